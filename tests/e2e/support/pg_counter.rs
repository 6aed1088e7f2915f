//! A PostgreSQL wire proxy in front of the test server that counts the statements its clients
//! execute: what a gateway pointed at it costs the control store, measured exactly and at once
//! (`pg_stat_database` is updated only when a backend flushes its statistics).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// The proxy; it runs until the test's runtime ends.
pub struct PgCounter {
    /// `postgres://…` through the proxy to the database of `url` (TLS off: the proxy reads the
    /// messages).
    pub url: String,
    statements: Arc<AtomicU64>,
}

impl PgCounter {
    /// Starts a proxy to the server of `database_url` (a `postgres://user@host:port/db` URL).
    pub async fn start(database_url: &str) -> Self {
        let (prefix, rest) = database_url.split_once("://").expect("a postgres:// URL");
        let (authority, path) = rest.split_once('/').expect("a database name");
        let (userinfo, server) = match authority.rsplit_once('@') {
            Some((u, s)) => (Some(u), s),
            None => (None, authority),
        };
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let statements = Arc::new(AtomicU64::new(0));
        let counted = statements.clone();
        let server = server.to_owned();
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let counted = counted.clone();
                let server = server.clone();
                tokio::spawn(async move {
                    if let Ok(upstream) = tokio::net::TcpStream::connect(&server).await {
                        relay(client, upstream, counted).await;
                    }
                });
            }
        });
        let path = match path.split_once('?') {
            Some((db, query)) => format!("{db}?{query}&sslmode=disable"),
            None => format!("{path}?sslmode=disable"),
        };
        let url = match userinfo {
            Some(u) => format!("{prefix}://{u}@127.0.0.1:{port}/{path}"),
            None => format!("{prefix}://127.0.0.1:{port}/{path}"),
        };
        Self { url, statements }
    }

    /// Statements executed through the proxy so far (simple queries and extended-protocol
    /// executions).
    pub fn statements(&self) -> u64 {
        self.statements.load(Ordering::SeqCst)
    }
}

/// Copies both ways; counts the client's `Q` (query) and `E` (execute) messages.
async fn relay(
    client: tokio::net::TcpStream,
    upstream: tokio::net::TcpStream,
    counted: Arc<AtomicU64>,
) {
    let (mut client_read, mut client_write) = client.into_split();
    let (mut upstream_read, mut upstream_write) = upstream.into_split();
    let back = tokio::spawn(async move {
        let _ = tokio::io::copy(&mut upstream_read, &mut client_write).await;
    });
    // The startup message (and an SSL request) carry no type byte.
    let mut typed = false;
    loop {
        let message = if typed {
            let mut head = [0u8; 5];
            if client_read.read_exact(&mut head).await.is_err() {
                break;
            }
            let len = u32::from_be_bytes([head[1], head[2], head[3], head[4]]) as usize;
            let mut body = vec![0u8; len.saturating_sub(4)];
            if client_read.read_exact(&mut body).await.is_err() {
                break;
            }
            if matches!(head[0], b'Q' | b'E') {
                counted.fetch_add(1, Ordering::SeqCst);
            }
            [head.to_vec(), body].concat()
        } else {
            let mut len = [0u8; 4];
            if client_read.read_exact(&mut len).await.is_err() {
                break;
            }
            let n = u32::from_be_bytes(len) as usize;
            let mut body = vec![0u8; n.saturating_sub(4)];
            if client_read.read_exact(&mut body).await.is_err() {
                break;
            }
            // SSLRequest (80877103) is answered `N` by a server without TLS; the startup
            // message that follows is untyped too.
            let ssl_request = body.len() == 4 && body == [0x04, 0xd2, 0x16, 0x2f];
            typed = !ssl_request;
            [len.to_vec(), body].concat()
        };
        if upstream_write.write_all(&message).await.is_err() {
            break;
        }
    }
    back.abort();
}
