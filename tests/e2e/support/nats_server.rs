//! A real `nats-server` process on a free port, stopped when dropped.

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
    /// Starts a server; `extra_config` is appended to its configuration file.
    pub fn start(extra_config: &str) -> Self {
        Self::start_on(free_port(), extra_config)
    }

    /// Starts a server on `port`.
    pub fn start_on(port: u16, extra_config: &str) -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let conf: PathBuf = dir.path().join("nats.conf");
        std::fs::write(&conf, format!("listen: 127.0.0.1:{port}\n{extra_config}\n"))
            .expect("write nats.conf");
        let child = Command::new(binary())
            .arg("-c")
            .arg(&conf)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("nats-server must be installed (the test command installs it)");
        let server = Self {
            child,
            port,
            _dir: dir,
        };
        server.wait_ready();
        server
    }

    /// `nats://127.0.0.1:{port}`.
    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    fn wait_ready(&self) {
        let started = Instant::now();
        while started.elapsed() < Duration::from_secs(10) {
            if std::net::TcpStream::connect(("127.0.0.1", self.port)).is_ok() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        panic!("nats-server did not start on port {}", self.port);
    }
}

impl Drop for NatsServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
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
