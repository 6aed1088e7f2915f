//! The API key extraction decision, independent of the component glue.

use serde::Deserialize;

/// The stage configuration (`[data_plane.plugins.api_key.config]`).
#[derive(Debug, Default, Deserialize)]
#[cfg_attr(not(target_arch = "wasm32"), derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// Headers that may carry the key, in order of preference. Default `["apikey", "x-api-key"]`.
    pub headers: Option<Vec<String>>,
    /// Paths on which `?apikey=` is accepted. Default: the realtime WebSocket and SSE routes.
    pub query_paths: Option<Vec<String>>,
}

/// Where the key was found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    Header,
    Query,
}

/// Key roles.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    Anon,
    ServiceRole,
}

/// The decision for one request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    Absent,
    Present {
        key: String,
        source: Source,
        allowed_roles: Vec<Role>,
    },
    Refuse(String),
}

/// A configured extraction policy.
#[derive(Debug, Clone)]
pub struct Policy {
    headers: Vec<String>,
    query_paths: Vec<String>,
}

impl Policy {
    /// Builds the policy from the stage configuration (JSON text).
    pub fn configure(json: &str) -> Result<Self, String> {
        let config: Config = if json.trim().is_empty() {
            Config::default()
        } else {
            serde_json::from_str(json).map_err(|e| format!("invalid api_key config: {e}"))?
        };
        let headers: Vec<String> = config
            .headers
            .unwrap_or_else(|| vec!["apikey".to_owned(), "x-api-key".to_owned()])
            .into_iter()
            .map(|h| h.trim().to_ascii_lowercase())
            .collect();
        if headers.is_empty() {
            return Err("headers: at least one header name is required".to_owned());
        }
        if let Some(bad) = headers.iter().find(|h| {
            h.is_empty()
                || !h
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        }) {
            return Err(format!("headers: {bad:?} is not a header name"));
        }
        if headers.iter().any(|h| h == "authorization") {
            return Err("headers: \"authorization\" carries user JWTs, not API keys".to_owned());
        }
        let query_paths = config.query_paths.unwrap_or_else(|| {
            vec![
                "/v1/realtime/websocket".to_owned(),
                "/v1/realtime/sse".to_owned(),
            ]
        });
        if let Some(bad) = query_paths.iter().find(|p| !p.starts_with('/')) {
            return Err(format!("query_paths: {bad:?} must start with '/'"));
        }
        Ok(Self {
            headers,
            query_paths,
        })
    }

    /// The lower-case names of the headers the host must pass to [`Policy::extract`].
    pub fn headers(&self) -> &[String] {
        &self.headers
    }

    /// Decides for one request. `headers` holds only the configured headers (owned in the
    /// component, borrowed from the request where the host runs the policy natively).
    pub fn extract<N: AsRef<str>, V: AsRef<str>>(
        &self,
        path: &str,
        query_keys: &[String],
        headers: &[(N, V)],
    ) -> Decision {
        let mut header_key: Option<&str> = None;
        for (name, value) in headers {
            if !self.headers.iter().any(|h| h == name.as_ref()) {
                continue;
            }
            let value = value.as_ref().trim();
            if value.is_empty() {
                continue;
            }
            match header_key {
                None => header_key = Some(value),
                Some(seen) if seen == value => {}
                Some(_) => return Decision::Refuse("conflicting API keys in headers".to_owned()),
            }
        }
        let mut query_key: Option<&str> = None;
        for value in query_keys {
            let value = value.trim();
            if value.is_empty() {
                continue;
            }
            match query_key {
                None => query_key = Some(value),
                Some(seen) if seen == value => {}
                Some(_) => {
                    return Decision::Refuse("conflicting API keys in the query".to_owned());
                }
            }
        }
        if query_key.is_some() && !self.query_paths.iter().any(|p| p == path) {
            return Decision::Refuse(
                "the apikey query parameter is not accepted on this route; send the apikey header"
                    .to_owned(),
            );
        }
        match (header_key, query_key) {
            (Some(h), Some(q)) if h != q => {
                Decision::Refuse("the apikey header and query parameter differ".to_owned())
            }
            (Some(key), _) => Decision::Present {
                key: key.to_owned(),
                source: Source::Header,
                allowed_roles: vec![Role::Anon, Role::ServiceRole],
            },
            // A key in a URL leaks into logs, traces and Referer headers: never a secret key.
            (None, Some(key)) => Decision::Present {
                key: key.to_owned(),
                source: Source::Query,
                allowed_roles: vec![Role::Anon],
            },
            (None, None) => Decision::Absent,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h(name: &str, value: &str) -> (String, String) {
        (name.to_owned(), value.to_owned())
    }

    const NO_HEADERS: &[(String, String)] = &[];

    #[test]
    fn header_key_is_found_for_both_roles() {
        let p = Policy::configure("{}").expect("config");
        let d = p.extract("/v1/db/todos", &[], &[h("x-api-key", "aura_pk_abc")]);
        assert_eq!(
            d,
            Decision::Present {
                key: "aura_pk_abc".into(),
                source: Source::Header,
                allowed_roles: vec![Role::Anon, Role::ServiceRole]
            }
        );
    }

    #[test]
    fn query_key_only_on_streaming_routes_and_only_anon() {
        let p = Policy::configure("{}").expect("config");
        let q = vec!["aura_pk_abc".to_owned()];
        match p.extract("/v1/realtime/sse", &q, NO_HEADERS) {
            Decision::Present {
                source: Source::Query,
                allowed_roles,
                ..
            } => assert_eq!(allowed_roles, vec![Role::Anon]),
            other => panic!("unexpected {other:?}"),
        }
        assert!(matches!(
            p.extract("/v1/db/todos", &q, NO_HEADERS),
            Decision::Refuse(_)
        ));
        assert!(matches!(
            p.extract("/v1/db/todos", &q, &[h("apikey", "aura_pk_abc")]),
            Decision::Refuse(_)
        ));
    }

    #[test]
    fn conflicting_keys_are_refused_and_absent_is_absent() {
        let p = Policy::configure("{}").expect("config");
        assert!(matches!(
            p.extract("/x", &[], &[h("apikey", "a"), h("x-api-key", "b")]),
            Decision::Refuse(_)
        ));
        assert_eq!(p.extract("/x", &[], &[h("apikey", " ")]), Decision::Absent);
        assert_eq!(p.extract("/x", &[], NO_HEADERS), Decision::Absent);
    }

    #[test]
    fn config_is_validated() {
        assert!(Policy::configure(r#"{"headers":[]}"#).is_err());
        assert!(Policy::configure(r#"{"headers":["authorization"]}"#).is_err());
        assert!(Policy::configure(r#"{"header":["x"]}"#).is_err());
        let p = Policy::configure(r#"{"headers":["X-Key"]}"#).expect("config");
        assert_eq!(p.headers(), ["x-key"]);
    }
}
