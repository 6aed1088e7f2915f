//! `bench/pgo` optimises the production build with a profile of the gateway under a training
//! load. A route of that load that answers something else than it expects (a moved route, a new
//! requirement on a header) would train the build on error pages, so the script stops on it; this
//! test runs its check (`--check`: every route's status, WebSocket upgrades, no load) against the
//! binary of this test run, so that a change of routes shows here first, not at a release build.

use std::path::Path;
use std::process::{Command, Output};

use crate::support::cli::{failed_saying, stderr, succeeded};
use crate::support::config::binary;

/// `bench/pgo --check` against this test run's gateway binary and `bench_peers`, with `env`
/// added to the script's environment (which the gateways it starts inherit).
fn check(env: &[(&str, &str)]) -> Output {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let gateway = binary();
    // `cargo test` builds the examples beside the binary (target/<profile>/examples).
    let peers = gateway
        .parent()
        .expect("the binary's folder")
        .join("examples/bench_peers");
    assert!(
        peers.exists(),
        "{} is not built: `cargo test` builds it, or `cargo build -p aura-gateway --example bench_peers`",
        peers.display()
    );
    Command::new("python3")
        .arg(root.join("bench/pgo"))
        .arg("--check")
        .arg(&gateway)
        .arg(&peers)
        .envs(env.iter().copied())
        .output()
        .expect("run bench/pgo --check")
}

#[test]
fn every_route_of_the_pgo_training_load_answers_as_the_script_expects() {
    let out = check(&[]);
    succeeded(&out);
    let log = stderr(&out);
    for (route, status) in [
        ("storage, one key", "200"),
        ("storage upload", "200"),
        ("CORS preflight", "204"),
        ("db over NATS", "200"),
        ("functions over NATS", "200"),
        ("unknown API key", "401"),
        ("dot segment", "400"),
        ("management: project", "200"),
        ("management: no JWT", "401"),
        ("metrics", "200"),
    ] {
        assert!(
            log.lines()
                .any(|line| line.contains(route) && line.trim_end().ends_with(status)),
            "{route}: not checked as {status}:\n{log}"
        );
    }
    assert!(log.contains("5 upgrades"), "{log}");
    assert!(
        log.contains("every route of the training load answered as it should"),
        "{log}"
    );
}

#[test]
fn a_training_route_answering_otherwise_stops_the_script_naming_it() {
    // Another metrics token than the script's (the environment overrides the configuration
    // file): `/metrics` answers 401 where the training load expects 200.
    let out = check(&[("AURA_METRICS__TOKEN", "another-metrics-token-0123456789")]);
    failed_saying(&out, "metrics (GET http://127.0.0.1:");
    failed_saying(&out, "answered 401, not 200");
    assert!(
        !stderr(&out).contains("every route of the training load answered as it should"),
        "{}",
        stderr(&out)
    );
}
