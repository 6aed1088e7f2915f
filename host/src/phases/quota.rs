//! Phase 10, the per-actor quota, after authentication: the `quota` policy stage names the
//! bucket and its figures for this actor and route; the host bounds them
//! ([`crate::ratelimit::rules`]) and enforces the rule (locally, or shared through Redis).

use http::Method;

use super::Phase;
use super::context::RequestContext;
use super::per_ip::{Limiter, count, too_many};
use crate::actor::Actor;
use crate::error::GatewayError;
use crate::policy::slot::StageCall;
use crate::policy::stages::quota::{BucketScope, QuotaDenial, deny_code, deny_status};
use crate::policy::stages::{Quota, QuotaDecision, QuotaInput};
use crate::ratelimit::Decision;
use crate::ratelimit::rules::{self, Answered, Scope};
use crate::state::AppState;

/// The longest `Retry-After` of a module's `429` denial, in seconds.
const MAX_DENY_RETRY_AFTER_SECS: u32 = 3_600;

/// The answer to a module's denial: its status and code from the fixed sets, and for a 429 a
/// `Retry-After` within 1 s and [`MAX_DENY_RETRY_AFTER_SECS`], whatever the module said.
fn denied(denial: &QuotaDenial) -> GatewayError {
    let status = deny_status(denial.status);
    let error = GatewayError::new(
        status,
        deny_code(denial.reason),
        "the request is refused by the quota policy",
        crate::error::Side::Client,
    );
    if status != http::StatusCode::TOO_MANY_REQUESTS {
        return error;
    }
    let secs = denial
        .retry_after_seconds
        .clamp(1, MAX_DENY_RETRY_AFTER_SECS);
    error.retry_after(std::time::Duration::from_secs(u64::from(secs)))
}

/// Takes the request's tokens for `actor` (phase 9's): `Ok(None)` when exempt, the decision (for
/// the response's `RateLimit-*` headers) when admitted, the answer when refused (by the bucket or
/// the module's denial) or when the stage failed.
pub async fn check(
    state: &AppState,
    cx: &RequestContext,
    actor: &Actor,
    method: &Method,
    path: &str,
    headers: &http::HeaderMap,
) -> Phase<Option<Decision>> {
    use axum::response::IntoResponse;
    let call = StageCall {
        pinned: &cx.policies,
        request_id: cx.id.as_ref().map(|id| id.as_str()),
        plane: actor.plane,
        project: actor.project.as_deref(),
        at: cx.started,
    };
    let input = QuotaInput {
        method: method.as_str(),
        path,
        route_group: cx.group,
        actor,
        headers: Some(headers),
    };
    let (decision, source) = state
        .policies
        .decide::<Quota>(&call, input)
        .await
        .map_err(IntoResponse::into_response)?;
    let plane = cx.plane.as_str();
    let answered = match &*decision {
        QuotaDecision::Exempt => return Ok(None),
        QuotaDecision::Deny(denial) => {
            let code = deny_code(denial.reason);
            state
                .metrics
                .quota_denials
                .with_label_values(&[plane, source.as_str(), code])
                .inc();
            return Err(denied(denial).into_response());
        }
        QuotaDecision::Limit(rule) => Answered {
            scope: match &rule.scope {
                BucketScope::Key => Scope::Key,
                BucketScope::User => Scope::User,
                BucketScope::ConsoleUser => Scope::ConsoleUser,
                BucketScope::Project => Scope::Project,
                BucketScope::ClientIp => Scope::ClientIp,
                BucketScope::Named(name) => Scope::Named(name),
            },
            rate_per_second: rule.rate_per_second,
            burst: rule.burst,
            cost: rule.cost,
        },
    };
    let rule = match rules::bound(&state.config.rate_limit, source, actor, answered) {
        Ok(bounded) => {
            for field in bounded.clamped.iter() {
                rules::clamped_counter(&state.metrics, cx.plane, source, field).inc();
            }
            bounded.rule
        }
        Err(refused) => {
            state
                .metrics
                .quota_rules_refused
                .with_label_values(&[plane, source.as_str(), refused.as_str()])
                .inc();
            tracing::error!(
                plane,
                source = source.as_str(),
                project = actor.project.as_deref().unwrap_or_default(),
                reason = %refused,
                "quota decision refused; the request fails closed"
            );
            return Err(GatewayError::policy_failed("quota").into_response());
        }
    };
    let decision = state.quotas.check(&rule).await;
    count(state, cx.plane, Limiter::Actor, &decision);
    if decision.allowed {
        Ok(Some(decision))
    } else {
        Err(too_many(&decision))
    }
}

#[cfg(test)]
mod tests {
    use axum::response::{IntoResponse, Response};

    use super::*;
    use crate::policy::stages::quota::{DenyReason, DenyStatus};

    fn answer(status: DenyStatus, reason: DenyReason, retry_after_seconds: u32) -> Response {
        denied(&QuotaDenial {
            status,
            reason,
            retry_after_seconds,
        })
        .into_response()
    }

    #[tokio::test]
    async fn a_denial_is_the_contracts_json_error_with_a_bounded_retry_after() {
        let r = answer(DenyStatus::Forbidden, DenyReason::ClaimDenied, u32::MAX);
        assert_eq!(r.status(), http::StatusCode::FORBIDDEN);
        assert!(r.headers().get("retry-after").is_none(), "a 403 has none");
        let body = axum::body::to_bytes(r.into_body(), 4096)
            .await
            .expect("body");
        let body: serde_json::Value = serde_json::from_slice(&body).expect("json");
        assert_eq!(body["error"]["code"], "claim_denied");
        assert!(body["error"]["message"].is_string());
        for (asked, sent) in [(u32::MAX, "3600"), (0, "1"), (30, "30")] {
            let r = answer(
                DenyStatus::TooManyRequests,
                DenyReason::QuotaExceeded,
                asked,
            );
            assert_eq!(r.status(), http::StatusCode::TOO_MANY_REQUESTS);
            assert_eq!(r.headers()["retry-after"], sent, "asked {asked}");
        }
    }
}
