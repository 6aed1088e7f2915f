//! The CORS decision, independent of the component glue.

use serde::Deserialize;

/// The plane a policy instance serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Plane {
    Data,
    Management,
}

/// The stage configuration (`[<plane>.plugins.cors.config]`).
#[derive(Debug, Default, Deserialize)]
#[cfg_attr(not(target_arch = "wasm32"), derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// Allowed origins. Data plane default `["*"]`; management plane default: none.
    pub allow_origins: Option<Vec<String>>,
    /// Methods announced on a preflight.
    pub allow_methods: Option<Vec<String>>,
    /// Request headers announced on a preflight.
    pub allow_headers: Option<Vec<String>>,
    /// Response headers exposed to scripts.
    pub expose_headers: Option<Vec<String>>,
    /// Preflight cache lifetime in seconds.
    pub max_age_secs: Option<u32>,
}

/// A configured CORS policy.
#[derive(Debug, Clone)]
pub struct Policy {
    any_origin: bool,
    origins: Vec<String>,
    allow_methods: Vec<String>,
    allow_headers: Vec<String>,
    expose_headers: Vec<String>,
    max_age: u32,
}

/// The headers for an allowed origin.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Allow {
    pub allow_origin: String,
    pub allow_methods: Vec<String>,
    pub allow_headers: Vec<String>,
    pub expose_headers: Vec<String>,
    pub max_age: Option<u32>,
}

fn strings(items: &[&str]) -> Vec<String> {
    items.iter().map(|s| (*s).to_owned()).collect()
}

impl Policy {
    /// Builds the policy from the stage configuration (JSON text).
    pub fn configure(plane: Plane, json: &str) -> Result<Self, String> {
        let config: Config = if json.trim().is_empty() {
            Config::default()
        } else {
            serde_json::from_str(json).map_err(|e| format!("invalid cors config: {e}"))?
        };
        let origins = match (plane, config.allow_origins) {
            (_, Some(list)) => list,
            (Plane::Data, None) => vec!["*".to_owned()],
            (Plane::Management, None) => Vec::new(),
        };
        let mut any_origin = false;
        let mut exact = Vec::with_capacity(origins.len());
        for origin in origins {
            let origin = origin.trim().trim_end_matches('/').to_owned();
            if origin == "*" {
                if plane == Plane::Management {
                    return Err("allow_origins: \"*\" is refused on the management plane; \
                                list the console origins explicitly"
                        .to_owned());
                }
                any_origin = true;
            } else if origin.is_empty() || origin.contains('*') {
                return Err(format!(
                    "allow_origins: {origin:?} is not an origin (scheme://host[:port])"
                ));
            } else if !(origin.starts_with("http://") || origin.starts_with("https://")) {
                return Err(format!(
                    "allow_origins: {origin:?} must start with http:// or https://"
                ));
            } else {
                exact.push(origin.to_ascii_lowercase());
            }
        }
        let (methods, headers): (&[&str], &[&str]) = match plane {
            Plane::Data => (
                &["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"],
                &[
                    "authorization",
                    "apikey",
                    "x-api-key",
                    "content-type",
                    "x-client-info",
                    "range",
                    "prefer",
                    "accept-profile",
                    "content-profile",
                    "x-upsert",
                ],
            ),
            Plane::Management => (
                &["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"],
                &["authorization", "content-type", "x-aura-project"],
            ),
        };
        Ok(Self {
            any_origin,
            origins: exact,
            allow_methods: config.allow_methods.unwrap_or_else(|| strings(methods)),
            allow_headers: config.allow_headers.unwrap_or_else(|| strings(headers)),
            expose_headers: config.expose_headers.unwrap_or_else(|| {
                strings(&[
                    "x-request-id",
                    "content-range",
                    "retry-after",
                    "ratelimit-limit",
                    "ratelimit-remaining",
                    "ratelimit-reset",
                ])
            }),
            max_age: config.max_age_secs.unwrap_or(match plane {
                Plane::Data => 3600,
                Plane::Management => 600,
            }),
        })
    }

    /// Whether decisions depend on the origin (not when any origin is allowed).
    pub fn reads_origin(&self) -> bool {
        !self.any_origin
    }

    /// Decides for one request carrying `origin`. `None` means the origin is not allowed.
    pub fn decide(&self, origin: &str, preflight: bool) -> Option<Allow> {
        let allow_origin = if self.any_origin {
            "*".to_owned()
        } else if self
            .origins
            .iter()
            .any(|o| o.eq_ignore_ascii_case(origin.trim_end_matches('/')))
        {
            origin.to_owned()
        } else {
            return None;
        };
        Some(if preflight {
            Allow {
                allow_origin,
                allow_methods: self.allow_methods.clone(),
                allow_headers: self.allow_headers.clone(),
                expose_headers: Vec::new(),
                max_age: Some(self.max_age),
            }
        } else {
            Allow {
                allow_origin,
                allow_methods: Vec::new(),
                allow_headers: Vec::new(),
                expose_headers: self.expose_headers.clone(),
                max_age: None,
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn data_plane_defaults_to_any_origin() {
        let p = Policy::configure(Plane::Data, "{}").expect("config");
        let a = p.decide("https://anything.example", true).expect("allowed");
        assert_eq!(a.allow_origin, "*");
        assert!(a.max_age.is_some());
    }

    #[test]
    fn management_refuses_wildcard_and_defaults_to_nothing() {
        let err = Policy::configure(Plane::Management, r#"{"allow_origins":["*"]}"#)
            .expect_err("wildcard refused");
        assert!(err.contains("allow_origins"), "{err}");
        let p = Policy::configure(Plane::Management, "{}").expect("config");
        assert_eq!(p.decide("https://studio.example", false), None);
    }

    #[test]
    fn management_echoes_listed_origin_only() {
        let p = Policy::configure(
            Plane::Management,
            r#"{"allow_origins":["https://Studio.example/"]}"#,
        )
        .expect("config");
        let a = p.decide("https://studio.example", false).expect("listed");
        assert_eq!(a.allow_origin, "https://studio.example");
        assert!(p.decide("https://evil.example", false).is_none());
        assert!(p.decide("https://studio.example.evil", false).is_none());
    }

    #[test]
    fn unknown_keys_and_bad_origins_are_refused() {
        assert!(Policy::configure(Plane::Data, r#"{"origins":[]}"#).is_err());
        assert!(Policy::configure(Plane::Data, r#"{"allow_origins":["*.x.com"]}"#).is_err());
        assert!(Policy::configure(Plane::Data, r#"{"allow_origins":["x.com"]}"#).is_err());
    }
}
