//! An OTLP/HTTP trace receiver: `POST /v1/traces` with a protobuf `ExportTraceServiceRequest`,
//! decoded here (the few fields the tests read) and kept.

use std::sync::{Arc, Mutex};

use axum::Router;
use axum::body::Bytes;
use axum::routing::post;

/// One exported span.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExportedSpan {
    /// Hex, 32 digits.
    pub trace_id: String,
    /// Hex, 16 digits.
    pub span_id: String,
    /// Hex, 16 digits; empty for a root span.
    pub parent_span_id: String,
    pub name: String,
}

/// The receiver and what it received.
#[derive(Clone, Default)]
pub struct Receiver {
    spans: Arc<Mutex<Vec<ExportedSpan>>>,
    pub requests: Arc<Mutex<usize>>,
}

impl Receiver {
    /// Serves HTTPS with `tls`; returns the receiver and its endpoint (`https://localhost:…`).
    pub async fn start_tls(tls: Arc<rustls::ServerConfig>) -> (Self, String) {
        let receiver = Self::default();
        let state = receiver.clone();
        let app = Router::new().route(
            "/v1/traces",
            post(move |body: Bytes| {
                let state = state.clone();
                async move {
                    *state.requests.lock().expect("lock") += 1;
                    let spans = decode_export(&body).expect("a valid ExportTraceServiceRequest");
                    state.spans.lock().expect("lock").extend(spans);
                    // An empty ExportTraceServiceResponse.
                    (
                        [("content-type", "application/x-protobuf")],
                        Vec::<u8>::new(),
                    )
                }
            }),
        );
        let port = super::upstream::serve_https(app, tls).await;
        (receiver, format!("https://localhost:{port}"))
    }

    /// Every span received so far.
    pub fn spans(&self) -> Vec<ExportedSpan> {
        self.spans.lock().expect("lock").clone()
    }
}

/// A protobuf field: its number and, for the kinds the tests read, its value.
enum Value<'a> {
    Varint,
    Bytes(&'a [u8]),
    Fixed,
}

fn varint(buf: &mut &[u8]) -> Option<u64> {
    let mut out = 0u64;
    for shift in (0..64).step_by(7) {
        let (&b, rest) = buf.split_first()?;
        *buf = rest;
        out |= u64::from(b & 0x7f) << shift;
        if b & 0x80 == 0 {
            return Some(out);
        }
    }
    None
}

/// The fields of one message, in order.
fn fields(mut buf: &[u8]) -> Option<Vec<(u64, Value<'_>)>> {
    let mut out = Vec::new();
    while !buf.is_empty() {
        let key = varint(&mut buf)?;
        let value = match key & 7 {
            0 => {
                varint(&mut buf)?;
                Value::Varint
            }
            1 => {
                buf = buf.get(8..)?;
                Value::Fixed
            }
            2 => {
                let len = usize::try_from(varint(&mut buf)?).ok()?;
                let (bytes, rest) = (buf.get(..len)?, buf.get(len..)?);
                buf = rest;
                Value::Bytes(bytes)
            }
            5 => {
                buf = buf.get(4..)?;
                Value::Fixed
            }
            _ => return None,
        };
        out.push((key >> 3, value));
    }
    Some(out)
}

fn messages(buf: &[u8], number: u64) -> Option<Vec<&[u8]>> {
    Some(
        fields(buf)?
            .into_iter()
            .filter_map(|(n, v)| match v {
                Value::Bytes(b) if n == number => Some(b),
                _ => None,
            })
            .collect(),
    )
}

/// ExportTraceServiceRequest{1: ResourceSpans{2: ScopeSpans{2: Span{1 trace_id, 2 span_id,
/// 4 parent_span_id, 5 name}}}}.
pub fn decode_export(body: &[u8]) -> Option<Vec<ExportedSpan>> {
    let mut out = Vec::new();
    for resource in messages(body, 1)? {
        for scope in messages(resource, 2)? {
            for span in messages(scope, 2)? {
                let one = |n| {
                    messages(span, n).map(|v| v.first().map(|b| b.to_vec()).unwrap_or_default())
                };
                out.push(ExportedSpan {
                    trace_id: hex::encode(one(1)?),
                    span_id: hex::encode(one(2)?),
                    parent_span_id: hex::encode(one(4)?),
                    name: String::from_utf8(one(5)?).ok()?,
                });
            }
        }
    }
    Some(out)
}
