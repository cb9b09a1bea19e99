//! Escape sites: the indirect jumps of the copies that may land in
//! original, uninstrumented code, and the explicit loads no probe can
//! trace, counted with the same counters. Each goes through a check
//! ([`super::probe::escape_stub`]) that counts the executions that do, in
//! the runtime's process block; the annotation lists the sites with what
//! one escape is estimated to leave untraced (docs/METRICS.md, "Dynamic
//! coverage").
//!
//! The check itself is exact (a target in the original code of the
//! relocated functions, at an address without a patch into the copies);
//! the choice of jumps only has to include every jump that can escape:
//! every unresolved jump and tail call (a code pointer can point anywhere),
//! and every jump-table jump unless each of its targets gets a patch.

use super::{OriginalUnwind, PATCH, Planned, entry_points};
use crate::annotation::{Annotation, EscapeSite};
use crate::binary::{Binary, FunctionCode, IndirectJumpKind};
use foldhash::HashMap;
use rayon::prelude::*;
use std::collections::BTreeSet;

/// Instruction indices of the indirect jumps of `plan` that may land in
/// original code. A jump-table target at the start of another function is
/// a call of that function, whose entry is patched.
pub(super) fn candidates(
    binary: &Binary,
    plan: &Planned,
    original: &OriginalUnwind<'_>,
) -> Vec<usize> {
    let code = &plan.code;
    let f = &binary.functions()[plan.function];
    // The functions are sorted by start.
    let is_start = |t: u64| {
        binary
            .functions()
            .binary_search_by_key(&t, |f| f.start)
            .is_ok()
    };
    let unresolved = code
        .indirect_jumps
        .iter()
        .any(|j| j.kind == IndirectJumpKind::Unresolved);
    let mut points: Option<BTreeSet<u64>> = None;
    let mut out = Vec::new();
    for j in &code.indirect_jumps {
        let may_escape = match j.kind {
            IndirectJumpKind::Unresolved | IndirectJumpKind::TailCall => true,
            IndirectJumpKind::JumpTable(t) => {
                let mut targets: Vec<u64> = code.jump_tables[t]
                    .targets
                    .iter()
                    .copied()
                    .filter(|&t| f.contains(t) || !is_start(t))
                    .collect();
                targets.sort_unstable();
                targets.dedup();
                let points = points.get_or_insert_with(|| {
                    entry_points(
                        code,
                        original.eh_frame.as_ref(),
                        &|lsda| original.lsda_limit(lsda),
                        &|addr, len| original.read(addr, len),
                    )
                });
                unresolved
                    || targets.iter().any(|&t| {
                        !f.contains(t)
                            || (t != f.start && t < f.start + PATCH)
                            || t + PATCH > f.end()
                            || points.range(t + 1..t + PATCH).next().is_some()
                    })
                    || targets.windows(2).any(|w| w[1] - w[0] < PATCH)
            }
        };
        if may_escape {
            out.push(j.instruction as usize);
        }
    }
    out
}

/// The annotation's escape sites, in counter order (the ids the copies'
/// checks were given, `plan.escape_ids`), with the estimate of the loads
/// one escape leaves untraced: the explicit loads of the original code it
/// reaches, each block once, up to a patched address (for a jump-table
/// jump, the mean over its unpatched targets; for a jump whose targets are
/// unknown, every block of its function).
pub(super) fn sites(
    binary: &Binary,
    plans: &[Planned],
    patched: &BTreeSet<u64>,
    annotation: &Annotation,
) -> Vec<EscapeSite> {
    // Every load's address with whether it is instrumented or implied and
    // whether instrumented, sorted by address (stably: of loads at one
    // address the last counts). A region's addresses are looked up among
    // the loads between its lowest and highest, instead of in a hash map of
    // hundreds of thousands of loads built on one thread.
    let mut loads: Vec<(u64, bool, bool)> = annotation
        .loads
        .iter()
        .map(|l| (l.ip, l.instrumented || l.proxy.is_some(), l.instrumented))
        .collect();
    loads.sort_by_key(|&(ip, _, _)| ip);
    let plan_of: HashMap<usize, usize> = plans
        .iter()
        .enumerate()
        .map(|(i, p)| (p.function, i))
        .collect();
    let count = |code: &FunctionCode, starts: &[u64]| -> (u32, u32) {
        let ips = region(code, starts, patched);
        let (Some(&low), Some(&high)) = (ips.iter().min(), ips.iter().max()) else {
            return (0, 0);
        };
        let near =
            &loads[loads.partition_point(|l| l.0 < low)..loads.partition_point(|l| l.0 <= high)];
        ips.iter()
            .filter_map(|&ip| {
                let end = near.partition_point(|l| l.0 <= ip);
                end.checked_sub(1).map(|i| near[i]).filter(|l| l.0 == ip)
            })
            .fold((0, 0), |(l, p), (_, covered, probed)| {
                (l + u32::from(covered), p + u32::from(probed))
            })
    };
    // The plans' sites on all cores (an estimate may decode its target's
    // function again), put in counter order below.
    let mut sites: Vec<(u32, EscapeSite)> = plans
        .par_iter()
        .flat_map_iter(|plan| {
            let mut sites = Vec::new();
            let own = plan.annotation_function.map_or(u32::MAX, |a| a as u32);
            // Every jump with unknown targets reaches the same blocks.
            let mut from_every_block = None;
            for &(index, id) in &plan.escape_ids {
                if plan.untraced_loads.binary_search(&index).is_ok() {
                    sites.push((
                        id,
                        EscapeSite {
                            at: plan.code.instructions[index].ip(),
                            function: own,
                            loads: 1,
                            probed: 0,
                            untraced_load: true,
                        },
                    ));
                    continue;
                }
                let jump = plan
                    .code
                    .indirect_jumps
                    .iter()
                    .find(|j| j.instruction as usize == index);
                let targets: Vec<u64> = match jump.map(|j| j.kind) {
                    Some(IndirectJumpKind::JumpTable(t)) => {
                        let mut targets = plan.code.jump_tables[t].targets.clone();
                        targets.sort_unstable();
                        targets.dedup();
                        targets.retain(|t| !patched.contains(t));
                        targets
                    }
                    _ => Vec::new(),
                };
                let mut function = own;
                let (loads, probed) = if targets.is_empty() {
                    *from_every_block.get_or_insert_with(|| {
                        let all: Vec<u64> = plan.code.blocks.iter().map(|b| b.start).collect();
                        count(&plan.code, &all)
                    })
                } else {
                    let mut sum = (0u64, 0u64);
                    for (k, &t) in targets.iter().enumerate() {
                        let Some(target_plan) = binary
                            .function_index_at(t)
                            .and_then(|fi| plan_of.get(&fi))
                            .map(|&pi| &plans[pi])
                        else {
                            continue;
                        };
                        if k == 0 {
                            function = target_plan
                                .annotation_function
                                .map_or(u32::MAX, |a| a as u32);
                        }
                        let (l, p) = count(&target_plan.whole_code(binary), &[t]);
                        sum.0 += u64::from(l);
                        sum.1 += u64::from(p);
                    }
                    let n = targets.len() as u64;
                    (sum.0.div_ceil(n) as u32, sum.1.div_ceil(n) as u32)
                };
                sites.push((
                    id,
                    EscapeSite {
                        at: plan.code.instructions[index].ip(),
                        function,
                        loads,
                        probed,
                        untraced_load: false,
                    },
                ));
            }
            sites
        })
        .collect();
    sites.sort_by_key(|&(id, _)| id);
    debug_assert!(sites.iter().enumerate().all(|(i, s)| s.0 as usize == i));
    sites.into_iter().map(|(_, s)| s).collect()
}

/// Addresses of the instructions of `code` reachable from `starts` without
/// passing a patched block start (other than a start itself).
fn region(code: &FunctionCode, starts: &[u64], patched: &BTreeSet<u64>) -> Vec<u64> {
    let mut stack: Vec<usize> = starts
        .iter()
        .filter_map(|&t| code.instruction_at(t).map(|i| code.block_of[i] as usize))
        .collect();
    let mut visited = vec![false; code.blocks.len()];
    let mut ips = Vec::new();
    while let Some(b) = stack.pop() {
        if std::mem::replace(&mut visited[b], true) {
            continue;
        }
        let block = &code.blocks[b];
        if patched.contains(&block.start) && !starts.contains(&block.start) {
            continue;
        }
        ips.extend(block.instructions().map(|i| code.instructions[i].ip()));
        stack.extend(block.successors.iter().map(|&s| s as usize));
    }
    ips
}
