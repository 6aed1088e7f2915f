//! Phase 0, path normalisation ([`crate::path`]), before anything else: the router, public-path
//! matching, the policy stages and the proxies all see the normal form of the path.
//!
//! A refused path is not answered here but handed on ([`RefusedPath`]) and answered `400
//! invalid_path` by the request-limits phase (3), so that the answer carries the CORS and
//! security headers and a request id like every other.

use std::borrow::Cow;

use axum::extract::Request;
use http::Uri;
use http::uri::PathAndQuery;

use crate::path::{PathError, normalize};

/// Why a request's path was refused.
#[derive(Debug, Clone, Copy)]
pub struct RefusedPath(pub PathError);

impl RefusedPath {
    /// Label value for metrics.
    pub fn reason(&self) -> &'static str {
        match self.0 {
            PathError::NotAbsolute => "not_absolute",
            PathError::BadEscape => "bad_escape",
            PathError::EncodedSlash => "encoded_slash",
            PathError::Backslash => "backslash",
            PathError::EncodedControl => "encoded_control",
            PathError::EncodedDotSegment => "encoded_dot_segment",
            PathError::Climbs => "climbs",
            PathError::DotSegmentParameters => "dot_segment_parameters",
        }
    }
}

/// Rewrites the request's path to its normal form, or says why it is refused.
pub fn normalize_request(request: &mut Request) -> Option<RefusedPath> {
    let rewritten = match normalize(request.uri().path()) {
        Ok(Cow::Borrowed(_)) => return None,
        Ok(Cow::Owned(path)) => path,
        Err(error) => return Some(RefusedPath(error)),
    };
    let path_and_query = match request.uri().query() {
        Some(query) => format!("{rewritten}?{query}"),
        None => rewritten,
    };
    let mut parts = request.uri().clone().into_parts();
    let Ok(pq) = PathAndQuery::try_from(path_and_query) else {
        return Some(RefusedPath(PathError::BadEscape));
    };
    parts.path_and_query = Some(pq);
    match Uri::from_parts(parts) {
        Ok(uri) => {
            *request.uri_mut() = uri;
            None
        }
        Err(_) => Some(RefusedPath(PathError::BadEscape)),
    }
}
