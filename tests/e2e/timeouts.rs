//! Timeout budgets per route group.

use std::time::{Duration, Instant};

use reqwest::StatusCode;

use crate::support::builder::Gateway;
use crate::support::call::{Answer, Call, IntoCall, client, console_client};
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

/// What `count` concurrent GETs of `path` answered, each with how long it took.
async fn concurrently(
    gw: &crate::support::gateway::Process,
    key: &str,
    path: &str,
    count: usize,
) -> Vec<(Answer, Duration)> {
    let calls = (0..count).map(|_| async {
        let started = Instant::now();
        let answer = Call::get(gw.data_url(path)).key(key).read().await;
        (answer, started.elapsed())
    });
    futures::future::join_all(calls).await
}

/// Route budgets and backend calls keep their timers from one request to the next (a timer
/// still set for a finished request is moved to the next one's deadline): through the binary,
/// each request is cut at its own group's budget, whether the timer it gets last served a
/// longer budget, a shorter one, or fired while no request held it.
#[tokio::test]
async fn each_request_is_cut_at_its_own_budget_whatever_its_timer_served_before_through_the_binary()
{
    let started = Gateway::builder()
        .toml("[timeouts]\ndefault_ms = 700\nfunctions_ms = 5000\n")
        .binary();
    let (gw, key) = (&started.gw, started.fx.anon_key.clone());
    let answer = |_| reply(200, &[], b"done");
    let functions = gw
        .bus
        .respond_after("functions", Duration::from_millis(1_200), answer)
        .await;
    let _ai = gw
        .bus
        .respond_after("ai", Duration::from_millis(3_000), answer)
        .await;
    let _notifications = gw.bus.respond("notifications", answer).await;
    let within_default =
        |took: Duration| took >= Duration::from_millis(700) && took < Duration::from_millis(2_500);

    for round in 0..2 {
        // Functions outlive the default budget: their timers are left set 5 s ahead.
        for (a, took) in concurrently(gw, &key, "/v1/functions/slow", 8).await {
            assert_eq!(
                (a.status, a.text()),
                (StatusCode::OK, "done".into()),
                "round {round}"
            );
            assert!(
                took >= Duration::from_millis(1_200),
                "round {round}: {took:?}"
            );
        }
        // The same timers moved 4.3 s earlier: the default budget cuts these at 0.7 s, neither
        // at the 5 s the timers were set for nor at the backend's answer (3 s).
        for (a, took) in concurrently(gw, &key, "/v1/ai/slow", 8).await {
            assert_eq!(a.status, StatusCode::GATEWAY_TIMEOUT, "round {round}");
            assert!(a.code().ends_with("timeout"), "round {round}: {}", a.code());
            assert!(within_default(took), "round {round}: cut after {took:?}");
        }
        // Quick answers; then their timers fire while nobody holds them. A fired timer handed
        // to the next request is set again: it does not cut that request at once.
        for (a, _) in concurrently(gw, &key, "/v1/notifications/quick", 8).await {
            assert_eq!(a.status, StatusCode::OK, "round {round}");
        }
        tokio::time::sleep(Duration::from_millis(1_000)).await;
    }
    assert_eq!(functions.count(), 16);
    for (a, took) in concurrently(gw, &key, "/v1/ai/slow", 8).await {
        assert_eq!(a.status, StatusCode::GATEWAY_TIMEOUT);
        assert!(within_default(took), "cut after {took:?}");
    }
}
