//! The operator's admin token (`plugins.admin_token`), guarding the management plane's
//! introspection (`/v1/admin/*`) and the policy reload (`/v1/policies/reload`).

use crate::error::GatewayError;

/// `Ok` when `headers` carry `Authorization: Bearer <token>`; `404` when no token is configured
/// (the guarded route does not exist), `401 invalid_admin_token` otherwise.
pub fn check_token(token: Option<&str>, headers: &http::HeaderMap) -> Result<(), GatewayError> {
    let Some(token) = token else {
        return Err(GatewayError::not_found("no route for this path"));
    };
    let presented = crate::auth::bearer::bearer(headers)
        .ok()
        .flatten()
        .unwrap_or_default();
    if crate::phases::metrics_auth::constant_time_eq(presented.as_bytes(), token.as_bytes()) {
        Ok(())
    } else {
        Err(GatewayError::unauthorized(
            "invalid_admin_token",
            "a valid admin bearer token is required",
        ))
    }
}
