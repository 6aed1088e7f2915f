//! `bench/pgo` optimises the production build with a profile of the gateway under a training
//! load. A route of that load that answers something else than it expects (a moved route, a new
//! requirement on a header) would train the build on error pages, so the script stops on it; this
//! test runs its check (`--check`: every route's status, WebSocket upgrades, no load) against the
//! binary of this test run, so that a change of routes shows here first, not at a release build.

use std::path::Path;
use std::process::{Command, Output};

use crate::support::cli::{failed_saying, stderr, succeeded};
use crate::support::config::binary;

/// The project's root.
fn root() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// This test run's `bench_peers` (`cargo test` builds the examples beside the binary, in
/// target/<profile>/examples).
fn peers() -> std::path::PathBuf {
    let peers = binary()
        .parent()
        .expect("the binary's folder")
        .join("examples/bench_peers");
    assert!(
        peers.exists(),
        "{} is not built: `cargo test` builds it, or `cargo build -p aura-gateway --example bench_peers`",
        peers.display()
    );
    peers
}

/// `bench/pgo --check` against this test run's gateway binary and `bench_peers`, with `env`
/// added to the script's environment (which the gateways it starts inherit).
fn check(env: &[(&str, &str)]) -> Output {
    let root = root();
    let gateway = binary();
    let peers = peers();
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

/// The bench scripts start their servers on ports picked free, and such a port can be bound by
/// another process first (the suite's own servers run beside `bench/pgo --check`). Here a
/// listener holds the port the script is handed first: `wait_port` does not take that
/// listener for `bench_peers` (which cannot bind and exits saying so), and `start_listening`
/// starts `bench_peers` again on another port, where it answers.
#[test]
fn a_server_whose_port_was_taken_is_not_mistaken_for_the_other_listener_and_starts_on_another() {
    const SCRIPT: &str = r#"
import importlib.machinery, importlib.util, socket, sys, tempfile, urllib.request
loader = importlib.machinery.SourceFileLoader("bench_run", sys.argv[1] + "/bench/run")
spec = importlib.util.spec_from_loader("bench_run", loader)
bench = importlib.util.module_from_spec(spec)
loader.exec_module(bench)
peers = sys.argv[2]
taken = socket.socket()
taken.bind(("127.0.0.1", 0))
taken.listen()
port = taken.getsockname()[1]
logs = tempfile.mkdtemp()
procs = bench.Procs()
try:
    alone = procs.start("alone", [peers, "http", f"127.0.0.1:{port}"], "0", logdir=logs)
    try:
        bench.wait_port(port, alone, "bench_peers on a taken port")
        print("WAITED: the other listener was taken for bench_peers")
    except SystemExit as e:
        print("REFUSED:", str(e).splitlines()[0])
    real = bench.free_port
    picks = iter([port])
    bench.free_port = lambda: next(picks, None) or real()
    proc, ports = bench.start_listening(procs, "again", 1,
                                        lambda p: [peers, "http", f"127.0.0.1:{p[0]}"], "0",
                                        "bench_peers", logdir=logs)
    body = urllib.request.urlopen(f"http://127.0.0.1:{ports[0]}/x", timeout=5).read()
    print("STARTED", ports[0] != port, bench.listens_on(proc.pid, ports[0]), body.decode().strip())
finally:
    procs.stop_all()
"#;
    let out = Command::new("python3")
        .arg("-c")
        .arg(SCRIPT)
        .arg(root())
        .arg(peers())
        .output()
        .expect("run python3");
    succeeded(&out);
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        said.contains("REFUSED: bench_peers on a taken port exited with"),
        "{said}\n{}",
        stderr(&out)
    );
    assert!(
        said.contains("STARTED True True hello, aura!"),
        "{said}\n{}",
        stderr(&out)
    );
    assert!(
        stderr(&out).contains("a port was taken before it was bound; starting again on others"),
        "{}",
        stderr(&out)
    );
}
