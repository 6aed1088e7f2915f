//! Who is calling: established by the auth slot of the chain, read by the quota stage and the
//! proxies (the envelope's `actor` object, the `x-aura-*` headers).

use serde::Serialize;

use crate::plane::Plane;

/// The caller's role.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// Publishable key, or no key on a public path.
    Anon,
    /// Publishable key plus a valid user JWT.
    Authenticated,
    /// Secret key.
    ServiceRole,
    /// Console user (management plane).
    Console,
}

impl Role {
    /// Contract spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Anon => "anon",
            Role::Authenticated => "authenticated",
            Role::ServiceRole => "service_role",
            Role::Console => "console",
        }
    }
}

/// The caller of one request. Its serialized fields are the envelope's `actor` object, also
/// written by `EnvelopeRequest::to_json`: a field added here must be written there too.
#[derive(Debug, Clone, Serialize)]
pub struct Actor {
    /// The plane the request came in on (not part of the envelope's actor object).
    #[serde(skip)]
    pub plane: Plane,
    pub role: Role,
    pub project: Option<String>,
    pub key_id: Option<String>,
    pub user_id: Option<String>,
    pub org_role: Option<String>,
    /// The client IP the gateway computed (the TCP peer, or the forwarded address behind a
    /// trusted proxy); envelope field `client_ip`, added in envelope 1.x, omitted when unknown.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub client_ip: Option<std::net::IpAddr>,
    /// The project's plan (for quota rules; not part of the envelope).
    #[serde(skip)]
    pub plan: Option<String>,
}

impl Actor {
    /// The caller before any credential is known: `anon` on the data plane, an unidentified
    /// `console` caller on the management plane.
    pub fn unauthenticated(plane: Plane) -> Self {
        Self {
            plane,
            role: match plane {
                Plane::Data => Role::Anon,
                Plane::Management => Role::Console,
            },
            project: None,
            key_id: None,
            user_id: None,
            org_role: None,
            client_ip: None,
            plan: None,
        }
    }
}
