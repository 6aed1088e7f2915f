//! Fuzz bodies: what each `cargo fuzz` target (`tests/fuzz`) checks for one input.
//!
//! Each function takes raw bytes, drives one parser or decision that sees untrusted input, and
//! panics when an invariant breaks. The fuzz targets call them; the saved corpus
//! (`tests/fuzz/corpus/<target>/`) is replayed through them by the normal test run. Inputs
//! with several fields separate them with NUL bytes.

use std::net::IpAddr;
use std::sync::OnceLock;
use std::time::Duration;

use bytes::BytesMut;
use http::{HeaderMap, HeaderName, HeaderValue};

use crate::actor::Actor;
use crate::auth::jwt::{JwtVerifier, MAX_TOKEN_LEN};
use crate::config::JwtConfig;
use crate::http1::body::Framing;
use crate::plane::Plane;
use crate::proxy::envelope::{self, EnvelopeRequest};
use crate::proxy::headers;

/// A fuzz body: one input, a panic when an invariant breaks.
pub type FuzzBody = fn(&[u8]);

/// The fuzz targets, by name (the directory names under `tests/fuzz/corpus`).
pub const TARGETS: &[(&str, FuzzBody)] = &[
    ("envelope", envelope),
    ("api_key", api_key),
    ("jwt", jwt),
    ("forwarded_for", forwarded_for),
    ("db_routing", db_routing),
    ("path", path),
    ("request_head", request_head),
    ("answer_head", answer_head),
    ("chunked", chunked),
];

/// Splits an input into at most `n` NUL-separated text fields (lossy UTF-8).
fn fields(data: &[u8], n: usize) -> Vec<String> {
    let mut out: Vec<String> = data
        .splitn(n, |b| *b == 0)
        .map(|f| String::from_utf8_lossy(f).into_owned())
        .collect();
    out.resize(n, String::new());
    out
}

/// Headers from `name:value` lines; lines that are not a valid header are skipped.
fn header_map(text: &str) -> HeaderMap {
    let mut headers = HeaderMap::new();
    for line in text.split('\n') {
        let Some((name, value)) = line.split_once(':') else {
            continue;
        };
        if let (Ok(name), Ok(value)) = (
            HeaderName::from_bytes(name.trim().as_bytes()),
            HeaderValue::from_str(value.trim()),
        ) {
            headers.append(name, value);
        }
    }
    headers
}

/// The envelope decoder on arbitrary reply bytes, and the encoder on arbitrary request parts:
/// a decoded reply has a valid status and no framing headers; an encoded request is JSON whose
/// body decodes back to the same bytes, whose headers keep no stripped name, and which is the
/// serde rendering byte for byte.
pub fn envelope(data: &[u8]) {
    if let Ok(reply) = envelope::parse_reply(&bytes::Bytes::copy_from_slice(data)) {
        let status = reply.status.as_u16();
        assert!((200..=599).contains(&status), "status {status} accepted");
        for name in ["content-length", "transfer-encoding", "connection"] {
            assert!(
                !reply.headers.contains_key(name),
                "{name} kept from a reply"
            );
        }
    }
    let f = fields(data, 5);
    let headers = header_map(&f[3]);
    let mut actor = Actor::unauthenticated(Plane::Data);
    actor.client_ip = Some(IpAddr::from([192, 0, 2, 1]));
    let sent = headers::EnvelopeHeaders::new(&headers, &actor);
    let pairs = sent.pairs();
    let named = headers::connection_named(&headers);
    for (name, value) in &pairs {
        assert!(
            !headers::is_dropped(name, &named)
                || (name == "x-forwarded-for" && value == "192.0.2.1"),
            "stripped header {name} encoded"
        );
        assert!(
            name != "apikey" && name != "x-api-key" && !name.starts_with("x-aura-"),
            "credential or identity header {name} encoded"
        );
    }
    assert_eq!(
        pairs.iter().filter(|(n, _)| n == "x-forwarded-for").count(),
        1,
        "one x-forwarded-for, the gateway's"
    );
    let query = crate::headers::query_without_apikey(Some(f[2].as_str()).filter(|q| !q.is_empty()));
    if let Some(q) = &query {
        assert!(
            crate::headers::apikey_query_values(Some(q)).is_empty(),
            "apikey left in the query {q:?}"
        );
    }
    let body = f[4].as_bytes();
    let request = EnvelopeRequest {
        v: 1,
        id: "fuzz",
        plane: "data",
        method: &f[0],
        path: &f[1],
        query,
        headers: sent,
        body: EnvelopeRequest::encode_body(body),
        actor: &actor,
        deadline_ms: 1,
    };
    let bytes = request.to_json();
    assert_eq!(
        bytes,
        serde_json::to_vec(&request).expect("an envelope always encodes"),
        "the direct writer and serde disagree"
    );
    let back: serde_json::Value = serde_json::from_slice(&bytes).expect("an envelope is JSON");
    assert_eq!(back["path"].as_str(), Some(f[1].as_str()));
    let decoded = match back["body"].as_str() {
        None => Vec::new(),
        Some(b) => {
            use base64::Engine as _;
            base64::engine::general_purpose::STANDARD
                .decode(b)
                .expect("the body is base64")
        }
    };
    assert_eq!(decoded, body, "the body does not round-trip");
}

/// The default `api-key` policy on arbitrary paths, query values and headers: a key it
/// returns is one of the inputs, a query key only where the policy allows one and never for
/// a secret role.
pub fn api_key(data: &[u8]) {
    use aura_plugin_api_key::policy::{Decision, Policy, Role, Source};
    static POLICY: OnceLock<Policy> = OnceLock::new();
    let policy = POLICY.get_or_init(|| Policy::configure("{}").expect("default config"));
    let f = fields(data, 3);
    let query: Vec<String> = crate::headers::apikey_query_values(Some(&f[1]));
    let headers: Vec<(String, String)> = f[2]
        .split('\n')
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.to_owned()))
        .collect();
    match policy.extract(&f[0], &query, &headers) {
        Decision::Present {
            key,
            source,
            allowed_roles,
        } => {
            assert!(!key.is_empty(), "an empty key was extracted");
            match source {
                Source::Header => assert!(
                    headers
                        .iter()
                        .any(|(n, v)| policy.headers().contains(n) && v.trim() == key),
                    "header key {key:?} is not among the configured headers"
                ),
                Source::Query => {
                    assert!(
                        query.iter().any(|v| v.trim() == key),
                        "query key {key:?} is not in the query"
                    );
                    assert_eq!(
                        allowed_roles,
                        vec![Role::Anon],
                        "a URL key may only be anon"
                    );
                }
            }
        }
        Decision::Absent => assert!(
            !headers
                .iter()
                .any(|(n, v)| policy.headers().contains(n) && !v.trim().is_empty()),
            "a configured header held a key, yet none was found"
        ),
        Decision::Refuse(_) => {}
    }
}

const FUZZ_SECRET: &str = "fuzz-user-jwt-secret-0123456789abcdef";

/// The user JWT verifier: arbitrary token text is never accepted, and arbitrary claims signed
/// with the right key are accepted only when `aud` is exactly `authenticated`, `sub` a
/// non-empty string, `exp` a number not past, and `ref` absent, null or a string.
pub fn jwt(data: &[u8]) {
    static VERIFIER: OnceLock<(JwtVerifier, tokio::runtime::Runtime)> = OnceLock::new();
    let (verifier, runtime) = VERIFIER.get_or_init(|| {
        let config = JwtConfig {
            hs256_secret: Some(FUZZ_SECRET.to_owned()),
            ..JwtConfig::default()
        };
        (
            JwtVerifier::new(
                &config,
                "authenticated",
                Duration::from_secs(5),
                &crate::dns::Resolver::system(),
            )
            .expect("verifier"),
            tokio::runtime::Builder::new_current_thread()
                .build()
                .expect("runtime"),
        )
    });
    let text = String::from_utf8_lossy(data);
    assert!(
        runtime.block_on(verifier.verify(&text)).is_err(),
        "an unsigned token was accepted"
    );
    // The same bytes as a claims object, properly signed.
    let Ok(claims) = serde_json::from_slice::<serde_json::Value>(data) else {
        return;
    };
    let Ok(key) = jsonwebtoken::EncodingKey::from_secret(FUZZ_SECRET.as_bytes()) else {
        return;
    };
    let Ok(token) = jsonwebtoken::encode(&jsonwebtoken::Header::default(), &claims, &key) else {
        return;
    };
    let verdict = runtime.block_on(verifier.verify(&token));
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let aud_ok = match claims.get("aud") {
        Some(serde_json::Value::String(a)) => a == "authenticated",
        Some(serde_json::Value::Array(list)) => {
            !list.is_empty() && list.iter().all(|a| a.as_str() == Some("authenticated"))
        }
        _ => false,
    };
    let sub_ok = claims
        .get("sub")
        .and_then(|s| s.as_str())
        .is_some_and(|s| !s.is_empty());
    let exp_ok = claims
        .get("exp")
        .and_then(serde_json::Value::as_f64)
        .is_some_and(|e| e + 5.0 >= now as f64);
    let ref_ok = matches!(
        claims.get("ref"),
        None | Some(serde_json::Value::Null) | Some(serde_json::Value::String(_))
    );
    if let Ok(v) = verdict {
        assert!(
            token.len() <= MAX_TOKEN_LEN && aud_ok && sub_ok && exp_ok && ref_ok,
            "accepted claims {claims} as {v:?}"
        );
    }
}

/// The client address behind trusted proxies: always the peer, or an address written in the
/// `X-Forwarded-For` headers, and always the peer when the peer is not a trusted proxy.
pub fn forwarded_for(data: &[u8]) {
    use crate::ratelimit::client_ip::client_ip;
    static TRUSTED: OnceLock<Vec<ipnet::IpNet>> = OnceLock::new();
    let trusted = TRUSTED.get_or_init(|| {
        ["127.0.0.0/8", "10.0.0.0/8", "::1/128"]
            .iter()
            .map(|n| n.parse().expect("net"))
            .collect()
    });
    let f = fields(data, 2);
    let mut headers = HeaderMap::new();
    for value in f[1].split('\n') {
        if let Ok(v) = HeaderValue::from_str(value) {
            headers.append("x-forwarded-for", v);
        }
    }
    let peer: IpAddr = f[0].trim().parse().unwrap_or(IpAddr::from([127, 0, 0, 1]));
    let ip = client_ip(peer, &headers, trusted);
    let canonical = |ip: IpAddr| match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map(IpAddr::V4).unwrap_or(ip),
        v4 => v4,
    };
    let peer = canonical(peer);
    if !trusted.iter().any(|n| n.contains(&peer)) {
        assert_eq!(ip, peer, "an untrusted peer chose its own address");
        return;
    }
    let written = headers
        .get_all("x-forwarded-for")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|h| h.trim().parse::<IpAddr>().ok())
        .map(canonical)
        .any(|h| h == ip);
    assert!(
        ip == peer || written,
        "{ip} was neither the peer nor forwarded"
    );
}

/// The default `db-routing` decision: a PostgREST target only for a dedicated Postgres
/// project with that URL, a replica only of that project and only for a read, never for
/// management paths or `PUT`, and never a fallback.
pub fn db_routing(data: &[u8]) {
    use aura_plugin_db_routing::policy::{Engine, Policy, Project, Replica, Route, Topology};
    static POLICY: OnceLock<Policy> = OnceLock::new();
    let policy = POLICY.get_or_init(|| Policy::configure(r#"{"replicas":"any"}"#).expect("config"));
    let f = fields(data, 5);
    let flags = f[3].bytes().next().unwrap_or(0);
    let replicas = [Replica {
        url: f[4].as_str(),
        region: Some("r1"),
    }];
    let project = (flags & 1 == 1).then(|| Project {
        engine: if flags & 2 == 0 {
            Engine::Postgres
        } else {
            Engine::Mongodb
        },
        topology: if flags & 4 == 0 {
            Topology::Shared
        } else {
            Topology::Dedicated
        },
        postgrest_url: (flags & 8 == 0).then_some(f[2].as_str()),
        replicas: if flags & 16 == 0 { &[] } else { &replicas },
    });
    let region = (flags & 32 == 0).then_some("r1");
    match policy.decide(&f[0], &f[1], project, region) {
        Route::Replica(url) => {
            let p = project.expect("a replica without a project");
            assert_eq!(p.topology, Topology::Dedicated);
            assert!(f[0] == "GET" || f[0] == "HEAD", "a write sent to a replica");
            assert!(
                p.replicas.iter().any(|r| r.url == url),
                "not the project's replica"
            );
        }
        Route::Postgrest(url) => {
            let p = project.expect("a target without a project");
            assert_eq!(p.engine, Engine::Postgres);
            assert_eq!(p.topology, Topology::Dedicated);
            assert_eq!(
                Some(url.as_str()),
                p.postgrest_url,
                "a target not the project's"
            );
            assert!(!f[0].eq_ignore_ascii_case("PUT"), "PUT sent to PostgREST");
            for management in ["/v1/db/schema", "/v1/db/policies", "/v1/db/sql"] {
                let rest = f[1].strip_prefix(management);
                assert!(
                    !rest.is_some_and(|r| r.is_empty() || r.starts_with('/')),
                    "a management path sent to PostgREST"
                );
            }
        }
        Route::Unresolved => {
            let p = project.expect("unresolved without a project");
            assert_eq!(
                p.topology,
                Topology::Dedicated,
                "a shared project unresolved"
            );
        }
        Route::Nats => {
            if let Some(p) = project
                && p.engine == Engine::Postgres
                && p.topology == Topology::Dedicated
                && !f[0].eq_ignore_ascii_case("PUT")
            {
                // Only management paths of a dedicated project go to the db service.
                assert!(
                    ["/v1/db/schema", "/v1/db/policies", "/v1/db/sql"]
                        .iter()
                        .any(|m| f[1].starts_with(m)),
                    "a dedicated project's data request fell back to NATS: {:?}",
                    f[1]
                );
            }
        }
    }
}

/// The path normaliser on arbitrary input: a path it accepts comes out in normal form —
/// rooted, no empty, `.` or `..` segment, no encoded `/`, `\` or dot, escapes upper case —
/// normalising it again changes nothing, and its first two segments (the service prefix) are
/// the input's own: a `..` never climbs into them.
pub fn path(data: &[u8]) {
    use crate::path::normalize;
    let input = String::from_utf8_lossy(data);
    let Ok(out) = normalize(&input) else {
        return;
    };
    assert!(out.starts_with('/'), "{out:?} is not rooted");
    let segments: Vec<&str> = out[1..].split('/').collect();
    let last = segments.len().saturating_sub(1);
    for (i, segment) in segments.iter().enumerate() {
        assert!(
            !segment.is_empty() || i == last,
            "empty segment in {out:?} from {input:?}"
        );
        assert!(
            *segment != "." && *segment != "..",
            "dot segment in {out:?}"
        );
    }
    let upper = out.to_ascii_uppercase();
    for forbidden in ["%2F", "%5C", "%2E", "\\"] {
        assert!(
            !upper.contains(forbidden),
            "{forbidden} in {out:?} from {input:?}"
        );
    }
    let bytes = out.as_bytes();
    for (i, b) in bytes.iter().enumerate() {
        if *b == b'%' {
            let hex = &bytes[i + 1..i + 3];
            assert!(
                hex.iter()
                    .all(|h| h.is_ascii_digit() || (b'A'..=b'F').contains(h)),
                "escape not in upper case in {out:?}"
            );
        }
    }
    assert!(
        normalize(&out).is_ok_and(|again| again == out),
        "{out:?} is not stable"
    );
    // The first two segments written (ignoring empty and `.` ones) are kept, unless a `..` came
    // first, which is refused.
    let written: Vec<String> = input
        .split('/')
        .skip(1)
        .filter_map(|raw| {
            normalize(&format!("/{raw}"))
                .ok()
                .map(|s| s.trim_matches('/').to_owned())
        })
        .filter(|s| !s.is_empty())
        .take(2)
        .collect();
    if written.len() == 2 && !written.iter().any(|s| s.is_empty()) {
        let kept: Vec<&str> = segments.iter().take(2).copied().collect();
        assert_eq!(
            kept,
            written.iter().map(String::as_str).collect::<Vec<_>>(),
            "the prefix of {input:?} became {out:?}"
        );
    }
}

/// The request head a listener reads at most, in the fuzz bodies: the least the configuration
/// allows, so that inputs reach it.
const HEAD_LIMIT: usize = 8 * 1024;

/// Header fields grouped by name, in the order each name first appears, values in order: how
/// a `HeaderMap` keeps a head's fields.
type Grouped = Vec<(HeaderName, Vec<Vec<u8>>)>;

/// Groups `fields` by name.
fn grouped(fields: impl IntoIterator<Item = (HeaderName, Vec<u8>)>) -> Grouped {
    let mut out: Grouped = Vec::new();
    for (name, value) in fields {
        match out.iter_mut().find(|(n, _)| *n == name) {
            Some((_, values)) => values.push(value),
            None => out.push((name, vec![value])),
        }
    }
    out
}

/// A header map's fields, grouped by name (less those `skip` names).
fn grouped_map(map: &HeaderMap, skip: &[&str]) -> Grouped {
    grouped(
        map.iter()
            .filter(|(n, _)| !skip.contains(&n.as_str()))
            .map(|(n, v)| (n.clone(), v.as_bytes().to_vec())),
    )
}

/// The field lines `httparse` read, checked as `http` checks a name and a value (not the
/// gateway's own fast paths); `None` when one is not a valid name or value.
fn oracle_fields(headers: &[httparse::Header<'_>]) -> Option<Vec<(HeaderName, Vec<u8>)>> {
    headers
        .iter()
        .map(|h| {
            let name = HeaderName::from_bytes(h.name.as_bytes()).ok()?;
            let value = HeaderValue::from_bytes(h.value).ok()?;
            Some((name, value.as_bytes().to_vec()))
        })
        .collect()
}

/// The values of the fields named `name`.
fn values_of<'a>(
    fields: &'a [(HeaderName, Vec<u8>)],
    name: &'a str,
) -> impl Iterator<Item = &'a [u8]> {
    fields
        .iter()
        .filter(move |(n, _)| n.as_str() == name)
        .map(|(_, v)| v.as_slice())
}

/// A list field's elements (RFC 9110 §5.6.1), trimmed of optional whitespace, the empty ones
/// left out.
fn elements(value: &[u8]) -> impl Iterator<Item = &[u8]> {
    value
        .split(|b| *b == b',')
        .map(trim_ows)
        .filter(|e| !e.is_empty())
}

/// `bytes` without optional whitespace (SP, HTAB) around it.
fn trim_ows(bytes: &[u8]) -> &[u8] {
    let ows = |b: &u8| *b == b' ' || *b == b'\t';
    let start = bytes.iter().position(|b| !ows(b)).unwrap_or(bytes.len());
    let end = bytes.iter().rposition(|b| !ows(b)).map_or(start, |e| e + 1);
    &bytes[start..end]
}

/// Whether a `Connection` field holds `token`.
fn connection_has(fields: &[(HeaderName, Vec<u8>)], token: &str) -> bool {
    values_of(fields, "connection")
        .flat_map(elements)
        .any(|e| e.eq_ignore_ascii_case(token.as_bytes()))
}

/// The one length the `Content-Length` fields state (RFC 9110 §8.6: a list of one number
/// repeated is that number), `Err` when they state several or one that is not a number; a
/// number is 1 to 19 digits (the gateway's bound, under 2^64), around optional whitespace.
/// Also whether the fields said it as anything but one plain number (the gateway restates it).
fn stated_length(fields: &[(HeaderName, Vec<u8>)]) -> Result<(Option<u64>, bool), ()> {
    let mut length = None;
    let mut count = 0;
    let mut listed = false;
    for value in values_of(fields, "content-length") {
        count += 1;
        listed |= value.contains(&b',');
        for part in value.split(|b| *b == b',') {
            let digits = trim_ows(part);
            if digits.is_empty() || digits.len() > 19 || !digits.iter().all(u8::is_ascii_digit) {
                return Err(());
            }
            let n: u64 = std::str::from_utf8(digits)
                .map_err(|_| ())?
                .parse()
                .map_err(|_| ())?;
            if length.is_some_and(|l| l != n) {
                return Err(());
            }
            length = Some(n);
        }
    }
    Ok((length, count > 1 || listed))
}

/// The fields as the gateway keeps them: a length said as several numbers restated as one.
fn kept_fields(fields: &[(HeaderName, Vec<u8>)], length: Option<u64>, restate: bool) -> Grouped {
    let mut kept = grouped(fields.iter().cloned());
    if restate && let Some(n) = length {
        for (name, values) in &mut kept {
            if *name == http::header::CONTENT_LENGTH {
                *values = vec![n.to_string().into_bytes()];
            }
        }
    }
    kept
}

/// How many field lines a head the gateway wrote has (its lines but the first and the empty
/// last one).
fn field_lines(head: &[u8]) -> usize {
    head.windows(2)
        .filter(|w| *w == b"\r\n")
        .count()
        .saturating_sub(2)
}

/// What a request head should be read as, by RFC 9112 and the gateway's stated rules, from
/// the parts `httparse` found in it.
#[derive(Debug)]
struct ExpectedRequest {
    method: http::Method,
    uri: http::Uri,
    version: http::Version,
    headers: Grouped,
    body: Framing,
    keep_alive: bool,
    expect_continue: bool,
    upgrade: bool,
}

/// The request `parsed` (complete) should be read as, or why it is refused.
fn expected_request(parsed: &httparse::Request<'_, '_>) -> Result<ExpectedRequest, &'static str> {
    let method = http::Method::from_bytes(parsed.method.unwrap_or_default().as_bytes())
        .map_err(|_| "method")?;
    let uri =
        http::Uri::try_from(parsed.path.unwrap_or_default().as_bytes()).map_err(|_| "target")?;
    let version = match parsed.version {
        Some(0) => http::Version::HTTP_10,
        _ => http::Version::HTTP_11,
    };
    let fields = oracle_fields(parsed.headers).ok_or("a name or value")?;
    let hosts = values_of(&fields, "host").count();
    if hosts > 1 || (hosts == 0 && version == http::Version::HTTP_11) {
        return Err("one Host (RFC 9112 §3.2)");
    }
    let (length, restate) = stated_length(&fields).map_err(|()| "Content-Length")?;
    let te: Vec<&[u8]> = values_of(&fields, "transfer-encoding").collect();
    let body = if te.is_empty() {
        match length {
            None | Some(0) => Framing::Done,
            Some(n) => Framing::Length(n),
        }
    } else {
        // RFC 9112 §6.1: an HTTP/1.0 message with a Transfer-Encoding has faulty framing.
        if version == http::Version::HTTP_10 {
            return Err("Transfer-Encoding in HTTP/1.0");
        }
        // §6.3: both may be a smuggling attempt; the gateway refuses them.
        if values_of(&fields, "content-length").next().is_some() {
            return Err("Content-Length and Transfer-Encoding");
        }
        let codings: Vec<&[u8]> = te.iter().flat_map(|v| elements(v)).collect();
        // §6.3: a request whose final coding is not chunked is refused.
        if !codings
            .last()
            .is_some_and(|c| c.eq_ignore_ascii_case(b"chunked"))
        {
            return Err("chunked not final");
        }
        // §7: chunked is applied once; the gateway decodes no other coding, and refuses a
        // field that names none.
        if codings.len() != 1 || te.iter().any(|v| elements(v).next().is_none()) {
            return Err("a coding other than chunked alone");
        }
        Framing::CHUNKED
    };
    let keep_alive = match version {
        http::Version::HTTP_10 => {
            connection_has(&fields, "keep-alive") && !connection_has(&fields, "close")
        }
        _ => !connection_has(&fields, "close"),
    };
    let expect_continue = version == http::Version::HTTP_11
        && values_of(&fields, "expect").any(|v| v.eq_ignore_ascii_case(b"100-continue"));
    let upgrade = values_of(&fields, "upgrade").next().is_some();
    Ok(ExpectedRequest {
        method,
        uri,
        version,
        headers: kept_fields(&fields, length, restate),
        body,
        keep_alive,
        expect_continue,
        upgrade,
    })
}

/// The client-side request head parser on arbitrary bytes, against `httparse` read by RFC 9112
/// §6.3: see [`request_head_verdict`].
pub fn request_head(data: &[u8]) {
    request_head_verdict(data);
}

/// The client-side request head parser (`http1::server::parse`, under a head limit of 8 KiB)
/// on arbitrary bytes: it accepts a head exactly when `httparse` parses it complete and RFC
/// 9112 and the gateway's stated rules accept its framing (one `Host`; never `Content-Length`
/// beside `Transfer-Encoding`, nor lengths that differ or are not 1–19 digits; `chunked` the
/// one coding, never in HTTP/1.0), and then reads it as `httparse` does: the same method,
/// target, version, header names and values in order, the framing those rules give, the bytes
/// after the head left in the buffer. A head it writes from an accepted one for a backend
/// parses back to the same method, target, headers and framing. Whether it accepted.
pub fn request_head_verdict(data: &[u8]) -> bool {
    use crate::http1::server as head;
    let within = &data[..data.len().min(HEAD_LIMIT)];
    let mut fields = [httparse::EMPTY_HEADER; head::MAX_HEADERS];
    let mut theirs = httparse::Request::new(&mut fields);
    let status = theirs.parse(within);
    let mut buf = BytesMut::from(data);
    let ours = head::parse(&mut buf, HEAD_LIMIT);
    let len = match status {
        Ok(httparse::Status::Complete(len)) => len,
        Ok(httparse::Status::Partial) => {
            match ours {
                Ok(None) => {
                    assert!(
                        data.len() < HEAD_LIMIT,
                        "a partial head over the limit waited"
                    );
                    assert_eq!(buf.len(), data.len(), "a partial head was taken");
                }
                Err(r) => assert!(
                    data.len() >= HEAD_LIMIT && r.status.as_u16() == 431,
                    "a partial head refused: {r:?}"
                ),
                Ok(Some(h)) => panic!("httparse finds it partial, the gateway took {h:?}"),
            }
            return false;
        }
        Err(e) => {
            let refusal = ours.expect_err("httparse refuses the head, the gateway did not");
            let status = if e == httparse::Error::TooManyHeaders {
                431
            } else {
                400
            };
            assert_eq!(refusal.status.as_u16(), status, "{e:?}: {refusal:?}");
            return false;
        }
    };
    let mut scanned = 0;
    assert!(
        head::may_end(&data[..len], &mut scanned),
        "a complete head whose end the connection would not look for"
    );
    let head = match (ours, expected_request(&theirs)) {
        (Ok(Some(head)), Ok(expected)) => {
            let request = &head.request;
            assert_eq!(request.method(), expected.method);
            assert_eq!(request.uri(), &expected.uri);
            assert_eq!(request.version(), expected.version);
            assert_eq!(
                grouped_map(request.headers(), &[]),
                expected.headers,
                "the header fields"
            );
            for value in request.headers().values() {
                assert!(
                    !value
                        .as_bytes()
                        .iter()
                        .any(|b| matches!(b, 0 | b'\r' | b'\n')),
                    "NUL, CR or LF kept in {value:?}"
                );
            }
            assert_eq!(head.body, expected.body, "the body's framing");
            assert_eq!(head.keep_alive, expected.keep_alive, "keep-alive");
            assert_eq!(head.expect_continue, expected.expect_continue, "expect");
            assert_eq!(head.upgrade, expected.upgrade, "upgrade");
            assert_eq!(&buf[..], &data[len..], "the bytes after the head");
            head
        }
        (Err(_), Err(_)) => return false,
        (ours, expected) => panic!(
            "the gateway read {:?}; by the rules it is {:?}",
            ours.map(|h| h.map(|h| (h.request, h.body))),
            expected.map(|e| (e.method, e.uri, e.body))
        ),
    };
    // Written for a backend (its own host, its own framing header) and read back.
    use crate::http1::client as h1;
    let sending = match head.body {
        Framing::Length(n) => h1::Sending::Length(n),
        Framing::Done => h1::Sending::Nothing,
        _ => h1::Sending::Chunked,
    };
    let host = HeaderValue::from_static("backend.internal");
    let added = h1::Added {
        host: Some(&host),
        backend: None,
    };
    let mut wire = Vec::new();
    h1::encode_head(&mut wire, &head.request, sending, added);
    let mut again = BytesMut::from(&wire[..]);
    if field_lines(&wire) > head::MAX_HEADERS {
        // With the backend's `host` added, past what the client side reads (a backend has its
        // own cap).
        let refused = head::parse(&mut again, wire.len() + 1).expect_err("over the cap");
        assert_eq!(refused.status.as_u16(), 431);
        return true;
    }
    let back = head::parse(&mut again, wire.len() + 1)
        .unwrap_or_else(|r| panic!("a written head is refused: {r:?}: {wire:?}"))
        .expect("a written head is complete");
    assert!(again.is_empty(), "a written head has bytes after it");
    assert_eq!(back.request.method(), head.request.method());
    // The origin form (RFC 9112 §3.2.1): the path and query, an empty path written `/`.
    let target = head
        .request
        .uri()
        .path_and_query()
        .map_or("", |p| p.as_str());
    let target = if target.is_empty() || target.starts_with('?') {
        format!("/{target}")
    } else {
        target.to_owned()
    };
    assert_eq!(back.request.uri().to_string(), target, "the target written");
    assert_eq!(back.body, head.body, "the framing written");
    let framing = ["host", "content-length", "transfer-encoding"];
    assert_eq!(
        grouped_map(back.request.headers(), &framing),
        grouped_map(head.request.headers(), &framing),
        "the header fields written"
    );
    assert_eq!(back.request.headers()["host"], host);
    true
}

/// The backend-side answer head parser on arbitrary bytes, against `httparse` read by RFC
/// 9112 §6.3: see [`answer_head_verdict`].
pub fn answer_head(data: &[u8]) {
    answer_head_verdict(data);
}

/// The backend-side answer head parser (`http1::client::parse_head`) on arbitrary bytes: it accepts
/// a head exactly when `httparse` parses it complete with a valid status and RFC 9112 §6.3
/// accepts its framing (never `Content-Length` beside `Transfer-Encoding`, nor lengths that
/// differ or are not 1–19 digits), and then reads it as `httparse` does: the same status,
/// version, header names and values in order; chunked when the final coding is, else to the
/// connection's close; the stated length; an HTTP/1.0 answer with a `Transfer-Encoding`
/// never kept alive (§6.1). The head the gateway writes to its client from it parses back to
/// the same status and headers, framed as the gateway says. Whether it accepted.
pub fn answer_head_verdict(data: &[u8]) -> bool {
    use crate::http1::client as h1;
    use crate::http1::server::{self as head, Framed, Sending};
    use crate::phases::stamps::Stamps;
    let within = &data[..data.len().min(h1::MAX_HEAD_BYTES)];
    let mut fields = [httparse::EMPTY_HEADER; h1::MAX_HEADERS];
    let mut theirs = httparse::Response::new(&mut fields);
    let status = theirs.parse(within);
    let mut buf = BytesMut::from(data);
    let ours = h1::parse_head(&mut buf);
    let len = match status {
        Ok(httparse::Status::Complete(len)) => len,
        Ok(httparse::Status::Partial) => {
            assert!(matches!(ours, Ok(None)), "httparse finds it partial");
            assert_eq!(buf.len(), data.len(), "a partial head was taken");
            return false;
        }
        Err(e) => {
            let error = ours
                .err()
                .unwrap_or_else(|| panic!("httparse refuses it ({e:?})"));
            let why = if e == httparse::Error::TooManyHeaders {
                "more than 100 headers"
            } else {
                "not an HTTP/1.x answer head"
            };
            assert!(
                matches!(error, h1::WireError::Invalid(w) if w == why),
                "{e:?}: {error}"
            );
            return false;
        }
    };
    let expected = (|| {
        let code = theirs.code.ok_or("no status")?;
        let status = http::StatusCode::from_u16(code).map_err(|_| "status")?;
        let version = match theirs.version {
            Some(0) => http::Version::HTTP_10,
            _ => http::Version::HTTP_11,
        };
        let fields = oracle_fields(theirs.headers).ok_or("a name or value")?;
        let (length, restate) = stated_length(&fields).map_err(|()| "Content-Length")?;
        let te: Vec<&[u8]> = values_of(&fields, "transfer-encoding").collect();
        let framing = match (te.is_empty(), length) {
            (false, Some(_)) => return Err("Content-Length and Transfer-Encoding"),
            (false, None) => {
                // A coding the gateway would have to undo is refused, not passed on unmarked.
                let mut codings = te.iter().flat_map(|v| elements(v));
                if codings.any(|c| !c.eq_ignore_ascii_case(b"chunked")) {
                    return Err("a coding other than chunked");
                }
                let last = te.iter().flat_map(|v| elements(v)).last();
                if last.is_some_and(|c| c.eq_ignore_ascii_case(b"chunked")) {
                    Framing::CHUNKED
                } else {
                    Framing::UntilClose
                }
            }
            (true, Some(n)) => Framing::Length(n),
            (true, None) => Framing::UntilClose,
        };
        let close = connection_has(&fields, "close");
        let keep_alive = match version {
            http::Version::HTTP_10 => {
                connection_has(&fields, "keep-alive") && !close && te.is_empty()
            }
            _ => !close,
        };
        Ok((
            status,
            version,
            kept_fields(&fields, length, restate),
            framing,
            keep_alive,
        ))
    })();
    let answer = match (ours, expected) {
        (Ok(Some(answer)), Ok((status, version, headers, framing, keep_alive))) => {
            assert_eq!(answer.status, status);
            assert_eq!(answer.version, version);
            assert_eq!(
                grouped_map(&answer.headers, &[]),
                headers,
                "the header fields"
            );
            assert_eq!(answer.framing, framing, "the body's framing");
            assert_eq!(answer.keep_alive, keep_alive, "keep-alive");
            assert_eq!(&buf[..], &data[len..], "the bytes after the head");
            answer
        }
        (Err(_), Err(_)) => return false,
        (ours, expected) => panic!(
            "the gateway read {:?}; by the rules it is {expected:?}",
            ours.map(|h| h.map(|h| (h.status, h.framing)))
        ),
    };
    // Written to an HTTP/1.1 client as the connection frames it, and read back.
    let stated = head::stated_length(&answer.headers);
    match answer.framing {
        Framing::Length(n) => assert_eq!(stated, Some(n), "the length passed on"),
        _ => assert_eq!(stated, None, "a length passed on beside other framing"),
    }
    let status = answer.status;
    let bodiless = status.is_informational()
        || status == http::StatusCode::NO_CONTENT
        || status == http::StatusCode::NOT_MODIFIED;
    let sending = match (bodiless, stated) {
        (true, _) => Sending::Bodiless,
        (false, Some(n)) => Sending::Length(n),
        (false, None) => Sending::Chunked,
    };
    let framed = Framed {
        version: http::Version::HTTP_11,
        sending,
        close: false,
    };
    let mut wire = Vec::new();
    head::encode(&mut wire, status, &answer.headers, &Stamps::none(), framed);
    let mut again = BytesMut::from(&wire[..]);
    if field_lines(&wire) > h1::MAX_HEADERS {
        // With the `date` added, past what the backend side reads (a client has its own cap).
        assert!(matches!(
            h1::parse_head(&mut again),
            Err(h1::WireError::Invalid("more than 100 headers"))
        ));
        return true;
    }
    let back = h1::parse_head(&mut again)
        .unwrap_or_else(|e| panic!("a written head is refused: {e}: {wire:?}"))
        .expect("a written head is complete");
    assert!(again.is_empty(), "a written head has bytes after it");
    assert_eq!(back.status, status);
    assert_eq!(back.version, http::Version::HTTP_11);
    let keeps_length =
        bodiless && !status.is_informational() && status != http::StatusCode::NO_CONTENT;
    let framing = match sending {
        Sending::Length(n) => Framing::Length(n),
        Sending::Chunked => Framing::CHUNKED,
        _ => match stated {
            Some(n) if keeps_length => Framing::Length(n),
            _ => Framing::UntilClose,
        },
    };
    assert_eq!(back.framing, framing, "the framing written");
    // The connection decides these, but a `101` keeps its `Connection`.
    let mut decided = vec!["content-length", "transfer-encoding"];
    if status != http::StatusCode::SWITCHING_PROTOCOLS {
        decided.extend(["connection", "keep-alive"]);
    }
    if !answer.headers.contains_key(http::header::DATE) {
        decided.push("date");
        assert_eq!(
            back.headers.get_all("date").iter().count(),
            1,
            "one date added"
        );
    }
    assert_eq!(
        grouped_map(&back.headers, &decided),
        grouped_map(&answer.headers, &decided),
        "the header fields written"
    );
    true
}

/// How a body decoding ended.
#[derive(Debug, PartialEq, Eq)]
enum Outcome {
    /// The body, and how many bytes were left after it.
    Accepted {
        body: Vec<u8>,
        rest: usize,
    },
    Refused,
    /// The input ended inside the body.
    Cut,
}

/// Decodes `wire` framed by `framing`, handed to the decoder in reads of `read(i)` bytes (at
/// least one): the decoder never hands out an empty piece or more bytes than it was given,
/// asks for room within its read sizes, and holds no more bytes undecided than its bounds
/// allow.
fn decode_in_reads(framing: Framing, wire: &[u8], read: impl Fn(usize) -> usize) -> Outcome {
    use crate::http1::body::{
        BODY_READ_CHUNK, Chunk, Decoded, Decoder, MAX_CHUNK_EXTRAS, MAX_CHUNK_LINE, READ_CHUNK,
    };
    let mut decoder = Decoder::new(framing);
    let mut buf = BytesMut::new();
    let mut fed = 0;
    let mut reads = 0;
    let mut body = Vec::new();
    loop {
        match decoder.decode(&mut buf) {
            Decoded::Data(data) => {
                assert!(!data.is_empty(), "an empty piece of body");
                body.extend_from_slice(&data);
                assert!(body.len() <= fed, "more body than bytes given");
            }
            Decoded::End => {
                return Outcome::Accepted {
                    body,
                    rest: buf.len() + wire.len() - fed,
                };
            }
            Decoded::More(room) => {
                assert!(
                    (READ_CHUNK..=BODY_READ_CHUNK).contains(&room),
                    "room for {room}"
                );
                let held = buf.len();
                match decoder.framing() {
                    Framing::Chunked(Chunk::Size) => assert!(
                        held < MAX_CHUNK_LINE,
                        "{held} bytes held for a chunk-size line"
                    ),
                    Framing::Chunked(Chunk::Trailers) => assert!(
                        held < MAX_CHUNK_EXTRAS + 2,
                        "{held} bytes held for a trailer"
                    ),
                    Framing::Chunked(Chunk::DataEnd) => assert!(held < 2, "{held} held for CRLF"),
                    _ => assert_eq!(held, 0, "data held back"),
                }
                if fed == wire.len() {
                    return if decoder.at_eof() {
                        Outcome::Accepted { body, rest: 0 }
                    } else {
                        Outcome::Cut
                    };
                }
                let n = read(reads).max(1).min(wire.len() - fed);
                reads += 1;
                buf.extend_from_slice(&wire[fed..fed + n]);
                fed += n;
            }
            Decoded::Refused(_) => return Outcome::Refused,
        }
    }
}

/// A chunked body read whole, as RFC 9112 §7.1 and the decoder's stated bounds say: a size
/// of 1–16 hex digits, then optional whitespace and extensions (any bytes but CR, LF and NUL)
/// or nothing, then CRLF, the line with its CRLF at most `MAX_CHUNK_LINE` bytes; the data and
/// CRLF; after the last chunk, trailer field lines without a bare CR or LF or a NUL (§2.2),
/// then an empty line; extensions and trailer lines at most `MAX_CHUNK_EXTRAS` bytes in all.
/// Every size line it takes, `httparse` reads as the same size.
fn chunked_reference(wire: &[u8]) -> Outcome {
    use crate::http1::body::{MAX_CHUNK_EXTRAS, MAX_CHUNK_LINE};
    /// The line at `at`, ended by CRLF within `within` bytes; `Err(true)` when the bytes run
    /// past that bound without one, `Err(false)` when they end first.
    fn line(wire: &[u8], at: usize, within: usize) -> Result<&[u8], bool> {
        let window = &wire[at..wire.len().min(at.saturating_add(within))];
        match window.windows(2).position(|w| w == b"\r\n") {
            Some(end) => Ok(&window[..end]),
            None => Err(wire.len() - at >= within),
        }
    }
    let controls = |bytes: &[u8]| bytes.iter().any(|b| matches!(b, b'\r' | b'\n' | 0));
    let fail = |over: bool| if over { Outcome::Refused } else { Outcome::Cut };
    let mut at = 0;
    let mut extras = 0;
    let mut body = Vec::new();
    loop {
        let size_line = match line(wire, at, MAX_CHUNK_LINE) {
            Ok(l) => l,
            Err(over) => return fail(over),
        };
        let digits = size_line
            .iter()
            .take_while(|b| b.is_ascii_hexdigit())
            .count();
        if !(1..=16).contains(&digits) {
            return Outcome::Refused;
        }
        let Ok(size) =
            u64::from_str_radix(std::str::from_utf8(&size_line[..digits]).unwrap_or("x"), 16)
        else {
            return Outcome::Refused;
        };
        let ext = &size_line[digits..];
        let after_space = ext
            .iter()
            .position(|b| *b != b' ' && *b != b'\t')
            .map(|i| &ext[i..]);
        let well_formed =
            ext.is_empty() || (after_space.is_some_and(|e| e.starts_with(b";")) && !controls(ext));
        if !well_formed {
            return Outcome::Refused;
        }
        extras += ext.len();
        if extras > MAX_CHUNK_EXTRAS {
            return Outcome::Refused;
        }
        assert_eq!(
            httparse::parse_chunk_size(&wire[at..]),
            Ok(httparse::Status::Complete((size_line.len() + 2, size))),
            "httparse reads the chunk-size line {size_line:?} otherwise"
        );
        at += size_line.len() + 2;
        if size == 0 {
            break;
        }
        let left = (wire.len() - at) as u64;
        if left < size {
            return Outcome::Cut;
        }
        let end = at + size as usize;
        body.extend_from_slice(&wire[at..end]);
        at = end;
        match wire.get(at..at + 2) {
            None => return Outcome::Cut,
            Some(b"\r\n") => at += 2,
            Some(_) => return Outcome::Refused,
        }
    }
    loop {
        let trailer = match line(wire, at, MAX_CHUNK_EXTRAS - extras + 2) {
            Ok(l) => l,
            Err(over) => return fail(over),
        };
        at += trailer.len() + 2;
        if trailer.is_empty() {
            return Outcome::Accepted {
                body,
                rest: wire.len() - at,
            };
        }
        if controls(trailer) {
            return Outcome::Refused;
        }
        extras += trailer.len() + 2;
        if extras > MAX_CHUNK_EXTRAS {
            return Outcome::Refused;
        }
    }
}

/// The body decoder on arbitrary bytes, against RFC 9112 §7.1 and its bounds: see
/// [`chunked_verdict`].
pub fn chunked(data: &[u8]) {
    chunked_verdict(data);
}

/// The body decoder (`http1::body::Decoder`) on arbitrary bytes (the first byte picks how they
/// are split into reads and into chunks): as a chunked body it ends, is refused or is cut
/// exactly where a whole-body reading of RFC 9112 §7.1 with the decoder's bounds says, with
/// the same body and the same bytes after it, whatever the reads — one at a time, all at
/// once or in the input's own sizes — and every size line it takes reads the same with
/// `httparse`. The bytes written in chunks by the body encoder both sides' writers drive
/// (`http1::body::Encoder`: small frames into the buffer, large ones apart), split as the first
/// byte says, decode back to them with what followed left over; a length-framed body is the
/// bytes it says. Whether the arbitrary bytes were accepted as a chunked body.
pub fn chunked_verdict(data: &[u8]) -> bool {
    use crate::http1::body::{COALESCE, Encoder};
    let Some((&seed, wire)) = data.split_first() else {
        return false;
    };
    // Read sizes from the input itself (its bytes, cycled), so they vary within one input.
    let own = |i: usize| usize::from(wire.get(i % wire.len().max(1)).copied().unwrap_or(1)) + 1;
    let seeded = |i: usize| (usize::from(seed) * 31 + i * 7) % (usize::from(seed % 64) + 2) + 1;
    let expected = chunked_reference(wire);
    for (how, outcome) in [
        (
            "whole",
            decode_in_reads(Framing::CHUNKED, wire, |_| usize::MAX),
        ),
        ("bytewise", decode_in_reads(Framing::CHUNKED, wire, |_| 1)),
        ("own sizes", decode_in_reads(Framing::CHUNKED, wire, own)),
        ("seeded", decode_in_reads(Framing::CHUNKED, wire, seeded)),
    ] {
        assert_eq!(outcome, expected, "read {how}");
    }
    let accepted = matches!(expected, Outcome::Accepted { .. });

    // The input as a body, framed by the encoder in frames of the sizes `seeded` gives (with
    // the seed's high bit, one frame over COALESCE, written apart), the way a writer sends it.
    let mut encoded = Vec::with_capacity(wire.len() * 2 + 64);
    let mut encoder = Encoder::chunked();
    let mut at = 0;
    let mut i = 0;
    while at < wire.len() {
        let size = if seed & 0x80 != 0 && i == 0 {
            COALESCE + 1
        } else {
            seeded(i)
        };
        let n = size.min(wire.len() - at);
        i += 1;
        let mut frame = bytes::Bytes::copy_from_slice(&wire[at..at + n]);
        let framed = encoder.data(&mut encoded, &mut frame);
        assert!(!framed.over, "a chunked body has no length to exceed");
        if let Some(after) = framed.apart {
            encoded.extend_from_slice(&frame);
            encoded.extend_from_slice(after);
        }
        at += n;
    }
    let mut trailers = http::HeaderMap::new();
    if seed & 1 == 1 {
        trailers.insert("x-checksum", http::HeaderValue::from_static("1"));
    }
    encoder
        .end(&mut encoded, Some(&trailers))
        .expect("a chunked body is never short");
    let next = b"GET /next HTTP/1.1\r\n";
    encoded.extend_from_slice(next);
    let round = Outcome::Accepted {
        body: wire.to_vec(),
        rest: next.len(),
    };
    assert_eq!(chunked_reference(&encoded), round, "the writer's chunks");
    let reads: [(&str, &dyn Fn(usize) -> usize); 3] = [
        ("bytewise", &|_| 1),
        ("own sizes", &own),
        ("whole", &|_| usize::MAX),
    ];
    for (how, read) in reads {
        assert_eq!(
            decode_in_reads(Framing::CHUNKED, &encoded, read),
            round,
            "the writer's chunks, read {how}"
        );
    }

    // Length framing: exactly the bytes it says, the rest left.
    let n = usize::from(seed).min(wire.len());
    assert_eq!(
        decode_in_reads(Framing::Length(n as u64), wire, own),
        Outcome::Accepted {
            body: wire[..n].to_vec(),
            rest: wire.len() - n,
        },
        "a length of {n}"
    );
    accepted
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Replays every saved corpus input of every target (`tests/fuzz/corpus/<target>/*`).
    #[test]
    fn the_fuzz_corpus_replays_without_a_failure() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fuzz/corpus");
        let mut failed = Vec::new();
        for (name, body) in TARGETS {
            let dir = root.join(name);
            let entries = std::fs::read_dir(&dir)
                .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
                .collect::<Result<Vec<_>, _>>()
                .expect("corpus entries");
            assert!(!entries.is_empty(), "{name}: empty corpus");
            for entry in entries {
                let data = std::fs::read(entry.path()).expect("corpus file");
                if std::panic::catch_unwind(|| body(&data)).is_err() {
                    failed.push(entry.path().display().to_string());
                }
            }
        }
        assert!(failed.is_empty(), "failing corpus inputs: {failed:#?}");
    }

    /// The bodies reach their acceptance branches: a properly signed valid token is accepted
    /// by the verifier they use, and a dedicated project's request gets its PostgREST target.
    #[test]
    fn the_bodies_reach_their_accepting_branches() {
        let config = JwtConfig {
            hs256_secret: Some(FUZZ_SECRET.to_owned()),
            ..JwtConfig::default()
        };
        let verifier = JwtVerifier::new(
            &config,
            "authenticated",
            Duration::from_secs(5),
            &crate::dns::Resolver::system(),
        )
        .expect("verifier");
        let claims =
            serde_json::json!({"aud": "authenticated", "sub": "u1", "exp": 4_102_444_800u64});
        let key = jsonwebtoken::EncodingKey::from_secret(FUZZ_SECRET.as_bytes()).expect("key");
        let token =
            jsonwebtoken::encode(&jsonwebtoken::Header::default(), &claims, &key).expect("token");
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("runtime");
        let verified = runtime.block_on(verifier.verify(&token)).expect("accepted");
        assert_eq!(verified.subject, "u1");
        jwt(claims.to_string().as_bytes());

        use aura_plugin_db_routing::policy::{Engine, Policy, Project, Route, Topology};
        let policy = Policy::configure("{}").expect("config");
        let project = Project {
            engine: Engine::Postgres,
            topology: Topology::Dedicated,
            postgrest_url: Some("http://pgrst.internal:3000"),
            replicas: &[],
        };
        assert_eq!(
            policy.decide("GET", "/v1/db/todos", Some(project), None),
            Route::Postgrest("http://pgrst.internal:3000".into())
        );
        db_routing(b"GET\x00/v1/db/todos\x00http://pgrst.internal:3000\x00\x05");
        // A read of a dedicated project with a replica goes to it, a write never does.
        db_routing(b"GET\x00/v1/db/todos\x00http://pgrst.internal:3000\x00\x15\x00http://r:3000");
        db_routing(b"POST\x00/v1/db/todos\x00http://pgrst.internal:3000\x00\x15\x00http://r:3000");

        // The HTTP/1.1 bodies accept a well-formed message of each framing, and refuse the
        // ambiguous ones.
        for head in [
            &b"GET / HTTP/1.1\r\nHost: gw\r\n\r\n"[..],
            b"POST /a?b HTTP/1.1\r\nHost: gw\r\nContent-Length: 3, 3\r\n\r\nabc",
            b"PUT / HTTP/1.1\r\nHost: gw\r\nTransfer-Encoding: chunked\r\n\r\n",
            b"GET / HTTP/1.0\r\nConnection: keep-alive\r\n\r\n",
        ] {
            assert!(request_head_verdict(head), "{head:?}");
        }
        assert!(!request_head_verdict(
            b"POST / HTTP/1.1\r\nHost: gw\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n"
        ));
        for head in [
            &b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"[..],
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n",
            b"HTTP/1.0 200 OK\r\n\r\n",
            b"HTTP/1.1 304 Not Modified\r\nContent-Length: 9\r\n\r\n",
        ] {
            assert!(answer_head_verdict(head), "{head:?}");
        }
        assert!(!answer_head_verdict(
            b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\n"
        ));
        assert!(chunked_verdict(
            b"\x03a;x\r\n0123456789\r\n0\r\nx: 1\r\n\r\nnext"
        ));
        assert!(!chunked_verdict(b"\x03a\r\n0123456789XX"));
    }

    /// The saved corpus of each HTTP/1.1 body holds messages it accepts and messages it
    /// refuses: the replay exercises both sides of every parser.
    #[test]
    fn the_http1_corpus_holds_accepted_and_refused_messages() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fuzz/corpus");
        type Verdict = fn(&[u8]) -> bool;
        let verdicts: [(&str, Verdict); 3] = [
            ("request_head", request_head_verdict),
            ("answer_head", answer_head_verdict),
            ("chunked", chunked_verdict),
        ];
        for (name, verdict) in verdicts {
            let (mut accepted, mut refused) = (0, 0);
            for entry in std::fs::read_dir(root.join(name)).expect("corpus") {
                let data = std::fs::read(entry.expect("entry").path()).expect("corpus file");
                if verdict(&data) {
                    accepted += 1;
                } else {
                    refused += 1;
                }
            }
            println!("{name}: {accepted} accepted, {refused} not");
            assert!(
                accepted > 0 && refused > 0,
                "{name}: {accepted} accepted, {refused} not"
            );
        }
    }
}
