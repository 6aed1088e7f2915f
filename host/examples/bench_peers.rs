//! The backends `bench/run` measures the gateway against (benchmark tooling, not a service).
//!
//! `bench_peers http ADDR`: a one-thread HTTP/1.1 upstream. Any `GET` answers `200` with a
//! 13-byte body; `GET …/stream/BYTES` streams BYTES zero bytes in 64 KiB chunks; any request
//! with a body reads it to the end and answers its length; a WebSocket handshake is answered
//! `101` and the connection then held, whatever it sends read and dropped (idle tunnels).
//!
//! `bench_peers nats URL SUBJECT`: a NATS responder answering every envelope on SUBJECT with
//! the same 13-byte `200` reply.
//!
//! `bench_peers proxy ADDR UPSTREAM`: the floor of the gateway's stack, a bare reverse proxy
//! with nothing of the gateway in it: hyper's server, hyper-util's pooled client (as the
//! gateway's HTTP route uses them), on a multi-thread runtime sized like the gateway's.
//! `bench_peers proxy-ct ADDR UPSTREAM`: the same on a current-thread runtime (the runtime
//! shape measured on the floor).
//!
//! `bench_peers lean ADDR UPSTREAM`: the floor under hyper, tokio and `httparse` alone on a
//! current-thread runtime: each client connection gets one upstream connection of its own; a
//! request head is parsed, rewritten (hop-by-hop headers dropped) and sent with its
//! `Content-Length` body in one write, the answer likewise. No chunked bodies, no upgrades, no
//! limits beyond a 16 KiB head: a measurement of what parsing and forwarding cost without an
//! HTTP library's state machine, not a server.

use std::convert::Infallible;
use std::net::SocketAddr;

use bytes::Bytes;
use futures::StreamExt;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::{Request, Response};

const BODY: &[u8] = b"hello, aura!\n";
const CHUNK: usize = 64 * 1024;

type Body = http_body_util::combinators::UnsyncBoxBody<Bytes, Infallible>;

fn full(bytes: impl Into<Bytes>) -> Body {
    Full::new(bytes.into()).boxed_unsync()
}

async fn serve(mut request: Request<Incoming>) -> Result<Response<Body>, Infallible> {
    if let Some(key) = request.headers().get("sec-websocket-key") {
        let accept = tokio_tungstenite::tungstenite::handshake::derive_accept_key(key.as_bytes());
        let upgrade = hyper::upgrade::on(&mut request);
        tokio::spawn(async move {
            use tokio::io::AsyncReadExt as _;
            if let Ok(upgraded) = upgrade.await {
                let mut io = hyper_util::rt::TokioIo::new(upgraded);
                let mut buf = [0u8; 512];
                while matches!(io.read(&mut buf).await, Ok(n) if n > 0) {}
            }
        });
        return Ok(Response::builder()
            .status(101)
            .header("connection", "upgrade")
            .header("upgrade", "websocket")
            .header("sec-websocket-accept", accept)
            .body(full(Bytes::new()))
            .expect("response"));
    }
    let path = request.uri().path().to_owned();
    if let Some(n) = path
        .rsplit_once("/stream/")
        .and_then(|(_, n)| n.parse::<u64>().ok())
    {
        let zeros = Bytes::from(vec![0u8; CHUNK]);
        let chunks = futures::stream::unfold(n, move |left| {
            let zeros = zeros.clone();
            async move {
                (left > 0).then(|| {
                    let take = left.min(CHUNK as u64) as usize;
                    (
                        Ok::<_, Infallible>(Frame::data(zeros.slice(..take))),
                        left - take as u64,
                    )
                })
            }
        });
        let response = Response::builder()
            .header("content-type", "application/octet-stream")
            .header("content-length", n)
            .body(BodyExt::boxed_unsync(StreamBody::new(chunks)))
            .expect("response");
        return Ok(response);
    }
    let mut body = request.into_body();
    let mut read = 0u64;
    while let Some(frame) = body.frame().await {
        match frame {
            Ok(f) => read += f.data_ref().map_or(0, |d| d.len() as u64),
            Err(_) => break,
        }
    }
    let payload = if read > 0 {
        full(format!("{read}\n"))
    } else {
        full(BODY)
    };
    Ok(Response::builder()
        .header("content-type", "text/plain")
        .body(payload)
        .expect("response"))
}

async fn http(addr: SocketAddr) -> anyhow::Result<()> {
    let listener = tokio::net::TcpListener::bind(addr).await?;
    loop {
        let (stream, _) = listener.accept().await?;
        let _ = stream.set_nodelay(true);
        tokio::spawn(async move {
            let _ = hyper::server::conn::http1::Builder::new()
                .keep_alive(true)
                .serve_connection(
                    hyper_util::rt::TokioIo::new(stream),
                    hyper::service::service_fn(serve),
                )
                .with_upgrades()
                .await;
        });
    }
}

async fn proxy(addr: SocketAddr, upstream: &str) -> anyhow::Result<()> {
    use hyper_util::client::legacy::Client;
    use hyper_util::client::legacy::connect::HttpConnector;
    let upstream: http::Uri = upstream.parse()?;
    let mut connector = HttpConnector::new();
    connector.set_nodelay(true);
    let client: Client<HttpConnector, Incoming> =
        Client::builder(hyper_util::rt::TokioExecutor::new())
            .pool_max_idle_per_host(64)
            .build(connector);
    let listener = tokio::net::TcpListener::bind(addr).await?;
    loop {
        let (stream, _) = listener.accept().await?;
        let _ = stream.set_nodelay(true);
        let client = client.clone();
        let upstream = upstream.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |request: Request<Incoming>| {
                let client = client.clone();
                let upstream = upstream.clone();
                async move {
                    let (mut parts, body) = request.into_parts();
                    let mut uri = upstream.into_parts();
                    uri.path_and_query = parts.uri.path_and_query().cloned();
                    parts.uri = http::Uri::from_parts(uri).expect("uri");
                    parts.headers.remove(http::header::HOST);
                    match client.request(Request::from_parts(parts, body)).await {
                        Ok(response) => Ok::<_, Infallible>(response.map(BodyExt::boxed_unsync)),
                        Err(_) => Ok(Response::builder()
                            .status(502)
                            .body(
                                Full::new(Bytes::new())
                                    .map_err(|never| match never {})
                                    .boxed_unsync(),
                            )
                            .expect("response")),
                    }
                }
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .keep_alive(true)
                .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                .await;
        });
    }
}

/// One HTTP/1.1 message read from `io` into `buf` (a head of at most [`LEAN_HEAD`] bytes and its
/// `Content-Length` body), re-written into `out` without hop-by-hop headers. `None` at a clean
/// end of the stream.
async fn lean_message(
    io: &mut tokio::net::TcpStream,
    buf: &mut bytes::BytesMut,
    out: &mut Vec<u8>,
    request: bool,
) -> anyhow::Result<Option<()>> {
    use tokio::io::AsyncReadExt as _;
    loop {
        let mut headers = [httparse::EMPTY_HEADER; 64];
        let parsed = if request {
            let mut head = httparse::Request::new(&mut headers);
            match head.parse(buf)? {
                httparse::Status::Complete(len) => {
                    out.extend_from_slice(head.method.unwrap_or("GET").as_bytes());
                    out.push(b' ');
                    out.extend_from_slice(head.path.unwrap_or("/").as_bytes());
                    out.extend_from_slice(b" HTTP/1.1\r\n");
                    Some((len, head.headers.len()))
                }
                httparse::Status::Partial => None,
            }
        } else {
            let mut head = httparse::Response::new(&mut headers);
            match head.parse(buf)? {
                httparse::Status::Complete(len) => {
                    out.extend_from_slice(b"HTTP/1.1 ");
                    let mut code = itoa::Buffer::new();
                    out.extend_from_slice(code.format(head.code.unwrap_or(502)).as_bytes());
                    out.push(b' ');
                    out.extend_from_slice(head.reason.unwrap_or("").as_bytes());
                    out.extend_from_slice(b"\r\n");
                    Some((len, head.headers.len()))
                }
                httparse::Status::Partial => None,
            }
        };
        if let Some((len, count)) = parsed {
            let mut body = 0usize;
            for h in &headers[..count] {
                let name = h.name;
                if name.eq_ignore_ascii_case("connection")
                    || name.eq_ignore_ascii_case("keep-alive")
                {
                    continue;
                }
                if name.eq_ignore_ascii_case("transfer-encoding") {
                    anyhow::bail!("chunked bodies are not forwarded");
                }
                if name.eq_ignore_ascii_case("content-length") {
                    body = std::str::from_utf8(h.value)?.trim().parse()?;
                }
                out.extend_from_slice(name.as_bytes());
                out.extend_from_slice(b": ");
                out.extend_from_slice(h.value);
                out.extend_from_slice(b"\r\n");
            }
            out.extend_from_slice(b"\r\n");
            let _ = buf.split_to(len);
            while buf.len() < body {
                if io.read_buf(buf).await? == 0 {
                    anyhow::bail!("the stream ended inside a body");
                }
            }
            out.extend_from_slice(&buf.split_to(body));
            return Ok(Some(()));
        }
        if buf.len() >= LEAN_HEAD {
            anyhow::bail!("a head over {LEAN_HEAD} bytes");
        }
        if io.read_buf(buf).await? == 0 {
            if buf.is_empty() {
                return Ok(None);
            }
            anyhow::bail!("the stream ended inside a head");
        }
    }
}

/// The longest head `bench_peers lean` reads.
const LEAN_HEAD: usize = 16 * 1024;

async fn lean(addr: SocketAddr, upstream: SocketAddr) -> anyhow::Result<()> {
    use tokio::io::AsyncWriteExt as _;
    let listener = tokio::net::TcpListener::bind(addr).await?;
    loop {
        let (mut client, _) = listener.accept().await?;
        let _ = client.set_nodelay(true);
        tokio::spawn(async move {
            let mut upstream_io: Option<tokio::net::TcpStream> = None;
            let mut from_client = bytes::BytesMut::with_capacity(4096);
            let mut from_upstream = bytes::BytesMut::with_capacity(4096);
            let mut out = Vec::with_capacity(4096);
            loop {
                out.clear();
                match lean_message(&mut client, &mut from_client, &mut out, true).await {
                    Ok(Some(())) => {}
                    _ => return,
                }
                let io = match &mut upstream_io {
                    Some(io) => io,
                    None => match tokio::net::TcpStream::connect(upstream).await {
                        Ok(io) => {
                            let _ = io.set_nodelay(true);
                            upstream_io.insert(io)
                        }
                        Err(_) => return,
                    },
                };
                if io.write_all(&out).await.is_err() {
                    return;
                }
                out.clear();
                match lean_message(io, &mut from_upstream, &mut out, false).await {
                    Ok(Some(())) => {}
                    _ => return,
                }
                if client.write_all(&out).await.is_err() {
                    return;
                }
            }
        });
    }
}

async fn nats(url: &str, subject: &str) -> anyhow::Result<()> {
    use base64::Engine as _;
    let client = async_nats::connect(url).await?;
    let mut sub = client.subscribe(subject.to_owned()).await?;
    client.flush().await?;
    let reply = Bytes::from(
        serde_json::json!({
            "status": 200,
            "headers": [["content-type", "text/plain"]],
            "body": base64::engine::general_purpose::STANDARD.encode(BODY),
        })
        .to_string(),
    );
    while let Some(message) = sub.next().await {
        if let Some(to) = message.reply {
            client.publish(to, reply.clone()).await?;
        }
    }
    Ok(())
}

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    match args
        .iter()
        .map(String::as_str)
        .collect::<Vec<_>>()
        .as_slice()
    {
        ["http", addr] => runtime.block_on(http(addr.parse()?)),
        ["nats", url, subject] => runtime.block_on(nats(url, subject)),
        ["proxy", addr, upstream] => tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()?
            .block_on(proxy(addr.parse()?, upstream)),
        ["proxy-ct", addr, upstream] => runtime.block_on(proxy(addr.parse()?, upstream)),
        ["lean", addr, upstream] => runtime.block_on(lean(addr.parse()?, upstream.parse()?)),
        _ => anyhow::bail!(
            "usage: bench_peers http ADDR | bench_peers nats URL SUBJECT | \
             bench_peers proxy ADDR UPSTREAM | bench_peers proxy-ct ADDR UPSTREAM | \
             bench_peers lean ADDR UPSTREAM"
        ),
    }
}
