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
//! checked before the request. Names resolve through the gateway's own resolver
//! ([`crate::dns`], purpose `issuer`): never a thread of the runtime's, each lookup ended at
//! `dns.timeout_ms`.
//!
//! The checks of an issuer being added (its names resolved, its keys fetched once) hold places
//! of their own, `auth.issuers.max_concurrent_probes`, at most
//! `max_probes_per_organization` of them for one organization, and never the permits of the
//! key fetches that users' tokens wait for: one organization adding issuers in a loop cannot
//! delay another's first token.

use std::collections::{HashMap, HashSet};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ipnet::IpNet;
use sha2::Digest as _;

use super::keyset::{
    AddressRefused, FetchFailure, FetchLimits, FetchObserver, Fetching, Freshness, KeySet,
    KeySource, Origin, UrlGuard, parse_set,
};
use crate::config::IssuersConfig;
use crate::control::records::check_https_url;
use crate::control::{IssuerRecord, ProjectRecord};
use crate::dns::{FetchResolver, LookupError, Purpose};
use crate::metrics::Metrics;
use crate::proxy::targets::TargetAllowList;

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

/// The IPv4 addresses an IPv6 address carries to a translator or relay that may deliver to
/// them: NAT64 (`64:ff9b::/96`, `64:ff9b:1::/48`, RFC 6052), 6to4 (`2002::/16`, RFC 3056) and
/// Teredo (`2001::/32`, RFC 4380: its server, and its client stored inverted).
fn embedded_ipv4(ip: IpAddr) -> Vec<Ipv4Addr> {
    let IpAddr::V6(v6) = ip else {
        return Vec::new();
    };
    let o = v6.octets();
    let v4 = |a: u8, b: u8, c: u8, d: u8| Ipv4Addr::new(a, b, c, d);
    let s = v6.segments();
    match (s[0], s[1], s[2]) {
        (0x0064, 0xff9b, _) if s[2..6] == [0, 0, 0, 0] => vec![v4(o[12], o[13], o[14], o[15])],
        // The /48 form skips octet 8 (the `u` octet): the address is in octets 6, 7, 9 and 10.
        (0x0064, 0xff9b, 0x0001) => vec![v4(o[6], o[7], o[9], o[10])],
        (0x2002, _, _) => vec![v4(o[2], o[3], o[4], o[5])],
        (0x2001, 0x0000, _) => vec![
            v4(o[4], o[5], o[6], o[7]),
            v4(!o[12], !o[13], !o[14], !o[15]),
        ],
        _ => Vec::new(),
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
        let denied = |ip: IpAddr| self.denied.iter().any(|net| net.contains(&ip));
        // An address that carries an IPv4 one reaches it through a translator or relay: that
        // address is checked too, whatever networks `denied_networks` lists.
        !denied(ip)
            && embedded_ipv4(ip).into_iter().all(|v4| {
                let v4 = IpAddr::V4(v4);
                self.allowed.allows_ip(v4) || !denied(v4)
            })
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
    resolver: FetchResolver,
}

impl reqwest::dns::Resolve for SsrfResolver {
    fn resolve(&self, name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        let (targets, resolver) = (self.targets.clone(), self.resolver.clone());
        let host = name.as_str().to_owned();
        Box::pin(async move {
            let permitted = resolve_permitted(&targets, &resolver, &host).await?;
            Ok(Box::new(permitted.into_iter()) as reqwest::dns::Addrs)
        })
    }
}

/// Why a name gave no address to connect to.
#[derive(Debug, thiserror::Error)]
enum Unusable {
    #[error(transparent)]
    Lookup(#[from] LookupError),
    #[error(transparent)]
    Refused(#[from] AddressRefused),
}

impl From<Unusable> for FetchFailure {
    fn from(e: Unusable) -> Self {
        let outcome = match &e {
            Unusable::Refused(_) => "not_allowed",
            Unusable::Lookup(LookupError::Timeout { .. }) => "timeout",
            Unusable::Lookup(LookupError::Refused { .. }) => "busy",
            Unusable::Lookup(LookupError::Failed { .. }) => "connect",
        };
        FetchFailure::new(outcome, e.to_string())
    }
}

/// The addresses of `host` that `targets` permits; none is an error ([`AddressRefused`]).
async fn resolve_permitted(
    targets: &IssuerTargets,
    resolver: &FetchResolver,
    host: &str,
) -> Result<Vec<SocketAddr>, Unusable> {
    let permitted: Vec<SocketAddr> = resolver
        .resolve_host(host)
        .await?
        .into_iter()
        .filter(|a| targets.permits(Some(host), a.ip()))
        .collect();
    if permitted.is_empty() {
        return Err(AddressRefused(host.to_owned()).into());
    }
    Ok(permitted)
}

/// No place for the check of an issuer being added.
#[derive(Debug, Clone, Copy, thiserror::Error)]
pub enum ChecksBusy {
    /// The organization holds its share (`auth.issuers.max_probes_per_organization`).
    #[error(
        "this organization already has its most issuer checks in progress (auth.issuers.max_probes_per_organization); retry shortly"
    )]
    Organization,
    /// Every place is held (`auth.issuers.max_concurrent_probes`).
    #[error(
        "too many issuer checks are in progress (auth.issuers.max_concurrent_probes); retry shortly"
    )]
    Instance,
}

impl ChecksBusy {
    /// The metrics label.
    pub fn scope(self) -> &'static str {
        match self {
            Self::Organization => "organization",
            Self::Instance => "instance",
        }
    }
}

/// The places of issuer checks: few in all, fewer for one organization.
#[derive(Debug)]
struct CheckPlaces {
    instance: Arc<tokio::sync::Semaphore>,
    /// Places held, by organization; an organization holding none has no entry, so the map
    /// never holds more entries than there are places.
    held: Mutex<HashMap<uuid::Uuid, usize>>,
    share: usize,
}

/// A place among the checks of issuers being added, held until dropped.
#[derive(Debug)]
pub struct CheckPlace {
    _instance: tokio::sync::OwnedSemaphorePermit,
    organization: uuid::Uuid,
    places: Arc<CheckPlaces>,
}

impl Drop for CheckPlace {
    fn drop(&mut self) {
        let mut held = self.places.held.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(count) = held.get_mut(&self.organization) {
            *count -= 1;
            if *count == 0 {
                held.remove(&self.organization);
            }
        }
    }
}

impl CheckPlaces {
    /// A place for `organization`, at once or never (a check waits for nothing).
    fn take(self: &Arc<Self>, organization: uuid::Uuid) -> Result<CheckPlace, ChecksBusy> {
        let mut held = self.held.lock().unwrap_or_else(|p| p.into_inner());
        let count = held.get(&organization).copied().unwrap_or(0);
        if count >= self.share {
            return Err(ChecksBusy::Organization);
        }
        let permit = self
            .instance
            .clone()
            .try_acquire_owned()
            .map_err(|_| ChecksBusy::Instance)?;
        held.insert(organization, count + 1);
        Ok(CheckPlace {
            _instance: permit,
            organization,
            places: self.clone(),
        })
    }
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
    resolver: FetchResolver,
    client: reqwest::Client,
    /// The key fetches' permits (never an issuer check's).
    permits: Arc<tokio::sync::Semaphore>,
    checks: Arc<CheckPlaces>,
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
    /// The registry `config` describes, resolving names with `resolver`; `metrics` counts
    /// fetches, checks and verifications.
    pub fn new(
        config: &IssuersConfig,
        resolver: &crate::dns::Resolver,
        metrics: Option<&Metrics>,
    ) -> Result<Self, String> {
        let targets = Arc::new(IssuerTargets::new(config)?);
        let resolver = resolver.for_fetches(Purpose::Issuer);
        let timeout = Duration::from_millis(config.fetch_timeout_ms);
        let tls = crate::tls::client_config("auth.issuers.tls", config.tls.as_ref(), true)
            .map_err(|e| e.to_string())?;
        let client = super::jwt::fetch_client(timeout)
            .https_only(true)
            .use_preconfigured_tls(tls)
            .dns_resolver(Arc::new(SsrfResolver {
                targets: targets.clone(),
                resolver: resolver.clone(),
            }))
            .build()
            .map_err(|e| format!("auth.issuers: the fetch client: {e}"))?;
        Ok(Self {
            targets,
            resolver,
            client,
            permits: Arc::new(tokio::sync::Semaphore::new(config.max_concurrent_fetches)),
            checks: Arc::new(CheckPlaces {
                instance: Arc::new(tokio::sync::Semaphore::new(config.max_concurrent_probes)),
                held: Mutex::new(HashMap::new()),
                share: config.max_probes_per_organization,
            }),
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

    /// A place for checking an issuer `organization` is adding: at once, or refused (counted
    /// in `aura_issuer_checks_refused_total{scope}`).
    pub fn admit_check(&self, organization: uuid::Uuid) -> Result<CheckPlace, ChecksBusy> {
        self.checks.take(organization).inspect_err(|busy| {
            if let Some(metrics) = &self.metrics {
                metrics
                    .issuer_checks_refused
                    .with_label_values(&[busy.scope()])
                    .inc();
            }
        })
    }

    /// [`IssuerTargets::check_url`], and a name resolved now with at least one permitted
    /// address: the check of an issuer being added, in `place` (the fetches check again each
    /// time). A name that does not resolve within `dns.timeout_ms` is a `timeout` naming it.
    pub async fn check_resolved(&self, url: &str, _place: &CheckPlace) -> Result<(), FetchFailure> {
        self.targets.check_url(url)?;
        let name = host_of(url)?;
        if name.parse::<IpAddr>().is_ok() || self.targets.allowed.allows_name(&name) {
            return Ok(());
        }
        resolve_permitted(&self.targets, &self.resolver, &name).await?;
        Ok(())
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
    /// an issuer being added, in `place` (never a key fetch's permit). Every URL is checked,
    /// names resolved.
    pub async fn probe(
        &self,
        record: &IssuerRecord,
        place: &CheckPlace,
    ) -> Result<KeySet, FetchFailure> {
        match (&record.jwks_url, &record.keys) {
            (None, Some(keys)) => parse_set(keys.as_bytes(), self.limits.max_keys),
            (url, _) => {
                let check = url.as_deref().unwrap_or(&record.issuer);
                self.check_resolved(check, place).await?;
                let origin = match url {
                    Some(url) => Origin::Url(url.clone()),
                    None => Origin::discovery(record.issuer.clone()),
                };
                let guard: Arc<dyn UrlGuard> = self.targets.clone();
                let probe = KeySource::detached(
                    origin,
                    self.client.clone(),
                    self.limits,
                    // The place is its permit: the key fetches' permits stay theirs.
                    Fetching {
                        permits: None,
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
    fn addresses_carrying_a_denied_ipv4_address_are_refused() {
        // The default list denies the translation and relay prefixes whole, whatever they carry.
        let t = targets(&[]);
        for denied in [
            "64:ff9b::5db8:d822",
            "64:ff9b:1:5db8:d8:2200::",
            "2002:5db8:d822::1",
            "2001:0:4136:e378:8000:63bf:a247:27dd",
        ] {
            assert!(!t.permits(None, denied.parse().expect("ip")), "{denied}");
        }
        // A list of IPv4 networks only still catches them by the address they carry.
        let config = IssuersConfig {
            denied_networks: vec!["127.0.0.0/8".to_owned(), "169.254.0.0/16".to_owned()],
            ..IssuersConfig::default()
        };
        let t = IssuerTargets::new(&config).expect("targets");
        for (denied, carried) in [
            ("64:ff9b::7f00:1", "127.0.0.1"),
            ("64:ff9b:1:a9fe:a9:fe00::", "169.254.169.254"),
            ("2002:7f00:1::", "127.0.0.1"),
            ("2002:a9fe:a9fe:1::1", "169.254.169.254"),
            // Teredo: its client inverted (127.0.0.1), and its server (169.254.169.254).
            ("2001:0:4136:e378:8000:63bf:80ff:fffe", "127.0.0.1"),
            ("2001:0:a9fe:a9fe:8000:63bf:a247:27dd", "169.254.169.254"),
        ] {
            let ip: IpAddr = denied.parse().expect("ip");
            assert!(
                embedded_ipv4(ip).contains(&carried.parse().expect("v4")),
                "{denied} carries {carried}"
            );
            assert!(!t.permits(None, ip), "{denied}");
        }
        for public in [
            "64:ff9b::5db8:d822",
            "2002:5db8:d822::1",
            "2001:0:4136:e378:8000:63bf:a247:27dd",
            "2606:4700::1111",
        ] {
            assert!(t.permits(None, public.parse().expect("ip")), "{public}");
        }
        // Allowed explicitly: the carried address is allowed too.
        let config = IssuersConfig {
            denied_networks: vec!["127.0.0.0/8".to_owned()],
            allowed_targets: vec!["127.0.0.1".to_owned()],
            ..IssuersConfig::default()
        };
        let t = IssuerTargets::new(&config).expect("targets");
        assert!(t.permits(None, "2002:7f00:1::".parse().expect("ip")));
        assert!(!t.permits(None, "2002:7f00:2::".parse().expect("ip")));
    }

    #[test]
    fn issuer_checks_take_places_of_their_own_shared_between_organizations() {
        let places = Arc::new(CheckPlaces {
            instance: Arc::new(tokio::sync::Semaphore::new(3)),
            held: Mutex::new(HashMap::new()),
            share: 2,
        });
        let (a, b, c) = (
            uuid::Uuid::new_v4(),
            uuid::Uuid::new_v4(),
            uuid::Uuid::new_v4(),
        );
        let a1 = places.take(a).expect("a1");
        let _a2 = places.take(a).expect("a2");
        assert!(matches!(places.take(a), Err(ChecksBusy::Organization)));
        let b1 = places.take(b).expect("b1");
        assert!(matches!(places.take(c), Err(ChecksBusy::Instance)));
        drop(b1);
        let _c1 = places.take(c).expect("c1");
        drop(a1);
        let _b2 = places.take(b).expect("b takes the place a gave back");
        assert!(matches!(places.take(a), Err(ChecksBusy::Instance)));
        assert!(
            places.held.lock().expect("held").len() <= 3,
            "no more entries than places"
        );
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
