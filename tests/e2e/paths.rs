//! Request paths, through the real binary: dot segments, encoded separators and dot segments
//! with parameters (`..;`) are refused `400 invalid_path` and never reach a backend; dot
//! segments inside a service's own path are resolved before routing.

use reqwest::StatusCode;

use crate::support::builder::{Gateway, Started};
use crate::support::call::Call;
use crate::support::edge::Edge;
use crate::support::metrics::metric;
use crate::support::raw::{exchange, status_of};
use crate::support::upstream::Recorder;

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

/// `..;` is `..` to backends that strip path parameters (Tomcat, Jetty, Spring); it reached
/// them. Such a segment is `400 invalid_path` now, and nothing is forwarded.
#[tokio::test]
async fn dot_segments_with_parameters_never_reach_a_backend() {
    let storage = Recorder::start().await;
    let upstreams = format!("[upstreams]\nstorage_url = \"{}\"\n", storage.url);
    let Started { gw, fx, dir: _dir } = Gateway::builder().toml(upstreams).binary();
    for path in [
        "/v1/storage/object/..;/..;/admin",
        "/v1/storage/object/a/..;jsessionid=x/b",
        "/v1/storage/object/.;/b",
        "/v1/storage/object/a/..%3B/b",
    ] {
        let key = &fx.anon_key;
        let raw = format!(
            "GET {path} HTTP/1.1\r\nhost: gw\r\napikey: {key}\r\nconnection: close\r\n\r\n"
        );
        let answer = exchange(gw.port, raw).await;
        assert!(answer.starts_with("HTTP/1.1 400"), "{path}: {answer}");
        assert!(answer.contains("invalid_path"), "{path}: {answer}");
    }
    assert!(storage.seen().is_empty(), "{:?}", storage.seen());
    // A parameter that is not on a dot segment is the backend's business.
    let object = Call::get(gw.data_url("/v1/storage/object/a;v=1/b")).key(&fx.anon_key);
    object.expect(StatusCode::OK).await;
}
