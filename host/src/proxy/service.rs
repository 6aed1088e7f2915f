//! The backend services behind the gateway.

/// A backend service (CONTRACT §2).
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

impl Service {
    /// Every service.
    pub const ALL: [Service; 9] = [
        Service::Auth,
        Service::Db,
        Service::Storage,
        Service::Functions,
        Service::Realtime,
        Service::Notifications,
        Service::Ai,
        Service::Provisioner,
        Service::Control,
    ];

    /// The service's position in [`Service::ALL`].
    pub fn index(self) -> usize {
        self as usize
    }

    /// The prefix of the service's routes (`/v1/{name}`).
    pub fn route_prefix(self) -> &'static str {
        match self {
            Service::Auth => "/v1/auth",
            Service::Db => "/v1/db",
            Service::Storage => "/v1/storage",
            Service::Functions => "/v1/functions",
            Service::Realtime => "/v1/realtime",
            Service::Notifications => "/v1/notifications",
            Service::Ai => "/v1/ai",
            Service::Provisioner => "/v1/provisioner",
            Service::Control => "/v1/control",
        }
    }

    /// The service name, as used in NATS subjects (`{prefix}.{name}.http`).
    pub fn name(self) -> &'static str {
        match self {
            Service::Auth => "auth",
            Service::Db => "db",
            Service::Storage => "storage",
            Service::Functions => "functions",
            Service::Realtime => "realtime",
            Service::Notifications => "notifications",
            Service::Ai => "ai",
            Service::Provisioner => "provisioner",
            Service::Control => "control",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_service_is_at_its_index_in_all() {
        for (i, service) in Service::ALL.into_iter().enumerate() {
            assert_eq!(service.index(), i, "{service:?}");
        }
    }

    #[test]
    fn each_route_prefix_is_v1_and_the_service_name() {
        for service in Service::ALL {
            assert_eq!(service.route_prefix(), format!("/v1/{}", service.name()));
        }
    }
}
