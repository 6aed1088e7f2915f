//! `bench/run --skip-build` and `bench/pair` measure a gateway binary they did not build. One
//! older than the sources it is built from measures the code before a change, and both say so,
//! naming the newest such files (`newer_sources` in `bench/run`). This test gives that check a
//! binary dated before every source file, then one dated after them all. And the instructions
//! `bench/run` counts in libc's `memcpy` (reported apart) are read from a callgrind file with
//! and without the cache simulation's columns.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// `bench/run`'s function `function` called on `path`, its answer as JSON.
fn bench_run(function: &str, path: &Path) -> serde_json::Value {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let script = "import importlib.machinery, importlib.util, json, sys\n\
                  loader = importlib.machinery.SourceFileLoader('bench_run', sys.argv[1])\n\
                  module = importlib.util.module_from_spec(\n\
                  \x20   importlib.util.spec_from_loader('bench_run', loader))\n\
                  loader.exec_module(module)\n\
                  print(json.dumps(getattr(module, sys.argv[2])(sys.argv[3])))\n";
    let out = Command::new("python3")
        .arg("-c")
        .arg(script)
        .arg(root.join("bench/run"))
        .arg(function)
        .arg(path)
        .output()
        .expect("run python3");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("JSON")
}

/// `bench/run`'s `newer_sources(binary)`: the tracked sources changed after `binary`.
fn newer_sources(binary: &Path) -> Vec<String> {
    serde_json::from_value(bench_run("newer_sources", binary)).expect("a JSON list of paths")
}

/// A callgrind file of `events`, with 3,000 instructions in libc's `memcpy` and 7,000 in the
/// gateway's own code (each event's other counts after them).
fn callgrind_file(dir: &Path, events: &[&str]) -> std::path::PathBuf {
    let others = |base: u64| {
        (1..events.len() as u64)
            .map(|i| format!(" {}", base + i))
            .collect::<String>()
    };
    let text = format!(
        "version: 1\ncreator: callgrind-3.19.0\npid: 1\ncmd: aura-gateway\npart: 1\n\
         positions: line\nevents: {}\n\
         ob=(1) /usr/lib/x86_64-linux-gnu/libc.so.6\n\
         fl=(1) ./string/../sysdeps/x86_64/multiarch/memmove-vec-unaligned-erms.S\n\
         fn=(1) __memcpy_avx_unaligned_erms\n1 3000{}\n\
         ob=(2) /usr/local/bin/aura-gateway\nfl=(2) host/src/http1/server.rs\n\
         fn=(2) aura_gateway::http1::server::parse\n1 7000{}\n",
        events.join(" "),
        others(20),
        others(10),
    );
    let path = dir.join(format!("callgrind.{}", events.len()));
    std::fs::write(&path, text).expect("write the callgrind file");
    path
}

#[test]
fn the_instructions_in_memcpy_are_read_with_and_without_the_cache_simulation() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    for events in [
        &["Ir"][..],
        &[
            "Ir", "Dr", "Dw", "I1mr", "D1mr", "D1mw", "ILmr", "DLmr", "DLmw",
        ][..],
    ] {
        let file = callgrind_file(dir.path(), events);
        assert_eq!(
            bench_run("memcpy_instructions", &file),
            serde_json::json!(3000),
            "{events:?}"
        );
    }
}

#[test]
fn a_gateway_binary_older_than_its_sources_is_named_by_the_benchmarks() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let binary = dir.path().join("aura-gateway");
    std::fs::write(&binary, b"a stand-in for a gateway binary").expect("write it");
    let file = std::fs::File::options()
        .write(true)
        .open(&binary)
        .expect("open it");

    file.set_modified(UNIX_EPOCH + Duration::from_secs(1))
        .expect("date it 1970");
    let stale = newer_sources(&binary);
    for source in [
        "host/src/main.rs",
        "host/src/policy/stages/api_key.rs",
        "wit/gateway.wit",
        "Cargo.lock",
    ] {
        assert!(stale.iter().any(|p| p == source), "{source}: {stale:?}");
    }
    assert!(
        stale.iter().all(|p| ["host/", "plugins/", "wit/"]
            .iter()
            .any(|dir| p.starts_with(dir))
            || p == "Cargo.toml"
            || p == "Cargo.lock"),
        "only the gateway's own sources: {stale:?}"
    );

    file.set_modified(SystemTime::now() + Duration::from_secs(365 * 86_400))
        .expect("date it a year ahead");
    assert_eq!(newer_sources(&binary), Vec::<String>::new());
}
