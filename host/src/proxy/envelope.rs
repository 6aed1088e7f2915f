//! NATS envelope, version 1 (CONTRACT §4): an HTTP request as JSON, and its reply.

use std::borrow::Cow;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue, StatusCode};
use serde::{Deserialize, Serialize};

use crate::actor::Actor;
use crate::error::GatewayError;

/// An envelope request. Encoded once per attempt (only `deadline_ms` changes) by
/// [`EnvelopeRequest::to_json`], which writes what this `Serialize` renders: a field added here
/// or to the actor's serialized fields must be written there too (the byte-for-byte test
/// compares the two).
#[derive(Debug, Serialize)]
pub struct EnvelopeRequest<'a> {
    pub v: u8,
    pub id: &'a str,
    pub plane: &'a str,
    pub method: &'a str,
    pub path: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub query: Option<String>,
    pub headers: super::headers::EnvelopeHeaders<'a>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub body: Option<String>,
    pub actor: &'a Actor,
    pub deadline_ms: u64,
}

impl EnvelopeRequest<'_> {
    /// Encodes a body as standard base64 with padding; `None` when empty.
    pub fn encode_body(body: &[u8]) -> Option<String> {
        (!body.is_empty()).then(|| STANDARD.encode(body))
    }

    /// The envelope as JSON, written directly: the same document as its `Serialize` rendering
    /// (tested byte for byte), without a serializer's per-field and per-byte work. Field names
    /// are constants, and a string is copied whole unless it holds a byte JSON escapes.
    pub fn to_json(&self) -> Vec<u8> {
        // Room for the fields and a typical set of headers; more grows the vector.
        let known = self.path.len()
            + self.query.as_ref().map_or(0, String::len)
            + self.body.as_ref().map_or(0, String::len);
        let mut out = Vec::with_capacity(known + 1024);
        out.extend_from_slice(b"{\"v\":");
        out.extend_from_slice(itoa::Buffer::new().format(self.v).as_bytes());
        out.extend_from_slice(b",\"id\":");
        json::string(&mut out, self.id);
        out.extend_from_slice(b",\"plane\":");
        json::string(&mut out, self.plane);
        out.extend_from_slice(b",\"method\":");
        json::string(&mut out, self.method);
        out.extend_from_slice(b",\"path\":");
        json::string(&mut out, self.path);
        if let Some(query) = &self.query {
            out.extend_from_slice(b",\"query\":");
            json::string(&mut out, query);
        }
        out.extend_from_slice(b",\"headers\":[");
        let mut first = true;
        for (name, value) in self.headers.kept_bytes() {
            json::header(&mut out, &mut first, name, value);
        }
        if let Some(ip) = self.headers.client_ip() {
            json::pair(
                &mut out,
                &mut first,
                "x-forwarded-for",
                super::headers::ip_text(&mut [0; 64], ip),
            );
        }
        out.push(b']');
        if let Some(body) = &self.body {
            out.extend_from_slice(b",\"body\":");
            json::string(&mut out, body);
        }
        let actor = self.actor;
        out.extend_from_slice(b",\"actor\":{\"role\":");
        json::string(&mut out, actor.role.as_str());
        for (name, value) in [
            (&b",\"project\":"[..], &actor.project),
            (b",\"key_id\":", &actor.key_id),
            (b",\"user_id\":", &actor.user_id),
            (b",\"org_role\":", &actor.org_role),
        ] {
            out.extend_from_slice(name);
            match value {
                Some(value) => json::string(&mut out, value),
                None => out.extend_from_slice(b"null"),
            }
        }
        if let Some(ip) = actor.client_ip {
            out.extend_from_slice(b",\"client_ip\":");
            json::string(&mut out, super::headers::ip_text(&mut [0; 64], ip));
        }
        out.extend_from_slice(b"},\"deadline_ms\":");
        out.extend_from_slice(itoa::Buffer::new().format(self.deadline_ms).as_bytes());
        out.push(b'}');
        out
    }
}

/// JSON text as serde_json writes it.
mod json {
    use http::HeaderName;

    pub(super) use crate::json_text::string;
    use crate::json_text::{any_needs_escape, any_needs_escape_or_is_not_ascii};

    /// `["name","value"]`, after a comma unless it is the first.
    pub(super) fn pair(out: &mut Vec<u8>, first: &mut bool, name: &str, value: &str) {
        if !std::mem::take(first) {
            out.push(b',');
        }
        out.push(b'[');
        string(out, name);
        out.push(b',');
        string(out, value);
        out.push(b']');
    }

    /// A header pair: as [`pair`] with the value taken lossily as UTF-8 (what
    /// `String::from_utf8_lossy` makes of it). A header name never needs escaping (it is made
    /// of token characters), and a value of ASCII that needs no escape, the usual one, is
    /// copied as it is, without a pass to check its UTF-8.
    pub(super) fn header(out: &mut Vec<u8>, first: &mut bool, name: &HeaderName, value: &[u8]) {
        let name = name.as_str();
        debug_assert!(!any_needs_escape(name.as_bytes()), "{name}");
        if any_needs_escape_or_is_not_ascii(value) {
            pair(out, first, name, &String::from_utf8_lossy(value));
            return;
        }
        out.reserve(name.len() + value.len() + 8);
        if !std::mem::take(first) {
            out.push(b',');
        }
        out.extend_from_slice(b"[\"");
        out.extend_from_slice(name.as_bytes());
        out.extend_from_slice(b"\",\"");
        out.extend_from_slice(value);
        out.extend_from_slice(b"\"]");
    }
}

/// An envelope reply as received. Its strings are borrowed from the payload, copied only when
/// the JSON escaped something in them.
#[derive(Debug, Deserialize)]
struct RawReply<'a> {
    status: u16,
    #[serde(default, borrow)]
    headers: Option<Vec<(Text<'a>, Text<'a>)>>,
    #[serde(default, borrow)]
    body: Option<Text<'a>>,
}

/// A string of a reply (a newtype: serde borrows a `Cow` only where it is a field's own type).
#[derive(Debug, Deserialize)]
struct Text<'a>(#[serde(borrow)] Cow<'a, str>);

/// A validated reply.
#[derive(Debug)]
pub struct Reply {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Bytes,
}

/// The most headers a reply may carry: as many as an HTTP backend's answer may (hyper's limit).
/// A header map holds at most 32,768 names and panics past that, and a reply of a megabyte can
/// list a hundred thousand pairs.
pub const REPLY_HEADERS_MAX: usize = 100;

/// Parses and validates a reply payload; anything not of the contract's shape is a 502.
pub fn parse_reply(payload: &Bytes) -> Result<Reply, GatewayError> {
    let bad = |why: String| GatewayError::bad_gateway("bad_backend_reply", why);
    let raw: RawReply<'_> = serde_json::from_slice(payload)
        .map_err(|e| bad(format!("the backend reply is not a valid envelope: {e}")))?;
    let status = StatusCode::from_u16(raw.status)
        .ok()
        .filter(|s| (200..=599).contains(&s.as_u16()))
        .ok_or_else(|| {
            bad(format!(
                "the backend reply has an invalid status {}",
                raw.status
            ))
        })?;
    let pairs = raw.headers.unwrap_or_default();
    if pairs.len() > REPLY_HEADERS_MAX {
        return Err(bad(format!(
            "the backend reply has {} headers, more than {REPLY_HEADERS_MAX}",
            pairs.len()
        )));
    }
    let mut headers = HeaderMap::with_capacity(pairs.len() + crate::headers::ANSWER_HEADERS);
    for (Text(name), Text(value)) in pairs {
        let name = HeaderName::from_bytes(name.as_bytes()).map_err(|_| {
            bad(format!(
                "the backend reply has an invalid header name {name:?}"
            ))
        })?;
        let value = header_value(payload, value)
            .ok_or_else(|| bad(format!("the backend reply has an invalid value for {name}")))?;
        if super::headers::is_hop_by_hop(name.as_str()) || name == http::header::CONTENT_LENGTH {
            continue;
        }
        headers.append(name, value);
    }
    let body = match raw.body {
        None => Bytes::new(),
        Some(Text(b)) => Bytes::from(
            STANDARD
                .decode(b.as_bytes())
                .map_err(|e| bad(format!("the backend reply body is not base64: {e}")))?,
        ),
    };
    Ok(Reply {
        status,
        headers,
        body,
    })
}

/// A reply's header value: visible ASCII and tabs only (what `HeaderValue::from_str` takes).
/// A value the JSON did not escape shares the payload's buffer instead of being copied: the
/// payload then lives until the answer's head is written, which is before its body is.
fn header_value(payload: &Bytes, value: Cow<'_, str>) -> Option<HeaderValue> {
    if !value
        .bytes()
        .all(|b| b == b'\t' || (b' '..=b'~').contains(&b))
    {
        return None;
    }
    match value {
        Cow::Borrowed(text) => {
            HeaderValue::from_maybe_shared(payload.slice_ref(text.as_bytes())).ok()
        }
        Cow::Owned(text) => HeaderValue::from_str(&text).ok(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_direct_writer_is_the_serde_rendering_byte_for_byte() {
        // Every control character, quotes, backslashes, DEL, and text beyond ASCII.
        let nasty: String = (0u8..0x20)
            .map(char::from)
            .chain("\"\\/\u{7f}é€𝄞 plain".chars())
            .collect();
        let mut headers = HeaderMap::new();
        headers.append("x-a", HeaderValue::from_static("plain value"));
        headers.append(
            "x-b",
            HeaderValue::from_bytes(b"q\"uo\\te\t\xff\xe9").expect("obs-text"),
        );
        headers.append("x-a", HeaderValue::from_static("second"));
        let actors = {
            let mut bare = Actor::unauthenticated(crate::plane::Plane::Data);
            let mut full = bare.clone();
            full.role = crate::actor::Role::ServiceRole;
            full.project = Some(nasty.clone());
            full.key_id = Some("k\"1".into());
            full.user_id = Some(String::new());
            full.org_role = Some("owner".into());
            full.client_ip = Some("2001:db8::8a2e:370:7334".parse().expect("ip"));
            bare.client_ip = Some(std::net::IpAddr::from([203, 0, 113, 7]));
            [
                Actor::unauthenticated(crate::plane::Plane::Management),
                bare,
                full,
            ]
        };
        for actor in &actors {
            for (query, body) in [
                (None, None),
                (
                    Some(nasty.clone()),
                    EnvelopeRequest::encode_body(b"\x00\x01body"),
                ),
                (Some(String::new()), Some(String::new())),
            ] {
                let request = EnvelopeRequest {
                    v: 1,
                    id: &nasty,
                    plane: "management",
                    method: "PATCH",
                    path: "/v1/db/\"x\"",
                    query,
                    headers: crate::proxy::headers::EnvelopeHeaders::new(&headers, actor),
                    body,
                    actor,
                    deadline_ms: u64::MAX,
                };
                let direct = request.to_json();
                let serde = serde_json::to_vec(&request).expect("encodes");
                assert_eq!(
                    String::from_utf8_lossy(&direct),
                    String::from_utf8_lossy(&serde)
                );
                assert_eq!(direct, serde);
            }
        }
    }

    fn parse(payload: &[u8]) -> Result<Reply, GatewayError> {
        parse_reply(&Bytes::copy_from_slice(payload))
    }

    #[test]
    fn replies_are_validated() {
        let r = parse(br#"{"status":201,"headers":[["x-a","1"]],"body":"AAEC"}"#).expect("valid");
        assert_eq!(r.status, StatusCode::CREATED);
        assert_eq!(&r.body[..], &[0, 1, 2]);
        assert!(parse(b"not json").is_err());
        assert!(parse(br#"{"status":99}"#).is_err());
        assert!(parse(br#"{"status":200,"body":"***"}"#).is_err());
        assert!(parse(br#"{"status":200,"headers":[["bad name","x"]]}"#).is_err());
        assert!(parse(br#"{"headers":[]}"#).is_err());
        let empty = parse(br#"{"status":204}"#).expect("minimal");
        assert!(empty.body.is_empty());
    }

    #[test]
    fn a_reply_with_more_headers_than_an_answer_may_carry_is_refused() {
        let reply = |count: usize| {
            let pairs = vec![r#"["x-a","1"]"#; count].join(",");
            format!(r#"{{"status":200,"headers":[{pairs}]}}"#)
        };
        let at_most = parse(reply(REPLY_HEADERS_MAX).as_bytes()).expect("at the bound");
        assert_eq!(
            at_most.headers.get_all("x-a").iter().count(),
            REPLY_HEADERS_MAX
        );
        for count in [REPLY_HEADERS_MAX + 1, 40_000] {
            let error = parse(reply(count).as_bytes()).expect_err("over the bound");
            assert_eq!(error.code, "bad_backend_reply");
            assert!(
                error.message.contains(&format!("{count} headers")),
                "{}",
                error.message
            );
        }
    }

    #[test]
    fn reply_strings_are_taken_escaped_or_not_and_values_beyond_visible_ascii_refused() {
        let payload = Bytes::from_static(
            br#"{"status":200,"headers":[["x-plain","a b"],["x\u002descaped","say \"hi\"\tnow"],["content-length","9"],["connection","close"]],"body":"AA\/C"}"#,
        );
        let reply = parse_reply(&payload).expect("valid");
        assert_eq!(reply.headers["x-plain"], "a b");
        assert_eq!(reply.headers["x-escaped"], "say \"hi\"\tnow");
        assert_eq!(reply.headers.len(), 2, "framing headers dropped");
        assert_eq!(
            &reply.body[..],
            &[0, 15, 194][..],
            "`\\/` in base64 decodes"
        );
        // A value the JSON did not escape is the payload's own bytes, not a copy.
        let range = payload.as_ptr_range();
        assert!(range.contains(&reply.headers["x-plain"].as_bytes().as_ptr()));
        for value in [
            r#""caf\u00e9""#,
            "\"caf\u{e9}\"",
            r#""a\u0001b""#,
            r#""a\u007fb""#,
            r#""a\nb""#,
        ] {
            let payload = format!(r#"{{"status":200,"headers":[["x-a",{value}]]}}"#);
            let error = parse(payload.as_bytes()).expect_err(value);
            assert_eq!(error.code, "bad_backend_reply", "{value}");
            assert!(
                error.message.contains("invalid value for x-a"),
                "{value}: {}",
                error.message
            );
        }
    }
}
