//! Projects' trusted issuers: whose keys, fetched how, and where the gateway may connect.
//!
//! A project trusts issuers (`aura_control.project_issuers`, [`IssuerRecord`]); a user token is
//! verified against the keys of the issuer its `iss` names ([`super::user_token`]). Each
//! issuer's keys are a [`KeySource`] held in a bounded registry keyed by where they come from:
//! two projects trusting one issuer share its keys (the audience and role rules stay each
//! project's), an issuer nobody uses is dropped after `auth.issuers.idle_secs`, and nothing is
//! fetched for an issuer no request named.
//!
//! Every fetch goes through one client: `https` only, no redirects, no proxy, TLS from the
//! public roots plus `auth.issuers.tls`, and a resolver that returns only the addresses
//! [`IssuerTargets`] permits — so a connection only ever goes to a checked address, whatever a
//! name resolves to at the moment (DNS rebinding included). An IP address written in a URL is
//! checked before the request.

use std::collections::HashSet;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ipnet::IpNet;
use sha2::Digest as _;

use super::keyset::{
    FetchFailure, FetchLimits, FetchObserver, Fetching, Freshness, KeySet, KeySource, Origin,
    UrlGuard, parse_set,
};
use crate::config::IssuersConfig;
use crate::control::records::check_https_url;
use crate::control::{IssuerRecord, ProjectRecord};
use crate::metrics::Metrics;
use crate::proxy::targets::TargetAllowList;

/// Every address of a host is in a denied network.
#[derive(Debug, Clone, thiserror::Error)]
#[error("every address of {0} is in a denied network (auth.issuers.denied_networks)")]
pub struct AddressRefused(pub String);

/// Where issuers may be: any address outside `denied_networks`, and inside them only what
/// `allowed_targets` lists.
#[derive(Debug)]
pub struct IssuerTargets {
    allowed: TargetAllowList,
    denied: Vec<IpNet>,
}

/// An IPv4-mapped IPv6 address as its IPv4 address.
fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    }
}

impl IssuerTargets {
    /// From `[auth.issuers]` (already validated).
    pub fn new(config: &IssuersConfig) -> Result<Self, String> {
        let denied = config
            .denied_networks
            .iter()
            .map(|n| {
                n.parse::<IpNet>()
                    .map_err(|_| format!("auth.issuers.denied_networks: {n:?} is not a CIDR"))
            })
            .collect::<Result<_, _>>()?;
        Ok(Self {
            allowed: TargetAllowList::parse(&config.allowed_targets)
                .map_err(|e| format!("auth.issuers.allowed_targets: {e}"))?,
            denied,
        })
    }

    /// Whether the gateway may connect to `ip`, reached as host `name` (none: an address
    /// written in the URL).
    pub fn permits(&self, name: Option<&str>, ip: IpAddr) -> bool {
        let ip = canonical(ip);
        if name.is_some_and(|n| self.allowed.allows_name(n)) || self.allowed.allows_ip(ip) {
            return true;
        }
        !self.denied.iter().any(|net| net.contains(&ip))
    }

    /// Checks `url` before a fetch: `https`, no user information, and an IP address in it
    /// permitted (a name is checked when it is resolved).
    pub fn check_url(&self, url: &str) -> Result<(), FetchFailure> {
        check_https_url(url).map_err(|e| FetchFailure::new("not_allowed", e))?;
        let Ok(ip) = host_of(url)?.parse::<IpAddr>() else {
            return Ok(());
        };
        if self.permits(None, ip) {
            Ok(())
        } else {
            Err(FetchFailure::new(
                "not_allowed",
                format!("{ip} is in a denied network (auth.issuers.denied_networks)"),
            ))
        }
    }

    /// [`IssuerTargets::check_url`], and a name resolved now with at least one permitted
    /// address: the check of an issuer being added (the fetches check again each time).
    pub async fn check_resolved(&self, url: &str) -> Result<(), FetchFailure> {
        self.check_url(url)?;
        let name = host_of(url)?;
        if name.parse::<IpAddr>().is_ok() || self.allowed.allows_name(&name) {
            return Ok(());
        }
        let name = name.as_str();
        let port = reqwest::Url::parse(url)
            .ok()
            .and_then(|u| u.port_or_known_default())
            .unwrap_or(443);
        let addrs: Vec<SocketAddr> = tokio::time::timeout(
            Duration::from_secs(2),
            tokio::net::lookup_host((name, port)),
        )
        .await
        .map_err(|_| FetchFailure::new("connect", format!("{name} did not resolve in time")))?
        .map_err(|_| FetchFailure::new("connect", format!("{name} does not resolve")))?
        .collect();
        if addrs.iter().any(|a| self.permits(Some(name), a.ip())) {
            Ok(())
        } else {
            Err(FetchFailure::new(
                "not_allowed",
                AddressRefused(name.to_owned()).to_string(),
            ))
        }
    }
}

/// The host of `url` as the URL parser normalised it (an IP address without brackets).
fn host_of(url: &str) -> Result<String, FetchFailure> {
    let parsed =
        reqwest::Url::parse(url).map_err(|_| FetchFailure::new("not_allowed", "not a URL"))?;
    let host = parsed
        .host_str()
        .ok_or_else(|| FetchFailure::new("not_allowed", "no host"))?;
    Ok(host
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_owned())
}

impl UrlGuard for IssuerTargets {
    fn check(&self, url: &str) -> Result<(), FetchFailure> {
        self.check_url(url)
    }
}

/// The resolver of issuer fetches: only permitted addresses come out.
struct SsrfResolver {
    targets: Arc<IssuerTargets>,
}

impl reqwest::dns::Resolve for SsrfResolver {
    fn resolve(&self, name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        Box::pin(resolve_permitted(
            self.targets.clone(),
            name.as_str().to_owned(),
        ))
    }
}

/// The addresses of `host` that `targets` permits; none is an error ([`AddressRefused`]).
async fn resolve_permitted(
    targets: Arc<IssuerTargets>,
    host: String,
) -> Result<reqwest::dns::Addrs, Box<dyn std::error::Error + Send + Sync>> {
    let resolved = tokio::net::lookup_host((host.as_str(), 0)).await?;
    let permitted: Vec<SocketAddr> = resolved
        .filter(|a| targets.permits(Some(&host), a.ip()))
        .collect();
    if permitted.is_empty() {
        return Err(Box::new(AddressRefused(host)));
    }
    Ok(Box::new(permitted.into_iter()))
}

/// At most so many distinct `issuer` label values; the rest are `other`.
#[derive(Debug)]
struct LabelBudget {
    seen: Mutex<HashSet<String>>,
    cap: usize,
}

impl LabelBudget {
    fn label(&self, iss: &str) -> String {
        let mut iss = iss.to_owned();
        if iss.len() > 256 {
            let mut end = 256;
            while !iss.is_char_boundary(end) {
                end -= 1;
            }
            iss.truncate(end);
        }
        let mut seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
        if seen.contains(&iss) {
            return iss;
        }
        if seen.len() < self.cap {
            seen.insert(iss.clone());
            return iss;
        }
        "other".to_owned()
    }
}

/// Counts one source's fetches under its issuer's label.
struct SourceMetrics {
    fetches: prometheus::IntCounterVec,
    keys: prometheus::IntGaugeVec,
    label: String,
}

impl FetchObserver for SourceMetrics {
    fn fetched(&self, outcome: &'static str) {
        self.fetches
            .with_label_values(&[self.label.as_str(), outcome])
            .inc();
    }

    fn keys(&self, count: usize) {
        self.keys
            .with_label_values(&[self.label.as_str()])
            .set(i64::try_from(count).unwrap_or(i64::MAX));
    }
}

/// The registry of trusted issuers' keys.
pub struct Issuers {
    targets: Arc<IssuerTargets>,
    client: reqwest::Client,
    permits: Arc<tokio::sync::Semaphore>,
    limits: FetchLimits,
    freshness: Freshness,
    sources: moka::sync::Cache<[u8; 32], Arc<KeySource>>,
    labels: LabelBudget,
    metrics: Option<Metrics>,
}

impl std::fmt::Debug for Issuers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Issuers")
            .field("sources", &self.sources.entry_count())
            .finish_non_exhaustive()
    }
}

impl Issuers {
    /// The registry `config` describes; `metrics` counts fetches and verifications.
    pub fn new(config: &IssuersConfig, metrics: Option<&Metrics>) -> Result<Self, String> {
        let targets = Arc::new(IssuerTargets::new(config)?);
        let timeout = Duration::from_millis(config.fetch_timeout_ms);
        let tls = crate::tls::client_config("auth.issuers.tls", config.tls.as_ref(), true)
            .map_err(|e| e.to_string())?;
        let client = super::jwt::fetch_client(timeout)
            .https_only(true)
            .use_preconfigured_tls(tls)
            .dns_resolver(Arc::new(SsrfResolver {
                targets: targets.clone(),
            }))
            .build()
            .map_err(|e| format!("auth.issuers: the fetch client: {e}"))?;
        Ok(Self {
            targets,
            client,
            permits: Arc::new(tokio::sync::Semaphore::new(config.max_concurrent_fetches)),
            limits: FetchLimits {
                timeout,
                max_bytes: config.max_document_bytes,
                max_keys: config.max_keys,
            },
            freshness: Freshness {
                cooldown: Duration::from_secs(config.refresh_cooldown_secs),
                max_age: Duration::from_secs(config.max_age_secs),
                unknown_kid_wait: Duration::from_millis(config.unknown_kid_wait_ms),
                discovery_max_age: Duration::from_secs(config.discovery_max_age_secs),
            },
            sources: moka::sync::Cache::builder()
                .max_capacity(config.max_cached)
                .time_to_idle(Duration::from_secs(config.idle_secs))
                .build(),
            labels: LabelBudget {
                seen: Mutex::new(HashSet::new()),
                cap: config.metrics_issuer_labels,
            },
            metrics: metrics.cloned(),
        })
    }

    /// Where issuers may be.
    pub fn targets(&self) -> &IssuerTargets {
        &self.targets
    }

    /// The metrics label of issuer `iss` (`other` past the label budget).
    pub fn label(&self, iss: &str) -> String {
        self.labels.label(iss)
    }

    /// Counts a user token of `issuer` (a label) and its outcome.
    pub fn count_token(&self, issuer: &str, outcome: &'static str) {
        if let Some(metrics) = &self.metrics {
            metrics
                .user_jwts
                .with_label_values(&[issuer, outcome])
                .inc();
        }
    }

    /// The registry key of a record's keys: where they come from.
    fn source_key(record: &IssuerRecord) -> [u8; 32] {
        let mut hash = sha2::Sha256::new();
        match (&record.jwks_url, &record.keys) {
            (Some(url), _) => {
                hash.update(b"jwks_url\0");
                hash.update(url.as_bytes());
            }
            (None, Some(keys)) => {
                hash.update(b"keys\0");
                hash.update(keys.as_bytes());
            }
            (None, None) => {
                hash.update(b"discovery\0");
                hash.update(record.issuer.as_bytes());
            }
        }
        hash.finalize().into()
    }

    /// The keys of `record`'s issuer, created (and their first fetch started) when no request
    /// asked for them yet. Inline keys that do not parse within `auth.issuers.max_keys` are an
    /// error.
    pub fn source(&self, record: &IssuerRecord) -> Result<Arc<KeySource>, FetchFailure> {
        let key = Self::source_key(record);
        if let Some(source) = self.sources.get(&key) {
            return Ok(source);
        }
        let source = match (&record.jwks_url, &record.keys) {
            (None, Some(keys)) => {
                KeySource::inline(parse_set(keys.as_bytes(), self.limits.max_keys)?)
            }
            (url, _) => {
                let origin = match url {
                    Some(url) => Origin::Url(url.clone()),
                    None => Origin::discovery(record.issuer.clone()),
                };
                KeySource::new(
                    origin,
                    self.client.clone(),
                    self.limits,
                    self.freshness,
                    self.fetching(&record.issuer),
                )
                .started()
            }
        };
        let source = Arc::new(source);
        // Two requests creating it at once: one wins, the other's fetch is dropped with it.
        Ok(self.sources.get_with(key, || source.clone()))
    }

    fn fetching(&self, iss: &str) -> Fetching {
        let guard: Arc<dyn UrlGuard> = self.targets.clone();
        Fetching {
            permits: Some(self.permits.clone()),
            observer: self.metrics.as_ref().map(|m| {
                Box::new(SourceMetrics {
                    fetches: m.issuer_key_fetches.clone(),
                    keys: m.issuer_keys.clone(),
                    label: self.label(iss),
                }) as Box<dyn FetchObserver>
            }),
            guard: Some(guard),
        }
    }

    /// Starts fetching the keys of every issuer of `project` that has none loaded, so that its
    /// users' first tokens rarely wait.
    pub fn warm(&self, project: &ProjectRecord) {
        // Inline keys are parsed when a token first needs them: nothing to fetch.
        for record in project.issuers.iter().filter(|r| r.keys.is_none()) {
            let _ = self.source(record);
        }
    }

    /// The state of `record`'s keys on this instance, if any request or warm-up created them.
    pub fn status(&self, record: &IssuerRecord) -> Option<super::keyset::SourceStatus> {
        self.sources
            .get(&Self::source_key(record))
            .map(|source| source.status())
    }

    /// Fetches `record`'s keys once now, within every bound, without keeping them: the check of
    /// an issuer being added. Every URL is checked, names resolved.
    pub async fn probe(&self, record: &IssuerRecord) -> Result<KeySet, FetchFailure> {
        match (&record.jwks_url, &record.keys) {
            (None, Some(keys)) => parse_set(keys.as_bytes(), self.limits.max_keys),
            (url, _) => {
                let check = url.as_deref().unwrap_or(&record.issuer);
                self.targets.check_resolved(check).await?;
                let origin = match url {
                    Some(url) => Origin::Url(url.clone()),
                    None => Origin::discovery(record.issuer.clone()),
                };
                let guard: Arc<dyn UrlGuard> = self.targets.clone();
                let probe = KeySource::detached(
                    origin,
                    self.client.clone(),
                    self.limits,
                    Fetching {
                        permits: Some(self.permits.clone()),
                        observer: None,
                        guard: Some(guard),
                    },
                );
                probe.probe().await
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn targets(allowed: &[&str]) -> IssuerTargets {
        let config = IssuersConfig {
            allowed_targets: allowed.iter().map(|a| (*a).to_owned()).collect(),
            ..IssuersConfig::default()
        };
        IssuerTargets::new(&config).expect("targets")
    }

    #[test]
    fn private_addresses_are_refused_unless_allowed() {
        let t = targets(&[]);
        for denied in [
            "127.0.0.1",
            "10.1.2.3",
            "169.254.169.254",
            "192.168.1.1",
            "172.16.0.1",
            "100.64.0.1",
            "0.0.0.0",
            "::1",
            "fd00::1",
            "fe80::1",
            "::ffff:127.0.0.1",
            "::ffff:169.254.169.254",
        ] {
            let ip: IpAddr = denied.parse().expect("ip");
            assert!(!t.permits(None, ip), "{denied}");
            assert!(!t.permits(Some("id.example"), ip), "{denied}");
        }
        for public in ["93.184.216.34", "2606:4700::1111"] {
            assert!(t.permits(None, public.parse().expect("ip")), "{public}");
        }
        let t = targets(&["127.0.0.1", ".corp.example"]);
        assert!(t.permits(None, "127.0.0.1".parse().expect("ip")));
        assert!(t.permits(None, "::ffff:127.0.0.1".parse().expect("ip")));
        assert!(!t.permits(None, "127.0.0.2".parse().expect("ip")));
        assert!(t.permits(Some("id.corp.example"), "10.0.0.1".parse().expect("ip")));
        assert!(!t.permits(
            Some("id.corp.example.evil"),
            "10.0.0.1".parse().expect("ip")
        ));
    }

    #[test]
    fn urls_are_https_without_user_information_and_their_addresses_checked() {
        let t = targets(&["127.0.0.1"]);
        assert!(t.check_url("https://127.0.0.1:8443/jwks.json").is_ok());
        assert!(t.check_url("https://id.example/jwks.json").is_ok());
        for refused in [
            "http://id.example/jwks.json",
            "https://user:pw@id.example/jwks.json",
            "https://127.0.0.2/jwks.json",
            "https://[::1]/jwks.json",
            "https://169.254.169.254/latest",
            "https://id.example/jwks.json#x",
            "file:///etc/passwd",
        ] {
            let e = t.check_url(refused).expect_err(refused);
            assert_eq!(e.outcome, "not_allowed", "{refused}");
        }
    }

    #[test]
    fn issuer_labels_are_budgeted() {
        let budget = LabelBudget {
            seen: Mutex::new(HashSet::new()),
            cap: 2,
        };
        assert_eq!(budget.label("https://a"), "https://a");
        assert_eq!(budget.label("https://b"), "https://b");
        assert_eq!(budget.label("https://c"), "other");
        assert_eq!(budget.label("https://a"), "https://a");
        let roomy = LabelBudget {
            seen: Mutex::new(HashSet::new()),
            cap: 2,
        };
        assert_eq!(roomy.label(&"x".repeat(300)).len(), 256);
    }
}
