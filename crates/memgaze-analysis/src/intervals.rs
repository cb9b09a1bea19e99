//! The execution interval tree (paper §IV-C1): samples merged pairwise,
//! bottom-up. A node of level `h` covers `2^h` consecutive samples; its
//! footprint is the number of distinct addresses over all of them.
//!
//! The same trick as the trace windows gives every node's `F` from one
//! counter per address: an address first touched in sample `s` whose
//! previous sample with it was `p` is new in its node at every level
//! `h ≤ msb(p ^ s)`. Inter-sample metrics are estimates scaled by ρ
//! (`F̂ = ρ·F`); `ΔF = F / (A + A_const)` needs no scaling (Eq. 4).

use super::result::{IntervalLevel, IntervalNode, IntervalTree};

const LEVELS: usize = 64;
/// Levels with at most this many nodes are kept node by node.
const MAX_KEPT_NODES: usize = 256;

#[derive(Clone, Copy, Debug, Default)]
struct Totals {
    f: u64,
    lines: u64,
    a: u64,
    a_const: u64,
    d_sum: u64,
    d_count: u64,
}

#[derive(Clone, Copy, Debug, Default)]
struct LevelAcc {
    nodes: u64,
    a: u64,
    f: u64,
    d_f: f64,
    d_f_nodes: u64,
}

/// Builds the tree while samples (pieces) close in order.
pub(crate) struct IntervalBuilder {
    /// Pieces closed so far; the open piece has this index.
    closed: u64,
    hist_f: [u64; LEVELS],
    hist_lines: [u64; LEVELS],
    running: Totals,
    start: [Totals; LEVELS],
    levels: [LevelAcc; LEVELS],
    kept: Vec<Vec<IntervalNode>>,
    overflowed: [bool; LEVELS],
}

impl IntervalBuilder {
    pub(crate) fn new() -> Self {
        IntervalBuilder {
            closed: 0,
            hist_f: [0; LEVELS],
            hist_lines: [0; LEVELS],
            running: Totals::default(),
            start: [Totals::default(); LEVELS],
            levels: [LevelAcc::default(); LEVELS],
            kept: vec![Vec::new(); LEVELS],
            overflowed: [false; LEVELS],
        }
    }

    /// The value `first_address`/`first_line` store for the open piece:
    /// equal to an entry's mark iff it was already seen in this piece.
    #[inline]
    pub(crate) fn current_mark(&self) -> u32 {
        self.closed as u32 + 1
    }

    fn level(last: &mut u32, current: u64) -> usize {
        let h = if *last == 0 {
            LEVELS - 1
        } else {
            let prev = u64::from(*last - 1);
            (63 - (prev ^ current).leading_zeros()) as usize
        };
        *last = current as u32 + 1;
        h
    }

    /// First access in the open piece to an address whose last piece is
    /// recorded in `last` (piece index + 1, 0 = never); updates it.
    #[inline]
    pub(crate) fn first_address(&mut self, last: &mut u32) {
        let h = Self::level(last, self.closed);
        self.hist_f[h] += 1;
    }

    /// Same for a 64-byte line.
    #[inline]
    pub(crate) fn first_line(&mut self, last: &mut u32) {
        let h = Self::level(last, self.closed);
        self.hist_lines[h] += 1;
    }

    /// Closes the open piece with its totals.
    pub(crate) fn close_piece(&mut self, a: u64, a_const: u64, d_sum: u64, d_count: u64) {
        self.running.a += a;
        self.running.a_const += a_const;
        self.running.d_sum += d_sum;
        self.running.d_count += d_count;
        self.closed += 1;
        let highest = (self.closed.trailing_zeros() as usize).min(LEVELS - 1);
        self.close_levels(highest, true);
    }

    fn suffixes(&self) -> [(u64, u64); LEVELS] {
        let mut out = [(0, 0); LEVELS];
        let (mut f, mut l) = (0, 0);
        for h in (0..LEVELS).rev() {
            f += self.hist_f[h];
            l += self.hist_lines[h];
            out[h] = (f, l);
        }
        out
    }

    fn close_levels(&mut self, highest: usize, complete: bool) {
        let suffix = self.suffixes();
        for (h, &(f, lines)) in suffix.iter().enumerate().take(highest + 1) {
            let now = Totals {
                f,
                lines,
                ..self.running
            };
            let start = self.start[h];
            let span = if complete {
                1u64 << h
            } else {
                self.closed & ((1u64 << h) - 1)
            };
            if span == 0 {
                continue;
            }
            let node = IntervalNode {
                h: h as u32,
                first_sample: self.closed - span,
                samples: span,
                complete,
                a: now.a - start.a,
                a_const: now.a_const - start.a_const,
                f: now.f - start.f,
                f_lines: now.lines - start.lines,
                f_hat: None,
                // ΔF = F / (κ·A): undefined, like κ, when the node has no
                // Strided or Irregular access (docs/METRICS.md), even if it holds
                // Constant loads; such nodes stay out of the level's mean.
                d_f: if now.a == start.a {
                    None
                } else {
                    ratio(
                        now.f - start.f,
                        (now.a - start.a) + (now.a_const - start.a_const),
                    )
                },
                d_mean: mean(now.d_sum - start.d_sum, now.d_count - start.d_count),
            };
            if complete {
                let acc = &mut self.levels[h];
                acc.nodes += 1;
                acc.a += node.a;
                acc.f += node.f;
                if let Some(d_f) = node.d_f {
                    acc.d_f += d_f;
                    acc.d_f_nodes += 1;
                }
                self.start[h] = now;
            }
            if !self.overflowed[h] {
                if self.kept[h].len() == MAX_KEPT_NODES {
                    self.overflowed[h] = true;
                    self.kept[h] = Vec::new();
                } else {
                    self.kept[h].push(node);
                }
            }
        }
    }

    /// The tree: per-level averages and the nodes of the upper levels,
    /// with the trailing incomplete nodes (and so the root) closed.
    pub(crate) fn finish(mut self, rho: Option<f64>) -> IntervalTree {
        let pieces = self.closed;
        let mut levels = Vec::new();
        for (h, acc) in self.levels.iter().enumerate() {
            if acc.nodes == 0 {
                continue;
            }
            levels.push(IntervalLevel {
                h: h as u32,
                nodes: acc.nodes,
                a: acc.a as f64 / acc.nodes as f64,
                f: acc.f as f64 / acc.nodes as f64,
                f_hat: rho.map(|r| r * acc.f as f64 / acc.nodes as f64),
                d_f: (acc.d_f_nodes > 0).then(|| acc.d_f / acc.d_f_nodes as f64),
            });
        }
        if pieces == 0 {
            return IntervalTree {
                levels,
                nodes: Vec::new(),
            };
        }
        // Height of the root: the smallest h with 2^h ≥ pieces.
        let root = (64 - (pieces - 1).leading_zeros()) as usize;
        if root > 0 {
            self.close_levels(root.min(LEVELS - 1), false);
        }
        let mut nodes = Vec::new();
        for h in (0..=root.min(LEVELS - 1)).rev() {
            if self.overflowed[h] {
                break;
            }
            nodes.extend(self.kept[h].drain(..).map(|mut n| {
                n.f_hat = rho.map(|r| r * n.f as f64);
                n
            }));
        }
        IntervalTree { levels, nodes }
    }
}

fn ratio(num: u64, den: u64) -> Option<f64> {
    (den > 0).then(|| num as f64 / den as f64)
}

fn mean(sum: u64, count: u64) -> Option<f64> {
    ratio(sum, count)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Pieces given as address lists (all accesses).
    fn build(pieces: &[&[u32]]) -> IntervalTree {
        let mut b = IntervalBuilder::new();
        let mut last = std::collections::HashMap::<u32, u32>::new();
        for piece in pieces {
            let mut seen = std::collections::HashSet::new();
            for &a in *piece {
                if seen.insert(a) {
                    b.first_address(last.entry(a).or_default());
                }
            }
            b.close_piece(piece.len() as u64, 0, 0, 0);
        }
        b.finish(Some(2.0))
    }

    #[test]
    fn nodes_count_distinct_addresses_over_their_samples() {
        let t = build(&[&[1, 2], &[2, 3], &[1], &[4, 4]]);
        let level = |h: u32| t.levels.iter().find(|l| l.h == h).unwrap();
        assert_eq!(level(0).f, (2 + 2 + 1 + 1) as f64 / 4.0);
        assert_eq!(level(1).f, (3 + 2) as f64 / 2.0); // {1,2,3}, {1,4}
        assert_eq!(level(2).f, 4.0);
        assert_eq!(level(2).f_hat, Some(8.0));
        let root = &t.nodes[0];
        assert_eq!((root.h, root.samples, root.f, root.a), (2, 4, 4, 7));
        assert!(root.complete);
    }

    /// A sample holding only Constant loads (A = 0, A_const > 0) has no
    /// ΔF (null, as the summary's), and its node does not pull the level's
    /// mean ΔF down with a 0 (found by an outside oracle on a gcc -O0
    /// program whose first samples were all stack-slot loads).
    #[test]
    fn nodes_without_accesses_have_no_delta_f() {
        let mut b = IntervalBuilder::new();
        let mut last = std::collections::HashMap::<u32, u32>::new();
        // Piece 0: 5 Constant loads only. Piece 1: addresses 1, 2, 1 and
        // one Constant load.
        b.close_piece(0, 5, 0, 0);
        for a in [1, 2] {
            b.first_address(last.entry(a).or_default());
        }
        b.close_piece(3, 1, 0, 0);
        let t = b.finish(Some(1.0));
        let node = |h: u32, first: u64| {
            t.nodes
                .iter()
                .find(|n| n.h == h && n.first_sample == first)
                .unwrap()
        };
        assert_eq!((node(0, 0).a, node(0, 0).a_const), (0, 5));
        assert_eq!(node(0, 0).d_f, None);
        assert_eq!(node(0, 1).d_f, Some(2.0 / 4.0));
        assert_eq!(node(1, 0).d_f, Some(2.0 / 9.0));
        let level0 = t.levels.iter().find(|l| l.h == 0).unwrap();
        assert_eq!((level0.nodes, level0.d_f), (2, Some(2.0 / 4.0)));
    }

    #[test]
    fn trailing_nodes_are_incomplete() {
        let t = build(&[&[1], &[2], &[3]]);
        let root = &t.nodes[0];
        assert_eq!(
            (root.h, root.samples, root.complete, root.f),
            (2, 3, false, 3)
        );
        assert!(
            t.nodes
                .iter()
                .any(|n| n.h == 1 && n.first_sample == 2 && !n.complete)
        );
        assert!(t.levels.iter().all(|l| l.h <= 1));
    }
}
