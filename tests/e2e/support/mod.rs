//! Test support: a real `nats-server` on a free port, an in-process gateway on ephemeral
//! ports, and the gateway binary.

#![allow(dead_code)]

pub mod fixture;
pub mod gateway;
pub mod h2raw;
pub mod nats_server;
pub mod otlp;
pub mod outage;
pub mod pg_counter;
pub mod pki;
pub mod postgres;
pub mod redis_server;
pub mod responder;
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
