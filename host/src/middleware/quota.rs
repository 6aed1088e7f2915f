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
            bucket: bucket_name(tenant.is_some(), actor.project.as_deref(), rule.bucket),
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

/// The bucket a decision counts against. A project's own module names buckets inside that
/// project only: it can never draw on another project's (or the console's) buckets.
fn bucket_name(from_tenant: bool, project: Option<&str>, bucket: String) -> String {
    match (from_tenant, project) {
        (true, Some(project)) => format!("tenant:{project}:{bucket}"),
        _ => bucket,
    }
}

#[cfg(test)]
mod tests {
    use super::bucket_name;

    #[test]
    fn a_projects_module_cannot_name_another_projects_bucket() {
        let forged = "key:5f0c8a0e-9a55-4c0f-9d55-6f3c2d1b7e11".to_owned();
        let from_alpha = bucket_name(true, Some("alpha"), forged.clone());
        let from_beta = bucket_name(true, Some("beta"), forged.clone());
        assert_ne!(from_alpha, forged, "a tenant bucket is namespaced");
        assert_ne!(from_alpha, from_beta, "two projects never share a bucket");
        assert_eq!(bucket_name(false, Some("alpha"), forged.clone()), forged);
    }
}
