//! The layers of the chain, one module each. Their order is written once, in
//! [`crate::planes::chain`].

pub mod access_log;
pub mod auth;
pub mod body_limit;
pub mod budget;
pub mod cors;
pub mod metrics;
pub mod metrics_auth;
pub mod path;
pub mod quota;
pub mod rate_limit;
pub mod request_id;
pub mod security_headers;
pub mod trace;

use crate::plane::Plane;
use crate::state::AppState;

/// The state every plane-aware layer receives: the shared state and the layer's plane.
#[derive(Debug, Clone)]
pub struct PlaneCtx {
    pub state: AppState,
    pub plane: Plane,
}
