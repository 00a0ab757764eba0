//! A map bounded by estimated bytes, for the collector's and the symbolizer's
//! caches: two generations, the younger taking new entries and entries found in
//! the older one; when the younger fills half the bound, the older one is dropped
//! whole (its entries counted as evicted) and the younger becomes the older. So
//! what is in use stays, what is not goes within two turns, the bound holds at
//! every moment, and eviction costs nothing per entry.

use std::borrow::Borrow;
use std::collections::HashMap;
use std::hash::Hash;

/// Counters of one bounded cache.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct CacheStats {
    /// Entries held.
    pub entries: usize,
    /// Estimated bytes held (entries and their share of the maps).
    pub bytes: usize,
    /// The bound on `bytes`.
    pub max_bytes: usize,
    /// Entries evicted to stay within the bound (or never kept: larger than half
    /// the bound).
    pub evicted: u64,
}

impl CacheStats {
    /// Adds `other`'s figures to these.
    pub(crate) fn add(&mut self, other: CacheStats) {
        self.entries += other.entries;
        self.bytes += other.bytes;
        self.max_bytes += other.max_bytes;
        self.evicted += other.evicted;
    }
}

/// A map with foldhash (randomly seeded per map) instead of SipHash, for the maps
/// the collector and the request path touch per sample or per request: addresses,
/// label ids, stack ids, interned names. With it the collector's work outside
/// symbolization halved under Callgrind, and the layered request lost 508 of its
/// 5 894 instructions. The per-map random seed stays.
pub(crate) type FastMap<K, V> = HashMap<K, V, foldhash::fast::RandomState>;

struct Generation<K, V> {
    map: FastMap<K, (V, usize)>,
    bytes: usize,
}

impl<K, V> Default for Generation<K, V> {
    fn default() -> Self {
        Generation {
            map: HashMap::default(),
            bytes: 0,
        }
    }
}

pub(crate) struct BoundedCache<K, V> {
    young: Generation<K, V>,
    old: Generation<K, V>,
    max_bytes: usize,
    evicted: u64,
}

impl<K: Hash + Eq, V> BoundedCache<K, V> {
    /// Bytes a map spends per entry besides what the entry's own estimate counts
    /// (the slot, control byte and load factor).
    const SLOT_BYTES: usize = (std::mem::size_of::<(K, (V, usize))>() + 1) * 8 / 7;

    pub(crate) fn new(max_bytes: usize) -> Self {
        BoundedCache {
            young: Generation::default(),
            old: Generation::default(),
            max_bytes,
            evicted: 0,
        }
    }

    /// The value of `key`, kept in the young generation from now on.
    pub(crate) fn get<Q>(&mut self, key: &Q) -> Option<&V>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        if !self.young.map.contains_key(key)
            && let Some((k, (v, bytes))) = self.old.map.remove_entry(key)
        {
            self.old.bytes -= bytes;
            self.insert_sized(k, v, bytes);
        }
        self.young.map.get(key).map(|(v, _)| v)
    }

    /// The value of `key` without moving it (for readers holding `&self`).
    pub(crate) fn peek<Q>(&self, key: &Q) -> Option<&V>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.young
            .map
            .get(key)
            .or_else(|| self.old.map.get(key))
            .map(|(v, _)| v)
    }

    /// Keeps `value` under `key`; `heap_bytes` is what the key and value hold
    /// outside the map (boxed slices, strings, shared allocations they own).
    pub(crate) fn insert(&mut self, key: K, value: V, heap_bytes: usize) {
        self.insert_sized(key, value, heap_bytes + Self::SLOT_BYTES);
    }

    fn insert_sized(&mut self, key: K, value: V, bytes: usize) {
        let half = self.max_bytes / 2;
        if bytes > half {
            self.evicted += 1;
            return;
        }
        if self.young.bytes + bytes > half {
            let old = std::mem::replace(&mut self.old, std::mem::take(&mut self.young));
            self.evicted += old.map.len() as u64;
        }
        if let Some((_, previous)) = self.young.map.insert(key, (value, bytes)) {
            self.young.bytes -= previous;
        }
        self.young.bytes += bytes;
    }

    pub(crate) fn stats(&self) -> CacheStats {
        CacheStats {
            entries: self.young.map.len() + self.old.map.len(),
            bytes: self.young.bytes + self.old.bytes,
            max_bytes: self.max_bytes,
            evicted: self.evicted,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stays_within_its_bound_and_counts_evictions() {
        let mut c: BoundedCache<u64, Box<[u8]>> = BoundedCache::new(64 << 10);
        for i in 0..10_000u64 {
            c.insert(i, vec![0; 100].into(), 100);
            let s = c.stats();
            assert!(s.bytes <= s.max_bytes, "{s:?}");
        }
        let s = c.stats();
        assert!(s.entries > 100, "{s:?}");
        assert_eq!(s.entries as u64 + s.evicted, 10_000, "{s:?}");
        // Recent entries are there; the first ones are gone.
        assert!(c.peek(&9_999).is_some());
        assert!(c.peek(&0).is_none());
        // Larger than half the bound: never kept, counted.
        c.insert(1 << 40, vec![0; 40 << 10].into(), 40 << 10);
        assert!(c.peek(&(1 << 40)).is_none());
        assert_eq!(c.stats().evicted, s.evicted + 1);
    }

    #[test]
    fn entries_in_use_survive_turns() {
        let mut c: BoundedCache<u64, u64> = BoundedCache::new(16 << 10);
        c.insert(7, 7, 0);
        for i in 100..100_000u64 {
            c.insert(i, i, 0);
            if i % 50 == 0 {
                assert_eq!(c.get(&7), Some(&7), "after {i} inserts");
            }
        }
        assert!(c.stats().evicted > 10_000);
    }
}
