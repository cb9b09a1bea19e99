//! An open-addressing hash table keyed by addresses, built for the
//! analysis' access pattern: every record looks up its address and its
//! line, so the tables are the hot path and their cache misses set the
//! speed.
//!
//! Why not `std::collections::HashMap`: a general hash scatters
//! neighbouring keys, so a strided stream misses the cache on every
//! record; and it offers no way to prefetch the slot of a record that will
//! be processed a few records later. This table
//!
//! - keeps keys of one *chunk* (16 neighbours: the 4-byte granules of a
//!   64-byte line, or the lines of 1 KiB) in consecutive slots, from a
//!   Fibonacci hash of the chunk — a stream touches one key line per chunk;
//! - probes linearly (load ≤ 70%) over slots that hold the key beside its
//!   value: the address table's slots are one 64-byte, line-aligned cache
//!   line each ([`LineSlot`]), so a hit touches one cache line (keys and
//!   values in separate arrays cost two random lines per lookup; measured
//!   in ARCHITECTURE.md), small values are packed ([`PackedSlot`]);
//! - exposes [`AddrTable::prefetch`] to load a slot ahead of its use.
//!
//! Entries are never removed. Memory is proportional to the distinct keys.

use super::NONE;

/// The part of a key that chooses its chunk and its place in the chunk.
pub(crate) trait KeyLayout {
    /// Bits of the key below the chunk number.
    const CHUNK_SHIFT: u32;
    /// Bits of the key below the place in the chunk (place = 4 bits).
    const GRANULE_SHIFT: u32;
}

/// Byte addresses: chunks are 64-byte lines, places are 4-byte granules.
pub(crate) struct ByteAddresses;
impl KeyLayout for ByteAddresses {
    const CHUNK_SHIFT: u32 = 6;
    const GRANULE_SHIFT: u32 = 2;
}

/// Line numbers (`addr >> 6`): chunks are 16 lines (1 KiB).
pub(crate) struct LineNumbers;
impl KeyLayout for LineNumbers {
    const CHUNK_SHIFT: u32 = 4;
    const GRANULE_SHIFT: u32 = 0;
}

/// A slot of the table: a key and its value side by side, so that a hit
/// touches one cache line, not a key line and a value line.
pub(crate) trait Slot: Copy {
    type Value: Copy + Default;
    /// A slot holding `key` and the default value.
    fn new(key: u64) -> Self;
    fn key(&self) -> u64;
    fn value(&self) -> &Self::Value;
    fn value_mut(&mut self) -> &mut Self::Value;
}

/// A slot that is exactly one 64-byte, line-aligned cache line (for values
/// of up to 56 bytes): a random lookup costs one cache miss.
#[derive(Clone, Copy, Debug)]
#[repr(C, align(64))]
pub(crate) struct LineSlot<V> {
    key: u64,
    value: V,
}

/// A slot packed with its neighbours (small values).
#[derive(Clone, Copy, Debug)]
#[repr(C)]
pub(crate) struct PackedSlot<V> {
    key: u64,
    value: V,
}

macro_rules! impl_slot {
    ($slot:ident) => {
        impl<V: Copy + Default> Slot for $slot<V> {
            type Value = V;
            #[inline]
            fn new(key: u64) -> Self {
                $slot {
                    key,
                    value: V::default(),
                }
            }
            #[inline]
            fn key(&self) -> u64 {
                self.key
            }
            #[inline]
            fn value(&self) -> &V {
                &self.value
            }
            #[inline]
            fn value_mut(&mut self) -> &mut V {
                &mut self.value
            }
        }
    };
}
impl_slot!(LineSlot);
impl_slot!(PackedSlot);

/// Hash table from `u64` keys to values kept in slots `S` (see the module
/// docs).
pub(crate) struct AddrTable<S: Slot, L> {
    slots: Vec<S>,
    /// `64 − log2(slots.len())`: the Fibonacci hash keeps the top bits.
    shift: u32,
    len: usize,
    /// The value of key `u64::MAX`, which marks empty slots.
    max_key: Option<S::Value>,
    layout: std::marker::PhantomData<L>,
}

const EMPTY: u64 = NONE;
const MIN_SLOTS: usize = 64;

/// A vector of `len` copies of `value`, backed by transparent huge pages
/// where the kernel allows it: the tables are accessed at random, and with
/// 4 KiB pages nearly every lookup of a large table would also miss the TLB.
fn huge_vec<T: Copy>(len: usize, value: T) -> Vec<T> {
    let mut v: Vec<T> = Vec::with_capacity(len);
    advise_huge_pages(v.as_ptr() as usize, len * std::mem::size_of::<T>());
    v.resize(len, value);
    v
}

/// Asks for transparent huge pages on the 2 MiB-aligned part of a fresh
/// allocation (before it is touched). Only a hint: errors are ignored.
pub(crate) fn advise_huge_pages(start: usize, len: usize) {
    const HUGE: usize = 2 << 20;
    let first = start.next_multiple_of(HUGE);
    let end = (start + len) / HUGE * HUGE;
    if end > first {
        #[cfg(target_os = "linux")]
        // SAFETY: madvise only changes how the kernel backs this range of
        // our own allocation; MADV_HUGEPAGE never changes its contents.
        unsafe {
            libc::madvise(first as *mut libc::c_void, end - first, libc::MADV_HUGEPAGE);
        }
    }
}

impl<S: Slot, L: KeyLayout> AddrTable<S, L> {
    pub fn new() -> Self {
        AddrTable {
            slots: huge_vec(MIN_SLOTS, S::new(EMPTY)),
            shift: 64 - MIN_SLOTS.trailing_zeros(),
            len: 0,
            max_key: None,
            layout: std::marker::PhantomData,
        }
    }

    /// Distinct keys.
    pub fn len(&self) -> usize {
        self.len + self.max_key.is_some() as usize
    }

    #[inline]
    fn home(&self, key: u64) -> usize {
        let chunk = key >> L::CHUNK_SHIFT;
        let mixed = (chunk ^ 0x2d35_8dcc_aa6c_78a5).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        let place = (key >> L::GRANULE_SHIFT) & 15;
        ((mixed >> self.shift) as usize).wrapping_add(place as usize) & (self.slots.len() - 1)
    }

    /// Hints the CPU to load the slot where `key` lives (or would).
    #[inline]
    pub fn prefetch(&self, key: u64) {
        let i = self.home(key);
        prefetch(&self.slots[i] as *const S as *const u8);
    }

    /// The slot of `key`: `Ok(i)` when present, `Err(i)` the empty slot
    /// where it would go.
    #[inline]
    fn find(&self, key: u64) -> Result<usize, usize> {
        let mask = self.slots.len() - 1;
        let mut i = self.home(key);
        loop {
            let k = self.slots[i].key();
            if k == key {
                return Ok(i);
            }
            if k == EMPTY {
                return Err(i);
            }
            i = (i + 1) & mask;
        }
    }

    /// The value of `key`, inserted as `V::default()` if absent.
    #[inline]
    pub fn entry(&mut self, key: u64) -> &mut S::Value {
        if key == EMPTY {
            return self.max_key.get_or_insert_with(S::Value::default);
        }
        let i = match self.find(key) {
            Ok(i) => i,
            Err(i) => {
                if (self.len + 1) * 10 > self.slots.len() * 7 {
                    self.grow();
                    return self.entry(key);
                }
                self.len += 1;
                self.slots[i] = S::new(key);
                i
            }
        };
        self.slots[i].value_mut()
    }

    /// The slot index of `key`, if present (not for `u64::MAX`): a hint
    /// for [`Self::entry_hinted`] a few records later.
    #[inline]
    pub fn index_of(&self, key: u64) -> Option<usize> {
        if key == EMPTY {
            return None;
        }
        self.find(key).ok()
    }

    /// The value in slot `index` (from [`Self::index_of`]).
    #[inline]
    pub fn value_at(&self, index: usize) -> &S::Value {
        self.slots[index].value()
    }

    /// [`Self::entry`], trying slot `hint` first: keys never move except
    /// when the table grows, and a key lives in one slot only, so a slot
    /// holding `key` is its slot; otherwise (a stale hint after growth, or
    /// none) it looks the key up.
    #[inline]
    pub fn entry_hinted(&mut self, key: u64, hint: u32) -> &mut S::Value {
        let i = hint as usize;
        if i < self.slots.len() && self.slots[i].key() == key && key != EMPTY {
            return self.slots[i].value_mut();
        }
        self.entry(key)
    }

    /// The value of `key`, if present.
    #[inline]
    pub fn get(&self, key: u64) -> Option<&S::Value> {
        if key == EMPTY {
            return self.max_key.as_ref();
        }
        self.find(key).ok().map(|i| self.slots[i].value())
    }

    /// The value of `key`, if present.
    #[inline]
    pub fn get_mut(&mut self, key: u64) -> Option<&mut S::Value> {
        if key == EMPTY {
            return self.max_key.as_mut();
        }
        match self.find(key) {
            Ok(i) => Some(self.slots[i].value_mut()),
            Err(_) => None,
        }
    }

    /// Every (key, value), in no particular order.
    pub fn iter(&self) -> impl Iterator<Item = (u64, &S::Value)> {
        self.slots
            .iter()
            .filter(|s| s.key() != EMPTY)
            .map(|s| (s.key(), s.value()))
            .chain(self.max_key.as_ref().map(|v| (EMPTY, v)))
    }

    #[cold]
    fn grow(&mut self) {
        let new_len = self.slots.len() * 2;
        let old = std::mem::replace(&mut self.slots, huge_vec(new_len, S::new(EMPTY)));
        self.shift -= 1;
        for slot in old.into_iter().filter(|s| s.key() != EMPTY) {
            let i = self.find(slot.key()).expect_err("keys are unique");
            self.slots[i] = slot;
        }
    }
}

/// Hints the CPU to load the cache line at `p`.
#[inline]
pub(crate) fn prefetch(p: *const u8) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch has no architectural effect; the pointer is into a
    // live allocation.
    unsafe {
        std::arch::x86_64::_mm_prefetch(p as *const i8, std::arch::x86_64::_MM_HINT_T0);
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    #[test]
    fn behaves_like_a_map() {
        let mut table: AddrTable<LineSlot<u64>, ByteAddresses> = AddrTable::new();
        let mut packed: AddrTable<PackedSlot<u64>, LineNumbers> = AddrTable::new();
        let mut model: HashMap<u64, u64> = HashMap::new();
        let mut x = 7u64;
        for i in 0..200_000u64 {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let key = match i % 4 {
                0 => x,
                1 => 0x5555_0000_0000 + 8 * (i % 5000),
                2 => u64::MAX - (x % 3),
                _ => x % 1000,
            };
            *table.entry(key) += i;
            *packed.entry(key) += i;
            *model.entry(key).or_default() += i;
        }
        assert_eq!(table.len(), model.len());
        for (k, v) in &model {
            assert_eq!(table.get(*k), Some(v));
            assert_eq!(packed.get(*k), Some(v));
        }
        assert_eq!(table.iter().count(), model.len());
        assert_eq!(packed.iter().count(), model.len());
        assert_eq!(table.get(12345678901), None);
        table.prefetch(42);
    }

    #[test]
    fn line_slots_are_one_cache_line() {
        assert_eq!(std::mem::size_of::<LineSlot<[u8; 56]>>(), 64);
        assert_eq!(std::mem::align_of::<LineSlot<u8>>(), 64);
        assert_eq!(std::mem::size_of::<PackedSlot<u32>>(), 16);
    }
}
