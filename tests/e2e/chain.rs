//! The chain's order, proven on the routers without sockets.

use aura_gateway::config::Config;
use aura_gateway::planes::chain::PlaneService;
use aura_gateway::planes::{build_data_plane_router, build_management_plane_router};
use aura_gateway::state::AppState;
use axum::body::Body;
use http::{Request, Response, StatusCode};
use tower::ServiceExt;

use crate::support::SECURITY_HEADERS;
use crate::support::config::test_config;
use crate::support::fixture::console_token;
use crate::support::records::{TEST_CONSOLE_USER, TEST_KEY, e2e_store};

async fn state(config: Config) -> AppState {
    let store = std::sync::Arc::new(e2e_store());
    AppState::build_with_store(config, None, store)
        .await
        .expect("state")
}

/// The state of a gateway with [`config`], and its data plane.
async fn data_plane() -> (AppState, PlaneService) {
    let state = state(config()).await;
    let router = build_data_plane_router(state.clone());
    (state, router)
}

/// Credentials of the standard e2e records for `router`'s plane.
fn credentials(data_plane: bool) -> (&'static str, String) {
    if data_plane {
        ("apikey", TEST_KEY.to_owned())
    } else {
        let user = uuid::Uuid::parse_str(TEST_CONSOLE_USER).expect("uuid");
        ("authorization", format!("Bearer {}", console_token(user)))
    }
}

fn config() -> Config {
    // Nothing listens there: these tests never reach a backend.
    let mut c = test_config("nats://127.0.0.1:1", "chain");
    c.server.max_body_bytes = 1024;
    c.management_plane.plugins.cors.config =
        serde_json::json!({ "allow_origins": ["https://studio.example"] });
    c
}

/// `method path` with `headers` and `body`.
fn request(method: &str, path: &str, headers: &[(&str, &str)], body: Body) -> Request<Body> {
    let mut request = Request::builder().method(method).uri(path);
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    request.body(body).expect("request")
}

/// `GET path` with `headers`.
fn get(path: &str, headers: &[(&str, &str)]) -> Request<Body> {
    request("GET", path, headers, Body::empty())
}

async fn send(router: &PlaneService, request: Request<Body>) -> Response<Body> {
    router.clone().oneshot(request).await.expect("infallible")
}

fn assert_edge_headers(response: &Response<Body>) {
    for h in SECURITY_HEADERS {
        let present = response.headers().contains_key(*h);
        assert!(present, "missing {h}: {response:?}");
    }
    let id = response
        .headers()
        .get("x-request-id")
        .expect("x-request-id");
    let id = id.to_str().expect("ascii");
    assert_eq!(id.len(), 32, "{id}");
    assert!(id.bytes().all(|b| b.is_ascii_hexdigit()), "{id}");
}

async fn json(response: Response<Body>) -> serde_json::Value {
    let body = axum::body::to_bytes(response.into_body(), 1 << 20).await;
    serde_json::from_slice(&body.expect("body")).expect("JSON body")
}

fn requests_counted(state: &AppState, status: &str) -> bool {
    let status = format!("status=\"{status}\"");
    let text = state.metrics.render();
    text.lines()
        .any(|l| l.starts_with("aura_http_requests_total") && l.contains(&status))
}

/// Whether `response` allows a credentialed CORS request.
fn allows_credentials(response: &Response<Body>) -> bool {
    response
        .headers()
        .contains_key("access-control-allow-credentials")
}

#[tokio::test]
async fn a_preflight_is_answered_before_any_inner_layer_runs() {
    let (state, router) = data_plane().await;
    // A body limit, metrics or metrics auth running first would answer 413, count, or 401.
    let preflight = [
        ("origin", "https://app.example"),
        ("access-control-request-method", "GET"),
        ("content-length", "999999"),
    ];
    let preflight = request("OPTIONS", "/metrics", &preflight, Body::empty());
    let response = send(&router, preflight).await;
    assert_eq!(response.status(), StatusCode::NO_CONTENT);
    assert_eq!(response.headers()["access-control-allow-origin"], "*");
    assert!(!allows_credentials(&response));
    assert_edge_headers(&response);
    let counted = requests_counted(&state, "204");
    assert!(!counted, "metrics layer must not see a preflight");
}

#[tokio::test]
async fn an_error_made_by_the_innermost_layer_carries_every_outer_header() {
    let (state, router) = data_plane().await;
    let metrics = get("/metrics", &[("origin", "https://app.example")]);
    let response = send(&router, metrics).await;
    assert_eq!(response.status(), StatusCode::UNAUTHORIZED);
    assert_eq!(response.headers()["access-control-allow-origin"], "*");
    let exposed = response.headers()["access-control-expose-headers"].to_str();
    assert!(exposed.expect("ascii").contains("x-request-id"));
    assert_edge_headers(&response);
    let counted = requests_counted(&state, "401");
    assert!(counted, "metrics sit outside metrics auth");
    let code = json(response).await["error"]["code"].clone();
    assert_eq!(code, "invalid_metrics_token");
}

#[tokio::test]
async fn the_body_limit_runs_before_metrics_and_auth_and_still_gets_an_id() {
    let (state, router) = data_plane().await;
    let body = Body::from(vec![0u8; 4096]);
    let origin = ("origin", "https://app.example");
    let oversized = request(
        "POST",
        "/metrics",
        &[origin, ("content-length", "4096")],
        body,
    );
    let response = send(&router, oversized).await;
    assert_eq!(response.status(), StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(response.headers()["access-control-allow-origin"], "*");
    assert_edge_headers(&response);
    let counted = requests_counted(&state, "413");
    assert!(!counted, "metrics sit inside the body limit");
    assert_eq!(json(response).await["error"]["code"], "payload_too_large");
}

#[tokio::test]
async fn metrics_need_the_bearer_token() {
    let (_state, router) = data_plane().await;
    let with_token = |token: &str| {
        let bearer = format!("Bearer {token}");
        get("/metrics", &[("authorization", bearer.as_str())])
    };
    let response = send(&router, with_token("test-metrics-token-0123456789")).await;
    assert_eq!(response.status(), StatusCode::OK);
    let wrong = send(&router, with_token("test-metrics-token-0123456780")).await;
    assert_eq!(wrong.status(), StatusCode::UNAUTHORIZED);
    let mut no_token = config();
    no_token.metrics.token = None;
    let router = build_data_plane_router(self::state(no_token).await);
    let response = send(&router, get("/metrics", &[])).await;
    assert_eq!(response.status(), StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn client_request_ids_are_replaced_by_fresh_ones() {
    let router = build_data_plane_router(state(config()).await);
    let mut seen = std::collections::HashSet::new();
    for _ in 0..20 {
        let chosen = get("/health", &[("x-request-id", "chosen-by-client")]);
        let response = send(&router, chosen).await;
        assert_edge_headers(&response);
        let id = response.headers()["x-request-id"].to_str().expect("ascii");
        let id = id.to_owned();
        assert_ne!(id, "chosen-by-client");
        assert!(seen.insert(id), "ids are unique");
    }
}

#[tokio::test]
async fn unknown_routes_and_methods_get_json_errors_with_headers_on_both_planes() {
    let state = state(config()).await;
    for (data_plane, router) in [
        (true, build_data_plane_router(state.clone())),
        (false, build_management_plane_router(state.clone())),
    ] {
        let (name, value) = credentials(data_plane);
        let credential = [(name, value.as_str())];
        for (method, path, status, code) in [
            ("GET", "/nope", StatusCode::NOT_FOUND, "not_found"),
            (
                "DELETE",
                "/health",
                StatusCode::METHOD_NOT_ALLOWED,
                "method_not_allowed",
            ),
        ] {
            let response = send(&router, request(method, path, &credential, Body::empty())).await;
            assert_eq!(response.status(), status);
            assert_edge_headers(&response);
            assert_eq!(json(response).await["error"]["code"], code);
        }
    }
}

#[tokio::test]
async fn management_cors_allows_only_listed_origins() {
    let router = build_management_plane_router(state(config()).await);
    let preflight = |origin: &str| {
        let headers = [("origin", origin), ("access-control-request-method", "GET")];
        request("OPTIONS", "/v1/projects/abc", &headers, Body::empty())
    };
    let denied = send(&router, preflight("https://evil.example")).await;
    assert!(!denied.headers().contains_key("access-control-allow-origin"));
    assert_eq!(denied.status(), StatusCode::FORBIDDEN);
    assert_edge_headers(&denied);
    let allowed = send(&router, preflight("https://studio.example")).await;
    assert_eq!(allowed.status(), StatusCode::NO_CONTENT);
    let origin = &allowed.headers()["access-control-allow-origin"];
    assert_eq!(origin, "https://studio.example");
    assert_eq!(allowed.headers()["vary"], "origin");
    let actual = send(
        &router,
        get("/health", &[("origin", "https://evil.example")]),
    )
    .await;
    assert_eq!(actual.status(), StatusCode::OK);
    assert!(!actual.headers().contains_key("access-control-allow-origin"));
}

#[tokio::test]
async fn the_data_plane_allows_any_origin_without_credentials() {
    let router = build_data_plane_router(state(config()).await);
    let anything = get("/health", &[("origin", "https://anything.example")]);
    let response = send(&router, anything).await;
    assert_eq!(response.headers()["access-control-allow-origin"], "*");
    assert!(!allows_credentials(&response));
}

#[tokio::test]
async fn errors_the_gateway_answers_are_counted_by_the_side_that_failed() {
    let (state, router) = data_plane().await;
    let errors = |side: &str, code: &str| {
        let (side, code) = (format!("side=\"{side}\""), format!("code=\"{code}\""));
        let text = state.metrics.render();
        let counted = |l: &&str| l.starts_with("aura_errors_total") && l.contains("plane=\"data\"");
        text.lines()
            .filter(counted)
            .any(|l| l.contains(&side) && l.contains(&code))
    };
    // The client's fault: no API key.
    let response = send(&router, get("/v1/storage/object/a", &[])).await;
    assert_eq!(response.status(), StatusCode::UNAUTHORIZED);
    assert!(errors("client", "missing_api_key"));
    // The backend's: nothing listens where the NATS services are.
    let (name, value) = credentials(true);
    let response = send(&router, get("/v1/functions/f", &[(name, &value)])).await;
    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    let code = json(response).await["error"]["code"].clone();
    let code = code.as_str().expect("a code").to_owned();
    let counted = errors("upstream", &code);
    assert!(counted, "{code}: {}", state.metrics.render());
    // A success is not an error.
    let response = send(&router, get("/health", &[])).await;
    assert_eq!(response.status(), StatusCode::OK);
    assert!(!state.metrics.render().contains("code=\"-\""));
}
