//! Change events signed for the fleet: what one change of the control data is ([`Change`]), how
//! an instance signs what it publishes and checks what it receives ([`Fleet`]), and the
//! coalescing of the expensive actions events ask for ([`Coalesced`]). The listeners that act on
//! them are [`crate::changes`].
//!
//! Events on NATS (`{nats.subject_prefix}.gateway.changes`) carry an HMAC-SHA256 of their
//! payload under `nats.fleet_secret`, their origin, a sequence number and their time, and are
//! refused unless the signature verifies, they are at most [`MAX_EVENT_AGE`] old (or ahead),
//! and their sequence is past the last one seen from their origin (no replay). Refusals are
//! counted in `aura_change_events_refused_total{source, reason}`.

use std::collections::{HashMap, HashSet};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use hmac::{Hmac, Mac as _};
use serde::{Deserialize, Serialize};
use sha2::Sha256;

use crate::metrics::Metrics;

/// Largest change event read, in bytes.
pub const MAX_EVENT_BYTES: usize = 4096;

/// The NATS header carrying an event's signature: `v1=<hex HMAC-SHA256 of the payload>`.
pub const SIGNATURE_HEADER: &str = "Aura-Fleet-Signature";

/// The oldest (or furthest ahead) a signed event may be: the fleet's clocks agree within it.
pub const MAX_EVENT_AGE: Duration = Duration::from_secs(30);

/// Longest project ref an event may name.
const MAX_REF_BYTES: usize = 256;

/// One change of the control data.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum Change {
    /// An API key was created, revoked or deleted (its SHA-256, hex).
    ApiKey { key_sha256: String },
    /// A project's record changed (topology, PostgREST URL, plan…).
    Project { project_ref: String },
    /// An organization membership changed (roles are read on every request; kept for
    /// completeness and for caches to come).
    Membership {
        organization_id: String,
        user_id: String,
    },
    /// A project's own policy modules changed.
    TenantModules { project_ref: String },
    /// Every cached key and project may be stale (a control file replaced). Never accepted from
    /// another instance or the database: only this instance decides it.
    Everything,
    /// The operator asked for a reload of the plugin sections.
    OperatorReload,
}

impl Change {
    /// Checks the fields of a change that came from outside this instance.
    pub fn check(&self) -> Result<(), &'static str> {
        let project =
            |r: &str| !r.is_empty() && r.len() <= MAX_REF_BYTES && !r.chars().any(char::is_control);
        let ok = match self {
            Change::ApiKey { key_sha256 } => crate::config::is_sha256_hex(key_sha256),
            Change::Project { project_ref } | Change::TenantModules { project_ref } => {
                project(project_ref)
            }
            Change::Membership {
                organization_id,
                user_id,
            } => {
                uuid::Uuid::parse_str(organization_id).is_ok()
                    && uuid::Uuid::parse_str(user_id).is_ok()
            }
            Change::Everything | Change::OperatorReload => true,
        };
        if ok { Ok(()) } else { Err("invalid") }
    }

    pub(crate) fn kind(&self) -> &'static str {
        match self {
            Change::ApiKey { .. } => "api_key",
            Change::Project { .. } => "project",
            Change::Membership { .. } => "membership",
            Change::TenantModules { .. } => "tenant_modules",
            Change::Everything => "everything",
            Change::OperatorReload => "operator_reload",
        }
    }
}

/// A change as published on NATS: with the instance that made it (which does not act twice),
/// its sequence number from that instance and when it was sent (milliseconds since the epoch).
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Published {
    origin: String,
    seq: u64,
    at_ms: u64,
    #[serde(flatten)]
    change: Change,
}

/// The subject of the change events under `prefix`.
pub fn subject(prefix: &str) -> String {
    format!("{prefix}.gateway.changes")
}

pub(crate) fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// An action that change events ask for, run at most once per interval: asks that arrive while
/// one is due are folded into it.
#[derive(Debug)]
pub struct Coalesced {
    due: AtomicBool,
    wake: tokio::sync::Notify,
    every: Duration,
    run: prometheus::IntCounter,
    coalesced: prometheus::IntCounter,
}

impl Coalesced {
    /// An action named `action` in `aura_change_actions_total`, run at most once per `every`.
    pub fn new(action: &str, every: Duration, metrics: &Metrics) -> Self {
        Self {
            due: AtomicBool::new(false),
            wake: tokio::sync::Notify::new(),
            every,
            run: metrics.change_actions.with_label_values(&[action, "run"]),
            coalesced: metrics
                .change_actions
                .with_label_values(&[action, "coalesced"]),
        }
    }

    /// Asks for the action: it runs soon, once for every ask made before it starts.
    pub fn ask(&self) {
        if self.due.swap(true, Ordering::AcqRel) {
            self.coalesced.inc();
        } else {
            self.wake.notify_one();
        }
    }

    /// Waits until the action is asked for, then marks it started (asks from now on make it
    /// due again).
    pub async fn asked(&self) {
        loop {
            if self.due.swap(false, Ordering::AcqRel) {
                self.run.inc();
                return;
            }
            self.wake.notified().await;
        }
    }

    /// Whether the action was asked for and has not started yet.
    pub fn is_due(&self) -> bool {
        self.due.load(Ordering::Acquire)
    }

    /// The least time between two runs.
    pub fn every(&self) -> Duration {
        self.every
    }
}

/// This instance's part in the fleet: how it signs what it publishes, what it has seen of the
/// others, and its coalesced actions.
#[derive(Debug)]
pub struct Fleet {
    /// This instance's id in the events.
    pub instance_id: String,
    secret: Option<Vec<u8>>,
    seq: AtomicU64,
    /// The last sequence number accepted per origin, and when.
    seen: Mutex<HashMap<String, (u64, Instant)>>,
    /// Refreshes of the projects' modules asked for by events.
    pub tenant_refresh: Coalesced,
    /// The projects events named since the last refresh started; `None`: every project's
    /// (a change of everything, or more projects than [`MAX_NAMED_PROJECTS`]).
    named_projects: Mutex<Option<HashSet<String>>>,
    /// Reloads of the plugin sections asked for by events.
    pub operator_reload: Coalesced,
    refused: prometheus::IntCounterVec,
}

/// Projects named by events waiting for one refresh at most; past it, every project's modules
/// are listed instead.
pub const MAX_NAMED_PROJECTS: usize = 1024;

/// Origins remembered at most (older ones are forgotten first; a forgotten origin's old events
/// are still refused by their age).
const MAX_ORIGINS: usize = 1024;

impl Fleet {
    /// The fleet part of an instance configured with `config`.
    pub fn new(config: &crate::config::Config, metrics: &Metrics) -> Self {
        let every = Duration::from_millis(config.control.change_min_interval_ms);
        Self {
            instance_id: uuid::Uuid::new_v4().to_string(),
            secret: config
                .nats
                .fleet_secret
                .as_ref()
                .map(|s| s.as_bytes().to_vec()),
            seq: AtomicU64::new(0),
            seen: Mutex::new(HashMap::new()),
            tenant_refresh: Coalesced::new("tenant_refresh", every, metrics),
            named_projects: Mutex::new(Some(HashSet::new())),
            operator_reload: Coalesced::new("operator_reload", every, metrics),
            refused: metrics.change_events_refused.clone(),
        }
    }

    /// Asks for a refresh of `project`'s modules (`None`: of every project's).
    pub fn ask_tenant_refresh(&self, project: Option<&str>) {
        {
            let mut named = self
                .named_projects
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            match (named.as_mut(), project) {
                (Some(set), Some(project))
                    if set.len() < MAX_NAMED_PROJECTS || set.contains(project) =>
                {
                    set.insert(project.to_owned());
                }
                _ => *named = None,
            }
        }
        self.tenant_refresh.ask();
    }

    /// The projects named since the last call (`None`: every project's modules are to be
    /// listed).
    pub fn take_named_projects(&self) -> Option<HashSet<String>> {
        let mut named = self
            .named_projects
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        named.replace(HashSet::new())
    }

    /// Whether events go over NATS (`nats.fleet_secret` is set).
    pub fn signs(&self) -> bool {
        self.secret.is_some()
    }

    pub(crate) fn refuse(&self, source: &str, reason: &str) {
        self.refused.with_label_values(&[source, reason]).inc();
    }

    /// The payload and signature of `change` as this instance publishes it.
    pub(crate) fn sign(&self, change: Change) -> Option<(Vec<u8>, String)> {
        let secret = self.secret.as_ref()?;
        let seq = self.seq.fetch_add(1, Ordering::AcqRel) + 1;
        Some(signed_event(
            secret,
            &self.instance_id,
            seq,
            now_ms(),
            change,
        ))
    }

    /// The change a NATS message carries, when it is a valid event of another instance of the
    /// fleet; `None` (counted by reason) otherwise, or when it is this instance's own.
    pub(crate) fn accept(&self, payload: &[u8], signed: Option<&str>, now: u64) -> Option<Change> {
        let secret = self.secret.as_ref()?;
        if payload.len() > MAX_EVENT_BYTES {
            self.refuse("nats", "invalid");
            return None;
        }
        let Some(signed) = signed else {
            self.refuse("nats", "unsigned");
            return None;
        };
        if !verify(secret, payload, signed) {
            self.refuse("nats", "bad_signature");
            return None;
        }
        let Ok(message) = serde_json::from_slice::<Published>(payload) else {
            self.refuse("nats", "invalid");
            return None;
        };
        if message.origin == self.instance_id {
            return None;
        }
        if message.change.check().is_err() || message.origin.len() > 64 {
            self.refuse("nats", "invalid");
            return None;
        }
        if now.abs_diff(message.at_ms) > MAX_EVENT_AGE.as_millis() as u64 {
            self.refuse("nats", "stale");
            return None;
        }
        {
            let mut seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
            if seen
                .get(&message.origin)
                .is_some_and(|(last, _)| message.seq <= *last)
            {
                drop(seen);
                self.refuse("nats", "replayed");
                return None;
            }
            if seen.len() >= MAX_ORIGINS && !seen.contains_key(&message.origin) {
                let oldest = seen
                    .iter()
                    .min_by_key(|(_, (_, at))| *at)
                    .map(|(origin, _)| origin.clone());
                if let Some(oldest) = oldest {
                    seen.remove(&oldest);
                }
            }
            seen.insert(message.origin.clone(), (message.seq, Instant::now()));
        }
        // Forgetting every cached record is an instance's own decision: a flood of those would
        // turn every cached lookup into a store query.
        if message.change == Change::Everything {
            self.refuse("nats", "kind");
            return None;
        }
        Some(message.change)
    }
}

/// The payload of `change` as instance `origin` sends it (its `seq`-th event, at `at_ms`
/// milliseconds since the epoch) and its signature under `secret` (the value of the
/// [`SIGNATURE_HEADER`] header): what every instance publishes, for the fleet's own tools.
pub fn signed_event(
    secret: &[u8],
    origin: &str,
    seq: u64,
    at_ms: u64,
    change: Change,
) -> (Vec<u8>, String) {
    let message = Published {
        origin: origin.to_owned(),
        seq,
        at_ms,
        change,
    };
    let payload = serde_json::to_vec(&message).unwrap_or_default();
    let signed = signature(secret, &payload);
    (payload, signed)
}

/// Milliseconds since the epoch, as events carry them.
pub fn now_millis() -> u64 {
    now_ms()
}

type HmacSha256 = Hmac<Sha256>;

/// `v1=<hex HMAC-SHA256 of payload under secret>`.
fn signature(secret: &[u8], payload: &[u8]) -> String {
    let mut mac = HmacSha256::new_from_slice(secret).expect("HMAC takes a key of any length");
    mac.update(payload);
    format!("v1={}", hex::encode(mac.finalize().into_bytes()))
}

/// Whether `signed` is the signature of `payload` under `secret` (compared in constant time).
fn verify(secret: &[u8], payload: &[u8], signed: &str) -> bool {
    let Some(tag) = signed
        .strip_prefix("v1=")
        .and_then(|h| hex::decode(h.trim()).ok())
    else {
        return false;
    };
    let mut mac = HmacSha256::new_from_slice(secret).expect("HMAC takes a key of any length");
    mac.update(payload);
    mac.verify_slice(&tag).is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fleet(secret: Option<&str>) -> Fleet {
        let mut config = crate::config::Config::default();
        config.nats.fleet_secret = secret.map(str::to_owned);
        Fleet::new(&config, &Metrics::new())
    }

    fn refused(f: &Fleet, reason: &str) -> u64 {
        f.refused.with_label_values(&["nats", reason]).get()
    }

    #[test]
    fn events_parse_strictly_and_within_bounds() {
        let p: Published = serde_json::from_slice(
            br#"{"origin":"a","seq":1,"at_ms":2,"kind":"api_key","key_sha256":"ab"}"#,
        )
        .expect("an event");
        assert_eq!(
            p.change,
            Change::ApiKey {
                key_sha256: "ab".into()
            }
        );
        assert!(p.change.check().is_err(), "not a SHA-256");
        assert!(serde_json::from_slice::<Change>(br#"{"kind":"nonsense"}"#).is_err());
        assert!(serde_json::from_slice::<Change>(br#"{"kind":"project"}"#).is_err());
        let long = Change::Project {
            project_ref: "x".repeat(MAX_REF_BYTES + 1),
        };
        assert!(long.check().is_err());
        let membership = Change::Membership {
            organization_id: "not-a-uuid".into(),
            user_id: uuid::Uuid::new_v4().to_string(),
        };
        assert!(membership.check().is_err());
    }

    #[test]
    fn only_signed_fresh_unreplayed_events_of_another_instance_are_accepted() {
        let sender = fleet(Some("0123456789abcdef0123456789abcdef"));
        let receiver = fleet(Some("0123456789abcdef0123456789abcdef"));
        let change = Change::TenantModules {
            project_ref: "alpha".into(),
        };
        let (payload, signed) = sender.sign(change.clone()).expect("signed");
        let now = now_ms();
        assert_eq!(
            receiver.accept(&payload, Some(&signed), now),
            Some(change.clone())
        );
        assert_eq!(
            receiver.accept(&payload, Some(&signed), now),
            None,
            "a replay"
        );
        assert_eq!(refused(&receiver, "replayed"), 1);
        assert_eq!(receiver.accept(&payload, None, now), None);
        assert_eq!(refused(&receiver, "unsigned"), 1);
        let (next, next_signed) = sender.sign(change.clone()).expect("signed");
        let mut forged = next.clone();
        let at = forged.len() - 3;
        forged[at] ^= 1;
        assert_eq!(receiver.accept(&forged, Some(&next_signed), now), None);
        assert_eq!(refused(&receiver, "bad_signature"), 1);
        // Signed under another secret: refused the same.
        let (other, other_signed) = fleet(Some("another-secret-of-the-right-size!"))
            .sign(change.clone())
            .expect("signed");
        assert_eq!(receiver.accept(&other, Some(&other_signed), now), None);
        assert_eq!(refused(&receiver, "bad_signature"), 2);
        // Too old (or ahead): refused, whatever its signature.
        // (Signed a moment after `now`: a second past the bound, whatever the moment.)
        let late = now + MAX_EVENT_AGE.as_millis() as u64 + 1_000;
        assert_eq!(receiver.accept(&next, Some(&next_signed), late), None);
        assert_eq!(refused(&receiver, "stale"), 1);
        assert_eq!(
            receiver.accept(&next, Some(&next_signed), now),
            Some(change)
        );
        // Its own events are not acted on twice; `everything` is never another's decision.
        let (own, own_signed) = receiver.sign(Change::OperatorReload).expect("signed");
        assert_eq!(receiver.accept(&own, Some(&own_signed), now), None);
        let (all, all_signed) = sender.sign(Change::Everything).expect("signed");
        assert_eq!(receiver.accept(&all, Some(&all_signed), now), None);
        assert_eq!(refused(&receiver, "kind"), 1);
    }

    #[test]
    fn without_a_fleet_secret_nothing_is_signed_or_accepted() {
        let f = fleet(None);
        assert!(!f.signs());
        assert!(f.sign(Change::OperatorReload).is_none());
        let signed = fleet(Some("0123456789abcdef0123456789abcdef"))
            .sign(Change::OperatorReload)
            .expect("signed");
        assert_eq!(f.accept(&signed.0, Some(&signed.1), now_ms()), None);
    }

    #[tokio::test]
    async fn asks_made_before_a_run_starts_are_one_run() {
        let c = Coalesced::new("test", Duration::from_millis(1), &Metrics::new());
        for _ in 0..100 {
            c.ask();
        }
        assert!(c.is_due());
        tokio::time::timeout(Duration::from_secs(1), c.asked())
            .await
            .expect("asked");
        assert!(!c.is_due(), "the 100 asks were one run");
        assert_eq!(c.run.get(), 1);
        assert_eq!(c.coalesced.get(), 99);
        assert!(
            tokio::time::timeout(Duration::from_millis(50), c.asked())
                .await
                .is_err(),
            "nothing more was asked"
        );
        c.ask();
        tokio::time::timeout(Duration::from_secs(1), c.asked())
            .await
            .expect("asked again");
    }
}
