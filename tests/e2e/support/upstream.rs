//! HTTP backends for the tests: one that records every request it receives, and a WebSocket
//! echo server.

use std::sync::{Arc, Mutex};

use axum::Router;
use axum::extract::Request;
use futures::{SinkExt, StreamExt};

/// What a backend received.
#[derive(Debug, Clone)]
pub struct Seen {
    pub method: String,
    /// Path and query, exactly as received.
    pub target: String,
    pub headers: http::HeaderMap,
}

impl Seen {
    /// The values of header `name`.
    pub fn all(&self, name: &str) -> Vec<String> {
        self.headers
            .get_all(name)
            .iter()
            .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
            .collect()
    }

    /// The single value of header `name`, if any.
    pub fn one(&self, name: &str) -> Option<String> {
        self.all(name).into_iter().next()
    }
}

/// A backend answering `200 ok` to everything and recording what it received.
#[derive(Clone)]
pub struct Recorder {
    pub url: String,
    seen: Arc<Mutex<Vec<Seen>>>,
}

impl Recorder {
    /// Starts one on an ephemeral port.
    pub async fn start() -> Self {
        let seen: Arc<Mutex<Vec<Seen>>> = Arc::default();
        let addr = serve_http(Self::app(seen.clone())).await;
        Self {
            url: format!("http://{addr}"),
            seen,
        }
    }

    /// Starts one serving HTTPS with `tls`; its URL names `localhost`.
    pub async fn start_tls(tls: Arc<rustls::ServerConfig>) -> Self {
        let seen: Arc<Mutex<Vec<Seen>>> = Arc::default();
        let port = serve_https(Self::app(seen.clone()), tls).await;
        Self {
            url: format!("https://localhost:{port}"),
            seen,
        }
    }

    fn app(seen: Arc<Mutex<Vec<Seen>>>) -> Router {
        let record = seen;
        Router::new().fallback(move |request: Request| {
            let record = record.clone();
            async move {
                record.lock().expect("lock").push(Seen {
                    method: request.method().as_str().to_owned(),
                    target: request
                        .uri()
                        .path_and_query()
                        .map(|p| p.as_str().to_owned())
                        .unwrap_or_default(),
                    headers: request.headers().clone(),
                });
                "ok"
            }
        })
    }

    /// Everything received so far.
    pub fn seen(&self) -> Vec<Seen> {
        self.seen.lock().expect("lock").clone()
    }

    /// The last request received.
    pub fn last(&self) -> Option<Seen> {
        self.seen.lock().expect("lock").last().cloned()
    }

    /// Forgets what was received.
    pub fn clear(&self) {
        self.seen.lock().expect("lock").clear();
    }
}

/// Serves `app` over HTTP on an ephemeral port of 127.0.0.1; returns its address.
pub async fn serve_http(app: Router) -> std::net::SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move { axum::serve(listener, app).await });
    addr
}

/// Serves `app` over HTTPS with `tls` on an ephemeral port of 127.0.0.1; returns the port.
pub async fn serve_https(app: Router, tls: Arc<rustls::ServerConfig>) -> u16 {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let port = listener.local_addr().expect("addr").port();
    let acceptor = tokio_rustls::TlsAcceptor::from(tls);
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let acceptor = acceptor.clone();
            let app = app.clone();
            tokio::spawn(async move {
                let Ok(tls) = acceptor.accept(tcp).await else {
                    return;
                };
                let _ = hyper_util::server::conn::auto::Builder::new(
                    hyper_util::rt::TokioExecutor::new(),
                )
                .serve_connection(
                    hyper_util::rt::TokioIo::new(tls),
                    hyper_util::service::TowerToHyperService::new(app),
                )
                .await;
            });
        }
    });
    port
}

/// A WebSocket server echoing text and binary messages; returns its `http://` base URL.
pub async fn websocket_echo() -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let Ok(mut ws) = tokio_tungstenite::accept_async(stream).await else {
                    return;
                };
                while let Some(Ok(message)) = ws.next().await {
                    if message.is_close() {
                        let _ = ws.flush().await;
                    } else if (message.is_text() || message.is_binary())
                        && ws.send(message).await.is_err()
                    {
                        break;
                    }
                }
            });
        }
    });
    format!("http://{addr}")
}

/// A backend whose every answer is a Server-Sent Events stream that never ends: one event, then
/// silence. It counts the streams it has open (each one a backend connection of the gateway's)
/// and the most it ever had open at once.
#[derive(Clone)]
pub struct SseBackend {
    pub url: String,
    open: Arc<std::sync::atomic::AtomicUsize>,
    most: Arc<std::sync::atomic::AtomicUsize>,
}

/// One open stream of an [`SseBackend`]: counted until its body is dropped.
struct OpenStream {
    open: Arc<std::sync::atomic::AtomicUsize>,
}

impl Drop for OpenStream {
    fn drop(&mut self) {
        self.open.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
    }
}

impl SseBackend {
    /// Starts one on an ephemeral port.
    pub async fn start() -> Self {
        use std::sync::atomic::Ordering;
        let open: Arc<std::sync::atomic::AtomicUsize> = Arc::default();
        let most: Arc<std::sync::atomic::AtomicUsize> = Arc::default();
        let (o, m) = (open.clone(), most.clone());
        let app = Router::new().fallback(move || {
            let (open, most) = (o.clone(), m.clone());
            async move {
                let now = open.fetch_add(1, Ordering::SeqCst) + 1;
                most.fetch_max(now, Ordering::SeqCst);
                let guard = OpenStream { open };
                let events = futures::stream::once(async {
                    Ok::<_, std::convert::Infallible>(bytes::Bytes::from_static(b"data: hi\n\n"))
                })
                .chain(futures::stream::pending())
                .map(move |item| {
                    let _ = &guard;
                    item
                });
                (
                    [(http::header::CONTENT_TYPE, "text/event-stream")],
                    axum::body::Body::from_stream(events),
                )
            }
        });
        let addr = serve_http(app).await;
        Self {
            url: format!("http://{addr}"),
            open,
            most,
        }
    }

    /// Streams open now.
    pub fn open(&self) -> usize {
        self.open.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// The most streams it had open at once.
    pub fn most(&self) -> usize {
        self.most.load(std::sync::atomic::Ordering::SeqCst)
    }
}
