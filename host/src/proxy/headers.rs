//! The request headers a backend receives, decided in one place for both transports (the NATS
//! envelope and HTTP backends).
//!
//! Removed: hop-by-hop headers and the headers a client lists in `Connection` — except the
//! names the gateway itself sets or vouches for, which `Connection` cannot remove
//! ([`is_gateway_owned`]) —, API key headers, any client `x-aura-*`, the client's own
//! forwarding headers (`X-Forwarded-*`, `X-Real-IP`, `Forwarded`) and `Expect` (answered by
//! the gateway). A name is compared with `_` read as `-`, the way CGI-style backends read it.
//! Added by the gateway: the actor as `x-aura-*` (HTTP backends; NATS backends get the
//! envelope's `actor`), the client IP it computed (`x-forwarded-for` on both,
//! `x-aura-client-ip` on HTTP).

use std::net::IpAddr;

use http::{HeaderMap, HeaderName, HeaderValue, header};

use crate::actor::Actor;

/// The names of the headers that describe one hop, never forwarded (RFC 9110 §7.6.1).
const HOP_BY_HOP_NAMES: [&str; 9] = [
    "connection",
    "keep-alive",
    "proxy-authenticate",
    "proxy-authorization",
    "proxy-connection",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
];

/// [`HOP_BY_HOP_NAMES`] as header names.
pub static HOP_BY_HOP: [HeaderName; 9] = [
    HeaderName::from_static(HOP_BY_HOP_NAMES[0]),
    HeaderName::from_static(HOP_BY_HOP_NAMES[1]),
    HeaderName::from_static(HOP_BY_HOP_NAMES[2]),
    HeaderName::from_static(HOP_BY_HOP_NAMES[3]),
    HeaderName::from_static(HOP_BY_HOP_NAMES[4]),
    HeaderName::from_static(HOP_BY_HOP_NAMES[5]),
    HeaderName::from_static(HOP_BY_HOP_NAMES[6]),
    HeaderName::from_static(HOP_BY_HOP_NAMES[7]),
    HeaderName::from_static(HOP_BY_HOP_NAMES[8]),
];

/// Whether `name` (lower-case) is in [`HOP_BY_HOP`]. Compared as strings: a standard
/// [`HeaderName`]'s `as_str` is a table lookup, too dear to run nine times per header; and
/// only when the first letter is one of theirs.
pub fn is_hop_by_hop(name: &str) -> bool {
    matches!(
        name.as_bytes().first(),
        Some(b'c' | b'k' | b'p' | b't' | b'u')
    ) && HOP_BY_HOP_NAMES.contains(&name)
}

/// The client's own account of where the request came from: replaced by the gateway's (with
/// every other `x-forwarded-*`: a client's `X-Forwarded-Host` or `-Proto` is its own word).
pub const CLIENT_FORWARDING: &[&str] = &["x-forwarded-for", "x-real-ip", "forwarded"];

/// `x-aura-client-ip`.
pub static X_AURA_CLIENT_IP: HeaderName = HeaderName::from_static("x-aura-client-ip");
/// `x-forwarded-for`.
pub static X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");

/// Names the gateway sets or has verified: a client's `Connection` header never removes them.
pub fn is_gateway_owned(name: &str) -> bool {
    matches!(
        name,
        "x-request-id" | "authorization" | "x-forwarded-for" | "content-length" | "host"
    ) || name.starts_with("x-aura-")
}

/// Header names listed in `Connection`, lower-case, without the gateway's own names.
pub fn connection_named(headers: &HeaderMap) -> Vec<String> {
    headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|s| s.trim().to_ascii_lowercase())
        .filter(|s| !s.is_empty() && !is_gateway_owned(s))
        .collect()
}

/// Whether `name` is `canonical` (lower-case, with `-`), reading `_` in `name` as `-`: the
/// spelling WSGI, Rack, CGI and PHP stacks fold into the same variable (`HTTP_X_AURA_ROLE`).
fn eq_folded(name: &[u8], canonical: &[u8]) -> bool {
    name.len() == canonical.len() && starts_with_folded(name, canonical)
}

/// Whether `name` starts with `prefix` (lower-case, with `-`), reading `_` in `name` as `-`.
fn starts_with_folded(name: &[u8], prefix: &[u8]) -> bool {
    name.len() >= prefix.len()
        && name
            .iter()
            .zip(prefix)
            .all(|(n, p)| n == p || (*n == b'_' && *p == b'-'))
}

/// Whether a request header must not reach a backend as the client sent it: hop-by-hop, the
/// client's forwarding headers (`x-forwarded-*`, `x-real-ip`, `forwarded`), the API key
/// headers, any `x-aura-*`, and what `Connection` names. Names are compared with `_` read as
/// `-` (`x_aura_user_id` is dropped like `x-aura-user-id`), and a client's underscore
/// spelling of a name the gateway sets itself (`x_request_id`, `content_length`) is dropped
/// too: backends that fold the two would read the client's value for the gateway's.
pub fn is_dropped(name: &str, connection_named: &[String]) -> bool {
    let bytes = name.as_bytes();
    // Dispatched on the first letter: most names start with none of these, and are then
    // compared with nothing.
    let always = match bytes.first() {
        Some(b'c' | b'k' | b'p' | b't' | b'u') => {
            HOP_BY_HOP_NAMES
                .iter()
                .any(|h| eq_folded(bytes, h.as_bytes()))
                // The gateway's own `content-length`, in a spelling only a client writes.
                || bytes == b"content_length"
        }
        Some(b'x') => {
            starts_with_folded(bytes, b"x-aura-")
                || starts_with_folded(bytes, b"x-forwarded-")
                || eq_folded(bytes, b"x-api-key")
                || eq_folded(bytes, b"x-real-ip")
                // The gateway's own request id, in a spelling only a client writes.
                || bytes == b"x_request_id"
        }
        Some(b'f') => bytes == b"forwarded",
        // The gateway answers `Expect: 100-continue` itself, before it asks for the body: a
        // backend that read it would wait for a body already on its way, or answer `100` late.
        Some(b'e') => bytes == b"expect",
        Some(b'a') => bytes == b"apikey",
        _ => false,
    };
    always || connection_named.iter().any(|c| c == name)
}

/// Removes what [`is_dropped`] names from `headers`, in place.
pub fn drop_client_headers(headers: &mut HeaderMap) {
    let named = connection_named(headers);
    let dropped: Vec<HeaderName> = headers
        .keys()
        .filter(|n| is_dropped(n.as_str(), &named))
        .cloned()
        .collect();
    for name in dropped {
        headers.remove(name);
    }
}

static X_AURA_ROLE: HeaderName = HeaderName::from_static("x-aura-role");
static X_AURA_PROJECT: HeaderName = HeaderName::from_static("x-aura-project");
static X_AURA_USER_ID: HeaderName = HeaderName::from_static("x-aura-user-id");
static X_AURA_ORG_ROLE: HeaderName = HeaderName::from_static("x-aura-org-role");

/// Whether `value` may be sent as a header value as it is (what `HeaderValue::from_str`
/// accepts: no control character but a tab, no DEL).
fn is_header_value(value: &str) -> bool {
    value
        .bytes()
        .all(|b| b == b'\t' || (b >= b' ' && b != 0x7f))
}

/// The headers the gateway adds to a request for an HTTP backend, in the order they are sent:
/// the actor as `x-aura-*` (a value that cannot be a header value is left out), then the client
/// IP it computed as `x-forwarded-for` and `x-aura-client-ip`.
fn each_added(actor: &Actor, mut each: impl FnMut(&'static HeaderName, &[u8])) {
    each(&X_AURA_ROLE, actor.role.as_str().as_bytes());
    for (name, value) in [
        (&X_AURA_PROJECT, &actor.project),
        (&X_AURA_USER_ID, &actor.user_id),
        (&X_AURA_ORG_ROLE, &actor.org_role),
    ] {
        if let Some(v) = value.as_deref().filter(|v| is_header_value(v)) {
            each(name, v.as_bytes());
        }
    }
    if let Some(ip) = actor.client_ip {
        let mut buf = [0; 64];
        let text = ip_bytes(&mut buf, ip);
        each(&X_FORWARDED_FOR, text);
        each(&X_AURA_CLIENT_IP, text);
    }
}

/// A request's headers as an HTTP backend receives them, applied while its head is written
/// (`http1::client`) instead of by rewriting the request's map: the client's headers that are kept,
/// in their order in the map, then the gateway's ([`each_added`]). The same headers as
/// [`for_http_backend`] leaves in a map, without a removal or an insertion in it (each a hash
/// and a probe, about 250 instructions).
#[derive(Debug)]
pub struct HttpBackendHeaders<'a> {
    named: Vec<String>,
    actor: &'a Actor,
}

impl<'a> HttpBackendHeaders<'a> {
    /// The backend's view of a request with `headers` from `actor`.
    pub fn new(headers: &HeaderMap, actor: &'a Actor) -> Self {
        Self {
            named: connection_named(headers),
            actor,
        }
    }

    /// Whether the client's header `name` (lower-case) is sent. `host` never is: the pool
    /// writes its backend's.
    pub fn keeps(&self, name: &str) -> bool {
        name != "host" && !is_dropped(name, &self.named)
    }

    /// Calls `each` with every header the gateway adds, in order.
    pub fn each_added(&self, each: impl FnMut(&'static HeaderName, &[u8])) {
        each_added(self.actor, each);
    }
}

/// The codec writes a forwarded request's head through it: the client's headers it does not
/// keep left out, the gateway's written after the rest.
impl crate::http1::head::HeadEdits for HttpBackendHeaders<'_> {
    fn skips(&self, name: &str) -> bool {
        !self.keeps(name)
    }
    fn write_lines(&self, out: &mut Vec<u8>) {
        self.each_added(|name, value| {
            crate::http1::head::line(out, name.as_str().as_bytes(), value);
        });
    }
}

/// An IP address as text, written into `buf` (an address is at most 45 bytes): IPv4 as its
/// four decimal octets directly, IPv6 through its `Display`.
pub fn ip_text(buf: &mut [u8; 64], ip: IpAddr) -> &str {
    std::str::from_utf8(ip_bytes(buf, ip)).expect("an IP address is ASCII")
}

/// The decimal digits of every octet (left-aligned) and how many there are.
const OCTETS: [([u8; 3], u8); 256] = {
    let mut table = [([0u8; 3], 0u8); 256];
    let mut i = 0;
    while i < 256 {
        let n = i as u8;
        table[i] = if n >= 100 {
            ([b'0' + n / 100, b'0' + n / 10 % 10, b'0' + n % 10], 3)
        } else if n >= 10 {
            ([b'0' + n / 10, b'0' + n % 10, 0], 2)
        } else {
            ([b'0' + n, 0, 0], 1)
        };
        i += 1;
    }
    table
};

/// [`ip_text`]'s bytes, for a head written as bytes.
fn ip_bytes(buf: &mut [u8; 64], ip: IpAddr) -> &[u8] {
    let len = match ip {
        // Most clients: each octet's digits from a table, three bytes copied and the length
        // moved by as many as it has.
        IpAddr::V4(v4) => {
            let mut len = 0;
            for (i, octet) in v4.octets().into_iter().enumerate() {
                if i > 0 {
                    buf[len] = b'.';
                    len += 1;
                }
                let (digits, n) = &OCTETS[usize::from(octet)];
                buf[len..len + 3].copy_from_slice(digits);
                len += usize::from(*n);
            }
            len
        }
        IpAddr::V6(_) => {
            use std::io::Write as _;
            let mut cursor = std::io::Cursor::new(&mut buf[..]);
            let _ = write!(cursor, "{ip}");
            cursor.position() as usize
        }
    };
    &buf[..len]
}

/// Rewrites a request's headers for an HTTP backend in its map: client headers dropped,
/// identity and client IP set (a WebSocket handshake, which hyper's client sends; other
/// requests are written through [`HttpBackendHeaders`]).
pub fn for_http_backend(headers: &mut HeaderMap, actor: &Actor) {
    drop_client_headers(headers);
    headers.remove(header::HOST);
    each_added(actor, |name, value| {
        if let Ok(value) = HeaderValue::from_bytes(value) {
            headers.insert(name.clone(), value);
        }
    });
}

/// The request headers as envelope pairs: lower-case names, order kept, client headers
/// dropped, `x-forwarded-for` set to the client IP. Values that are not UTF-8 are passed
/// lossily. Serialised straight from the request's header map, without copying it.
#[derive(Debug)]
pub struct EnvelopeHeaders<'a> {
    headers: &'a HeaderMap,
    named: Vec<String>,
    client_ip: Option<IpAddr>,
}

impl<'a> EnvelopeHeaders<'a> {
    /// The envelope headers of a request with `headers` from `actor`.
    pub fn new(headers: &'a HeaderMap, actor: &Actor) -> Self {
        Self {
            named: connection_named(headers),
            headers,
            client_ip: actor.client_ip,
        }
    }

    /// The client's headers that are kept, in order, their values as the client sent them.
    pub fn kept_bytes(&self) -> impl Iterator<Item = (&'a HeaderName, &'a [u8])> + '_ {
        self.headers
            .iter()
            .filter(|(name, _)| !is_dropped(name.as_str(), &self.named))
            .map(|(name, value)| (name, value.as_bytes()))
    }

    /// The client's headers that are kept, in order, their values as text (lossily).
    pub fn kept(&self) -> impl Iterator<Item = (&'a str, std::borrow::Cow<'a, str>)> + '_ {
        self.kept_bytes()
            .map(|(name, value)| (name.as_str(), String::from_utf8_lossy(value)))
    }

    /// The client IP sent as `x-forwarded-for` after the kept headers, when known.
    pub fn client_ip(&self) -> Option<IpAddr> {
        self.client_ip
    }

    /// Every pair as it is sent (the kept headers, then the gateway's `x-forwarded-for`).
    pub fn pairs(&self) -> Vec<(String, String)> {
        let mut out: Vec<(String, String)> = self
            .kept()
            .map(|(n, v)| (n.to_owned(), v.into_owned()))
            .collect();
        if let Some(ip) = self.client_ip {
            out.push((X_FORWARDED_FOR.as_str().to_owned(), ip.to_string()));
        }
        out
    }
}

impl serde::Serialize for EnvelopeHeaders<'_> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeSeq;
        let mut seq = serializer.serialize_seq(None)?;
        for pair in self.kept() {
            seq.serialize_element(&pair)?;
        }
        if let Some(ip) = self.client_ip {
            seq.serialize_element(&(X_FORWARDED_FOR.as_str(), ip))?;
        }
        seq.end()
    }
}

/// The request headers as envelope pairs (see [`EnvelopeHeaders`]).
pub fn for_envelope(headers: &HeaderMap, actor: &Actor) -> Vec<(String, String)> {
    EnvelopeHeaders::new(headers, actor).pairs()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plane::Plane;

    fn actor() -> Actor {
        let mut a = Actor::unauthenticated(Plane::Data);
        a.project = Some("alpha".into());
        a.client_ip = Some("203.0.113.7".parse().expect("ip"));
        a
    }

    #[test]
    fn connection_cannot_remove_what_the_gateway_owns() {
        let mut h = HeaderMap::new();
        h.insert(
            "connection",
            HeaderValue::from_static("x-request-id, Authorization, x-hop, x-aura-role"),
        );
        h.insert("x-request-id", HeaderValue::from_static("abc"));
        h.insert("authorization", HeaderValue::from_static("Bearer t"));
        h.insert("x-hop", HeaderValue::from_static("1"));
        for_http_backend(&mut h, &actor());
        assert_eq!(h["x-request-id"], "abc");
        assert_eq!(h["authorization"], "Bearer t");
        assert!(h.get("x-hop").is_none());
        assert!(h.get("connection").is_none());
        assert_eq!(h["x-aura-role"], "anon");
    }

    #[test]
    fn the_client_ip_is_the_gateways() {
        let mut h = HeaderMap::new();
        h.insert("x-forwarded-for", HeaderValue::from_static("6.6.6.6"));
        h.insert("x-real-ip", HeaderValue::from_static("6.6.6.6"));
        h.insert("forwarded", HeaderValue::from_static("for=6.6.6.6"));
        h.insert("x-aura-client-ip", HeaderValue::from_static("6.6.6.6"));
        let pairs = for_envelope(&h, &actor());
        assert_eq!(
            pairs,
            vec![("x-forwarded-for".to_owned(), "203.0.113.7".to_owned())]
        );
        for_http_backend(&mut h, &actor());
        assert_eq!(h["x-forwarded-for"], "203.0.113.7");
        assert_eq!(h["x-aura-client-ip"], "203.0.113.7");
        assert!(h.get("x-real-ip").is_none());
        assert!(h.get("forwarded").is_none());
        assert_eq!(h.get_all("x-forwarded-for").iter().count(), 1);
    }

    #[test]
    fn hop_by_hop_is_the_rfc_9110_list() {
        let names: Vec<&str> = HOP_BY_HOP.iter().map(HeaderName::as_str).collect();
        assert_eq!(names, HOP_BY_HOP_NAMES);
        // The names RFC 9110 §7.6.1 lists; the `proxy-*` credentials and `trailer` describe one
        // hop too.
        let rfc = "connection proxy-connection keep-alive te transfer-encoding upgrade";
        assert!(rfc.split(' ').all(is_hop_by_hop));
        assert!(
            ["proxy-authenticate", "proxy-authorization", "trailer"]
                .into_iter()
                .all(is_hop_by_hop)
        );
        assert_eq!(
            HOP_BY_HOP[0],
            header::CONNECTION,
            "a standard name stays standard"
        );
        assert!(names.iter().all(|n| is_hop_by_hop(n)));
        assert!(!is_hop_by_hop("x-request-id"));
        assert!(!is_hop_by_hop("Connection"), "names are lower-case by then");
    }

    #[test]
    fn ip_values_are_written_as_displayed() {
        for ip in [
            "0.0.0.0",
            "9.10.99.100",
            "203.0.113.7",
            "255.255.255.255",
            "::1",
            "2001:db8::8a2e:370:7334",
            "::ffff:192.0.2.1",
        ] {
            let ip: IpAddr = ip.parse().expect("ip");
            assert_eq!(ip_text(&mut [0; 64], ip), ip.to_string());
        }
        // Every octet in every place, beside the shortest and the longest.
        for o in 0..=255u8 {
            for v4 in [
                [o, 0, 0, 0],
                [255, o, 0, 255],
                [9, 99, o, 100],
                [0, 0, 0, o],
                [o, o, o, o],
            ] {
                let ip = IpAddr::from(v4);
                assert_eq!(ip_text(&mut [0xff; 64], ip), ip.to_string());
            }
        }
    }

    #[test]
    fn an_identity_value_is_sent_exactly_when_it_is_a_header_value() {
        for b in 0..=u8::MAX {
            let bytes = [b'a', b, b'z'];
            let Ok(text) = std::str::from_utf8(&bytes) else {
                continue;
            };
            assert_eq!(
                is_header_value(text),
                HeaderValue::from_str(text).is_ok(),
                "byte {b:#04x}"
            );
        }
        assert!(is_header_value("ünïcode"));
        assert_eq!(
            is_header_value("ünïcode"),
            HeaderValue::from_str("ünïcode").is_ok()
        );
        let mut a = actor();
        a.user_id = Some("evil\r\nx-aura-role: service_role".into());
        a.org_role = Some("owner".into());
        let mut sent = Vec::new();
        each_added(&a, |name, value| {
            sent.push((name.as_str(), String::from_utf8_lossy(value).into_owned()));
        });
        let sent: Vec<(&str, &str)> = sent.iter().map(|(n, v)| (*n, v.as_str())).collect();
        assert_eq!(
            sent,
            [
                ("x-aura-role", "anon"),
                ("x-aura-project", "alpha"),
                ("x-aura-org-role", "owner"),
                ("x-forwarded-for", "203.0.113.7"),
                ("x-aura-client-ip", "203.0.113.7"),
            ]
        );
    }

    /// The names [`is_dropped`] drops, said plainly: what its first-letter dispatch must agree
    /// with.
    fn dropped_by_definition(name: &str, named: &[String]) -> bool {
        let folded = name.replace('_', "-");
        let folded = folded.as_str();
        HOP_BY_HOP_NAMES.contains(&folded)
            || CLIENT_FORWARDING.contains(&folded)
            || folded == "apikey"
            || name == "expect"
            || folded == "x-api-key"
            || folded.starts_with("x-aura-")
            || folded.starts_with("x-forwarded-")
            // The gateway's own names, in a client's underscore spelling.
            || (name.contains('_') && is_gateway_owned(folded))
            || named.iter().any(|c| c == name)
    }

    #[test]
    fn the_first_letter_dispatch_drops_exactly_the_defined_names() {
        let named = ["x-hop".to_owned(), "accept".to_owned()];
        let mut names: Vec<String> = HOP_BY_HOP_NAMES
            .iter()
            .chain(CLIENT_FORWARDING)
            .chain(&[
                "apikey",
                "x-api-key",
                "x-aura-",
                "x-aura-role",
                "x-aura",
                "x-aurora",
                "x-hop",
                "accept",
                "authorization",
                "content-type",
                "cookie",
                "forwarded-x",
                "a",
                "x",
                "",
                "user-agent",
                "x-request-id",
                "te-x",
                "apikey2",
                "host",
                "origin",
                "expect",
                "expected",
            ])
            .map(|n| n.to_string())
            .collect();
        // Each name in its underscore spelling too, and a few backends fold more.
        for name in names.clone() {
            names.push(name.replace('-', "_"));
        }
        names.extend(
            [
                "x_forwarded_host",
                "x-forwarded-proto",
                "x-forwarded_port",
                "x_aura_user_id",
                "x_aura_role",
                "x_aura_org_role",
                "x_request_id",
                "content_length",
                "transfer_encoding",
                "x_custom_header",
                "user_agent",
            ]
            .map(String::from),
        );
        // Each listed name with a letter more, a letter fewer, and its first letter changed.
        for name in names.clone() {
            names.push(format!("{name}s"));
            if let Some(shorter) = name.get(..name.len().saturating_sub(1)) {
                names.push(shorter.to_owned());
            }
            if let Some(rest) = name.get(1..) {
                names.push(format!("q{rest}"));
            }
        }
        for name in &names {
            for named in [&named[..], &[]] {
                assert_eq!(
                    is_dropped(name, named),
                    dropped_by_definition(name, named),
                    "{name:?} with {named:?}"
                );
            }
        }
        assert!(names.iter().filter(|n| is_dropped(n, &[])).count() > 15);
    }

    #[test]
    fn stripped_headers() {
        let named = vec!["x-hop".to_owned()];
        for h in [
            "apikey",
            "x-api-key",
            "x-aura-role",
            "connection",
            "x-hop",
            "upgrade",
            "x-real-ip",
            "expect",
        ] {
            assert!(is_dropped(h, &named), "{h}");
        }
        assert!(!is_dropped("authorization", &named));
    }

    #[test]
    fn underscore_spellings_of_the_gateways_headers_are_dropped() {
        for h in [
            "x_aura_user_id",
            "x_aura_role",
            "x_aura_org_role",
            "x-aura_project",
            "x_forwarded_for",
            "x_forwarded_host",
            "x-forwarded-proto",
            "x_real_ip",
            "x_api_key",
            "x_request_id",
            "content_length",
            "transfer_encoding",
            "proxy_connection",
        ] {
            assert!(is_dropped(h, &[]), "{h}");
        }
        // The gateway's own spelling of what it sets is kept; other underscores pass.
        for h in [
            "x-request-id",
            "content-length",
            "x_custom",
            "user_agent",
            "my_header",
        ] {
            assert!(!is_dropped(h, &[]), "{h}");
        }
    }
}
