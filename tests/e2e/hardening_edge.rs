//! The proxy edge under attack, through the real binary: paths, credentials, forwarding
//! headers, keys in URLs, the console token, PostgREST targets, tunnels and JWKS.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use futures::StreamExt;
use reqwest::StatusCode;
use serde_json::json;
use uuid::Uuid;

use crate::support::builder::{Gateway, Started};
use crate::support::call::{Call, IntoCall};
use crate::support::fixture::{Fixture, console_token, user_token};
use crate::support::gateway::Process;
use crate::support::metrics::metric;
use crate::support::raw::{exchange, get, status_of};
use crate::support::records::TEST_KEY;
use crate::support::responder::{Envelopes, reply};
use crate::support::upstream::{Recorder, websocket_echo};

/// An extra project `ded` of organization A with a dedicated PostgREST at `postgrest`, and its
/// anon key.
fn dedicated(fx: &Fixture, postgrest: &str) -> (String, String) {
    let key = format!("aura_pk_ded_{}", Uuid::new_v4().simple());
    let records = format!(
        "[[projects]]\nref = \"ded\"\norganization_id = \"{org}\"\ndb_engine = \"postgres\"\ntopology = \"dedicated\"\npostgrest_url = \"{postgrest}\"\n\n\
         [[projects]]\nref = \"far\"\norganization_id = \"{org}\"\ndb_engine = \"postgres\"\ntopology = \"dedicated\"\npostgrest_url = \"http://10.255.255.1:3000\"\n\n\
         [[api_keys]]\nid = \"{id}\"\nproject_ref = \"ded\"\nrole = \"anon\"\nkey_sha256 = \"{hash}\"\n\n\
         [[api_keys]]\nid = \"{id2}\"\nproject_ref = \"far\"\nrole = \"anon\"\nkey_sha256 = \"{hash2}\"\n",
        org = fx.org_a,
        id = Uuid::new_v4(),
        id2 = Uuid::new_v4(),
        hash = aura_gateway::auth::keys::hash_key(&key),
        hash2 = aura_gateway::auth::keys::hash_key(&format!("{key}_far")),
    );
    (records, key)
}

struct Edge {
    gw: Process,
    fx: Fixture,
    storage: Recorder,
    realtime: Recorder,
    postgrest: Recorder,
    envelopes: Envelopes,
    ded_key: String,
}

impl Edge {
    async fn start(extra_toml: &str) -> Self {
        let fx = Fixture::new();
        let (storage, realtime, postgrest) = (
            Recorder::start().await,
            Recorder::start().await,
            Recorder::start().await,
        );
        let (records, ded_key) = dedicated(&fx, &postgrest.url);
        let (storage_url, realtime_url) = (&storage.url, &realtime.url);
        let upstreams = format!(
            "[upstreams]\nstorage_url = \"{storage_url}\"\nrealtime_url = \"{realtime_url}\"\npostgrest_allowed_targets = [\"127.0.0.0/8\"]\n\n{extra_toml}",
        );
        let gw = Gateway::builder()
            .fixture(&fx)
            .records(records)
            .toml(upstreams);
        let bus = crate::support::responder::Bus::shared();
        let envelopes = bus.record(&["db", "auth", "functions"], |_| reply(200, &[], b"nats"));
        let envelopes = envelopes.await;
        let Started { gw, .. } = gw.bus(&bus).binary();
        Self {
            gw,
            fx,
            storage,
            realtime,
            postgrest,
            envelopes,
            ded_key,
        }
    }

    /// `raw` sent on a connection of its own to the data plane: what came back.
    async fn data(&self, raw: Vec<u8>) -> String {
        exchange(self.gw.port, raw).await
    }

    /// `raw` sent on a connection of its own to the management plane: what came back.
    async fn mgmt(&self, raw: Vec<u8>) -> String {
        exchange(self.gw.management_port, raw).await
    }

    /// `GET path` with the key of project `ded` on the data plane: what came back.
    async fn get_ded(&self, path: &str) -> String {
        self.data(get(path, &[("apikey", &self.ded_key)])).await
    }

    fn envelopes(&self) -> Vec<serde_json::Value> {
        self.envelopes.seen()
    }
}

#[tokio::test]
async fn dot_segments_and_encoded_separators_never_reach_a_backend() {
    let edge = Edge::start("").await;
    for path in [
        "/v1/db/../tenant-victim/todos",
        "/v1/db/%2e%2e/tenant-victim/todos",
        "/v1/storage/object/%2e%2e/secret",
        "/v1/storage/object/.%2E/secret",
        "/v1/storage/object/..%2fsecret",
        "/v1/storage/object/a%5csecret",
        "/v1/storage/../db/todos",
    ] {
        let answer = edge.get_ded(path).await;
        assert_eq!(status_of(&answer), 400, "{path}: {answer}");
        assert!(answer.contains("\"invalid_path\""), "{path}: {answer}");
        let stamped = answer.to_ascii_lowercase().contains("x-request-id");
        assert!(stamped, "{answer}");
    }
    let (postgrest, storage) = (edge.postgrest.seen(), edge.storage.seen());
    assert!(postgrest.is_empty(), "{postgrest:?}");
    assert!(storage.is_empty(), "{storage:?}");

    // Dot segments inside a service's own path are resolved before routing.
    let answer = edge.get_ded("/v1/storage/object/./a/../b%2Dc//d").await;
    assert_eq!(status_of(&answer), 200, "{answer}");
    assert_eq!(
        edge.storage.last().expect("forwarded").target,
        "/object/b-c/d"
    );
    // Every spelling of the db management route is routed as the management route (NATS).
    for path in [
        "/v1/db//sql",
        "/v1/db/./sql",
        "/v1/db/%73ql",
        "/v1/db/x/../sql",
    ] {
        let answer = edge.get_ded(path).await;
        let envelope = edge.envelopes().pop().expect("envelope");
        assert_eq!(status_of(&answer), 200, "{path}: {answer}");
        assert!(answer.ends_with("nats"), "{path} went over NATS: {answer}");
        assert_eq!(envelope["path"], "/v1/db/sql", "{path}");
    }
    // A CRUD request of the dedicated project still reaches its PostgREST, normalised.
    let answer = edge.get_ded("/v1/db/./todos//1").await;
    assert_eq!(status_of(&answer), 200, "{answer}");
    assert_eq!(edge.postgrest.last().expect("forwarded").target, "/todos/1");
    for seen in edge
        .storage
        .seen()
        .iter()
        .chain(edge.postgrest.seen().iter())
    {
        let t = seen.target.to_ascii_lowercase();
        let unsafe_parts = ["/../", "/./", "%2e", "%2f", "//"];
        let normalised = !unsafe_parts.iter().any(|part| t.contains(part));
        assert!(normalised, "a backend saw {t}");
    }
    let metrics = edge.gw.metrics().await;
    assert!(metric(&metrics, "aura_paths_refused_total", &[]) >= 7.0);
}

#[tokio::test]
async fn authorization_is_verified_or_refused_never_forwarded_unverified() {
    let edge = Edge::start("").await;
    let fx = &edge.fx;
    let token = user_token("alpha", Uuid::new_v4());
    let other_token = user_token("other", Uuid::new_v4());
    let send = async |authorizations: &[String]| {
        let mut headers = vec![("apikey", fx.anon_key.as_str())];
        headers.extend(authorizations.iter().map(|v| ("authorization", v.as_str())));
        edge.data(get("/v1/storage/object/x", &headers)).await
    };

    // A tab after the scheme, any case: parsed and verified.
    let answer = send(&[format!("bEaReR\t{token}")]).await;
    assert_eq!(status_of(&answer), 200, "{answer}");
    let seen = edge.storage.last().expect("forwarded");
    assert_eq!(seen.one("x-aura-role").as_deref(), Some("authenticated"));
    assert_eq!(seen.all("authorization"), vec![format!("bEaReR\t{token}")]);
    edge.storage.clear();

    for (what, authorizations) in [
        (
            "another project's token after a tab",
            vec![format!("Bearer\t{other_token}")],
        ),
        (
            "two Authorization headers",
            vec![format!("Bearer {token}"), format!("Bearer {other_token}")],
        ),
        ("another scheme", vec!["Basic dXNlcjpwYXNz".to_owned()]),
        ("a malformed bearer", vec!["Bearer a b".to_owned()]),
        ("an empty bearer", vec!["Bearer".to_owned()]),
    ] {
        let answer = send(&authorizations).await;
        assert_eq!(status_of(&answer), 401, "{what}: {answer}");
        // A readable bearer is verified (`invalid_jwt` when refused); an unreadable header is
        // `invalid_token`.
        let code = if what.starts_with("another project") {
            "\"invalid_jwt\""
        } else {
            "\"invalid_token\""
        };
        assert!(answer.contains(code), "{what}: {answer}");
    }
    let forwarded = edge.storage.seen();
    assert!(forwarded.is_empty(), "nothing forwarded: {forwarded:?}");
    // A public path needs no key, but a token there has no project to be checked against.
    let signup = || Call::post(edge.gw.data_url("/v1/auth/signup"));
    assert_eq!(
        signup().bearer(&token).status().await,
        StatusCode::UNAUTHORIZED
    );
    let before = edge.envelopes().len();
    let served = signup().status().await;
    assert_eq!(served, StatusCode::OK, "without a token it is served");
    assert_eq!(edge.envelopes().len(), before + 1);

    // The same parser on the management plane.
    let console = format!("Bearer {}", console_token(fx.admin));
    let two = [
        ("authorization", console.as_str()),
        ("authorization", "Bearer x"),
    ];
    let answer = edge.mgmt(get("/v1/projects/alpha", &two)).await;
    assert_eq!(status_of(&answer), 401, "{answer}");
}

#[tokio::test]
async fn hostile_header_bytes_are_refused_as_a_key_and_reach_an_envelope_exactly() {
    let edge = Edge::start("").await;
    let key = edge.fx.anon_key.clone();
    let head = |path: &str| {
        format!("GET {path} HTTP/1.1\r\nhost: gw\r\nconnection: close\r\n").into_bytes()
    };

    // A key with a byte that is not UTF-8: the stage sees U+FFFD, no key has that form, 401.
    let mut raw = head("/v1/storage/object/x");
    raw.extend_from_slice(format!("apikey: {key}").as_bytes());
    raw.extend_from_slice(b"\xff\r\n\r\n");
    let answer = edge.data(raw).await;
    assert_eq!(status_of(&answer), 401, "{answer}");
    assert!(answer.contains("\"invalid_api_key\""), "{answer}");
    assert!(edge.storage.seen().is_empty(), "nothing forwarded");

    // Quotes, backslashes, a tab and bytes beyond ASCII in the headers of a NATS route: the
    // envelope is JSON and carries each value as sent (bytes that are not UTF-8 as U+FFFD).
    let mut raw = head("/v1/functions/v1/hostile");
    raw.extend_from_slice(format!("apikey: {key}\r\nx-q: a\"b\\c\td\r\nx-obs: ").as_bytes());
    raw.extend_from_slice(b"caf\xc3\xa9 \xe9\xff\r\n\r\n");
    let answer = edge.data(raw).await;
    assert_eq!(status_of(&answer), 200, "{answer}");
    let mut envelopes = edge.envelopes().into_iter();
    let envelope = envelopes.rfind(|e| e["path"] == "/v1/functions/v1/hostile");
    let envelope = envelope.expect("the envelope reached the responder");
    let header = |name: &str| {
        let pairs = envelope["headers"].as_array().expect("headers");
        let pair = pairs.iter().find(|pair| pair[0] == name);
        pair.and_then(|pair| pair[1].as_str()).map(str::to_owned)
    };
    assert_eq!(header("x-q").as_deref(), Some("a\"b\\c\td"));
    let obs = String::from_utf8_lossy(b"caf\xc3\xa9 \xe9\xff").into_owned();
    assert_eq!(header("x-obs"), Some(obs));
    assert!(header("apikey").is_none(), "the key is not forwarded");
}

#[tokio::test]
async fn connection_cannot_remove_the_gateways_own_headers() {
    let edge = Edge::start("").await;
    let token = format!("Bearer {}", user_token("alpha", Uuid::new_v4()));
    let raw = get(
        "/v1/storage/object/x",
        &[
            ("apikey", &edge.fx.anon_key),
            ("authorization", &token),
            (
                "connection",
                "close, x-request-id, Authorization, x-forwarded-for, x-aura-role, x-hop",
            ),
            ("x-hop", "1"),
        ],
    );
    let answer = edge.data(raw).await;
    assert_eq!(status_of(&answer), 200, "{answer}");
    let seen = edge.storage.last().expect("forwarded");
    let id = answer.lines().find_map(|l| {
        let l = l.to_ascii_lowercase();
        l.strip_prefix("x-request-id: ").map(str::to_owned)
    });
    let id = id.expect("request id");
    let forwarded_id = seen.one("x-request-id").map(|v| v.to_ascii_lowercase());
    assert_eq!(forwarded_id, Some(id.trim().to_owned()));
    assert_eq!(seen.one("authorization"), Some(token));
    assert_eq!(seen.one("x-aura-role").as_deref(), Some("authenticated"));
    assert_eq!(seen.one("x-forwarded-for").as_deref(), Some("127.0.0.1"));
    let hop = seen.one("x-hop").is_some();
    assert!(!hop, "a client's own hop header is still removed");
}

#[tokio::test]
async fn backends_learn_the_client_ip_from_the_gateway_not_the_client() {
    let edge = Edge::start("").await;
    let client = reqwest::Client::new();
    let spoofed = [
        ("x-forwarded-for", "6.6.6.6"),
        ("x-real-ip", "6.6.6.6"),
        ("forwarded", "for=6.6.6.6"),
        ("x-aura-client-ip", "6.6.6.6"),
    ];
    let spoofing = |path: &str| {
        let request = client
            .get(edge.gw.data_url(path))
            .call()
            .key(&edge.fx.anon_key);
        request.headers(&spoofed)
    };
    assert_eq!(
        spoofing("/v1/storage/object/x").status().await,
        StatusCode::OK
    );
    let seen = edge.storage.last().expect("forwarded");
    assert_eq!(seen.all("x-forwarded-for"), vec!["127.0.0.1"]);
    assert_eq!(seen.all("x-aura-client-ip"), vec!["127.0.0.1"]);
    assert!(seen.one("x-real-ip").is_none());
    assert!(seen.one("forwarded").is_none());

    assert_eq!(spoofing("/v1/auth/user").read().await.text(), "nats");
    let envelope = edge.envelopes().pop().expect("envelope");
    assert_eq!(envelope["actor"]["client_ip"], "127.0.0.1");
    let headers: Vec<(String, String)> =
        serde_json::from_value(envelope["headers"].clone()).expect("pairs");
    let named = |n: &str| {
        let values = headers.iter().filter(|(h, _)| h == n);
        values.map(|(_, v)| v.clone()).collect::<Vec<_>>()
    };
    assert_eq!(named("x-forwarded-for"), vec!["127.0.0.1"]);
    assert!(named("x-real-ip").is_empty() && named("forwarded").is_empty());
    assert!(named("x-aura-client-ip").is_empty());
}

#[tokio::test]
async fn behind_a_trusted_proxy_the_forwarded_client_is_told() {
    let storage = Recorder::start().await;
    let gw = Gateway::with(|c| c.upstreams.storage_url = Some(storage.url.clone()))
        .with(|c| c.rate_limit.trusted_proxies = vec!["127.0.0.0/8".parse().expect("net")])
        .start()
        .await;
    let object = Call::get(gw.data_url("/v1/storage/object/x")).key(TEST_KEY);
    let proxied = object.header("x-forwarded-for", "6.6.6.6, 203.0.113.9");
    proxied.expect(StatusCode::OK).await;
    let seen = storage.last().expect("forwarded");
    assert_eq!(seen.all("x-forwarded-for"), vec!["203.0.113.9"]);
    assert_eq!(seen.all("x-aura-client-ip"), vec!["203.0.113.9"]);
}

#[tokio::test]
async fn a_service_role_key_in_the_url_is_refused_whatever_the_headers_say() {
    let edge = Edge::start(
        "[data_plane.plugins.api_key.config]\nheaders = [\"apikey\", \"x-api-key\", \"x-client-key\"]\n",
    )
    .await;
    let fx = &edge.fx;
    let (anon, service) = (&fx.anon_key, &fx.service_key);
    let sse = "/v1/realtime/sse";
    for (path, header_key) in [
        (format!("{sse}?apikey={service}"), service),
        (format!("{sse}?apikey={service}"), anon),
        (format!("{sse}?apikey={anon}&apikey={service}"), anon),
        (format!("/v1/storage/object/x?apikey={service}"), service),
    ] {
        let r = Call::get(edge.gw.data_url(&path))
            .key(header_key)
            .read()
            .await;
        let body = r.json_or_null();
        assert_eq!(r.status, StatusCode::UNAUTHORIZED, "{path}: {body}");
        assert_eq!(body["error"]["code"], "invalid_api_key", "{path}");
    }
    assert!(edge.realtime.seen().is_empty() && edge.storage.seen().is_empty());
    // An anon key in the URL of a streaming route is still fine.
    let anon_sse = Call::get(edge.gw.data_url(&format!("{sse}?apikey={anon}")));
    assert_eq!(anon_sse.status().await, StatusCode::OK);
    // Every header the api-key stage reads is a credential, never forwarded.
    let object = Call::get(edge.gw.data_url("/v1/storage/object/x"));
    let client_key = object.header("x-client-key", anon).status().await;
    assert_eq!(client_key, StatusCode::OK);
    let seen = edge.storage.last().expect("forwarded");
    let reached = seen.one("x-client-key").is_some();
    assert!(!reached, "the key reached storage");
}

/// The default api-key module declares the path only for a request with a key in the query
/// (`path-with-query-keys`): a key sent in a header is decided once for every path, a key in the
/// query per path. A decision kept for a header key never answers a request that carries a key
/// in the query too, and a query key stays refused on every path that does not accept one.
#[tokio::test]
async fn a_header_keys_decision_serves_every_path_and_query_keys_are_decided_per_path() {
    let edge = Edge::start("").await;
    let anon = &edge.fx.anon_key;
    let stage = |text: &str, outcome: &str| {
        let outcome = format!("outcome=\"{outcome}\"");
        let labels = ["plane=\"data\"", "stage=\"api_key\"", outcome.as_str()];
        metric(text, "aura_decision_cache_total", &labels)
    };
    let before = edge.gw.metrics().await;
    let (misses, hits) = (stage(&before, "miss"), stage(&before, "hit"));
    for n in 0..10 {
        let object = Call::get(edge.gw.data_url(&format!("/v1/storage/object/b/{n}")));
        object.key(anon).expect(StatusCode::OK).await;
    }
    let text = edge.gw.metrics().await;
    assert_eq!(
        stage(&text, "miss") - misses,
        1.0,
        "one decision, ten paths"
    );
    assert!(stage(&text, "hit") - hits >= 9.0, "{text}");
    assert_eq!(edge.storage.seen().len(), 10);

    let (storage_a, storage_b) = ("/v1/storage/object/b/1", "/v1/storage/object/b/2");
    for path in [storage_a, storage_a, storage_b] {
        // The header key's kept decision is not this request's: its query key is refused.
        let with_query = Call::get(edge.gw.data_url(&format!("{path}?apikey={anon}")));
        let r = with_query.key(anon).read().await;
        assert_eq!(r.status, StatusCode::UNAUTHORIZED, "{path}");
        assert_eq!(r.json_or_null()["error"]["code"], "invalid_api_key");
    }
    let sse = Call::get(edge.gw.data_url(&format!("/v1/realtime/sse?apikey={anon}")));
    assert_eq!(sse.status().await, StatusCode::OK, "accepted where it is");
    let text = edge.gw.metrics().await;
    let decided = stage(&text, "miss") - misses;
    assert_eq!(decided, 4.0, "one decision per path with a query key");
    assert_eq!(
        edge.storage.seen().len(),
        10,
        "no refused request reached storage"
    );
}

#[tokio::test]
async fn the_console_token_stays_in_the_gateway_and_targets_are_allow_listed() {
    let edge = Edge::start("").await;
    let console = console_token(edge.fx.admin);
    let as_admin = |path: &str| {
        let call = Call::get(edge.gw.mgmt_url(path)).bearer(&console);
        call.header("x-aura-project", "ded")
    };
    as_admin("/v1/db/todos?select=*")
        .expect(StatusCode::OK)
        .await;
    let seen = edge.postgrest.last().expect("forwarded to ded's PostgREST");
    let reached = seen.one("authorization").is_some();
    assert!(!reached, "the console token reached PostgREST");
    assert_eq!(seen.one("x-aura-org-role").as_deref(), Some("admin"));
    // Over NATS the console token is still the backend's to see.
    assert_eq!(as_admin("/v1/db/sql").status().await, StatusCode::OK);

    // A dedicated target outside upstreams.postgrest_allowed_targets is never called.
    let started = Instant::now();
    let far = format!("{}_far", edge.ded_key);
    let todos = Call::get(edge.gw.data_url("/v1/db/todos")).key(far);
    let r = todos.expect(StatusCode::SERVICE_UNAVAILABLE).await;
    assert_eq!(r.code(), "db_target_not_allowed");
    let tried = started.elapsed() >= Duration::from_secs(1);
    assert!(!tried, "no connection was tried");

    // A path parameter that is not UTF-8 once decoded: the contract's JSON error.
    let bearer = format!("Bearer {console}");
    let raw = get(
        "/v1/projects/alpha/policies/%FF",
        &[("authorization", &bearer)],
    );
    let answer = edge.mgmt(raw).await;
    assert_eq!(status_of(&answer), 400, "{answer}");
    assert!(answer.contains("application/json"), "{answer}");
    assert!(answer.contains("\"invalid_path\""), "{answer}");
}

#[tokio::test]
async fn websocket_tunnels_hold_their_connection_slot_and_end_within_the_grace() {
    let realtime = websocket_echo().await;
    let gw = Gateway::with(|c| c.upstreams.realtime_url = Some(realtime))
        .with(|c| (c.server.max_connections, c.server.shutdown_grace_secs) = (2, 1))
        .start()
        .await;
    let url = format!("ws://{}/v1/realtime/websocket?apikey={TEST_KEY}", gw.data);
    let (first, _) = tokio_tungstenite::connect_async(&url)
        .await
        .expect("tunnel 1");
    let (mut second, _) = tokio_tungstenite::connect_async(&url)
        .await
        .expect("tunnel 2");
    // Both slots are held by open tunnels: a third connection waits in the backlog.
    let health = gw.data_url("/health");
    let third = tokio::spawn(async move {
        let started = Instant::now();
        let r = Call::get(&health).try_send().await;
        (r.map(|r| r.status()), started.elapsed())
    });
    tokio::time::sleep(Duration::from_millis(800)).await;
    let served = third.is_finished();
    assert!(
        !served,
        "a third connection was served while two tunnels were open"
    );
    drop(first);
    let third = tokio::time::timeout(Duration::from_secs(5), third).await;
    let (status, waited) = third.expect("served once a tunnel ended").expect("task");
    assert_eq!(status.expect("answered"), StatusCode::OK);
    assert!(waited >= Duration::from_millis(700), "{waited:?}");

    // Shutdown: the open tunnel ends within the grace (1 s).
    let started = Instant::now();
    let shutdown = tokio::spawn(gw.shutdown());
    let ended = tokio::time::timeout(Duration::from_secs(5), async {
        while let Some(Ok(_)) = second.next().await {}
    })
    .await;
    assert!(ended.is_ok(), "the tunnel outlived the shutdown grace");
    let took = started.elapsed();
    shutdown.await.expect("shut down");
    println!("tunnel closed {took:?} after shutdown began (grace 1 s)");
    assert!(took < Duration::from_secs(3), "{took:?}");
}

#[tokio::test]
async fn a_slow_jwks_fetch_never_holds_a_request() {
    use jsonwebtoken::{Algorithm, EncodingKey, Header};
    let fixture = |name: &str| {
        let path = format!("{}/../tests/fixtures/{name}", env!("CARGO_MANIFEST_DIR"));
        std::fs::read(path).expect("fixture")
    };
    let jwks: serde_json::Value =
        serde_json::from_slice(&fixture("jwks.json")).expect("jwks fixture");
    let fetches = Arc::new(AtomicUsize::new(0));
    let count = fetches.clone();
    let serve_jwks = axum::routing::get(move || {
        let n = count.fetch_add(1, Ordering::SeqCst);
        let jwks = jwks.clone();
        async move {
            if n > 0 {
                // Every fetch after the first hangs.
                tokio::time::sleep(Duration::from_secs(30)).await;
            }
            axum::Json(jwks)
        }
    });
    let app = axum::Router::new().route("/jwks.json", serve_jwks);
    let addr = crate::support::upstream::serve_http(app).await;
    let fx = Fixture::new();
    let storage = Recorder::start().await;
    let gw = Gateway::with(|c| c.upstreams.storage_url = Some(storage.url.clone()))
        .with(|c| {
            let jwt = &mut c.auth.user_jwt;
            jwt.jwks_url = Some(format!("http://{addr}/jwks.json"));
            (jwt.jwks_max_age_secs, jwt.jwks_refresh_cooldown_secs) = (Some(1), Some(1));
        })
        .fixture(&fx)
        .start()
        .await;
    let rsa = EncodingKey::from_rsa_pem(&fixture("rsa_private.pem")).expect("rsa key");
    let mut header = Header::new(Algorithm::RS256);
    header.kid = Some("rsa-1".into());
    let token = jsonwebtoken::encode(
        &header,
        &json!({ "sub": Uuid::new_v4().to_string(), "aud": "authenticated", "ref": "alpha", "exp": crate::support::fixture::epoch() + 600 }),
        &rsa,
    )
    .expect("token");
    let call = || {
        let object = Call::get(gw.data_url("/v1/storage/object/x")).key(&fx.anon_key);
        object.bearer(&token).status()
    };
    assert_eq!(call().await, StatusCode::OK);
    // The set is now stale: the next fetch starts and hangs; requests keep the last good keys.
    tokio::time::sleep(Duration::from_millis(1_200)).await;
    let mut slowest = Duration::ZERO;
    for _ in 0..5 {
        let started = Instant::now();
        assert_eq!(call().await, StatusCode::OK);
        slowest = slowest.max(started.elapsed());
    }
    println!("slowest request while the JWKS fetch hangs: {slowest:?}");
    assert!(fetches.load(Ordering::SeqCst) >= 2, "a refresh was started");
    let waited = slowest >= Duration::from_secs(1);
    assert!(!waited, "a request waited for the fetch: {slowest:?}");
}

#[tokio::test]
async fn stage_inputs_larger_than_the_plugins_arena_are_served_and_leave_it_usable() {
    // The default plugins serve a call's blocks from a 16 KiB region and anything larger from
    // their system allocator: a client decides how large the `apikey` and `Origin` values the
    // stages receive are (up to `server.max_header_bytes`).
    let edge = Edge::start("").await;
    let client = reqwest::Client::new();
    let url = edge.gw.data_url("/v1/storage/object/x");
    let object = |key: &str| client.get(&url).call().key(key);
    let huge_key = format!("aura_pk_{}", "k".repeat(40 * 1024));
    let huge_origin = format!("https://{}.example", "o".repeat(20 * 1024));
    for round in 0..20 {
        // A key bigger than the region: extracted from the system allocator, then unknown.
        let r = object(&huge_key).read().await;
        assert_eq!(r.status, StatusCode::UNAUTHORIZED, "round {round}");
        let body = r.text();
        assert!(
            body.contains("\"invalid_api_key\""),
            "round {round}: {body}"
        );
        // An origin bigger than the region, with a valid key: the CORS stage answers for it.
        let r = object(&edge.fx.anon_key).origin(&huge_origin).read().await;
        assert_eq!(r.status, StatusCode::OK, "round {round}");
        let allowed = &r.headers["access-control-allow-origin"];
        assert_eq!(
            allowed, "*",
            "round {round}: the data plane allows any origin"
        );
        // And the same instances keep answering ordinary requests from their region.
        let r = object(&edge.fx.anon_key)
            .origin("https://app.example.com")
            .read()
            .await;
        assert_eq!(r.status, StatusCode::OK, "round {round}");
        assert_eq!(r.headers["access-control-allow-origin"], "*");
    }
    let forwarded = edge.storage.seen().len();
    assert_eq!(forwarded, 40, "every keyed request forwarded");
}

/// A hostile NATS backend's replies, through the binary: each reply is parsed with its strings
/// borrowed where the JSON did not escape them, so escapes must still be read exactly, values
/// that are not visible ASCII (a header injection among them) refused, and framing headers
/// dropped, and a reply listing more headers than an answer may carry refused rather than
/// overflowing the header map; the gateway keeps serving after each refusal.
#[tokio::test]
async fn a_hostile_nats_reply_is_read_exactly_or_refused_and_its_framing_headers_dropped() {
    let edge = Edge::start("").await;
    let _hostile = edge
        .gw
        .bus
        .respond("ai", |envelope| {
            let reply: &'static str = match envelope["path"].as_str() {
                // Escapes in a name, in a value and in the body (`\/` in the base64 of "hi?"),
                // and framing headers a backend has no say over.
                Some("/v1/ai/escaped") => {
                    r#"{"status":201,"headers":[["x-plain","a b"],["x\u002descaped","say \"hi\"\tnow"],["content-length","999"],["transfer-encoding","chunked"]],"body":"aGk\/"}"#
                }
                Some("/v1/ai/escaped-beyond-ascii") => {
                    r#"{"status":200,"headers":[["x-a","caf\u00e9"]]}"#
                }
                Some("/v1/ai/beyond-ascii") => "{\"status\":200,\"headers\":[[\"x-a\",\"caf\u{e9}\"]]}",
                Some("/v1/ai/nul") => r#"{"status":200,"headers":[["x-a","a\u0000b"]]}"#,
                Some("/v1/ai/injection") => {
                    r#"{"status":200,"headers":[["x-a","a\r\nx-injected: 1"]]}"#
                }
                // More headers than a header map can hold.
                Some("/v1/ai/flood") => {
                    let pairs = vec![r#"["x-a","1"]"#; 40_000].join(",");
                    return bytes::Bytes::from(format!(r#"{{"status":200,"headers":[{pairs}]}}"#));
                }
                _ => r#"{"status":200,"body":"b2s="}"#,
            };
            bytes::Bytes::from_static(reply.as_bytes())
        })
        .await;
    let call = |path: &str| edge.data(get(path, &[("apikey", &edge.fx.anon_key)]));

    let answer = call("/v1/ai/escaped").await;
    assert_eq!(status_of(&answer), 201, "{answer}");
    let (head, body) = answer.split_once("\r\n\r\n").expect("a head and a body");
    let lines: Vec<&str> = head.lines().collect();
    assert!(lines.contains(&"x-plain: a b"), "{head}");
    assert!(lines.contains(&"x-escaped: say \"hi\"\tnow"), "{head}");
    assert_eq!(body, "hi?");
    let framing = |l: &&&str| l.starts_with("content-length") || l.starts_with("transfer-encoding");
    let framing: Vec<&&str> = lines.iter().filter(framing).collect();
    assert_eq!(framing, [&"content-length: 3"], "{head}");

    for path in [
        "/v1/ai/escaped-beyond-ascii",
        "/v1/ai/beyond-ascii",
        "/v1/ai/nul",
        "/v1/ai/injection",
        "/v1/ai/flood",
    ] {
        let answer = call(path).await;
        assert_eq!(status_of(&answer), 502, "{path}: {answer}");
        assert!(answer.contains("\"bad_backend_reply\""), "{path}: {answer}");
        assert!(!answer.contains("x-injected"), "{path}: {answer}");
        let answer = call("/v1/ai/ok").await;
        assert_eq!(status_of(&answer), 200, "after {path}: {answer}");
        assert!(answer.ends_with("\r\n\r\nok"), "after {path}: {answer}");
    }
}
