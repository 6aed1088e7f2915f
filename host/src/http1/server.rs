//! HTTP/1.1 heads on the client's side: a request head parsed by `httparse` into an
//! `http::Request`, an answer head encoded for the wire.
//!
//! A request head is refused — the contract's JSON error, then the connection closed — when it
//! is not HTTP/1.x (`400`), is over the listener's head limit or has more than
//! [`MAX_HEADERS`] headers (`431`), or frames its body ambiguously (RFC 9112 §6.3): a
//! `Content-Length` beside a `Transfer-Encoding`, `Content-Length`s that differ or are not
//! digits, a transfer coding other than `chunked` alone, a `Transfer-Encoding` in HTTP/1.0,
//! no `Host` or more than one (`400`). Header values are sliced out of the head's bytes, not
//! copied.

use std::cell::RefCell;
use std::time::{SystemTime, UNIX_EPOCH};

use bytes::{Bytes, BytesMut};
use http::{HeaderMap, HeaderValue, Method, Request, StatusCode, Uri, Version, header};

use super::head::{FramingFields, HeadEdits, Rules, line};
use crate::error::{GatewayError, Side};
use crate::http1::body::{Framing, content_length};

/// The most headers a request head may carry (hyper's server default).
pub(crate) const MAX_HEADERS: usize = 100;

/// A request head, parsed.
#[derive(Debug)]
pub(crate) struct RequestHead {
    /// Method, target, version and headers; the body is the connection's to give.
    pub request: Request<()>,
    /// How the request's body ends (`Done`: it has none).
    pub body: Framing,
    /// Whether the client keeps the connection for another request.
    pub keep_alive: bool,
    /// `Expect: 100-continue`: the client waits for a `100` before it sends the body.
    pub expect_continue: bool,
    /// The request asks to switch protocols (`Upgrade`).
    pub upgrade: bool,
}

/// Why a head is refused: the answer's status, code and message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Refusal {
    pub status: StatusCode,
    pub code: &'static str,
    pub message: &'static str,
}

impl Refusal {
    fn bad(message: &'static str) -> Self {
        Self {
            status: StatusCode::BAD_REQUEST,
            code: "malformed_request",
            message,
        }
    }

    fn too_large(message: &'static str) -> Self {
        Self {
            status: StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            code: "request_headers_too_large",
            message,
        }
    }

    /// The contract's JSON error for it.
    pub fn error(&self) -> GatewayError {
        GatewayError::new(self.status, self.code, self.message, Side::Client)
    }
}

/// Where one header's name and value lie in the head.
#[derive(Debug, Clone, Copy, Default)]
struct Field {
    name: (u32, u32),
    value: (u32, u32),
}

/// The request head at the start of `buf`, taken out of it when complete; `None` while it is
/// not all there. Only the first `limit` bytes are looked at: a head not complete within them
/// is refused.
pub(crate) fn parse(buf: &mut BytesMut, limit: usize) -> Result<Option<RequestHead>, Refusal> {
    let within = &buf[..buf.len().min(limit)];
    let start = within.as_ptr() as usize;
    let offset = |part: &[u8]| -> (u32, u32) {
        // Every part lies in `within`, which is under `limit` (a `u32`-sized configuration).
        ((part.as_ptr() as usize - start) as u32, part.len() as u32)
    };
    // Left uninitialised: `httparse` writes the ones it parses (3.2 KB a request otherwise).
    let mut headers =
        [const { std::mem::MaybeUninit::<httparse::Header<'_>>::uninit() }; MAX_HEADERS];
    let mut parsed = httparse::Request::new(&mut []);
    let len = match parsed.parse_with_uninit_headers(within, &mut headers) {
        Ok(httparse::Status::Complete(len)) => len,
        Ok(httparse::Status::Partial) if buf.len() >= limit => {
            return Err(Refusal::too_large(
                "the request head is over the listener's limit",
            ));
        }
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(httparse::Error::TooManyHeaders) => {
            return Err(Refusal::too_large("more than 100 request headers"));
        }
        Err(_) => return Err(Refusal::bad("not an HTTP/1.x request head")),
    };
    let method = Method::from_bytes(parsed.method.unwrap_or_default().as_bytes())
        .map_err(|_| Refusal::bad("an invalid method"))?;
    let target = offset(parsed.path.unwrap_or_default().as_bytes());
    let version = match parsed.version {
        Some(0) => Version::HTTP_10,
        _ => Version::HTTP_11,
    };
    let mut fields = [Field::default(); MAX_HEADERS];
    let count = parsed.headers.len();
    for (field, h) in fields.iter_mut().zip(parsed.headers.iter()) {
        *field = Field {
            name: offset(h.name.as_bytes()),
            value: offset(h.value),
        };
    }
    let head = buf.split_to(len).freeze();
    let slice = |(at, len): (u32, u32)| head.slice(at as usize..(at + len) as usize);
    let uri = Uri::from_maybe_shared(slice(target))
        .map_err(|_| Refusal::bad("an invalid request target"))?;

    let mut map = HeaderMap::with_capacity(count + crate::headers::REQUEST_HEADERS);
    let mut framing = FramingFields::default();
    let mut expect_continue = false;
    let mut hosts = 0;
    for field in &fields[..count] {
        let (at, n) = field.name;
        let name = crate::headers::name(&head[at as usize..(at + n) as usize])
            .map_err(|_| Refusal::bad("an invalid header name"))?;
        let value = crate::headers::parsed_value(slice(field.value))
            .map_err(|_| Refusal::bad("an invalid header value"))?;
        let raw = value.as_bytes();
        framing
            .read(&name, raw, Rules::Request)
            .map_err(Refusal::bad)?;
        if name == header::EXPECT {
            expect_continue |= raw.eq_ignore_ascii_case(b"100-continue");
        } else if name == header::HOST {
            hosts += 1;
        }
        map.append(name, value);
    }
    if hosts > 1 || (hosts == 0 && version == Version::HTTP_11) {
        return Err(Refusal::bad(
            "an HTTP/1.1 request needs exactly one Host header",
        ));
    }
    let FramingFields {
        length,
        restate_length,
        chunked,
        coded,
        close,
        keep_alive: keep_alive_token,
    } = framing;
    let chunked = chunked.is_some();
    let transfer_encoding = chunked || coded;
    if transfer_encoding && version == Version::HTTP_10 {
        return Err(Refusal::bad("a Transfer-Encoding in an HTTP/1.0 request"));
    }
    if coded {
        return Err(Refusal::bad("a transfer coding other than chunked alone"));
    }
    let body = match (chunked, length) {
        (true, Some(_)) => {
            return Err(Refusal::bad("both Content-Length and Transfer-Encoding"));
        }
        (true, None) => Framing::CHUNKED,
        (false, Some(0) | None) => Framing::Done,
        (false, Some(n)) => Framing::Length(n),
    };
    if restate_length && let Some(n) = length {
        // Passed on as the one number it means.
        map.insert(header::CONTENT_LENGTH, HeaderValue::from(n));
    }
    let keep_alive = match version {
        Version::HTTP_10 => keep_alive_token && !close,
        _ => !close,
    };
    let upgrade = map.contains_key(header::UPGRADE);
    let mut request = Request::new(());
    *request.method_mut() = method;
    *request.uri_mut() = uri;
    *request.version_mut() = version;
    *request.headers_mut() = map;
    Ok(Some(RequestHead {
        request,
        body,
        keep_alive,
        expect_continue: expect_continue && version == Version::HTTP_11,
        upgrade,
    }))
}

/// Whether `buf` holds an empty line (`\n\n` or `\n\r\n`), the end of a head: searched from
/// `scanned` (less the two bytes a line end may straddle), which is moved to the end.
pub(crate) fn may_end(buf: &[u8], scanned: &mut usize) -> bool {
    let from = scanned.saturating_sub(2).min(buf.len());
    *scanned = buf.len();
    let rest = &buf[from..];
    rest.iter().enumerate().any(|(i, b)| {
        *b == b'\n'
            && match rest.get(i + 1) {
                Some(b'\n') => true,
                Some(b'\r') => rest.get(i + 2) == Some(&b'\n'),
                _ => false,
            }
    })
}

/// How an answer's body is framed on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Sending {
    /// No body follows (`HEAD`, `1xx`, `204`, `304`): the answer's own length header, if any,
    /// is passed as it is (but never on a `1xx` or `204`).
    Bodiless,
    Length(u64),
    Chunked,
    /// The body runs to the connection's close (an HTTP/1.0 client, a length not known).
    UntilClose,
}

/// What the connection adds to an answer's head.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Framed {
    pub version: Version,
    pub sending: Sending,
    /// `Connection: close` (the connection ends after this answer).
    pub close: bool,
}

/// Writes the answer head into `out`: the status line, the answer's headers but those the
/// connection decides (`Connection`, `Keep-Alive`, `Content-Length`, `Transfer-Encoding`) and
/// those `stamps` replace (an answer's stamps: request id, security and rate-limit headers), the
/// stamps, the connection's own headers, and `Date` when the answer
/// has none. A `101` keeps its `Connection`.
pub(crate) fn encode(
    out: &mut Vec<u8>,
    status: StatusCode,
    headers: &HeaderMap,
    stamps: &impl HeadEdits,
    framed: Framed,
) {
    out.extend_from_slice(match framed.version {
        Version::HTTP_10 => b"HTTP/1.0 ",
        _ => b"HTTP/1.1 ",
    });
    out.extend_from_slice(status.as_str().as_bytes());
    out.push(b' ');
    out.extend_from_slice(status.canonical_reason().unwrap_or("").as_bytes());
    out.extend_from_slice(b"\r\n");
    let switching = status == StatusCode::SWITCHING_PROTOCOLS;
    let keeps_length = framed.sending == Sending::Bodiless
        && !status.is_informational()
        && status != StatusCode::NO_CONTENT;
    let mut dated = false;
    for (name, value) in headers {
        // Names are lower case: compared as they are, after their length.
        let text = name.as_str();
        let skip = match text.len() {
            4 if text == "date" => {
                dated = true;
                false
            }
            10 if text == "connection" || text == "keep-alive" => !switching,
            14 if text == "content-length" => !keeps_length,
            17 if text == "transfer-encoding" => true,
            _ => stamps.skips(text),
        };
        if skip {
            continue;
        }
        line(out, text.as_bytes(), value.as_bytes());
    }
    stamps.write_lines(out);
    match framed.sending {
        Sending::Length(n) => {
            out.extend_from_slice(b"content-length: ");
            out.extend_from_slice(itoa::Buffer::new().format(n).as_bytes());
            out.extend_from_slice(b"\r\n");
        }
        Sending::Chunked => out.extend_from_slice(b"transfer-encoding: chunked\r\n"),
        Sending::Bodiless | Sending::UntilClose => {}
    }
    if !switching {
        if framed.close {
            out.extend_from_slice(b"connection: close\r\n");
        } else if framed.version == Version::HTTP_10 {
            out.extend_from_slice(b"connection: keep-alive\r\n");
        }
    }
    if !dated {
        out.extend_from_slice(b"date: ");
        date(|now| out.extend_from_slice(now));
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"\r\n");
}

/// The length an answer's `Content-Length` header states, when it is one number.
pub(crate) fn stated_length(headers: &HeaderMap) -> Option<u64> {
    let mut values = headers.get_all(header::CONTENT_LENGTH).iter();
    let first = content_length(values.next()?.as_bytes())?;
    values
        .all(|v| content_length(v.as_bytes()) == Some(first))
        .then_some(first)
}

thread_local! {
    /// The `Date` of this second, formatted once per second per thread.
    static DATE: RefCell<(u64, Bytes)> = const { RefCell::new((u64::MAX, Bytes::new())) };
}

/// Calls `f` with the current time as an HTTP date (IMF-fixdate).
fn date(f: impl FnOnce(&[u8])) {
    let now = SystemTime::now();
    let second = now.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    DATE.with(|cell| {
        let mut cached = cell.borrow_mut();
        if cached.0 != second {
            *cached = (second, Bytes::from(httpdate::fmt_http_date(now)));
        }
        f(&cached.1);
    });
}

#[cfg(test)]
mod tests {
    use http::HeaderName;

    use super::*;
    use crate::http1::head::NoEdits;
    use crate::phases::stamps::Stamps;

    fn parse_all(raw: &[u8]) -> Result<Option<RequestHead>, Refusal> {
        let mut buf = BytesMut::from(raw);
        parse(&mut buf, 16 * 1024)
    }

    fn whole(raw: &[u8]) -> RequestHead {
        parse_all(raw).expect("valid").expect("complete")
    }

    #[test]
    fn httparse_and_header_value_admit_the_same_bytes() {
        // `headers::parsed_value` skips `HeaderValue`'s check for what `httparse` admitted: every byte
        // inside a value, alone and between others, is admitted by both or refused by one.
        let start = b"GET / HTTP/1.1\r\nhost: h\r\n";
        for (b, value, raw) in crate::headers::heads_with_each_value_byte(start) {
            let ours = parse_all(&raw);
            let theirs = HeaderValue::from_bytes(&value);
            match (ours, theirs) {
                (Ok(Some(head)), Ok(checked)) => {
                    let got = head.request.headers().get("x-v").expect("kept");
                    assert_eq!(got.as_bytes(), checked.as_bytes(), "byte {b:#04x}");
                    assert_eq!(got.to_str().is_ok(), checked.to_str().is_ok(), "{b:#04x}");
                }
                (Err(refusal), Err(_)) => {
                    assert_eq!(
                        refusal,
                        Refusal::bad("not an HTTP/1.x request head"),
                        "{b:#04x}"
                    );
                }
                (ours, theirs) => panic!("byte {b:#04x}: ours {ours:?}, HeaderValue's {theirs:?}"),
            }
        }
        // Values that are not ASCII go through the check, and are kept as they came.
        let head = whole(b"GET / HTTP/1.1\r\nhost: h\r\nx-v: caf\xc3\xa9 \xff\r\n\r\n");
        let got = head.request.headers().get("x-v").expect("kept");
        assert_eq!(got.as_bytes(), b"caf\xc3\xa9 \xff");
        assert!(got.to_str().is_err(), "not visible ASCII");
    }

    fn refused(raw: &str) -> Refusal {
        parse_all(raw.as_bytes()).expect_err(raw)
    }

    #[test]
    fn a_request_head_is_parsed_and_taken_out_of_the_buffer() {
        let mut buf = BytesMut::from(
            &b"POST /v1/x?y=1 HTTP/1.1\r\nHost: gw\r\nX-Key: a b\r\nContent-Length: 3\r\n\r\nabcGET"[..],
        );
        let head = parse(&mut buf, 1024).expect("valid").expect("complete");
        assert_eq!(&buf[..], b"abcGET", "the body and what follows stay");
        assert_eq!(head.request.method(), Method::POST);
        assert_eq!(head.request.uri().path(), "/v1/x");
        assert_eq!(head.request.uri().query(), Some("y=1"));
        assert_eq!(head.request.headers()["x-key"], "a b");
        assert_eq!(head.body, Framing::Length(3));
        assert!(head.keep_alive && !head.expect_continue && !head.upgrade);

        let mut partial = BytesMut::from(&b"GET / HTTP/1.1\r\nHost: gw\r\n"[..]);
        assert!(parse(&mut partial, 1024).expect("valid so far").is_none());
        assert_eq!(partial.len(), 26, "nothing taken while incomplete");
    }

    #[test]
    fn a_request_map_has_room_for_the_headers_the_phases_add() {
        // What the phases insert on a request's way to an HTTP backend, at most.
        let added = [
            "traceparent",
            "tracestate",
            "x-request-id",
            "x-aura-role",
            "x-aura-project",
            "x-aura-user-id",
            "x-aura-org-role",
            "x-forwarded-for",
            "x-aura-client-ip",
        ];
        assert_eq!(added.len(), crate::headers::REQUEST_HEADERS);
        for count in 1..=40 {
            let mut raw = String::from("GET / HTTP/1.1\r\nHost: gw\r\n");
            for i in 1..count {
                raw.push_str(&format!("x-client-{i}: v\r\n"));
            }
            raw.push_str("\r\n");
            let mut head = whole(raw.as_bytes());
            let headers = head.request.headers_mut();
            assert_eq!(headers.len(), count);
            let room = headers.capacity();
            for name in added {
                headers.insert(HeaderName::from_static(name), HeaderValue::from_static("v"));
            }
            assert_eq!(headers.capacity(), room, "{count} headers: the map grew");
        }
    }

    #[test]
    fn keep_alive_expect_and_upgrade_are_read_per_version() {
        let h = whole(b"GET / HTTP/1.0\r\n\r\n");
        assert!(!h.keep_alive, "HTTP/1.0 closes unless asked");
        let h = whole(b"GET / HTTP/1.0\r\nConnection: Keep-Alive\r\n\r\n");
        assert!(h.keep_alive);
        let h = whole(b"GET / HTTP/1.1\r\nHost: a\r\nConnection: x, close\r\n\r\n");
        assert!(!h.keep_alive);
        let h = whole(b"PUT / HTTP/1.1\r\nHost: a\r\nExpect: 100-Continue\r\nTransfer-Encoding: chunked\r\n\r\n");
        assert!(h.expect_continue);
        assert_eq!(h.body, Framing::CHUNKED);
        let h = whole(
            b"GET / HTTP/1.1\r\nHost: a\r\nUpgrade: websocket\r\nConnection: upgrade\r\n\r\n",
        );
        assert!(h.upgrade);
        let h = whole(b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 4, 4\r\n\r\n");
        assert_eq!(h.body, Framing::Length(4));
        assert_eq!(
            h.request.headers()["content-length"],
            "4",
            "restated as one number"
        );
    }

    #[test]
    fn ambiguous_or_malformed_heads_are_refused() {
        let bad = [
            "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n",
            "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 2\r\nContent-Length: 4\r\n\r\n",
            "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 2, 4\r\n\r\n",
            "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: -1\r\n\r\n",
            "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: gzip\r\n\r\n",
            "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: gzip, chunked\r\n\r\n",
            "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked, chunked\r\n\r\n",
            "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n",
            "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: \r\n\r\n",
            "POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n",
            "GET / HTTP/1.1\r\n\r\n",
            "GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n",
            "GET / HTTP/1.1\r\nHost: a\r\nBad Name: v\r\n\r\n",
            "GET / HTTP/1.1\r\nHost: a\r\nX-Ctl\x01: v\r\n\r\n",
            "GET / HTTP/1.1\r\nHost: a\r\n: empty\r\n\r\n",
            "GET / HTTP/1.1\r\nHost: a\r\nX: a\x00b\r\n\r\n",
            "GET / HTTP/2.0\r\nHost: a\r\n\r\n",
            "G@T / HTTP/1.1\r\nHost: a\r\n\r\n",
            "GET /\x7f HTTP/1.1\r\nHost: a\r\n\r\n",
        ];
        for raw in bad {
            assert_eq!(refused(raw).status, StatusCode::BAD_REQUEST, "{raw:?}");
        }
        let mut many = String::from("GET / HTTP/1.1\r\nHost: a\r\n");
        for i in 0..MAX_HEADERS {
            many.push_str(&format!("x-{i}: v\r\n"));
        }
        many.push_str("\r\n");
        assert_eq!(
            refused(&many).status,
            StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE
        );
        let mut buf = BytesMut::from(format!("GET /{} HTTP/1.1\r\n", "a".repeat(2000)).as_bytes());
        let over = parse(&mut buf, 1024).expect_err("over the limit, never complete");
        assert_eq!(over.status, StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE);
        // A head that ends past the limit is refused even when all of it is buffered.
        let mut buf = BytesMut::from(
            format!(
                "GET / HTTP/1.1\r\nHost: a\r\nx: {}\r\n\r\n",
                "v".repeat(2000)
            )
            .as_bytes(),
        );
        assert!(parse(&mut buf, 1024).is_err());
    }

    fn map_of(headers: &[(&str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (n, v) in headers {
            map.append(
                HeaderName::from_bytes(n.as_bytes()).expect("name"),
                HeaderValue::from_str(v).expect("value"),
            );
        }
        map
    }

    fn encoded(status: StatusCode, headers: &[(&str, &str)], framed: Framed) -> String {
        let mut out = Vec::new();
        encode(&mut out, status, &map_of(headers), &NoEdits, framed);
        String::from_utf8(out).expect("ascii")
    }

    /// The header lines of an encoded head, sorted (the date's value left out).
    fn lines_of(head: &[u8]) -> Vec<(String, String)> {
        let mut headers = [httparse::EMPTY_HEADER; 32];
        let mut parsed = httparse::Response::new(&mut headers);
        assert!(matches!(
            parsed.parse(head),
            Ok(httparse::Status::Complete(_))
        ));
        let mut lines: Vec<(String, String)> = parsed
            .headers
            .iter()
            .map(|h| {
                let value = if h.name == "date" {
                    String::new()
                } else {
                    String::from_utf8_lossy(h.value).into_owned()
                };
                (h.name.to_owned(), value)
            })
            .collect();
        lines.sort();
        lines
    }

    #[test]
    fn stamps_are_written_in_place_of_an_answer_s_own_copies_of_their_names() {
        use std::time::Duration;

        use crate::phases::request_id::RequestId;
        use crate::ratelimit::Decision;

        // A backend's answer that sets every stamped name itself, and others.
        let backend = [
            ("content-security-policy", "default-src *"),
            ("x-content-type-options", "sniff"),
            ("referrer-policy", "unsafe-url"),
            ("strict-transport-security", "max-age=0"),
            ("x-frame-options", "SAMEORIGIN"),
            ("x-request-id", "from-the-backend"),
            ("ratelimit-limit", "7"),
            ("ratelimit-remaining", "6"),
            ("ratelimit-reset", "60"),
            ("x-a", "1"),
            ("content-type", "text/plain"),
        ];
        let id = RequestId::mint();
        let decision = Decision::allowed(1000, 998, Duration::from_millis(2_500));
        let framed = Framed {
            version: Version::HTTP_11,
            sending: Sending::Length(0),
            close: false,
        };
        for bits in 0..8u8 {
            let stamps = Stamps::of_bits(bits, &id, &decision);
            let mut written = Vec::new();
            encode(
                &mut written,
                StatusCode::OK,
                &map_of(&backend),
                &stamps,
                framed,
            );
            // What the same answer reads as with the stamps put in its map.
            let mut applied = map_of(&backend);
            stamps.apply(&mut applied);
            let mut expected = Vec::new();
            encode(
                &mut expected,
                StatusCode::OK,
                &applied,
                &Stamps::none(),
                framed,
            );
            let lines = lines_of(&written);
            assert_eq!(lines, lines_of(&expected), "{stamps:?}");
            let value = |name: &str| -> Vec<&str> {
                lines
                    .iter()
                    .filter(|(n, _)| n == name)
                    .map(|(_, v)| v.as_str())
                    .collect()
            };
            let security = bits & 1 != 0;
            assert_eq!(
                value("x-frame-options"),
                [if security { "DENY" } else { "SAMEORIGIN" }]
            );
            assert_eq!(
                value("x-request-id"),
                [if bits & 2 != 0 {
                    id.as_str()
                } else {
                    "from-the-backend"
                }]
            );
            assert_eq!(
                value("ratelimit-reset"),
                [if bits & 4 != 0 { "3" } else { "60" }]
            );
            assert_eq!(value("x-a"), ["1"]);
            assert_eq!(lines.len(), backend.len() + 2, "content-length and date");
        }
    }

    #[test]
    fn answer_heads_carry_the_connections_framing_and_a_date() {
        let v11 = Version::HTTP_11;
        let head = encoded(
            StatusCode::OK,
            &[
                ("content-length", "99"),
                ("transfer-encoding", "chunked"),
                ("connection", "x"),
                ("x-a", "1"),
            ],
            Framed {
                version: v11,
                sending: Sending::Length(5),
                close: false,
            },
        );
        assert!(
            head.starts_with("HTTP/1.1 200 OK\r\nx-a: 1\r\ncontent-length: 5\r\ndate: "),
            "{head}"
        );
        assert!(head.ends_with(" GMT\r\n\r\n"), "{head}");
        assert!(!head.contains("99") && !head.contains("chunked") && !head.contains("connection"));

        let head = encoded(
            StatusCode::NOT_FOUND,
            &[("date", "then")],
            Framed {
                version: Version::HTTP_10,
                sending: Sending::Chunked,
                close: false,
            },
        );
        assert_eq!(
            head,
            "HTTP/1.0 404 Not Found\r\ndate: then\r\ntransfer-encoding: chunked\r\nconnection: keep-alive\r\n\r\n"
        );
        let head = encoded(
            StatusCode::OK,
            &[("content-length", "12"), ("date", "d")],
            Framed {
                version: v11,
                sending: Sending::Bodiless,
                close: true,
            },
        );
        assert_eq!(
            head,
            "HTTP/1.1 200 OK\r\ncontent-length: 12\r\ndate: d\r\nconnection: close\r\n\r\n"
        );
        let head = encoded(
            StatusCode::NO_CONTENT,
            &[("content-length", "0"), ("date", "d")],
            Framed {
                version: v11,
                sending: Sending::Bodiless,
                close: false,
            },
        );
        assert_eq!(head, "HTTP/1.1 204 No Content\r\ndate: d\r\n\r\n");
        let head = encoded(
            StatusCode::SWITCHING_PROTOCOLS,
            &[
                ("connection", "upgrade"),
                ("upgrade", "websocket"),
                ("date", "d"),
            ],
            Framed {
                version: v11,
                sending: Sending::Bodiless,
                close: false,
            },
        );
        assert_eq!(
            head,
            "HTTP/1.1 101 Switching Protocols\r\nconnection: upgrade\r\nupgrade: websocket\r\ndate: d\r\n\r\n"
        );
    }

    #[test]
    fn a_trickled_head_is_searched_once_and_its_end_found_across_reads() {
        let head = b"GET / HTTP/1.1\r\nHost: a\r\n\r\n";
        for cut in 1..head.len() {
            let mut scanned = 0;
            let ended_early = may_end(&head[..cut], &mut scanned);
            assert_eq!(scanned, cut);
            assert!(!ended_early, "{cut}");
            assert!(
                may_end(head, &mut scanned),
                "the end found after a cut at {cut}"
            );
        }
        let mut scanned = 0;
        assert!(may_end(b"GET / HTTP/1.0\n\n", &mut scanned), "bare LF");
        let mut scanned = 0;
        assert!(!may_end(b"GET / HTTP/1.1\r\nHost: a\r\n", &mut scanned));
    }

    #[test]
    fn a_stated_length_is_one_number() {
        let mut h = HeaderMap::new();
        assert_eq!(stated_length(&h), None);
        h.append(header::CONTENT_LENGTH, HeaderValue::from_static("7"));
        assert_eq!(stated_length(&h), Some(7));
        h.append(header::CONTENT_LENGTH, HeaderValue::from_static("8"));
        assert_eq!(stated_length(&h), None);
    }
}
