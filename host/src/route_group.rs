//! Route groups: the unit of timeout budgets, body limits, metrics and quota costs.

/// The group a request path belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RouteGroup {
    Auth,
    Db,
    Storage,
    Functions,
    Realtime,
    Notifications,
    Ai,
    Control,
    /// Management-plane organization and project routes.
    Management,
    /// Answered by the gateway itself (`/health`, `/metrics`) or unknown.
    Gateway,
}

impl RouteGroup {
    /// Every group, in [`RouteGroup::index`] order.
    pub const ALL: [RouteGroup; 10] = [
        RouteGroup::Auth,
        RouteGroup::Db,
        RouteGroup::Storage,
        RouteGroup::Functions,
        RouteGroup::Realtime,
        RouteGroup::Notifications,
        RouteGroup::Ai,
        RouteGroup::Control,
        RouteGroup::Management,
        RouteGroup::Gateway,
    ];

    /// The group's position in [`RouteGroup::ALL`].
    pub fn index(self) -> usize {
        self as usize
    }

    /// The group of `path`.
    pub fn of(path: &str) -> Self {
        let Some(rest) = path.strip_prefix("/v1/") else {
            return if path == "/.well-known/jwks.json" {
                RouteGroup::Auth
            } else {
                RouteGroup::Gateway
            };
        };
        let head = rest.split('/').next().unwrap_or_default();
        match head {
            "auth" => RouteGroup::Auth,
            "db" => RouteGroup::Db,
            "storage" => RouteGroup::Storage,
            "functions" => RouteGroup::Functions,
            "realtime" => RouteGroup::Realtime,
            "notifications" => RouteGroup::Notifications,
            "ai" => RouteGroup::Ai,
            "control" => RouteGroup::Control,
            "organizations" | "projects" => RouteGroup::Management,
            _ => RouteGroup::Gateway,
        }
    }

    /// Label value.
    pub fn as_str(self) -> &'static str {
        match self {
            RouteGroup::Auth => "auth",
            RouteGroup::Db => "db",
            RouteGroup::Storage => "storage",
            RouteGroup::Functions => "functions",
            RouteGroup::Realtime => "realtime",
            RouteGroup::Notifications => "notifications",
            RouteGroup::Ai => "ai",
            RouteGroup::Control => "control",
            RouteGroup::Management => "management",
            RouteGroup::Gateway => "gateway",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::RouteGroup;

    #[test]
    fn groups_follow_the_first_segment() {
        assert_eq!(RouteGroup::of("/v1/functions/hello"), RouteGroup::Functions);
        assert_eq!(RouteGroup::of("/v1/db"), RouteGroup::Db);
        assert_eq!(
            RouteGroup::of("/v1/projects/abc/logs"),
            RouteGroup::Management
        );
        assert_eq!(RouteGroup::of("/.well-known/jwks.json"), RouteGroup::Auth);
        assert_eq!(RouteGroup::of("/health"), RouteGroup::Gateway);
        assert_eq!(RouteGroup::of("/v1/functionsx/a"), RouteGroup::Gateway);
        for (i, g) in RouteGroup::ALL.iter().enumerate() {
            assert_eq!(g.index(), i);
        }
    }
}
