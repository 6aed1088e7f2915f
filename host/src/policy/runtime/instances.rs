//! The instances of projects' modules: one memory budget for all of them, coldest first out.
//!
//! A project's module holds no instance of its own while nobody calls it. An instance is made
//! when a call needs one (or when the module is checked at install), goes back here idle after
//! the call, and is taken again by the module's next call, warmest first. Every instance alive,
//! idle or in a call, is charged its bytes ([`Charge`]); while the charges are over
//! `plugins.tenant_instance_budget_bytes` the coldest idle instance of any project is dropped.
//! Instances in a call are never taken: a warm call never fails for want of memory, and the
//! instances in calls are bounded by the tenant threads. There is no count of projects or of
//! modules anywhere: ten thousand projects with modules cost their compiled code (shared by
//! digest) and whatever instances their traffic keeps warm.
//!
//! Operator modules do not come here: they keep their instances in the pooling allocator's
//! reserve, so a tenant's instances never take one of theirs.

use std::any::Any;
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

/// What an instance is charged besides its linear memories and tables: its store, instance
/// state and WASI context, estimated.
pub const INSTANCE_OVERHEAD_BYTES: usize = 32 * 1024;

/// The bytes charged for a table element (a function reference and its metadata).
pub const TABLE_ELEMENT_BYTES: usize = 16;

/// An idle instance, type-erased: the module that kept it takes it back as its own type.
pub type Idle = Box<dyn Any + Send>;

/// The gauges and counter of the budget.
#[derive(Debug)]
struct Gauges {
    instances: prometheus::IntGauge,
    bytes: prometheus::IntGauge,
    evictions: prometheus::IntCounter,
}

/// Idle instances by module, and the order they went idle in.
#[derive(Default)]
struct Kept {
    /// Every idle instance, coldest first: its sequence number → (module, bytes).
    coldest: BTreeMap<u64, (u64, usize)>,
    /// Each module's idle instances, coldest first (ascending sequence numbers).
    by_module: HashMap<u64, Vec<(u64, Idle)>>,
    next: u64,
}

/// The budget of projects' module instances of one gateway.
pub struct TenantInstances {
    budget: usize,
    /// Bytes charged to instances alive.
    bytes: AtomicUsize,
    /// Instances alive.
    instances: AtomicUsize,
    evictions: AtomicU64,
    modules: AtomicU64,
    kept: Mutex<Kept>,
    gauges: OnceLock<Gauges>,
}

impl std::fmt::Debug for TenantInstances {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TenantInstances")
            .field("budget", &self.budget)
            .field("bytes", &self.bytes())
            .field("instances", &self.instances())
            .finish_non_exhaustive()
    }
}

/// An instance's share of the budget, given back when the instance is dropped.
#[derive(Debug)]
pub struct Charge {
    bytes: usize,
    of: Arc<TenantInstances>,
}

impl Charge {
    /// The bytes charged.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Charges `bytes` from now on (the instance's memory grew during a call).
    pub fn set(&mut self, bytes: usize) {
        if bytes >= self.bytes {
            self.of
                .bytes
                .fetch_add(bytes - self.bytes, Ordering::Relaxed);
        } else {
            self.of
                .bytes
                .fetch_sub(self.bytes - bytes, Ordering::Relaxed);
        }
        self.bytes = bytes;
        self.of.publish();
    }
}

impl Drop for Charge {
    fn drop(&mut self) {
        self.of.bytes.fetch_sub(self.bytes, Ordering::Relaxed);
        self.of.instances.fetch_sub(1, Ordering::Relaxed);
        self.of.publish();
    }
}

/// The bytes an instance is charged: `memory` bytes of linear memory and `table_elements`.
pub fn instance_bytes(memory: usize, table_elements: usize) -> usize {
    INSTANCE_OVERHEAD_BYTES + memory + table_elements * TABLE_ELEMENT_BYTES
}

impl TenantInstances {
    /// A budget of `budget` bytes.
    pub fn new(budget: usize) -> Arc<Self> {
        Arc::new(Self {
            budget,
            bytes: AtomicUsize::new(0),
            instances: AtomicUsize::new(0),
            evictions: AtomicU64::new(0),
            modules: AtomicU64::new(0),
            kept: Mutex::new(Kept::default()),
            gauges: OnceLock::new(),
        })
    }

    /// Counts in `metrics` from now on.
    pub fn count_in(&self, metrics: &crate::metrics::Metrics) {
        metrics.tenant_instance_budget_bytes.set(self.budget as i64);
        let _ = self.gauges.set(Gauges {
            instances: metrics.tenant_instances.clone(),
            bytes: metrics.tenant_instance_bytes.clone(),
            evictions: metrics.tenant_instance_evictions.clone(),
        });
        self.publish();
    }

    fn publish(&self) {
        if let Some(g) = self.gauges.get() {
            g.instances.set(self.instances() as i64);
            g.bytes.set(self.bytes() as i64);
        }
    }

    /// A number naming one module's idle instances here.
    pub fn module_id(&self) -> u64 {
        self.modules.fetch_add(1, Ordering::Relaxed)
    }

    /// The budget, in bytes.
    pub fn budget(&self) -> usize {
        self.budget
    }

    /// Bytes charged to the instances alive.
    pub fn bytes(&self) -> usize {
        self.bytes.load(Ordering::Relaxed)
    }

    /// Instances alive, idle or in a call.
    pub fn instances(&self) -> usize {
        self.instances.load(Ordering::Relaxed)
    }

    /// Idle instances dropped to stay within the budget so far.
    pub fn evictions(&self) -> u64 {
        self.evictions.load(Ordering::Relaxed)
    }

    /// Charges a new instance of `bytes`. Never refused: past the budget, idle instances go
    /// when the next one is kept.
    pub fn charge(self: &Arc<Self>, bytes: usize) -> Charge {
        self.instances.fetch_add(1, Ordering::Relaxed);
        self.bytes.fetch_add(bytes, Ordering::Relaxed);
        self.publish();
        Charge {
            bytes,
            of: self.clone(),
        }
    }

    /// `module`'s warmest idle instance, if it has one.
    pub fn take(&self, module: u64) -> Option<Idle> {
        let mut kept = self.kept.lock().unwrap_or_else(|p| p.into_inner());
        let list = kept.by_module.get_mut(&module)?;
        let (seq, idle) = list.pop()?;
        if list.is_empty() {
            kept.by_module.remove(&module);
        }
        kept.coldest.remove(&seq);
        Some(idle)
    }

    /// Keeps `idle` (charged `bytes`) as `module`'s warmest idle instance, unless the module
    /// already keeps `max_per_module`; then drops the coldest idle instances of any module
    /// while the charges are over the budget (the one just kept included).
    pub fn keep(&self, module: u64, bytes: usize, max_per_module: usize, idle: Idle) {
        let mut dropped: Vec<Idle> = Vec::new();
        {
            let mut kept = self.kept.lock().unwrap_or_else(|p| p.into_inner());
            let seq = kept.next;
            kept.next += 1;
            let list = kept.by_module.entry(module).or_default();
            if list.len() >= max_per_module {
                dropped.push(idle);
            } else {
                list.push((seq, idle));
                kept.coldest.insert(seq, (module, bytes));
            }
            let mut over = self.bytes().saturating_sub(self.budget);
            while over > 0 {
                let Some((seq, (owner, size))) = kept.coldest.pop_first() else {
                    break;
                };
                if let Some(list) = kept.by_module.get_mut(&owner) {
                    // A module's coldest instance is its first: sequence numbers only grow.
                    if let Some(at) = list.iter().position(|(s, _)| *s == seq) {
                        dropped.push(list.remove(at).1);
                    }
                    if list.is_empty() {
                        kept.by_module.remove(&owner);
                    }
                }
                over = over.saturating_sub(size);
                self.evictions.fetch_add(1, Ordering::Relaxed);
                if let Some(g) = self.gauges.get() {
                    g.evictions.inc();
                }
            }
        }
        // Outside the lock: dropping an instance gives its charge back.
        drop(dropped);
    }

    /// Drops every idle instance of `module` (the module was unloaded).
    pub fn forget(&self, module: u64) {
        let dropped = {
            let mut kept = self.kept.lock().unwrap_or_else(|p| p.into_inner());
            let list = kept.by_module.remove(&module).unwrap_or_default();
            for (seq, _) in &list {
                kept.coldest.remove(seq);
            }
            list
        };
        drop(dropped);
    }

    /// Idle instances kept now.
    pub fn idle(&self) -> usize {
        self.kept
            .lock()
            .map(|k| k.coldest.len())
            .unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An idle "instance" that carries its charge, as a module's instance does.
    struct Fake {
        _charge: Charge,
        name: &'static str,
    }

    fn fake(budget: &Arc<TenantInstances>, bytes: usize, name: &'static str) -> Idle {
        Box::new(Fake {
            _charge: budget.charge(bytes),
            name,
        })
    }

    fn name(idle: Idle) -> &'static str {
        idle.downcast::<Fake>().expect("a fake").name
    }

    #[test]
    fn past_the_budget_the_coldest_idle_instance_of_any_module_goes() {
        let budget = TenantInstances::new(300);
        let (a, b, c) = (budget.module_id(), budget.module_id(), budget.module_id());
        budget.keep(a, 100, 4, fake(&budget, 100, "a1"));
        budget.keep(b, 100, 4, fake(&budget, 100, "b1"));
        budget.keep(a, 100, 4, fake(&budget, 100, "a2"));
        assert_eq!(
            (budget.bytes(), budget.instances(), budget.evictions()),
            (300, 3, 0)
        );

        // A fourth instance: the coldest (a1) goes, whoever's it was.
        budget.keep(c, 100, 4, fake(&budget, 100, "c1"));
        assert_eq!(
            (budget.bytes(), budget.instances(), budget.evictions()),
            (300, 3, 1)
        );
        assert_eq!(budget.take(a).map(name), Some("a2"), "a1 was the coldest");
        assert!(budget.take(a).is_none());
        assert_eq!(budget.take(b).map(name), Some("b1"));
        assert_eq!(budget.take(c).map(name), Some("c1"));
    }

    #[test]
    fn instances_in_a_call_are_never_taken_and_an_instance_past_the_budget_alone_is_dropped() {
        let budget = TenantInstances::new(250);
        let module = budget.module_id();
        // Two instances in calls (not kept): 200 bytes, nothing to evict.
        let busy = (budget.charge(100), budget.charge(100));
        budget.keep(module, 100, 4, fake(&budget, 100, "idle"));
        // 300 > 250: the only idle instance goes; the busy ones stay charged.
        assert_eq!(budget.evictions(), 1);
        assert_eq!((budget.bytes(), budget.instances()), (200, 2));
        assert!(budget.take(module).is_none());
        drop(busy);
        assert_eq!((budget.bytes(), budget.instances()), (0, 0));
    }

    #[test]
    fn a_module_keeps_at_most_its_share_warmest_first_and_forgetting_it_frees_its_charges() {
        let budget = TenantInstances::new(1 << 20);
        let module = budget.module_id();
        for n in ["one", "two", "three"] {
            budget.keep(module, 10, 2, fake(&budget, 10, n));
        }
        assert_eq!(budget.instances(), 2, "the third was dropped, not kept");
        assert_eq!(
            budget.evictions(),
            0,
            "over the module's share is not an eviction"
        );
        assert_eq!(budget.take(module).map(name), Some("two"), "warmest first");
        budget.keep(module, 10, 2, fake(&budget, 10, "four"));
        budget.forget(module);
        assert_eq!(
            (budget.bytes(), budget.instances(), budget.idle()),
            (0, 0, 0)
        );
    }

    #[test]
    fn a_charge_follows_an_instance_that_grew() {
        let budget = TenantInstances::new(1 << 20);
        let mut charge = budget.charge(instance_bytes(65_536, 10));
        assert_eq!(budget.bytes(), INSTANCE_OVERHEAD_BYTES + 65_536 + 160);
        charge.set(instance_bytes(131_072, 10));
        assert_eq!(budget.bytes(), INSTANCE_OVERHEAD_BYTES + 131_072 + 160);
        charge.set(100);
        assert_eq!(budget.bytes(), 100);
        drop(charge);
        assert_eq!(budget.bytes(), 0);
    }
}
