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
