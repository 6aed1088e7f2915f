//! A real `nats-server` process on a free port, stopped when dropped or when the test process
//! ends.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use super::free_port;

/// A running `nats-server`.
pub struct NatsServer {
    child: Child,
    pub port: u16,
    _dir: tempfile::TempDir,
}

impl NatsServer {
    /// Starts a server; `extra_config` is appended to its configuration file. A port taken by
    /// another test between being picked and being bound is picked again (up to five times).
    pub fn start(extra_config: &str) -> Self {
        (0..5)
            .find_map(|_| Self::try_start_on(free_port(), extra_config))
            .expect("nats-server did not start on any of five free ports")
    }

    /// Starts a server on `port`.
    pub fn start_on(port: u16, extra_config: &str) -> Self {
        Self::try_start_on(port, extra_config)
            .unwrap_or_else(|| panic!("nats-server did not start on port {port}"))
    }

    /// Starts a server on `port`; `None` when it does not listen there (the port was taken).
    pub fn try_start_on(port: u16, extra_config: &str) -> Option<Self> {
        let dir = tempfile::tempdir().expect("tempdir");
        let conf: PathBuf = dir.path().join("nats.conf");
        std::fs::write(&conf, format!("listen: 127.0.0.1:{port}\n{extra_config}\n"))
            .expect("write nats.conf");
        // The server runs under a small shell that kills it as soon as its stdin closes: when
        // this handle is dropped, and also when the test process ends without dropping it (the
        // shared server is a static), so no server outlives the test run.
        let child = Command::new("sh")
            .arg("-c")
            .arg(r#""$0" -c "$1" & n=$!; read -r _; kill -9 "$n"; wait "$n""#)
            .arg(binary())
            .arg(&conf)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("sh and nats-server must be installed (the test command installs it)");
        let server = Self {
            child,
            port,
            _dir: dir,
        };
        server.wait_ready().then_some(server)
    }

    /// `nats://127.0.0.1:{port}`.
    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    fn wait_ready(&self) -> bool {
        let started = Instant::now();
        while started.elapsed() < Duration::from_secs(10) {
            if std::net::TcpStream::connect(("127.0.0.1", self.port)).is_ok() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        false
    }
}

impl Drop for NatsServer {
    fn drop(&mut self) {
        // Closing stdin makes the shell kill the server (SIGKILL) and wait for it.
        drop(self.child.stdin.take());
        let _ = self.child.wait();
    }
}

fn binary() -> String {
    std::env::var("NATS_SERVER_BIN").unwrap_or_else(|_| {
        for candidate in [
            "/usr/sbin/nats-server",
            "/usr/bin/nats-server",
            "/usr/local/bin/nats-server",
        ] {
            if std::path::Path::new(candidate).exists() {
                return candidate.to_owned();
            }
        }
        "nats-server".to_owned()
    })
}

/// One server shared by the tests that do not stop it.
pub fn shared() -> &'static NatsServer {
    static SHARED: OnceLock<NatsServer> = OnceLock::new();
    SHARED.get_or_init(|| NatsServer::start(""))
}
