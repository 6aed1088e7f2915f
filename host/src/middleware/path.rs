//! Path normalisation ([`crate::path`]), before routing: the router, public-path matching, the
//! policy stages and the proxies all see the normal form of the path.
//!
//! It wraps the plane's router rather than sitting in the chain (the chain runs after routing).
//! A refused path is not answered here but marked ([`RefusedPath`]) and answered `400
//! invalid_path` by the request-limits layer (slot 3 of the chain), so that the answer carries
//! the CORS and security headers and a request id like every other.

use std::borrow::Cow;

use axum::extract::Request;
use http::Uri;
use http::uri::PathAndQuery;

use crate::path::{PathError, normalize};

/// A request whose path was refused (request extension).
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
        }
    }
}

/// Rewrites the request's path to its normal form, or marks it refused.
pub fn normalize_request(mut request: Request) -> Request {
    let rewritten = match normalize(request.uri().path()) {
        Ok(Cow::Borrowed(_)) => return request,
        Ok(Cow::Owned(path)) => path,
        Err(error) => {
            request.extensions_mut().insert(RefusedPath(error));
            return request;
        }
    };
    let path_and_query = match request.uri().query() {
        Some(query) => format!("{rewritten}?{query}"),
        None => rewritten,
    };
    let mut parts = request.uri().clone().into_parts();
    match PathAndQuery::try_from(path_and_query) {
        Ok(pq) => parts.path_and_query = Some(pq),
        Err(_) => {
            request
                .extensions_mut()
                .insert(RefusedPath(PathError::BadEscape));
            return request;
        }
    }
    match Uri::from_parts(parts) {
        Ok(uri) => *request.uri_mut() = uri,
        Err(_) => {
            request
                .extensions_mut()
                .insert(RefusedPath(PathError::BadEscape));
        }
    }
    request
}
