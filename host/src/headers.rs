//! Header names, header values and credential helpers that the phases, authentication, the
//! policy stages and the transports all use: the request id's name, the room the phases need in
//! an answer, removing a family of headers, cheap shared values, and the `apikey` query
//! parameter.

use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue};

/// `x-request-id`.
pub static X_REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");

/// How many headers the phases may add to a backend's answer on its way back: the request id,
/// three `RateLimit-*`, five security headers and three CORS headers. A proxy makes room for
/// them once.
pub const ANSWER_HEADERS: usize = 12;

/// How many headers the phases may add to a request on its way to its backend: `traceparent`
/// and `tracestate`, the request id, four `x-aura-*` identity headers, `x-forwarded-for` and
/// `x-aura-client-ip`. A request's header map is made with room for them, so that it does not
/// grow (and hash every header again) half-way through the chain.
pub const REQUEST_HEADERS: usize = 9;

/// Removes every header whose name starts with `prefix`. Such headers are rare: they are looked
/// for before any name is collected, by their first letter before the rest.
pub fn remove_prefixed(headers: &mut HeaderMap, prefix: &str) {
    let first = prefix.as_bytes().first();
    if !prefix.is_empty()
        && !headers.keys().any(|n| {
            let n = n.as_str();
            n.as_bytes().first() == first && n.starts_with(prefix)
        })
    {
        return;
    }
    let names: Vec<HeaderName> = headers
        .keys()
        .filter(|n| n.as_str().starts_with(prefix))
        .cloned()
        .collect();
    for name in names {
        headers.remove(name);
    }
}

/// A header value of at most `N` bytes that is cloned without an allocation: its bytes are
/// written once into a reference-counted block. A value made from a vector (`from_bytes`,
/// `from_str`) is copied once more into such a block the first time it is cloned. `None` when
/// `bytes` is longer than `N` or not a valid header value.
pub fn shared_value<const N: usize>(bytes: &[u8]) -> Option<HeaderValue> {
    struct Inline<const N: usize> {
        bytes: [u8; N],
        len: usize,
    }
    impl<const N: usize> AsRef<[u8]> for Inline<N> {
        fn as_ref(&self) -> &[u8] {
            &self.bytes[..self.len]
        }
    }
    let mut inline = Inline {
        bytes: [0; N],
        len: bytes.len(),
    };
    inline.bytes.get_mut(..bytes.len())?.copy_from_slice(bytes);
    HeaderValue::from_maybe_shared(Bytes::from_owner(inline)).ok()
}

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
    fn remove_prefixed_removes_every_value_of_every_matching_name() {
        let mut h: HeaderMap = [
            ("x-aura-role", "service_role"),
            ("x-aura-role", "anon"),
            ("x-aura-project", "other"),
            ("x-aurora", "kept"),
        ]
        .into_iter()
        .map(|(n, v)| (HeaderName::from_static(n), HeaderValue::from_static(v)))
        .collect();
        assert_eq!(h.len(), 4);
        remove_prefixed(&mut h, "x-aura-");
        assert_eq!(h.len(), 1);
        assert_eq!(h["x-aurora"], "kept");
        remove_prefixed(&mut h, "x-aura-");
        assert_eq!(h.len(), 1);
    }

    #[test]
    fn a_shared_value_is_checked_and_bounded() {
        let value = shared_value::<8>(b"12345678").expect("fits");
        assert_eq!(value, "12345678");
        assert_eq!(value.clone(), value);
        assert_eq!(shared_value::<8>(b""), Some(HeaderValue::from_static("")));
        assert_eq!(
            shared_value::<8>(b"123456789"),
            None,
            "longer than its block"
        );
        assert_eq!(shared_value::<8>(b"a\r\nb"), None, "not a header value");
    }
}
