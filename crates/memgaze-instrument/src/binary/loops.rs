//! Natural loops: for every back edge `latch -> header` (the header
//! dominates the latch), the blocks that reach the latch without passing
//! through the header. Loops sharing a header are merged; nesting follows
//! from containment.

use super::cfg::BasicBlock;
use super::dominators::{self, Dominators};

/// One natural loop.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Loop {
    /// Header block (the single entry).
    pub header: u32,
    /// Blocks whose edge back to the header closes the loop.
    pub(crate) latches: Vec<u32>,
    /// All blocks, sorted (header included).
    pub blocks: Vec<u32>,
    /// Index of the innermost enclosing loop.
    pub parent: Option<u32>,
    /// 1 for an outermost loop.
    pub depth: u32,
}

impl Loop {
    /// Whether block `b` belongs to the loop.
    pub fn contains(&self, b: u32) -> bool {
        self.blocks.binary_search(&b).is_ok()
    }
}

/// All loops of a function.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LoopForest {
    /// Loops, innermost (smallest) first.
    pub loops: Vec<Loop>,
    /// Innermost loop of each block; empty when there are no loops (most
    /// functions: a list of `None`s was an allocation each).
    innermost: Vec<Option<u32>>,
    /// Edges to an earlier block (in reverse post-order) whose target does
    /// not dominate the source: cycles with more than one entry, which no
    /// natural loop describes.
    pub(crate) irreducible_edges: u32,
}

impl LoopForest {
    /// Finds the loops of a function's blocks. Most functions have no
    /// cycle at all (no edge goes back in reverse post-order), and then
    /// neither loops nor irreducible edges: their dominators, which were
    /// most of this pass's work, are not computed.
    pub fn of(blocks: &[BasicBlock]) -> LoopForest {
        // Edges that all lead to a later block (by index) close no cycle:
        // most acyclic functions are seen so without their order.
        let forward_only = blocks
            .iter()
            .enumerate()
            .all(|(b, block)| block.successors.iter().all(|&s| s as usize > b));
        if forward_only {
            return LoopForest::acyclic();
        }
        let rpo = dominators::reverse_post_order(blocks);
        let position = dominators::rpo_positions(&rpo, blocks.len());
        let cyclic = rpo.iter().any(|&b| {
            blocks[b as usize]
                .successors
                .iter()
                .any(|&s| position[s as usize] <= position[b as usize])
        });
        if !cyclic {
            return LoopForest::acyclic();
        }
        LoopForest::compute(blocks, &Dominators::from_order(blocks, rpo, position))
    }

    /// The forest of blocks without a cycle.
    fn acyclic() -> LoopForest {
        LoopForest {
            loops: Vec::new(),
            innermost: Vec::new(),
            irreducible_edges: 0,
        }
    }

    /// Finds the loops.
    pub fn compute(blocks: &[BasicBlock], dom: &Dominators) -> LoopForest {
        let n = blocks.len();
        let mut by_header: Vec<(u32, Vec<u32>)> = Vec::new();
        let mut irreducible = 0;
        for (b, block) in blocks.iter().enumerate() {
            let b = b as u32;
            if !dom.is_reachable(b) {
                continue;
            }
            for &s in &block.successors {
                // A dominator comes first in reverse post-order: an edge
                // forward in it closes no cycle, and most edges are.
                if dom.rpo_position[s as usize] > dom.rpo_position[b as usize] {
                    continue;
                }
                if dom.dominates(s, b) {
                    match by_header.iter_mut().find(|(h, _)| *h == s) {
                        Some((_, latches)) => latches.push(b),
                        None => by_header.push((s, vec![b])),
                    }
                } else {
                    irreducible += 1;
                }
            }
        }
        // One marking buffer for every loop, cleared through the loop's own
        // blocks: a fresh one per loop, scanned whole for the body, made
        // large functions with many loops quadratic.
        let mut inside = vec![false; n];
        let mut stack: Vec<u32> = Vec::new();
        // One list to gather every loop's body in, each then copied at its
        // size (grown from empty, a body was several allocations).
        let mut body: Vec<u32> = Vec::new();
        let mut loops: Vec<Loop> = by_header
            .into_iter()
            .map(|(header, latches)| {
                body.clear();
                body.push(header);
                inside[header as usize] = true;
                for &l in &latches {
                    if !inside[l as usize] {
                        inside[l as usize] = true;
                        body.push(l);
                        stack.push(l);
                    }
                }
                while let Some(x) = stack.pop() {
                    for &p in &blocks[x as usize].predecessors {
                        if !inside[p as usize] && dom.is_reachable(p) {
                            inside[p as usize] = true;
                            body.push(p);
                            stack.push(p);
                        }
                    }
                }
                for &b in &body {
                    inside[b as usize] = false;
                }
                body.sort_unstable();
                Loop {
                    header,
                    latches,
                    blocks: body.to_vec(),
                    parent: None,
                    depth: 0,
                }
            })
            .collect();
        loops.sort_by_key(|l| (l.blocks.len(), l.header));
        let mut innermost = if loops.is_empty() {
            Vec::new()
        } else {
            vec![None; n]
        };
        for (i, l) in loops.iter().enumerate() {
            for &b in &l.blocks {
                if innermost[b as usize].is_none() {
                    innermost[b as usize] = Some(i as u32);
                }
            }
        }
        for i in 0..loops.len() {
            let header = loops[i].header;
            loops[i].parent = (i + 1..loops.len())
                .find(|&j| loops[j].contains(header))
                .map(|j| j as u32);
        }
        for i in (0..loops.len()).rev() {
            loops[i].depth = match loops[i].parent {
                Some(p) => loops[p as usize].depth + 1,
                None => 1,
            };
        }
        LoopForest {
            loops,
            innermost,
            irreducible_edges: irreducible,
        }
    }

    /// Innermost loop containing block `b`.
    pub(crate) fn innermost(&self, b: u32) -> Option<u32> {
        self.innermost.get(b as usize).copied().flatten()
    }

    /// The loops containing block `b`, innermost first.
    pub(crate) fn nest(&self, b: u32) -> impl Iterator<Item = u32> + '_ {
        std::iter::successors(self.innermost(b), move |&l| self.loops[l as usize].parent)
    }
}
