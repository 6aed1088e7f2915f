//! Timeout budgets per route group, applied to each group before the groups are merged, so that
//! a longer budget (functions) is never cut by a shorter one wrapped around it. There is no
//! global timeout.

use std::time::Duration;

use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use tokio::time::Instant;

use crate::error::GatewayError;

/// The instant the current request's budget runs out (request extension), for transports
/// that must stop early or tell the backend how long it has.
#[derive(Debug, Clone, Copy)]
pub struct Deadline(pub Instant);

/// The layer's state: the group's budget.
#[derive(Debug, Clone, Copy)]
pub struct Budget(pub Duration);

/// The layer: 504 with the contract's JSON error when the budget runs out before the response
/// headers are ready.
pub async fn enforce(
    State(Budget(budget)): State<Budget>,
    mut request: Request,
    next: Next,
) -> Response {
    let deadline = Instant::now() + budget;
    request.extensions_mut().insert(Deadline(deadline));
    match tokio::time::timeout_at(deadline, next.run(request)).await {
        Ok(response) => response,
        Err(_) => GatewayError::timeout(
            "gateway_timeout",
            format!("the request exceeded its {} ms budget", budget.as_millis()),
        )
        .into_response(),
    }
}
