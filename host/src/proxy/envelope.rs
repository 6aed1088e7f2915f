//! NATS envelope, version 1 (CONTRACT §4): an HTTP request as JSON, and its reply.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue, StatusCode};
use serde::{Deserialize, Serialize};

use crate::actor::Actor;
use crate::error::GatewayError;

/// The raw query without any `apikey` parameter; `None` when nothing is left.
pub fn query_without_apikey(query: Option<&str>) -> Option<String> {
    let query = query?;
    let kept: Vec<&str> = query
        .split('&')
        .filter(|pair| !pair.is_empty())
        .filter(|pair| {
            let key = pair.split('=').next().unwrap_or_default();
            let decoded: String = form_urlencoded_key(key);
            decoded != "apikey"
        })
        .collect();
    (!kept.is_empty()).then(|| kept.join("&"))
}

/// Percent-decodes a query key (`+` as space), lossily.
fn form_urlencoded_key(key: &str) -> String {
    let bytes = key.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < bytes.len() => {
                let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).ok();
                match hex.and_then(|h| u8::from_str_radix(h, 16).ok()) {
                    Some(b) => {
                        out.push(b);
                        i += 2;
                    }
                    None => out.push(b'%'),
                }
            }
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The values of every `apikey` query parameter, percent-decoded.
pub fn apikey_query_values(query: Option<&str>) -> Vec<String> {
    let Some(query) = query else {
        return Vec::new();
    };
    query
        .split('&')
        .filter_map(|pair| {
            let mut parts = pair.splitn(2, '=');
            let key = form_urlencoded_key(parts.next().unwrap_or_default());
            (key == "apikey").then(|| form_urlencoded_key(parts.next().unwrap_or_default()))
        })
        .collect()
}

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
        for (name, value) in self.headers.kept() {
            json::pair(&mut out, &mut first, name, &value);
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
    /// `s` as a JSON string: copied whole when no byte needs escaping, else escaped the way
    /// serde_json escapes (`\"`, `\\`, the short forms of `\b \f \n \r \t`, `\u00xx` for the
    /// other control characters; everything else as it is, UTF-8 included).
    pub(super) fn string(out: &mut Vec<u8>, s: &str) {
        let bytes = s.as_bytes();
        out.push(b'"');
        if !any_needs_escape(bytes) {
            out.extend_from_slice(bytes);
        } else {
            escaped(out, bytes);
        }
        out.push(b'"');
    }

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

    pub(super) fn needs_escape(b: u8) -> bool {
        b < 0x20 || b == b'"' || b == b'\\'
    }

    /// Whether any byte of `bytes` needs escaping, eight bytes at a time: a byte below 0x20,
    /// or equal to `"` or `\\`, sets the high bit of its lane in one of the three masks (the
    /// usual "has a byte less than n" test; a lane above a set one may be set too, which does
    /// not change the answer).
    pub(super) fn any_needs_escape(bytes: &[u8]) -> bool {
        const ONES: u64 = 0x0101_0101_0101_0101;
        const HIGH: u64 = 0x8080_8080_8080_8080;
        let below = |v: u64, n: u64| v.wrapping_sub(ONES * n) & !v & HIGH;
        let mut chunks = bytes.chunks_exact(8);
        for chunk in &mut chunks {
            let v = u64::from_le_bytes(chunk.try_into().expect("eight bytes"));
            let hit = below(v, 0x20)
                | below(v ^ (ONES * u64::from(b'"')), 1)
                | below(v ^ (ONES * u64::from(b'\\')), 1);
            if hit != 0 {
                return true;
            }
        }
        chunks.remainder().iter().any(|&b| needs_escape(b))
    }

    fn escaped(out: &mut Vec<u8>, bytes: &[u8]) {
        const HEX: &[u8; 16] = b"0123456789abcdef";
        let mut start = 0;
        for (i, &b) in bytes.iter().enumerate() {
            if !needs_escape(b) {
                continue;
            }
            out.extend_from_slice(&bytes[start..i]);
            match b {
                b'"' => out.extend_from_slice(b"\\\""),
                b'\\' => out.extend_from_slice(b"\\\\"),
                0x08 => out.extend_from_slice(b"\\b"),
                0x0c => out.extend_from_slice(b"\\f"),
                b'\n' => out.extend_from_slice(b"\\n"),
                b'\r' => out.extend_from_slice(b"\\r"),
                b'\t' => out.extend_from_slice(b"\\t"),
                _ => out.extend_from_slice(&[
                    b'\\',
                    b'u',
                    b'0',
                    b'0',
                    HEX[usize::from(b >> 4)],
                    HEX[usize::from(b & 0xf)],
                ]),
            }
            start = i + 1;
        }
        out.extend_from_slice(&bytes[start..]);
    }
}

/// An envelope reply as received.
#[derive(Debug, Deserialize)]
struct RawReply {
    status: u16,
    #[serde(default)]
    headers: Option<Vec<(String, String)>>,
    #[serde(default)]
    body: Option<String>,
}

/// A validated reply.
#[derive(Debug)]
pub struct Reply {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Bytes,
}

/// Parses and validates a reply payload; anything not of the contract's shape is a 502.
pub fn parse_reply(payload: &[u8]) -> Result<Reply, GatewayError> {
    let bad = |why: String| GatewayError::bad_gateway("bad_backend_reply", why);
    let raw: RawReply = serde_json::from_slice(payload)
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
    let mut headers = HeaderMap::new();
    for (name, value) in raw.headers.unwrap_or_default() {
        let name = HeaderName::from_bytes(name.as_bytes()).map_err(|_| {
            bad(format!(
                "the backend reply has an invalid header name {name:?}"
            ))
        })?;
        let value = HeaderValue::from_str(&value)
            .map_err(|_| bad(format!("the backend reply has an invalid value for {name}")))?;
        if super::headers::is_hop_by_hop(name.as_str()) || name == http::header::CONTENT_LENGTH {
            continue;
        }
        headers.append(name, value);
    }
    let body = match raw.body {
        None => Bytes::new(),
        Some(b) => Bytes::from(
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn apikey_is_removed_from_the_query_and_the_rest_kept_raw() {
        assert_eq!(
            query_without_apikey(Some("a=1&apikey=secret&b=%20x")),
            Some("a=1&b=%20x".to_owned())
        );
        assert_eq!(query_without_apikey(Some("api%6Bey=s")), None);
        assert_eq!(query_without_apikey(Some("apikey=s")), None);
        assert_eq!(query_without_apikey(None), None);
        assert_eq!(apikey_query_values(Some("apikey=a%2Bb&x=1")), vec!["a+b"]);
    }

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

    #[test]
    fn the_eight_byte_escape_scan_agrees_with_the_byte_test_everywhere() {
        for b in 0..=255u8 {
            for at in 0..17 {
                // Around it: bytes that never need escaping, high ones included.
                for filler in [b'a', 0x7f, 0x80, 0xff, b'!', b'#', b'[', b']'] {
                    let mut bytes = [filler; 17];
                    bytes[at] = b;
                    assert_eq!(
                        json::any_needs_escape(&bytes),
                        json::needs_escape(b),
                        "byte {b:#04x} at {at} among {filler:#04x}"
                    );
                }
            }
        }
        assert!(!json::any_needs_escape(b""));
    }

    #[test]
    fn replies_are_validated() {
        let r =
            parse_reply(br#"{"status":201,"headers":[["x-a","1"]],"body":"AAEC"}"#).expect("valid");
        assert_eq!(r.status, StatusCode::CREATED);
        assert_eq!(&r.body[..], &[0, 1, 2]);
        assert!(parse_reply(b"not json").is_err());
        assert!(parse_reply(br#"{"status":99}"#).is_err());
        assert!(parse_reply(br#"{"status":200,"body":"***"}"#).is_err());
        assert!(parse_reply(br#"{"status":200,"headers":[["bad name","x"]]}"#).is_err());
        assert!(parse_reply(br#"{"headers":[]}"#).is_err());
        let empty = parse_reply(br#"{"status":204}"#).expect("minimal");
        assert!(empty.body.is_empty());
    }
}
