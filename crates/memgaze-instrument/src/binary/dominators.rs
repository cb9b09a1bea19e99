//! Dominator tree of a function's basic blocks (Cooper, Harvey & Kennedy,
//! "A Simple, Fast Dominance Algorithm": iterate over reverse post-order
//! until the immediate dominators settle).

use super::cfg::BasicBlock;

/// The immediate dominator of a block that has none: a plain number
/// rather than an `Option` (half the size, and the walks up the tree test
/// no tag at each step).
pub(crate) const NO_IDOM: u32 = u32::MAX;

/// Immediate dominators; block 0 is the entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Dominators {
    /// Immediate dominator of each block ([`NO_IDOM`] for the entry and
    /// for blocks unreachable from it).
    pub(crate) idom: Vec<u32>,
    /// Reverse post-order position of each reachable block (`u32::MAX` for
    /// unreachable ones).
    pub(crate) rpo_position: Vec<u32>,
    /// Reachable blocks in reverse post-order.
    pub(crate) rpo: Vec<u32>,
    /// Pre- and post-order numbers of each block in the dominator tree, for
    /// constant-time [`Dominators::dominates`].
    tree_order: Vec<(u32, u32)>,
}

impl Dominators {
    /// Computes the tree.
    pub fn compute(blocks: &[BasicBlock]) -> Dominators {
        let rpo = reverse_post_order(blocks);
        let position = rpo_positions(&rpo, blocks.len());
        Dominators::from_order(blocks, rpo, position)
    }

    /// Computes the tree from the blocks' reverse post-order and each
    /// block's position in it ([`reverse_post_order`], [`rpo_positions`]).
    pub(crate) fn from_order(
        blocks: &[BasicBlock],
        rpo: Vec<u32>,
        position: Vec<u32>,
    ) -> Dominators {
        let n = blocks.len();
        let mut idom: Vec<u32> = vec![NO_IDOM; n];
        if n == 0 {
            return Dominators {
                idom,
                rpo_position: position,
                rpo,
                tree_order: Vec::new(),
            };
        }
        idom[0] = 0;
        for &b in rpo.iter().skip(1) {
            idom[b as usize] = idom_from_predecessors(blocks, &idom, &position, b);
        }
        // A second round changes nothing unless it changes a block with a
        // predecessor at or after it in the order (a back edge): every
        // other block's predecessors, and their dominators, are as the first
        // round saw them until then. So only those blocks are asked (in a
        // reducible function the header of a back edge dominates its
        // source, which adds nothing), and the rounds run on if one changes.
        let mut changed = rpo.iter().skip(1).any(|&b| {
            let at = position[b as usize];
            let predecessors = &blocks[b as usize].predecessors;
            predecessors.iter().any(|&p| position[p as usize] >= at) && {
                let new = idom_from_predecessors(blocks, &idom, &position, b);
                new != NO_IDOM && idom[b as usize] != new
            }
        });
        while changed {
            changed = false;
            for &b in rpo.iter().skip(1) {
                let new = idom_from_predecessors(blocks, &idom, &position, b);
                if new != NO_IDOM && idom[b as usize] != new {
                    idom[b as usize] = new;
                    changed = true;
                }
            }
        }
        idom[0] = NO_IDOM;
        let tree_order = tree_order(&idom, &rpo);
        Dominators {
            idom,
            rpo_position: position,
            rpo,
            tree_order,
        }
    }

    /// Whether block `a` dominates block `b` (every block dominates itself).
    pub fn dominates(&self, a: u32, b: u32) -> bool {
        if !self.is_reachable(a) || !self.is_reachable(b) {
            return false;
        }
        let (pa, qa) = self.tree_order[a as usize];
        let (pb, qb) = self.tree_order[b as usize];
        pa <= pb && qb <= qa
    }

    /// Whether the block is reachable from the entry.
    pub(crate) fn is_reachable(&self, b: u32) -> bool {
        self.rpo_position[b as usize] != u32::MAX
    }
}

/// Pre/post-order numbers of a DFS over the dominator tree (iterative:
/// the tree can be as deep as the function is long).
fn tree_order(idom: &[u32], rpo: &[u32]) -> Vec<(u32, u32)> {
    let n = idom.len();
    // Every block's children in `rpo` order, in one list: block `p`'s are
    // `children[first[p]..first[p + 1]]` (a list per block was most of
    // this pass's allocations).
    let mut first = vec![0u32; n + 1];
    for &b in rpo.iter().skip(1) {
        let p = idom[b as usize];
        if p != NO_IDOM {
            first[p as usize + 1] += 1;
        }
    }
    for p in 0..n {
        first[p + 1] += first[p];
    }
    let mut filled = first[..n].to_vec();
    let mut children = vec![0u32; first[n] as usize];
    for &b in rpo.iter().skip(1) {
        let p = idom[b as usize];
        if p != NO_IDOM {
            children[filled[p as usize] as usize] = b;
            filled[p as usize] += 1;
        }
    }
    let children_of =
        |b: u32| &children[first[b as usize] as usize..first[b as usize + 1] as usize];
    let mut order = vec![(u32::MAX, u32::MAX); n];
    let mut clock = 0u32;
    // Never deeper than the blocks: one allocation, not a growing stack.
    let mut stack: Vec<(u32, usize)> = Vec::with_capacity(n);
    stack.push((0, 0));
    order[0].0 = clock;
    clock += 1;
    while let Some(&mut (b, ref mut next)) = stack.last_mut() {
        if let Some(&c) = children_of(b).get(*next) {
            *next += 1;
            order[c as usize].0 = clock;
            clock += 1;
            stack.push((c, 0));
        } else {
            order[b as usize].1 = clock;
            clock += 1;
            stack.pop();
        }
    }
    order
}

/// Block `b`'s immediate dominator as its predecessors with one so far
/// give it ([`NO_IDOM`] if none has).
#[inline(always)]
fn idom_from_predecessors(blocks: &[BasicBlock], idom: &[u32], position: &[u32], b: u32) -> u32 {
    let mut new = NO_IDOM;
    for &p in &blocks[b as usize].predecessors {
        if idom[p as usize] == NO_IDOM {
            continue;
        }
        new = if new == NO_IDOM {
            p
        } else {
            intersect(idom, position, p, new)
        };
    }
    new
}

/// The nearest common dominator of `a` and `b`, both with an immediate
/// dominator so far (the entry is its own), walking up from the one later
/// in reverse post-order.
fn intersect(idom: &[u32], position: &[u32], mut a: u32, mut b: u32) -> u32 {
    while a != b {
        while position[a as usize] > position[b as usize] {
            a = idom[a as usize];
        }
        while position[b as usize] > position[a as usize] {
            b = idom[b as usize];
        }
    }
    a
}

/// The position of each of `n` blocks in `rpo` (`u32::MAX` for blocks
/// not in it: unreachable ones).
pub(crate) fn rpo_positions(rpo: &[u32], n: usize) -> Vec<u32> {
    let mut position = vec![u32::MAX; n];
    for (i, &b) in rpo.iter().enumerate() {
        position[b as usize] = i as u32;
    }
    position
}

/// Reverse post-order of the blocks reachable from block 0 (iterative DFS).
pub(crate) fn reverse_post_order(blocks: &[BasicBlock]) -> Vec<u32> {
    let n = blocks.len();
    let mut order = Vec::with_capacity(n);
    if n == 0 {
        return order;
    }
    let mut visited = vec![false; n];
    // Never deeper than the blocks: one allocation, not a growing stack.
    let mut stack: Vec<(u32, usize)> = Vec::with_capacity(n);
    stack.push((0, 0));
    visited[0] = true;
    while let Some(&mut (b, ref mut next)) = stack.last_mut() {
        let succ = &blocks[b as usize].successors;
        if *next < succ.len() {
            let s = succ[*next];
            *next += 1;
            if !visited[s as usize] {
                visited[s as usize] = true;
                stack.push((s, 0));
            }
        } else {
            order.push(b);
            stack.pop();
        }
    }
    order.reverse();
    order
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::binary::cfg::Terminator;
    use proptest::prelude::*;

    fn graph(edges: &[(u32, u32)], n: usize) -> Vec<BasicBlock> {
        let mut blocks: Vec<BasicBlock> = (0..n)
            .map(|i| BasicBlock {
                start: i as u64,
                end: i as u64 + 1,
                first: i as u32,
                len: 1,
                successors: Default::default(),
                predecessors: Default::default(),
                terminator: Terminator::FallThrough,
            })
            .collect();
        for &(a, b) in edges {
            if !blocks[a as usize].successors.contains(&b) {
                blocks[a as usize].successors.push(b);
                blocks[b as usize].predecessors.push(a);
            }
        }
        blocks
    }

    /// Brute force: `a` dominates `b` iff `b` is unreachable from the entry
    /// once `a` is removed (and `b` is reachable at all).
    fn dominates_brute(blocks: &[BasicBlock], a: u32, b: u32) -> bool {
        let reach = |removed: Option<u32>| {
            let mut seen = vec![false; blocks.len()];
            let mut stack = vec![0u32];
            if removed == Some(0) {
                return seen;
            }
            seen[0] = true;
            while let Some(x) = stack.pop() {
                for &s in &blocks[x as usize].successors {
                    if Some(s) != removed && !seen[s as usize] {
                        seen[s as usize] = true;
                        stack.push(s);
                    }
                }
            }
            seen
        };
        if !reach(None)[b as usize] {
            return false;
        }
        a == b || !reach(Some(a))[b as usize]
    }

    #[test]
    fn diamond_with_loop() {
        // 0 -> 1 -> {2, 3} -> 4 -> 1, 4 -> 5
        let g = graph(&[(0, 1), (1, 2), (1, 3), (2, 4), (3, 4), (4, 1), (4, 5)], 6);
        let d = Dominators::compute(&g);
        assert_eq!(d.idom, vec![NO_IDOM, 0, 1, 1, 1, 4]);
        assert!(d.dominates(1, 5));
        assert!(!d.dominates(2, 4));
    }

    proptest! {
        #[test]
        fn matches_brute_force(n in 1usize..12, edges in proptest::collection::vec((0u32..12, 0u32..12), 0..30)) {
            let edges: Vec<(u32, u32)> = edges
                .into_iter()
                .filter(|&(a, b)| (a as usize) < n && (b as usize) < n)
                .collect();
            let g = graph(&edges, n);
            let d = Dominators::compute(&g);
            // The loops found without dominators for acyclic graphs are
            // the ones found with them.
            prop_assert_eq!(
                crate::binary::LoopForest::of(&g),
                crate::binary::LoopForest::compute(&g, &d)
            );
            for a in 0..n as u32 {
                for b in 0..n as u32 {
                    prop_assert_eq!(d.dominates(a, b), dominates_brute(&g, a, b), "{} dom {}", a, b);
                }
            }
        }

        #[test]
        fn forward_only_graphs_have_the_loops_of_their_dominators(n in 1usize..12, edges in proptest::collection::vec((0u32..12, 0u32..12), 0..30)) {
            // Every edge to a later block: the shortcut of `LoopForest::of`.
            let edges: Vec<(u32, u32)> = edges
                .into_iter()
                .filter(|&(a, b)| a != b && (a as usize) < n && (b as usize) < n)
                .map(|(a, b)| (a.min(b), a.max(b)))
                .collect();
            let g = graph(&edges, n);
            let d = Dominators::compute(&g);
            prop_assert_eq!(
                crate::binary::LoopForest::of(&g),
                crate::binary::LoopForest::compute(&g, &d)
            );
        }
    }
}
