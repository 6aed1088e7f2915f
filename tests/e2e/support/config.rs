//! The configurations of the gateways under test: the in-process one as a [`Config`], the
//! binary's as a file, and the compile cache every gateway of a test run shares.

use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use aura_gateway::config::Config;

use super::fixture::{CONSOLE_SECRET, Fixture, USER_SECRET};

/// The fleet secret of the test configurations (change events on NATS are signed with it).
pub const FLEET_SECRET: &str = "test-fleet-secret-0123456789abcdef0123456789";

/// The metrics token of the test configurations.
pub const METRICS_TOKEN: &str = "test-metrics-token-0123456789";

/// The gateway binary built by cargo for these tests.
pub fn binary() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_aura-gateway"))
}

/// Where every gateway of this test run keeps the modules named in its configuration compiled
/// (`plugins.compile_cache_dir`), unless its test names a folder of its own: the default modules
/// are compiled once per run instead of once per gateway. Emptied when the run starts, and
/// filled once then (by `check-config`) so that gateways starting together find it complete.
pub fn compile_cache() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("e2e-compile-cache");
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&dir)
            .expect("compile cache folder");
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).expect("chmod");
        fill_compile_cache(&dir);
        dir
    })
}

/// Compiles the default modules and the testing CORS module into `dir`. Best effort: a gateway compiles
/// what it does not find there.
fn fill_compile_cache(dir: &Path) {
    let work = tempfile::tempdir().expect("tempdir");
    let config = work.path().join("gateway.toml");
    std::fs::write(
        &config,
        format!(
            "[plugins]\ncompile_cache_dir = {dir:?}\n\n[data_plane.plugins.cors]\nmodule = {:?}\n",
            aura_gateway::policy::stages::builtin::TESTING_PLUGIN_PATH,
        ),
    )
    .expect("config");
    let out = std::process::Command::new(binary())
        .args(["check-config", "--config"])
        .arg(&config)
        .output()
        .expect("run check-config");
    if !out.status.success() {
        eprintln!(
            "the compile cache was not filled: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// A test configuration: quiet logs, NATS at `nats_url` with the subject prefix `prefix`.
pub fn test_config(nats_url: &str, prefix: &str) -> Config {
    let mut config = Config::default();
    config.nats.url = nats_url.to_owned();
    config.nats.subject_prefix = prefix.to_owned();
    config.nats.fleet_secret = Some(FLEET_SECRET.into());
    config.log.level = "warn".into();
    config.metrics.token = Some(METRICS_TOKEN.into());
    config.plugins.call_deadline_ms = 2_000;
    config.plugins.compile_cache_dir = Some(compile_cache().display().to_string());
    // Tests send bursts from one address; the rate-limit tests set their own limits.
    for per_ip in [
        &mut config.rate_limit.data_plane_per_ip,
        &mut config.rate_limit.management_plane_per_ip,
    ] {
        per_ip.rate_per_second = 1_000_000;
        per_ip.burst = 1_000_000;
    }
    // Uploaded modules are compiled by the gateway binary's worker (this test process is not
    // the gateway executable).
    config.plugins.tenant_compile_worker = Some(binary().display().to_string());
    config.upstreams.postgrest_allowed_targets = vec!["127.0.0.0/8".into()];
    config.auth.user_jwt.hs256_secret = Some(USER_SECRET.into());
    config.auth.console_jwt.hs256_secret = Some(CONSOLE_SECRET.into());
    config
}

/// Writes `fx`'s control file (plus `extra_records`) and a configuration for the gateway binary
/// in `dir`: loopback, NATS at `nats_url` under `prefix`, the test secrets, per-IP limits out of
/// the way, then `extra_toml` (tables of its own; when it has a `[control]` table, that one is
/// the store's instead of the control file). Returns the config path.
pub fn binary_config(
    dir: &Path,
    fx: &Fixture,
    extra_records: &str,
    nats_url: &str,
    prefix: &str,
    extra_toml: &str,
) -> PathBuf {
    std::fs::write(
        dir.join("control.toml"),
        format!("{}\n{extra_records}", fx.control_file()),
    )
    .expect("control file");
    let config = format!(
        r#"host = "127.0.0.1"

[log]
level = "info"

[nats]
url = "{nats_url}"
subject_prefix = "{prefix}"
fleet_secret = "{FLEET_SECRET}"

{control}
[metrics]
token = "{METRICS_TOKEN}"

[auth.user_jwt]
hs256_secret = "{USER_SECRET}"

[auth.console_jwt]
hs256_secret = "{CONSOLE_SECRET}"

[rate_limit.data_plane_per_ip]
rate_per_second = 1000000
burst = 1000000

[rate_limit.management_plane_per_ip]
rate_per_second = 1000000
burst = 1000000

{extra_toml}
"#,
        control = if extra_toml.contains("[control]") {
            ""
        } else {
            "[control]\nfile = \"control.toml\"\nreload_interval_ms = 200\n"
        },
    );
    write_config(dir, &config)
}

/// Writes `toml` as `dir/gateway.toml`; returns its path.
pub fn write_config(dir: &Path, toml: &str) -> PathBuf {
    let path = dir.join("gateway.toml");
    std::fs::write(&path, toml).expect("write config");
    path
}

/// `path` in the repository's `examples` folder.
pub(crate) fn example(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../examples")
        .join(path)
}
