//! Timeout budgets per route group.

use std::time::{Duration, Instant};

use reqwest::StatusCode;

use crate::support::builder::Gateway;
use crate::support::call::{Answer, IntoCall, client, console_client};
use crate::support::responder::reply;

#[tokio::test]
async fn a_functions_request_outlives_the_default_budget_that_cuts_other_groups() {
    let budgets = |c: &mut aura_gateway::config::Config| {
        (c.timeouts.default_ms, c.timeouts.functions_ms) = (700, 5_000)
    };
    let gw = Gateway::start_with(budgets).await;
    let (delay, done) = (Duration::from_millis(1_500), |_| reply(200, &[], b"done"));
    let functions = gw.bus.respond_after("functions", delay, done).await;
    let _auth = gw.bus.respond_after("auth", delay, done).await;

    let started = Instant::now();
    let slow = |path: &str| client().get(gw.data_url(path)).send();
    let (f, a) = tokio::join!(slow("/v1/functions/slow"), slow("/v1/auth/slow"));
    let (f, a) = (f.expect("functions"), a.expect("auth"));
    let (f, a) = (Answer::of(f).await, Answer::of(a).await);
    assert_eq!(
        f.status,
        StatusCode::OK,
        "functions has its own, longer budget"
    );
    assert_eq!(f.text(), "done");
    assert_eq!(
        a.status,
        StatusCode::GATEWAY_TIMEOUT,
        "auth is cut at the default budget"
    );
    assert!(a.headers.contains_key("x-request-id"));
    assert!(a.code().ends_with("timeout"));
    assert!(started.elapsed() >= delay);
    assert_eq!(functions.count(), 1);
}

#[tokio::test]
async fn gateway_routes_have_a_budget_too() {
    // The management plane's extra routes get the default budget: a slow control backend is cut.
    let gw = Gateway::start_with(|c| c.timeouts.default_ms = 300).await;
    let slowly = Duration::from_millis(1_000);
    let _control = gw
        .bus
        .respond_after("control", slowly, |_| reply(200, &[], b""))
        .await;
    let started = Instant::now();
    let logs = console_client()
        .get(gw.mgmt_url("/v1/projects/e2e/logs"))
        .call();
    assert_eq!(logs.send().await.status(), StatusCode::GATEWAY_TIMEOUT);
    assert!(started.elapsed() < Duration::from_millis(1_000));
}
