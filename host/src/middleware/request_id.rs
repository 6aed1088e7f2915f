//! Request ids: every request gets a fresh id, sent to backends as `x-request-id` (and as the
//! envelope `id`) and returned on the response. A client-sent `x-request-id` is replaced: ids
//! are minted by the gateway so that logs and backends can trust them.

use axum::extract::Request;
use axum::middleware::Next;
use axum::response::Response;
use http::{HeaderMap, HeaderName, HeaderValue};

/// `x-request-id`.
pub static X_REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");

/// The id of the current request (request extension).
#[derive(Debug, Clone)]
pub struct RequestId(pub String);

impl RequestId {
    /// A new random id (32 hex digits).
    pub fn mint() -> Self {
        Self(uuid::Uuid::new_v4().simple().to_string())
    }

    fn header_value(&self) -> HeaderValue {
        HeaderValue::from_str(&self.0).expect("hex is a valid header value")
    }
}

/// Gives a response answered outside this layer (a preflight, an early 413) an id of its own,
/// so that every response carries one.
pub fn stamp_if_missing(headers: &mut HeaderMap) {
    if !headers.contains_key(&X_REQUEST_ID) {
        headers.insert(X_REQUEST_ID.clone(), RequestId::mint().header_value());
    }
}

/// The layer.
pub async fn assign(mut request: Request, next: Next) -> Response {
    let id = RequestId::mint();
    let value = id.header_value();
    tracing::Span::current().record("request_id", id.0.as_str());
    request
        .headers_mut()
        .insert(X_REQUEST_ID.clone(), value.clone());
    request.extensions_mut().insert(id);
    let mut response = next.run(request).await;
    response.headers_mut().insert(X_REQUEST_ID.clone(), value);
    response
}
