//! Location zoom tree (paper §IV-C2): hot memory regions.
//!
//! A region is cut into pages; a *hot sub-region* is a maximal run of
//! contiguous pages each with ≥ 1 access whose accesses total ≥ `t`% of the
//! region's. Each hot sub-region is zoomed again with pages 8× smaller, from
//! 1 GiB pages down to the minimum page width; a region with no hot
//! sub-region, or found at the minimum width, is a leaf. A hot sub-region
//! that is the whole region again (same accessed lines) is the same node,
//! not a child. Leaves are reported trimmed to their first and last
//! accessed 64-byte lines (the pages at their ends may be only partly used).

use std::ops::Range;

/// Accesses to one 64-byte line over the whole trace.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct LineStat {
    /// `addr >> 6`.
    pub(crate) line: u64,
    pub(crate) a: u64,
    pub(crate) d_sum: u64,
    pub(crate) d_count: u64,
}

/// A leaf of the zoom tree.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Leaf {
    /// Its lines, as a range of the sorted line table.
    pub(crate) lines: Range<usize>,
    /// Byte range of the page run that defined it (page aligned).
    pub(crate) span: Range<u64>,
    /// Page size (log2) at which it was found.
    pub(crate) page_shift: u32,
    /// Zoom depth (root = 0).
    pub(crate) depth: u32,
}

/// Page size of the root's children.
const ROOT_SHIFT: u32 = 30;
/// Pages shrink by 2^STEP per level.
const STEP: u32 = 3;

/// The leaves of the zoom tree over `lines` (sorted by line, unique).
pub(crate) fn hot_regions(
    lines: &[LineStat],
    threshold_percent: f64,
    min_page_shift: u32,
) -> Vec<Leaf> {
    let min_page_shift = min_page_shift.max(6);
    let mut shifts = vec![];
    let mut s = ROOT_SHIFT.max(min_page_shift);
    loop {
        shifts.push(s);
        if s == min_page_shift {
            break;
        }
        s = s.saturating_sub(STEP).max(min_page_shift);
    }
    let mut leaves = Vec::new();
    if lines.is_empty() {
        return leaves;
    }
    let zoom = Zoom {
        lines,
        threshold: threshold_percent / 100.0,
        shifts,
    };
    let total = lines.iter().map(|l| l.a).sum();
    let root_span = 0..u64::MAX;
    zoom.region(0..lines.len(), root_span, total, 0, 0, &mut leaves);
    leaves
}

struct Zoom<'a> {
    lines: &'a [LineStat],
    threshold: f64,
    shifts: Vec<u32>,
}

struct Run {
    lines: Range<usize>,
    first_page: u64,
    last_page: u64,
    a: u64,
}

impl Zoom<'_> {
    /// Zooms into `range` (a node at `depth`, spanning `span`) with pages
    /// of `shifts[level]`.
    fn region(
        &self,
        range: Range<usize>,
        span: Range<u64>,
        total: u64,
        level: usize,
        depth: u32,
        leaves: &mut Vec<Leaf>,
    ) {
        let shift = self.shifts[level];
        let runs = self.runs(range.clone(), shift);
        let hot: Vec<&Run> = runs
            .iter()
            .filter(|r| r.a as f64 >= self.threshold * total as f64)
            .collect();
        if hot.is_empty() {
            leaves.push(Leaf {
                lines: range,
                span,
                page_shift: if level == 0 {
                    64
                } else {
                    self.shifts[level - 1]
                },
                depth,
            });
            return;
        }
        for run in hot {
            let run_span = run.first_page << shift..(run.last_page + 1) << shift;
            let same = run.lines == range;
            let child_depth = if same { depth } else { depth + 1 };
            if level + 1 < self.shifts.len() {
                self.region(
                    run.lines.clone(),
                    run_span,
                    run.a,
                    level + 1,
                    child_depth,
                    leaves,
                );
            } else {
                leaves.push(Leaf {
                    lines: run.lines.clone(),
                    span: run_span,
                    page_shift: shift,
                    depth: child_depth,
                });
            }
        }
    }

    fn runs(&self, range: Range<usize>, shift: u32) -> Vec<Run> {
        let mut runs: Vec<Run> = Vec::new();
        for i in range {
            let l = self.lines[i];
            let page = l.line >> (shift - 6);
            match runs.last_mut() {
                Some(run) if page <= run.last_page + 1 => {
                    run.last_page = page;
                    run.lines.end = i + 1;
                    run.a += l.a;
                }
                _ => runs.push(Run {
                    lines: i..i + 1,
                    first_page: page,
                    last_page: page,
                    a: l.a,
                }),
            }
        }
        runs
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(addr: u64, a: u64) -> LineStat {
        LineStat {
            line: addr >> 6,
            a,
            d_sum: 0,
            d_count: 0,
        }
    }

    #[test]
    fn separate_arrays_become_separate_leaves() {
        // Two 64 KiB arrays 1 MiB apart, plus a cold scattered line.
        let mut lines = Vec::new();
        for i in 0..1024 {
            lines.push(line(0x1000_0000 + 64 * i, 10));
        }
        for i in 0..1024 {
            lines.push(line(0x1010_0000 + 64 * i, 30));
        }
        lines.push(line(0x7fff_0000_0000, 1));
        let leaves = hot_regions(&lines, 10.0, 12);
        assert_eq!(leaves.len(), 2);
        assert_eq!(leaves[0].lines, 0..1024);
        assert_eq!(leaves[1].lines, 1024..2048);
        assert_eq!(leaves[0].page_shift, 12);
        assert_eq!(leaves[0].span, 0x1000_0000..0x1001_0000);
        assert!(leaves[0].depth >= 1);
    }

    #[test]
    fn contiguous_pages_merge_even_when_individually_cold() {
        // One 1 MiB object touched evenly: every 4 KiB page is < 10% but the
        // run is one hot region.
        let lines: Vec<_> = (0..256).map(|i| line(0x2000_0000 + 4096 * i, 1)).collect();
        let leaves = hot_regions(&lines, 10.0, 12);
        assert_eq!(leaves.len(), 1);
        assert_eq!(leaves[0].lines, 0..256);
    }

    #[test]
    fn scattered_cold_accesses_leave_the_region_a_leaf() {
        // 20 lines 64 KiB apart, each 5%: no run reaches 10% below 64 KiB pages.
        let lines: Vec<_> = (0..20).map(|i| line(0x3000_0000 + 65536 * i, 1)).collect();
        let leaves = hot_regions(&lines, 10.0, 12);
        assert_eq!(leaves.len(), 1);
        assert_eq!(leaves[0].lines, 0..20);
        assert_eq!(leaves[0].page_shift, 18);
    }
}
