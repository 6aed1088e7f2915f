//! Test support: a real `nats-server` on a free port, the gateway in process or as the binary
//! (started by [`builder::Gateway::builder`]), requests to it, and what the tests run against.

#![allow(dead_code)]

pub mod builder;
pub mod call;
pub mod cli;
pub mod config;
pub mod edge;
pub mod fixture;
pub mod gateway;
pub mod h2raw;
pub mod issuer;
pub mod metrics;
pub mod nats_server;
pub mod otlp;
pub mod outage;
pub mod pg_counter;
pub mod pki;
pub mod policy;
pub mod poll;
pub mod postgres;
pub mod raw;
pub mod records;
pub mod redis_server;
pub mod responder;
pub mod router;
pub mod tls_servers;
pub mod topology;
pub mod upstream;
pub mod wasm;

use std::net::TcpListener;
use std::sync::atomic::{AtomicU32, Ordering};

/// A port free right now on 127.0.0.1.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

/// Waits until 127.0.0.1:`port` accepts connections; fails naming `what` after `within`.
pub fn wait_for_port(port: u16, within: std::time::Duration, what: &str) {
    let started = std::time::Instant::now();
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(started.elapsed() < within, "{what}");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// A subject prefix no other test uses.
pub fn unique_prefix() -> String {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    format!(
        "t{}x{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

/// The security headers every response carries (CONTRACT §7).
pub const SECURITY_HEADERS: &[&str] = &[
    "content-security-policy",
    "x-content-type-options",
    "referrer-policy",
    "strict-transport-security",
    "x-frame-options",
];
