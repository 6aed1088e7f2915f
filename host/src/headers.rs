//! Header names, header values and credential helpers that the phases, authentication, the
//! policy stages and the transports all use: the request id's name, the room the phases need in
//! an answer, names and values read from a parsed head, removing a family of headers, cheap
//! shared values, and the `apikey` query parameter.

use bytes::Bytes;
use http::header::{InvalidHeaderName, InvalidHeaderValue};
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

/// Names that SDK clients, browsers and backends send on many requests, by length: those `http`
/// does not know, made once and handed out without an allocation (any other unknown name read
/// from a head is copied into a new allocation, lowercased), and the frequent standard ones,
/// found here in fewer steps than `HeaderName::from_bytes` takes to lowercase and match them.
static COMMON_NAMES: [Common; 63] = [
    Common::new("dnt"),
    Common::new("age"),
    Common::new("host"),
    Common::new("date"),
    Common::new("vary"),
    Common::new("etag"),
    Common::new("range"),
    Common::new("apikey"),
    Common::new("prefer"),
    Common::new("accept"),
    Common::new("cookie"),
    Common::new("origin"),
    Common::new("server"),
    Common::new("pragma"),
    Common::new("expect"),
    Common::new("referer"),
    Common::new("upgrade"),
    Common::new("expires"),
    Common::new("location"),
    Common::new("if-match"),
    Common::new("x-api-key"),
    Common::new("x-real-ip"),
    Common::new("sec-ch-ua"),
    Common::new("tracestate"),
    Common::new("connection"),
    Common::new("user-agent"),
    Common::new("set-cookie"),
    Common::new("traceparent"),
    Common::new("x-request-id"),
    Common::new("content-type"),
    Common::new("x-client-info"),
    Common::new("authorization"),
    Common::new("cache-control"),
    Common::new("last-modified"),
    Common::new("if-none-match"),
    Common::new("accept-ranges"),
    Common::new("content-range"),
    Common::new("accept-profile"),
    Common::new("sec-fetch-site"),
    Common::new("sec-fetch-mode"),
    Common::new("sec-fetch-dest"),
    Common::new("content-length"),
    Common::new("x-forwarded-for"),
    Common::new("content-profile"),
    Common::new("accept-encoding"),
    Common::new("accept-language"),
    Common::new("x-frame-options"),
    Common::new("referrer-policy"),
    Common::new("x-forwarded-host"),
    Common::new("sec-ch-ua-mobile"),
    Common::new("content-encoding"),
    Common::new("www-authenticate"),
    Common::new("x-forwarded-proto"),
    Common::new("transfer-encoding"),
    Common::new("if-modified-since"),
    Common::new("sec-websocket-key"),
    Common::new("sec-ch-ua-platform"),
    Common::new("preference-applied"),
    Common::new("content-disposition"),
    Common::new("sec-websocket-accept"),
    Common::new("sec-websocket-version"),
    Common::new("x-content-type-options"),
    Common::new("access-control-max-age"),
];

/// Where the names of each length lie in [`COMMON_NAMES`] (by length, up to the longest).
static COMMON_BY_LENGTH: [(u8, u8); COMMON_LONGEST + 1] = by_length(&COMMON_NAMES);

/// The longest of [`COMMON_NAMES`], which fits in [`Folded`]'s three words.
const COMMON_LONGEST: usize = 22;

/// A name's bytes in three little-endian words, zero past its end.
type Folded = [u64; 3];

/// One of [`COMMON_NAMES`]: the name, its bytes as words, and the bits that tell a letter's
/// case (`0x20` in each letter's byte).
struct Common {
    name: HeaderName,
    len: usize,
    words: Folded,
    case: Folded,
}

impl Common {
    const fn new(name: &'static str) -> Self {
        let bytes = name.as_bytes();
        let mut words = [0u64; 3];
        let mut case = [0u64; 3];
        let mut i = 0;
        while i < bytes.len() {
            words[i / 8] |= (bytes[i] as u64) << (8 * (i % 8));
            if bytes[i].is_ascii_lowercase() {
                case[i / 8] |= 0x20 << (8 * (i % 8));
            }
            i += 1;
        }
        Self {
            name: HeaderName::from_static(name),
            len: bytes.len(),
            words,
            case,
        }
    }

    /// Whether `input` (a name's bytes as words) is this name in any case: a letter's byte
    /// matches either case of the letter, any other byte only itself.
    fn is(&self, input: &Folded) -> bool {
        (input[0] | self.case[0]) == self.words[0]
            && (input[1] | self.case[1]) == self.words[1]
            && (input[2] | self.case[2]) == self.words[2]
    }
}

/// The range of each length in `names`, which are sorted by length.
const fn by_length<const N: usize>(names: &[Common; N]) -> [(u8, u8); COMMON_LONGEST + 1] {
    let mut ranges = [(0u8, 0u8); COMMON_LONGEST + 1];
    let mut i = 0;
    while i < N {
        let len = names[i].len;
        if ranges[len].1 == 0 {
            ranges[len].0 = i as u8;
        }
        ranges[len].1 = i as u8 + 1;
        i += 1;
    }
    ranges
}

/// A header name read from a head: one of [`COMMON_NAMES`] when it is one, in any case (no
/// allocation), else what `HeaderName::from_bytes` makes of it (the other standard names
/// allocate nothing either; unknown ones are checked and copied lowercased).
#[inline]
pub fn name(bytes: &[u8]) -> Result<HeaderName, InvalidHeaderName> {
    if let Some(&(start, end)) = COMMON_BY_LENGTH.get(bytes.len())
        && start < end
    {
        let mut padded = [0u8; 24];
        padded[..bytes.len()].copy_from_slice(bytes);
        let word = |i: usize| {
            let mut w = [0u8; 8];
            w.copy_from_slice(&padded[i * 8..i * 8 + 8]);
            u64::from_le_bytes(w)
        };
        let input = [word(0), word(1), word(2)];
        if let Some(common) = COMMON_NAMES[usize::from(start)..usize::from(end)]
            .iter()
            .find(|common| common.is(&input))
        {
            return Ok(common.name.clone());
        }
    }
    HeaderName::from_bytes(bytes)
}

/// A header value sliced from a head `httparse` accepted. `httparse` admits in a value the
/// bytes `HeaderValue` admits (HTAB, `0x20..=0x7E` and `0x80..=0xFF`; a test in `http1::server`
/// for requests and one in `http1::client` for answers hold the two rules to each other), so an ASCII value is taken without the byte-by-byte check `HeaderValue` would
/// repeat (about 1,400 instructions a request); any other goes through it. Only for bytes
/// `httparse` parsed as a header value.
#[expect(
    unsafe_code,
    reason = "`HeaderValue`'s unchecked constructor is `unsafe`; see the safety comment"
)]
#[inline]
pub fn parsed_value(bytes: Bytes) -> Result<HeaderValue, InvalidHeaderValue> {
    if bytes.is_ascii() {
        // SAFETY: the constructor requires UTF-8, which ASCII is; that every byte is one a
        // header value may hold, `httparse` checked when it parsed the head.
        return Ok(unsafe { HeaderValue::from_maybe_shared_unchecked(bytes) });
    }
    HeaderValue::from_maybe_shared(bytes)
}

/// Heads that carry each byte but CR and LF inside a header value (`x-v: a<byte>z`), after
/// `start` (a request or status line and any headers): the byte, the value and the head.
#[cfg(test)]
pub(crate) fn heads_with_each_value_byte(
    start: &'static [u8],
) -> impl Iterator<Item = (u8, [u8; 3], Vec<u8>)> {
    (0..=u8::MAX)
        .filter(|b| *b != b'\r' && *b != b'\n')
        .map(move |b| {
            let value = [b'a', b, b'z'];
            let mut raw = start.to_vec();
            raw.extend_from_slice(b"x-v: ");
            raw.extend_from_slice(&value);
            raw.extend_from_slice(b"\r\n\r\n");
            (b, value, raw)
        })
}

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
    fn common_names_are_found_in_any_case_and_others_made_as_http_makes_them() {
        let mut seen = 0;
        for (len, &(start, end)) in COMMON_BY_LENGTH.iter().enumerate() {
            for known in COMMON_NAMES[usize::from(start)..usize::from(end)]
                .iter()
                .map(|c| &c.name)
            {
                seen += 1;
                assert_eq!(known.as_str().len(), len, "{known} is under its length");
                assert!(
                    http::HeaderName::from_bytes(known.as_str().as_bytes())
                        .is_ok_and(|n| n.as_str() == known.as_str()),
                    "{known} is a lowercase name"
                );
                for asked in [
                    known.as_str().to_owned(),
                    known.as_str().to_ascii_uppercase(),
                ] {
                    let got = name(asked.as_bytes()).expect("a valid name");
                    assert_eq!(&got, known, "{asked}");
                    assert_eq!(
                        got.as_str().as_ptr(),
                        known.as_str().as_ptr(),
                        "{asked}: handed out, not copied"
                    );
                    assert_eq!(
                        HeaderName::from_bytes(asked.as_bytes()).ok().as_ref(),
                        Some(known),
                        "what http makes of {asked}"
                    );
                }
            }
        }
        assert_eq!(seen, COMMON_NAMES.len(), "each name under its length");
        for raw in [
            &b"Content-Type"[..],
            b"ACCEPT",
            b"X-Other",
            b"apikeys",
            b"apike",
            b"api key",
            b"apikey:",
            b"",
            b"x-api-key\xff",
            b"X-CLIENT-INF0",
            // A byte that is a letter's other case only by its 0x20 bit: never taken for it.
            b"x\x0dapi-key",
            b"x-api\x0dkey",
            b"APIKE\x19",
            b"apike@",
            b"x-api-ke\x00",
            // The same for standard names of the table.
            b"content\x0dtype",
            b"USER\x0dAGENT",
            b"hos\x14",
        ] {
            assert_eq!(
                name(raw).ok(),
                HeaderName::from_bytes(raw).ok(),
                "{:?}",
                String::from_utf8_lossy(raw)
            );
        }
        let mut map = HeaderMap::new();
        map.insert(
            name(b"ApiKey").expect("valid"),
            HeaderValue::from_static("k"),
        );
        map.insert(
            HeaderName::from_bytes(b"x-client-info").expect("valid"),
            HeaderValue::from_static("sdk"),
        );
        assert_eq!(
            map.get("apikey").map(HeaderValue::as_bytes),
            Some(&b"k"[..])
        );
        assert_eq!(
            map.get(name(b"X-Client-Info").expect("valid")),
            Some(&HeaderValue::from_static("sdk")),
            "the same key whichever way it was made"
        );
    }

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
