//! What the phases know of one request, in one place: filled in phase by phase, read by the
//! later phases on the way in and by every phase on the way out.

use std::net::IpAddr;
use std::sync::Arc;

use tokio::time::Instant;

use super::request_id::RequestId;
use super::stamps::Stamps;
use crate::actor::Actor;
use crate::plane::Plane;
use crate::policy::Policies;
use crate::routes::RouteGroup;

/// The context of one request.
#[derive(Debug)]
pub struct RequestContext {
    /// The listener it arrived on.
    pub plane: Plane,
    /// When the plane's service received it.
    pub started: Instant,
    /// The TCP peer's address (unspecified when the request did not come from a socket).
    pub peer: IpAddr,
    /// The route group of its (normalised) path.
    pub group: RouteGroup,
    /// The policy modules it pinned when it arrived: every stage of it runs on these.
    pub policies: Arc<Policies>,
    /// Its id (phase 7 on).
    pub id: Option<RequestId>,
    /// The client IP (phase 8 on).
    pub client_ip: Option<IpAddr>,
    /// The caller (phase 9 on).
    pub actor: Option<Arc<Actor>>,
    /// Refused by the per-IP limit: the CORS answer then comes from the plane's module.
    pub ip_limited: bool,
    /// The headers the phases set on the answer on their way out (2, 7 and 10).
    pub stamps: Stamps,
}

impl RequestContext {
    /// The context of a request from `peer` to `plane` on path group `group`, pinning
    /// `policies`.
    pub fn new(plane: Plane, peer: IpAddr, group: RouteGroup, policies: Arc<Policies>) -> Self {
        Self {
            plane,
            started: Instant::now(),
            peer,
            group,
            policies,
            id: None,
            client_ip: None,
            actor: None,
            ip_limited: false,
            stamps: Stamps::none(),
        }
    }

    /// The project of the request, once known.
    pub fn project(&self) -> Option<&str> {
        self.actor.as_deref().and_then(|a| a.project.as_deref())
    }
}

/// What a route handler needs from the phases: passed to a service route's handler, and the one
/// request extension they set for the plane's own routes.
#[derive(Debug, Clone)]
pub struct RouteContext {
    /// The caller.
    pub actor: Arc<Actor>,
    /// The request id (also the `x-request-id` header and the envelope `id`).
    pub request_id: RequestId,
    /// When the plane's service received the request ([`RequestContext::started`]).
    pub started: Instant,
    /// When the route group's budget runs out.
    pub deadline: Instant,
    /// The modules the request pinned.
    pub policies: Arc<Policies>,
}
