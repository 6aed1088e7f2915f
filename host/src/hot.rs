//! A fixed table in front of a cache: the entries in use are answered with one lock and one
//! comparison, without the cache's bookkeeping. In front of the key and project lookups
//! ([`crate::auth::keys::Lookups`]) and of the per-actor rate-limit buckets
//! ([`crate::ratelimit::local::LocalBuckets`]).
//!
//! The table is direct-mapped: a lookup's hash picks one slot, and an entry put there replaces
//! whatever it held. So its memory is fixed when it is made, and a flood of distinct lookups
//! only makes the table miss: every miss goes to the cache behind it, which stays the one place
//! that fetches, shares concurrent fetches, expires and counts capacity. The hash is seeded at
//! random per table, so which names share a slot is not known from outside, and names made to
//! share one would only make each other miss.
//!
//! An entry is answered until the deadline it was put with, and only while no
//! [`HotTable::forget_all`] came after the lookup that fetched it. Forgetting advances a
//! generation that every entry carries, so it costs nothing per slot, and a fetch that raced
//! with it is never answered (see [`HotTable::ticket`]).

use std::borrow::Borrow;
use std::hash::{BuildHasher, Hash};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

/// Slots of a table: a power of two.
pub const DEFAULT_SLOTS: usize = 4096;

struct Entry<K, V> {
    key: K,
    value: V,
    generation: u64,
    until: Instant,
}

/// One slot: empty, or the last entry put there.
type Slot<K, V> = Mutex<Option<Entry<K, V>>>;

/// The fixed table: `slots` entries chosen by hash.
pub struct HotTable<K, V> {
    slots: Box<[Slot<K, V>]>,
    generation: AtomicU64,
    hasher: foldhash::fast::RandomState,
}

impl<K, V> std::fmt::Debug for HotTable<K, V> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HotTable")
            .field("slots", &self.slots.len())
            .field("generation", &self.generation.load(Ordering::Relaxed))
            .finish()
    }
}

/// What [`HotTable::ticket`] hands out: the generation a fetch started in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ticket(u64);

impl<K: Eq, V: Clone> HotTable<K, V> {
    /// A table of `slots` entries, rounded up to a power of two (at least 1).
    pub fn new(slots: usize) -> Self {
        let slots = slots.max(1).next_power_of_two();
        Self {
            slots: (0..slots).map(|_| Mutex::new(None)).collect(),
            generation: AtomicU64::new(0),
            hasher: foldhash::fast::RandomState::default(),
        }
    }

    /// The hash of `key` that [`Self::get`] and [`Self::put`] take: foldhash, seeded at random
    /// per table (a collision only costs a miss, so a fast hash is enough).
    pub fn hash<Q: Hash + ?Sized>(&self, key: &Q) -> u64 {
        self.hasher.hash_one(key)
    }

    fn slot(&self, hash: u64) -> &Slot<K, V> {
        // `new` made the length a power of two.
        &self.slots[(hash as usize) & (self.slots.len() - 1)]
    }

    /// The value put for `key`, when its slot holds it, it has not expired at `now` and
    /// nothing was forgotten since it was fetched.
    pub fn get<Q>(&self, hash: u64, key: &Q, now: Instant) -> Option<V>
    where
        K: Borrow<Q>,
        Q: Eq + ?Sized,
    {
        let generation = self.generation.load(Ordering::Acquire);
        let slot = self.slot(hash).lock().ok()?;
        let entry = slot.as_ref()?;
        (entry.key.borrow() == key && entry.generation == generation && now < entry.until)
            .then(|| entry.value.clone())
    }

    /// Taken before a lookup goes to the cache behind: the value it brings back is put here
    /// only if nothing was forgotten in between.
    pub fn ticket(&self) -> Ticket {
        Ticket(self.generation.load(Ordering::Acquire))
    }

    /// Puts `value` for `key` until `until`, unless something was forgotten since `ticket`.
    pub fn put(&self, hash: u64, key: K, value: V, ticket: Ticket, until: Instant) {
        let Ok(mut slot) = self.slot(hash).lock() else {
            return;
        };
        // An entry carries the generation its fetch started in, and `get` answers only
        // entries of the current one: a put that races a forget is never answered, whichever
        // of the two comes first. This check only saves the slot for a fresher entry.
        if self.generation.load(Ordering::Acquire) != ticket.0 {
            return;
        }
        *slot = Some(Entry {
            key,
            value,
            generation: ticket.0,
            until,
        });
    }

    /// Forgets every entry: none put before is answered again.
    pub fn forget_all(&self) {
        self.generation.fetch_add(1, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn table() -> (HotTable<String, u32>, Instant) {
        (HotTable::new(4), Instant::now())
    }

    #[test]
    fn a_value_put_is_answered_until_its_deadline_and_not_after() {
        let (t, now) = table();
        let until = now + Duration::from_secs(10);
        t.put(7, "a".to_owned(), 1, t.ticket(), until);
        assert_eq!(t.get(7, "a", now), Some(1));
        assert_eq!(t.get(7, "a", until - Duration::from_millis(1)), Some(1));
        assert_eq!(t.get(7, "a", until), None, "expired at its deadline");
    }

    #[test]
    fn another_key_in_the_same_slot_is_a_miss_then_replaces_it() {
        let (t, now) = table();
        let until = now + Duration::from_secs(10);
        // 3 and 7 pick the same of four slots.
        t.put(3, "a".to_owned(), 1, t.ticket(), until);
        assert_eq!(t.get(7, "b", now), None, "a different key never answers");
        assert_eq!(t.get(3, "a", now), Some(1));
        t.put(7, "b".to_owned(), 2, t.ticket(), until);
        assert_eq!(t.get(7, "b", now), Some(2));
        assert_eq!(t.get(3, "a", now), None, "replaced");
        // Another slot is untouched.
        t.put(4, "c".to_owned(), 3, t.ticket(), until);
        assert_eq!(t.get(7, "b", now), Some(2));
    }

    #[test]
    fn forgetting_drops_every_entry_and_a_fetch_that_raced_it_stays_out() {
        let (t, now) = table();
        let until = now + Duration::from_secs(10);
        t.put(1, "a".to_owned(), 1, t.ticket(), until);
        let raced = t.ticket();
        t.forget_all();
        assert_eq!(t.get(1, "a", now), None, "forgotten");
        t.put(2, "b".to_owned(), 2, raced, until);
        assert_eq!(
            t.get(2, "b", now),
            None,
            "fetched before the forget: not put"
        );
        t.put(2, "b".to_owned(), 2, t.ticket(), until);
        assert_eq!(t.get(2, "b", now), Some(2), "fetched after it: put");
    }

    #[test]
    fn the_table_has_a_power_of_two_of_slots() {
        assert_eq!(HotTable::<u8, u8>::new(0).slots.len(), 1);
        assert_eq!(HotTable::<u8, u8>::new(5).slots.len(), 8);
        assert_eq!(HotTable::<u8, u8>::new(4096).slots.len(), 4096);
    }
}
