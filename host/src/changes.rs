//! Control changes told to the whole fleet at once — and only by the fleet.
//!
//! Two channels carry them:
//! - **PostgreSQL**: `migrate` installs triggers on the cached control tables that append each
//!   change to `aura_control.change_log` (a table no other role may read or write: its rows name
//!   key hashes, project refs and user ids) and `NOTIFY aura_control_changes` with the new row's
//!   id only. Any database login may `NOTIFY` or `LISTEN` on any channel, so a notification is a
//!   wake-up and nothing more: the instance reads what is new in the log itself, at most every
//!   [`LOG_READ_SPACING`], and acts only on the kinds the triggers write (`api_key`, `project`,
//!   `membership`, `tenant_modules`) with their fields validated. A forged notification costs at
//!   most one indexed read that finds nothing.
//! - **NATS** (`{nats.subject_prefix}.gateway.changes`): what an instance changed itself (a
//!   tenant module installed or removed, an operator reload asked for). Events are signed by the
//!   fleet: each carries an HMAC-SHA256 of its payload under `nats.fleet_secret`, its origin, a
//!   sequence number and its time, and is refused unless the signature verifies, it is at most
//!   [`crate::fleet::MAX_EVENT_AGE`] old (or ahead), and its sequence is past the last one seen from its
//!   origin (no replay). Without `nats.fleet_secret`, instances neither publish nor accept
//!   events on NATS (every instance still catches up within its cache lifetimes and
//!   `plugins.tenant_refresh_secs`, and through PostgreSQL's log).
//!
//! Whatever arrives, the expensive actions are bounded: a key or project change forgets that one
//! record; tenant refreshes and operator reloads asked for by events are coalesced and run at
//! most once per `control.change_min_interval_ms` ([`Coalesced`]); `everything` (forget every
//! cached record) is only ever this instance's own decision (its control file reloaded, its
//! PostgreSQL listener reconnected), never an event's.
//!
//! Events are hints, never authority: acting on one only makes an instance ask the control store
//! again (or re-read its own configuration file), so even a valid event can cost a lookup, never
//! grant access. Refusals are counted in `aura_change_events_refused_total{source, reason}`.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use futures::StreamExt as _;

use crate::fleet::{Change, Coalesced, SIGNATURE_HEADER, now_ms, subject};
use crate::state::{AppState, WeakState};

/// The PostgreSQL channel the control tables' triggers notify.
pub const PG_CHANNEL: &str = "aura_control_changes";

/// The change log is read at most this often, however many notifications arrive.
pub const LOG_READ_SPACING: Duration = Duration::from_millis(100);

/// Ids of the change log not seen yet though a later one was (a transaction that took its id
/// earlier and commits later) are looked for again this long.
const GAP_WAIT: Duration = Duration::from_secs(10);

/// Tells the fleet about `change` (best effort: without NATS or `nats.fleet_secret`, the others
/// see it within their cache lifetimes). The caller has already applied it locally.
pub async fn publish(state: &AppState, change: Change) {
    let Some((payload, signature)) = state.fleet.sign(change) else {
        return;
    };
    let mut headers = async_nats::HeaderMap::new();
    headers.insert(SIGNATURE_HEADER, signature.as_str());
    if let Err(e) = state
        .nats
        .publish_with_headers(
            subject(&state.config.nats.subject_prefix),
            headers,
            payload.into(),
        )
        .await
    {
        tracing::warn!(error = %e, "change event not published; other instances catch up by polling");
    }
}

/// Acts on a change on this instance. Expensive actions are asked for, not run here: they are
/// coalesced ([`Coalesced`]).
pub async fn apply(state: &AppState, change: &Change, source: &'static str) {
    state
        .metrics
        .change_events
        .with_label_values(&[source, change.kind()])
        .inc();
    tracing::debug!(?change, source, "control change");
    match change {
        Change::ApiKey { key_sha256 } => {
            state.auth.forget_key(key_sha256).await;
        }
        Change::Project { project_ref } => state.auth.forget_project(project_ref).await,
        Change::Membership { .. } => {}
        Change::TenantModules { project_ref } => state.request_tenant_refresh(Some(project_ref)),
        Change::Everything => {
            state.auth.forget_all();
            state.request_tenant_refresh(None);
        }
        Change::OperatorReload => state.fleet.operator_reload.ask(),
    }
}

/// Subscribes to the fleet's change events (when signed), and to PostgreSQL's change log when
/// the store is PostgreSQL; both act on this instance. Runs until the state is dropped.
pub fn spawn(state: &AppState) {
    spawn_tenant_refresh(state);
    spawn_operator_reloads(state);
    if state.fleet.signs() {
        spawn_nats(state);
    } else {
        tracing::warn!(
            "nats.fleet_secret is not set: change events between instances are off on NATS \
             (other instances see a change within their cache lifetimes and plugins.tenant_refresh_secs)"
        );
    }
    if let Some(mut reloads) = state.auth.store.reloads() {
        let weak = state.downgrade();
        tokio::spawn(async move {
            while reloads.changed().await.is_ok() {
                let Some(state) = weak.upgrade() else { break };
                apply(&state, &Change::Everything, "file").await;
            }
        });
    }
    if let Some(pool) = state
        .auth
        .store
        .postgres_pool()
        .filter(|_| state.config.control.notifications)
    {
        tokio::spawn(listen_postgres(state.downgrade(), pool));
    }
}

/// Tells the other instances, on NATS, that a project's modules changed ([`publish`]).
#[derive(Debug)]
pub struct FleetAnnouncer(WeakState);

impl FleetAnnouncer {
    /// Announces for `state`, without keeping it alive.
    pub fn new(state: WeakState) -> Self {
        Self(state)
    }
}

#[async_trait::async_trait]
impl crate::policy::registry::Announce for FleetAnnouncer {
    async fn tenant_modules_changed(&self, project: &str) {
        if let Some(state) = self.0.upgrade() {
            publish(
                &state,
                Change::TenantModules {
                    project_ref: project.to_owned(),
                },
            )
            .await;
        }
    }
}

/// Keeps the projects' modules in line with the control store: every
/// `plugins.tenant_refresh_secs` every project's are listed, and sooner when a change event asks
/// for it (at most once per `control.change_min_interval_ms`) only the projects the events named
/// are read again.
fn spawn_tenant_refresh(state: &AppState) {
    let weak = state.downgrade();
    let fleet = state.fleet.clone();
    let every = Duration::from_secs(state.config.plugins.tenant_refresh_secs.max(1));
    tokio::spawn(async move {
        // The first refresh lists every project's modules.
        let mut named: Option<std::collections::HashSet<String>> = None;
        loop {
            let started = tokio::time::Instant::now();
            let Some(state) = weak.upgrade() else { break };
            match named.take() {
                None => {
                    if state.policies.refresh_tenants().await {
                        state.readiness.store_answered();
                        state.readiness.tenant_modules_listed();
                    }
                }
                Some(projects) => {
                    for project in projects {
                        state.policies.refresh_tenant_project(&project).await;
                    }
                }
            }
            drop(state);
            // The period, or sooner when a change event asks for it — but never sooner
            // than the least interval after the last refresh started, whatever arrives.
            tokio::select! {
                () = tokio::time::sleep(every) => {}
                asked = fleet.tenant_refresh.wait(&weak) => {
                    if !asked {
                        break;
                    }
                    tokio::time::sleep_until(started + fleet.tenant_refresh.every()).await;
                    named = fleet.take_named_projects();
                }
            }
        }
    });
}

/// Runs the operator reloads that events ask for, at most once per interval.
fn spawn_operator_reloads(state: &AppState) {
    let weak = state.downgrade();
    let fleet = state.fleet.clone();
    tokio::spawn(async move {
        loop {
            if !fleet.operator_reload.wait(&weak).await {
                return;
            }
            let Some(state) = weak.upgrade() else { return };
            let _ = state.reload_policies("fleet change event").await;
            drop(state);
            tokio::time::sleep(fleet.operator_reload.every()).await;
        }
    });
}

impl Coalesced {
    /// Waits until the action is asked for (true), without keeping the state alive: false once
    /// it is gone.
    pub async fn wait(&self, state: &WeakState) -> bool {
        loop {
            tokio::select! {
                () = self.asked() => return true,
                () = tokio::time::sleep(Duration::from_secs(1)) => {
                    if state.upgrade().is_none() {
                        return false;
                    }
                }
            }
        }
    }
}

fn spawn_nats(state: &AppState) {
    let weak = state.downgrade();
    let subject = subject(&state.config.nats.subject_prefix);
    let nats = state.nats.clone();
    tokio::spawn(async move {
        // The client resubscribes by itself after a reconnection.
        let mut subscription = loop {
            match nats.subscribe(subject.clone()).await {
                Ok(s) => break s,
                Err(e) => {
                    tracing::warn!(error = %e, "change events: cannot subscribe yet");
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
            }
        };
        while let Some(message) = subscription.next().await {
            let Some(state) = weak.upgrade() else { break };
            let signed = message
                .headers
                .as_ref()
                .and_then(|h| h.get(SIGNATURE_HEADER))
                .map(|v| v.as_str());
            if let Some(change) = state.fleet.accept(&message.payload, signed, now_ms()) {
                apply(&state, &change, "nats").await;
            }
        }
    });
}

/// One row of `aura_control.change_log`.
type LogRow = (
    i64,
    String,
    Option<String>,
    Option<String>,
    Option<uuid::Uuid>,
    Option<uuid::Uuid>,
);

/// The change a row of the log records, if it is one the triggers write.
fn change_of_row(
    (_, kind, key_sha256, project_ref, organization_id, user_id): LogRow,
) -> Option<Change> {
    let change = match kind.as_str() {
        "api_key" => Change::ApiKey {
            key_sha256: key_sha256?,
        },
        "project" => Change::Project {
            project_ref: project_ref?,
        },
        "membership" => Change::Membership {
            organization_id: organization_id?.to_string(),
            user_id: user_id?.to_string(),
        },
        "tenant_modules" => Change::TenantModules {
            project_ref: project_ref?,
        },
        _ => return None,
    };
    change.check().ok()?;
    Some(change)
}

/// What this instance has read of the change log.
#[derive(Debug, Default)]
struct LogCursor {
    /// The newest id read.
    last: i64,
    /// Ids below `last` not read yet, and when they were first missed.
    gaps: BTreeMap<i64, Instant>,
}

impl LogCursor {
    /// Whether a notification naming `id` may bring something not read yet.
    fn may_be_new(&self, id: i64) -> bool {
        id > self.last || self.gaps.contains_key(&id)
    }

    /// Takes in the ids of rows read, in order: later ids move `last`, skipped ones are gaps.
    fn read(&mut self, id: i64) {
        if id > self.last {
            // Sequences are not transactional: a skipped id may still commit.
            let missed = (self.last + 1)..id;
            if self.last > 0 && missed.end - missed.start <= 1_000 {
                for gap in missed {
                    self.gaps.entry(gap).or_insert_with(Instant::now);
                }
            }
            self.last = id;
        } else {
            self.gaps.remove(&id);
        }
    }

    /// Gaps still waited for (expired ones dropped: rolled back, or too late to matter).
    fn waiting(&mut self) -> Vec<i64> {
        self.gaps.retain(|_, at| at.elapsed() < GAP_WAIT);
        while self.gaps.len() > 1_000 {
            self.gaps.pop_first();
        }
        self.gaps.keys().copied().collect()
    }
}

/// Listens to `aura_control_changes` and reads the change log on each notification (at most
/// every [`LOG_READ_SPACING`]); reconnects when the connection is lost, after a second, and
/// after up to 30 s while it keeps failing (a store without the change log: `migrate` first).
async fn listen_postgres(weak: WeakState, pool: sqlx::PgPool) {
    let mut backoff = Duration::from_secs(1);
    loop {
        match sqlx::postgres::PgListener::connect_with(&pool).await {
            Ok(mut listener) => {
                if let Err(e) = listener.listen(PG_CHANNEL).await {
                    tracing::warn!(error = %e, "change events: LISTEN failed");
                } else if let Some(cursor) = start_reading(&weak, &pool).await {
                    tracing::info!("change events: listening to PostgreSQL");
                    backoff = Duration::from_secs(1);
                    if !follow(&weak, &pool, &mut listener, cursor).await {
                        return;
                    }
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, "change events: cannot listen to PostgreSQL yet")
            }
        }
        if weak.upgrade().is_none() {
            return;
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(Duration::from_secs(30));
    }
}

/// The cursor at the log's newest row now. What changed while this instance was not listening
/// is not known: it forgets every cached record (its own decision) and refreshes.
async fn start_reading(weak: &WeakState, pool: &sqlx::PgPool) -> Option<LogCursor> {
    let newest: Result<(Option<i64>,), _> =
        sqlx::query_as("SELECT max(id) FROM aura_control.change_log")
            .fetch_one(pool)
            .await;
    let last = match newest {
        Ok((last,)) => last.unwrap_or(0),
        Err(e) => {
            tracing::warn!(error = %e, "change events: the change log cannot be read (run `aura-gateway migrate`)");
            return None;
        }
    };
    let state = weak.upgrade()?;
    apply(&state, &Change::Everything, "postgres").await;
    Some(LogCursor {
        last,
        gaps: BTreeMap::new(),
    })
}

/// Follows notifications until the connection is lost (true) or the state is gone (false).
///
/// Receiving and reading are apart: notifications are taken as fast as they come and only
/// wake the reader, which reads the log at most every [`LOG_READ_SPACING`] — however many
/// notifications arrived meanwhile, one read covers them.
async fn follow(
    weak: &WeakState,
    pool: &sqlx::PgPool,
    listener: &mut sqlx::postgres::PgListener,
    cursor: LogCursor,
) -> bool {
    let cursor = std::sync::Arc::new(tokio::sync::Mutex::new(cursor));
    let wake = std::sync::Arc::new(tokio::sync::Notify::new());
    let reader = tokio::spawn(read_when_woken(
        weak.clone(),
        pool.clone(),
        cursor.clone(),
        wake.clone(),
    ));
    // `None` or an error: the connection was lost; reconnect.
    let lost = loop {
        let Ok(Some(notification)) = listener.try_recv().await else {
            break true;
        };
        let Some(state) = weak.upgrade() else {
            break false;
        };
        // While a read is in progress, a new notification is worth the next one.
        let worth = match cursor.try_lock() {
            Ok(cursor) => worth_a_read(&state, &cursor, notification.payload()),
            Err(_) => is_row_id(&state, notification.payload()),
        };
        if worth {
            wake.notify_one();
        }
    };
    reader.abort();
    lost
}

/// Reads the log each time it is woken, then waits [`LOG_READ_SPACING`] before the next.
async fn read_when_woken(
    weak: WeakState,
    pool: sqlx::PgPool,
    cursor: std::sync::Arc<tokio::sync::Mutex<LogCursor>>,
    wake: std::sync::Arc<tokio::sync::Notify>,
) {
    loop {
        wake.notified().await;
        let Some(state) = weak.upgrade() else { return };
        read_log(&state, &pool, &mut *cursor.lock().await).await;
        drop(state);
        tokio::time::sleep(LOG_READ_SPACING).await;
    }
}

/// Whether a payload is a row id (what the triggers send); anything else is refused and counted.
fn is_row_id(state: &AppState, payload: &str) -> bool {
    let ok = payload.parse::<i64>().is_ok_and(|id| id > 0);
    if !ok {
        state.fleet.refuse("postgres", "invalid");
    }
    ok
}

/// Whether a notification's payload may bring a row not read yet. The triggers send a row id
/// and nothing else; anything else is not theirs (refused and counted).
fn worth_a_read(state: &AppState, cursor: &LogCursor, payload: &str) -> bool {
    is_row_id(state, payload) && payload.parse::<i64>().is_ok_and(|id| cursor.may_be_new(id))
}

/// Reads and applies the rows of the log past the cursor (and the gaps it waits for).
async fn read_log(state: &AppState, pool: &sqlx::PgPool, cursor: &mut LogCursor) {
    loop {
        let gaps = cursor.waiting();
        let rows: Result<Vec<LogRow>, _> = sqlx::query_as(
            "SELECT id, kind, key_sha256, project_ref, organization_id, user_id \
             FROM aura_control.change_log WHERE id > $1 OR id = ANY($2) ORDER BY id LIMIT 500",
        )
        .bind(cursor.last)
        .bind(&gaps)
        .fetch_all(pool)
        .await;
        let rows = match rows {
            Ok(rows) => rows,
            Err(e) => {
                tracing::warn!(error = %e, "change events: the change log cannot be read now");
                return;
            }
        };
        let full = rows.len() == 500;
        for row in rows {
            cursor.read(row.0);
            match change_of_row(row) {
                Some(change) => apply(state, &change, "postgres").await,
                None => state.fleet.refuse("postgres", "invalid"),
            }
        }
        if !full {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cursor_reads_late_commits_in_its_gaps() {
        let mut cursor = LogCursor {
            last: 10,
            gaps: BTreeMap::new(),
        };
        assert!(!cursor.may_be_new(9));
        assert!(cursor.may_be_new(11));
        cursor.read(13);
        assert_eq!(cursor.last, 13);
        assert_eq!(cursor.waiting(), vec![11, 12], "11 and 12 may still commit");
        assert!(cursor.may_be_new(12));
        cursor.read(12);
        assert_eq!(cursor.waiting(), vec![11]);
        assert!(!cursor.may_be_new(12));
    }

    #[test]
    fn rows_of_kinds_the_triggers_do_not_write_are_refused() {
        let row = |kind: &str, key: Option<&str>, project: Option<&str>| -> LogRow {
            (
                1,
                kind.into(),
                key.map(str::to_owned),
                project.map(str::to_owned),
                None,
                None,
            )
        };
        assert_eq!(
            change_of_row(row("project", None, Some("alpha"))),
            Some(Change::Project {
                project_ref: "alpha".into()
            })
        );
        assert_eq!(change_of_row(row("everything", None, None)), None);
        assert_eq!(change_of_row(row("operator_reload", None, None)), None);
        assert_eq!(change_of_row(row("api_key", Some("zz"), None)), None);
        assert_eq!(change_of_row(row("project", None, None)), None);
    }
}
