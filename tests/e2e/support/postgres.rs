//! A fresh PostgreSQL database per test, on the server named by `GATEWAY_TEST_DATABASE_URL`
//! (default: the local server, user postgres), dropped afterwards.

use std::sync::atomic::{AtomicU32, Ordering};

use aura_gateway::control::postgres::PostgresStore;
use sqlx::Connection;
use sqlx::postgres::{PgConnection, PgPoolOptions};

/// The administrative URL tests create databases through.
pub fn admin_url() -> String {
    std::env::var("GATEWAY_TEST_DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".to_owned())
}

/// The `[control]` table of a gateway whose store is the database at `url`.
pub fn control_table(url: &str) -> String {
    format!("[control]\nstore = \"postgres\"\ndatabase_url = \"{url}\"\n")
}

/// The configuration of a gateway over the database at `url` (with PostgreSQL's notifications
/// on or off) whose caches and tenant refresh are set long: only change events make it ask the
/// store again. Its `[plugins]` table comes last.
pub fn long_cached(url: &str, notifications: bool) -> String {
    let control = control_table(url);
    format!(
        "{control}notifications = {notifications}\n\n\
         [auth]\nkey_cache_ttl_secs = 30\nproject_cache_ttl_secs = 30\n\n\
         [plugins]\ntenant_refresh_secs = 3600\n"
    )
}

/// A database that exists for one test.
pub struct TestDatabase {
    pub name: String,
    pub url: String,
}

fn with_database(url: &str, db: &str) -> String {
    let (base, _) = url
        .rsplit_once('/')
        .expect("a database URL ends with /dbname");
    format!("{base}/{db}")
}

impl TestDatabase {
    /// Creates a new, empty database.
    pub async fn create() -> Self {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let name = format!(
            "aura_test_{}_{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        );
        let admin = admin_url();
        let mut conn = PgConnection::connect(&admin)
            .await
            .unwrap_or_else(|e| panic!("PostgreSQL must be reachable at {admin}: {e}"));
        sqlx::query(&format!("DROP DATABASE IF EXISTS {name}"))
            .execute(&mut conn)
            .await
            .expect("drop old");
        sqlx::query(&format!("CREATE DATABASE {name}"))
            .execute(&mut conn)
            .await
            .expect("create database");
        let url = with_database(&admin, &name);
        Self { name, url }
    }

    /// A migrated store on this database.
    pub async fn store(&self) -> PostgresStore {
        let pool = PgPoolOptions::new()
            .max_connections(4)
            .connect(&self.url)
            .await
            .expect("connect");
        let store = PostgresStore::from_pool(pool);
        store.migrate().await.expect("migrations apply");
        store
    }

    /// A new database with `fx`'s records, and a migrated store on it.
    pub async fn seeded(fx: &super::fixture::Fixture) -> (Self, PostgresStore) {
        let db = Self::create().await;
        let store = db.store().await;
        fx.seed(&db).await;
        (db, store)
    }

    /// The rows of a query on this database.
    pub async fn query<T>(&self, sql: &str) -> Vec<T>
    where
        T: for<'r> sqlx::FromRow<'r, sqlx::postgres::PgRow> + Send + Unpin,
    {
        let mut conn = PgConnection::connect(&self.url).await.expect("connect");
        sqlx::query_as(sql)
            .fetch_all(&mut conn)
            .await
            .expect("query")
    }

    /// Runs SQL statements on this database.
    pub async fn execute(&self, sql: &str) {
        let mut conn = PgConnection::connect(&self.url).await.expect("connect");
        sqlx::raw_sql(sql).execute(&mut conn).await.expect("sql");
    }
}

impl Drop for TestDatabase {
    fn drop(&mut self) {
        run_as_admin(format!(
            "DROP DATABASE IF EXISTS {} WITH (FORCE)",
            self.name
        ));
    }
}

/// Runs `sql` on the administrative connection, from any context (a drop included), best
/// effort.
pub fn run_as_admin(sql: String) {
    let admin = admin_url();
    let _ = std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        rt.block_on(async move {
            if let Ok(mut conn) = PgConnection::connect(&admin).await {
                let _ = sqlx::query(&sql).execute(&mut conn).await;
            }
        });
    })
    .join();
}
