//! Per-actor quota, after authentication: the `quota` policy stage names the bucket and its
//! figures for this actor and route; the host enforces it (locally, or shared through Redis).

use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::PlaneCtx;
use super::rate_limit::{count, rate_limit_headers, too_many};
use crate::actor::Actor;
use crate::error::GatewayError;
use crate::policy::stages::QuotaDecision;
use crate::ratelimit::rules::{self, Answered, RuleSource};
use crate::route_group::RouteGroup;

/// The layer.
pub async fn per_actor(State(ctx): State<PlaneCtx>, request: Request, next: Next) -> Response {
    let state = &ctx.state;
    let Some(actor) = request.extensions().get::<Actor>().cloned() else {
        return GatewayError::internal("no actor on the request (chain misconfigured)")
            .into_response();
    };
    let group = RouteGroup::of(request.uri().path()).as_str();
    // The project's own module, when it installed one, runs on the tenant pool.
    let tenant = match (ctx.plane, actor.project.as_deref()) {
        (crate::plane::Plane::Data, Some(project)) => {
            state
                .tenants
                .decide_quota(
                    project,
                    request.method().as_str().to_owned(),
                    request.uri().path().to_owned(),
                    group,
                    actor.clone(),
                )
                .await
        }
        _ => None,
    };
    let source = if tenant.is_some() {
        RuleSource::Tenant
    } else {
        RuleSource::Operator
    };
    let decision = match tenant {
        Some(result) => result.map_err(|e| state.tenant_call_failed(&e)),
        None => {
            let policies = state.policies_of(request.extensions());
            policies
                .plane(ctx.plane)
                .quota
                .decide(
                    request.method().as_str(),
                    request.uri().path(),
                    group,
                    &actor,
                )
                .map_err(|e| state.plugin_failed(&e))
        }
    };
    let rule = match decision {
        Err(e) => return e.into_response(),
        Ok(QuotaDecision::Exempt) => return next.run(request).await,
        Ok(QuotaDecision::Limit(answered)) => {
            let answered = Answered {
                bucket: &answered.bucket,
                rate_per_second: answered.rate_per_second,
                burst: answered.burst,
                cost: answered.cost,
            };
            match rules::bound(
                &state.config.rate_limit,
                source,
                actor.project.as_deref(),
                answered,
            ) {
                Ok(bounded) => {
                    for field in &bounded.clamped {
                        state
                            .metrics
                            .quota_rules_clamped
                            .with_label_values(&[
                                ctx.plane.as_str(),
                                source.as_str(),
                                field.as_str(),
                            ])
                            .inc();
                    }
                    bounded.rule
                }
                Err(refused) => {
                    state
                        .metrics
                        .quota_rules_refused
                        .with_label_values(&[ctx.plane.as_str(), source.as_str(), refused.as_str()])
                        .inc();
                    tracing::error!(
                        plane = ctx.plane.as_str(),
                        source = source.as_str(),
                        project = actor.project.as_deref().unwrap_or_default(),
                        reason = %refused,
                        "quota decision refused; the request fails closed"
                    );
                    return GatewayError::policy_failed("quota").into_response();
                }
            }
        }
    };
    let decision = state.quotas.check(&rule).await;
    count(&ctx, "actor", &decision);
    if !decision.allowed {
        return too_many(&decision);
    }
    let mut response = next.run(request).await;
    rate_limit_headers(response.headers_mut(), &decision);
    response
}
