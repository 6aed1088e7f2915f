//! The route table (CONTRACT §2): one row per backend service, and the paths the gateway answers
//! itself. Everything that sorts a path derives from here — the service routes both planes mount
//! ([`service_of`]), the route groups of metrics, logs, budgets and body limits
//! ([`RouteGroup::of`]), the data plane's key-free paths ([`is_public`]), the routes that exist
//! on the management plane only ([`is_management_route`]), the NATS subjects and the HTTP
//! backends (by [`Service::name`]).
//!
//! A new backend service is a variant of [`Service`] and its row in [`SERVICES`]; one reached
//! over HTTP also needs its base URL in the configuration (`upstreams.{name}_url`,
//! [`crate::config::UpstreamsConfig::url_of`]).

use http::Method;

/// A backend service: one row of [`SERVICES`], at its [`Service::index`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Service {
    Auth,
    Db,
    Storage,
    Functions,
    Realtime,
    Notifications,
    Ai,
    Provisioner,
    Control,
}

/// How a service's requests reach it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    /// The request in a JSON envelope, NATS request/reply on `{prefix}.{name}.http`.
    Nats,
    /// Pooled HTTP to `upstreams.{name}_url`, streamed both ways (WebSocket and SSE included).
    Http,
    /// Decided per request by the `db-routing` stage: NATS, or the project's dedicated
    /// PostgREST over HTTP; never a fallback from one to the other.
    DbRouting,
}

/// The time budget of a service's routes (`[timeouts]`); there is no global one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Budget {
    /// `timeouts.default_ms`.
    Default,
    /// `timeouts.functions_ms`: functions may run for minutes.
    Functions,
}

/// The cap on a request's body.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyLimit {
    /// `server.max_body_bytes`.
    Server,
    /// `upstreams.storage_max_body_bytes`: uploads stream through and may be far larger.
    Uploads,
}

/// A path of a service answered without an API key on the data plane, for these methods.
#[derive(Debug, Clone, Copy)]
pub struct PublicPath {
    pub path: &'static str,
    pub methods: &'static [Method],
}

/// One backend service.
#[derive(Debug, Clone, Copy)]
pub struct ServiceRow {
    pub service: Service,
    /// Its name: the segment of its routes (`/v1/{name}/…`), its NATS subject
    /// (`{prefix}.{name}.http`), its route group's label, its breaker's and its HTTP backend's.
    pub name: &'static str,
    pub transport: Transport,
    /// Whether `/v1/{name}/…` is a service route, mounted on both planes. The provisioner is
    /// reached only through the management plane's project routes.
    pub mounted: bool,
    pub budget: Budget,
    pub body_limit: BodyLimit,
    /// Its paths that need no API key on the data plane (the JWKS lives outside `/v1/`).
    pub public: &'static [PublicPath],
    /// The one path of it where a WebSocket upgrade is taken (HTTP services only); an
    /// `Upgrade` anywhere else is refused, never tunnelled.
    pub websocket: Option<&'static str>,
}

const READS: &[Method] = &[Method::GET, Method::HEAD];

/// The realtime service's WebSocket route: the only path a connection is upgraded on.
pub const WEBSOCKET_PATH: &str = "/v1/realtime/websocket";

/// The JWKS of user tokens: the auth service's, served on the data plane.
pub const JWKS_PATH: &str = "/.well-known/jwks.json";

/// A service reached over `transport`, mounted on both planes, with the default budget and
/// body limit and no key-free path: what most rows are.
const fn row(service: Service, name: &'static str, transport: Transport) -> ServiceRow {
    ServiceRow {
        service,
        name,
        transport,
        mounted: true,
        budget: Budget::Default,
        body_limit: BodyLimit::Server,
        public: &[],
        websocket: None,
    }
}

/// Every backend service, in [`Service`] order.
pub const SERVICES: [ServiceRow; 9] = [
    ServiceRow {
        public: &[
            PublicPath {
                path: JWKS_PATH,
                methods: READS,
            },
            PublicPath {
                path: "/v1/auth/signup",
                methods: &[Method::POST],
            },
        ],
        ..row(Service::Auth, "auth", Transport::Nats)
    },
    row(Service::Db, "db", Transport::DbRouting),
    ServiceRow {
        body_limit: BodyLimit::Uploads,
        ..row(Service::Storage, "storage", Transport::Http)
    },
    ServiceRow {
        budget: Budget::Functions,
        ..row(Service::Functions, "functions", Transport::Nats)
    },
    ServiceRow {
        websocket: Some(WEBSOCKET_PATH),
        ..row(Service::Realtime, "realtime", Transport::Http)
    },
    row(Service::Notifications, "notifications", Transport::Nats),
    row(Service::Ai, "ai", Transport::Nats),
    ServiceRow {
        mounted: false,
        ..row(Service::Provisioner, "provisioner", Transport::Nats)
    },
    row(Service::Control, "control", Transport::Nats),
];

/// Liveness, answered by the gateway on both planes without a credential.
pub const HEALTH_PATH: &str = "/health";

/// The Prometheus exposition, on the data plane, behind its own token.
pub const METRICS_PATH: &str = "/metrics";

/// Readiness, on the management plane.
pub const READY_PATH: &str = "/ready";

/// Routes of the management plane only: its introspection, reload, readiness, projects and
/// organizations. Each is a path and everything under it.
pub const MANAGEMENT_ONLY: [&str; 5] = [
    "/v1/admin",
    "/v1/policies",
    "/v1/projects",
    "/v1/organizations",
    READY_PATH,
];

impl Service {
    /// Every service, in [`SERVICES`] order.
    pub fn all() -> impl Iterator<Item = Service> {
        SERVICES.iter().map(|row| row.service)
    }

    /// The service's position in [`SERVICES`].
    pub fn index(self) -> usize {
        self as usize
    }

    /// The service's row.
    pub fn row(self) -> &'static ServiceRow {
        &SERVICES[self.index()]
    }

    /// The service's name (route segment, NATS subject, labels).
    pub fn name(self) -> &'static str {
        self.row().name
    }

    /// What follows `/v1/{name}` in `path`, when `path` is one of the service's routes.
    pub fn rest_of(self, path: &str) -> Option<&str> {
        path.strip_prefix("/v1/")?.strip_prefix(self.name())
    }
}

/// The mounted service whose routes hold `path` (`/v1/{name}/{rest}`, `rest` not empty): the
/// service routes of both planes.
pub fn service_of(path: &str) -> Option<Service> {
    service_under(path).filter(|service| path.len() > service.name().len() + "/v1//".len())
}

/// The mounted service under whose prefix (`/v1/{name}/`) `path` is, whatever follows.
pub fn service_under(path: &str) -> Option<Service> {
    let (head, _) = path.strip_prefix("/v1/")?.split_once('/')?;
    SERVICES
        .iter()
        .find(|row| row.mounted && row.name == head)
        .map(|row| row.service)
}

/// Whether `path` needs no API key on the data plane with `method`: liveness, the services'
/// public paths, and `/metrics` (which has its own guard).
pub fn is_public(method: &Method, path: &str) -> bool {
    match path {
        HEALTH_PATH => READS.contains(method),
        METRICS_PATH => true,
        _ => SERVICES
            .iter()
            .flat_map(|row| row.public)
            .any(|public| public.path == path && public.methods.contains(method)),
    }
}

/// Whether `path` is a route of the management plane only ([`MANAGEMENT_ONLY`]): on the data
/// plane it does not exist.
pub fn is_management_route(path: &str) -> bool {
    MANAGEMENT_ONLY.iter().any(|prefix| {
        path.strip_prefix(prefix)
            .is_some_and(|rest| rest.is_empty() || rest.starts_with('/'))
    })
}

/// The group of a route, for metrics, the access log, the quota stage, time budgets and body
/// limits: its service, the management plane's organization and project routes, or the
/// gateway's own (and unknown) paths.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RouteGroup {
    Service(Service),
    /// Management-plane organization and project routes.
    Management,
    /// Answered by the gateway itself (`/health`, `/metrics`) or unknown.
    Gateway,
}

impl RouteGroup {
    /// How many indices there are ([`RouteGroup::index`]).
    pub const COUNT: usize = SERVICES.len() + 2;

    /// Every group a path can be in: the mounted services', then management and gateway.
    pub fn all() -> impl Iterator<Item = RouteGroup> {
        SERVICES
            .iter()
            .filter(|row| row.mounted)
            .map(|row| RouteGroup::Service(row.service))
            .chain([RouteGroup::Management, RouteGroup::Gateway])
    }

    /// A dense index below [`RouteGroup::COUNT`].
    pub fn index(self) -> usize {
        match self {
            RouteGroup::Service(service) => service.index(),
            RouteGroup::Management => SERVICES.len(),
            RouteGroup::Gateway => SERVICES.len() + 1,
        }
    }

    /// The group of `path`: the mounted service of `/v1/{name}` or `/v1/{name}/…`, the service
    /// owning a public path outside `/v1/` (the JWKS), management for organizations and
    /// projects, else the gateway.
    pub fn of(path: &str) -> Self {
        let Some(rest) = path.strip_prefix("/v1/") else {
            return SERVICES
                .iter()
                .find(|row| row.public.iter().any(|p| p.path == path))
                .map_or(RouteGroup::Gateway, |row| RouteGroup::Service(row.service));
        };
        let head = rest.split('/').next().unwrap_or_default();
        if let Some(row) = SERVICES.iter().find(|row| row.mounted && row.name == head) {
            return RouteGroup::Service(row.service);
        }
        match head {
            "organizations" | "projects" => RouteGroup::Management,
            _ => RouteGroup::Gateway,
        }
    }

    /// Label value.
    pub fn as_str(self) -> &'static str {
        match self {
            RouteGroup::Service(service) => service.name(),
            RouteGroup::Management => "management",
            RouteGroup::Gateway => "gateway",
        }
    }

    /// The group's time budget.
    pub fn budget(self) -> Budget {
        match self {
            RouteGroup::Service(service) => service.row().budget,
            RouteGroup::Management | RouteGroup::Gateway => Budget::Default,
        }
    }

    /// The group's cap on request bodies.
    pub fn body_limit(self) -> BodyLimit {
        match self {
            RouteGroup::Service(service) => service.row().body_limit,
            RouteGroup::Management | RouteGroup::Gateway => BodyLimit::Server,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_service_is_at_its_index_and_named_once() {
        for (i, row) in SERVICES.iter().enumerate() {
            assert_eq!(row.service.index(), i, "{:?}", row.service);
            // The name is the quota stage's `route-group` (WIT `0.5.0`): at most 32 bytes of
            // lower-case letters, digits and `-`, never one of the two other groups' names.
            assert!(
                (1..=32).contains(&row.name.len())
                    && row
                        .name
                        .bytes()
                        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                    && !["management", "gateway"].contains(&row.name),
                "{}",
                row.name
            );
            assert_eq!(
                SERVICES.iter().filter(|r| r.name == row.name).count(),
                1,
                "{}",
                row.name
            );
        }
        let mut indices: Vec<usize> = RouteGroup::all().map(RouteGroup::index).collect();
        indices.sort_unstable();
        indices.dedup();
        assert!(indices.iter().all(|&i| i < RouteGroup::COUNT));
        assert_eq!(indices.len(), RouteGroup::all().count());
    }

    #[test]
    fn service_routes_need_a_rest_after_the_prefix() {
        assert_eq!(
            service_of("/v1/storage/object/a.png"),
            Some(Service::Storage)
        );
        assert_eq!(service_of("/v1/db/todos"), Some(Service::Db));
        assert_eq!(service_of("/v1/functions/f"), Some(Service::Functions));
        assert_eq!(service_of("/v1/auth/signup"), Some(Service::Auth));
        for none in [
            "/v1/storage",
            "/v1/storage/",
            "/v1/projects/x",
            "/health",
            "/v1/storagex/a",
            "/v1/provisioner/projects",
        ] {
            assert_eq!(service_of(none), None, "{none}");
        }
        assert_eq!(Service::Storage.rest_of("/v1/storage/a/b"), Some("/a/b"));
        let transport = |s: Service| s.row().transport;
        assert_eq!(transport(Service::Storage), Transport::Http);
        assert_eq!(transport(Service::Realtime), Transport::Http);
        assert_eq!(transport(Service::Db), Transport::DbRouting);
        assert_eq!(transport(Service::Functions), Transport::Nats);
        assert_eq!(transport(Service::Auth), Transport::Nats);
        assert_eq!(service_under("/v1/storage/"), Some(Service::Storage));
        assert_eq!(service_under("/v1/storage"), None);
    }

    #[test]
    fn groups_follow_the_first_segment() {
        let group = RouteGroup::of;
        assert_eq!(
            group("/v1/functions/hello"),
            RouteGroup::Service(Service::Functions)
        );
        assert_eq!(group("/v1/db"), RouteGroup::Service(Service::Db));
        assert_eq!(group("/v1/projects/abc/logs"), RouteGroup::Management);
        assert_eq!(group(JWKS_PATH), RouteGroup::Service(Service::Auth));
        assert_eq!(group("/health"), RouteGroup::Gateway);
        assert_eq!(group("/v1/functionsx/a"), RouteGroup::Gateway);
        assert_eq!(group("/v1/provisioner/x"), RouteGroup::Gateway);
        assert_eq!(group("/v1/functions/f").budget(), Budget::Functions);
        assert_eq!(group("/v1/auth/user").budget(), Budget::Default);
        assert_eq!(group("/v1/storage/o").body_limit(), BodyLimit::Uploads);
        assert_eq!(group("/v1/db/t").body_limit(), BodyLimit::Server);
        assert_eq!(group("/v1/storage/o").as_str(), "storage");
    }

    #[test]
    fn public_paths_need_their_methods() {
        assert!(is_public(&Method::GET, "/health"));
        assert!(is_public(&Method::GET, JWKS_PATH));
        assert!(is_public(&Method::HEAD, JWKS_PATH));
        assert!(is_public(&Method::POST, "/v1/auth/signup"));
        assert!(!is_public(&Method::GET, "/v1/auth/signup"));
        assert!(!is_public(&Method::POST, "/health"));
        assert!(!is_public(&Method::GET, "/v1/auth/user"));
        assert!(is_public(&Method::GET, "/metrics"));
    }

    #[test]
    fn management_routes_are_whole_segments() {
        for path in [
            "/v1/admin",
            "/v1/admin/plugins",
            "/v1/policies/reload",
            "/v1/projects/p/api-keys",
            "/v1/organizations/o/projects",
            "/ready",
        ] {
            assert!(is_management_route(path), "{path}");
        }
        for path in [
            "/v1/adminx",
            "/v1/projectsx/a",
            "/readyz",
            "/v1/db/projects",
        ] {
            assert!(!is_management_route(path), "{path}");
        }
    }
}
