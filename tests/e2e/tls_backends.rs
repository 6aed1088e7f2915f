//! The gateway's own connections over TLS, against servers of the test's own that refuse plain
//! text: PostgreSQL (control store), Redis (shared quotas), NATS (envelopes, with credentials)
//! and an HTTPS backend asking for a client certificate.

use std::time::{Duration, Instant};

use aura_gateway::config::{ClientTlsConfig, NatsConfig};
use aura_gateway::proxy::nats::NatsTransport;
use reqwest::StatusCode;
use sqlx::Connection as _;

use crate::support::fixture::Fixture;
use crate::support::gateway::{METRICS_TOKEN, Process, binary, metric};
use crate::support::nats_server::NatsServer;
use crate::support::pki::Pki;
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
    let verified = pg.url(
        "postgres",
        &format!("?sslmode=verify-full&sslrootcert={}", pki.ca.display()),
    );
    let migrate = std::process::Command::new(binary())
        .args(["migrate", "--database-url", &verified])
        .output()
        .expect("migrate");
    assert!(
        migrate.status.success(),
        "migrate over TLS: {}",
        String::from_utf8_lossy(&migrate.stderr)
    );
    let mut conn = sqlx::PgConnection::connect(&verified).await.expect("TLS");
    sqlx::raw_sql(&fx.seed_sql())
        .execute(&mut conn)
        .await
        .expect("seed");

    // Redis: TLS port only, client certificate and password required.
    let redis = TlsRedis::start(&pki);
    let plain = redis::Client::open(format!(
        "redis://:{}@127.0.0.1:{}/",
        redis.password, redis.port
    ))
    .expect("url");
    let plain = tokio::time::timeout(
        Duration::from_secs(5),
        plain.get_multiplexed_async_connection(),
    )
    .await;
    assert!(
        !matches!(plain, Ok(Ok(_))),
        "the Redis server accepted plain text"
    );

    // NATS: TLS with client certificates, and a password.
    let nats = NatsServer::start(&format!(
        "{}authorization {{ user: \"gw\", password: \"nats-tls-password\" }}\n",
        nats_tls_block(&pki)
    ));
    let prefix = unique_prefix();
    let backend = nats_client(&pki, nats.port, "gw", "nats-tls-password").await;
    let responder = Responder::start_with(
        backend,
        &format!("{prefix}.auth.http"),
        Duration::ZERO,
        |envelope| {
            let method = envelope["method"].as_str().unwrap_or_default().to_owned();
            reply(
                200,
                &[("content-type", "text/plain")],
                format!("auth saw {method}").as_bytes(),
            )
        },
    )
    .await;

    // An HTTPS storage backend asking for the gateway's client certificate.
    let storage = Recorder::start_tls(pki.rustls_server(true)).await;

    let config = dir.path().join("gateway.toml");
    std::fs::write(
        &config,
        format!(
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
            ca = pki.ca.display(),
            redis_url = redis.url(),
            redis_tls = toml_tls("rate_limit.redis_tls", &pki),
            storage = storage.url,
            upstreams_tls = toml_tls("upstreams.tls", &pki),
        ),
    )
    .expect("config");
    let check = std::process::Command::new(binary())
        .args(["check-config", "--config"])
        .arg(&config)
        .output()
        .expect("check-config");
    let printed = String::from_utf8_lossy(&check.stdout);
    assert!(
        check.status.success(),
        "{printed}{}",
        String::from_utf8_lossy(&check.stderr)
    );
    assert!(
        !printed
            .lines()
            .any(|l| l.starts_with("warning:") && l.contains("plain text")),
        "TLS hops warned about: {printed}"
    );

    let gw = Process::serve(&config, dir.path());
    // Ready means: the control store answered (over TLS) and NATS is connected (over TLS).
    let started = Instant::now();
    loop {
        let r = reqwest::get(gw.mgmt_url("/ready")).await.expect("/ready");
        if r.status() == StatusCode::OK {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "not ready: {}\nlog:\n{}",
            r.text().await.unwrap_or_default(),
            gw.log_text()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let client = reqwest::Client::new();
    // The key is looked up in PostgreSQL; the envelope goes over NATS.
    let r = client
        .post(gw.data_url("/v1/auth/signup"))
        .header("apikey", &fx.anon_key)
        .body("{}")
        .send()
        .await
        .expect("auth");
    assert_eq!(r.status(), StatusCode::OK, "{}", gw.log_text());
    assert_eq!(r.text().await.expect("body"), "auth saw POST");
    assert_eq!(responder.count(), 1);
    // Storage over HTTPS with the gateway's client certificate.
    let r = client
        .get(gw.data_url("/v1/storage/object/a.png"))
        .header("apikey", &fx.anon_key)
        .send()
        .await
        .expect("storage");
    assert_eq!(r.status(), StatusCode::OK, "{}", gw.log_text());
    let seen = storage.last().expect("the HTTPS backend was reached");
    assert!(seen.target.ends_with("/object/a.png"), "{}", seen.target);
    // Quotas are shared through Redis over TLS.
    let started = Instant::now();
    loop {
        let text = gw.metrics().await;
        if metric(&text, "aura_ratelimit_shared", &[]) == 1.0 {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(15),
            "quotas never shared through Redis; log:\n{}",
            gw.log_text()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // An unknown key is refused by the store over TLS, not by a fallback.
    let r = client
        .post(gw.data_url("/v1/auth/signup"))
        .header("apikey", "aura_pk_unknown_0123456789abcdefghijklmnopqrstu")
        .send()
        .await
        .expect("auth");
    assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
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

    // Without the CA and a client certificate, a TLS-only server is not reached.
    let token_server = NatsServer::start(&format!(
        "{tls}authorization {{ token: \"nats-token-0123456789\" }}\n"
    ));
    assert!(
        !nats_connects(
            &token_server,
            NatsConfig {
                token: Some("nats-token-0123456789".into()),
                ..NatsConfig::default()
            }
        )
        .await,
        "connected without trusting the server's CA"
    );
    // Token.
    assert!(
        nats_connects(
            &token_server,
            NatsConfig {
                token: Some("nats-token-0123456789".into()),
                ..base.clone()
            }
        )
        .await
    );
    assert!(
        !nats_connects(
            &token_server,
            NatsConfig {
                token: Some("a-wrong-token-0123456789".into()),
                ..base.clone()
            }
        )
        .await,
        "a wrong token was accepted"
    );
    drop(token_server);

    // NKey.
    let user = nkeys::KeyPair::new_user();
    let nkey_server = NatsServer::start(&format!(
        "{tls}authorization {{ users = [ {{ nkey: \"{}\" }} ] }}\n",
        user.public_key()
    ));
    assert!(
        nats_connects(
            &nkey_server,
            NatsConfig {
                nkey_seed: Some(user.seed().expect("seed")),
                ..base.clone()
            }
        )
        .await
    );
    let stranger = nkeys::KeyPair::new_user();
    assert!(
        !nats_connects(
            &nkey_server,
            NatsConfig {
                nkey_seed: Some(stranger.seed().expect("seed")),
                ..base.clone()
            }
        )
        .await,
        "an unknown NKey was accepted"
    );
    drop(nkey_server);

    // A .creds file (operator mode: operator, account and user JWTs).
    let operator = nkeys::KeyPair::new_operator();
    let account = nkeys::KeyPair::new_account();
    let user = nkeys::KeyPair::new_user();
    let operator_jwt = nats_jwt(
        &operator,
        &operator.public_key(),
        "op",
        serde_json::json!({"type": "operator", "version": 2}),
    );
    let account_jwt = nats_jwt(
        &operator,
        &account.public_key(),
        "acct",
        serde_json::json!({
            "limits": {"subs": -1, "data": -1, "payload": -1, "imports": -1, "exports": -1,
                       "wildcards": true, "conn": -1, "leaf": -1},
            "default_permissions": {"pub": {}, "sub": {}},
            "type": "account", "version": 2
        }),
    );
    let user_jwt = nats_jwt(
        &account,
        &user.public_key(),
        "gateway",
        serde_json::json!({"pub": {}, "sub": {}, "subs": -1, "data": -1, "payload": -1,
                           "type": "user", "version": 2}),
    );
    let creds = dir.path().join("gateway.creds");
    std::fs::write(
        &creds,
        format!(
            "-----BEGIN NATS USER JWT-----\n{user_jwt}\n------END NATS USER JWT------\n\n\
             ************************* IMPORTANT *************************\n\n\
             -----BEGIN USER NKEY SEED-----\n{}\n------END USER NKEY SEED------\n",
            user.seed().expect("seed")
        ),
    )
    .expect("creds");
    let creds_server = NatsServer::start(&format!(
        "{tls}operator: \"{operator_jwt}\"\nresolver: MEMORY\nresolver_preload: {{\n  {}: \"{account_jwt}\"\n}}\n",
        account.public_key()
    ));
    assert!(
        nats_connects(
            &creds_server,
            NatsConfig {
                credentials_file: Some(creds.display().to_string()),
                ..base.clone()
            }
        )
        .await
    );
    // The same user JWT with another key's seed is refused.
    let forged = dir.path().join("forged.creds");
    std::fs::write(
        &forged,
        std::fs::read_to_string(&creds).expect("creds").replace(
            &user.seed().expect("seed"),
            &nkeys::KeyPair::new_user().seed().expect("seed"),
        ),
    )
    .expect("forged");
    assert!(
        !nats_connects(
            &creds_server,
            NatsConfig {
                credentials_file: Some(forged.display().to_string()),
                ..base.clone()
            }
        )
        .await,
        "a forged .creds file was accepted"
    );
}

#[tokio::test]
async fn check_config_warns_about_plain_text_secret_hops_off_loopback() {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = dir.path().join("gateway.toml");
    std::fs::write(
        &config,
        r#"
[nats]
url = "nats://10.1.2.3:4222,nats://127.0.0.1:4222"

[upstreams]
storage_url = "http://storage.internal:5000"
realtime_url = "http://127.0.0.1:4000"

[rate_limit]
redis_url = "redis://:hunter2-password@cache.internal:6379/0"
"#,
    )
    .expect("config");
    let out = std::process::Command::new(binary())
        .args(["check-config", "--config"])
        .arg(&config)
        .output()
        .expect("check-config");
    let printed = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{printed}");
    let warnings: Vec<&str> = printed
        .lines()
        .filter(|l| l.starts_with("warning:") && l.contains("plain text"))
        .collect();
    assert_eq!(warnings.len(), 3, "{printed}");
    // And the fleet's change events, off without a shared secret.
    assert!(
        printed.contains("warning: nats.fleet_secret is not set"),
        "{printed}"
    );
    assert!(
        warnings
            .iter()
            .any(|w| w.contains("nats.url") && w.contains("10.1.2.3"))
    );
    assert!(warnings.iter().any(|w| w.contains("upstreams.storage_url")));
    assert!(warnings.iter().any(|w| w.contains("rate_limit.redis_url")));
    // Loopback hops are not warned about, and no secret is printed.
    assert!(!printed.contains("realtime_url"), "{printed}");
    assert!(!printed.contains("hunter2"), "{printed}");
}
