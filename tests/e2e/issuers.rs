//! Projects' own JWT issuers, through the binary, against real HTTPS issuers (local servers with
//! the test's own CA): each project accepts only its issuers' tokens, selected by `iss` then
//! `kid`; keys rotate without a restart; an issuer that is down keeps its last good keys;
//! hostile JWKS are bounded; issuers are managed by owners and admins; over the control file and
//! PostgreSQL, and across three instances.

use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{Value, json};
use uuid::Uuid;

use crate::support::builder::Gateway;
use crate::support::call::{Answer, Call};
use crate::support::config::binary_config;
use crate::support::fixture::{Fixture, user_token};
use crate::support::gateway::Process;
use crate::support::issuer::{CountingListener, Mode, TestIssuer, TestKey};
use crate::support::metrics::metric;
use crate::support::pki::Pki;
use crate::support::poll::eventually;
use crate::support::postgres::{TestDatabase, control_table};
use crate::support::responder::{Bus, Envelopes, json_ok};

/// A CA of the test's own, its server certificate the issuers'.
fn pki() -> (tempfile::TempDir, Pki) {
    let dir = tempfile::tempdir().expect("dir");
    let pki = Pki::new(dir.path(), "idp");
    (dir, pki)
}

/// `[auth.issuers]` for the tests: the issuers are on 127.0.0.1 (allowed past the denied
/// private ranges), trusted through the test CA, refreshed quickly.
fn issuers_toml(pki: &Pki) -> String {
    format!(
        "[auth.issuers]\nallowed_targets = [\"127.0.0.1\"]\nrefresh_cooldown_secs = 1\n\
         max_age_secs = 2\ndiscovery_max_age_secs = 2\nidle_secs = 3600\n\
         unknown_kid_wait_ms = 1000\nfetch_timeout_ms = 1500\nmax_keys = 32\n\n\
         [auth.issuers.tls]\nca_file = \"{}\"\n",
        pki.ca.display()
    )
}

/// A `POST …/issuers` body for `issuer` with audience `my-api`.
fn body(issuer: &TestIssuer) -> Value {
    json!({ "issuer": issuer.url, "audience": { "accepted": ["my-api"] } })
}

async fn add(gw: &Process, project: &str, user: Uuid, body: &Value) -> Answer {
    Call::post(gw.mgmt_url(&format!("/v1/projects/{project}/issuers")))
        .console(user)
        .json(body)
        .read()
        .await
}

/// A user call on `/v1/auth/user` with `key` and `token`: the status and error code.
async fn user_call(gw: &Process, key: &str, token: &str) -> (StatusCode, String) {
    Call::get(gw.data_url("/v1/auth/user"))
        .key(key)
        .bearer(token)
        .read()
        .await
        .status_and_code()
}

fn refused() -> (StatusCode, String) {
    (StatusCode::UNAUTHORIZED, "invalid_jwt".to_owned())
}

fn ok() -> (StatusCode, String) {
    (StatusCode::OK, String::new())
}

/// Two projects, each trusting its own issuer (added through the API): each issuer's tokens
/// are accepted on its project only, nothing forwarded otherwise, and the other issuer is not
/// even asked; platform tokens keep working; a `kid` both issuers publish is verified against
/// the token's issuer's key only.
async fn two_projects(gw: &Process, fx: &Fixture, pki: &Pki, envelopes: &Envelopes) {
    let (ka, kb) = (TestKey::ec("a-1"), TestKey::ec("b-1"));
    let a = TestIssuer::start(pki, std::slice::from_ref(&ka)).await;
    let b = TestIssuer::start(pki, std::slice::from_ref(&kb)).await;
    let added = add(gw, "alpha", fx.owner, &body(&a)).await;
    assert_eq!(added.status, StatusCode::CREATED, "{}", added.text());
    let added = added.json();
    assert_eq!(added["issuer"], a.url);
    assert_eq!(added["source"], "discovery");
    assert_eq!(added["project"], "alpha");
    let added = add(gw, "other", fx.outsider, &body(&b)).await;
    assert_eq!(added.status, StatusCode::CREATED, "{}", added.text());
    let b_token = b.token(&kb, json!({}));
    assert_eq!(user_call(gw, &fx.other_project_key, &b_token).await, ok());
    assert_eq!(envelopes.last()["actor"]["project"], "other");
    let b_fetches = b.jwks_fetches();

    let sub = Uuid::new_v4().to_string();
    let a_token = a.token(&ka, json!({ "sub": sub }));
    assert_eq!(user_call(gw, &fx.anon_key, &a_token).await, ok());
    let e = envelopes.last();
    assert_eq!(e["actor"]["role"], "authenticated");
    assert_eq!(e["actor"]["user_id"], sub);
    assert_eq!(e["actor"]["project"], "alpha");
    let seen = envelopes.seen().len();
    // A's token on the other project, B's on alpha: refused, nothing forwarded.
    assert_eq!(
        user_call(gw, &fx.other_project_key, &a_token).await,
        refused()
    );
    assert_eq!(user_call(gw, &fx.anon_key, &b_token).await, refused());
    assert_eq!(envelopes.seen().len(), seen, "nothing is forwarded");
    assert_eq!(
        b.jwks_fetches(),
        b_fetches,
        "B is not asked for alpha's request"
    );
    // The platform's own tokens still work.
    let platform = user_token("alpha", fx.owner);
    assert_eq!(user_call(gw, &fx.anon_key, &platform).await, ok());

    // The token's other rules: audience, expiry, a ref naming another project, a role claim.
    for claims in [
        json!({ "aud": "another-api" }),
        json!({ "exp": crate::support::fixture::epoch() - 3600 }),
        json!({ "ref": "other" }),
    ] {
        let token = a.token(&ka, claims.clone());
        assert_eq!(
            user_call(gw, &fx.anon_key, &token).await,
            refused(),
            "{claims}"
        );
    }
    // Auth0 adds its own audience: one accepted audience is enough.
    let token = a.token(
        &ka,
        json!({ "aud": ["https://a.example/userinfo", "my-api"] }),
    );
    assert_eq!(user_call(gw, &fx.anon_key, &token).await, ok());

    // A kid both issuers publish: alpha trusts both; each token is verified against its own
    // issuer's key only.
    let (shared_a, shared_b) = (TestKey::ec("shared"), TestKey::ec("shared"));
    a.rotate(&[ka.clone(), shared_a.clone()]);
    b.rotate(&[kb.clone(), shared_b.clone()]);
    let added = add(gw, "alpha", fx.admin, &body(&b)).await;
    assert_eq!(added.status, StatusCode::CREATED, "{}", added.text());
    let a_signed_by_b = a.token(&shared_b, json!({}));
    let b_signed_by_a = b.token(&shared_a, json!({}));
    let a_signed_by_a = a.token(&shared_a, json!({}));
    let b_signed_by_b = b.token(&shared_b, json!({}));
    // The new kid is fetched on first sight (the unknown-kid rule; once the cooldown since
    // the last fetch has passed), then known.
    for token in [&a_signed_by_a, &b_signed_by_b] {
        let known = eventually(Duration::from_secs(5), async || {
            user_call(gw, &fx.anon_key, token).await == ok()
        })
        .await;
        assert!(known, "a rotated key is picked up");
    }
    assert_eq!(user_call(gw, &fx.anon_key, &a_signed_by_b).await, refused());
    assert_eq!(user_call(gw, &fx.anon_key, &b_signed_by_a).await, refused());
    let metrics = gw.metrics().await;
    let bad = metric(
        &metrics,
        "aura_user_jwts_total",
        &[
            &format!("issuer=\"{}\"", a.url),
            "outcome=\"bad_signature\"",
        ],
    );
    assert!(bad >= 1.0, "{metrics}");
    let good = metric(
        &metrics,
        "aura_user_jwts_total",
        &[&format!("issuer=\"{}\"", a.url), "outcome=\"ok\""],
    );
    assert!(good >= 3.0, "{metrics}");
    assert!(
        metric(
            &metrics,
            "aura_user_jwts_total",
            &["issuer=\"platform\"", "outcome=\"ok\""]
        ) >= 1.0
    );
}

#[tokio::test]
async fn two_projects_each_accept_only_their_own_issuers_tokens() {
    let (_pki_dir, pki) = pki();
    let started = Gateway::builder().toml(issuers_toml(&pki)).binary();
    let envelopes = started.gw.bus.record(&["auth"], json_ok).await;
    two_projects(&started.gw, &started.fx, &pki, &envelopes).await;
    // The access log names the issuer, never a token.
    let log = started.gw.log_text();
    assert!(log.contains("issuer=\"https://127.0.0.1:"), "{log}");
    assert!(log.contains("issuer=\"platform\""), "{log}");
    assert!(!log.contains("eyJ"), "no token in the log");
    // The control file holds them.
    let file = std::fs::read_to_string(started.dir.path().join("control.toml")).expect("file");
    assert_eq!(file.matches("[[project_issuers]]").count(), 3, "{file}");
}

#[tokio::test]
async fn the_same_through_postgres_and_an_issuer_written_in_sql() {
    let fx = Fixture::new();
    let (db, _store) = TestDatabase::seeded(&fx).await;
    let (_pki_dir, pki) = pki();
    let toml = format!("{}\n{}", control_table(&db.url), issuers_toml(&pki));
    let started = Gateway::builder().fixture(&fx).toml(&toml).binary();
    let envelopes = started.gw.bus.record(&["auth"], json_ok).await;
    two_projects(&started.gw, &fx, &pki, &envelopes).await;
    let rows: Vec<(String, String)> = db
        .query("SELECT project_ref, issuer FROM aura_control.project_issuers ORDER BY created_at")
        .await;
    assert_eq!(rows.len(), 3, "{rows:?}");
    // Written by anyone else: a row inserted by SQL is trusted once the change is logged.
    let key = TestKey::ec("sql-1");
    let sql = TestIssuer::start(&pki, std::slice::from_ref(&key)).await;
    let token = sql.token(&key, json!({}));
    assert_eq!(
        user_call(&started.gw, &fx.anon_key, &token).await,
        refused()
    );
    db.execute(&format!(
        "INSERT INTO aura_control.project_issuers (id, project_ref, issuer, jwks_url, audiences) \
         VALUES ('{}', 'alpha', '{}', '{}', '{{my-api}}')",
        Uuid::new_v4(),
        sql.url,
        sql.jwks_url()
    ))
    .await;
    let trusted = eventually(Duration::from_secs(5), async || {
        user_call(&started.gw, &fx.anon_key, &token).await == ok()
    })
    .await;
    assert!(trusted, "an issuer inserted in the table is trusted");
    db.execute(&format!(
        "DELETE FROM aura_control.project_issuers WHERE issuer = '{}'",
        sql.url
    ))
    .await;
    let gone = eventually(Duration::from_secs(5), async || {
        user_call(&started.gw, &fx.anon_key, &token).await == refused()
    })
    .await;
    assert!(gone, "a deleted issuer is no longer trusted");
}

#[tokio::test]
async fn key_rotation_at_the_issuer_is_picked_up_without_a_restart_and_a_down_issuer_keeps_its_keys()
 {
    let (_pki_dir, pki) = pki();
    let started = Gateway::builder().toml(issuers_toml(&pki)).binary();
    let (gw, fx) = (&started.gw, &started.fx);
    let _envelopes = gw.bus.record(&["auth"], json_ok).await;
    let k1 = TestKey::ec("k1");
    let issuer = TestIssuer::start(&pki, std::slice::from_ref(&k1)).await;
    let added = add(gw, "alpha", fx.owner, &body(&issuer)).await;
    assert_eq!(added.status, StatusCode::CREATED, "{}", added.text());
    let old = issuer.token(&k1, json!({}));
    assert_eq!(user_call(gw, &fx.anon_key, &old).await, ok());

    // Rotation: the new kid is fetched when first seen (past the 1 s cooldown since the last
    // fetch), within the unknown-kid wait: accepted on the first try.
    let k2 = TestKey::ec("k2");
    issuer.rotate(std::slice::from_ref(&k2));
    tokio::time::sleep(Duration::from_millis(1300)).await;
    let new = issuer.token(&k2, json!({}));
    assert_eq!(user_call(gw, &fx.anon_key, &new).await, ok());
    // Unknown kids in a burst fetch at most once per cooldown (1 s).
    let before = issuer.jwks_fetches();
    let started_at = std::time::Instant::now();
    let stranger = TestKey::ec("nobody");
    for _ in 0..20 {
        let token = issuer.token(&stranger, json!({}));
        assert_eq!(user_call(gw, &fx.anon_key, &token).await, refused());
    }
    let seconds = started_at.elapsed().as_secs() + 2;
    let fetched = issuer.jwks_fetches() - before;
    assert!(
        fetched as u64 <= seconds,
        "{fetched} fetches in {seconds} s"
    );
    // The old key is gone once the set was fetched again.
    assert_eq!(user_call(gw, &fx.anon_key, &old).await, refused());

    // Down: the last good keys stay in force past their age; the failures are counted.
    issuer.set_mode(Mode::Down);
    tokio::time::sleep(Duration::from_secs(3)).await;
    for _ in 0..3 {
        assert_eq!(user_call(gw, &fx.anon_key, &new).await, ok());
        tokio::time::sleep(Duration::from_millis(700)).await;
    }
    let failed = eventually(Duration::from_secs(5), async || {
        let metrics = gw.metrics().await;
        metric(
            &metrics,
            "aura_issuer_key_fetches_total",
            &[&format!("issuer=\"{}\"", issuer.url), "outcome=\"status\""],
        ) >= 1.0
    })
    .await;
    assert!(failed, "the failed fetches are counted");
    // The management API shows this instance's keys: in force, the last fetch failing.
    let list = Call::get(gw.mgmt_url("/v1/projects/alpha/issuers"))
        .console(fx.admin)
        .expect(200)
        .await
        .json();
    let keys = &list["issuers"][0]["keys"];
    assert_eq!(keys["status"], "failing", "{list}");
    assert_eq!(keys["kids"], json!(["k2"]), "{list}");
    // Hanging: still the last good keys, and requests never wait for the fetch.
    issuer.set_mode(Mode::Hang);
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(user_call(gw, &fx.anon_key, &new).await, ok());
    // Back: a new key is picked up again.
    issuer.set_mode(Mode::Normal);
    let k3 = TestKey::ec("k3");
    issuer.rotate(&[k2.clone(), k3.clone()]);
    let third = issuer.token(&k3, json!({}));
    let back = eventually(Duration::from_secs(8), async || {
        user_call(gw, &fx.anon_key, &third).await == ok()
    })
    .await;
    assert!(back, "keys are picked up again after the outage");
}

#[tokio::test]
async fn hostile_jwks_and_issuer_urls_are_bounded_and_the_gateway_keeps_serving() {
    let (_pki_dir, pki) = pki();
    let started = Gateway::builder().toml(issuers_toml(&pki)).binary();
    let (gw, fx) = (&started.gw, &started.fx);
    let envelopes = gw.bus.record(&["auth"], json_ok).await;
    let good_key = TestKey::ec("good");
    let good = TestIssuer::start(&pki, std::slice::from_ref(&good_key)).await;
    assert_eq!(
        add(gw, "alpha", fx.owner, &body(&good)).await.status,
        StatusCode::CREATED
    );
    let good_token = good.token(&good_key, json!({}));
    assert_eq!(user_call(gw, &fx.anon_key, &good_token).await, ok());
    let rss_before = gw.rss_mib();

    // A private address the gateway must never connect to.
    let private = CountingListener::start("127.0.0.2").await;
    let private_url = format!("https://127.0.0.2:{}/jwks.json", private.port);
    let key = TestKey::ec("k");
    let cases: Vec<(Mode, &str)> = vec![
        (Mode::HugeChunked(50 * 1024 * 1024), "too_large"),
        (Mode::HugeDeclared(50 * 1024 * 1024), "too_large"),
        (Mode::Slow, "timeout"),
        (Mode::ManyKeys(3000), "too_large"),
        (Mode::ManyKeys(300), "too_many_keys"),
        (Mode::JwksAt(private_url.clone()), "not_allowed"),
        (
            Mode::DiscoveryIssuer("https://someone-else.example".into()),
            "discovery_mismatch",
        ),
        (Mode::Redirect(private_url.clone()), "status"),
    ];
    for (mode, outcome) in cases {
        let hostile = TestIssuer::start(&pki, std::slice::from_ref(&key)).await;
        // Checked at add: refused, naming why.
        hostile.set_mode(mode.clone());
        let checked = add(gw, "alpha", fx.owner, &body(&hostile)).await;
        assert_eq!(
            checked.status,
            StatusCode::BAD_REQUEST,
            "{mode:?}: {}",
            checked.text()
        );
        let code = checked.code();
        assert!(
            code == "issuer_unreachable" || code == "issuer_not_allowed",
            "{mode:?}: {code}"
        );
        // Stored anyway (an identity provider briefly down): its tokens fail closed, each
        // within the fetch timeout and the unknown-kid wait.
        let mut unchecked = body(&hostile);
        unchecked["check"] = json!(false);
        let added = add(gw, "alpha", fx.owner, &unchecked).await;
        assert_eq!(
            added.status,
            StatusCode::CREATED,
            "{mode:?}: {}",
            added.text()
        );
        let token = hostile.token(&key, json!({}));
        let asked = std::time::Instant::now();
        assert_eq!(
            user_call(gw, &fx.anon_key, &token).await,
            refused(),
            "{mode:?}"
        );
        assert!(
            asked.elapsed() < Duration::from_secs(4),
            "{mode:?}: {:?}",
            asked.elapsed()
        );
        let counted = eventually(Duration::from_secs(5), async || {
            let metrics = gw.metrics().await;
            metric(
                &metrics,
                "aura_issuer_key_fetches_total",
                &[
                    &format!("issuer=\"{}\"", hostile.url),
                    &format!("outcome=\"{outcome}\""),
                ],
            ) >= 1.0
        })
        .await;
        let metrics = gw.metrics().await;
        let lines: Vec<&str> = metrics
            .lines()
            .filter(|l| l.contains(&hostile.url))
            .collect();
        let log = gw.log_text();
        let fetch_log: Vec<&str> = log.lines().filter(|l| l.contains("JWKS")).collect();
        assert!(
            counted,
            "{mode:?} is counted as {outcome}: {lines:?} {fetch_log:#?}"
        );
        // The good issuer's users are served meanwhile.
        assert_eq!(user_call(gw, &fx.anon_key, &good_token).await, ok());
        // At most eight issuers: remove this one.
        let id = added.json()["id"].as_str().expect("id").to_owned();
        Call::delete(gw.mgmt_url(&format!("/v1/projects/alpha/issuers/{id}")))
            .console(fx.owner)
            .expect(204)
            .await;
    }
    assert_eq!(private.accepted(), 0, "no connection to a denied address");
    // Issuer URLs themselves: a denied address, plain http, user information.
    for (issuer, code) in [
        (
            format!("https://127.0.0.2:{}", private.port),
            "issuer_not_allowed",
        ),
        ("https://169.254.169.254".to_owned(), "issuer_not_allowed"),
        ("http://id.example".to_owned(), "invalid_body"),
        ("https://user:pw@id.example".to_owned(), "invalid_body"),
    ] {
        let answer = add(
            gw,
            "alpha",
            fx.owner,
            &json!({ "issuer": issuer, "audience": { "accepted": [] } }),
        )
        .await;
        assert_eq!(
            (answer.status, answer.code().as_str()),
            (StatusCode::BAD_REQUEST, code),
            "{issuer}"
        );
    }
    let jwks_elsewhere = json!({ "issuer": "https://id.example", "jwks_url": private_url, "audience": { "accepted": [] }, "check": false });
    let answer = add(gw, "alpha", fx.owner, &jwks_elsewhere).await;
    assert_eq!(answer.code(), "issuer_not_allowed");
    assert_eq!(private.accepted(), 0, "no connection to a denied address");
    let grown = gw.rss_mib() - rss_before;
    assert!(grown < 40.0, "RSS grew {grown:.1} MiB");
    assert!(envelopes.seen().len() >= 9);
}

#[tokio::test]
async fn issuers_are_managed_by_owners_and_admins_only() {
    let (_pki_dir, pki) = pki();
    // The platform's own issuer is named: a project may not claim it, and a token of no trusted
    // issuer is refused as untrusted without any key lookup.
    let bus = Bus::new(
        &crate::support::nats_server::shared().url(),
        &crate::support::unique_prefix(),
    );
    let fx = Fixture::new();
    let dir = tempfile::tempdir().expect("dir");
    let config = binary_config(
        dir.path(),
        &fx,
        "",
        &bus.url,
        &bus.prefix,
        &issuers_toml(&pki),
    );
    let gw = Process::serve_with(&config, dir.path(), |command| {
        command.env("AURA_AUTH__USER_JWT__ISSUER", "https://platform.test");
        command.env(
            "AURA_PLUGINS__COMPILE_CACHE_DIR",
            crate::support::config::compile_cache(),
        );
    });
    let _envelopes = bus.record(&["auth"], json_ok).await;
    let key = TestKey::ec("k");
    let issuer = TestIssuer::start(&pki, std::slice::from_ref(&key)).await;
    let url = gw.mgmt_url("/v1/projects/alpha/issuers");
    for (user, status, code) in [
        (fx.developer, 403, "insufficient_role"),
        (fx.reader, 403, "read_only"),
        (fx.outsider, 403, "not_a_member"),
    ] {
        let answer = add(&gw, "alpha", user, &body(&issuer)).await;
        assert_eq!(
            (answer.status.as_u16(), answer.code().as_str()),
            (status, code)
        );
    }
    for (user, code) in [
        (fx.developer, "insufficient_role"),
        (fx.reader, "insufficient_role"),
    ] {
        let answer = Call::get(&url).console(user).expect(403).await;
        assert_eq!(
            answer.code(),
            code,
            "reading who signs users in is for owners and admins"
        );
    }
    let unknown = add(&gw, "nope", fx.owner, &body(&issuer)).await;
    assert_eq!(unknown.status, StatusCode::NOT_FOUND);
    for (body, code) in [
        (json!({ "issuer": issuer.url }), "invalid_body"),
        (
            json!({ "issuer": issuer.url, "audience": { "accepted": [] }, "role": { "claim": "role", "allowed": ["service_role"] } }),
            "invalid_body",
        ),
        (
            json!({ "issuer": issuer.url, "audience": { "accepted": [] }, "algorithms": ["HS256"] }),
            "invalid_body",
        ),
        (
            json!({ "issuer": issuer.url, "audience": { "accepted": [] }, "surprise": 1 }),
            "invalid_body",
        ),
        (
            json!({ "issuer": "https://platform.test", "audience": { "accepted": [] }, "keys": key.jwks() }),
            "issuer_reserved",
        ),
        (
            json!({ "issuer": "https://x.example", "audience": { "accepted": [] }, "keys": { "keys": [{ "kty": "oct", "k": "c2VjcmV0" }] } }),
            "invalid_body",
        ),
    ] {
        let answer = add(&gw, "alpha", fx.owner, &body).await;
        assert_eq!(
            (answer.status, answer.code().as_str()),
            (StatusCode::BAD_REQUEST, code),
            "{body}"
        );
    }
    let too_big = json!({ "issuer": issuer.url, "audience": { "accepted": [] }, "pad": "x".repeat(100 * 1024) });
    assert_eq!(
        add(&gw, "alpha", fx.owner, &too_big).await.status,
        StatusCode::PAYLOAD_TOO_LARGE
    );

    let first = add(&gw, "alpha", fx.admin, &body(&issuer)).await;
    assert_eq!(first.status, StatusCode::CREATED, "{}", first.text());
    let id = first.json()["id"].as_str().expect("id").to_owned();
    assert_eq!(first.json()["created_by"], fx.admin.to_string());
    let duplicate = add(&gw, "alpha", fx.owner, &body(&issuer)).await;
    assert_eq!(
        (duplicate.status, duplicate.code().as_str()),
        (StatusCode::CONFLICT, "issuer_exists")
    );
    // Seven more with inline keys: eight in all, the ninth refused.
    for i in 0..7 {
        let inline = json!({ "issuer": format!("https://inline-{i}.example"), "audience": { "accepted": [] }, "keys": key.jwks() });
        let answer = add(&gw, "alpha", fx.owner, &inline).await;
        assert_eq!(answer.status, StatusCode::CREATED, "{}", answer.text());
        assert_eq!(answer.json()["source"], "keys");
        assert!(
            !answer.text().contains("\"x\""),
            "inline keys are not echoed"
        );
    }
    let ninth = json!({ "issuer": "https://ninth.example", "audience": { "accepted": [] }, "keys": key.jwks() });
    let answer = add(&gw, "alpha", fx.owner, &ninth).await;
    assert_eq!(
        (answer.status, answer.code().as_str()),
        (StatusCode::CONFLICT, "too_many_issuers")
    );
    let list = Call::get(&url).console(fx.owner).expect(200).await.json();
    assert_eq!(list["issuers"].as_array().map(Vec::len), Some(8));
    assert_eq!(list["issuers"][0]["id"], id.as_str(), "oldest first");

    // Tokens: the trusted issuer's accepted, an inline issuer's too, an unknown issuer's refused
    // as untrusted, the platform's own (with its iss) still accepted.
    let token = issuer.token(&key, json!({}));
    assert_eq!(user_call(&gw, &fx.anon_key, &token).await, ok());
    let inline = key.sign(&json!({ "iss": "https://inline-3.example", "sub": "u", "exp": crate::support::fixture::epoch() + 60 }));
    assert_eq!(user_call(&gw, &fx.anon_key, &inline).await, ok());
    let stranger = key.sign(&json!({ "iss": "https://stranger.example", "sub": "u", "aud": "my-api", "exp": crate::support::fixture::epoch() + 60 }));
    assert_eq!(user_call(&gw, &fx.anon_key, &stranger).await, refused());
    let platform = crate::support::fixture::hs256(
        crate::support::fixture::USER_SECRET,
        json!({ "iss": "https://platform.test", "sub": "u", "aud": "authenticated", "ref": "alpha", "exp": crate::support::fixture::epoch() + 60 }),
    );
    assert_eq!(user_call(&gw, &fx.anon_key, &platform).await, ok());
    let no_iss = user_token("alpha", fx.owner);
    assert_eq!(
        user_call(&gw, &fx.anon_key, &no_iss).await,
        refused(),
        "the platform's iss is required once named"
    );
    let metrics = gw.metrics().await;
    assert!(
        metric(
            &metrics,
            "aura_user_jwts_total",
            &["issuer=\"untrusted\"", "outcome=\"untrusted_issuer\""]
        ) >= 2.0,
        "{metrics}"
    );

    // Reading one, removing it: its tokens are refused at once on this instance.
    let one = Call::get(format!("{url}/{id}"))
        .console(fx.admin)
        .expect(200)
        .await
        .json();
    assert_eq!(one["issuer"], issuer.url);
    assert_eq!(one["keys"]["status"], "ok", "{one}");
    Call::delete(format!("{url}/{id}"))
        .console(fx.developer)
        .expect(403)
        .await;
    Call::delete(format!("{url}/{id}"))
        .console(fx.owner)
        .expect(204)
        .await;
    Call::delete(format!("{url}/{id}"))
        .console(fx.owner)
        .expect(404)
        .await;
    Call::get(format!("{url}/{id}"))
        .console(fx.owner)
        .expect(404)
        .await;
    Call::get(format!("{url}/not-a-uuid"))
        .console(fx.owner)
        .expect(404)
        .await;
    assert_eq!(user_call(&gw, &fx.anon_key, &token).await, refused());
}

/// Three gateway binaries over `toml` (their store), on one NATS subject prefix: an issuer
/// added on one is trusted by all three, and once removed on another, by none.
async fn three_instances_follow(fx: &Fixture, pki: &Pki, toml: &str) {
    let dir = tempfile::tempdir().expect("dir");
    let prefix = crate::support::unique_prefix();
    let nats = crate::support::nats_server::shared().url();
    let gws: Vec<Process> = (0..3)
        .map(|i| {
            let sub = dir.path().join(format!("gw{i}"));
            std::fs::create_dir_all(&sub).expect("dir");
            Gateway::builder()
                .nats(&nats)
                .prefix(&prefix)
                .fixture(fx)
                .dir(&sub)
                .toml(toml)
                .binary()
                .gw
        })
        .collect();
    let _envelopes = Bus::new(&nats, &prefix).record(&["auth"], json_ok).await;
    let key = TestKey::ec("k");
    let issuer = TestIssuer::start(pki, std::slice::from_ref(&key)).await;
    let token = issuer.token(&key, json!({}));
    // Every instance has alpha cached, without the issuer.
    for gw in &gws {
        assert_eq!(user_call(gw, &fx.anon_key, &token).await, refused());
    }
    let added = add(&gws[1], "alpha", fx.admin, &body(&issuer)).await;
    assert_eq!(added.status, StatusCode::CREATED, "{}", added.text());
    let id = added.json()["id"].as_str().expect("id").to_owned();
    let all_answer = async |expected: (StatusCode, String)| {
        for gw in &gws {
            let followed = eventually(Duration::from_secs(5), async || {
                user_call(gw, &fx.anon_key, &token).await == expected
            })
            .await;
            assert!(followed, "instance {} answers {expected:?}", gw.port);
        }
    };
    all_answer(ok()).await;
    Call::delete(gws[2].mgmt_url(&format!("/v1/projects/alpha/issuers/{id}")))
        .console(fx.owner)
        .expect(204)
        .await;
    all_answer(refused()).await;
}

#[tokio::test]
async fn an_issuer_added_on_one_instance_is_trusted_by_all_three() {
    let fx = Fixture::new();
    let (db, _store) = TestDatabase::seeded(&fx).await;
    let (_pki_dir, pki) = pki();
    // Project records cached for 30 s: only change events make an instance read them again.
    let toml = format!(
        "{}notifications = true\n\n[auth]\nproject_cache_ttl_secs = 30\n\n{}",
        control_table(&db.url),
        issuers_toml(&pki)
    );
    three_instances_follow(&fx, &pki, &toml).await;
}

#[tokio::test]
async fn three_instances_on_one_control_file_share_issuers() {
    let fx = Fixture::new();
    let (_pki_dir, pki) = pki();
    let dir = tempfile::tempdir().expect("dir");
    let shared = dir.path().join("shared.toml");
    std::fs::write(&shared, fx.control_file()).expect("control file");
    let toml = format!(
        "[control]\nfile = \"{}\"\nreload_interval_ms = 200\n\n{}",
        shared.display(),
        issuers_toml(&pki)
    );
    three_instances_follow(&fx, &pki, &toml).await;
    let text = std::fs::read_to_string(&shared).expect("file");
    assert!(
        !text.contains("[[project_issuers]]"),
        "removed from the shared file: {text}"
    );
}
