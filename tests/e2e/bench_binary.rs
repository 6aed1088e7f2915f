//! `bench/run --skip-build` and `bench/pair` measure a gateway binary they did not build. One
//! older than the sources it is built from measures the code before a change, and both say so,
//! naming the newest such files (`newer_sources` in `bench/run`). This test gives that check a
//! binary dated before every source file, then one dated after them all.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// `bench/run`'s `newer_sources(binary)`: the tracked sources changed after `binary`.
fn newer_sources(binary: &Path) -> Vec<String> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let script = "import importlib.machinery, importlib.util, json, sys\n\
                  loader = importlib.machinery.SourceFileLoader('bench_run', sys.argv[1])\n\
                  module = importlib.util.module_from_spec(\n\
                  \x20   importlib.util.spec_from_loader('bench_run', loader))\n\
                  loader.exec_module(module)\n\
                  print(json.dumps(module.newer_sources(sys.argv[2])))\n";
    let out = Command::new("python3")
        .arg("-c")
        .arg(script)
        .arg(root.join("bench/run"))
        .arg(binary)
        .output()
        .expect("run python3");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("a JSON list of paths")
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
