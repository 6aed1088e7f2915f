//! The HTTP/1.1 client side of a backend connection: the gateway's own codec over `httparse`.
//!
//! A request's head is written in one write, its body after it through the [`Encoder`] both
//! sides write with (`Content-Length` when its length is known, chunked otherwise); the
//! answer's head is parsed by `httparse` into an `http::Response` and its body read as the
//! caller polls for it, framed by `Content-Length`, chunked coding or the connection's end
//! (RFC 9112 §6.3). No task, no channel: the request that holds the connection does the I/O
//! (`proxy/pool.rs`).
//!
//! A backend is trusted less than the gateway: everything it answers is bounded and refused
//! rather than guessed at — a head over [`MAX_HEAD_BYTES`] or with more than [`MAX_HEADERS`]
//! headers, a `Content-Length` beside a `Transfer-Encoding`, `Content-Length`s that differ or
//! are not digits, a chunk-size line over [`MAX_CHUNK_LINE`] bytes, chunk extensions or
//! trailers over [`MAX_CHUNK_EXTRAS`] bytes in all, more than [`MAX_INFORMATIONAL`] `1xx`
//! heads, a `101` it was not asked for. Such a connection is never used again.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use bytes::{Bytes, BytesMut};
use http::{HeaderMap, HeaderValue, Method, Response, StatusCode, Version, header};

use super::head::{FramingFields, HeadEdits, Rules, line};
use crate::http1::body::{
    Decoded, Decoder, Encoder, Framing, READ_CHUNK, content_length, has_token,
};
pub use crate::http1::body::{MAX_CHUNK_EXTRAS, MAX_CHUNK_LINE};
use http_body::Body;
use http_body_util::BodyExt as _;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt as _};

/// The longest answer head read (hyper's client reads up to about 400 KiB).
pub const MAX_HEAD_BYTES: usize = 128 * 1024;
/// The most headers an answer head may carry (hyper's client default).
pub const MAX_HEADERS: usize = 100;
/// The most informational (`1xx`) heads read before an answer.
pub const MAX_INFORMATIONAL: usize = 16;
/// A buffer larger than this is not kept while the connection is idle.
const KEEP_IDLE_BUFFER: usize = 16 * 1024;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Why an exchange failed on the connection. Every one of them closes the connection.
#[derive(Debug, thiserror::Error)]
pub enum WireError {
    /// Reading from the backend failed.
    #[error("reading from the backend: {0}")]
    Read(#[source] io::Error),
    /// Writing to the backend failed.
    #[error("writing to the backend: {0}")]
    Write(#[source] io::Error),
    /// The backend closed the connection before its answer (head or body) was complete.
    #[error("the backend closed the connection before its answer was complete")]
    Incomplete,
    /// The answer is not HTTP/1.x the gateway accepts; says why.
    #[error("the backend's answer is refused: {0}")]
    Invalid(&'static str),
    /// The request body failed (its source says why: a limit, the client's idle timeout…).
    #[error("the request body: {0}")]
    Body(#[source] BoxError),
    /// The request body's length differed from the `Content-Length` sent for it.
    #[error("the request body's length differs from its Content-Length")]
    BodyLength,
}

impl WireError {
    /// Whether the client's side failed: its request body broke (framing, a limit, an idle
    /// client, a client gone) or did not match its own `Content-Length`. Nothing the backend
    /// did; the exchange is closed all the same.
    pub fn is_client(&self) -> bool {
        matches!(self, Self::Body(_) | Self::BodyLength)
    }
}

/// What the request's body is sent with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Sending {
    Nothing,
    Length(u64),
    Chunked,
}

/// A request that failed before any byte of it reached the connection: handed back, to be
/// sent on another.
#[derive(Debug)]
pub struct Unsent<B> {
    pub request: http::Request<B>,
    pub error: WireError,
}

/// How sending a request failed.
#[derive(Debug)]
pub enum SendError<B> {
    /// Nothing of it was written (boxed: the request is most of the error's size).
    Unsent(Box<Unsent<B>>),
    /// Some of it may have reached the backend.
    Sent(WireError),
}

/// One HTTP/1.1 connection to a backend.
#[derive(Debug)]
pub struct Connection<T> {
    io: T,
    buf: BytesMut,
    write: Vec<u8>,
    /// Whether the connection takes another request once the current exchange ends.
    keep_alive: bool,
    /// The answer's body, as it is read.
    body: Decoder,
}

impl<T> Connection<T>
where
    T: AsyncRead + AsyncWrite + Unpin,
{
    /// A connection over `io`, newly opened.
    pub fn new(io: T) -> Self {
        Self {
            io,
            buf: BytesMut::new(),
            write: Vec::new(),
            keep_alive: true,
            body: Decoder::new(Framing::Done),
        }
    }

    /// Whether this idle connection has closed (or sent bytes nobody asked for, which makes
    /// it unusable as well). Registers `cx` for the connection's next read.
    pub fn poll_idle_closed(&mut self, cx: &mut Context<'_>) -> bool {
        if !self.is_reusable() {
            return true;
        }
        let mut probe = [0u8; 1];
        let mut read = tokio::io::ReadBuf::new(&mut probe);
        match Pin::new(&mut self.io).poll_read(cx, &mut read) {
            Poll::Pending => false,
            // An end, an error or unasked bytes: closed either way.
            Poll::Ready(_) => {
                self.keep_alive = false;
                true
            }
        }
    }

    /// Whether the last exchange ended cleanly and the connection takes another.
    pub fn is_reusable(&self) -> bool {
        self.keep_alive && self.body.is_done() && self.buf.is_empty()
    }

    /// Gives back a large read buffer before the connection waits idle.
    pub fn shrink_idle(&mut self) {
        if self.buf.is_empty() && self.buf.capacity() > KEEP_IDLE_BUFFER {
            self.buf = BytesMut::new();
        }
        if self.write.capacity() > KEEP_IDLE_BUFFER {
            self.write = Vec::new();
        }
    }

    /// Sends `request` (its URI in origin form) with its headers as they are, and reads the
    /// answer's head; the answer's body is then read with [`Self::poll_body`].
    pub async fn send<B>(&mut self, request: http::Request<B>) -> Result<Response<()>, SendError<B>>
    where
        B: Body<Data = Bytes> + Unpin,
        B::Error: Into<BoxError>,
    {
        self.send_with(request, Added::default()).await
    }

    /// [`Self::send`], the head written with what `added` says: the backend's `host` and a
    /// client's request as its backend receives it.
    pub async fn send_with<B>(
        &mut self,
        request: http::Request<B>,
        added: Added<'_>,
    ) -> Result<Response<()>, SendError<B>>
    where
        B: Body<Data = Bytes> + Unpin,
        B::Error: Into<BoxError>,
    {
        let sending = match sending(&request) {
            Ok(sending) => sending,
            Err(error) => return Err(SendError::Unsent(Box::new(Unsent { request, error }))),
        };
        self.write.clear();
        encode_head(&mut self.write, &request, sending, added);
        if let Err(e) = self.io.write_all(&self.write).await {
            self.keep_alive = false;
            return Err(SendError::Unsent(Box::new(Unsent {
                request,
                error: WireError::Write(e),
            })));
        }
        let head_request = request.method() == Method::HEAD;
        // A client's `Connection` is not sent (it names the client's hop); the request's own
        // otherwise.
        let closes = added.backend.is_none() && has_token(request.headers(), "close");
        let body = request.into_body();
        let written = self.write_body(body, sending).await;
        if let Err(e) = written {
            self.keep_alive = false;
            // A backend that refuses the body may have answered before it closed (a `413`):
            // that answer is the exchange's, if it is there.
            if matches!(e, WireError::Write(_))
                && let Ok(response) = self.read_head(head_request).await
            {
                self.keep_alive = false;
                return Ok(response);
            }
            return Err(SendError::Sent(e));
        }
        if let Err(e) = self.io.flush().await {
            self.keep_alive = false;
            return Err(SendError::Sent(WireError::Write(e)));
        }
        let response = self.read_head(head_request).await.map_err(|e| {
            self.keep_alive = false;
            SendError::Sent(e)
        })?;
        if closes {
            self.keep_alive = false;
        }
        Ok(response)
    }

    /// Writes the request's body frame by frame as it comes, nothing kept back: a chunk and its
    /// framing in one write (a chunk over [`COALESCE`](crate::http1::body::COALESCE) bytes apart
    /// from its framing), a length-framed body's data as it is, never copied.
    async fn write_body<B>(&mut self, body: B, sending: Sending) -> Result<(), WireError>
    where
        B: Body<Data = Bytes> + Unpin,
        B::Error: Into<BoxError>,
    {
        let mut body = body;
        let mut encoder = match sending {
            Sending::Nothing => return Ok(()),
            Sending::Length(n) => Encoder::length(n).at_once(),
            Sending::Chunked => Encoder::chunked().at_once(),
        };
        while let Some(frame) = body.frame().await {
            let frame = frame.map_err(|e| WireError::Body(e.into()))?;
            // Trailers of the client's body are not forwarded.
            let Ok(mut data) = frame.into_data() else {
                continue;
            };
            self.write.clear();
            let encoded = encoder.data(&mut self.write, &mut data);
            if encoded.over {
                return Err(WireError::BodyLength);
            }
            if !self.write.is_empty() {
                self.io
                    .write_all(&self.write)
                    .await
                    .map_err(WireError::Write)?;
            }
            if let Some(after) = encoded.apart {
                self.io
                    .write_all_buf(&mut data)
                    .await
                    .map_err(WireError::Write)?;
                self.io.write_all(after).await.map_err(WireError::Write)?;
            }
        }
        self.write.clear();
        encoder
            .end(&mut self.write, None)
            .map_err(|_| WireError::BodyLength)?;
        self.io
            .write_all(&self.write)
            .await
            .map_err(WireError::Write)
    }

    /// Reads the answer's head (informational heads skipped) and sets the body's framing.
    async fn read_head(&mut self, head_request: bool) -> Result<Response<()>, WireError> {
        let mut informational = 0;
        loop {
            if let Some(head) = parse_head(&mut self.buf)? {
                let status = head.status;
                if status == StatusCode::SWITCHING_PROTOCOLS {
                    return Err(WireError::Invalid("a 101 the request did not ask for"));
                }
                if status.is_informational() {
                    informational += 1;
                    if informational > MAX_INFORMATIONAL {
                        return Err(WireError::Invalid("too many informational answers"));
                    }
                    continue;
                }
                let bodiless = head_request
                    || status == StatusCode::NO_CONTENT
                    || status == StatusCode::NOT_MODIFIED;
                let framing = if bodiless || head.framing == Framing::Length(0) {
                    Framing::Done
                } else {
                    head.framing
                };
                // An answer that has no body but whose head declares one (a `HEAD`'s length,
                // a `204` or `304` with a length or chunked): a backend that then writes that
                // body anyway would have it read as the next request's answer, perhaps
                // another tenant's. Such a connection is not used again.
                let declares_body = matches!(head.framing, Framing::Chunked(_))
                    || matches!(head.framing, Framing::Length(n) if n > 0);
                self.keep_alive = head.keep_alive
                    && framing != Framing::UntilClose
                    && !(bodiless && declares_body);
                self.body = Decoder::new(framing);
                let mut response = Response::new(());
                *response.status_mut() = status;
                *response.version_mut() = head.version;
                *response.headers_mut() = head.headers;
                return Ok(response);
            }
            if self.buf.len() >= MAX_HEAD_BYTES {
                return Err(WireError::Invalid("an answer head over 128 KiB"));
            }
            let n = std::future::poll_fn(|cx| self.poll_fill(cx, READ_CHUNK))
                .await
                .map_err(WireError::Read)?;
            if n == 0 {
                return Err(WireError::Incomplete);
            }
        }
    }

    /// Reads into the buffer, with room for at least `room` bytes.
    fn poll_fill(&mut self, cx: &mut Context<'_>, room: usize) -> Poll<io::Result<usize>> {
        super::body::poll_fill(&mut self.io, &mut self.buf, cx, room)
    }

    /// Whether the answer's body has ended.
    pub fn body_ended(&self) -> bool {
        self.body.is_done()
    }

    /// The bytes left in the answer's body, when its length is known.
    pub fn body_left(&self) -> Option<u64> {
        self.body.left()
    }

    /// The answer body's next bytes; `None` at its end.
    pub fn poll_body(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<Bytes, WireError>>> {
        let result = self.poll_body_inner(cx);
        if let Poll::Ready(Some(Err(_))) = result {
            self.keep_alive = false;
            self.body = Decoder::new(Framing::Done);
        }
        result
    }

    fn poll_body_inner(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<Bytes, WireError>>> {
        loop {
            match self.body.decode(&mut self.buf) {
                Decoded::Data(data) => return Poll::Ready(Some(Ok(data))),
                Decoded::End => return Poll::Ready(None),
                Decoded::Refused(why) => return Poll::Ready(Some(Err(WireError::Invalid(why)))),
                Decoded::More(room) => match ready!(self.poll_fill(cx, room)) {
                    Ok(0) if self.body.at_eof() => return Poll::Ready(None),
                    Ok(0) => return Poll::Ready(Some(Err(WireError::Incomplete))),
                    Ok(_) => {}
                    Err(e) => return Poll::Ready(Some(Err(WireError::Read(e)))),
                },
            }
        }
    }
}

/// A parsed answer head.
pub(crate) struct Head {
    pub status: StatusCode,
    pub version: Version,
    pub headers: HeaderMap,
    pub framing: Framing,
    pub keep_alive: bool,
}

/// The answer head at the start of `buf`, taken out of it when it is all there. Names and
/// values are sliced out of the head's bytes, not copied: the head's buffer lives until the
/// answer's head is written to the client.
pub(crate) fn parse_head(buf: &mut BytesMut) -> Result<Option<Head>, WireError> {
    // A head that ends past the bound is never complete: one read may bring it all.
    let within = &buf[..buf.len().min(MAX_HEAD_BYTES)];
    // `httparse` parses answers only into initialised headers: most answers fit in a few, so
    // the full bound (3.2 KB to write for every answer) is set up only for a head with more.
    let mut few = [httparse::EMPTY_HEADER; FEW_HEADERS];
    let mut parsed = httparse::Response::new(&mut few);
    let status = parsed.parse(within);
    if matches!(status, Err(httparse::Error::TooManyHeaders)) {
        let mut all = vec![httparse::EMPTY_HEADER; MAX_HEADERS];
        let mut parsed = httparse::Response::new(&mut all);
        let status = parsed.parse(within);
        let mut fields = vec![Field::default(); MAX_HEADERS];
        let located = locate(&parsed, status, within, &mut fields)?;
        return take(buf, located, &fields);
    }
    let mut fields = [Field::default(); FEW_HEADERS];
    let located = locate(&parsed, status, within, &mut fields)?;
    take(buf, located, &fields)
}

/// Where one header's name and value lie in the head.
#[derive(Debug, Clone, Copy, Default)]
struct Field {
    name: (u32, u32),
    value: (u32, u32),
}

/// A complete answer head, located: its length, status line and how many headers it has.
struct Located {
    len: usize,
    code: Option<u16>,
    version: Option<u8>,
    count: usize,
}

/// The answer head `parsed` from `within`, after `status` (the parse's outcome): where its
/// headers lie, written into `fields` (room for as many as `parsed` had); `None` while it is
/// not all there.
fn locate(
    parsed: &httparse::Response<'_, '_>,
    status: httparse::Result<usize>,
    within: &[u8],
    fields: &mut [Field],
) -> Result<Option<Located>, WireError> {
    let len = match status {
        Ok(httparse::Status::Complete(len)) => len,
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(httparse::Error::TooManyHeaders) => {
            return Err(WireError::Invalid("more than 100 headers"));
        }
        Err(_) => return Err(WireError::Invalid("not an HTTP/1.x answer head")),
    };
    let start = within.as_ptr() as usize;
    // Every part lies in `within`, at most `MAX_HEAD_BYTES` long.
    let offset = |part: &[u8]| ((part.as_ptr() as usize - start) as u32, part.len() as u32);
    for (field, h) in fields.iter_mut().zip(parsed.headers.iter()) {
        *field = Field {
            name: offset(h.name.as_bytes()),
            value: offset(h.value),
        };
    }
    Ok(Some(Located {
        len,
        code: parsed.code,
        version: parsed.version,
        count: parsed.headers.len(),
    }))
}

/// Takes the head `located` out of `buf`, and makes it an answer head.
fn take(
    buf: &mut BytesMut,
    located: Option<Located>,
    fields: &[Field],
) -> Result<Option<Head>, WireError> {
    let Some(located) = located else {
        return Ok(None);
    };
    let head = buf.split_to(located.len).freeze();
    head_of(&head, &located, &fields[..located.count]).map(Some)
}

/// How many headers an answer head is first parsed into.
const FEW_HEADERS: usize = 24;

/// The answer head `head` (its bytes, taken out of the read buffer), located by [`locate`].
fn head_of(head: &Bytes, located: &Located, fields: &[Field]) -> Result<Head, WireError> {
    let slice = |(at, len): (u32, u32)| head.slice(at as usize..(at + len) as usize);
    let status = located
        .code
        .and_then(|code| StatusCode::from_u16(code).ok())
        .ok_or(WireError::Invalid("an invalid status code"))?;
    let version = match located.version {
        Some(0) => Version::HTTP_10,
        _ => Version::HTTP_11,
    };
    // Room for the phases' headers too (`crate::headers::ANSWER_HEADERS`): the map is
    // allocated once.
    let mut map = HeaderMap::with_capacity(fields.len() + crate::headers::ANSWER_HEADERS);
    let mut framing = FramingFields::default();
    for field in fields {
        let (at, n) = field.name;
        let name = crate::headers::name(&head[at as usize..(at + n) as usize])
            .map_err(|_| WireError::Invalid("an invalid header name"))?;
        let value = crate::headers::parsed_value(slice(field.value))
            .map_err(|_| WireError::Invalid("an invalid header value"))?;
        framing
            .read(&name, value.as_bytes(), Rules::Answer)
            .map_err(WireError::Invalid)?;
        map.append(name, value);
    }
    let FramingFields {
        length,
        restate_length,
        chunked: chunked_last,
        close,
        keep_alive: keep_alive_token,
        ..
    } = framing;
    if restate_length && let Some(n) = length {
        // Passed on as the one number it means.
        map.insert(header::CONTENT_LENGTH, HeaderValue::from(n));
    }
    let framing = match (chunked_last, length) {
        (Some(_), Some(_)) => {
            return Err(WireError::Invalid(
                "both Content-Length and Transfer-Encoding",
            ));
        }
        (Some(true), None) => Framing::CHUNKED,
        // A transfer coding other than chunked last: the body runs to the connection's end.
        (Some(false), None) => Framing::UntilClose,
        (None, Some(n)) => Framing::Length(n),
        (None, None) => Framing::UntilClose,
    };
    let keep_alive = match version {
        // An HTTP/1.0 answer with a Transfer-Encoding is framed faultily: the connection
        // ends after it (RFC 9112 §6.1).
        Version::HTTP_10 => keep_alive_token && !close && chunked_last.is_none(),
        _ => !close,
    };
    Ok(Head {
        status,
        version,
        headers: map,
        framing,
        keep_alive,
    })
}

/// How a request's body is sent: the `Content-Length` it carries (checked against the body as
/// it streams), else the body's exact length, else chunked; nothing for an ended body, except
/// `Content-Length: 0` for the methods that define a meaning for a body.
fn sending<B: Body>(request: &http::Request<B>) -> Result<Sending, WireError> {
    let body = request.body();
    let declared = request.headers().get_all(header::CONTENT_LENGTH);
    let mut length = None;
    for value in declared {
        let n = content_length(value.as_bytes()).ok_or(WireError::BodyLength)?;
        if length.is_some_and(|l| l != n) {
            return Err(WireError::BodyLength);
        }
        length = Some(n);
    }
    if body.is_end_stream() {
        if length.is_some_and(|n| n > 0) {
            return Err(WireError::BodyLength);
        }
        let says_empty = length.is_some()
            || matches!(
                *request.method(),
                Method::POST | Method::PUT | Method::PATCH
            );
        return Ok(if says_empty {
            Sending::Length(0)
        } else {
            Sending::Nothing
        });
    }
    Ok(match length.or(body.size_hint().exact()) {
        Some(n) => Sending::Length(n),
        None => Sending::Chunked,
    })
}

/// What a request's head carries besides what the request holds, written as the head is: no
/// header is inserted into or removed from the request's map for it.
#[derive(Debug, Clone, Copy, Default)]
pub struct Added<'a> {
    /// The backend's `host`, written first in place of the request's own.
    pub host: Option<&'a HeaderValue>,
    /// A client's request forwarded to an HTTP backend: which of its headers are written, and
    /// the gateway's headers after them.
    pub backend: Option<&'a dyn HeadEdits>,
}

/// Writes the request head into `out`: `added`'s `host` first, the request's headers (those
/// `added.backend` keeps), the gateway's, then its own framing header, none of the request's.
pub(crate) fn encode_head<B>(
    out: &mut Vec<u8>,
    request: &http::Request<B>,
    sending: Sending,
    added: Added<'_>,
) {
    out.extend_from_slice(request.method().as_str().as_bytes());
    out.push(b' ');
    let target = request.uri().path_and_query().map_or("", |p| p.as_str());
    // An empty path is written `/`, before a query too (RFC 9112 §3.2.1): `?q` alone is no
    // request target.
    if target.is_empty() || target.starts_with('?') {
        out.push(b'/');
    }
    out.extend_from_slice(target.as_bytes());
    out.extend_from_slice(b" HTTP/1.1\r\n");
    if let Some(host) = added.host {
        line(out, b"host", host.as_bytes());
    }
    for (name, value) in request.headers() {
        if name == header::CONTENT_LENGTH || name == header::TRANSFER_ENCODING {
            continue;
        }
        let name = name.as_str();
        match added.backend {
            Some(backend) if backend.skips(name) => continue,
            None if added.host.is_some() && name == "host" => continue,
            _ => {}
        }
        line(out, name.as_bytes(), value.as_bytes());
    }
    if let Some(backend) = added.backend {
        backend.write_lines(out);
    }
    match sending {
        Sending::Nothing => {}
        Sending::Length(n) => {
            line(
                out,
                b"content-length",
                itoa::Buffer::new().format(n).as_bytes(),
            );
        }
        Sending::Chunked => out.extend_from_slice(b"transfer-encoding: chunked\r\n"),
    }
    out.extend_from_slice(b"\r\n");
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::{Full, StreamBody};
    use tokio::io::{AsyncReadExt as _, DuplexStream};

    fn pair() -> (Connection<DuplexStream>, DuplexStream) {
        let (ours, theirs) = tokio::io::duplex(1 << 20);
        (Connection::new(ours), theirs)
    }

    /// A connection whose backend has already written `answer`.
    async fn answered(answer: &[u8]) -> (Connection<DuplexStream>, DuplexStream) {
        let (conn, mut peer) = pair();
        peer.write_all(answer).await.expect("answer");
        (conn, peer)
    }

    fn get(path: &str) -> http::Request<Full<Bytes>> {
        http::Request::get(path)
            .header("host", "backend")
            .body(Full::new(Bytes::new()))
            .expect("request")
    }

    /// Reads what the connection wrote until `until` appears.
    async fn written(peer: &mut DuplexStream, until: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        let mut buf = [0u8; 4096];
        while !out.windows(until.len()).any(|w| w == until) {
            let n = peer.read(&mut buf).await.expect("read");
            assert!(n > 0, "closed before {:?}", String::from_utf8_lossy(until));
            out.extend_from_slice(&buf[..n]);
        }
        out
    }

    async fn body(conn: &mut Connection<DuplexStream>) -> Result<Vec<u8>, WireError> {
        let mut out = Vec::new();
        while let Some(bytes) = std::future::poll_fn(|cx| conn.poll_body(cx)).await {
            out.extend_from_slice(&bytes?);
        }
        Ok(out)
    }

    /// Answers `answer` to one request and reads the whole exchange.
    async fn exchange(answer: &[u8]) -> (Connection<DuplexStream>, Result<Vec<u8>, WireError>) {
        let (mut conn, _peer) = answered(answer).await;
        let result = match conn.send(get("/x")).await {
            Ok(head) => {
                assert_eq!(head.status(), StatusCode::OK);
                body(&mut conn).await
            }
            Err(SendError::Sent(e)) => Err(e),
            Err(SendError::Unsent(u)) => Err(u.error),
        };
        (conn, result)
    }

    fn refused(result: Result<Vec<u8>, WireError>) -> &'static str {
        match result {
            Err(WireError::Invalid(why)) => why,
            other => panic!("not refused: {other:?}"),
        }
    }

    #[tokio::test]
    async fn a_get_is_one_head_and_a_length_answer_leaves_the_connection_reusable() {
        let (mut conn, mut peer) =
            answered(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nX-A: 1\r\nX-A: 2\r\n\r\nhello")
                .await;
        let head = match conn.send(get("/o/a?b=1")).await {
            Ok(head) => head,
            Err(_) => panic!("send failed"),
        };
        assert_eq!(head.status(), StatusCode::OK);
        assert_eq!(head.headers().get_all("x-a").iter().count(), 2);
        assert_eq!(conn.body_left(), Some(5));
        assert_eq!(body(&mut conn).await.expect("body"), b"hello");
        assert!(conn.is_reusable());
        let request = written(&mut peer, b"\r\n\r\n").await;
        assert_eq!(request, b"GET /o/a?b=1 HTTP/1.1\r\nhost: backend\r\n\r\n");
    }

    #[tokio::test]
    async fn answer_values_are_slices_of_the_head_and_admit_what_header_value_admits() {
        // Sliced out of one buffer: the second value lies as far after the first as in the
        // bytes the backend sent.
        let (mut conn, mut peer) =
            answered(b"HTTP/1.1 200 OK\r\nX-A: 1\r\nPrefer: 2\r\ncontent-length: 2\r\n\r\nok")
                .await;
        let head = conn.send(get("/a")).await.map_err(|_| ()).expect("head");
        let at = |name: &str| head.headers()[name].as_bytes().as_ptr() as usize;
        assert_eq!(at("prefer") - at("x-a"), "1\r\nPrefer: ".len());
        assert_eq!(head.headers()["prefer"], "2");
        drop(head);
        assert_eq!(body(&mut conn).await.expect("body"), b"ok");
        // The connection goes on with its buffer: a second answer reads whole.
        peer.write_all(b"HTTP/1.1 404 Not Found\r\nx-request-id: r2\r\ncontent-length: 0\r\n\r\n")
            .await
            .expect("answer");
        let second = conn.send(get("/b")).await.map_err(|_| ()).expect("head");
        assert_eq!(second.status(), StatusCode::NOT_FOUND);
        assert_eq!(second.headers()["x-request-id"], "r2");
        assert!(conn.is_reusable());

        // `headers::parsed_value` skips `HeaderValue`'s check for what `httparse` admitted:
        // every byte inside a value is admitted by both or refused by one.
        let start = b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n";
        for (b, value, raw) in crate::headers::heads_with_each_value_byte(start) {
            let (mut conn, _peer) = answered(&raw).await;
            match (conn.send(get("/x")).await, HeaderValue::from_bytes(&value)) {
                (Ok(head), Ok(checked)) => {
                    let got = &head.headers()["x-v"];
                    assert_eq!(got.as_bytes(), checked.as_bytes(), "byte {b:#04x}");
                    assert_eq!(got.to_str().is_ok(), checked.to_str().is_ok(), "{b:#04x}");
                }
                (Err(SendError::Sent(WireError::Invalid(why))), Err(_)) => {
                    assert_eq!(why, "not an HTTP/1.x answer head", "{b:#04x}");
                }
                (Ok(_), Err(_)) => panic!("byte {b:#04x}: kept by us, refused by HeaderValue"),
                (Err(e), Ok(_)) => {
                    panic!("byte {b:#04x}: refused by us ({e:?}), not by HeaderValue")
                }
                (Err(e), Err(_)) => panic!("byte {b:#04x}: refused for another reason: {e:?}"),
            }
        }
    }

    #[tokio::test]
    async fn bodies_are_sent_with_their_length_or_chunked() {
        let (mut conn, mut peer) = pair();
        let answer = b"HTTP/1.1 201 Created\r\ncontent-length: 0\r\n\r\n";
        peer.write_all(answer).await.expect("answer");
        let post = http::Request::post("/p")
            .header("content-length", "999")
            .body(Full::new(Bytes::from_static(b"abc")))
            .expect("request");
        // The declared length is the client's: a body that differs fails the exchange.
        assert!(matches!(
            conn.send(post).await,
            Err(SendError::Sent(WireError::BodyLength))
        ));

        let (mut conn, mut peer) = answered(answer).await;
        let post = http::Request::post("/p")
            .body(Full::new(Bytes::from_static(b"abc")))
            .expect("request");
        assert!(conn.send(post).await.is_ok());
        let sent = written(&mut peer, b"abc").await;
        assert!(sent.ends_with(b"content-length: 3\r\n\r\nabc"), "{sent:?}");

        // A body of unknown length goes chunked, its trailers dropped.
        let (mut conn, mut peer) = answered(answer).await;
        let frames: Vec<Result<http_body::Frame<Bytes>, std::convert::Infallible>> = vec![
            Ok(http_body::Frame::data(Bytes::from_static(b"hello "))),
            Ok(http_body::Frame::data(Bytes::from_static(b"world"))),
            Ok(http_body::Frame::trailers(HeaderMap::new())),
        ];
        let put = http::Request::put("/p")
            .header("transfer-encoding", "gzip, chunked")
            .body(StreamBody::new(futures::stream::iter(frames)))
            .expect("request");
        assert!(conn.send(put).await.is_ok());
        let sent = written(&mut peer, b"0\r\n\r\n").await;
        let sent = String::from_utf8(sent).expect("text");
        assert!(
            sent.ends_with(
                "transfer-encoding: chunked\r\n\r\n6\r\nhello \r\n5\r\nworld\r\n0\r\n\r\n"
            ),
            "{sent}"
        );
        assert!(!sent.contains("gzip"), "{sent}");

        // An empty POST says so; an empty GET carries no framing.
        let (mut conn, mut peer) = answered(answer).await;
        let post = http::Request::post("/p")
            .body(Full::new(Bytes::new()))
            .expect("request");
        assert!(conn.send(post).await.is_ok());
        let sent = written(&mut peer, b"\r\n\r\n").await;
        assert!(sent.ends_with(b"content-length: 0\r\n\r\n"), "{sent:?}");
    }

    #[tokio::test]
    async fn chunked_answers_are_decoded_with_extensions_and_trailers_dropped() {
        let (conn, result) = exchange(
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5;name=value\r\nhello\r\n1 \t;x\r\n!\r\n0\r\nx-trailer: 1\r\n\r\n",
        )
        .await;
        assert_eq!(result.expect("body"), b"hello!");
        assert!(conn.is_reusable());
    }

    #[tokio::test]
    async fn answers_without_a_length_run_to_the_close_and_are_not_reused() {
        let (mut conn, peer) = answered(b"HTTP/1.1 200 OK\r\n\r\nto the end").await;
        let sending = tokio::spawn(async move {
            let head = conn.send(get("/x")).await.map_err(|_| ()).expect("head");
            assert_eq!(head.status(), StatusCode::OK);
            let bytes = body(&mut conn).await.expect("body");
            (conn, bytes)
        });
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        drop(peer);
        let (conn, bytes) = sending.await.expect("task");
        assert_eq!(bytes, b"to the end");
        assert!(!conn.is_reusable());
    }

    #[tokio::test]
    async fn informational_answers_are_skipped_and_head_answers_have_no_body() {
        let (conn, result) =
            exchange(b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nlink: </a>\r\n\r\nHTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok").await;
        assert_eq!(result.expect("body"), b"ok");
        assert!(conn.is_reusable());

        let (mut conn, _peer) = answered(b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\n").await;
        let head = http::Request::head("/x")
            .body(Full::new(Bytes::new()))
            .expect("request");
        assert!(conn.send(head).await.is_ok());
        assert!(conn.body_ended());
        // The head declares a body the answer does not have: a backend that writes it anyway
        // would answer the next request with it, so the connection is not used again.
        assert!(!conn.is_reusable());

        // A 204 carries no body whatever it says; one that says it has one is not reused.
        let (mut conn, _peer) =
            answered(b"HTTP/1.1 204 No Content\r\ncontent-length: 3\r\n\r\n").await;
        assert!(conn.send(get("/x")).await.is_ok());
        assert!(conn.body_ended());
        assert!(!conn.is_reusable());
        for answer in [
            &b"HTTP/1.1 304 Not Modified\r\ntransfer-encoding: chunked\r\n\r\n"[..],
            b"HTTP/1.1 304 Not Modified\r\ncontent-length: 7\r\n\r\n",
        ] {
            let (mut conn, _peer) = answered(answer).await;
            assert!(conn.send(get("/x")).await.is_ok());
            assert!(conn.body_ended());
            assert!(!conn.is_reusable(), "{}", String::from_utf8_lossy(answer));
        }
        // Bodiless answers that declare nothing (or nothing more) keep the connection.
        for answer in [
            &b"HTTP/1.1 204 No Content\r\n\r\n"[..],
            b"HTTP/1.1 304 Not Modified\r\ncontent-length: 0\r\n\r\n",
        ] {
            let (mut conn, _peer) = answered(answer).await;
            assert!(conn.send(get("/x")).await.is_ok());
            assert!(conn.is_reusable(), "{}", String::from_utf8_lossy(answer));
        }
        let (mut conn, _peer) = answered(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n").await;
        let head = http::Request::head("/x")
            .body(Full::new(Bytes::new()))
            .expect("request");
        assert!(conn.send(head).await.is_ok());
        assert!(conn.is_reusable());
    }

    #[tokio::test]
    async fn connection_close_and_http_1_0_end_the_connection_after_the_answer() {
        let (conn, result) =
            exchange(b"HTTP/1.1 200 OK\r\nconnection: Close\r\ncontent-length: 1\r\n\r\nx").await;
        assert_eq!(result.expect("body"), b"x");
        assert!(!conn.is_reusable());
        let (conn, result) = exchange(b"HTTP/1.0 200 OK\r\ncontent-length: 1\r\n\r\nx").await;
        assert_eq!(result.expect("body"), b"x");
        assert!(!conn.is_reusable());
        let (conn, result) =
            exchange(b"HTTP/1.0 200 OK\r\nconnection: keep-alive\r\ncontent-length: 1\r\n\r\nx")
                .await;
        assert_eq!(result.expect("body"), b"x");
        assert!(conn.is_reusable());
        // Bytes past the answer: the backend is out of step, the connection is not reused.
        let (conn, result) =
            exchange(b"HTTP/1.1 200 OK\r\ncontent-length: 1\r\n\r\nxHTTP/1.1 200 OK\r\n").await;
        assert_eq!(result.expect("body"), b"x");
        assert!(!conn.is_reusable());
    }

    #[tokio::test]
    async fn ambiguous_or_oversized_answers_are_refused() {
        let both =
            b"HTTP/1.1 200 OK\r\ncontent-length: 3\r\ntransfer-encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n";
        assert_eq!(
            refused(exchange(both).await.1),
            "both Content-Length and Transfer-Encoding"
        );
        let differ = b"HTTP/1.1 200 OK\r\ncontent-length: 3\r\ncontent-length: 4\r\n\r\nabcd";
        assert_eq!(
            refused(exchange(differ).await.1),
            "Content-Lengths that differ"
        );
        let list = b"HTTP/1.1 200 OK\r\ncontent-length: 3, 4\r\n\r\nabcd";
        assert_eq!(
            refused(exchange(list).await.1),
            "Content-Lengths that differ"
        );
        // The same length twice is one length.
        let (mut conn, _peer) =
            answered(b"HTTP/1.1 200 OK\r\ncontent-length: 3, 3\r\n\r\nabc").await;
        let head = conn.send(get("/x")).await.map_err(|_| ()).expect("head");
        assert_eq!(
            head.headers()["content-length"],
            "3",
            "restated as one number"
        );
        assert_eq!(body(&mut conn).await.expect("body"), b"abc");
        for bad in ["+3", "-3", "3x", "0x3", "", "99999999999999999999"] {
            let answer = format!("HTTP/1.1 200 OK\r\ncontent-length: {bad}\r\n\r\nabc");
            assert_eq!(
                refused(exchange(answer.as_bytes()).await.1),
                "an invalid Content-Length",
                "{bad:?}"
            );
        }
        let switch = b"HTTP/1.1 101 Switching Protocols\r\nupgrade: websocket\r\n\r\n";
        assert_eq!(
            refused(exchange(switch).await.1),
            "a 101 the request did not ask for"
        );
        let hints = b"HTTP/1.1 103 Early Hints\r\n\r\n".repeat(MAX_INFORMATIONAL + 1);
        assert_eq!(
            refused(exchange(&hints).await.1),
            "too many informational answers"
        );
        let mut many = b"HTTP/1.1 200 OK\r\n".to_vec();
        for i in 0..=MAX_HEADERS {
            many.extend_from_slice(format!("x-{i}: v\r\n").as_bytes());
        }
        many.extend_from_slice(b"\r\n");
        assert_eq!(refused(exchange(&many).await.1), "more than 100 headers");
        // Past the first, small parse and up to the bound: every header kept.
        for count in [FEW_HEADERS, FEW_HEADERS + 1, MAX_HEADERS] {
            let mut answer = b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n".to_vec();
            for i in 1..count {
                answer.extend_from_slice(format!("x-{i}: v{i}\r\n").as_bytes());
            }
            answer.extend_from_slice(b"\r\n");
            let (mut conn, _peer) = answered(&answer).await;
            let head = conn.send(get("/x")).await.map_err(|_| ()).expect("head");
            assert_eq!(head.headers().len(), count, "{count} headers");
            assert_eq!(
                head.headers()[format!("x-{}", count - 1)],
                format!("v{}", count - 1)
            );
        }
        let mut huge = b"HTTP/1.1 200 OK\r\nx-big: ".to_vec();
        huge.extend(std::iter::repeat_n(b'a', MAX_HEAD_BYTES));
        assert_eq!(
            refused(exchange(&huge).await.1),
            "an answer head over 128 KiB"
        );
        // Complete, and all read at once: still over the bound.
        huge.extend_from_slice(b"\r\ncontent-length: 0\r\n\r\n");
        let (mut conn, _peer) = pair();
        conn.buf.extend_from_slice(&huge);
        assert!(matches!(
            conn.read_head(false).await,
            Err(WireError::Invalid("an answer head over 128 KiB"))
        ));
        assert_eq!(
            refused(exchange(b"SMTP ready\r\n\r\n").await.1),
            "not an HTTP/1.x answer head"
        );
    }

    #[test]
    fn the_last_transfer_coding_of_all_fields_frames_an_answer() {
        let framing = |head: &[u8]| {
            let head = parse_head(&mut BytesMut::from(head))
                .expect("valid")
                .expect("complete");
            (head.framing, head.keep_alive)
        };
        for (te, expected) in [
            ("chunked\r\ntransfer-encoding: ", Framing::CHUNKED),
            ("chunked\r\ntransfer-encoding: ,", Framing::CHUNKED),
            ("", Framing::UntilClose),
        ] {
            let head = format!("HTTP/1.1 200 OK\r\ntransfer-encoding: {te}\r\n\r\n");
            assert_eq!(framing(head.as_bytes()), (expected, true), "{te:?}");
        }
        // A coding the gateway would have to undo: refused, never passed on de-chunked.
        for te in [
            "gzip\r\ntransfer-encoding: chunked",
            "chunked\r\ntransfer-encoding: gzip",
            "chunked, gzip",
            "gzip, chunked",
            "identity",
        ] {
            let head = format!("HTTP/1.1 200 OK\r\ntransfer-encoding: {te}\r\n\r\n");
            assert!(
                matches!(
                    parse_head(&mut BytesMut::from(head.as_bytes())),
                    Err(WireError::Invalid("a transfer coding other than chunked"))
                ),
                "{te:?}"
            );
        }
        // An HTTP/1.0 answer with a transfer coding is not kept alive, whatever it asks.
        assert_eq!(
            framing(
                b"HTTP/1.0 200 OK\r\ntransfer-encoding: chunked\r\nconnection: keep-alive\r\n\r\n"
            ),
            (Framing::CHUNKED, false)
        );
        assert_eq!(
            framing(b"HTTP/1.0 200 OK\r\ncontent-length: 1\r\nconnection: keep-alive\r\n\r\n"),
            (Framing::Length(1), true)
        );
    }

    #[tokio::test]
    async fn chunked_bodies_out_of_bounds_are_refused() {
        let chunked =
            |rest: &str| format!("HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n{rest}");
        let cases = [
            ("zz\r\n", "a chunk-size line without a size"),
            ("1ffffffffffffffff\r\n", "a chunk size over 64 bits"),
            (
                "3 x\r\nabc\r\n0\r\n\r\n",
                "a chunk size followed by something other than an extension",
            ),
            ("3 \r\nabc\r\n0\r\n\r\n", "whitespace after a chunk size"),
            (
                "3\r\nabcX\r\n0\r\n\r\n",
                "a chunk's data not followed by CRLF",
            ),
        ];
        for (rest, why) in cases {
            assert_eq!(
                refused(exchange(chunked(rest).as_bytes()).await.1),
                why,
                "{rest:?}"
            );
        }
        let long_line = format!("1;{}\r\nx\r\n0\r\n\r\n", "e".repeat(MAX_CHUNK_LINE));
        assert_eq!(
            refused(exchange(chunked(&long_line).as_bytes()).await.1),
            "a chunk-size line over 4 KiB"
        );
        // Extensions within a line's bound, but over the body's bound in all.
        let ext = format!("1;{}\r\nx\r\n", "e".repeat(2000));
        let many = format!("{}0\r\n\r\n", ext.repeat(10));
        assert_eq!(
            refused(exchange(chunked(&many).as_bytes()).await.1),
            "chunk extensions and trailers over 16 KiB"
        );
        let trailers = format!("0\r\n{}\r\n", "x-t: v\r\n".repeat(3000));
        assert_eq!(
            refused(exchange(chunked(&trailers).as_bytes()).await.1),
            "chunk extensions and trailers over 16 KiB"
        );
    }

    #[tokio::test]
    async fn a_cut_answer_is_incomplete_and_an_idle_close_is_seen() {
        let (mut conn, peer) = answered(b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\nabc").await;
        assert!(conn.send(get("/x")).await.is_ok());
        drop(peer);
        assert!(matches!(body(&mut conn).await, Err(WireError::Incomplete)));
        assert!(!conn.is_reusable());

        let (mut conn, peer) = answered(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n").await;
        assert!(conn.send(get("/x")).await.is_ok());
        let mut cx = Context::from_waker(std::task::Waker::noop());
        assert!(!conn.poll_idle_closed(&mut cx), "open and quiet");
        drop(peer);
        assert!(conn.poll_idle_closed(&mut cx), "closed by the backend");
    }

    /// The head's header lines (after the request line), in order.
    fn header_lines(head: &[u8]) -> Vec<String> {
        let text = std::str::from_utf8(head).expect("a head is ASCII here");
        let mut lines: Vec<String> = text.split("\r\n").skip(1).map(str::to_owned).collect();
        assert_eq!(lines.pop().as_deref(), Some(""), "ends with an empty line");
        assert_eq!(lines.pop().as_deref(), Some(""), "ends with an empty line");
        lines
    }

    #[test]
    fn an_empty_path_is_written_as_a_slash_before_a_query_too() {
        for (uri, line) in [
            ("http://backend?admin=1", "GET /?admin=1 HTTP/1.1"),
            ("http://backend", "GET / HTTP/1.1"),
            ("backend:443", "GET / HTTP/1.1"),
            ("/a?b", "GET /a?b HTTP/1.1"),
            ("*", "GET * HTTP/1.1"),
        ] {
            let request = http::Request::get(uri).body(()).expect("request");
            let mut written = Vec::new();
            encode_head(&mut written, &request, Sending::Nothing, Added::default());
            let written = String::from_utf8(written).expect("ascii");
            assert_eq!(written.split("\r\n").next(), Some(line), "{uri}");
        }
    }

    #[test]
    fn a_pool_s_host_replaces_the_request_s_own_and_comes_first() {
        let host = HeaderValue::from_static("backend:9000");
        let request = http::Request::get("/x")
            .header("accept", "*/*")
            .header("host", "client.example")
            .header("x-kept", "1")
            .body(())
            .expect("request");
        let mut written = Vec::new();
        let added = Added {
            host: Some(&host),
            backend: None,
        };
        encode_head(&mut written, &request, Sending::Nothing, added);
        assert_eq!(
            header_lines(&written),
            ["host: backend:9000", "accept: */*", "x-kept: 1"]
        );
        let mut plain = Vec::new();
        encode_head(&mut plain, &request, Sending::Nothing, Added::default());
        assert_eq!(
            header_lines(&plain),
            ["accept: */*", "host: client.example", "x-kept: 1"]
        );
    }

    #[test]
    fn a_head_written_for_a_backend_has_the_headers_the_rewritten_map_has() {
        use crate::actor::Actor;
        use crate::plane::Plane;
        let host = HeaderValue::from_static("backend:9000");
        let mut v6 = Actor::unauthenticated(Plane::Data);
        v6.client_ip = Some("2001:db8::7".parse().expect("ip"));
        v6.project = Some("proj\u{7f}".into());
        let mut user = Actor::unauthenticated(Plane::Data);
        user.project = Some("alpha".into());
        user.user_id = Some("6a3e1c9e-user".into());
        user.org_role = Some("admin".into());
        user.client_ip = Some("203.0.113.7".parse().expect("ip"));
        let clients: [&[(&str, &str)]; 4] = [
            &[],
            &[
                ("accept", "*/*"),
                ("host", "gateway.example"),
                ("apikey", "k"),
            ],
            &[
                ("connection", "keep-alive, x-hop, X-Request-Id"),
                ("x-hop", "1"),
                ("x-request-id", "r1"),
                ("x-aura-role", "service_role"),
                ("x-forwarded-for", "6.6.6.6"),
                ("forwarded", "for=6.6.6.6"),
                ("accept", "a"),
                ("accept", "b"),
                ("content-length", "0"),
                ("authorization", "Bearer t"),
                ("te", "trailers"),
                ("x-api-key", "k"),
                ("x-client-info", "sdk/1"),
            ],
            &[
                ("upgrade", "h2c"),
                ("transfer-encoding", "chunked"),
                ("keep-alive", "5"),
            ],
        ];
        for actor in [Actor::unauthenticated(Plane::Data), v6, user] {
            for client in clients {
                let mut request = http::Request::post("/v1/storage/o?x=1").body(());
                let headers = request.as_mut().expect("request").headers_mut();
                for (name, value) in client {
                    headers.append(
                        http::HeaderName::from_static(name),
                        HeaderValue::from_static(value),
                    );
                }
                let request = request.expect("request");
                let sending = Sending::Length(0);

                let backend =
                    crate::proxy::headers::HttpBackendHeaders::new(request.headers(), &actor);
                let mut written = Vec::new();
                let added = Added {
                    host: Some(&host),
                    backend: Some(&backend),
                };
                encode_head(&mut written, &request, sending, added);

                let mut rewritten = request.map(|()| ());
                crate::proxy::headers::for_http_backend(rewritten.headers_mut(), &actor);
                rewritten.headers_mut().insert(header::HOST, host.clone());
                let mut expected = Vec::new();
                encode_head(&mut expected, &rewritten, sending, Added::default());

                let (written, mut expected) = (header_lines(&written), header_lines(&expected));
                assert_eq!(written[0], "host: backend:9000", "{client:?}");
                let mut sorted = written.clone();
                sorted.sort();
                expected.sort();
                assert_eq!(sorted, expected, "{client:?} from {actor:?}");
                // The client's kept headers in their order in the map.
                let kept: Vec<&String> = written
                    .iter()
                    .filter(|l| l.starts_with("accept") || l.starts_with("x-request-id"))
                    .collect();
                let mut in_order = kept.clone();
                in_order
                    .sort_by_key(|l| client.iter().position(|(n, v)| **l == format!("{n}: {v}")));
                assert_eq!(kept, in_order);
            }
        }
    }
}
