//! Reuse (stack) distance `D` within a sample, in O(log n) per access.
//!
//! Olken's method: every block accessed in the sample holds the time of its
//! last access, and those times are marked; the distance of an access to a
//! block last accessed at time `τ` is the number of marks after `τ` (the
//! distinct other blocks accessed since). The marks are a bitmap with a
//! Fenwick tree over its 64-bit words, so the tree is 64× smaller than the
//! time axis and stays in cache; the marks after a time are counted by two
//! walks down the tree that stop where they meet, plus one `popcount`. Time advances only when a block other than the most recent
//! one is accessed — repeated accesses to one block (a strided walk within
//! a cache line) touch nothing. When the time axis fills, live times are
//! renumbered `0..live` in order and the structures rebuilt in O(capacity):
//! memory stays proportional to the distinct blocks of the sample, not to
//! its length.

use super::NONE;

/// Per-block state of the current sample (valid while `piece` matches).
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct BlockLocal {
    pub piece: u32,
    pub time: u32,
    pub reused: bool,
}

const MIN_CAPACITY: u32 = 64;

/// Reuse distances of one access sequence (a sample of one thread).
pub(crate) struct ReuseTracker {
    /// Bit `t` set: some block's last access is at time `t`.
    bits: Vec<u64>,
    /// Fenwick tree over the set bits per word, 1-based.
    tree: Vec<u32>,
    /// The block last accessed at each time (stale where the bit is clear).
    owner: Vec<u64>,
    capacity: u32,
    now: u32,
    live: u32,
    piece: u32,
    captures: u64,
}

impl ReuseTracker {
    pub fn new() -> Self {
        let mut tracker = ReuseTracker {
            bits: Vec::new(),
            tree: Vec::new(),
            owner: Vec::new(),
            capacity: 0,
            now: 0,
            live: 0,
            piece: 0,
            captures: 0,
        };
        tracker.allocate(MIN_CAPACITY);
        tracker
    }

    fn allocate(&mut self, capacity: u32) {
        self.capacity = capacity;
        let words = (capacity / 64) as usize;
        self.bits = vec![0; words];
        self.tree = vec![0; words + 1];
        self.owner = vec![NONE; capacity as usize];
    }

    /// Starts a new sample; returns `(captures, survivals)` of the one that
    /// ended: distinct blocks with and without a reuse. O(capacity / 64),
    /// and the capacity shrinks back when a large sample is followed by
    /// small ones.
    pub fn reset(&mut self, piece: u32) -> (u64, u64) {
        let result = (self.captures, u64::from(self.live) - self.captures);
        let wanted = self
            .live
            .saturating_mul(8)
            .next_power_of_two()
            .max(MIN_CAPACITY);
        if self.capacity > 4 * wanted {
            self.allocate(wanted);
        } else {
            let used = (self.now as usize).div_ceil(64);
            self.bits[..used].fill(0);
            self.tree.fill(0);
        }
        self.now = 0;
        self.live = 0;
        self.piece = piece;
        self.captures = 0;
        result
    }

    /// Whether [`Self::compact`] must run before the next access.
    #[inline]
    pub fn needs_room(&self) -> bool {
        self.now == self.capacity
    }

    /// Renumbers live times `0..live`, growing the axis when more than a
    /// quarter of it is live (so a compaction, which looks up every live
    /// block, comes at most once per three accesses per live block). `set_time(block, time)` must store the new time in the
    /// block's [`BlockLocal`].
    #[cold]
    pub fn compact(&mut self, mut set_time: impl FnMut(u64, u32)) {
        let mut next = 0usize;
        for w in 0..self.bits.len() {
            let mut word = self.bits[w];
            while word != 0 {
                let t = w * 64 + word.trailing_zeros() as usize;
                word &= word - 1;
                let block = self.owner[t];
                self.owner[next] = block;
                set_time(block, next as u32);
                next += 1;
            }
        }
        debug_assert_eq!(next as u32, self.live);
        if u64::from(self.live) * 4 > u64::from(self.capacity) {
            let capacity = (self.live * 8).next_power_of_two();
            self.capacity = capacity;
            self.owner.resize(capacity as usize, NONE);
            self.bits = vec![0; (capacity / 64) as usize];
            self.tree = vec![0; (capacity / 64) as usize + 1];
        }
        let live = self.live as usize;
        self.bits.fill(0);
        for w in 0..live / 64 {
            self.bits[w] = u64::MAX;
        }
        if !live.is_multiple_of(64) {
            self.bits[live / 64] = (1u64 << (live % 64)) - 1;
        }
        // Linear Fenwick construction over per-word counts.
        self.tree.fill(0);
        let n = self.bits.len();
        for i in 1..=n {
            self.tree[i] += self.bits[i - 1].count_ones();
            let j = i + (i & i.wrapping_neg());
            if j <= n {
                self.tree[j] += self.tree[i];
            }
        }
        self.now = self.live;
    }

    /// An access to `block`; returns its reuse distance, or `None` for the
    /// first access to the block in this sample.
    #[inline]
    pub fn access(&mut self, block: u64, local: &mut BlockLocal) -> Option<u64> {
        debug_assert!(self.now < self.capacity);
        if local.piece != self.piece {
            local.piece = self.piece;
            local.reused = false;
            self.live += 1;
            self.place(block, local);
            return None;
        }
        if !local.reused {
            local.reused = true;
            self.captures += 1;
        }
        if local.time + 1 == self.now {
            return Some(0);
        }
        let old = local.time;
        let distance = self.marks_after(old);
        // Move the block's mark from `old` to `now`: one walk up the tree
        // from each word until the two paths meet (above it the −1 and +1
        // cancel), instead of two full walks.
        let new = self.now;
        self.bits[(old / 64) as usize] &= !(1 << (old % 64));
        self.owner[new as usize] = block;
        self.bits[(new / 64) as usize] |= 1 << (new % 64);
        self.tree_move(old / 64, new / 64);
        local.time = new;
        self.now += 1;
        Some(u64::from(distance))
    }

    #[inline]
    fn place(&mut self, block: u64, local: &mut BlockLocal) {
        let time = self.now;
        self.owner[time as usize] = block;
        self.bits[(time / 64) as usize] |= 1 << (time % 64);
        self.tree_add(time / 64, 1);
        local.time = time;
        self.now += 1;
    }

    /// Marks at times after `time` (all marks lie before `now`): the bits
    /// above it in its word plus the words after it up to the current one,
    /// as a difference of two prefix sums whose walks down the tree stop
    /// where they meet, so a short reuse costs a few steps, not `log n`.
    #[inline]
    fn marks_after(&self, time: u32) -> u32 {
        let word = (time / 64) as usize;
        let above = !(u64::MAX >> (63 - time % 64));
        let mut sum = (self.bits[word] & above).count_ones();
        // Σ words word+1 ..= last = P(last + 1) − P(word + 1), P(i) the
        // sum of words 0..i.
        let mut i = ((self.now - 1) / 64) as usize + 1;
        let mut j = word + 1;
        while i != j {
            if i > j {
                sum = sum.wrapping_add(self.tree[i]);
                i &= i - 1;
            } else {
                sum = sum.wrapping_sub(self.tree[j]);
                j &= j - 1;
            }
        }
        sum
    }

    /// Moves one mark from word `from` to word `to` (`from ≤ to`) in the
    /// Fenwick tree.
    #[inline]
    fn tree_move(&mut self, from: u32, to: u32) {
        let n = self.bits.len();
        let mut i = from as usize + 1;
        let mut j = to as usize + 1;
        while i != j {
            if i < j {
                if i > n {
                    break;
                }
                self.tree[i] = self.tree[i].wrapping_sub(1);
                i += i & i.wrapping_neg();
            } else {
                if j > n {
                    break;
                }
                self.tree[j] = self.tree[j].wrapping_add(1);
                j += j & j.wrapping_neg();
            }
        }
    }

    #[inline]
    fn tree_add(&mut self, word: u32, delta: u32) {
        let mut i = word as usize + 1;
        let n = self.bits.len();
        while i <= n {
            self.tree[i] = self.tree[i].wrapping_add(delta);
            i += i & i.wrapping_neg();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    /// Naive LRU stack distance.
    fn naive(seq: &[u64]) -> Vec<Option<u64>> {
        let mut stack: Vec<u64> = Vec::new();
        seq.iter()
            .map(|&b| {
                let d = stack.iter().rev().position(|&x| x == b).map(|i| i as u64);
                stack.retain(|&x| x != b);
                stack.push(b);
                d
            })
            .collect()
    }

    fn fast(seq: &[u64], tracker: &mut ReuseTracker, piece: u32) -> Vec<Option<u64>> {
        tracker.reset(piece);
        let mut locals: HashMap<u64, BlockLocal> = HashMap::new();
        seq.iter()
            .map(|&b| {
                if tracker.needs_room() {
                    tracker.compact(|block, time| locals.get_mut(&block).unwrap().time = time);
                }
                tracker.access(b, locals.entry(b).or_default())
            })
            .collect()
    }

    #[test]
    fn matches_naive_stack_through_compactions() {
        let mut tracker = ReuseTracker::new();
        let mut x = 1u64;
        for (piece, n) in [(1u32, 20000usize), (2, 10), (3, 3000)] {
            let seq: Vec<u64> = (0..n)
                .map(|i| {
                    x = x.wrapping_mul(6364136223846793005).wrapping_add(1);
                    if i % 3 == 0 {
                        (x >> 40) % 300
                    } else {
                        i as u64 / 7
                    }
                })
                .collect();
            assert_eq!(
                fast(&seq, &mut tracker, piece),
                naive(&seq),
                "piece {piece}"
            );
        }
    }

    #[test]
    fn by_hand() {
        // a b c a a b: D(a) = 2 (b, c), D(a) = 0, D(b) = 2 (c, a).
        let mut tracker = ReuseTracker::new();
        let got = fast(&[1, 2, 3, 1, 1, 2], &mut tracker, 1);
        assert_eq!(got, vec![None, None, None, Some(2), Some(0), Some(2)]);
        // captures: a, b; survivals: c
        assert_eq!(tracker.reset(2), (2, 1));
    }
}
