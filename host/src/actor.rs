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

/// Who issued a user token, for quotas, logs and metrics.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum IssuerLabel {
    /// The platform's own tokens (`[auth.user_jwt]`).
    Platform,
    /// One of the project's trusted issuers.
    Project {
        id: uuid::Uuid,
        iss: std::sync::Arc<str>,
    },
    /// No issuer the project trusts (the token was refused).
    Untrusted,
}

impl IssuerLabel {
    /// `platform`, `untrusted`, or the trusted issuer's `iss`.
    pub fn as_str(&self) -> &str {
        match self {
            IssuerLabel::Platform => "platform",
            IssuerLabel::Project { iss, .. } => iss.as_ref(),
            IssuerLabel::Untrusted => "untrusted",
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
    /// The claims of the user's verified token (for the quota stage's named claims; not part of
    /// the envelope).
    #[serde(skip)]
    pub claims: Option<std::sync::Arc<serde_json::Value>>,
    /// Who issued the user's verified token: the platform or one of the project's trusted
    /// issuers (for quotas and logs; not part of the envelope).
    #[serde(skip)]
    pub issuer: Option<IssuerLabel>,
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
            claims: None,
            issuer: None,
        }
    }
}

/// A client address as one caller: the address, an IPv6 one by its /64 (one host commonly holds
/// a whole /64); `-` when unknown. Names the decision cache's partitions before a project is
/// known and the `client_ip` scope of quota buckets.
pub fn client_prefix(client: Option<std::net::IpAddr>) -> std::borrow::Cow<'static, str> {
    use std::borrow::Cow;
    use std::net::IpAddr;
    match client {
        None => Cow::Borrowed("-"),
        Some(IpAddr::V4(v4)) => Cow::Owned(v4.to_string()),
        Some(IpAddr::V6(v6)) => {
            let s = v6.segments();
            Cow::Owned(format!("{:x}:{:x}:{:x}:{:x}::/64", s[0], s[1], s[2], s[3]))
        }
    }
}
