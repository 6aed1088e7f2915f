//! Phase 2, security headers on every response (CONTRACT §7), replacing a backend's.

use std::sync::OnceLock;

use http::{HeaderMap, HeaderName, HeaderValue, header};

const CSP: &str = "default-src 'none'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'";
const HSTS: &str = "max-age=63072000; includeSubDomains";

/// The security headers, in the order they are written.
const HEADERS: [(HeaderName, &str); 5] = [
    (header::CONTENT_SECURITY_POLICY, CSP),
    (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
    (header::REFERRER_POLICY, "no-referrer"),
    (header::STRICT_TRANSPORT_SECURITY, HSTS),
    (header::X_FRAME_OPTIONS, "DENY"),
];

/// Sets the security headers, replacing whatever a backend sent.
pub fn stamp(headers: &mut HeaderMap) {
    for (name, value) in HEADERS {
        headers.insert(name, HeaderValue::from_static(value));
    }
}

/// The security headers as the lines of an HTTP/1 head (`name: value\r\n` each), made once.
pub fn lines() -> &'static [u8] {
    static LINES: OnceLock<Box<[u8]>> = OnceLock::new();
    LINES.get_or_init(|| {
        let mut lines = Vec::new();
        for (name, value) in HEADERS {
            lines.extend_from_slice(name.as_str().as_bytes());
            lines.extend_from_slice(b": ");
            lines.extend_from_slice(value.as_bytes());
            lines.extend_from_slice(b"\r\n");
        }
        lines.into_boxed_slice()
    })
}
