//! Timeout budgets per route group.

use std::time::{Duration, Instant};

use reqwest::StatusCode;

use crate::support::gateway::{InProcess, test_config};
use crate::support::nats_server::shared;
use crate::support::responder::{Responder, reply};
use crate::support::unique_prefix;

#[tokio::test]
async fn a_functions_request_outlives_the_default_budget_that_cuts_other_groups() {
    let nats = shared();
    let prefix = unique_prefix();
    let mut config = test_config(&nats.url(), &prefix);
    config.timeouts.default_ms = 700;
    config.timeouts.functions_ms = 5_000;
    let gw = InProcess::start(config).await;
    let delay = Duration::from_millis(1_500);
    let functions = Responder::start(
        &nats.url(),
        &format!("{prefix}.functions.http"),
        delay,
        |_| reply(200, &[], b"done"),
    )
    .await;
    let _auth = Responder::start(&nats.url(), &format!("{prefix}.auth.http"), delay, |_| {
        reply(200, &[], b"done")
    })
    .await;

    let started = Instant::now();
    let (f, a) = tokio::join!(
        crate::support::gateway::client()
            .get(gw.data_url("/v1/functions/slow"))
            .send(),
        crate::support::gateway::client()
            .get(gw.data_url("/v1/auth/slow"))
            .send(),
    );
    let (f, a) = (f.expect("functions"), a.expect("auth"));
    assert_eq!(
        f.status(),
        StatusCode::OK,
        "functions has its own, longer budget"
    );
    assert_eq!(f.text().await.expect("body"), "done");
    assert_eq!(
        a.status(),
        StatusCode::GATEWAY_TIMEOUT,
        "auth is cut at the default budget"
    );
    assert!(a.headers().contains_key("x-request-id"));
    let body: serde_json::Value = a.json().await.expect("json");
    assert!(
        body["error"]["code"]
            .as_str()
            .expect("code")
            .ends_with("timeout")
    );
    assert!(started.elapsed() >= delay);
    assert_eq!(functions.count(), 1);
}

#[tokio::test]
async fn gateway_routes_have_a_budget_too() {
    // The management plane's extra routes get the default budget: a slow control backend is cut.
    let nats = shared();
    let prefix = unique_prefix();
    let mut config = test_config(&nats.url(), &prefix);
    config.timeouts.default_ms = 300;
    let gw = InProcess::start(config).await;
    let _control = Responder::start(
        &nats.url(),
        &format!("{prefix}.control.http"),
        Duration::from_millis(1_000),
        |_| reply(200, &[], b""),
    )
    .await;
    let started = Instant::now();
    let response = crate::support::gateway::console_client()
        .get(gw.mgmt_url("/v1/projects/e2e/logs"))
        .send()
        .await
        .expect("request");
    assert_eq!(response.status(), StatusCode::GATEWAY_TIMEOUT);
    assert!(started.elapsed() < Duration::from_millis(1_000));
}
