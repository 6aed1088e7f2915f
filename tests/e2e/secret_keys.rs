//! Secret keys never from a browser, through the binary: a `service_role` key on a request that
//! carries `Origin` or `Sec-Fetch-Site` is refused `401 secret_key_from_browser` and nothing is
//! forwarded, unless the key's project allows it (`PUT /v1/projects/{ref}/auth-settings`, owner
//! or admin) or the operator does (`auth.secret_keys_from_browsers`); over the control file and
//! over PostgreSQL, where a second instance follows the change.

use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::support::builder::{Gateway, Started};
use crate::support::call::Call;
use crate::support::cli::{check_config, failed_saying, succeeded};
use crate::support::config::write_config;
use crate::support::fixture::{Fixture, user_token};
use crate::support::gateway::Process;
use crate::support::metrics::metric;
use crate::support::poll::eventually;
use crate::support::postgres::{TestDatabase, control_table};
use crate::support::responder::{Envelopes, json_ok};

const BROWSER_CODE: &str = "secret_key_from_browser";

/// Headers of a WebSocket upgrade a browser page opens.
const WEBSOCKET: [(&str, &str); 4] = [
    ("connection", "upgrade"),
    ("upgrade", "websocket"),
    ("sec-websocket-version", "13"),
    ("sec-websocket-key", "dGhlIHNhbXBsZSBub25jZQ=="),
];

/// Calls `gw` with the service key and `headers` on a NATS-backed route; the status and, on a
/// refusal, the code.
async fn service_call(
    gw: &Process,
    fx: &Fixture,
    headers: &[(&str, &str)],
) -> (StatusCode, String) {
    Call::get(gw.data_url("/v1/auth/user"))
        .key(&fx.service_key)
        .headers(headers)
        .read()
        .await
        .status_and_code()
}

async fn refused_count(gw: &Process) -> f64 {
    let metrics = gw.metrics().await;
    metric(
        &metrics,
        "aura_errors_total",
        &[&format!("code=\"{BROWSER_CODE}\"")],
    )
}

async fn settings(gw: &Process, user: uuid::Uuid) -> Value {
    Call::get(gw.mgmt_url("/v1/projects/alpha/auth-settings"))
        .console(user)
        .expect(200)
        .await
        .json()
}

async fn put_settings(
    gw: &Process,
    user: uuid::Uuid,
    body: &Value,
) -> crate::support::call::Answer {
    Call::put(gw.mgmt_url("/v1/projects/alpha/auth-settings"))
        .console(user)
        .json(body)
        .read()
        .await
}

/// The rule and its settings on one gateway: refused from browsers, every refusal counted and
/// nothing forwarded; servers (Node's fetch included) and anon keys unaffected; the project's
/// opt-in through the management API, by owners and admins only.
async fn browser_rule(gw: &Process, fx: &Fixture, envelopes: &Envelopes) {
    let browsers: [&[(&str, &str)]; 4] = [
        &[("origin", "https://app.example")],
        &[("origin", "null")],
        &[("sec-fetch-site", "same-origin")],
        &[
            ("origin", "https://app.example"),
            ("sec-fetch-mode", "cors"),
            ("sec-fetch-site", "cross-site"),
        ],
    ];
    for headers in browsers {
        let (status, code) = service_call(gw, fx, headers).await;
        assert_eq!(
            (status, code.as_str()),
            (StatusCode::UNAUTHORIZED, BROWSER_CODE),
            "{headers:?}"
        );
    }
    // A page's WebSocket (browsers always send Origin on one), and a public path: a present key
    // is checked there too.
    let mut socket = WEBSOCKET.to_vec();
    socket.push(("origin", "https://app.example"));
    let upgrade = Call::get(gw.data_url("/v1/realtime/websocket"))
        .key(&fx.service_key)
        .headers(&socket[..])
        .expect(401)
        .await;
    assert_eq!(upgrade.code(), BROWSER_CODE);
    let public = Call::post(gw.data_url("/v1/auth/signup"))
        .key(&fx.service_key)
        .origin("https://app.example")
        .body("{}")
        .expect(401)
        .await;
    assert_eq!(public.code(), BROWSER_CODE);
    // Refused before a user token is looked at: a valid one changes nothing.
    let with_user = Call::get(gw.data_url("/v1/auth/user"))
        .key(&fx.service_key)
        .bearer(user_token("alpha", fx.owner))
        .origin("https://app.example")
        .expect(401)
        .await;
    assert_eq!(with_user.code(), BROWSER_CODE);
    assert!(envelopes.seen().is_empty(), "nothing is forwarded");
    assert_eq!(refused_count(gw).await, 7.0);

    // Servers: no signal, or Node's fetch (Sec-Fetch-Mode: cors alone).
    for headers in [
        &[][..],
        &[("sec-fetch-mode", "cors"), ("user-agent", "node")][..],
    ] {
        assert_eq!(
            service_call(gw, fx, headers).await.0,
            StatusCode::OK,
            "{headers:?}"
        );
        assert_eq!(envelopes.last()["actor"]["role"], "service_role");
    }
    // A browser with the anon key.
    Call::get(gw.data_url("/v1/auth/user"))
        .key(&fx.anon_key)
        .origin("https://app.example")
        .header("sec-fetch-site", "cross-site")
        .expect(200)
        .await;
    assert_eq!(envelopes.last()["actor"]["role"], "anon");
    assert_eq!(envelopes.seen().len(), 3);

    // The settings: any member reads them, owners and admins change them.
    let off = json!({ "project": "alpha", "browser_secret_keys": false });
    assert_eq!(settings(gw, fx.reader).await, off);
    let on = json!({ "browser_secret_keys": true });
    for (user, status, code) in [
        (fx.developer, 403, "insufficient_role"),
        (fx.reader, 403, "read_only"),
        (fx.outsider, 403, "not_a_member"),
    ] {
        let answer = put_settings(gw, user, &on).await;
        assert_eq!(
            (answer.status.as_u16(), answer.code().as_str()),
            (status, code)
        );
    }
    for (body, status, code) in [
        (json!({}), 400, "invalid_body"),
        (json!({ "browser_secret_keys": "yes" }), 400, "invalid_body"),
        (
            json!({ "browser_secret_keys": true, "also": 1 }),
            400,
            "invalid_body",
        ),
        (
            json!({ "browser_secret_keys": true, "pad": "x".repeat(5000) }),
            413,
            "payload_too_large",
        ),
    ] {
        let answer = put_settings(gw, fx.admin, &body).await;
        assert_eq!(
            (answer.status.as_u16(), answer.code().as_str()),
            (status, code),
            "{body}"
        );
    }
    let unknown = Call::put(gw.mgmt_url("/v1/projects/nope/auth-settings"))
        .console(fx.owner)
        .json(&on)
        .expect(404)
        .await;
    assert_eq!(unknown.code(), "not_found");
    // Nothing above changed the setting.
    assert_eq!(settings(gw, fx.developer).await, off);
    let (status, _) = service_call(gw, fx, &[("origin", "https://app.example")]).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);

    let answer = put_settings(gw, fx.admin, &on).await;
    assert_eq!(answer.status, StatusCode::OK, "{}", answer.text());
    assert_eq!(
        answer.json(),
        json!({ "project": "alpha", "browser_secret_keys": true })
    );
    assert_eq!(settings(gw, fx.reader).await["browser_secret_keys"], true);
    // In force at once on this instance.
    let (status, _) = service_call(gw, fx, &[("origin", "https://app.example")]).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(envelopes.last()["actor"]["role"], "service_role");

    let answer = put_settings(gw, fx.owner, &json!({ "browser_secret_keys": false })).await;
    assert_eq!(answer.status, StatusCode::OK, "{}", answer.text());
    let (status, code) = service_call(gw, fx, &[("origin", "https://app.example")]).await;
    assert_eq!(
        (status, code.as_str()),
        (StatusCode::UNAUTHORIZED, BROWSER_CODE)
    );
}

async fn started_with_envelopes(started: &Started) -> Envelopes {
    started.gw.bus.record(&["auth", "realtime"], json_ok).await
}

#[tokio::test]
async fn a_secret_key_from_a_browser_is_refused_unless_the_project_opts_in() {
    let started = Gateway::builder().binary();
    let envelopes = started_with_envelopes(&started).await;
    browser_rule(&started.gw, &started.fx, &envelopes).await;
    // The control file holds the setting while it is on, and loses it when turned off.
    let file = std::fs::read_to_string(started.dir.path().join("control.toml")).expect("file");
    assert!(!file.contains("browser_secret_keys"), "{file}");
    let answer = put_settings(
        &started.gw,
        started.fx.owner,
        &json!({ "browser_secret_keys": true }),
    )
    .await;
    assert_eq!(answer.status, StatusCode::OK);
    let file = std::fs::read_to_string(started.dir.path().join("control.toml")).expect("file");
    assert!(file.contains("browser_secret_keys = true"), "{file}");
}

#[tokio::test]
async fn the_same_over_postgres_and_a_second_instance_follows_the_setting() {
    let fx = Fixture::new();
    let (db, _store) = TestDatabase::seeded(&fx).await;
    // Project records cached for 30 s: only the change log makes the second instance reload.
    let toml = format!(
        "{}\n[auth]\nproject_cache_ttl_secs = 30\n",
        control_table(&db.url)
    );
    let first = Gateway::builder().fixture(&fx).toml(&toml).binary();
    let envelopes = started_with_envelopes(&first).await;
    let second = Gateway::builder()
        .fixture(&fx)
        .bus(&first.gw.bus)
        .toml(&toml)
        .binary();
    let origin = [("origin", "https://app.example")];
    // The second instance has the project cached, refused.
    let (status, code) = service_call(&second.gw, &fx, &origin).await;
    assert_eq!(
        (status, code.as_str()),
        (StatusCode::UNAUTHORIZED, BROWSER_CODE)
    );

    browser_rule(&first.gw, &fx, &envelopes).await;
    let rows: Vec<(bool,)> = db
        .query(
            "SELECT browser_secret_keys FROM aura_control.project_auth WHERE project_ref = 'alpha'",
        )
        .await;
    assert_eq!(rows, vec![(false,)]);

    let answer = put_settings(&first.gw, fx.owner, &json!({ "browser_secret_keys": true })).await;
    assert_eq!(answer.status, StatusCode::OK);
    let followed = eventually(Duration::from_secs(5), async || {
        service_call(&second.gw, &fx, &origin).await.0 == StatusCode::OK
    })
    .await;
    assert!(followed, "the second instance follows the change log");
    // Written by anyone (plain SQL): followed too.
    db.execute("UPDATE aura_control.project_auth SET browser_secret_keys = false WHERE project_ref = 'alpha'")
        .await;
    for gw in [&first.gw, &second.gw] {
        let refused = eventually(Duration::from_secs(5), async || {
            service_call(gw, &fx, &origin).await.1 == BROWSER_CODE
        })
        .await;
        assert!(refused, "a change in the table applies on every instance");
    }
}

#[tokio::test]
async fn the_operator_chooses_the_signals_or_allows_secret_keys_everywhere() {
    let node = [("sec-fetch-mode", "cors")];
    let origin = [("origin", "https://app.example")];
    // The literal rule: Sec-Fetch-Mode: cors is a browser too.
    let strict = Gateway::builder()
        .toml("[auth]\nbrowser_signals = [\"origin\", \"sec-fetch-mode\"]\n")
        .binary();
    let _strict_envelopes = started_with_envelopes(&strict).await;
    let (status, code) = service_call(&strict.gw, &strict.fx, &node).await;
    assert_eq!(
        (status, code.as_str()),
        (StatusCode::UNAUTHORIZED, BROWSER_CODE)
    );
    let same_origin = [("sec-fetch-site", "same-origin")];
    assert_eq!(
        service_call(&strict.gw, &strict.fx, &same_origin).await.0,
        StatusCode::OK
    );

    let open = Gateway::builder()
        .toml("[auth]\nsecret_keys_from_browsers = \"allow\"\n")
        .binary();
    let envelopes = started_with_envelopes(&open).await;
    assert_eq!(
        service_call(&open.gw, &open.fx, &origin).await.0,
        StatusCode::OK
    );
    assert_eq!(envelopes.last()["actor"]["role"], "service_role");

    // A wrong setting names its key.
    let dir = tempfile::tempdir().expect("dir");
    for (toml, what) in [
        ("[auth]\nbrowser_signals = []\n", "auth.browser_signals"),
        ("[auth]\nbrowser_signals = [\"user-agent\"]\n", "user-agent"),
        (
            "[auth]\nsecret_keys_from_browsers = \"sometimes\"\n",
            "sometimes",
        ),
    ] {
        let path = write_config(dir.path(), toml);
        failed_saying(&check_config(&path), what);
    }
    let path = write_config(
        dir.path(),
        "[auth]\nbrowser_signals = [\"sec-fetch-site\"]\n",
    );
    succeeded(&check_config(&path));
}
