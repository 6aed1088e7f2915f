//! The phases of a request, one module each. Their order is written once, in
//! [`crate::planes::chain`], which runs them over one [`context::RequestContext`].
#![expect(
    clippy::result_large_err,
    reason = "a phase's early answer is the response itself, made once per refused request: \
              boxing it would allocate for nothing"
)]

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
pub mod stamps;
pub mod trace;

/// What a phase on the way down returns: what it established for the phases inside it (the
/// request, the caller, a quota decision), or the answer that stops the way down there. What a
/// phase establishes is handed inward as a value, never left in the context to be found later,
/// so a phase cannot run before the one it needs.
pub type Phase<T> = Result<T, axum::response::Response>;
