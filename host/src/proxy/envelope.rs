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

/// An envelope request. Serialized once per attempt (only `deadline_ms` changes).
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
