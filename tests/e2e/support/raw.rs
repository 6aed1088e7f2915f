//! Raw HTTP/1.1 on a socket of its own, for what no client library would send.

use std::time::Duration;

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

/// [`raw_exchange`] with 127.0.0.1:`port`, off the runtime's threads.
pub async fn exchange(port: u16, raw: impl Into<Vec<u8>>) -> String {
    let raw = raw.into();
    tokio::task::spawn_blocking(move || raw_exchange(("127.0.0.1", port), &raw))
        .await
        .expect("exchange")
}

/// A `GET path` closing its connection, with `headers`.
pub fn get(path: &str, headers: &[(&str, &str)]) -> Vec<u8> {
    let mut raw = format!("GET {path} HTTP/1.1\r\nhost: gw\r\nconnection: close\r\n");
    for (n, v) in headers {
        raw += &format!("{n}: {v}\r\n");
    }
    raw += "\r\n";
    raw.into_bytes()
}

/// The status code of a raw HTTP/1.1 answer (0 when there is none).
pub fn status_of(response: &str) -> u16 {
    response
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0)
}
