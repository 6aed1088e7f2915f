//! The gateway under test: in-process on ephemeral ports, or the real binary. Both are started
//! by [`super::builder::Gateway::builder`]; these are the handles it returns.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use aura_gateway::config::Config;
use aura_gateway::control::ControlStore;
use aura_gateway::server;
use aura_gateway::state::AppState;
use tokio::sync::oneshot;

use super::config::{METRICS_TOKEN, binary, compile_cache};
use super::responder::Bus;

/// A gateway served in this process on two ephemeral ports.
pub struct InProcess {
    pub data: SocketAddr,
    pub management: SocketAddr,
    pub state: AppState,
    /// Its NATS server and subject prefix.
    pub bus: Bus,
    stop: Option<oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<anyhow::Result<()>>>,
    /// Kept for the gateway's life: the folder of its control file, when the test gave none.
    _dir: Option<tempfile::TempDir>,
}

impl InProcess {
    /// Starts a gateway with `config` over `store` (its ports are replaced by ephemeral ones).
    pub async fn start_with_store(
        mut config: Config,
        store: Arc<dyn ControlStore>,
        dir: Option<tempfile::TempDir>,
    ) -> Self {
        config.host = "127.0.0.1".into();
        config.port = 0;
        config.management_port = 0;
        config.validate(None).expect("valid test config");
        let bus = Bus::new(&config.nats.url, &config.nats.subject_prefix);
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
            bus,
            stop: Some(stop_tx),
            task: Some(task),
            _dir: dir,
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

    /// The gateway's metrics text, from its data plane.
    pub async fn metrics(&self) -> String {
        metrics_at(self.data_url("/metrics")).await
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

async fn metrics_at(url: String) -> String {
    reqwest::Client::new()
        .get(url)
        .bearer_auth(METRICS_TOKEN)
        .send()
        .await
        .expect("metrics")
        .text()
        .await
        .expect("text")
}

/// A gateway binary process, killed when dropped.
pub struct Process {
    pub child: Child,
    pub port: u16,
    pub management_port: u16,
    pub log: PathBuf,
    /// Its NATS server and subject prefix, when it was started with a test configuration.
    pub bus: Bus,
    /// Kept for the process's life (removed after it is killed): its folder, when the test
    /// gave none.
    pub(super) folder: Option<tempfile::TempDir>,
}

impl Process {
    /// Runs `aura-gateway serve --config {config}` with its ports from AURA_PORT and
    /// AURA_MANAGEMENT_PORT, and waits for both planes to answer `/health`. A port taken by
    /// another test between being picked and being bound is picked again (up to five times);
    /// any other exit fails at once with the gateway's log. Unless `config` names a compile cache
    /// of its own, the gateway uses the test run's ([`compile_cache`]).
    pub fn serve(config: &Path, dir: &Path) -> Self {
        let own_cache =
            std::fs::read_to_string(config).is_ok_and(|text| text.contains("compile_cache_dir"));
        Self::serve_with(config, dir, |command| {
            if !own_cache {
                command.env("AURA_PLUGINS__COMPILE_CACHE_DIR", compile_cache());
            }
        })
    }

    /// [`Process::serve`], with `command` adjusted by `adjust` before each start.
    pub fn serve_with(config: &Path, dir: &Path, adjust: impl Fn(&mut Command)) -> Self {
        const ATTEMPTS: u32 = 5;
        for attempt in 1..=ATTEMPTS {
            let port = super::free_port();
            // Two picks can name the same port (it is free until bound): pick again.
            let management_port = std::iter::repeat_with(super::free_port)
                .find(|p| *p != port)
                .expect("a second free port");
            let log = dir.join("gateway.log");
            let mut command = Command::new(binary());
            command
                .arg("serve")
                .arg("--config")
                .arg(config)
                .env("AURA_PORT", port.to_string())
                .env("AURA_MANAGEMENT_PORT", management_port.to_string())
                .stdout(Stdio::null())
                .stderr(std::fs::File::create(&log).expect("log file"));
            adjust(&mut command);
            let child = command.spawn().expect("spawn gateway");
            let mut process = Self {
                child,
                port,
                management_port,
                log,
                bus: Bus::default(),
                folder: None,
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
        let started = std::time::Instant::now();
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

    /// The gateway's metrics text.
    pub async fn metrics(&self) -> String {
        metrics_at(self.data_url("/metrics")).await
    }

    /// `http://127.0.0.1:{port}{path}`.
    pub fn data_url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{}", self.port, path)
    }

    /// `http://127.0.0.1:{management_port}{path}`.
    pub fn mgmt_url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{}", self.management_port, path)
    }

    /// Resident memory of the gateway, in MiB.
    pub fn rss_mib(&self) -> f64 {
        super::metrics::rss_mib(self.child.id())
    }

    /// Context switches (voluntary and involuntary) of the gateway's threads named `name`
    /// (`/proc/<pid>/task/*/comm`); `None` when there is no such thread.
    pub fn thread_switches(&self, name: &str) -> Option<u64> {
        let tasks = std::fs::read_dir(format!("/proc/{}/task", self.child.id())).ok()?;
        let mut found = None;
        for task in tasks.flatten() {
            let comm = std::fs::read_to_string(task.path().join("comm")).unwrap_or_default();
            if comm.trim() != name {
                continue;
            }
            let status = std::fs::read_to_string(task.path().join("status")).unwrap_or_default();
            let switches: u64 = status
                .lines()
                .filter(|l| l.contains("ctxt_switches:"))
                .filter_map(|l| l.split_whitespace().last()?.parse::<u64>().ok())
                .sum();
            *found.get_or_insert(0) += switches;
        }
        found
    }

    /// Sends a signal (`-TERM`, `-HUP`) to the gateway.
    pub fn signal(&self, signal: &str) {
        signal_child(&self.child, signal);
    }

    /// Sends SIGTERM and waits for the process to exit; its exit status.
    pub async fn terminate(self) -> std::process::ExitStatus {
        self.signal("-TERM");
        self.exit().await
    }

    /// Waits for the process to exit; its exit status.
    pub async fn exit(mut self) -> std::process::ExitStatus {
        tokio::task::spawn_blocking(move || self.child.wait())
            .await
            .expect("join")
            .expect("wait")
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Sends `signal` (`-TERM`, `-HUP`) to `child`.
pub fn signal_child(child: &Child, signal: &str) {
    let pid = child.id().to_string();
    assert!(
        Command::new("kill")
            .args([signal, &pid])
            .status()
            .expect("kill")
            .success()
    );
}

/// Sends SIGTERM to a gateway process.
pub fn terminate(child: &Child) {
    signal_child(child, "-TERM");
}
