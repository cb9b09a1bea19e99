//! Footprint metrics of every window size at once, in one pass.
//!
//! A [`WindowEngine`] follows one access sequence (the accesses of a
//! sample, or of one function within a sample) and, for every level `k` in
//! `lo..=top`, cuts it into consecutive windows of `2^k` accesses and adds
//! each window's `F`, `F_lines`, `F_str`, `F_irr` and `A_const` to
//! [`LevelSums`] when the window closes. Tails shorter than `2^k` are
//! dropped (docs/METRICS.md).
//!
//! # Why one hash lookup gives `F` for all levels
//!
//! Let an access at position `t` have its previous access to the same
//! address at `p`. `p` and `t` share a window of size `2^k` iff
//! `p >> k == t >> k`, i.e. iff `msb(p ^ t) < k`. So the access is the first
//! one to its address in its window exactly at the levels
//! `k ≤ m = msb(p ^ t)` (all levels when there is no `p`). The engine
//! counts accesses by `m` (`hist[m] += 1`, O(1)), and a window of level `k`
//! that closes has `F = Σ_{j ≥ k} hist[j]` minus the same sum at its start.
//! Closing costs O(levels) but happens every `2^k` accesses, so all levels
//! together cost O(1) amortised per access.
//!
//! # `F_str` / `F_irr` of addresses touched by both classes
//!
//! An address counts toward `F_str` of a window by the share of its
//! accesses in that window that are Strided. For an address touched by one
//! class only in the window that is the class of its first access there,
//! counted like `F` (`hist_str`). An address is *mixed* in the window of
//! level `k` containing `t` iff its last access of the other class, `p_o`,
//! lies in the same window: `k > msb(p_o ^ t)`. Such (address, level)
//! pairs are registered once per window ([`Mark`] remembers which levels
//! are already registered), and when the window closes the engine walks
//! the address's accesses in the window backwards through a ring buffer of
//! "distance to the previous access of the same address" entries, counting
//! Strided and Irregular accesses exactly, and corrects the window's
//! `F_str` by `s/(s+i) − [first access was Strided]`. The cost is paid only
//! by mixed addresses; the ring holds at most `2^top` entries.

use super::addr_table::{AddrTable, ByteAddresses, HugePageVec, PackedSlot};
use super::{LEVELS, NONE};

/// Positions of the last Strided (`[0]`) and Irregular (`[1]`) access to
/// an address in the current access sequence ([`NONE`] if none).
pub(crate) type Lasts = [u64; 2];

/// A fresh [`Lasts`].
pub(crate) const NO_LASTS: Lasts = [NONE, NONE];

/// Position of the last access of either class, or [`NONE`].
#[inline]
pub(crate) fn last_of(lasts: &Lasts) -> u64 {
    match (lasts[0], lasts[1]) {
        (NONE, x) | (x, NONE) => x,
        (a, b) => a.max(b),
    }
}

/// Per-address state in a side map: [`Lasts`] valid while `piece` matches
/// the current piece (so starting a new sample is O(1)).
#[derive(Clone, Copy, Debug)]
pub(crate) struct AddrLocal {
    pub(crate) piece: u32,
    pub(crate) lasts: Lasts,
}

impl Default for AddrLocal {
    fn default() -> Self {
        AddrLocal {
            piece: 0,
            lasts: NO_LASTS,
        }
    }
}

impl AddrLocal {
    /// The lasts for `piece`, reset if they belong to an earlier one.
    #[inline]
    pub(crate) fn for_piece(&mut self, piece: u32) -> &mut Lasts {
        if self.piece != piece {
            self.piece = piece;
            self.lasts = NO_LASTS;
        }
        &mut self.lasts
    }
}

/// Sums over closed windows of one level, for averaging.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(crate) struct LevelSums {
    pub(crate) windows: u64,
    pub(crate) f: u64,
    pub(crate) f_lines: u64,
    pub(crate) a_const: u64,
    pub(crate) f_str: f64,
    pub(crate) f_irr: f64,
    pub(crate) f_str_frac: f64,
    pub(crate) f_irr_frac: f64,
    pub(crate) d_f: f64,
}

impl LevelSums {
    #[inline]
    fn add(&mut self, k: u32, f: u64, f_str: f64, f_lines: u64, a_const: u64) {
        let f_irr = f as f64 - f_str;
        self.windows += 1;
        self.f += f;
        self.f_lines += f_lines;
        self.a_const += a_const;
        self.f_str += f_str;
        self.f_irr += f_irr;
        // A window holds 2^k ≥ 1 accesses, so F ≥ 1.
        self.f_str_frac += f_str / f as f64;
        self.f_irr_frac += f_irr / f as f64;
        self.d_f += f as f64 / ((1u64 << k) + a_const) as f64;
    }
}

/// Registration state of a mixed address: at position `t`, levels
/// `≥ level` of the windows containing `t` were registered.
#[derive(Clone, Copy, Debug, Default)]
struct Mark {
    piece: u32,
    level: u32,
    t: u64,
}

#[derive(Clone, Copy, Debug, Default)]
struct Start {
    f: u64,
    str_first: u64,
    lines: u64,
    a_const: u64,
}

/// Multi-level window metrics of one access sequence (see module docs).
pub(crate) struct WindowEngine {
    lo: u32,
    top: u32,
    piece: u32,
    pos: u64,
    hist: [u64; LEVELS],
    hist_str: [u64; LEVELS],
    hist_lines: [u64; LEVELS],
    /// Strided accesses (`Σ hist_str`) and lines noted (`Σ hist_lines`).
    strided: u64,
    lines: u64,
    a_const: u64,
    pending_const: u64,
    start: [Start; LEVELS],
    /// Per position `t mod len`: `(t − previous access to the same
    /// address) << 1 | is_strided`; distance 0 means none.
    ring: HugePageVec<u32>,
    /// The position at which the ring must grow (`u64::MAX` once it holds
    /// `2^top` entries): one compare per access.
    ring_grows_at: u64,
    mixed: Vec<Vec<u64>>,
    /// An address table, not a `HashMap`: a strided scan of mixed
    /// addresses then walks neighbouring slots.
    marks: AddrTable<PackedSlot<Mark>, ByteAddresses>,
    /// Scratch space of [`Self::mixed_correction`].
    walks: Vec<Walk>,
}

impl WindowEngine {
    /// An engine for levels `lo..=top` (`top < LEVELS`).
    pub(crate) fn new(lo: u32, top: u32) -> Self {
        assert!(lo <= top && (top as usize) < LEVELS);
        WindowEngine {
            lo,
            top,
            piece: 0,
            pos: 0,
            hist: [0; LEVELS],
            hist_str: [0; LEVELS],
            hist_lines: [0; LEVELS],
            strided: 0,
            lines: 0,
            a_const: 0,
            pending_const: 0,
            start: [Start::default(); LEVELS],
            ring: HugePageVec::new(),
            ring_grows_at: 0,
            mixed: vec![Vec::new(); LEVELS],
            marks: AddrTable::new(),
            walks: Vec::new(),
        }
    }

    /// The levels `(lo, top)` it tracks.
    pub(crate) fn levels(&self) -> (u32, u32) {
        (self.lo, self.top)
    }

    /// The piece (sample × thread) the engine follows.
    #[inline]
    pub(crate) fn piece(&self) -> u32 {
        self.piece
    }

    /// Starts a new access sequence; O(levels), whatever came before.
    pub(crate) fn reset(&mut self, piece: u32) {
        self.piece = piece;
        self.pos = 0;
        self.hist = [0; LEVELS];
        self.hist_str = [0; LEVELS];
        self.hist_lines = [0; LEVELS];
        self.strided = 0;
        self.lines = 0;
        self.a_const = 0;
        self.pending_const = 0;
        self.start = [Start::default(); LEVELS];
        for list in &mut self.mixed {
            list.clear();
        }
    }

    /// Constant loads seen since the last access; they belong to the window
    /// of the next access (a window is a run of records ending with its
    /// `2^k`-th access).
    #[inline]
    pub(crate) fn constant(&mut self, loads: u64) {
        self.pending_const += loads;
    }

    /// The 64-byte line of the next access was last accessed at position
    /// `prev` of this sequence ([`NONE`] if not). Call before [`Self::access`].
    #[inline]
    pub(crate) fn line(&mut self, prev: u64) {
        let m = self.level_of(prev);
        self.hist_lines[m] += 1;
        self.lines += 1;
    }

    /// Position the next access will take.
    #[inline]
    pub(crate) fn position(&self) -> u64 {
        self.pos
    }

    #[inline]
    fn level_of(&self, prev: u64) -> usize {
        if prev == NONE {
            self.top as usize
        } else {
            (63 - (prev ^ self.pos).leading_zeros()).min(self.top) as usize
        }
    }

    /// One access to `addr`, whose last positions in this sequence are
    /// `lasts` (the caller resets them at a new piece), of class Strided
    /// when `strided`, carrying `implied` Constant loads. Returns whether
    /// windows close now ([`Self::close`] must then be called).
    #[inline(always)]
    pub(crate) fn access(
        &mut self,
        addr: u64,
        lasts: &mut Lasts,
        strided: bool,
        implied: u64,
    ) -> bool {
        let t = self.pos;
        let prev = last_of(lasts);
        let other = lasts[strided as usize];
        let m = self.level_of(prev);
        self.hist[m] += 1;
        if strided {
            self.hist_str[m] += 1;
            self.strided += 1;
        }
        let distance = if prev == NONE || t - prev >= 1 << 31 {
            0
        } else {
            (t - prev) as u32
        };
        self.ring_put(t, (distance << 1) | strided as u32);
        if other != NONE {
            let first_mixed = self.first_mixed_level(other, t);
            if first_mixed <= self.top {
                self.register(addr, t, first_mixed);
            }
        }
        lasts[!strided as usize] = t;
        self.a_const += self.pending_const + implied;
        self.pending_const = 0;
        self.pos = t + 1;
        self.pos & ((1 << self.lo) - 1) == 0
    }

    #[inline]
    fn ring_put(&mut self, t: u64, value: u32) {
        if t >= self.ring_grows_at {
            self.grow_ring();
        }
        let mask = self.ring.len() - 1;
        self.ring[t as usize & mask] = value;
    }

    #[cold]
    fn grow_ring(&mut self) {
        let len = (self.ring.len() * 2).max(64).min(1 << self.top);
        self.ring.grow_to(len);
        self.ring_grows_at = if len < 1 << self.top {
            len as u64
        } else {
            u64::MAX
        };
    }

    /// Hints the CPU to load the registration mark of `addr` when an
    /// access with these `lasts` and of class Strided when `strided`, a few
    /// records from now, would register it (see [`Self::access`]): the
    /// marks are a table of their own, met at random by gathers.
    #[inline(always)]
    pub(crate) fn prefetch_mark(&self, addr: u64, lasts: &Lasts, strided: bool) {
        let other = lasts[strided as usize];
        if other != NONE && self.first_mixed_level(other, self.pos) <= self.top {
            self.marks.prefetch(addr);
        }
    }

    /// The lowest tracked level (at least `lo`) whose window around `t`
    /// also holds `other`, the last access of the other class: the
    /// address is mixed there and at every level above.
    #[inline(always)]
    fn first_mixed_level(&self, other: u64, t: u64) -> u32 {
        (64 - (other ^ t).leading_zeros()).max(self.lo)
    }

    #[cold]
    fn register(&mut self, addr: u64, t: u64, first_mixed: u32) {
        let piece = self.piece;
        let top = self.top;
        let mark = self.marks.entry(addr);
        let known = if mark.piece == piece {
            mark.level.max(64 - (mark.t ^ t).leading_zeros())
        } else {
            top + 1
        };
        for k in first_mixed..known.min(top + 1) {
            self.mixed[k as usize].push(addr);
        }
        *mark = Mark {
            piece,
            level: first_mixed.min(known),
            t,
        };
    }

    /// Closes the windows that end at the current position, adding their
    /// metrics to `sums[k]`. `last_of(addr)` must give the position of the
    /// last access to `addr` in this sequence (for mixed addresses).
    pub(crate) fn close(&mut self, last_of: impl Fn(u64) -> u64, sums: &mut [LevelSums]) {
        let highest = self.pos.trailing_zeros().min(self.top);
        // Every access adds 1 to exactly one bucket of `hist` (and of
        // `hist_lines` when lines are tracked), so the suffix sums follow
        // from the totals minus the buckets below: the frequent close of
        // level `lo` alone costs a handful of additions.
        let (mut f, mut s, mut l) = (self.pos, self.strided, self.lines);
        for j in 0..self.lo as usize {
            f -= self.hist[j];
            s -= self.hist_str[j];
            l -= self.hist_lines[j];
        }
        for k in self.lo..=highest {
            let ku = k as usize;
            let start = self.start[ku];
            let footprint = f - start.f;
            let mut f_str = (s - start.str_first) as f64;
            if !self.mixed[ku].is_empty() {
                f_str += self.mixed_correction(k, &last_of);
            }
            sums[ku].add(
                k,
                footprint,
                f_str,
                l - start.lines,
                self.a_const - start.a_const,
            );
            self.start[ku] = Start {
                f,
                str_first: s,
                lines: l,
                a_const: self.a_const,
            };
            f -= self.hist[ku];
            s -= self.hist_str[ku];
            l -= self.hist_lines[ku];
        }
    }

    /// `Σ s/(s+i) − [first access Strided]` over the addresses mixed in the
    /// closing window of level `k`.
    ///
    /// Each address's walk through the ring is a chain of dependent random
    /// reads (the ring holds `2^top` entries, megabytes at the top levels),
    /// so the walks of [`WALK_LANES`] addresses advance side by side: their
    /// reads are independent and their cache misses overlap. The last
    /// positions are looked up first, in one pass over the sorted list, for
    /// the same reason. The correction is then summed in address order, as
    /// one walk after another would, so the result is the same to the bit.
    fn mixed_correction(&mut self, k: u32, last_of: &impl Fn(u64) -> u64) -> f64 {
        let mut list = std::mem::take(&mut self.mixed[k as usize]);
        list.sort_unstable();
        list.dedup();
        let window_start = self.pos - (1 << k);
        let mask = self.ring.len() - 1;
        let mut walks = std::mem::take(&mut self.walks);
        walks.clear();
        walks.extend(list.iter().map(|&addr| {
            let q = last_of(addr);
            debug_assert!(q != NONE && q >= window_start && q < self.pos);
            Walk {
                q,
                strided: 0,
                irregular: 0,
                first_strided: false,
            }
        }));
        let mut lanes = [usize::MAX; WALK_LANES];
        let mut next = 0;
        for lane in &mut lanes {
            if next < walks.len() {
                *lane = next;
                next += 1;
            }
        }
        let mut active = WALK_LANES.min(walks.len());
        while active > 0 {
            for lane in &mut lanes {
                let i = *lane;
                if i == usize::MAX {
                    continue;
                }
                let walk = &mut walks[i];
                let entry = self.ring[walk.q as usize & mask];
                let is_str = entry & 1 == 1;
                if is_str {
                    walk.strided += 1;
                } else {
                    walk.irregular += 1;
                }
                let distance = u64::from(entry >> 1);
                if distance == 0 || walk.q - window_start < distance {
                    // The walk ends at the address's first access in the
                    // window.
                    walk.first_strided = is_str;
                    if next < walks.len() {
                        *lane = next;
                        next += 1;
                    } else {
                        *lane = usize::MAX;
                        active -= 1;
                    }
                } else {
                    walk.q -= distance;
                }
            }
        }
        let mut correction = 0.0;
        for walk in &walks {
            correction += walk.strided as f64 / (walk.strided + walk.irregular) as f64
                - if walk.first_strided { 1.0 } else { 0.0 };
        }
        list.clear();
        self.mixed[k as usize] = list;
        self.walks = walks;
        correction
    }
}

/// Walks of mixed addresses that advance side by side in
/// [`WindowEngine::mixed_correction`].
const WALK_LANES: usize = 8;

/// One mixed address's walk back through the ring: the position it has
/// reached, the accesses of each class counted so far, and, once it ends,
/// whether the address's first access in the window was Strided.
#[derive(Clone, Copy, Debug)]
struct Walk {
    q: u64,
    strided: u64,
    irregular: u64,
    first_strided: bool,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Map;

    /// Runs one sequence of (addr, strided, implied) and returns the sums.
    fn run(seq: &[(u64, bool, u64)], lo: u32, top: u32) -> Vec<LevelSums> {
        let mut engine = WindowEngine::new(lo, top);
        engine.reset(1);
        let mut locals: Map<u64, AddrLocal> = Map::default();
        let mut sums = vec![LevelSums::default(); LEVELS];
        for &(addr, strided, implied) in seq {
            let lasts = locals.entry(addr).or_default().for_piece(1);
            if engine.access(addr, lasts, strided, implied) {
                engine.close(|a| last_of(&locals[&a].lasts), &mut sums);
            }
        }
        sums
    }

    #[test]
    fn footprint_per_level_by_hand() {
        // Addresses: 1 2 1 3 | 4 4 4 4  (windows of 4 at k = 2, one of 8 at k = 3)
        let seq: Vec<_> = [1, 2, 1, 3, 4, 4, 4, 4]
            .iter()
            .map(|&a| (a, false, 0))
            .collect();
        let sums = run(&seq, 1, 3);
        assert_eq!(sums[1].windows, 4); // {1,2} {1,3} {4} {4}
        assert_eq!(sums[1].f, 2 + 2 + 1 + 1);
        assert_eq!(sums[2].windows, 2);
        assert_eq!(sums[2].f, 3 + 1);
        assert_eq!(sums[3].windows, 1);
        assert_eq!(sums[3].f, 4);
        assert_eq!(sums[3].f_irr, 4.0);
        assert_eq!(sums[3].f_str, 0.0);
    }

    #[test]
    fn mixed_address_is_split_by_access_share() {
        // Window of 8: address 7 accessed S S I (2/3 strided), 8 strided
        // only, 9 irregular only ×4.
        let seq = [
            (7, true, 0),
            (8, true, 0),
            (7, true, 0),
            (9, false, 0),
            (7, false, 0),
            (9, false, 0),
            (9, false, 1),
            (9, false, 0),
        ];
        let sums = run(&seq, 3, 3);
        assert_eq!(sums[3].f, 3);
        assert!((sums[3].f_str - (2.0 / 3.0 + 1.0)).abs() < 1e-12);
        assert!((sums[3].f_irr - (1.0 / 3.0 + 1.0)).abs() < 1e-12);
        assert_eq!(sums[3].a_const, 1);
        assert!((sums[3].d_f - 3.0 / 9.0).abs() < 1e-12);
    }

    #[test]
    fn constants_belong_to_the_window_of_the_next_access() {
        let mut engine = WindowEngine::new(1, 1);
        engine.reset(1);
        let mut local = [NO_LASTS, NO_LASTS];
        let mut sums = vec![LevelSums::default(); LEVELS];
        engine.constant(5); // before access 0: window 0
        engine.access(1, &mut local[0], true, 0);
        engine.constant(2); // between access 0 and 1: window 0
        assert!(engine.access(2, &mut local[1], true, 0));
        engine.close(|_| unreachable!(), &mut sums);
        engine.constant(3); // trailing: dropped with the (empty) tail
        assert_eq!(sums[1].a_const, 7);
        assert_eq!(sums[1].windows, 1);
    }
}
