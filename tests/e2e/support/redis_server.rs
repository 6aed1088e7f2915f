//! A real `redis-server` process on a free port, stopped when dropped; it can be frozen
//! (SIGSTOP) and resumed (SIGCONT).

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use super::free_port;

/// A running `redis-server`.
pub struct RedisServer {
    child: Child,
    pub port: u16,
}

impl RedisServer {
    /// Starts a server with no persistence.
    pub fn start() -> Self {
        Self::start_on(free_port())
    }

    /// Starts a server on `port` (a restart after [`RedisServer::kill`]).
    pub fn start_on(port: u16) -> Self {
        let child = Command::new(binary())
            .args([
                "--port",
                &port.to_string(),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server must be installed (the test command installs it)");
        let server = Self { child, port };
        super::wait_for_port(port, Duration::from_secs(10), "redis-server did not start");
        server
    }

    /// `redis://127.0.0.1:{port}/`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    fn signal(&self, signal: &str) {
        let ok = Command::new("kill")
            .args([signal, &self.child.id().to_string()])
            .status()
            .expect("kill")
            .success();
        assert!(ok, "kill {signal}");
    }

    /// Freezes the server (SIGSTOP): connections stay open, nothing is answered.
    pub fn freeze(&self) {
        self.signal("-STOP");
    }

    /// Resumes a frozen server (SIGCONT).
    pub fn resume(&self) {
        self.signal("-CONT");
    }

    /// Kills the server (SIGKILL): connections reset, the port refuses.
    pub fn kill(mut self) -> u16 {
        let _ = self.child.kill();
        let _ = self.child.wait();
        self.port
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.resume_quietly();
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl RedisServer {
    fn resume_quietly(&self) {
        let _ = Command::new("kill")
            .args(["-CONT", &self.child.id().to_string()])
            .status();
    }
}

fn binary() -> String {
    for candidate in ["/usr/bin/redis-server", "/usr/local/bin/redis-server"] {
        if std::path::Path::new(candidate).exists() {
            return candidate.to_owned();
        }
    }
    "redis-server".to_owned()
}
