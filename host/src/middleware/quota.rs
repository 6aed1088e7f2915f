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
use crate::ratelimit::Rule;
use crate::route_group::RouteGroup;

/// The layer.
pub async fn per_actor(State(ctx): State<PlaneCtx>, request: Request, next: Next) -> Response {
    let state = &ctx.state;
    let Some(actor) = request.extensions().get::<Actor>() else {
        return GatewayError::internal("no actor on the request (chain misconfigured)")
            .into_response();
    };
    let tenant = match (ctx.plane, actor.project.as_deref()) {
        (crate::plane::Plane::Data, Some(project)) => state.tenants.quota(project),
        _ => None,
    };
    let decision = {
        let policies = state.policies_of(request.extensions());
        let stage = match tenant.as_deref().map(|t| &t.module) {
            Some(crate::policy::tenants::TenantModule::Quota(stage)) => stage,
            _ => &policies.plane(ctx.plane).quota,
        };
        stage.decide(
            request.method().as_str(),
            request.uri().path(),
            RouteGroup::of(request.uri().path()).as_str(),
            actor,
        )
    };
    let rule = match decision {
        Err(e) => return state.plugin_failed(&e).into_response(),
        Ok(QuotaDecision::Exempt) => return next.run(request).await,
        Ok(QuotaDecision::Limit(rule)) => Rule {
            bucket: rule.bucket,
            rate_per_second: rule.rate_per_second.max(1),
            burst: rule.burst.max(1),
            cost: rule.cost.max(1),
        },
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
