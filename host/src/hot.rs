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
//! An entry is answered until the deadline it was put with, and only while nothing forgot it
//! after the lookup that fetched it: [`HotTable::forget`] forgets one key (its slot, and no
//! other), [`HotTable::forget_all`] every entry. Each advances a generation — the slot's, or the
//! table's, which every entry carries so that forgetting all costs nothing per slot — and a
//! fetch that raced with it is never answered (see [`HotTable::ticket`]).

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

/// One slot: empty, or the last entry put there, and how often a key was forgotten here.
struct SlotState<K, V> {
    entry: Option<Entry<K, V>>,
    forgotten: u64,
}

type Slot<K, V> = Mutex<SlotState<K, V>>;

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

/// What [`HotTable::ticket`] hands out: the table's generation a fetch started in, and its
/// slot's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ticket {
    table: u64,
    slot: u64,
}

impl<K: Eq, V: Clone> HotTable<K, V> {
    /// A table of `slots` entries, rounded up to a power of two (at least 1).
    pub fn new(slots: usize) -> Self {
        let slots = slots.max(1).next_power_of_two();
        Self {
            slots: (0..slots)
                .map(|_| {
                    Mutex::new(SlotState {
                        entry: None,
                        forgotten: 0,
                    })
                })
                .collect(),
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
        let entry = slot.entry.as_ref()?;
        (entry.key.borrow() == key && entry.generation == generation && now < entry.until)
            .then(|| entry.value.clone())
    }

    /// Taken before a lookup of the key hashed `hash` goes to the cache behind: the value it
    /// brings back is put here only if nothing was forgotten in between (that key's slot, or
    /// the whole table).
    pub fn ticket(&self, hash: u64) -> Ticket {
        let table = self.generation.load(Ordering::Acquire);
        let slot = self
            .slot(hash)
            .lock()
            .map(|s| s.forgotten)
            .unwrap_or(u64::MAX);
        Ticket { table, slot }
    }

    /// Puts `value` for `key` until `until`, unless something was forgotten since `ticket`.
    pub fn put(&self, hash: u64, key: K, value: V, ticket: Ticket, until: Instant) {
        let Ok(mut slot) = self.slot(hash).lock() else {
            return;
        };
        // An entry carries the table's generation its fetch started in, and `get` answers only
        // entries of the current one: a put that races a forget of everything is never
        // answered, whichever of the two comes first; a forget of this slot, made under its
        // lock, is seen here. (The table check only saves the slot for a fresher entry.)
        if self.generation.load(Ordering::Acquire) != ticket.table || slot.forgotten != ticket.slot
        {
            return;
        }
        slot.entry = Some(Entry {
            key,
            value,
            generation: ticket.table,
            until,
        });
    }

    /// Forgets `key` (hashed `hash`): it is not answered again, and a fetch of a key of its slot
    /// that started before is not put. Every other slot keeps its entry.
    pub fn forget<Q>(&self, hash: u64, key: &Q)
    where
        K: Borrow<Q>,
        Q: Eq + ?Sized,
    {
        let Ok(mut slot) = self.slot(hash).lock() else {
            return;
        };
        slot.forgotten = slot.forgotten.wrapping_add(1);
        if slot.entry.as_ref().is_some_and(|e| e.key.borrow() == key) {
            slot.entry = None;
        }
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
        t.put(7, "a".to_owned(), 1, t.ticket(7), until);
        assert_eq!(t.get(7, "a", now), Some(1));
        assert_eq!(t.get(7, "a", until - Duration::from_millis(1)), Some(1));
        assert_eq!(t.get(7, "a", until), None, "expired at its deadline");
    }

    #[test]
    fn another_key_in_the_same_slot_is_a_miss_then_replaces_it() {
        let (t, now) = table();
        let until = now + Duration::from_secs(10);
        // 3 and 7 pick the same of four slots.
        t.put(3, "a".to_owned(), 1, t.ticket(3), until);
        assert_eq!(t.get(7, "b", now), None, "a different key never answers");
        assert_eq!(t.get(3, "a", now), Some(1));
        t.put(7, "b".to_owned(), 2, t.ticket(7), until);
        assert_eq!(t.get(7, "b", now), Some(2));
        assert_eq!(t.get(3, "a", now), None, "replaced");
        // Another slot is untouched.
        t.put(4, "c".to_owned(), 3, t.ticket(4), until);
        assert_eq!(t.get(7, "b", now), Some(2));
    }

    #[test]
    fn forgetting_drops_every_entry_and_a_fetch_that_raced_it_stays_out() {
        let (t, now) = table();
        let until = now + Duration::from_secs(10);
        t.put(1, "a".to_owned(), 1, t.ticket(1), until);
        let raced = t.ticket(2);
        t.forget_all();
        assert_eq!(t.get(1, "a", now), None, "forgotten");
        t.put(2, "b".to_owned(), 2, raced, until);
        assert_eq!(
            t.get(2, "b", now),
            None,
            "fetched before the forget: not put"
        );
        t.put(2, "b".to_owned(), 2, t.ticket(2), until);
        assert_eq!(t.get(2, "b", now), Some(2), "fetched after it: put");
    }

    #[test]
    fn forgetting_one_key_keeps_every_other_slot_and_stops_its_racing_fetch() {
        let (t, now) = table();
        let until = now + Duration::from_secs(10);
        t.put(1, "a".to_owned(), 1, t.ticket(1), until);
        t.put(2, "b".to_owned(), 2, t.ticket(2), until);
        let raced = t.ticket(1);
        t.forget(1, "a");
        assert_eq!(t.get(1, "a", now), None, "forgotten");
        assert_eq!(t.get(2, "b", now), Some(2), "another slot keeps its entry");
        t.put(1, "a".to_owned(), 1, raced, until);
        assert_eq!(
            t.get(1, "a", now),
            None,
            "fetched before the forget: not put"
        );
        // A key sharing the slot (1 and 5 of four slots) is kept when another is forgotten.
        t.put(5, "e".to_owned(), 5, t.ticket(5), until);
        t.forget(1, "a");
        assert_eq!(
            t.get(5, "e", now),
            Some(5),
            "a forget of another key keeps it"
        );
        t.put(1, "a".to_owned(), 1, t.ticket(1), until);
        assert_eq!(t.get(1, "a", now), Some(1), "fetched after it: put");
    }

    #[test]
    fn the_table_has_a_power_of_two_of_slots() {
        assert_eq!(HotTable::<u8, u8>::new(0).slots.len(), 1);
        assert_eq!(HotTable::<u8, u8>::new(5).slots.len(), 8);
        assert_eq!(HotTable::<u8, u8>::new(4096).slots.len(), 4096);
    }
}
