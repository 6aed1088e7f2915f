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
