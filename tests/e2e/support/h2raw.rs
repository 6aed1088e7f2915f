//! HTTP/2 written frame by frame, for clients that misbehave on purpose: the preface, SETTINGS,
//! PING, and a HEADERS frame of a GET (HPACK without Huffman or the dynamic table).

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// The client connection preface.
pub const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// A frame: 24-bit length, type, flags, 31-bit stream id, payload.
pub fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let len = payload.len() as u32;
    let mut out = vec![(len >> 16) as u8, (len >> 8) as u8, len as u8, kind, flags];
    out.extend_from_slice(&stream.to_be_bytes());
    out.extend_from_slice(payload);
    out
}

/// An empty SETTINGS frame.
pub fn settings() -> Vec<u8> {
    frame(0x4, 0, 0, &[])
}

/// A PING frame.
pub fn ping(data: [u8; 8]) -> Vec<u8> {
    frame(0x6, 0, 0, &data)
}

fn string(out: &mut Vec<u8>, s: &str) {
    assert!(s.len() < 127, "short strings only");
    out.push(s.len() as u8);
    out.extend_from_slice(s.as_bytes());
}

/// A HEADERS frame (END_STREAM, END_HEADERS) of `GET path` on `stream` with `headers`.
pub fn get(stream: u32, path: &str, headers: &[(&str, &str)]) -> Vec<u8> {
    // :method GET (static 2), :scheme http (static 6).
    let mut block = vec![0x82, 0x86];
    // :path (static name 4), :authority (static name 1), literal without indexing.
    block.push(0x04);
    string(&mut block, path);
    block.push(0x01);
    string(&mut block, "gw");
    for (name, value) in headers {
        block.push(0x00);
        string(&mut block, name);
        string(&mut block, value);
    }
    frame(0x1, 0x1 | 0x4, stream, &block)
}

/// Reads from `stream` until it is closed, or `limit` passes; the time it took to close, or
/// `None` when it stayed open.
pub async fn closed_within(
    stream: &mut (impl tokio::io::AsyncRead + Unpin),
    limit: Duration,
) -> Option<Duration> {
    let started = std::time::Instant::now();
    let mut buf = [0u8; 4096];
    loop {
        let left = limit.checked_sub(started.elapsed())?;
        match tokio::time::timeout(left, stream.read(&mut buf)).await {
            Ok(Ok(0) | Err(_)) => return Some(started.elapsed()),
            Ok(Ok(_)) => {}
            Err(_) => return None,
        }
    }
}

/// Opens a connection to `addr` and sends the preface and an empty SETTINGS frame.
pub async fn connect(addr: (&str, u16)) -> tokio::net::TcpStream {
    let mut s = tokio::net::TcpStream::connect(addr).await.expect("connect");
    s.write_all(PREFACE).await.expect("preface");
    s.write_all(&settings()).await.expect("settings");
    s
}
