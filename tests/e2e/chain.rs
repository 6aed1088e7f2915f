//! The chain's order, proven on the routers without sockets.

use aura_gateway::config::Config;
use aura_gateway::planes::chain::PlaneService;
use aura_gateway::planes::{build_data_plane_router, build_management_plane_router};
use aura_gateway::state::AppState;
use axum::body::Body;
use http::{Request, Response, StatusCode};
use tower::ServiceExt;

use crate::support::SECURITY_HEADERS;

async fn state(config: Config) -> AppState {
    let store = std::sync::Arc::new(crate::support::gateway::e2e_store());
    AppState::build_with_store(config, None, store)
        .await
        .expect("state")
}

/// Credentials of the standard e2e records for `router`'s plane.
fn credentials(data_plane: bool) -> (&'static str, String) {
    if data_plane {
        ("apikey", crate::support::gateway::TEST_KEY.to_owned())
    } else {
        let user = uuid::Uuid::parse_str(crate::support::gateway::TEST_CONSOLE_USER).expect("uuid");
        (
            "authorization",
            format!("Bearer {}", crate::support::fixture::console_token(user)),
        )
    }
}

fn config() -> Config {
    // Nothing listens there: these tests never reach a backend.
    let mut c = crate::support::gateway::test_config("nats://127.0.0.1:1", "chain");
    c.server.max_body_bytes = 1024;
    c.management_plane.plugins.cors.config =
        serde_json::json!({ "allow_origins": ["https://studio.example"] });
    c
}

async fn send(router: &PlaneService, request: Request<Body>) -> Response<Body> {
    router.clone().oneshot(request).await.expect("infallible")
}

fn assert_edge_headers(response: &Response<Body>) {
    for h in SECURITY_HEADERS {
        assert!(
            response.headers().contains_key(*h),
            "missing {h}: {response:?}"
        );
    }
    let id = response
        .headers()
        .get("x-request-id")
        .expect("x-request-id")
        .to_str()
        .expect("ascii");
    assert_eq!(id.len(), 32, "{id}");
    assert!(id.bytes().all(|b| b.is_ascii_hexdigit()), "{id}");
}

async fn json(response: Response<Body>) -> serde_json::Value {
    let body = axum::body::to_bytes(response.into_body(), 1 << 20)
        .await
        .expect("body");
    serde_json::from_slice(&body).expect("JSON body")
}

fn requests_counted(state: &AppState, status: &str) -> bool {
    state.metrics.render().lines().any(|l| {
        l.starts_with("aura_http_requests_total") && l.contains(&format!("status=\"{status}\""))
    })
}

#[tokio::test]
async fn a_preflight_is_answered_before_any_inner_layer_runs() {
    let state = state(config()).await;
    let router = build_data_plane_router(state.clone());
    // A body limit, metrics or metrics auth running first would answer 413, count, or 401.
    let response = send(
        &router,
        Request::options("/metrics")
            .header("origin", "https://app.example")
            .header("access-control-request-method", "GET")
            .header("content-length", "999999")
            .body(Body::empty())
            .expect("request"),
    )
    .await;
    assert_eq!(response.status(), StatusCode::NO_CONTENT);
    assert_eq!(response.headers()["access-control-allow-origin"], "*");
    assert!(
        !response
            .headers()
            .contains_key("access-control-allow-credentials")
    );
    assert_edge_headers(&response);
    assert!(
        !requests_counted(&state, "204"),
        "metrics layer must not see a preflight"
    );
}

#[tokio::test]
async fn an_error_made_by_the_innermost_layer_carries_every_outer_header() {
    let state = state(config()).await;
    let router = build_data_plane_router(state.clone());
    let response = send(
        &router,
        Request::get("/metrics")
            .header("origin", "https://app.example")
            .body(Body::empty())
            .expect("request"),
    )
    .await;
    assert_eq!(response.status(), StatusCode::UNAUTHORIZED);
    assert_eq!(response.headers()["access-control-allow-origin"], "*");
    assert!(
        response.headers()["access-control-expose-headers"]
            .to_str()
            .expect("ascii")
            .contains("x-request-id")
    );
    assert_edge_headers(&response);
    assert!(
        requests_counted(&state, "401"),
        "metrics sit outside metrics auth"
    );
    assert_eq!(
        json(response).await["error"]["code"],
        "invalid_metrics_token"
    );
}

#[tokio::test]
async fn the_body_limit_runs_before_metrics_and_auth_and_still_gets_an_id() {
    let state = state(config()).await;
    let router = build_data_plane_router(state.clone());
    let response = send(
        &router,
        Request::post("/metrics")
            .header("origin", "https://app.example")
            .header("content-length", "4096")
            .body(Body::from(vec![0u8; 4096]))
            .expect("request"),
    )
    .await;
    assert_eq!(response.status(), StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(response.headers()["access-control-allow-origin"], "*");
    assert_edge_headers(&response);
    assert!(
        !requests_counted(&state, "413"),
        "metrics sit inside the body limit"
    );
    assert_eq!(json(response).await["error"]["code"], "payload_too_large");
}

#[tokio::test]
async fn metrics_need_the_bearer_token() {
    let state = state(config()).await;
    let router = build_data_plane_router(state.clone());
    let response = send(
        &router,
        Request::get("/metrics")
            .header("authorization", "Bearer test-metrics-token-0123456789")
            .body(Body::empty())
            .expect("request"),
    )
    .await;
    assert_eq!(response.status(), StatusCode::OK);
    let wrong = send(
        &router,
        Request::get("/metrics")
            .header("authorization", "Bearer test-metrics-token-0123456780")
            .body(Body::empty())
            .expect("request"),
    )
    .await;
    assert_eq!(wrong.status(), StatusCode::UNAUTHORIZED);
    let mut no_token = config();
    no_token.metrics.token = None;
    let router = build_data_plane_router(self::state(no_token).await);
    let response = send(
        &router,
        Request::get("/metrics")
            .body(Body::empty())
            .expect("request"),
    )
    .await;
    assert_eq!(response.status(), StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn client_request_ids_are_replaced_by_fresh_ones() {
    let router = build_data_plane_router(state(config()).await);
    let mut seen = std::collections::HashSet::new();
    for _ in 0..20 {
        let response = send(
            &router,
            Request::get("/health")
                .header("x-request-id", "chosen-by-client")
                .body(Body::empty())
                .expect("request"),
        )
        .await;
        assert_edge_headers(&response);
        let id = response.headers()["x-request-id"]
            .to_str()
            .expect("ascii")
            .to_owned();
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
        let request = |method: &str, path: &str| {
            Request::builder()
                .method(method)
                .uri(path)
                .header(name, value.as_str())
                .body(Body::empty())
                .expect("request")
        };
        let response = send(&router, request("GET", "/nope")).await;
        assert_eq!(response.status(), StatusCode::NOT_FOUND);
        assert_edge_headers(&response);
        assert_eq!(json(response).await["error"]["code"], "not_found");
        let response = send(&router, request("DELETE", "/health")).await;
        assert_eq!(response.status(), StatusCode::METHOD_NOT_ALLOWED);
        assert_edge_headers(&response);
        assert_eq!(json(response).await["error"]["code"], "method_not_allowed");
    }
}

#[tokio::test]
async fn management_cors_allows_only_listed_origins() {
    let router = build_management_plane_router(state(config()).await);
    let preflight = |origin: &str| {
        Request::options("/v1/projects/abc")
            .header("origin", origin)
            .header("access-control-request-method", "GET")
            .body(Body::empty())
            .expect("request")
    };
    let denied = send(&router, preflight("https://evil.example")).await;
    assert!(!denied.headers().contains_key("access-control-allow-origin"));
    assert_eq!(denied.status(), StatusCode::FORBIDDEN);
    assert_edge_headers(&denied);
    let allowed = send(&router, preflight("https://studio.example")).await;
    assert_eq!(allowed.status(), StatusCode::NO_CONTENT);
    assert_eq!(
        allowed.headers()["access-control-allow-origin"],
        "https://studio.example"
    );
    assert_eq!(allowed.headers()["vary"], "origin");
    let actual = send(
        &router,
        Request::get("/health")
            .header("origin", "https://evil.example")
            .body(Body::empty())
            .expect("request"),
    )
    .await;
    assert_eq!(actual.status(), StatusCode::OK);
    assert!(!actual.headers().contains_key("access-control-allow-origin"));
}

#[tokio::test]
async fn the_data_plane_allows_any_origin_without_credentials() {
    let router = build_data_plane_router(state(config()).await);
    let response = send(
        &router,
        Request::get("/health")
            .header("origin", "https://anything.example")
            .body(Body::empty())
            .expect("request"),
    )
    .await;
    assert_eq!(response.headers()["access-control-allow-origin"], "*");
    assert!(
        !response
            .headers()
            .contains_key("access-control-allow-credentials")
    );
}

#[tokio::test]
async fn errors_the_gateway_answers_are_counted_by_the_side_that_failed() {
    let state = state(config()).await;
    let router = build_data_plane_router(state.clone());
    let errors = |side: &str, code: &str| {
        state.metrics.render().lines().any(|l| {
            l.starts_with("aura_errors_total")
                && l.contains("plane=\"data\"")
                && l.contains(&format!("side=\"{side}\""))
                && l.contains(&format!("code=\"{code}\""))
        })
    };
    // The client's fault: no API key.
    let response = send(
        &router,
        Request::get("/v1/storage/object/a")
            .body(Body::empty())
            .expect("request"),
    )
    .await;
    assert_eq!(response.status(), StatusCode::UNAUTHORIZED);
    assert!(errors("client", "missing_api_key"));
    // The backend's: nothing listens where the NATS services are.
    let (name, value) = credentials(true);
    let response = send(
        &router,
        Request::get("/v1/functions/f")
            .header(name, value)
            .body(Body::empty())
            .expect("request"),
    )
    .await;
    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    let code = json(response).await["error"]["code"]
        .as_str()
        .expect("a code")
        .to_owned();
    assert!(
        errors("upstream", &code),
        "{code}: {}",
        state.metrics.render()
    );
    // A success is not an error.
    let response = send(
        &router,
        Request::get("/health")
            .body(Body::empty())
            .expect("request"),
    )
    .await;
    assert_eq!(response.status(), StatusCode::OK);
    assert!(!state.metrics.render().contains("code=\"-\""));
}
