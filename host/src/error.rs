//! The gateway's error type and its one mapping to the contract's JSON responses.
//!
//! Every error the gateway makes itself says what failed, which side failed (client, upstream,
//! plugin, gateway) and whether the client may retry; [`GatewayError::into_response`] is the only
//! place that turns one into HTTP: `{"error": {"code": "<snake_case>", "message": "<text>"}}`.

use std::time::Duration;

use axum::response::{IntoResponse, Response};
use http::{HeaderValue, StatusCode, header};

/// Which side of the gateway a failure comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    /// The request itself is wrong or not allowed.
    Client,
    /// A backend failed, is unreachable or too slow.
    Upstream,
    /// A policy plugin failed (trap, deadline, memory).
    Plugin,
    /// The gateway itself (configuration, overload, shutdown).
    Gateway,
}

impl Side {
    /// The side as the access log and the metrics name it.
    pub const fn as_str(self) -> &'static str {
        match self {
            Side::Client => "client",
            Side::Upstream => "upstream",
            Side::Plugin => "plugin",
            Side::Gateway => "gateway",
        }
    }
}

/// An error answered by the gateway.
#[derive(Debug, Clone)]
pub struct GatewayError {
    /// HTTP status.
    pub status: StatusCode,
    /// Stable snake_case code.
    pub code: &'static str,
    /// Human-readable message; never contains credentials.
    pub message: String,
    /// Which side failed.
    pub side: Side,
    /// Whether the same request may be retried as is.
    pub retryable: bool,
    /// `Retry-After`, when the client should wait.
    pub retry_after: Option<Duration>,
}

impl GatewayError {
    /// An error with its status, code, message and the side that failed.
    pub fn new(
        status: StatusCode,
        code: &'static str,
        message: impl Into<String>,
        side: Side,
    ) -> Self {
        Self {
            status,
            code,
            message: message.into(),
            side,
            retryable: false,
            retry_after: None,
        }
    }

    /// Marks the error as retryable.
    pub fn retryable(mut self) -> Self {
        self.retryable = true;
        self
    }

    /// Adds a `Retry-After` header.
    pub fn retry_after(mut self, after: Duration) -> Self {
        self.retry_after = Some(after);
        self.retryable = true;
        self
    }

    /// 400: the request is malformed.
    pub fn bad_request(code: &'static str, message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, code, message, Side::Client)
    }

    /// 401: missing or invalid credentials.
    pub fn unauthorized(code: &'static str, message: impl Into<String>) -> Self {
        Self::new(StatusCode::UNAUTHORIZED, code, message, Side::Client)
    }

    /// 403: authenticated but not allowed.
    pub fn forbidden(code: &'static str, message: impl Into<String>) -> Self {
        Self::new(StatusCode::FORBIDDEN, code, message, Side::Client)
    }

    /// 404: no such route or resource.
    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, "not_found", message, Side::Client)
    }

    /// 405: the route exists, not with this method.
    pub fn method_not_allowed() -> Self {
        Self::new(
            StatusCode::METHOD_NOT_ALLOWED,
            "method_not_allowed",
            "method not allowed on this route",
            Side::Client,
        )
    }

    /// 409: the request conflicts with how the gateway runs.
    pub fn conflict(code: &'static str, message: impl Into<String>) -> Self {
        Self::new(StatusCode::CONFLICT, code, message, Side::Client)
    }

    /// `431 request_headers_too_large`: the request head is over `server.max_header_bytes`.
    pub fn headers_too_large(message: impl Into<String>) -> Self {
        Self::new(
            StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            "request_headers_too_large",
            message,
            Side::Client,
        )
    }

    /// `413 payload_too_large`: the request body is over a limit.
    pub fn payload_too_large(message: impl Into<String>) -> Self {
        Self::too_large("payload_too_large", message)
    }

    /// 413 with its own code: a part of the body is over its limit (`config_too_large`).
    pub fn too_large(code: &'static str, message: impl Into<String>) -> Self {
        Self::new(StatusCode::PAYLOAD_TOO_LARGE, code, message, Side::Client)
    }

    /// 429: over a rate limit; retry after `wait`.
    pub fn rate_limited(wait: Duration) -> Self {
        Self::new(
            StatusCode::TOO_MANY_REQUESTS,
            "rate_limited",
            "too many requests; slow down",
            Side::Client,
        )
        .retry_after(wait)
    }

    /// 500: a policy plugin failed; the request fails closed.
    pub fn policy_failed(stage: &str) -> Self {
        Self::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "policy_failed",
            format!("the {stage} policy stage failed; the request was refused"),
            Side::Plugin,
        )
        .retryable()
    }

    /// 503: a project's policy modules are saturated (its concurrency cap or the tenant pool);
    /// the request fails closed.
    pub fn policy_busy() -> Self {
        Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "policy_busy",
            "the project's policy modules are busy; retry shortly",
            Side::Plugin,
        )
        .retry_after(Duration::from_secs(1))
    }

    /// 500: a fault inside the gateway.
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal_error",
            message,
            Side::Gateway,
        )
    }

    /// 502: the backend answered something that is not a valid reply.
    pub fn bad_gateway(code: &'static str, message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_GATEWAY, code, message, Side::Upstream)
    }

    /// 503: the backend cannot be reached now.
    pub fn unavailable(code: &'static str, message: impl Into<String>) -> Self {
        Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            code,
            message,
            Side::Upstream,
        )
        .retryable()
    }

    /// 503: the gateway sheds the request (more requests in flight than it takes at once).
    pub fn overloaded() -> Self {
        Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "overloaded",
            "the gateway is at capacity; retry shortly",
            Side::Gateway,
        )
        .retryable()
        .retry_after(std::time::Duration::from_secs(1))
    }

    /// 504: the route's budget ran out.
    pub fn timeout(code: &'static str, message: impl Into<String>) -> Self {
        Self::new(StatusCode::GATEWAY_TIMEOUT, code, message, Side::Upstream)
    }
}

impl std::fmt::Display for GatewayError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} {}: {}",
            self.status.as_u16(),
            self.code,
            self.message
        )
    }
}

impl std::error::Error for GatewayError {}

/// The body of a gateway-made error.
pub fn error_body(code: &str, message: &str) -> String {
    serde_json::json!({ "error": { "code": code, "message": message } }).to_string()
}

impl IntoResponse for GatewayError {
    fn into_response(self) -> Response {
        let mut response = (self.status, error_body(self.code, &self.message)).into_response();
        let headers = response.headers_mut();
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        if let Some(after) = self.retry_after {
            let secs = after.as_secs() + u64::from(after.subsec_nanos() > 0);
            headers.insert(header::RETRY_AFTER, HeaderValue::from(secs.max(1)));
        }
        response.extensions_mut().insert(ErrorCode {
            code: self.code,
            side: self.side,
        });
        response
    }
}

/// Response extension naming the gateway error's code and side, for the access log and metrics.
#[derive(Debug, Clone, Copy)]
pub struct ErrorCode {
    /// The error's code.
    pub code: &'static str,
    /// Which side failed.
    pub side: Side,
}
