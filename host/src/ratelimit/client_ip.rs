//! The client IP of a request: the TCP peer, unless the peer is a trusted proxy, in which case
//! the rightmost `X-Forwarded-For` address that is not itself a trusted proxy.

use std::net::{IpAddr, Ipv6Addr};

use http::HeaderMap;
use ipnet::IpNet;

/// The client IP of a request from `peer` with `headers`.
pub fn client_ip(peer: IpAddr, headers: &HeaderMap, trusted: &[IpNet]) -> IpAddr {
    let peer = canonical(peer);
    let is_trusted = |ip: &IpAddr| trusted.iter().any(|net| net.contains(ip));
    if !is_trusted(&peer) {
        return peer;
    }
    // All X-Forwarded-For headers, in order, as one list.
    let hops: Vec<IpAddr> = headers
        .get_all("x-forwarded-for")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|hop| hop.trim().parse::<IpAddr>().ok())
        .map(canonical)
        .collect();
    hops.iter()
        .rev()
        .find(|ip| !is_trusted(ip))
        .or_else(|| hops.first())
        .copied()
        .unwrap_or(peer)
}

/// IPv4-mapped IPv6 addresses as IPv4.
pub fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map(IpAddr::V4).unwrap_or(ip),
        v4 => v4,
    }
}

/// The rate-limit key of an address: IPv4 as is, IPv6 by its /64 (one subscriber's prefix).
pub fn bucket_of(ip: IpAddr) -> IpAddr {
    match canonical(ip) {
        IpAddr::V6(v6) => {
            let s = v6.segments();
            IpAddr::V6(Ipv6Addr::new(s[0], s[1], s[2], s[3], 0, 0, 0, 0))
        }
        v4 => v4,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(xff: &[&str]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for v in xff {
            h.append("x-forwarded-for", v.parse().expect("value"));
        }
        h
    }

    #[test]
    fn forwarded_for_is_ignored_from_an_untrusted_peer() {
        let trusted: Vec<IpNet> = vec!["10.0.0.0/8".parse().expect("net")];
        let ip = client_ip(
            "203.0.113.9".parse().expect("ip"),
            &headers(&["1.2.3.4"]),
            &trusted,
        );
        assert_eq!(ip, "203.0.113.9".parse::<IpAddr>().expect("ip"));
    }

    #[test]
    fn the_rightmost_untrusted_hop_is_the_client() {
        let trusted: Vec<IpNet> = vec!["10.0.0.0/8".parse().expect("net")];
        let ip = client_ip(
            "10.0.0.2".parse().expect("ip"),
            &headers(&["6.6.6.6, 198.51.100.7", "10.0.0.1"]),
            &trusted,
        );
        assert_eq!(
            ip,
            "198.51.100.7".parse::<IpAddr>().expect("ip"),
            "a spoofed left entry is ignored"
        );
        let ip = client_ip("10.0.0.2".parse().expect("ip"), &HeaderMap::new(), &trusted);
        assert_eq!(ip, "10.0.0.2".parse::<IpAddr>().expect("ip"));
    }

    #[test]
    fn ipv6_is_keyed_by_its_64_prefix() {
        let a = bucket_of("2001:db8:1:2:aaaa::1".parse().expect("ip"));
        let b = bucket_of("2001:db8:1:2:bbbb::9".parse().expect("ip"));
        let c = bucket_of("2001:db8:1:3::1".parse().expect("ip"));
        assert_eq!(a, b);
        assert_ne!(a, c);
        assert_eq!(
            bucket_of("::ffff:192.0.2.1".parse().expect("ip")),
            "192.0.2.1".parse::<IpAddr>().expect("ip")
        );
    }
}
