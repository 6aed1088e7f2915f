//! The phases of a request, one module each. Their order is written once, in
//! [`crate::planes::chain`], which runs them over one [`context::RequestContext`].

pub mod access_log;
pub mod auth;
pub mod context;
pub mod cors;
pub mod metrics;
pub mod metrics_auth;
pub mod path;
pub mod per_ip;
pub mod quota;
pub mod request_id;
pub mod request_limits;
pub mod security_headers;
pub mod trace;

/// How many headers the phases may add to a backend's answer on its way back: the request id,
/// three `RateLimit-*`, five security headers and three CORS headers. A proxy makes room for
/// them once.
pub const ANSWER_HEADERS: usize = 12;
