//! Phase 4, the request's tracing span: everything that does work runs inside it. The request id
//! is recorded into it by phase 7.
//!
//! W3C trace context: a `traceparent` (and its `tracestate`) is believed only from a peer in
//! `rate_limit.trusted_proxies`; the request span then continues that trace (its parent is the
//! caller's span). From anyone else it is dropped and a new trace starts. Either way the request
//! reaches its backend (HTTP header or NATS envelope header) with the gateway's own
//! `traceparent`: the trace id, and the request span as the parent. With trace export off, the
//! ids are minted here, so backends still see one trace per request.

use axum::extract::Request;
use http::{HeaderName, HeaderValue};
use opentelemetry::trace::{
    SpanContext, SpanId, TraceContextExt as _, TraceFlags, TraceId, TraceState,
};
use tracing::Span;
use tracing_opentelemetry::OpenTelemetrySpanExt as _;

use crate::plane::Plane;

/// `traceparent`.
pub static TRACEPARENT: HeaderName = HeaderName::from_static("traceparent");
/// `tracestate`.
pub static TRACESTATE: HeaderName = HeaderName::from_static("tracestate");

/// The `request` span: plane, method, path and an empty `request_id`; made only when spans are
/// exported (the log names a line's request without it: [`crate::telemetry::scope`]).
pub fn span(plane: Plane, request: &Request) -> Span {
    if !crate::telemetry::exporting() {
        return Span::none();
    }
    tracing::info_span!(
        "request",
        plane = plane.as_str(),
        method = %request.method(),
        path = %request.uri().path(),
        request_id = tracing::field::Empty,
    )
}

/// A `traceparent` value: version `00`, trace id, parent span id, flags (W3C Trace Context §3.2).
pub fn parse_traceparent(value: &[u8]) -> Option<SpanContext> {
    // 2 + 1 + 32 + 1 + 16 + 1 + 2; a future version may append fields after a dash.
    if value.len() < 55 || (value.len() > 55 && value[55] != b'-') {
        return None;
    }
    let text = std::str::from_utf8(&value[..55]).ok()?;
    let mut parts = text.split('-');
    let (version, trace, parent, flags) =
        (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
    let lower_hex = |s: &str| {
        s.bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    };
    if ![version, trace, parent, flags].iter().all(|p| lower_hex(p))
        || version == "ff"
        || (version == "00" && value.len() != 55)
    {
        return None;
    }
    let trace_id = TraceId::from_hex(trace).ok()?;
    let span_id = SpanId::from_hex(parent).ok()?;
    if trace_id == TraceId::INVALID || span_id == SpanId::INVALID {
        return None;
    }
    let flags = u8::from_str_radix(flags, 16).ok()?;
    Some(SpanContext::new(
        trace_id,
        span_id,
        TraceFlags::new(flags) & TraceFlags::SAMPLED,
        true,
        TraceState::NONE,
    ))
}

/// Each byte's two lower-case hex digits.
const HEX_PAIRS: [[u8; 2]; 256] = {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut pairs = [[0; 2]; 256];
    let mut byte = 0;
    while byte < 256 {
        pairs[byte] = [HEX[byte >> 4], HEX[byte & 0x0f]];
        byte += 1;
    }
    pairs
};

/// Writes `bytes` as lower-case hex into `out`, two digits a byte, one table lookup each.
fn hex_into(out: &mut [u8], bytes: &[u8]) {
    for (digits, &byte) in out.chunks_exact_mut(2).zip(bytes) {
        digits.copy_from_slice(&HEX_PAIRS[usize::from(byte)]);
    }
}

/// A version-`00` `traceparent` value, written on the stack (lower-case hex, no formatter).
pub fn traceparent(trace_id: TraceId, span_id: SpanId, sampled: bool) -> [u8; 55] {
    let mut value = *b"00-00000000000000000000000000000000-0000000000000000-00";
    // The trace id's 32 digits start at 3, the span id's 16 at 36.
    hex_into(&mut value[3..35], &trace_id.to_bytes());
    hex_into(&mut value[36..52], &span_id.to_bytes());
    if sampled {
        value[54] = b'1';
    }
    value
}

/// Links the request span to a trusted caller's trace, and sets the `traceparent` the backends
/// receive (the request span as their parent). `trusted` says whether the TCP peer is a
/// trusted proxy.
pub fn propagate(span: &Span, request: &mut Request, trusted: bool) {
    let headers = request.headers_mut();
    let caller = trusted
        .then(|| headers.get(&TRACEPARENT))
        .flatten()
        .and_then(|v| parse_traceparent(v.as_bytes()));
    let tracestate = caller
        .as_ref()
        .and_then(|_| headers.get(&TRACESTATE))
        .filter(|v| v.len() <= 512)
        .cloned();
    // A client's `traceparent` is replaced below (`insert` drops every value of a name).
    headers.remove(&TRACESTATE);
    if let Some(caller) = &caller {
        let parent = opentelemetry::Context::new().with_remote_span_context(caller.clone());
        let _ = span.set_parent(parent);
    }
    // With trace export on, the exported span's ids; otherwise ids minted here.
    let exported = span.context().span().span_context().clone();
    let (trace_id, span_id, sampled) = if exported.is_valid() {
        (
            exported.trace_id(),
            exported.span_id(),
            exported.trace_flags().is_sampled(),
        )
    } else {
        let random = uuid::Uuid::new_v4().as_u128();
        let trace_id = caller
            .as_ref()
            .map_or(TraceId::from(random), |c| c.trace_id());
        let span_id = SpanId::from(((random >> 64) as u64 ^ random as u64).max(1));
        let sampled = caller.as_ref().is_none_or(|c| c.trace_flags().is_sampled());
        (trace_id, span_id, sampled)
    };
    let value = HeaderValue::from_bytes(&traceparent(trace_id, span_id, sampled))
        .expect("hex digits and dashes are a header value");
    headers.insert(TRACEPARENT.clone(), value);
    if let Some(state) = tracestate {
        headers.insert(TRACESTATE.clone(), state);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn traceparent_is_parsed_strictly() {
        let ok = b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let cx = parse_traceparent(ok).expect("valid");
        assert_eq!(
            cx.trace_id().to_string(),
            "4bf92f3577b34da6a3ce929d0e0e4736"
        );
        assert!(cx.trace_flags().is_sampled());
        for bad in [
            &b"00-00000000000000000000000000000000-00f067aa0ba902b7-01"[..],
            b"00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            b"ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            b"00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
            b"00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01",
            b"garbage",
        ] {
            assert!(
                parse_traceparent(bad).is_none(),
                "{:?}",
                std::str::from_utf8(bad)
            );
        }
        // A later version may carry more fields.
        assert!(
            parse_traceparent(b"01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-xyz")
                .is_some()
        );
    }

    fn request(traceparent: Option<&'static str>) -> Request {
        let mut r = Request::new(axum::body::Body::empty());
        if let Some(tp) = traceparent {
            r.headers_mut()
                .insert(TRACEPARENT.clone(), HeaderValue::from_static(tp));
            r.headers_mut()
                .insert(TRACESTATE.clone(), HeaderValue::from_static("vendor=1"));
        }
        r
    }

    const CLIENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn traceparent_is_written_as_the_formatter_would() {
        for (trace, span, sampled) in [
            (
                0x4bf92f3577b34da6a3ce929d0e0e4736_u128,
                0x00f067aa0ba902b7_u64,
                true,
            ),
            (1, u64::MAX, false),
            (u128::MAX, 1, true),
        ] {
            let (trace, span) = (TraceId::from(trace), SpanId::from(span));
            let expected = format!("00-{trace}-{span}-{}", if sampled { "01" } else { "00" });
            let written = traceparent(trace, span, sampled);
            assert_eq!(std::str::from_utf8(&written).expect("ascii"), expected);
            assert!(parse_traceparent(&written).is_some());
        }
    }

    #[test]
    fn a_trusted_callers_trace_continues_with_the_gateway_as_parent() {
        let mut r = request(Some(CLIENT));
        propagate(&Span::none(), &mut r, true);
        let sent = r.headers()[&TRACEPARENT].to_str().expect("ascii");
        let cx = parse_traceparent(sent.as_bytes()).expect("valid");
        assert_eq!(
            cx.trace_id().to_string(),
            "4bf92f3577b34da6a3ce929d0e0e4736"
        );
        assert_ne!(cx.span_id().to_string(), "00f067aa0ba902b7");
        assert_eq!(r.headers()[&TRACESTATE], "vendor=1");
    }

    #[test]
    fn an_untrusted_callers_trace_is_replaced() {
        let mut r = request(Some(CLIENT));
        propagate(&Span::none(), &mut r, false);
        let sent = r.headers()[&TRACEPARENT].to_str().expect("ascii");
        let cx = parse_traceparent(sent.as_bytes()).expect("valid");
        assert_ne!(
            cx.trace_id().to_string(),
            "4bf92f3577b34da6a3ce929d0e0e4736"
        );
        assert!(r.headers().get(&TRACESTATE).is_none());
        // Without a caller, a new trace too, and a different one each time.
        let mut other = request(None);
        propagate(&Span::none(), &mut other, false);
        assert_ne!(other.headers()[&TRACEPARENT], r.headers()[&TRACEPARENT]);
        // Every value a client sent is replaced by the gateway's one, trusted or not.
        for trusted in [false, true] {
            let mut twice = request(Some(CLIENT));
            twice
                .headers_mut()
                .append(TRACEPARENT.clone(), HeaderValue::from_static("forged"));
            propagate(&Span::none(), &mut twice, trusted);
            let sent: Vec<_> = twice.headers().get_all(&TRACEPARENT).iter().collect();
            assert_eq!(sent.len(), 1, "trusted: {trusted}");
            assert_ne!(sent[0], CLIENT);
        }
    }
}
