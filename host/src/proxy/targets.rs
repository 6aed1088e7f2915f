//! Which dedicated PostgREST targets the gateway may call.
//!
//! A project's `postgrest_url` comes from the control store, and the URL a request goes to is
//! whatever the `db-routing` stage answers: neither is taken on trust. Before any connection,
//! the host checks the URL against `upstreams.postgrest_allowed_targets`: `http://` or `https://` (trusted
//! through `upstreams.tls`), no
//! user information, and a host that is an IP address inside one of the listed CIDRs or a name
//! equal to a listed host or ending with a listed `.suffix`. An empty list allows nothing.

use std::net::IpAddr;

use ipnet::IpNet;

use crate::config::TargetEntry;

/// The parsed allow-list.
#[derive(Debug, Clone, Default)]
pub struct TargetAllowList {
    nets: Vec<IpNet>,
    /// Exact host names, lower case.
    hosts: Vec<String>,
    /// Suffixes, lower case, each starting with `.`.
    suffixes: Vec<String>,
}

/// Why a target was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TargetRefused {
    #[error("not an http(s)://host[:port][/path] URL")]
    NotHttp,
    #[error("user information in the URL")]
    UserInfo,
    #[error("host {0} is not in upstreams.postgrest_allowed_targets")]
    NotAllowed(String),
}

impl TargetAllowList {
    /// Parses the entries: a CIDR (`10.0.0.0/8`), an IP address, a host name (`pg.internal`)
    /// or a suffix (`.pg.internal`). Errors name the entry.
    pub fn parse(entries: &[String]) -> Result<Self, String> {
        let mut list = Self::default();
        for entry in entries {
            match TargetEntry::parse(entry)? {
                TargetEntry::Net(net) => list.nets.push(net),
                TargetEntry::Host(host) => list.hosts.push(host),
                TargetEntry::Suffix(suffix) => list.suffixes.push(suffix),
            }
        }
        Ok(list)
    }

    /// Whether `ip` is inside a listed network (an IPv4-mapped IPv6 address as its IPv4).
    pub fn allows_ip(&self, ip: IpAddr) -> bool {
        let ip = match ip {
            IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
            v4 => v4,
        };
        self.nets.iter().any(|n| n.contains(&ip))
    }

    /// Whether host name `name` is listed, or ends with a listed suffix (case and a final `.`
    /// ignored).
    pub fn allows_name(&self, name: &str) -> bool {
        let name = name.trim_end_matches('.').to_ascii_lowercase();
        self.hosts.contains(&name) || self.suffixes.iter().any(|s| name.ends_with(s.as_str()))
    }

    /// Checks a target URL.
    pub fn check(&self, url: &str) -> Result<(), TargetRefused> {
        let uri: http::Uri = url.parse().map_err(|_| TargetRefused::NotHttp)?;
        if !matches!(uri.scheme_str(), Some("http" | "https")) {
            return Err(TargetRefused::NotHttp);
        }
        let authority = uri.authority().ok_or(TargetRefused::NotHttp)?;
        if authority.as_str().contains('@') {
            return Err(TargetRefused::UserInfo);
        }
        let host = authority.host();
        let bare = host.trim_start_matches('[').trim_end_matches(']');
        let allowed = match bare.parse::<IpAddr>() {
            Ok(ip) => self.allows_ip(ip),
            Err(_) => self.allows_name(bare),
        };
        if allowed {
            Ok(())
        } else {
            Err(TargetRefused::NotAllowed(host.to_owned()))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{TargetAllowList, TargetRefused};

    fn list(entries: &[&str]) -> TargetAllowList {
        TargetAllowList::parse(&entries.iter().map(|e| (*e).to_owned()).collect::<Vec<_>>())
            .expect("valid list")
    }

    #[test]
    fn targets_are_checked_by_network_and_name() {
        let l = list(&["10.1.0.0/16", "192.0.2.7", ".pg.internal", "db.example"]);
        assert_eq!(l.check("http://10.1.2.3:3000"), Ok(()));
        assert_eq!(l.check("http://192.0.2.7/rest"), Ok(()));
        assert_eq!(l.check("http://alpha.pg.internal:3000"), Ok(()));
        assert_eq!(l.check("http://DB.example"), Ok(()));
        assert_eq!(l.check("https://alpha.pg.internal"), Ok(()));
        assert_eq!(
            l.check("ftp://alpha.pg.internal"),
            Err(TargetRefused::NotHttp)
        );
        for refused in [
            "http://10.2.0.1:3000",
            "http://169.254.169.254/latest/meta-data",
            "http://evil-pg.internal",
            "http://pg.internal.evil.test",
            "http://db.example.evil.test",
            "http://[::1]:3000",
        ] {
            assert!(
                matches!(l.check(refused), Err(TargetRefused::NotAllowed(_))),
                "{refused}"
            );
        }
        assert_eq!(
            l.check("http://user:pw@10.1.2.3"),
            Err(TargetRefused::UserInfo)
        );
        assert_eq!(l.check("https://10.1.2.3"), Ok(()));
        assert_eq!(l.check("file:///etc/passwd"), Err(TargetRefused::NotHttp));
        assert!(matches!(
            TargetAllowList::default().check("http://10.1.2.3"),
            Err(TargetRefused::NotAllowed(_))
        ));
    }

    #[test]
    fn bad_entries_are_named() {
        let e = TargetAllowList::parse(&["10.0.0.0/33".to_owned()]).expect_err("bad");
        assert!(e.contains("10.0.0.0/33"), "{e}");
        assert!(TargetAllowList::parse(&["a b".to_owned()]).is_err());
    }
}
