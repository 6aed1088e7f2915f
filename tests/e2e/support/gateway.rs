//! The gateway under test: in-process on ephemeral ports, or the real binary.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use aura_gateway::config::Config;
use aura_gateway::server;
use aura_gateway::state::AppState;
use tokio::sync::oneshot;

/// A gateway served in this process on two ephemeral ports.
pub struct InProcess {
    pub data: SocketAddr,
    pub management: SocketAddr,
    pub state: AppState,
    stop: Option<oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<anyhow::Result<()>>>,
}

impl InProcess {
    /// Starts a gateway with `config` (its ports are replaced by ephemeral ones).
    /// Without a control file in `config`, the gateway uses the standard e2e records
    /// ([`TEST_KEY`], [`TEST_PROJECT`], [`TEST_CONSOLE_USER`]).
    pub async fn start(config: Config) -> Self {
        let store: std::sync::Arc<dyn aura_gateway::control::ControlStore> =
            if config.control.file.is_none() {
                std::sync::Arc::new(e2e_store())
            } else {
                aura_gateway::control::open(&config.control, None)
                    .await
                    .expect("control store")
            };
        Self::start_with_store(config, store).await
    }

    /// Starts a gateway over `store`.
    pub async fn start_with_store(
        mut config: Config,
        store: std::sync::Arc<dyn aura_gateway::control::ControlStore>,
    ) -> Self {
        config.host = "127.0.0.1".into();
        config.port = 0;
        config.management_port = 0;
        config.validate(None).expect("valid test config");
        let state = AppState::build_with_store(config.clone(), None, store)
            .await
            .expect("state");
        let (data, management) = server::bind(&config).await.expect("bind");
        let (data_addr, mgmt_addr) = (
            data.local_addr().expect("addr"),
            management.local_addr().expect("addr"),
        );
        let (stop_tx, stop_rx) = oneshot::channel::<()>();
        let task = tokio::spawn(server::serve(state.clone(), data, management, async move {
            let _ = stop_rx.await;
        }));
        Self {
            data: data_addr,
            management: mgmt_addr,
            state,
            stop: Some(stop_tx),
            task: Some(task),
        }
    }

    /// `http://{data}{path}`.
    pub fn data_url(&self, path: &str) -> String {
        format!("http://{}{}", self.data, path)
    }

    /// `http://{management}{path}`.
    pub fn mgmt_url(&self, path: &str) -> String {
        format!("http://{}{}", self.management, path)
    }

    /// Signals shutdown and waits for the server to finish.
    pub async fn shutdown(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(task) = self.task.take() {
            let _ = task.await;
        }
    }
}

impl Drop for InProcess {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

/// A test configuration: quiet logs, NATS at `nats_url` with a unique subject prefix.
pub fn test_config(nats_url: &str, prefix: &str) -> Config {
    let mut config = Config::default();
    config.nats.url = nats_url.to_owned();
    config.nats.subject_prefix = prefix.to_owned();
    config.nats.fleet_secret = Some(FLEET_SECRET.into());
    config.log.level = "warn".into();
    config.metrics.token = Some("test-metrics-token-0123456789".into());
    config.plugins.call_deadline_ms = 2_000;
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
    config.auth.user_jwt.hs256_secret = Some(super::fixture::USER_SECRET.into());
    config.auth.console_jwt.hs256_secret = Some(super::fixture::CONSOLE_SECRET.into());
    config
}

/// The gateway binary built by cargo for these tests.
pub fn binary() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_aura-gateway"))
}

/// A gateway binary process, killed when dropped.
pub struct Process {
    pub child: Child,
    pub port: u16,
    pub management_port: u16,
    pub log: PathBuf,
}

impl Process {
    /// Runs `aura-gateway serve --config {config}` with its ports from AURA_PORT and
    /// AURA_MANAGEMENT_PORT, and waits for both planes to answer `/health`. A port taken by
    /// another test between being picked and being bound is picked again (up to five times);
    /// any other exit fails at once with the gateway's log.
    pub fn serve(config: &Path, dir: &Path) -> Self {
        const ATTEMPTS: u32 = 5;
        for attempt in 1..=ATTEMPTS {
            let port = super::free_port();
            // Two picks can name the same port (it is free until bound): pick again.
            let management_port = std::iter::repeat_with(super::free_port)
                .find(|p| *p != port)
                .expect("a second free port");
            let log = dir.join("gateway.log");
            let child = Command::new(binary())
                .arg("serve")
                .arg("--config")
                .arg(config)
                .env("AURA_PORT", port.to_string())
                .env("AURA_MANAGEMENT_PORT", management_port.to_string())
                .stdout(Stdio::null())
                .stderr(std::fs::File::create(&log).expect("log file"))
                .spawn()
                .expect("spawn gateway");
            let mut process = Self {
                child,
                port,
                management_port,
                log,
            };
            if process.wait_healthy() {
                return process;
            }
            let log = process.log_text();
            if attempt == ATTEMPTS || !log.contains("Address already in use") {
                panic!("gateway did not start; log:\n{log}");
            }
        }
        unreachable!("the last attempt returns or panics")
    }

    /// Whether both planes answer; `false` as soon as the process has exited.
    fn wait_healthy(&mut self) -> bool {
        let started = Instant::now();
        // Loading policy modules comes first: large ones (a Python or JavaScript runtime) take
        // tens of seconds each to compile in a debug build.
        while started.elapsed() < Duration::from_secs(300) {
            let up = |port| std::net::TcpStream::connect(("127.0.0.1", port)).is_ok();
            if up(self.port) && up(self.management_port) {
                return true;
            }
            if matches!(self.child.try_wait(), Ok(Some(_))) {
                return false;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        false
    }

    /// What the gateway logged so far.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// `http://127.0.0.1:{port}{path}`.
    pub fn data_url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{}", self.port, path)
    }

    /// `http://127.0.0.1:{management_port}{path}`.
    pub fn mgmt_url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{}", self.management_port, path)
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `GET /health` on the data plane of `gw` with `key` and a CORS `Origin`: what a project's
/// CORS decision looks like.
pub async fn cors_probe(gw: &Process, key: &str) -> reqwest::Response {
    reqwest::Client::new()
        .get(gw.data_url("/health"))
        .header("apikey", key)
        .header("origin", "https://a.example")
        .send()
        .await
        .expect("answer")
}

/// A gateway binary over `fx`'s records (plus `extra_records`) in `dir`, on the shared NATS
/// server under a fresh subject prefix, with `extra_toml` appended to its configuration.
pub fn serve_binary(
    dir: &Path,
    fx: &super::fixture::Fixture,
    extra_records: &str,
    extra_toml: &str,
) -> Process {
    let config = binary_config(
        dir,
        fx,
        extra_records,
        &super::nats_server::shared().url(),
        &super::unique_prefix(),
        extra_toml,
    );
    Process::serve(&config, dir)
}

/// A gateway binary over a new [`super::fixture::Fixture`]'s records in a new folder, with
/// `extra_toml` (see [`serve_binary`]).
pub struct Started {
    pub gw: Process,
    pub fx: super::fixture::Fixture,
    /// Kept for the test's life: the gateway's files.
    pub dir: tempfile::TempDir,
}

/// Starts a [`Started`] gateway.
pub fn start_binary(extra_toml: &str) -> Started {
    let dir = tempfile::tempdir().expect("tempdir");
    let fx = super::fixture::Fixture::new();
    let gw = serve_binary(dir.path(), &fx, "", extra_toml);
    Started { gw, fx, dir }
}

/// Sends SIGTERM to a gateway process.
pub fn terminate(child: &Child) {
    let pid = child.id().to_string();
    assert!(
        Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .expect("kill")
            .success()
    );
}

/// Puts `module` in the file store's module directory under `dir` and returns the control-file
/// record installing it as `project`'s `cors` module, as another instance would have written it.
pub fn stored_cors_module(dir: &Path, project: &str, module: &[u8]) -> String {
    let digest = aura_gateway::policy::tenants::digest_of(module);
    std::fs::create_dir_all(dir.join("modules")).expect("dir");
    std::fs::write(dir.join(format!("modules/{digest}.wasm")), module).expect("module");
    format!(
        "[[project_policies]]\nproject_ref = \"{project}\"\nstage = \"cors\"\ndigest = \"{digest}\"\nconfig = \"{{}}\"\n"
    )
}

/// An anon key of [`TEST_PROJECT`] in the standard e2e records.
pub const TEST_KEY: &str = "aura_pk_e2e_0123456789abcdefghijklmnopqrstuvwxyz";
/// The project of the standard e2e records.
pub const TEST_PROJECT: &str = "e2e";
/// The owner of [`TEST_PROJECT`]'s organization.
pub const TEST_CONSOLE_USER: &str = "00000000-0000-4000-8000-0000000000ee";

/// The standard e2e records as a control file.
pub fn e2e_control_file() -> String {
    format!(
        r#"[[organizations]]
id = "00000000-0000-4000-8000-0000000000e0"
name = "e2e"

[[projects]]
ref = "{TEST_PROJECT}"
organization_id = "00000000-0000-4000-8000-0000000000e0"
db_engine = "postgres"
topology = "shared"

[[organization_members]]
organization_id = "00000000-0000-4000-8000-0000000000e0"
user_id = "{TEST_CONSOLE_USER}"
role = "owner"

[[api_keys]]
id = "00000000-0000-4000-8000-0000000000e1"
project_ref = "{TEST_PROJECT}"
role = "anon"
key_sha256 = "{}"
"#,
        aura_gateway::auth::keys::hash_key(TEST_KEY)
    )
}

/// A file store of the standard e2e records (in a fresh temporary file).
pub fn e2e_store() -> aura_gateway::control::file::FileStore {
    // Kept: the store writes beside its file (the policy history, stored modules).
    let dir = tempfile::tempdir().expect("tempdir").keep();
    let path = dir.join("e2e-control.toml");
    std::fs::write(&path, e2e_control_file()).expect("write");
    aura_gateway::control::file::FileStore::open(&path).expect("valid")
}

/// An HTTP client sending [`TEST_KEY`] on every request.
pub fn client() -> reqwest::Client {
    let mut headers = reqwest::header::HeaderMap::new();
    headers.insert(
        "apikey",
        reqwest::header::HeaderValue::from_static(TEST_KEY),
    );
    reqwest::Client::builder()
        .default_headers(headers)
        .build()
        .expect("client")
}

/// An HTTP client sending a console token of [`TEST_CONSOLE_USER`] on every request.
pub fn console_client() -> reqwest::Client {
    let user = uuid::Uuid::parse_str(TEST_CONSOLE_USER).expect("uuid");
    let mut headers = reqwest::header::HeaderMap::new();
    headers.insert(
        "authorization",
        reqwest::header::HeaderValue::from_str(&format!(
            "Bearer {}",
            super::fixture::console_token(user)
        ))
        .expect("header"),
    );
    reqwest::Client::builder()
        .default_headers(headers)
        .build()
        .expect("client")
}

/// Writes `fx`'s control file (plus `extra_records`) and a configuration for the gateway binary
/// in `dir`: loopback, NATS at `nats_url` under `prefix`, the test secrets, per-IP limits out of
/// the way, then `extra_toml` (tables of its own; when it has a `[control]` table, that one is
/// the store's instead of the control file). Returns the config path.
pub fn binary_config(
    dir: &Path,
    fx: &super::fixture::Fixture,
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
hs256_secret = "{user}"

[auth.console_jwt]
hs256_secret = "{console}"

[rate_limit.data_plane_per_ip]
rate_per_second = 1000000
burst = 1000000

[rate_limit.management_plane_per_ip]
rate_per_second = 1000000
burst = 1000000

{extra_toml}
"#,
        user = super::fixture::USER_SECRET,
        console = super::fixture::CONSOLE_SECRET,
        control = if extra_toml.contains("[control]") {
            ""
        } else {
            "[control]\nfile = \"control.toml\"\nreload_interval_ms = 200\n"
        },
    );
    let path = dir.join("gateway.toml");
    std::fs::write(&path, config).expect("config");
    path
}

/// The fleet secret of the test configurations (change events on NATS are signed with it).
pub const FLEET_SECRET: &str = "test-fleet-secret-0123456789abcdef0123456789";

/// The metrics token of the test configurations.
pub const METRICS_TOKEN: &str = "test-metrics-token-0123456789";

/// The sum of the samples of `name` whose labels contain every one of `labels`
/// (`plane="data"`), in a Prometheus text exposition.
pub fn metric(text: &str, name: &str, labels: &[&str]) -> f64 {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter(|l| {
            l.strip_prefix(name)
                .is_some_and(|rest| rest.starts_with('{') || rest.starts_with(' '))
        })
        .filter(|l| labels.iter().all(|want| l.contains(want)))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// Resident memory of process `pid`, in MiB.
pub fn rss_mib(pid: u32) -> f64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        })
        .map_or(0.0, |kib| kib / 1024.0)
}

impl Process {
    /// The gateway's metrics text.
    pub async fn metrics(&self) -> String {
        reqwest::Client::new()
            .get(self.data_url("/metrics"))
            .bearer_auth(METRICS_TOKEN)
            .send()
            .await
            .expect("metrics")
            .text()
            .await
            .expect("text")
    }

    /// Resident memory of the gateway, in MiB.
    pub fn rss_mib(&self) -> f64 {
        rss_mib(self.child.id())
    }
}

/// Sends `raw` on a new connection to `addr` and returns what came back until the gateway
/// closed the connection or went quiet for a second.
pub fn raw_exchange(addr: impl std::net::ToSocketAddrs, raw: &[u8]) -> String {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(1)))
        .expect("timeout");
    s.write_all(raw).expect("write");
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match s.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => out.extend_from_slice(&buf[..n]),
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The events of a file store's policy history under `dir` (every project's and the operator's,
/// every stage: one line each in `policy-history/<scope>/<stage>.jsonl`).
pub fn file_history_lines(dir: &Path) -> usize {
    let root = dir.join(aura_gateway::control::file_history::DIR);
    let Ok(scopes) = std::fs::read_dir(&root) else {
        return 0;
    };
    scopes
        .flatten()
        .filter_map(|scope| std::fs::read_dir(scope.path()).ok())
        .flat_map(|files| files.flatten())
        .filter(|f| f.path().extension().is_some_and(|x| x == "jsonl"))
        .map(|f| {
            std::fs::read_to_string(f.path())
                .map(|t| t.lines().count())
                .unwrap_or(0)
        })
        .sum()
}
