//! The gateway binary's other commands (`check-config`, `keys`, `plugin`, `wit`…): run, and
//! what they said.

use std::path::Path;
use std::process::{Command, Output};

use super::config::binary;

/// `aura-gateway args…` (then `--config config`); what it printed and how it exited.
pub fn run(args: &[&str], config: Option<&Path>) -> Output {
    let mut command = Command::new(binary());
    command.args(args);
    if let Some(config) = config {
        command.arg("--config").arg(config);
    }
    command.output().expect("run the gateway binary")
}

/// `aura-gateway plugin check module --stage stage --config config --vectors vectors`, with the
/// compile cache `cache` when given.
pub fn plugin_check(
    module: &Path,
    stage: &str,
    config: &Path,
    vectors: &Path,
    cache: Option<&Path>,
) -> Output {
    let mut command = Command::new(binary());
    command.args(["plugin", "check"]).arg(module);
    command.args(["--stage", stage, "--config"]).arg(config);
    command.arg("--vectors").arg(vectors);
    if let Some(cache) = cache {
        command.arg("--compile-cache-dir").arg(cache);
    }
    command.output().expect("plugin check")
}

/// What `out` wrote to stdout.
pub fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `aura-gateway check-config --config path`.
pub fn check_config(path: &Path) -> Output {
    run(&["check-config"], Some(path))
}

/// What `out` wrote to stderr.
pub fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// `out` exited successfully; its stderr otherwise.
pub fn succeeded(out: &Output) {
    assert!(out.status.success(), "{}", stderr(out));
}

/// `out` failed, saying `what` on stderr.
pub fn failed_saying(out: &Output, what: &str) {
    assert!(!out.status.success());
    let stderr = stderr(out);
    assert!(stderr.contains(what), "{stderr}");
}
