//! The gateway's own connections over TLS, against servers of the test's own that refuse plain
//! text: PostgreSQL (control store), Redis (shared quotas), NATS (envelopes, with credentials)
//! and an HTTPS backend asking for a client certificate.

use std::time::Duration;

use aura_gateway::config::{ClientTlsConfig, NatsConfig};
use aura_gateway::proxy::nats::NatsTransport;
use reqwest::StatusCode;
use sqlx::Connection as _;

use crate::support::call::{Call, IntoCall};
use crate::support::cli::{check_config, run, stderr};
use crate::support::config::{METRICS_TOKEN, write_config};
use crate::support::fixture::Fixture;
use crate::support::gateway::Process;
use crate::support::metrics::metric;
use crate::support::nats_server::NatsServer;
use crate::support::pki::Pki;
use crate::support::poll::poll_every;
use crate::support::responder::{Responder, reply};
use crate::support::tls_servers::{TlsPostgres, TlsRedis, nats_tls_block};
use crate::support::unique_prefix;
use crate::support::upstream::Recorder;

fn client_tls(pki: &Pki, with_cert: bool) -> ClientTlsConfig {
    ClientTlsConfig {
        ca_file: Some(pki.ca.display().to_string()),
        cert_file: with_cert.then(|| pki.client_cert.display().to_string()),
        key_file: with_cert.then(|| pki.client_key.display().to_string()),
    }
}

fn toml_tls(section: &str, pki: &Pki) -> String {
    format!(
        "[{section}]\nca_file = \"{}\"\ncert_file = \"{}\"\nkey_file = \"{}\"\n\n",
        pki.ca.display(),
        pki.client_cert.display(),
        pki.client_key.display()
    )
}

/// A NATS client of the test's own on a TLS server with user/password.
async fn nats_client(pki: &Pki, port: u16, user: &str, password: &str) -> async_nats::Client {
    aura_gateway::tls::install_crypto_provider();
    async_nats::ConnectOptions::new()
        .require_tls(true)
        .add_root_certificates(pki.ca.clone())
        .add_client_certificate(pki.client_cert.clone(), pki.client_key.clone())
        .user_and_password(user.into(), password.into())
        .connect(format!("tls://localhost:{port}"))
        .await
        .expect("the test's NATS client connects")
}

#[tokio::test]
async fn the_gateway_reaches_postgres_redis_nats_and_https_backends_over_required_tls() {
    let dir = tempfile::tempdir().expect("tempdir");
    let pki = Pki::new(&dir.path().join("pki"), "deps");
    let fx = Fixture::new();

    // PostgreSQL: plain text refused; migrations and records over verified TLS.
    let pg = TlsPostgres::start(&pki);
    let plain = sqlx::PgConnection::connect(&pg.url("postgres", "?sslmode=disable")).await;
    assert!(plain.is_err(), "the PostgreSQL server accepted plain text");
    let ca = pki.ca.display();
    let verified = pg.url(
        "postgres",
        &format!("?sslmode=verify-full&sslrootcert={ca}"),
    );
    let migrate = run(&["migrate", "--database-url", &verified], None);
    assert!(
        migrate.status.success(),
        "migrate over TLS: {}",
        stderr(&migrate)
    );
    let mut conn = sqlx::PgConnection::connect(&verified).await.expect("TLS");
    sqlx::raw_sql(&fx.seed_sql())
        .execute(&mut conn)
        .await
        .expect("seed");

    // Redis: TLS port only, client certificate and password required.
    let redis = TlsRedis::start(&pki);
    let plain = format!("redis://:{}@127.0.0.1:{}/", redis.password, redis.port);
    let plain = redis::Client::open(plain).expect("url");
    let plain = plain.get_multiplexed_async_connection();
    let plain = tokio::time::timeout(Duration::from_secs(5), plain).await;
    let accepted = matches!(plain, Ok(Ok(_)));
    assert!(!accepted, "the Redis server accepted plain text");

    // NATS: TLS with client certificates, and a password.
    let password = "authorization { user: \"gw\", password: \"nats-tls-password\" }\n";
    let nats = NatsServer::start(&format!("{}{password}", nats_tls_block(&pki)));
    let prefix = unique_prefix();
    let backend = nats_client(&pki, nats.port, "gw", "nats-tls-password").await;
    let subject = format!("{prefix}.auth.http");
    let responder = Responder::start_with(backend, &subject, Duration::ZERO, |envelope| {
        let method = envelope["method"].as_str().unwrap_or_default().to_owned();
        let text = format!("auth saw {method}");
        reply(200, &[("content-type", "text/plain")], text.as_bytes())
    })
    .await;

    // An HTTPS storage backend asking for the gateway's client certificate.
    let storage = Recorder::start_tls(pki.rustls_server(true)).await;

    let config = write_config(
        dir.path(),
        &format!(
            r#"host = "127.0.0.1"

[nats]
url = "tls://localhost:{nats_port}"
subject_prefix = "{prefix}"
user = "gw"
password = "nats-tls-password"

{nats_tls}[control]
store = "postgres"
database_url = "{pg_url}"

[control.tls]
ca_file = "{ca}"

[rate_limit]
redis_url = "{redis_url}"

{redis_tls}[upstreams]
storage_url = "{storage}"

{upstreams_tls}[metrics]
token = "{METRICS_TOKEN}"
"#,
            nats_port = nats.port,
            nats_tls = toml_tls("nats.tls", &pki),
            pg_url = pg.url("postgres", ""),
            redis_url = redis.url(),
            redis_tls = toml_tls("rate_limit.redis_tls", &pki),
            storage = storage.url,
            upstreams_tls = toml_tls("upstreams.tls", &pki),
        ),
    );
    let check = check_config(&config);
    let printed = String::from_utf8_lossy(&check.stdout);
    assert!(check.status.success(), "{printed}{}", stderr(&check));
    let warned = printed
        .lines()
        .any(|l| l.starts_with("warning:") && l.contains("plain text"));
    assert!(!warned, "TLS hops warned about: {printed}");

    let gw = Process::serve(&config, dir.path());
    // Ready means: the control store answered (over TLS) and NATS is connected (over TLS).
    let mut last = String::new();
    let ready = poll_every(
        Duration::from_secs(20),
        Duration::from_millis(100),
        async || {
            let r = Call::get(gw.mgmt_url("/ready")).read().await;
            last = r.text();
            (r.status == StatusCode::OK).then_some(())
        },
    );
    let ready = ready.await.is_some();
    assert!(ready, "not ready: {last}\nlog:\n{}", gw.log_text());
    let client = reqwest::Client::new();
    // The key is looked up in PostgreSQL; the envelope goes over NATS.
    let signup = |key: &str| client.post(gw.data_url("/v1/auth/signup")).call().key(key);
    let r = signup(&fx.anon_key).body("{}").read().await;
    assert_eq!(r.status, StatusCode::OK, "{}", gw.log_text());
    assert_eq!(r.text(), "auth saw POST");
    assert_eq!(responder.count(), 1);
    // Storage over HTTPS with the gateway's client certificate.
    let object = client.get(gw.data_url("/v1/storage/object/a.png")).call();
    let r = object.key(&fx.anon_key).read().await;
    assert_eq!(r.status, StatusCode::OK, "{}", gw.log_text());
    let seen = storage.last().expect("the HTTPS backend was reached");
    assert!(seen.target.ends_with("/object/a.png"), "{}", seen.target);
    // Quotas are shared through Redis over TLS.
    let shared = poll_every(
        Duration::from_secs(15),
        Duration::from_millis(200),
        async || (metric(&gw.metrics().await, "aura_ratelimit_shared", &[]) == 1.0).then_some(()),
    );
    let shared = shared.await.is_some();
    assert!(
        shared,
        "quotas never shared through Redis; log:\n{}",
        gw.log_text()
    );
    // An unknown key is refused by the store over TLS, not by a fallback.
    let unknown = signup("aura_pk_unknown_0123456789abcdefghijklmnopqrstu");
    assert_eq!(unknown.status().await, StatusCode::UNAUTHORIZED);
}

/// One NATS server with TLS and `authorization`, and whether the gateway's transport connects
/// with `config`.
async fn nats_connects(server: &NatsServer, mut config: NatsConfig) -> bool {
    config.url = format!("tls://localhost:{}", server.port);
    config.connect_timeout_ms = 1_500;
    match NatsTransport::connect(&config).await {
        Ok(transport) => transport.is_connected(),
        Err(_) => false,
    }
}

fn b64(bytes: &[u8]) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
}

/// A NATS JWT signed by `issuer`.
fn nats_jwt(issuer: &nkeys::KeyPair, subject: &str, name: &str, nats: serde_json::Value) -> String {
    let header = b64(br#"{"typ":"JWT","alg":"ed25519-nkey"}"#);
    let claims = serde_json::json!({
        "jti": format!("{name}-{}", uuid::Uuid::new_v4().simple()),
        "iat": crate::support::fixture::epoch(),
        "iss": issuer.public_key(),
        "name": name,
        "sub": subject,
        "nats": nats,
    });
    let claims = b64(claims.to_string().as_bytes());
    let signed = format!("{header}.{claims}");
    let signature = issuer.sign(signed.as_bytes()).expect("sign");
    format!("{signed}.{}", b64(&signature))
}

#[tokio::test]
async fn nats_credentials_of_every_kind_over_tls() {
    let dir = tempfile::tempdir().expect("tempdir");
    let pki = Pki::new(&dir.path().join("pki"), "nats");
    let tls = nats_tls_block(&pki);
    let base = NatsConfig {
        tls: Some(client_tls(&pki, true)),
        ..NatsConfig::default()
    };
    let token = |token: &str, base: &NatsConfig| NatsConfig {
        token: Some(token.into()),
        ..base.clone()
    };
    let nkey = |key: &nkeys::KeyPair| NatsConfig {
        nkey_seed: Some(key.seed().expect("seed")),
        ..base.clone()
    };
    let creds_file = |path: &std::path::Path| NatsConfig {
        credentials_file: Some(path.display().to_string()),
        ..base.clone()
    };

    // Without the CA and a client certificate, a TLS-only server is not reached.
    let authorization = "authorization { token: \"nats-token-0123456789\" }\n";
    let token_server = NatsServer::start(&format!("{tls}{authorization}"));
    let untrusted = token("nats-token-0123456789", &NatsConfig::default());
    let reached = nats_connects(&token_server, untrusted).await;
    assert!(!reached, "connected without trusting the server's CA");
    // Token.
    assert!(nats_connects(&token_server, token("nats-token-0123456789", &base)).await);
    let wrong = nats_connects(&token_server, token("a-wrong-token-0123456789", &base)).await;
    assert!(!wrong, "a wrong token was accepted");
    drop(token_server);

    // NKey.
    let user = nkeys::KeyPair::new_user();
    let users = format!(
        "authorization {{ users = [ {{ nkey: \"{}\" }} ] }}\n",
        user.public_key()
    );
    let nkey_server = NatsServer::start(&format!("{tls}{users}"));
    assert!(nats_connects(&nkey_server, nkey(&user)).await);
    let stranger = nats_connects(&nkey_server, nkey(&nkeys::KeyPair::new_user())).await;
    assert!(!stranger, "an unknown NKey was accepted");
    drop(nkey_server);

    // A .creds file (operator mode: operator, account and user JWTs).
    let operator = nkeys::KeyPair::new_operator();
    let account = nkeys::KeyPair::new_account();
    let user = nkeys::KeyPair::new_user();
    let operator_claims = serde_json::json!({"type": "operator", "version": 2});
    let operator_jwt = nats_jwt(&operator, &operator.public_key(), "op", operator_claims);
    let account_claims = serde_json::json!({
        "limits": {"subs": -1, "data": -1, "payload": -1, "imports": -1, "exports": -1,
                   "wildcards": true, "conn": -1, "leaf": -1},
        "default_permissions": {"pub": {}, "sub": {}},
        "type": "account", "version": 2
    });
    let account_jwt = nats_jwt(&operator, &account.public_key(), "acct", account_claims);
    let user_claims = serde_json::json!({"pub": {}, "sub": {}, "subs": -1, "data": -1, "payload": -1,
                                         "type": "user", "version": 2});
    let user_jwt = nats_jwt(&account, &user.public_key(), "gateway", user_claims);
    let creds = dir.path().join("gateway.creds");
    let seed = user.seed().expect("seed");
    std::fs::write(
        &creds,
        format!(
            "-----BEGIN NATS USER JWT-----\n{user_jwt}\n------END NATS USER JWT------\n\n\
             ************************* IMPORTANT *************************\n\n\
             -----BEGIN USER NKEY SEED-----\n{seed}\n------END USER NKEY SEED------\n",
        ),
    )
    .expect("creds");
    let account_key = account.public_key();
    let creds_server = NatsServer::start(&format!(
        "{tls}operator: \"{operator_jwt}\"\nresolver: MEMORY\nresolver_preload: {{\n  {account_key}: \"{account_jwt}\"\n}}\n",
    ));
    assert!(nats_connects(&creds_server, creds_file(&creds)).await);
    // The same user JWT with another key's seed is refused.
    let forged = dir.path().join("forged.creds");
    let other_seed = nkeys::KeyPair::new_user().seed().expect("seed");
    let forged_text = std::fs::read_to_string(&creds)
        .expect("creds")
        .replace(&seed, &other_seed);
    std::fs::write(&forged, forged_text).expect("forged");
    let accepted = nats_connects(&creds_server, creds_file(&forged)).await;
    assert!(!accepted, "a forged .creds file was accepted");
}

#[tokio::test]
async fn check_config_warns_about_plain_text_secret_hops_off_loopback() {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = write_config(
        dir.path(),
        r#"
[nats]
url = "nats://10.1.2.3:4222,nats://127.0.0.1:4222"

[upstreams]
storage_url = "http://storage.internal:5000"
realtime_url = "http://127.0.0.1:4000"

[rate_limit]
redis_url = "redis://:hunter2-password@cache.internal:6379/0"
"#,
    );
    let out = check_config(&config);
    let printed = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{printed}");
    let warnings: Vec<&str> = printed
        .lines()
        .filter(|l| l.starts_with("warning:") && l.contains("plain text"))
        .collect();
    assert_eq!(warnings.len(), 3, "{printed}");
    // And the fleet's change events, off without a shared secret.
    let fleet = printed.contains("warning: nats.fleet_secret is not set");
    assert!(fleet, "{printed}");
    let about = |what: &str| warnings.iter().any(|w| w.contains(what));
    assert!(
        warnings
            .iter()
            .any(|w| w.contains("nats.url") && w.contains("10.1.2.3"))
    );
    assert!(about("upstreams.storage_url"));
    assert!(about("rate_limit.redis_url"));
    // Loopback hops are not warned about, and no secret is printed.
    assert!(!printed.contains("realtime_url"), "{printed}");
    assert!(!printed.contains("hunter2"), "{printed}");
}
