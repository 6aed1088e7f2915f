//! Fuzz bodies: what each `cargo fuzz` target (`tests/fuzz`) checks for one input.
//!
//! Each function takes raw bytes, drives one parser or decision that sees untrusted input, and
//! panics when an invariant breaks. The fuzz targets call them; the saved corpus
//! (`tests/fuzz/corpus/<target>/`) is replayed through them by the normal test run. Inputs
//! with several fields separate them with NUL bytes.

use std::net::IpAddr;
use std::sync::OnceLock;
use std::time::Duration;

use http::{HeaderMap, HeaderName, HeaderValue};

use crate::actor::Actor;
use crate::auth::jwt::{JwtVerifier, MAX_TOKEN_LEN};
use crate::config::JwtConfig;
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
            JwtVerifier::new(&config, "authenticated", Duration::from_secs(5)).expect("verifier"),
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Replays every saved corpus input of every target (`tests/fuzz/corpus/<target>/*`).
    #[test]
    fn the_fuzz_corpus_replays_without_a_failure() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fuzz/corpus");
        for (name, body) in TARGETS {
            let dir = root.join(name);
            let entries = std::fs::read_dir(&dir)
                .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
                .collect::<Result<Vec<_>, _>>()
                .expect("corpus entries");
            assert!(!entries.is_empty(), "{name}: empty corpus");
            for entry in entries {
                let data = std::fs::read(entry.path()).expect("corpus file");
                body(&data);
            }
        }
    }

    /// The bodies reach their acceptance branches: a properly signed valid token is accepted
    /// by the verifier they use, and a dedicated project's request gets its PostgREST target.
    #[test]
    fn the_bodies_reach_their_accepting_branches() {
        let config = JwtConfig {
            hs256_secret: Some(FUZZ_SECRET.to_owned()),
            ..JwtConfig::default()
        };
        let verifier =
            JwtVerifier::new(&config, "authenticated", Duration::from_secs(5)).expect("verifier");
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
    }
}
