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
//!   in docs/performance.md), small values are packed ([`PackedSlot`]);
//! - exposes [`AddrTable::prefetch`] to load a slot ahead of its use
//!   ([`AddrTable::prefetch_two`] with the slot after it, where a key
//!   displaced by a cluster lies).
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
pub(crate) trait Slot: Copy + Send {
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
        impl<V: Copy + Default + Send> Slot for $slot<V> {
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
    slots: SlotMemory<S>,
    /// `64 − log2(slots.len())`: the Fibonacci hash keeps the top bits.
    shift: u32,
    len: usize,
    /// The value of key `u64::MAX`, which marks empty slots.
    max_key: Option<S::Value>,
    layout: std::marker::PhantomData<L>,
}

const EMPTY: u64 = NONE;
const MIN_SLOTS: usize = 64;

impl<S: Slot, L: KeyLayout> AddrTable<S, L> {
    pub(crate) fn new() -> Self {
        AddrTable {
            slots: SlotMemory::new(MIN_SLOTS, S::new(EMPTY)),
            shift: 64 - MIN_SLOTS.trailing_zeros(),
            len: 0,
            max_key: None,
            layout: std::marker::PhantomData,
        }
    }

    /// Distinct keys.
    pub(crate) fn len(&self) -> usize {
        self.len + self.max_key.is_some() as usize
    }

    #[inline(always)]
    fn home(&self, key: u64) -> usize {
        let chunk = key >> L::CHUNK_SHIFT;
        let mixed = (chunk ^ 0x2d35_8dcc_aa6c_78a5).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        let place = (key >> L::GRANULE_SHIFT) & 15;
        ((mixed >> self.shift) as usize).wrapping_add(place as usize) & (self.slots.len() - 1)
    }

    /// Hints the CPU to load the slot where `key` lives (or would).
    #[inline(always)]
    pub(crate) fn prefetch(&self, key: u64) {
        let i = self.home(key);
        prefetch(&self.slots[i] as *const S as *const u8);
    }

    /// [`Self::prefetch`], and the slot after it: a key displaced by a
    /// cluster usually lies in the next slot, a cache line of its own.
    #[inline(always)]
    pub(crate) fn prefetch_two(&self, key: u64) {
        let i = self.home(key);
        let next = (i + 1) & (self.slots.len() - 1);
        prefetch(&self.slots[i] as *const S as *const u8);
        prefetch(&self.slots[next] as *const S as *const u8);
    }

    /// The slot of `key`: `Ok(i)` when present, `Err(i)` the empty slot
    /// where it would go.
    #[inline(always)]
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
    pub(crate) fn entry(&mut self, key: u64) -> &mut S::Value {
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
    #[inline(always)]
    pub(crate) fn index_of(&self, key: u64) -> Option<usize> {
        if key == EMPTY {
            return None;
        }
        self.find(key).ok()
    }

    /// The value in slot `index` (from [`Self::index_of`]).
    #[inline(always)]
    pub(crate) fn value_at(&self, index: usize) -> &S::Value {
        self.slots[index].value()
    }

    /// [`Self::entry`], trying slot `hint` first: keys never move except
    /// when the table grows, and a key lives in one slot only, so a slot
    /// holding `key` is its slot; otherwise (a stale hint after growth, or
    /// none) it looks the key up.
    #[inline(always)]
    pub(crate) fn entry_hinted(&mut self, key: u64, hint: u32) -> &mut S::Value {
        let i = hint as usize;
        if i < self.slots.len() && self.slots[i].key() == key && key != EMPTY {
            return self.slots[i].value_mut();
        }
        self.entry(key)
    }

    /// The value of `key`, if present.
    #[inline]
    pub(crate) fn get(&self, key: u64) -> Option<&S::Value> {
        if key == EMPTY {
            return self.max_key.as_ref();
        }
        self.find(key).ok().map(|i| self.slots[i].value())
    }

    /// The value of `key`, if present.
    #[inline]
    pub(crate) fn get_mut(&mut self, key: u64) -> Option<&mut S::Value> {
        if key == EMPTY {
            return self.max_key.as_mut();
        }
        match self.find(key) {
            Ok(i) => Some(self.slots[i].value_mut()),
            Err(_) => None,
        }
    }

    /// Every (key, value), in no particular order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (u64, &S::Value)> {
        self.slots
            .iter()
            .filter(|s| s.key() != EMPTY)
            .map(|s| (s.key(), s.value()))
            .chain(self.max_key.as_ref().map(|v| (EMPTY, v)))
    }

    /// Doubles the table in place: the slots' memory grows without a copy
    /// (on Linux `mremap` moves the old pages, so only the new half is
    /// fresh memory the kernel must zero), then the keys are rehashed
    /// within it.
    ///
    /// The new home of a key is (almost always) at or above its old slot:
    /// the Fibonacci hash keeps the top bits, so doubling maps home `h` to
    /// `2h` or `2h + 1`, plus the same place in the chunk. The old slots are
    /// walked from the top down; a key moves up to the first empty slot at
    /// or after its new home, passing only slots above the walk, which are
    /// already in their final state (moved keys, or emptied slots that no
    /// probe sequence of a moved key crosses), so every moved key is found
    /// by a lookup of the finished table. The few keys whose new home lies
    /// below their slot, or whose probe would wrap around into the part not
    /// yet walked, are set aside and inserted once the walk is done.
    #[cold]
    fn grow(&mut self) {
        let old_len = self.slots.len();
        let new_len = old_len * 2;
        self.slots.grow(new_len, S::new(EMPTY));
        self.shift -= 1;
        let mut set_aside = Vec::new();
        for s in (0..old_len).rev() {
            let slot = self.slots[s];
            let key = slot.key();
            if key == EMPTY {
                continue;
            }
            let home = self.home(key);
            if home == s {
                continue;
            }
            self.slots[s] = S::new(EMPTY);
            if home < s {
                set_aside.push(slot);
                continue;
            }
            match (home..new_len).find(|&i| self.slots[i].key() == EMPTY) {
                Some(i) => self.slots[i] = slot,
                None => set_aside.push(slot),
            }
        }
        for slot in set_aside {
            let i = self.find(slot.key()).expect_err("keys are unique");
            self.slots[i] = slot;
        }
    }
}

/// Types whose all-zero bytes are a valid value, so that fresh anonymous
/// memory holds valid ones without being written.
///
/// # Safety
///
/// The all-zero bit pattern must be a valid value of the type.
pub(crate) unsafe trait Zeroable: Copy + Send {
    /// The value of zero bytes.
    fn zeroed() -> Self {
        // SAFETY: the trait's contract.
        unsafe { std::mem::zeroed() }
    }
}

// SAFETY: every bit pattern is a valid `u32`.
unsafe impl Zeroable for u32 {}

/// A growable array for the analysis' large arrays that are read at random
/// (the line entries, the window engines' rings): from 2 MiB on it lives
/// in memory like a table's slots ([`SlotMemory`]), backed by transparent
/// huge pages and doubled without a copy, and its spare capacity is the
/// kernel's untouched zeros. With 4 KiB pages a random access to tens of
/// megabytes misses the TLB, and a software prefetch of a line whose
/// translation misses does not hide the miss (measured in
/// docs/performance.md).
pub(crate) struct HugePageVec<T: Zeroable> {
    memory: SlotMemory<T>,
    len: usize,
}

impl<T: Zeroable> HugePageVec<T> {
    /// An empty vector.
    pub(crate) fn new() -> Self {
        HugePageVec {
            memory: SlotMemory::new(0, T::zeroed()),
            len: 0,
        }
    }

    /// Appends `value`, doubling the capacity when full.
    #[inline]
    pub(crate) fn push(&mut self, value: T) {
        if self.len == self.memory.len() {
            self.reserve_for(self.len + 1);
        }
        self.memory[self.len] = value;
        self.len += 1;
    }

    /// Grows to `new_len` elements (at least the current length), the new
    /// ones zero.
    pub(crate) fn grow_to(&mut self, new_len: usize) {
        assert!(new_len >= self.len, "HugePageVec only grows");
        if new_len > self.memory.len() {
            self.reserve_for(new_len);
        }
        self.len = new_len;
    }

    #[cold]
    fn reserve_for(&mut self, len: usize) {
        let capacity = len.next_power_of_two().max(16);
        self.memory.grow_zeroed(capacity);
    }
}

impl<T: Zeroable> std::ops::Deref for HugePageVec<T> {
    type Target = [T];
    #[inline(always)]
    fn deref(&self) -> &[T] {
        &self.memory[..self.len]
    }
}

impl<T: Zeroable> std::ops::DerefMut for HugePageVec<T> {
    #[inline(always)]
    fn deref_mut(&mut self) -> &mut [T] {
        &mut self.memory[..self.len]
    }
}

/// The slots of a table, whose memory can double without copying them
/// once the table is large (see [`AddrTable::grow`]). Small tables live
/// on the heap (a run has many of them, and a mapping each could exhaust
/// the process's map count). On Linux a table of 2 MiB or more lives in
/// an anonymous mapping, 2 MiB-aligned and advised to use transparent
/// huge pages (the tables are accessed at random, and with 4 KiB pages
/// nearly every lookup of a large table would also miss the TLB; measured
/// in docs/performance.md); growing it moves the old pages with `mremap` to a
/// new aligned place, so the huge pages survive and only the new half is
/// fresh (zeroed) memory.
struct SlotMemory<S> {
    heap: Vec<S>,
    #[cfg(target_os = "linux")]
    mapped: Option<Mapped<S>>,
    /// The slots in use (the heap's or the mapping's), kept beside them so
    /// that a lookup does not first ask which of the two holds them.
    ptr: std::ptr::NonNull<S>,
    len: usize,
}

/// `len` slots in a mapping from [`mapping::map`] or [`mapping::grow`].
#[cfg(target_os = "linux")]
struct Mapped<S> {
    ptr: std::ptr::NonNull<S>,
    len: usize,
}

#[cfg(target_os = "linux")]
impl<S> Mapped<S> {
    fn bytes(&self) -> usize {
        mapping::mapped(self.len * std::mem::size_of::<S>())
    }

    /// `len` mapped slots from `ptr`, the ones from `start` on set to
    /// `value` (they may be uninitialised, so written without reading), or
    /// left as the kernel's zeros when `value` is `None` (fresh anonymous
    /// memory; the caller guarantees zero bytes are a valid `S`).
    fn new(ptr: *mut u8, len: usize, start: usize, value: Option<S>) -> Self
    where
        S: Copy + Send,
    {
        let ptr = std::ptr::NonNull::new(ptr as *mut S).expect("mapped");
        if let Some(value) = value {
            // SAFETY: slots `start..len` are mapped, ours, and not yet
            // referenced elsewhere; `MaybeUninit` writes without reading.
            let fresh = unsafe {
                std::slice::from_raw_parts_mut(
                    ptr.as_ptr().add(start) as *mut std::mem::MaybeUninit<S>,
                    len - start,
                )
            };
            fill(fresh, value);
        }
        Mapped { ptr, len }
    }
}

/// New slots of at least this many bytes are filled by two threads.
#[cfg(target_os = "linux")]
const PARALLEL_FILL_BYTES: usize = 16 << 20;

/// Writes `value` into every slot of `slots`. Their memory is fresh, so
/// the first write to each page makes the kernel zero it, and for a large
/// table that costs more than the writes themselves (a tenth of a full
/// trace's main-thread time): from [`PARALLEL_FILL_BYTES`] on, where the
/// machine has a second core, a scoped thread fills the lower half
/// meanwhile (the slots are the same either way).
#[cfg(target_os = "linux")]
fn fill<S: Copy + Send>(slots: &mut [std::mem::MaybeUninit<S>], value: S) {
    fn fill_here<S: Copy>(part: &mut [std::mem::MaybeUninit<S>], value: S) {
        for slot in part {
            slot.write(value);
        }
    }
    let parallel = std::mem::size_of_val(slots) >= PARALLEL_FILL_BYTES
        && std::thread::available_parallelism().is_ok_and(|n| n.get() >= 2);
    if !parallel {
        fill_here(slots, value);
        return;
    }
    let mid = slots.len() / 2;
    let helped = std::thread::scope(|scope| {
        let (low, high) = slots.split_at_mut(mid);
        let helper = std::thread::Builder::new().spawn_scoped(scope, move || fill_here(low, value));
        fill_here(high, value);
        helper.is_ok()
    });
    if !helped {
        fill_here(&mut slots[..mid], value);
    }
}

#[cfg(target_os = "linux")]
impl<S> Drop for Mapped<S> {
    fn drop(&mut self) {
        // SAFETY: our mapping; slots are `Copy` (nothing to drop).
        unsafe { mapping::unmap(self.ptr.as_ptr() as *mut u8, self.bytes()) };
    }
}

// SAFETY: `Mapped` owns its slots like a `Vec<S>` does.
#[cfg(target_os = "linux")]
unsafe impl<S: Send> Send for Mapped<S> {}
// SAFETY: as above; shared access only reads.
#[cfg(target_os = "linux")]
unsafe impl<S: Sync> Sync for Mapped<S> {}

// SAFETY: `ptr` points into the slots `heap` or `mapped` own, so the
// memory is as sendable and shareable as they are.
unsafe impl<S: Send> Send for SlotMemory<S> {}
// SAFETY: as above; shared access only reads.
unsafe impl<S: Sync> Sync for SlotMemory<S> {}

impl<S: Copy + Send> SlotMemory<S> {
    fn new(len: usize, value: S) -> Self {
        let mut memory = SlotMemory {
            heap: vec![value; len],
            #[cfg(target_os = "linux")]
            mapped: None,
            ptr: std::ptr::NonNull::dangling(),
            len: 0,
        };
        memory.point_at_slots();
        memory
    }

    /// Points `ptr` and `len` at the slots in use.
    fn point_at_slots(&mut self) {
        #[cfg(target_os = "linux")]
        if let Some(m) = &self.mapped {
            (self.ptr, self.len) = (m.ptr, m.len);
            return;
        }
        self.ptr = std::ptr::NonNull::new(self.heap.as_mut_ptr()).expect("a vector's pointer");
        self.len = self.heap.len();
    }

    /// Grows to `new_len` slots, the new ones holding `value`.
    fn grow(&mut self, new_len: usize, value: S) {
        self.grow_slots(new_len, value, false);
        self.point_at_slots();
    }

    /// [`Self::grow`] with zero slots: new mapped slots are left as the
    /// kernel zeroed them, so memory not yet used is not touched.
    fn grow_zeroed(&mut self, new_len: usize)
    where
        S: Zeroable,
    {
        self.grow_slots(new_len, S::zeroed(), true);
        self.point_at_slots();
    }

    fn grow_slots(&mut self, new_len: usize, value: S, zeroed: bool) {
        let mapped_value = (!zeroed).then_some(value);
        #[cfg(target_os = "linux")]
        {
            let size = std::mem::size_of::<S>();
            if let Some(old) = self.mapped.take() {
                let (ptr, old_len, old_bytes) = (old.ptr.as_ptr(), old.len, old.bytes());
                std::mem::forget(old);
                let new_bytes = mapping::mapped(new_len * size);
                // SAFETY: our mapping of `old_bytes`, replaced by the new one.
                let ptr = unsafe { mapping::grow(ptr as *mut u8, old_bytes, new_bytes) };
                self.mapped = Some(Mapped::new(ptr, new_len, old_len, mapped_value));
                return;
            }
            if new_len * size >= mapping::HUGE && std::mem::align_of::<S>() <= 4096 {
                let ptr = mapping::map(mapping::mapped(new_len * size));
                let old_len = self.heap.len();
                // SAFETY: the mapping holds `new_len > old_len` slots and
                // does not overlap the heap vector.
                unsafe {
                    std::ptr::copy_nonoverlapping(self.heap.as_ptr(), ptr as *mut S, old_len)
                };
                self.mapped = Some(Mapped::new(ptr, new_len, old_len, mapped_value));
                self.heap = Vec::new();
                return;
            }
        }
        self.heap.resize(new_len, value);
    }
}

impl<S> std::ops::Deref for SlotMemory<S> {
    type Target = [S];
    #[inline(always)]
    fn deref(&self) -> &[S] {
        // SAFETY: `ptr` and `len` describe the initialised slots of the heap
        // vector or the mapping in use (every slot is written when the
        // memory is allocated, mapped or grown, and `point_at_slots` runs
        // after each of those).
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl<S> std::ops::DerefMut for SlotMemory<S> {
    #[inline(always)]
    fn deref_mut(&mut self) -> &mut [S] {
        // SAFETY: as for `deref`, and `&mut self` is unique.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

#[cfg(target_os = "linux")]
mod mapping {
    //! Anonymous mappings for [`super::SlotMemory`].

    use std::alloc::{Layout, handle_alloc_error};

    pub(crate) const HUGE: usize = 2 << 20;
    const PAGE: usize = 4096;

    /// Bytes mapped for `bytes` of slots.
    pub(crate) fn mapped(bytes: usize) -> usize {
        bytes.max(1).next_multiple_of(PAGE)
    }

    /// Address space for `len` bytes (a multiple of the page size), 2 MiB
    /// aligned when it is at least that large, reserved (inaccessible).
    fn reserve(len: usize) -> *mut u8 {
        let align = if len >= HUGE { HUGE } else { PAGE };
        let total = len + align - PAGE;
        // SAFETY: a fresh anonymous mapping at an address of the kernel's
        // choosing; the trimmed parts are ours and unused.
        unsafe {
            let p = libc::mmap(
                std::ptr::null_mut(),
                total,
                libc::PROT_NONE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            );
            if p == libc::MAP_FAILED {
                return std::ptr::null_mut();
            }
            let start = p as usize;
            let aligned = start.next_multiple_of(align);
            if aligned > start {
                libc::munmap(p, aligned - start);
            }
            let end = aligned + len;
            if start + total > end {
                libc::munmap(end as *mut libc::c_void, start + total - end);
            }
            aligned as *mut u8
        }
    }

    fn fail(len: usize) -> ! {
        handle_alloc_error(Layout::from_size_align(len, PAGE).expect("mapping layout"))
    }

    /// Asks for transparent huge pages (only a hint: errors are ignored).
    fn advise(p: *mut u8, len: usize) {
        if len >= HUGE {
            // SAFETY: only changes how the kernel backs our own mapping.
            unsafe {
                libc::madvise(p as *mut libc::c_void, len, libc::MADV_HUGEPAGE);
            }
        }
    }

    /// A readable, writable, zeroed mapping of `len` bytes.
    pub(crate) fn map(len: usize) -> *mut u8 {
        let p = reserve(len);
        if p.is_null() {
            fail(len);
        }
        // SAFETY: replaces our own reservation at `p` with a usable mapping.
        let q = unsafe {
            libc::mmap(
                p as *mut libc::c_void,
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED,
                -1,
                0,
            )
        };
        if q == libc::MAP_FAILED {
            // SAFETY: our reservation.
            unsafe { libc::munmap(p as *mut libc::c_void, len) };
            fail(len);
        }
        advise(p, len);
        p
    }

    /// Moves the mapping `p` of `old` bytes to a fresh place of `new`
    /// bytes, keeping its contents (pages are moved, not copied); the
    /// bytes after `old` are zero.
    ///
    /// # Safety
    /// `p` must be a mapping of `old` bytes from [`map`] or [`grow`], not
    /// used afterwards.
    pub(crate) unsafe fn grow(p: *mut u8, old: usize, new: usize) -> *mut u8 {
        let target = reserve(new);
        if target.is_null() {
            fail(new);
        }
        // SAFETY: moves our mapping onto our own reservation (MREMAP_FIXED
        // replaces it).
        let q = unsafe {
            libc::mremap(
                p as *mut libc::c_void,
                old,
                new,
                libc::MREMAP_MAYMOVE | libc::MREMAP_FIXED,
                target as *mut libc::c_void,
            )
        };
        if q == libc::MAP_FAILED {
            // SAFETY: our reservation.
            unsafe { libc::munmap(target as *mut libc::c_void, new) };
            fail(new);
        }
        advise(target, new);
        target
    }

    /// # Safety
    /// `p` must be a mapping of `len` bytes from [`map`] or [`grow`].
    pub(crate) unsafe fn unmap(p: *mut u8, len: usize) {
        // SAFETY: per the contract.
        unsafe { libc::munmap(p as *mut libc::c_void, len) };
    }
}

/// Hints the CPU to load the cache line at `p`.
#[inline(always)]
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
    fn prefetching_two_slots_wraps_at_the_top_of_the_table() {
        let table: AddrTable<LineSlot<u64>, ByteAddresses> = AddrTable::new();
        let last = table.slots.len() - 1;
        let key = (0..1u64 << 20)
            .map(|i| i * 4)
            .find(|&k| table.home(k) == last)
            .expect("some granule's home is the last slot");
        table.prefetch_two(key);
    }

    #[test]
    fn keys_survive_in_place_growth_with_full_clusters() {
        // Dense granules fill whole chunks (16 neighbouring slots each), so
        // clusters run into each other and across the top of the table,
        // where the rehash sets keys aside; check after every doubling.
        let mut table: AddrTable<LineSlot<u64>, ByteAddresses> = AddrTable::new();
        let mut slots = table.slots.len();
        let keys: Vec<u64> = (0..300_000u64)
            .map(|i| {
                if i % 3 == 0 {
                    i * 4
                } else {
                    (i << 20) ^ 0x7000
                }
            })
            .collect();
        for (n, &key) in keys.iter().enumerate() {
            *table.entry(key) = key + 1;
            if table.slots.len() != slots {
                slots = table.slots.len();
                for &k in &keys[..=n] {
                    assert_eq!(
                        table.get(k),
                        Some(&(k + 1)),
                        "key {k} after growing to {slots}"
                    );
                }
            }
        }
        assert_eq!(table.len(), keys.len());
        assert_eq!(table.iter().count(), keys.len());
    }

    #[test]
    fn line_slots_are_one_cache_line() {
        assert_eq!(std::mem::size_of::<LineSlot<[u8; 56]>>(), 64);
        assert_eq!(std::mem::align_of::<LineSlot<u8>>(), 64);
        assert_eq!(std::mem::size_of::<PackedSlot<u32>>(), 16);
    }

    #[test]
    fn huge_page_vec_keeps_its_elements_across_the_move_to_a_mapping() {
        // 64-byte elements: the vector leaves the heap at 32,768 (2 MiB)
        // and then doubles its mapping in place.
        #[derive(Clone, Copy, Debug, PartialEq)]
        #[repr(align(64))]
        struct Line(u64);
        // SAFETY: a `u64`.
        unsafe impl Zeroable for Line {}
        let mut v = HugePageVec::new();
        assert!(v.is_empty());
        for i in 0..200_000u64 {
            v.push(Line(i));
            if i.is_power_of_two() || i % 65_536 == 0 {
                assert!(
                    v.iter().enumerate().all(|(j, l)| l.0 == j as u64),
                    "after {i}"
                );
            }
        }
        assert_eq!(v.len(), 200_000);
        v[123_456] = Line(7);
        assert_eq!(v[123_456], Line(7));

        // `grow_to` keeps what is there and fills the rest.
        let mut ring = HugePageVec::<u32>::new();
        ring.grow_to(64);
        ring[63] = 5;
        ring.grow_to(1 << 20);
        assert_eq!(ring.len(), 1 << 20);
        assert_eq!(ring[63], 5);
        assert!(ring[64..].iter().all(|&x| x == 0));
    }
}
