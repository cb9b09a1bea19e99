//! Reuse (stack) distance `D` within a sample, in O(log n) per access.
//!
//! Olken's method: every block accessed in the sample holds the time of its
//! last access, and those times are marked; the distance of an access to a
//! block last accessed at time `τ` is the number of marks after `τ` (the
//! distinct other blocks accessed since).
//!
//! The marks are counted on three flat levels and one tree, shallow where
//! most reuses are short:
//!
//! - a bitmap of the time axis (one bit per time, [`WORD_TIMES`] per word);
//! - a `u16` count per *group* of [`GROUP_WORDS`] words (512 times);
//! - a Fenwick tree over *spans* of [`SPAN_GROUPS`] groups (32,768 times).
//!
//! The marks after `τ` are the bits above it in its word, the words after
//! it in its group, the groups after its group in its span (flat sums of
//! at most 7 and 63 entries, cut at the current time, which
//! auto-vectorise), and the spans after its span (two walks down the tree
//! that stop where they meet; none at all while the sample has touched
//! fewer than 4,096 blocks, since the axis then has one span). Moving a mark to
//! the present changes two bits and two group counts, and walks the tree
//! only when the mark leaves its span: O(1) where the Fenwick tree over
//! words it replaces walked ~2 × log2(axis / 64) nodes, with a
//! mispredicted branch at most steps. The tree keeps the whole O(log n).
//!
//! Time advances only when a block other than the most recent one is
//! accessed — repeated accesses to one block (a strided walk within a
//! cache line) touch nothing. When the time axis fills, live times are
//! renumbered `0..live` in order and the structures rebuilt in
//! O(capacity): memory stays proportional to the distinct blocks of the
//! sample, not to its length.

use super::NONE;

/// Per-block state of the current sample (valid while `piece` matches).
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct BlockLocal {
    pub(crate) piece: u32,
    pub(crate) time: u32,
    pub(crate) reused: bool,
}

/// Times per bitmap word.
const WORD_TIMES: u32 = 64;
/// Words per group (a group's count fits a `u16`).
const GROUP_WORDS: u32 = 8;
/// Times per group.
const GROUP_TIMES: u32 = WORD_TIMES * GROUP_WORDS;
/// Groups per span (a node of the Fenwick tree).
const SPAN_GROUPS: u32 = 64;
/// Times per span.
const SPAN_TIMES: u32 = GROUP_TIMES * SPAN_GROUPS;

/// `n` zero masks of type `$ty`, then `n` full ones: lane `k` of
/// `table[n - 1 - i..][..n]` is set iff `k > i` (see
/// [`ReuseTracker::marks_after`]).
macro_rules! masks_after {
    ($ty:ty, $n:expr) => {{
        let mut masks: [$ty; 2 * $n] = [0; 2 * $n];
        let mut k = $n;
        while k < masks.len() {
            masks[k] = <$ty>::MAX;
            k += 1;
        }
        masks
    }};
}

/// Masks over a group's words.
static WORDS_AFTER: [u64; 2 * GROUP_WORDS as usize] = masks_after!(u64, GROUP_WORDS as usize);
/// Masks over a span's groups.
static GROUPS_AFTER: [u16; 2 * SPAN_GROUPS as usize] = masks_after!(u16, SPAN_GROUPS as usize);

/// The smallest time axis: one group.
const MIN_CAPACITY: u32 = GROUP_TIMES;

/// Reuse distances of one access sequence (a sample of one thread).
pub(crate) struct ReuseTracker {
    /// Bit `t` set: some block's last access is at time `t`.
    bits: Vec<u64>,
    /// Set bits per group of [`GROUP_WORDS`] words.
    groups: Vec<u16>,
    /// Fenwick tree over the set bits per span, 1-based.
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
    pub(crate) fn new() -> Self {
        let mut tracker = ReuseTracker {
            bits: Vec::new(),
            groups: Vec::new(),
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

    /// Sizes the structures for `capacity` times (a power of two ≥
    /// [`MIN_CAPACITY`]), all clear.
    fn allocate(&mut self, capacity: u32) {
        self.capacity = capacity;
        self.bits = vec![0; (capacity / WORD_TIMES) as usize];
        // Whole spans, so that a span's groups are one fixed-size array.
        self.groups = vec![0; (capacity.div_ceil(SPAN_TIMES) * SPAN_GROUPS) as usize];
        self.tree = vec![0; capacity.div_ceil(SPAN_TIMES) as usize + 1];
        self.owner = vec![NONE; capacity as usize];
    }

    /// Starts a new sample; returns `(captures, survivals)` of the one that
    /// ended: distinct blocks with and without a reuse. O(capacity / 64),
    /// and the capacity shrinks back when a large sample is followed by
    /// small ones.
    pub(crate) fn reset(&mut self, piece: u32) -> (u64, u64) {
        let result = (self.captures, u64::from(self.live) - self.captures);
        let wanted = self
            .live
            .saturating_mul(8)
            .next_power_of_two()
            .max(MIN_CAPACITY);
        if self.capacity > 4 * wanted {
            self.allocate(wanted);
        } else {
            let used = self.now.div_ceil(WORD_TIMES) as usize;
            self.bits[..used].fill(0);
            let used = self.now.div_ceil(GROUP_TIMES) as usize;
            self.groups[..used].fill(0);
            self.tree.fill(0);
        }
        self.now = 0;
        self.live = 0;
        self.piece = piece;
        self.captures = 0;
        result
    }

    /// Distinct blocks of the current sample so far.
    #[inline]
    pub(crate) fn live(&self) -> u32 {
        self.live
    }

    /// Whether [`Self::compact`] must run before the next access.
    #[inline]
    pub(crate) fn needs_room(&self) -> bool {
        self.now == self.capacity
    }

    /// Renumbers live times `0..live`, growing the axis when more than a
    /// quarter of it is live (so a compaction, which looks up every live
    /// block, comes at most once per three accesses per live block).
    /// `set_time(block, time)` must store the new time in the block's
    /// [`BlockLocal`].
    #[cold]
    pub(crate) fn compact(&mut self, mut set_time: impl FnMut(u64, u32)) {
        let mut next = 0usize;
        for w in 0..self.bits.len() {
            let mut word = self.bits[w];
            while word != 0 {
                let t = w * WORD_TIMES as usize + word.trailing_zeros() as usize;
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
            let owner = std::mem::take(&mut self.owner);
            self.allocate(capacity);
            self.owner = owner;
            self.owner.resize(capacity as usize, NONE);
        }
        // Times 0..live are marked, the rest clear.
        let live = self.live;
        self.bits.fill(0);
        let full_words = (live / WORD_TIMES) as usize;
        self.bits[..full_words].fill(u64::MAX);
        if !live.is_multiple_of(WORD_TIMES) {
            self.bits[full_words] = (1u64 << (live % WORD_TIMES)) - 1;
        }
        self.groups.fill(0);
        let full_groups = (live / GROUP_TIMES) as usize;
        self.groups[..full_groups].fill(GROUP_TIMES as u16);
        if !live.is_multiple_of(GROUP_TIMES) {
            self.groups[full_groups] = (live % GROUP_TIMES) as u16;
        }
        // Linear Fenwick construction over per-span counts.
        self.tree.fill(0);
        let n = self.tree.len() - 1;
        for i in 1..=n {
            let span_start = (i as u32 - 1) * SPAN_TIMES;
            self.tree[i] += live.saturating_sub(span_start).min(SPAN_TIMES);
            let j = i + (i & i.wrapping_neg());
            if j <= n {
                self.tree[j] += self.tree[i];
            }
        }
        self.now = live;
    }

    /// An access to `block`; returns its reuse distance, or `None` for the
    /// first access to the block in this sample.
    #[inline(always)]
    pub(crate) fn access(&mut self, block: u64, local: &mut BlockLocal) -> Option<u64> {
        debug_assert!(self.now < self.capacity);
        if local.piece != self.piece {
            local.piece = self.piece;
            local.reused = false;
            self.live += 1;
            let time = self.mark_now(block, local);
            self.tree_add(time / SPAN_TIMES);
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
        self.bits[(old / WORD_TIMES) as usize] &= !(1 << (old % WORD_TIMES));
        self.groups[(old / GROUP_TIMES) as usize] -= 1;
        let new = self.mark_now(block, local);
        let (from, to) = (old / SPAN_TIMES, new / SPAN_TIMES);
        if from != to {
            self.tree_move(from, to);
        }
        Some(u64::from(distance))
    }

    /// Marks `block` at the current time in the bitmap and its group, and
    /// advances the time; returns the marked time (the caller updates the
    /// tree, which a move within a span leaves alone).
    #[inline(always)]
    fn mark_now(&mut self, block: u64, local: &mut BlockLocal) -> u32 {
        let time = self.now;
        self.owner[time as usize] = block;
        self.bits[(time / WORD_TIMES) as usize] |= 1 << (time % WORD_TIMES);
        self.groups[(time / GROUP_TIMES) as usize] += 1;
        local.time = time;
        self.now += 1;
        time
    }

    /// Marks at times after `time` (all marks lie before `now`, and every
    /// bit and count after `now` is zero).
    ///
    /// A reuse within the current word is one `popcount`. Otherwise: the
    /// bits above `time` in the words of its group, the groups after its
    /// group in its span — both as fixed-length masked sums, which compile
    /// to straight-line (vector) code instead of loops whose trip counts
    /// the branch predictor cannot guess — and the spans after its span,
    /// as a difference of two prefix sums whose walks down the tree stop
    /// where they meet.
    #[inline(always)]
    fn marks_after(&self, time: u32) -> u32 {
        let last = self.now - 1;
        let word = time / WORD_TIMES;
        let above = !(u64::MAX >> (63 - time % WORD_TIMES));
        if word == last / WORD_TIMES {
            return (self.bits[word as usize] & above).count_ones();
        }
        let group = (time / GROUP_TIMES) as usize;
        let words: &[u64; GROUP_WORDS as usize] = self.bits[group * GROUP_WORDS as usize..]
            [..GROUP_WORDS as usize]
            .try_into()
            .expect("a group's words");
        // The masks select the entries after the time's own: lane `k` of
        // `AFTER[n - 1 - i..][..n]` is all ones iff `k > i`.
        let in_group = (word % GROUP_WORDS) as usize;
        let word_masks =
            &WORDS_AFTER[GROUP_WORDS as usize - 1 - in_group..][..GROUP_WORDS as usize];
        let mut sum = (self.bits[word as usize] & above).count_ones();
        for (&bits, &mask) in words.iter().zip(word_masks) {
            sum += (bits & mask).count_ones();
        }
        let span = time / SPAN_TIMES;
        let groups: &[u16; SPAN_GROUPS as usize] = self.groups
            [span as usize * SPAN_GROUPS as usize..][..SPAN_GROUPS as usize]
            .try_into()
            .expect("a span's groups");
        let in_span = group % SPAN_GROUPS as usize;
        let group_masks =
            &GROUPS_AFTER[SPAN_GROUPS as usize - 1 - in_span..][..SPAN_GROUPS as usize];
        // A span holds at most 32,768 marks: the sum fits the `u16` lanes.
        let mut groups_after = 0u16;
        for (&count, &mask) in groups.iter().zip(group_masks) {
            groups_after = groups_after.wrapping_add(count & mask);
        }
        sum += u32::from(groups_after);
        // Σ spans span+1 ..= last's = P(last's + 1) − P(span + 1), P(i)
        // the sum of spans 0..i.
        let mut i = (last / SPAN_TIMES) as usize + 1;
        let mut j = span as usize + 1;
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

    /// Moves one mark from span `from` to span `to` (`from < to`) in the
    /// Fenwick tree: one walk up from each until the two paths meet (above
    /// it the −1 and +1 cancel).
    #[inline]
    fn tree_move(&mut self, from: u32, to: u32) {
        let n = self.tree.len() - 1;
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

    /// Adds one mark to span `span` in the Fenwick tree.
    #[inline]
    fn tree_add(&mut self, span: u32) {
        let mut i = span as usize + 1;
        let n = self.tree.len() - 1;
        while i <= n {
            self.tree[i] += 1;
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

    /// Naive distances of dense block ids: the blocks whose last access
    /// lies between the previous access and this one, by a scan of all.
    fn naive_dense(seq: &[u64], blocks: usize) -> Vec<Option<u64>> {
        let mut last: Vec<Option<usize>> = vec![None; blocks];
        seq.iter()
            .enumerate()
            .map(|(i, &b)| {
                let d = last[b as usize].map(|p| {
                    last.iter()
                        .filter(|l| l.is_some_and(|l| l > p && l < i))
                        .count() as u64
                });
                last[b as usize] = Some(i);
                d
            })
            .collect()
    }

    #[test]
    fn spans_and_their_tree_match_the_naive_stack() {
        // 9,000 live blocks make the axis 131,072 times long (four spans
        // of the Fenwick tree), and 120,000 reuses walk it into the fourth
        // span: reuses within a word, a group, a span and across spans.
        let mut tracker = ReuseTracker::new();
        let mut x = 7u64;
        let blocks = 9_000u64;
        let seq: Vec<u64> = (0..blocks)
            .chain((0..120_000u64).map(|i| {
                x = x
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                match i % 4 {
                    0 => (x >> 33) % blocks,
                    1 => (x >> 33) % 40,
                    2 => (i / 4) % blocks,
                    _ => blocks - 1 - (x >> 33) % 600,
                }
            }))
            .collect();
        let got = fast(&seq, &mut tracker, 1);
        assert_eq!(tracker.capacity, 4 * SPAN_TIMES);
        assert!(tracker.now > 3 * SPAN_TIMES, "{}", tracker.now);
        let want = naive_dense(&seq, blocks as usize);
        let first_difference = (0..seq.len()).find(|&i| got[i] != want[i]);
        assert_eq!(
            first_difference,
            None,
            "{:?}",
            first_difference.map(|i| (got[i], want[i]))
        );
        // A small sample after the large one, then the axis shrinks back.
        assert_eq!(fast(&[5, 6, 5], &mut tracker, 2), vec![None, None, Some(1)]);
        tracker.reset(3);
        assert_eq!(tracker.capacity, MIN_CAPACITY);
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
