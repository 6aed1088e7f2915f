//! Builds the default policy plugins (and the hostile test plugins) for `wasm32-wasip2` and puts
//! the components in `OUT_DIR`, so that `cargo build` is the only step and the defaults are
//! embedded in the binary.
//!
//! The plugins are built once per change by a nested cargo with its own target directory
//! (`target/plugins/<checkout>`, one per checkout path), shared by every profile of the host:
//! debug, release, test and clippy builds all reuse the same components.

use std::env;
use std::path::{Path, PathBuf};
use std::process::Command;

// The host's table of stages: each stage's default plugin is the package
// `aura-plugin-<interface>`, built to `<key>.wasm`.
#[path = "src/plane.rs"]
#[expect(dead_code, reason = "the build reads the table of stages only")]
mod plane;
#[path = "src/stage.rs"]
#[expect(dead_code, reason = "the build reads the table of stages only")]
mod stage;

/// The hostile test plugins: (package, file name in OUT_DIR).
const TEST_PLUGINS: &[(&str, &str)] = &[
    ("aura-plugin-testing", "testing.wasm"),
    ("aura-plugin-testing-quota", "testing_quota.wasm"),
    ("aura-plugin-testing-legacy", "testing_legacy.wasm"),
    ("aura-plugin-testing-db", "testing_db.wasm"),
    (
        "aura-plugin-testing-quota-inputs",
        "testing_quota_inputs.wasm",
    ),
    ("aura-plugin-testing-api-key", "testing_api_key.wasm"),
];

/// Every plugin built: (package, file name in OUT_DIR), the default plugins first.
fn plugins() -> Vec<(String, String)> {
    stage::STAGES
        .iter()
        .map(|s| {
            (
                format!("aura-plugin-{}", s.interface),
                format!("{}.wasm", s.key),
            )
        })
        .chain(
            TEST_PLUGINS
                .iter()
                .map(|(p, f)| ((*p).to_owned(), (*f).to_owned())),
        )
        .collect()
}

const TARGET: &str = "wasm32-wasip2";

fn main() {
    let manifest_dir = PathBuf::from(env::var("CARGO_MANIFEST_DIR").expect("CARGO_MANIFEST_DIR"));
    let workspace = manifest_dir.parent().expect("workspace root").to_path_buf();
    let out_dir = PathBuf::from(env::var("OUT_DIR").expect("OUT_DIR"));
    let target_dir = env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .map(|d| {
            if d.is_absolute() {
                d
            } else {
                workspace.join(d)
            }
        })
        .unwrap_or_else(|| workspace.join("target"))
        .join("plugins")
        // The nested build's fingerprints are relative to its workspace: two checkouts sharing
        // one target directory would each take the plugins the other built last. Each
        // checkout builds into a directory of its own.
        .join(workspace_key(&workspace));

    println!(
        "cargo:rerun-if-changed={}",
        workspace.join("plugins").display()
    );
    println!("cargo:rerun-if-changed={}", workspace.join("wit").display());
    println!(
        "cargo:rerun-if-changed={}",
        manifest_dir.join("src/stage.rs").display()
    );
    println!(
        "cargo:rerun-if-changed={}",
        workspace.join("Cargo.lock").display()
    );

    git_revision(&workspace);
    ensure_target();
    let cargo = env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
    let mut cmd = Command::new(cargo);
    cmd.current_dir(&workspace)
        .arg("build")
        .arg("--quiet")
        .arg("--target")
        .arg(TARGET)
        .arg("--profile")
        .arg("plugin")
        .arg("--target-dir")
        .arg(&target_dir);
    let plugins = plugins();
    for (package, _) in &plugins {
        cmd.arg("-p").arg(package);
    }
    // The outer build's flags and wrappers (clippy, coverage) are for the host target; the
    // plugins get their own, so that every outer build sees the same plugin fingerprints.
    for var in [
        "CARGO_ENCODED_RUSTFLAGS",
        "RUSTFLAGS",
        "RUSTC_WORKSPACE_WRAPPER",
        "RUSTC_WRAPPER",
        "CARGO_TARGET_DIR",
        "CARGO_BUILD_TARGET",
        "CARGO_BUILD_RUSTFLAGS",
    ] {
        cmd.env_remove(var);
    }
    // A small guest stack keeps a fresh instance cheap; deep recursion traps instead.
    cmd.env(
        "CARGO_TARGET_WASM32_WASIP2_RUSTFLAGS",
        "-Clink-arg=-zstack-size=65536",
    );
    let status = cmd
        .status()
        .unwrap_or_else(|e| panic!("cannot run cargo to build the plugins: {e}"));
    if !status.success() {
        panic!(
            "building the policy plugins for {TARGET} failed (errors above); the target must be installed: \
             (rustup target add {TARGET})"
        );
    }
    let built = target_dir.join(TARGET).join("plugin");
    for (package, file) in &plugins {
        let artifact = built.join(format!("{}.wasm", package.replace('-', "_")));
        copy(&artifact, &out_dir.join(file));
    }
}

/// A short name for the checkout at `workspace` (a hash of its path).
fn workspace_key(workspace: &Path) -> String {
    use std::hash::{Hash, Hasher};
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    workspace.hash(&mut hasher);
    format!("{:016x}", hasher.finish())
}

/// Installs the wasm32-wasip2 standard library through rustup when it is missing, so that a
/// fresh clone builds with `cargo build` alone.
fn ensure_target() {
    let rustc = env::var("RUSTC").unwrap_or_else(|_| "rustc".to_owned());
    let sysroot = Command::new(&rustc)
        .args(["--print", "sysroot"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| PathBuf::from(String::from_utf8_lossy(&o.stdout).trim()));
    let installed = sysroot
        .as_ref()
        .is_some_and(|root| root.join("lib/rustlib").join(TARGET).is_dir());
    if installed {
        return;
    }
    println!(
        "cargo:warning=installing the {TARGET} target with rustup (needed to build the policy plugins)"
    );
    let status = Command::new("rustup")
        .args(["target", "add", TARGET])
        .status();
    if !matches!(status, Ok(s) if s.success()) {
        println!("cargo:warning=could not install {TARGET}; run: rustup target add {TARGET}");
    }
}

fn copy(from: &Path, to: &Path) {
    std::fs::copy(from, to)
        .unwrap_or_else(|e| panic!("copy {} to {}: {e}", from.display(), to.display()));
}

/// `BUILD_GIT_REVISION` (not `AURA_…`: cargo also sets it when running tests, where the
/// configuration would read it) for `/v1/admin/status`: the commit the binary is built from, when built
/// in a git checkout (rebuilt when the checked-out commit changes).
fn git_revision(workspace: &Path) {
    let git = |args: &[&str]| {
        Command::new("git")
            .args(args)
            .current_dir(workspace)
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
    };
    let Some(revision) = git(&["rev-parse", "--short=12", "HEAD"]) else {
        return;
    };
    println!("cargo:rustc-env=BUILD_GIT_REVISION={revision}");
    // Only files that exist: a missing one would rerun this script on every build.
    let mut watched = vec![".git/HEAD".to_owned(), ".git/packed-refs".to_owned()];
    if let Some(reference) = git(&["symbolic-ref", "-q", "HEAD"]) {
        watched.push(format!(".git/{reference}"));
    }
    for path in watched {
        let path = workspace.join(path);
        if path.is_file() {
            println!("cargo:rerun-if-changed={}", path.display());
        }
    }
}
