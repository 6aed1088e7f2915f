//! `[upstreams]`: the HTTP backends (storage, realtime, dedicated PostgREST targets).

use std::net::IpAddr;

use ipnet::IpNet;
use serde::{Deserialize, Serialize};

use super::{ClientTlsConfig, ConfigError, problem};

/// HTTP backends.
#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct UpstreamsConfig {
    /// Base URL of the storage service (`http://host:port[/path]`); none: storage answers 503.
    pub storage_url: Option<String>,
    /// Base URL of the realtime service; none: realtime answers 503.
    pub realtime_url: Option<String>,
    /// Largest upload accepted on `/v1/storage/*`, in bytes (streamed, never buffered).
    pub storage_max_body_bytes: u64,
    /// Time allowed to open a connection to an HTTP backend, in milliseconds.
    pub connect_timeout_ms: u64,
    /// A stream (body, SSE, WebSocket) with no traffic either way for this long is closed, in
    /// seconds. Streams are not bounded by the route budget once established.
    pub stream_idle_timeout_secs: u64,
    /// Idle pooled connections kept per backend host.
    pub pool_max_idle_per_host: usize,
    /// Dedicated PostgREST targets the gateway may call: CIDRs (`10.0.0.0/8`), IP addresses,
    /// host names (`pg.internal`) or suffixes (`.pg.internal`). A project's `postgrest_url`
    /// outside the list is answered `503 db_target_not_allowed`. Empty: none allowed.
    pub postgrest_allowed_targets: Vec<String>,
    /// Trust for `https://` backends: a CA bundle added to the public roots, a client
    /// certificate. `http://` backends stay allowed (`check-config` warns when one that
    /// receives credentials is not on loopback).
    pub tls: Option<ClientTlsConfig>,
    /// The request header that names the client's region (`x-client-region`, a CDN's country
    /// header, …), passed to the db-routing stage to pick a read replica. The edge in front of
    /// the gateway must set it (a client could send it): it only ever picks among the project's
    /// own replicas. A value over 64 bytes or not visible ASCII is ignored. None: no region.
    pub client_region_header: Option<String>,
}

/// The longest client region taken from `upstreams.client_region_header`, in bytes.
pub const MAX_REGION_BYTES: usize = 64;

impl Default for UpstreamsConfig {
    fn default() -> Self {
        Self {
            storage_url: None,
            realtime_url: None,
            storage_max_body_bytes: 5 * 1024 * 1024 * 1024,
            connect_timeout_ms: 2_000,
            stream_idle_timeout_secs: 300,
            pool_max_idle_per_host: 64,
            postgrest_allowed_targets: Vec::new(),
            tls: None,
            client_region_header: None,
        }
    }
}

impl UpstreamsConfig {
    /// The base URL of each service reached over HTTP, by service name: `upstreams.{name}_url`.
    pub(crate) fn service_urls(&self) -> [(&'static str, &Option<String>); 2] {
        [
            ("storage", &self.storage_url),
            ("realtime", &self.realtime_url),
        ]
    }

    /// Whether `upstreams.{name}_url` is a key of this section.
    pub fn has_url_for(&self, name: &str) -> bool {
        self.service_urls().iter().any(|(n, _)| *n == name)
    }

    /// The base URL configured for the HTTP service named `name`, when set.
    pub fn url_of(&self, name: &str) -> Option<&str> {
        self.service_urls()
            .into_iter()
            .find(|(n, _)| *n == name)
            .and_then(|(_, url)| url.as_deref())
    }

    /// The entries of `postgrest_allowed_targets`; the error names the first that is none.
    pub fn postgrest_targets(&self) -> Result<Vec<TargetEntry>, String> {
        self.postgrest_allowed_targets
            .iter()
            .map(|entry| TargetEntry::parse(entry))
            .collect()
    }

    /// The client's region, from `client_region_header`, when set and within bounds.
    pub fn client_region<'a>(&self, headers: &'a http::HeaderMap) -> Option<&'a str> {
        let name = self.client_region_header.as_deref()?;
        let value = headers.get(name)?.to_str().ok()?;
        (!value.is_empty()
            && value.len() <= MAX_REGION_BYTES
            && value.bytes().all(|b| b.is_ascii_graphic()))
        .then_some(value)
    }

    /// Checks the section, `key` naming it.
    pub(super) fn validate(&self, key: &str) -> Result<(), ConfigError> {
        if let Some(name) = &self.client_region_header
            && http::HeaderName::from_bytes(name.as_bytes())
                .map_or(true, |n| n.as_str() != name.as_str())
        {
            return Err(problem(
                &format!("{key}.client_region_header"),
                format!("{name:?} is not a lower-case header name"),
            ));
        }
        if let Some(tls) = &self.tls {
            tls.validate(&format!("{key}.tls"))?;
        }
        for (name, url) in self.service_urls() {
            if let Some(url) = url
                && url
                    .parse::<http::Uri>()
                    .ok()
                    .filter(|uri| {
                        matches!(uri.scheme_str(), Some("http" | "https")) && uri.host().is_some()
                    })
                    .is_none()
            {
                return Err(problem(
                    &format!("{key}.{name}_url"),
                    format!("{url:?} is not an http(s)://host[:port][/path] URL"),
                ));
            }
        }
        if let Err(e) = self.postgrest_targets() {
            return Err(problem(&format!("{key}.postgrest_allowed_targets"), e));
        }
        let at_least = |field, value, min| super::at_least(key, field, value, min);
        at_least("storage_max_body_bytes", self.storage_max_body_bytes, 1)?;
        at_least("connect_timeout_ms", self.connect_timeout_ms, 1)?;
        at_least("stream_idle_timeout_secs", self.stream_idle_timeout_secs, 1)
    }
}

/// An entry of `upstreams.postgrest_allowed_targets`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TargetEntry {
    /// A network (`10.0.0.0/8`); an IP address is a network of one.
    Net(IpNet),
    /// A host name (`pg.internal`), lower case.
    Host(String),
    /// A suffix (`.pg.internal`), lower case, starting with `.`.
    Suffix(String),
}

impl TargetEntry {
    /// Parses an entry: a CIDR, an IP address, a host name or a `.suffix`. The error names the
    /// entry.
    pub fn parse(entry: &str) -> Result<Self, String> {
        let e = entry.trim().to_ascii_lowercase();
        if let Ok(net) = e.parse::<IpNet>() {
            Ok(TargetEntry::Net(net))
        } else if let Ok(ip) = e.parse::<IpAddr>() {
            Ok(TargetEntry::Net(IpNet::from(ip)))
        } else if let Some(rest) = e.strip_prefix('.')
            && is_host_name(rest)
        {
            Ok(TargetEntry::Suffix(e))
        } else if is_host_name(&e) {
            Ok(TargetEntry::Host(e))
        } else {
            Err(format!(
                "{entry:?} is neither a CIDR, an IP address, a host name nor a .suffix"
            ))
        }
    }
}

/// Whether `s` is a DNS host name: dot-separated labels of 1 to 63 letters, digits and `-`.
fn is_host_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 253
        && s.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && label
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-')
        })
}

#[cfg(test)]
mod tests {
    use super::TargetEntry;

    #[test]
    fn target_entries_are_networks_hosts_or_suffixes() {
        assert_eq!(
            TargetEntry::parse(" 192.0.2.7 "),
            Ok(TargetEntry::Net("192.0.2.7/32".parse().expect("net")))
        );
        assert_eq!(
            TargetEntry::parse("10.1.0.0/16"),
            Ok(TargetEntry::Net("10.1.0.0/16".parse().expect("net")))
        );
        assert_eq!(
            TargetEntry::parse(".PG.internal"),
            Ok(TargetEntry::Suffix(".pg.internal".to_owned()))
        );
        assert_eq!(
            TargetEntry::parse("db.example"),
            Ok(TargetEntry::Host("db.example".to_owned()))
        );
        for bad in ["10.0.0.0/33", "a b", "", ".", "-x..y"] {
            let e = TargetEntry::parse(bad).expect_err(bad);
            assert!(e.contains(&format!("{bad:?}")), "{e}");
        }
    }
}
