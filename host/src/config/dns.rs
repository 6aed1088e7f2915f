//! `[dns]`: how the gateway resolves names (backends, issuers, the platform's JWKS).

use std::net::{IpAddr, SocketAddr};

use serde::{Deserialize, Serialize};

use super::{ConfigError, problem};

/// The gateway's own asynchronous resolver: lookups never take a thread, each one ends at its
/// deadline, and each purpose has its own bound of lookups in flight.
#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct DnsConfig {
    /// Name servers to ask, as `ip:port` (or `ip`, port 53), in order; empty: those of
    /// `/etc/resolv.conf`, with its search domains. `/etc/hosts` is read first either way.
    pub nameservers: Vec<String>,
    /// The deadline of one lookup, in milliseconds (100–30000): when it passes the lookup is
    /// ended and fails.
    pub timeout_ms: u64,
    /// Queries sent to each name server before a lookup gives up (1–5); each waits at most
    /// `timeout_ms / attempts`.
    pub attempts: usize,
    /// Lookups in flight at once for each purpose (backend connections; projects' issuers;
    /// the platform's JWKS), 1–65536; past it a lookup fails at once, counted.
    pub max_in_flight: usize,
}

impl Default for DnsConfig {
    fn default() -> Self {
        Self {
            nameservers: Vec::new(),
            timeout_ms: 2_000,
            attempts: 2,
            max_in_flight: 256,
        }
    }
}

/// A name server entry: `ip:port`, `[v6]:port` or a bare address (port 53).
pub fn parse_nameserver(entry: &str) -> Option<SocketAddr> {
    entry
        .parse::<SocketAddr>()
        .ok()
        .or_else(|| {
            entry
                .parse::<IpAddr>()
                .ok()
                .map(|ip| SocketAddr::new(ip, 53))
        })
        .filter(|addr| addr.port() != 0)
}

impl DnsConfig {
    /// Checks the section, `key` naming it.
    pub(super) fn validate(&self, key: &str) -> Result<(), ConfigError> {
        for entry in &self.nameservers {
            if parse_nameserver(entry).is_none() {
                return Err(problem(
                    &format!("{key}.nameservers"),
                    format!("{entry:?} is not an ip:port address (e.g. \"10.0.0.2:53\")"),
                ));
            }
        }
        if self.nameservers.len() > 16 {
            return Err(problem(
                &format!("{key}.nameservers"),
                "at most 16 name servers",
            ));
        }
        let within = |field, value, low, high| super::within(key, field, value, low, high);
        within("timeout_ms", self.timeout_ms, 100, 30_000)?;
        within("attempts", self.attempts as u64, 1, 5)?;
        within("max_in_flight", self.max_in_flight as u64, 1, 65_536)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn name_servers_and_bounds_are_checked_naming_the_key() {
        assert!(DnsConfig::default().validate("dns").is_ok());
        assert_eq!(
            parse_nameserver("127.0.0.1:5353"),
            Some("127.0.0.1:5353".parse().expect("addr"))
        );
        assert_eq!(
            parse_nameserver("::1"),
            Some("[::1]:53".parse().expect("addr"))
        );
        for (edit, key) in [
            (
                DnsConfig {
                    nameservers: vec!["ns.example:53".to_owned()],
                    ..DnsConfig::default()
                },
                "dns.nameservers",
            ),
            (
                DnsConfig {
                    nameservers: vec!["127.0.0.1:0".to_owned()],
                    ..DnsConfig::default()
                },
                "dns.nameservers",
            ),
            (
                DnsConfig {
                    timeout_ms: 0,
                    ..DnsConfig::default()
                },
                "dns.timeout_ms",
            ),
            (
                DnsConfig {
                    attempts: 0,
                    ..DnsConfig::default()
                },
                "dns.attempts",
            ),
            (
                DnsConfig {
                    max_in_flight: 0,
                    ..DnsConfig::default()
                },
                "dns.max_in_flight",
            ),
        ] {
            let e = edit.validate("dns").expect_err(key);
            assert_eq!(e.key, key);
        }
    }
}
