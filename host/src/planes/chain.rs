//! The request path of a plane, written once: one tower `Service` per plane runs the phases
//! below, in this order, as plain async steps over one [`RequestContext`] — no middleware
//! layers wrapping boxed services, no facts passed around in request extensions.
//!
//! A request goes down the phases; the answer comes back up through every phase that ran, so
//! that an answer made by an inner phase (a `401`, a `429`) still gets the outer phases' work:
//! its request id, its access-log line, its count, its security and CORS headers. A phase that
//! answers early stops the way down there.
//!
//! | # | phase | why it sits there |
//! |---|---|---|
//! | 0 | path | normalised before anything: routing, every phase and the proxies see one path |
//! | 1 | CORS | a preflight is answered before any other work (after its per-IP token); CORS headers go on every response, errors included |
//! | 2 | security headers | stamped on everything produced inside, gateway errors included |
//! | 3 | request limits | refused paths and oversized bodies are answered before any logging, auth or plugin work |
//! | 4 | trace | the request span wraps everything that does work |
//! | 5 | metrics | counts every request that got past the limits, with its final status |
//! | 6 | access log | one line per request with its final status and latency |
//! | 7 | request id | every response from here in carries the id; backends get the same id |
//! | 8 | per-IP rate limit | floods are refused before any credential work |
//! | 9 | auth | establishes the actor |
//! | 10 | per-actor quota | needs the actor |
//! | 11 | metrics auth | guards `/metrics` only; innermost, next to the handler it protects |
//! | 12 | route | the handler, under its route group's timeout budget (there is no global timeout) |
//!
//! The headers phases 2, 7 and 10 set on the way out (security headers, request id,
//! `RateLimit-*`) are kept beside the answer ([`crate::phases::stamps`]): the HTTP/1 writer
//! writes them after the answer's own headers, in place of a backend's, and every other
//! consumer gets them in the answer's map.
//!
//! The shape follows Pingora's `ProxyHttp`: each phase is a function of its own module
//! ([`crate::phases`]); this file is only their order.

use std::convert::Infallible;
use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use axum::Router;
use axum::body::Body;
use axum::extract::Request;
use axum::response::{IntoResponse, Response};
use tower::ServiceExt;
use tracing::Instrument;

use super::routes;
use crate::actor::Actor;
use crate::deadline::Timers;
use crate::error::GatewayError;
use crate::phases::context::{RequestContext, RouteContext};
use crate::phases::cors::{self, Cors};
use crate::phases::metrics::RequestMetrics;
use crate::phases::request_id::{self, RequestId};
use crate::phases::stamps::Stamped;
use crate::phases::{
    Phase, access_log, auth, metrics_auth, path, per_ip, quota, request_limits, trace,
};
use crate::plane::Plane;
use crate::routes::{Budget, RouteGroup};
use crate::state::AppState;
use crate::telemetry::scope::InRequest;

/// The request path of one plane. Cheap to clone.
#[derive(Debug, Clone)]
pub struct PlaneService(Arc<Pipeline>);

#[derive(Debug)]
struct Pipeline {
    state: AppState,
    plane: Plane,
    /// The plane's own routes and fallbacks (service routes are dispatched by
    /// [`crate::routes::service_of`]), with nothing around them.
    router: Router,
    metrics: RequestMetrics,
    /// The route budgets' timers, moved from request to request.
    budgets: Timers,
}

impl PlaneService {
    /// The service of `plane` over `router` (its handlers).
    pub fn new(state: AppState, plane: Plane, router: Router) -> Self {
        let metrics = RequestMetrics::new(&state.metrics, plane);
        Self(Arc::new(Pipeline {
            state,
            plane,
            router,
            metrics,
            budgets: Timers::default(),
        }))
    }

    /// Runs one request from `peer` through every phase, and answers with the headers the
    /// phases set on the way out kept beside the response ([`Stamped::into_response`] puts
    /// them into its map; the HTTP/1 writer writes them itself).
    pub async fn stamped(&self, request: Request, peer: SocketAddr) -> Stamped {
        // The phases' state machine is several kilobytes. Boxed here, it is written once into
        // the heap; unboxed, the connection would move it into its in-flight slot on every
        // request, and every future wrapping it would grow by as much. The box is allocated
        // before the future is made, so that it is made in place: `Box::pin(future)` makes it
        // on the stack and copies its 9 KB into the box.
        let slot = Box::new_uninit();
        Box::into_pin(Box::write(slot, self.0.run(request, peer.ip()))).await
    }
}

impl Pipeline {
    /// Phases 0 to 2, and their way back.
    async fn run(&self, mut request: Request, peer: IpAddr) -> Stamped {
        let refused = path::normalize_request(&mut request); // 0
        let group = RouteGroup::of(request.uri().path());
        let policies = self.state.policies.snapshot();
        let mut cx = RequestContext::new(self.plane, peer, group, policies);
        let cors = Cors::of(&self.state, self.plane, &request); // 1
        if let Some(cors) = cors.as_ref().filter(|c| c.is_preflight()) {
            return Stamped::whole(cors::preflight(&self.state, &mut cx, request, cors).await);
        }
        let mut response = self.limited(&mut cx, request, refused).await; // 3 and in
        cx.stamps.security(); // 2
        let response = match &cors {
            Some(cors) => cors::respond(&self.state, &cx, cors, response).await, // 1
            None => {
                cors::strip(response.headers_mut());
                response
            }
        };
        Stamped {
            response,
            stamps: cx.stamps,
        }
    }

    /// Phases 3 and 4.
    async fn limited(
        &self,
        cx: &mut RequestContext,
        request: Request,
        refused: Option<path::RefusedPath>,
    ) -> Response {
        let mut request = match request_limits::check(&self.state, cx, refused, request) {
            Ok(request) => request,
            Err(answer) => return answer,
        };
        let span = trace::span(self.plane, &request);
        let trusted = per_ip::is_trusted_peer(&self.state, cx.peer);
        trace::propagate(&span, &mut request, trusted);
        self.observed(cx, request).instrument(span).await
    }

    /// Phases 5 and 6: the answer counted and logged, whatever produced it.
    async fn observed(&self, cx: &mut RequestContext, request: Request) -> Response {
        // The URI's clone shares its bytes: nothing copied for the line.
        let logged =
            access_log::enabled().then(|| (request.method().clone(), request.uri().clone()));
        let response = self.identified(cx, request).await;
        if let Some((method, uri)) = &logged {
            access_log::line(cx, method, uri.path(), &response); // 6
        }
        self.metrics.record(cx, &response); // 5
        response
    }

    /// Phase 7: one id for the request, its backends and its answer.
    async fn identified(&self, cx: &mut RequestContext, mut request: Request) -> Response {
        let id = RequestId::mint();
        request_id::assign(&id, request.headers_mut());
        cx.id = Some(id.clone());
        // Every line logged from here on names the request.
        let admitted = self.admitted(cx, &id, request);
        let response = InRequest::new(id.hex(), admitted)
            .await
            .unwrap_or_else(|answer| answer);
        cx.stamps.request_id(&id);
        response
    }

    /// Phases 8 to 11: each hands the next what it established, or answers.
    async fn admitted(
        &self,
        cx: &mut RequestContext,
        id: &RequestId,
        request: Request,
    ) -> Phase<Response> {
        per_ip::check(&self.state, cx, &request)?; // 8
        let (request, actor) = auth::authenticate(&self.state, cx, request).await?; // 9
        let (method, path) = (request.method(), request.uri().path());
        let quota = quota::check(&self.state, cx, &actor, method, path, request.headers()).await?; // 10
        metrics_auth::guard(&self.state, &request)?; // 11
        let response = self.route(cx, actor, id.clone(), request).await;
        if let Some(decision) = &quota {
            cx.stamps.rate_limit(decision); // 10
        }
        Ok(response)
    }

    /// Phase 12: the handler, within its route group's budget.
    async fn route(
        &self,
        cx: &RequestContext,
        actor: Arc<Actor>,
        request_id: RequestId,
        mut request: Request,
    ) -> Response {
        let timeouts = &self.state.config.timeouts;
        let budget = match cx.group.budget() {
            Budget::Functions => timeouts.functions_budget(),
            Budget::Default => timeouts.default_budget(),
        };
        let deadline = tokio::time::Instant::now() + budget;
        let route_cx = RouteContext {
            actor,
            request_id,
            started: cx.started,
            deadline,
            policies: cx.policies.clone(),
        };
        let handled = async {
            match crate::routes::service_of(request.uri().path()) {
                // A service route's handler takes the context as an argument: no extension map
                // is made for it.
                Some(service) => routes::serve(service, &self.state, &route_cx, request).await,
                None => {
                    request.extensions_mut().insert(route_cx);
                    self.router
                        .clone()
                        .oneshot(request)
                        .await
                        .unwrap_or_else(|never| match never {})
                }
            }
        };
        match self.budgets.run_until(deadline, handled).await {
            Ok(response) => response,
            Err(_) => GatewayError::timeout(
                "gateway_timeout",
                format!("the request exceeded its {} ms budget", budget.as_millis()),
            )
            .into_response(),
        }
    }
}

impl<B> tower::Service<http::Request<B>> for PlaneService
where
    B: http_body::Body<Data = bytes::Bytes> + Send + 'static,
    B::Error: Into<axum::BoxError>,
{
    type Response = Response;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Response, Infallible>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let pipeline = self.0.clone();
        let request = request.map(Body::new);
        let peer = per_ip::peer_of(&request);
        Box::pin(async move { Ok(pipeline.run(request, peer).await.into_response()) })
    }
}
