//! The transports to the backends (the NATS envelope, pooled HTTP, WebSocket tunnels, the
//! allow-list of dedicated PostgREST targets) and what they share. The handlers that use them,
//! written once for both planes, are [`crate::planes::handlers`].

pub mod envelope;
pub mod headers;
pub mod http;
pub mod idle;
pub mod nats;
pub mod pool;
pub mod targets;
pub mod tunnels;

use axum::body::Body;
use http_body_util::LengthLimitError;

use crate::error::GatewayError;

/// An answer's body holding something until the body is done or dropped: a place in a budget,
/// the count of an open stream.
#[derive(Debug)]
pub struct Holding<G> {
    body: Body,
    _held: G,
}

impl<G> Holding<G> {
    /// `body`, holding `held`.
    pub fn new(body: Body, held: G) -> Self {
        Self { body, _held: held }
    }
}

impl<G: Send + Unpin + 'static> http_body::Body for Holding<G> {
    type Data = bytes::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        std::pin::Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}

/// Whether `error` (or any error under it) is the request body limit being reached.
pub(crate) fn is_body_limit(error: &(dyn std::error::Error + 'static)) -> bool {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(error);
    while let Some(err) = source {
        if err.is::<LengthLimitError>() {
            return true;
        }
        source = err.source();
    }
    false
}

/// Reads a small request body of at most `max` bytes (refused `413` past it, without reading
/// the rest); `what` names it in the error.
pub async fn read_small_body(
    body: Body,
    max: usize,
    what: &str,
) -> Result<bytes::Bytes, GatewayError> {
    axum::body::to_bytes(body, max).await.map_err(|e| {
        if is_body_limit(&e) {
            GatewayError::payload_too_large(format!("{what} is at most {max} bytes"))
        } else {
            GatewayError::bad_request("invalid_body", "the request body could not be read")
        }
    })
}

/// Reads a request body, mapping an exceeded limit to 413.
pub async fn read_body(body: Body) -> Result<bytes::Bytes, GatewayError> {
    axum::body::to_bytes(body, usize::MAX).await.map_err(|e| {
        if is_body_limit(&e) {
            return GatewayError::payload_too_large("the request body is over the limit");
        }
        GatewayError::bad_request(
            "invalid_body",
            format!("the request body could not be read: {e}"),
        )
    })
}
