//! Name resolution for what the gateway connects to while serving: HTTP backends (each new
//! connection), projects' trusted issuers (the checks of an issuer being added, and key
//! fetches) and the platform's JWKS.
//!
//! Lookups are asynchronous (`hickory-resolver` on the gateway's own runtime): a lookup is a
//! future waiting on a socket and a timer, never a thread of the runtime's blocking pool, so a
//! name server that never answers costs a socket and a timer per lookup — never the threads
//! that file reads, compilations and other tenants' connections need. Each lookup:
//!
//! - answers an IP address written as one at once, without a lookup;
//! - reads `/etc/hosts` first (`localhost` included), then asks the name servers
//!   (`dns.nameservers`, else those of `/etc/resolv.conf` with its search domains);
//! - ends at `dns.timeout_ms` whatever the name servers do: its future is dropped, and its
//!   queries and sockets with it;
//! - takes a place among the `dns.max_in_flight` of its [`Purpose`], or fails at once: a
//!   flood of issuer lookups never takes a backend connection's place.
//!
//! Counted in `aura_dns_lookups_total{purpose, outcome}`.

use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use hickory_resolver::TokioResolver;
use hickory_resolver::config::{
    ConnectionConfig, LookupIpStrategy, NameServerConfig, ResolveHosts, ResolverConfig,
};
use hickory_resolver::net::runtime::TokioRuntimeProvider;
use prometheus::IntCounter;
use tokio::sync::Semaphore;

use crate::config::{DnsConfig, parse_nameserver};
use crate::metrics::Metrics;

/// Who a lookup is for: each purpose has its own places in flight and its own metrics label.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Purpose {
    /// A new connection to an HTTP backend (storage, realtime, a dedicated PostgREST).
    Backend,
    /// A project's trusted issuer: the checks of an issuer being added and its key fetches.
    Issuer,
    /// The platform's own JWKS (`auth.user_jwt.jwks_url`, `auth.console_jwt.jwks_url`).
    Platform,
}

impl Purpose {
    const ALL: [Self; 3] = [Self::Backend, Self::Issuer, Self::Platform];

    /// The metrics label.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Backend => "backend",
            Self::Issuer => "issuer",
            Self::Platform => "platform",
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// Why a name gave no address.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LookupError {
    /// The deadline passed: the lookup was ended.
    #[error("{name} did not resolve in time (within {ms} ms, dns.timeout_ms)")]
    Timeout { name: String, ms: u128 },
    /// The name servers answered without an address, or failed.
    #[error("{name} does not resolve ({reason})")]
    Failed { name: String, reason: String },
    /// Every place of the purpose was taken: nothing was asked.
    #[error("{name} was not looked up: too many lookups in flight (dns.max_in_flight)")]
    Refused { name: String },
}

/// The gateway's resolver; clones share everything.
#[derive(Clone)]
pub struct Resolver {
    inner: Arc<Inner>,
}

struct Inner {
    resolver: TokioResolver,
    deadline: Duration,
    /// Places in flight, by [`Purpose::index`].
    places: [Semaphore; 3],
    /// `[ok, failed, timeout, refused]` by [`Purpose::index`].
    counts: Option<[[IntCounter; 4]; 3]>,
}

impl std::fmt::Debug for Resolver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Resolver")
            .field("deadline", &self.inner.deadline)
            .finish_non_exhaustive()
    }
}

const OK: usize = 0;
const FAILED: usize = 1;
const TIMEOUT: usize = 2;
const REFUSED: usize = 3;

impl Resolver {
    /// The resolver `config` describes (already validated); `metrics` counts its lookups.
    /// Without `dns.nameservers`, `/etc/resolv.conf` is read now; when it names no usable
    /// name server, names resolve from `/etc/hosts` only (logged).
    pub fn new(config: &DnsConfig, metrics: Option<&Metrics>) -> Result<Self, String> {
        let mut builder = if config.nameservers.is_empty() {
            TokioResolver::builder_tokio().unwrap_or_else(|e| {
                tracing::warn!(error = %e, "/etc/resolv.conf names no usable name server: names resolve from /etc/hosts only (set dns.nameservers)");
                TokioResolver::builder_with_config(
                    ResolverConfig::from_name_servers(Vec::new()),
                    TokioRuntimeProvider::default(),
                )
            })
        } else {
            let servers = config
                .nameservers
                .iter()
                .filter_map(|entry| parse_nameserver(entry))
                .map(|addr| {
                    let connections = [ConnectionConfig::udp(), ConnectionConfig::tcp()]
                        .into_iter()
                        .map(|mut connection| {
                            connection.port = addr.port();
                            connection
                        })
                        .collect();
                    NameServerConfig::new(addr.ip(), true, connections)
                })
                .collect();
            TokioResolver::builder_with_config(
                ResolverConfig::from_name_servers(servers),
                TokioRuntimeProvider::default(),
            )
        };
        let deadline = Duration::from_millis(config.timeout_ms);
        let attempts = config.attempts.max(1);
        let options = builder.options_mut();
        // Each query gets its share of the deadline, so that every attempt is made before the
        // deadline ends the lookup.
        options.timeout =
            (deadline / u32::try_from(attempts).unwrap_or(1)).max(Duration::from_millis(50));
        options.attempts = attempts;
        options.use_hosts_file = ResolveHosts::Always;
        // Both families at once, IPv4 first: what the system resolver gives for a backend's
        // name, without waiting for one family before asking the other.
        options.ip_strategy = LookupIpStrategy::Ipv4AndIpv6;
        let resolver = builder.build().map_err(|e| format!("dns: {e}"))?;
        let counts = metrics.map(|m| {
            Purpose::ALL.map(|purpose| {
                ["ok", "failed", "timeout", "refused"].map(|outcome| {
                    m.dns_lookups
                        .with_label_values(&[purpose.as_str(), outcome])
                })
            })
        });
        Ok(Self {
            inner: Arc::new(Inner {
                resolver,
                deadline,
                places: std::array::from_fn(|_| Semaphore::new(config.max_in_flight)),
                counts,
            }),
        })
    }

    /// A resolver with the default `[dns]` (the system's name servers), counting nothing: for
    /// tests and tools.
    pub fn system() -> Self {
        Self::new(&DnsConfig::default(), None).expect("the default resolver builds")
    }

    fn count(&self, purpose: Purpose, outcome: usize) {
        if let Some(counts) = &self.inner.counts {
            counts[purpose.index()][outcome].inc();
        }
    }

    /// The addresses of `host` (a name, or an IP address with or without brackets), for
    /// `purpose`, within the deadline.
    pub async fn lookup(&self, host: &str, purpose: Purpose) -> Result<Vec<IpAddr>, LookupError> {
        let bare = host.trim_start_matches('[').trim_end_matches(']');
        if let Ok(ip) = bare.parse::<IpAddr>() {
            return Ok(vec![ip]);
        }
        let Ok(_place) = self.inner.places[purpose.index()].try_acquire() else {
            self.count(purpose, REFUSED);
            return Err(LookupError::Refused {
                name: host.to_owned(),
            });
        };
        let lookup = self.inner.resolver.lookup_ip(bare);
        let result = match tokio::time::timeout(self.inner.deadline, lookup).await {
            Err(_) => Err(LookupError::Timeout {
                name: host.to_owned(),
                ms: self.inner.deadline.as_millis(),
            }),
            Ok(Err(e)) => Err(LookupError::Failed {
                name: host.to_owned(),
                reason: if e.is_no_records_found() {
                    "no address".to_owned()
                } else {
                    e.to_string()
                },
            }),
            Ok(Ok(found)) => {
                let addresses: Vec<IpAddr> = found.iter().collect();
                if addresses.is_empty() {
                    Err(LookupError::Failed {
                        name: host.to_owned(),
                        reason: "no address".to_owned(),
                    })
                } else {
                    Ok(addresses)
                }
            }
        };
        self.count(
            purpose,
            match &result {
                Ok(_) => OK,
                Err(LookupError::Timeout { .. }) => TIMEOUT,
                Err(_) => FAILED,
            },
        );
        result
    }

    /// [`Resolver::lookup`] as socket addresses of port 0 (the connector sets the port).
    pub async fn socket_addrs(
        &self,
        host: &str,
        purpose: Purpose,
    ) -> Result<Vec<SocketAddr>, LookupError> {
        Ok(self
            .lookup(host, purpose)
            .await?
            .into_iter()
            .map(|ip| SocketAddr::new(ip, 0))
            .collect())
    }

    /// The resolver of HTTP backend connections (hyper-util's `HttpConnector`).
    pub fn for_backends(&self) -> ConnectResolver {
        ConnectResolver(self.clone())
    }

    /// The resolver of an HTTP client's fetches (reqwest) for `purpose`.
    pub fn for_fetches(&self, purpose: Purpose) -> FetchResolver {
        FetchResolver {
            resolver: self.clone(),
            purpose,
        }
    }
}

/// [`Resolver`] as hyper-util's connector resolver, for [`Purpose::Backend`].
#[derive(Debug, Clone)]
pub struct ConnectResolver(Resolver);

impl tower::Service<hyper_util::client::legacy::connect::dns::Name> for ConnectResolver {
    type Response = std::vec::IntoIter<SocketAddr>;
    type Error = LookupError;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, LookupError>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), LookupError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, name: hyper_util::client::legacy::connect::dns::Name) -> Self::Future {
        let resolver = self.0.clone();
        Box::pin(async move {
            let addresses = resolver
                .socket_addrs(name.as_str(), Purpose::Backend)
                .await?;
            Ok(addresses.into_iter())
        })
    }
}

/// [`Resolver`] as reqwest's resolver, for one purpose.
#[derive(Debug, Clone)]
pub struct FetchResolver {
    resolver: Resolver,
    purpose: Purpose,
}

impl FetchResolver {
    /// The addresses of `host`, as [`Resolver::socket_addrs`].
    pub async fn resolve_host(&self, host: &str) -> Result<Vec<SocketAddr>, LookupError> {
        self.resolver.socket_addrs(host, self.purpose).await
    }
}

impl reqwest::dns::Resolve for FetchResolver {
    fn resolve(&self, name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        let this = self.clone();
        let host = name.as_str().to_owned();
        Box::pin(async move {
            let addresses = this.resolve_host(&host).await?;
            Ok(Box::new(addresses.into_iter()) as reqwest::dns::Addrs)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A name server on loopback that reads queries and never answers; counts them.
    fn silent_name_server() -> (SocketAddr, Arc<std::sync::atomic::AtomicUsize>) {
        let socket = std::net::UdpSocket::bind("127.0.0.1:0").expect("bind");
        let addr = socket.local_addr().expect("addr");
        let seen = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counter = seen.clone();
        std::thread::spawn(move || {
            let mut buf = [0u8; 1500];
            while socket.recv_from(&mut buf).is_ok() {
                counter.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
        });
        (addr, seen)
    }

    fn config(server: SocketAddr, timeout_ms: u64, max_in_flight: usize) -> DnsConfig {
        DnsConfig {
            nameservers: vec![server.to_string()],
            timeout_ms,
            attempts: 2,
            max_in_flight,
        }
    }

    #[tokio::test]
    async fn literals_and_hosts_entries_need_no_name_server() {
        let (server, seen) = silent_name_server();
        let resolver = Resolver::new(&config(server, 500, 4), None).expect("resolver");
        for (host, expected) in [
            ("10.1.2.3", "10.1.2.3"),
            ("[::1]", "::1"),
            ("2001:db8::1", "2001:db8::1"),
        ] {
            let found = resolver.lookup(host, Purpose::Backend).await.expect(host);
            assert_eq!(found, vec![expected.parse::<IpAddr>().expect("ip")]);
        }
        let found = resolver
            .lookup("localhost", Purpose::Backend)
            .await
            .expect("localhost");
        assert!(found.contains(&IpAddr::from([127, 0, 0, 1])), "{found:?}");
        assert_eq!(
            seen.load(std::sync::atomic::Ordering::Relaxed),
            0,
            "nothing asked"
        );
    }

    #[tokio::test]
    async fn a_silent_name_server_ends_at_the_deadline_and_places_are_per_purpose() {
        let metrics = Metrics::new();
        let (server, seen) = silent_name_server();
        let resolver = Resolver::new(&config(server, 300, 2), Some(&metrics)).expect("resolver");
        let started = std::time::Instant::now();
        let e = resolver
            .lookup("nx.example", Purpose::Issuer)
            .await
            .expect_err("silent");
        assert!(
            matches!(&e, LookupError::Timeout { name, .. } if name == "nx.example"),
            "{e:?}"
        );
        assert!(e.to_string().contains("nx.example did not resolve in time"));
        let took = started.elapsed();
        assert!(
            took >= Duration::from_millis(300) && took < Duration::from_millis(1500),
            "{took:?}"
        );
        assert!(seen.load(std::sync::atomic::Ordering::Relaxed) >= 1);
        // Two issuer lookups hang: a third is refused at once; a backend lookup is not.
        let (a, b) = (resolver.clone(), resolver.clone());
        let hung = [
            tokio::spawn(async move { a.lookup("a.example", Purpose::Issuer).await }),
            tokio::spawn(async move { b.lookup("b.example", Purpose::Issuer).await }),
        ];
        tokio::time::sleep(Duration::from_millis(50)).await;
        let refused = resolver.lookup("c.example", Purpose::Issuer).await;
        assert_eq!(
            refused,
            Err(LookupError::Refused {
                name: "c.example".to_owned()
            })
        );
        let backend = resolver.lookup("d.example", Purpose::Backend).await;
        assert!(
            matches!(backend, Err(LookupError::Timeout { .. })),
            "{backend:?}"
        );
        for task in hung {
            assert!(matches!(
                task.await.expect("task"),
                Err(LookupError::Timeout { .. })
            ));
        }
        let count = |purpose: &str, outcome: &str| {
            metrics
                .dns_lookups
                .with_label_values(&[purpose, outcome])
                .get()
        };
        assert_eq!(count("issuer", "timeout"), 3);
        assert_eq!(count("issuer", "refused"), 1);
        assert_eq!(count("backend", "timeout"), 1);
    }
}
