//! The countdown kept in a register across an innermost loop (soft mode).
//!
//! A superblock's block check, `sub qword fs:[0x38], k; jbe stub`, is a
//! read-modify-write through memory once per iteration: on a streamed loop
//! of one load per cycle it costs more than the loads. In an innermost loop
//! without calls, the rewriter keeps the countdown in a register `R` that
//! no instruction of the loop reads or writes, and the checks become
//! `sub R, k; jbe stub`:
//!
//! - **Entry** (the header's label, which every edge from outside reaches):
//!   `lea rsp, [rsp-144]; mov [rsp], R; mov R, fs:[0x38]`. `R`'s value is
//!   kept on the stack below the red zone with `rsp` moved past it, so a
//!   signal frame (and a nested handler's) lands below it, and a signal
//!   handler that runs a loop of its own saves its own copy. Back edges
//!   jump past the entry.
//! - **Exits** (every edge to a block outside the loop: taken branches go
//!   through a stub, fall-throughs get the code inline after the branch):
//!   `mov fs:[0x38], R; mov R, [rsp]; lea rsp, [rsp+144]` — no flags
//!   change. A side exit of a superblock adds its skipped loads to `R`
//!   first.
//! - **Counting fragments** and the runtime read the countdown in memory:
//!   a block check's stub gives `k` back to `R` and stores it before the
//!   fragment; every branch out of the fragment reloads `R` (or restores it,
//!   leaving the loop).
//! - A lone load's probe (flags dead) is `sub R, 1; jb slow`; its slow stub
//!   stores 0 to the countdown in memory as ever, and returns through a
//!   reload of `R`.
//! - **Spare register**: when a spatial check in the loop finds no dead
//!   register (it would save one below the red zone: a store, a load and
//!   two `rsp` updates per execution), a second register `S` that nothing
//!   in the loop uses is saved at entry in the frame's alignment word
//!   (`mov [rsp+8], S`, before the countdown's load) and restored at every
//!   exit after `R` (`mov S, [rsp+8]`); those checks use `S` unsaved. Why:
//!   the irregular kernel's second check saved `rcx` on every iteration,
//!   as liveness cannot call a register dead across a return.
//!
//! Loops qualify when every block ends in a fall-through, a conditional
//! branch or a jump inside the function, no block falls through into the
//! header, no instruction names `rsp` (a stack-relative operand would see
//! the moved `rsp`), calls, returns or traps, every counted load of the loop
//! is in a superblock lying wholly inside it or has a flags-dead probe, and a register is left that
//! neither the loop nor a probe of its loads uses (`rcx`, `rbp` and each
//! probe's borrowed dead register are never taken; the spare register is
//! the next such one, when there is one). Functions with
//! unresolved indirect jumps keep the memory countdown everywhere.
//!
//! Approximate, and only in sampled runs (a full trace keeps the countdown
//! at 0 in memory and in `R`): while a thread runs such a loop, the
//! countdown in memory is the one of its last stub, so a signal handler's
//! loads there are counted against that copy, which the loop's exit then
//! overwrites, and a region's begin or the process's end, which read other
//! threads' countdowns, see that copy. Unwinding from an asynchronous
//! signal inside the loop sees `rsp` 144 bytes lower than its CFI says (as
//! inside a probe that saves below the red zone), and `R` and `S` holding
//! the probes' values rather than the caller's.

use super::probe::{FastPath, SpatialProbe, branch, count_register_by, fs_countdown, i2, with_ip};
use super::relocate::{Insert, Superblock};
use crate::binary::usage::Usages;
use crate::binary::{FunctionCode, Terminator};
use foldhash::HashMap;
use iced_x86::{Code, FlowControl, Instruction, MemoryOperand, Register};

/// Bytes `rsp` moves down on loop entry: the red zone, the saved register
/// and 8 bytes that keep `rsp`'s alignment (where the spare register, if
/// any, is saved).
const FRAME: i64 = 128 + 16;

/// The registers a loop may keep the countdown in, in the order preferred.
/// `rcx` (the probes' `jrcxz` form), `rbp` (frame-pointer unwinding) and
/// `rsp` are never taken.
const CANDIDATES: [Register; 13] = [
    Register::R11,
    Register::R10,
    Register::R9,
    Register::R8,
    Register::RAX,
    Register::RDX,
    Register::RSI,
    Register::RDI,
    Register::RBX,
    Register::R12,
    Register::R13,
    Register::R14,
    Register::R15,
];

/// An innermost loop whose countdown lives in a register.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct RegisterLoop {
    /// Instruction index of the header's first instruction.
    pub header: usize,
    /// Its blocks, sorted.
    pub blocks: Vec<u32>,
    /// The register holding the countdown inside it.
    pub reg: Register,
    /// A register freed across the loop the same way for its spatial
    /// checks that find no dead register (see the module documentation).
    pub spare: Option<Register>,
}

impl RegisterLoop {
    fn contains(&self, block: u32) -> bool {
        self.blocks.binary_search(&block).is_ok()
    }
}

/// The innermost loops of `code` that keep their countdown in a register
/// (see the module documentation), given the function's soft-mode
/// `inserts` (loads not in a superblock), `superblocks` and spatial checks.
/// A check inside such a loop that would save its scratch register takes
/// the loop's spare register instead (`spatial` is updated).
pub(crate) fn plan(
    code: &FunctionCode,
    inserts: &[(usize, Insert)],
    superblocks: &[Superblock],
    spatial: &mut HashMap<usize, (u32, SpatialProbe)>,
) -> Vec<RegisterLoop> {
    if code.unresolved_indirect_jumps() > 0 {
        return Vec::new();
    }
    let forest = code.loops();
    if forest.loops.is_empty() {
        return Vec::new();
    }
    let mut usages = Usages::new();
    let mut out = Vec::new();
    // Loops that enclose another, found in one pass over the parents.
    let mut encloses = vec![false; forest.loops.len()];
    for lp in &forest.loops {
        if let Some(parent) = lp.parent {
            encloses[parent as usize] = true;
        }
    }
    // Per block, 1 + the index of the last loop whose blocks were marked:
    // membership in the loop at hand is then one look-up, not a search of
    // its blocks per load and per superblock instruction.
    let mut marked_by = vec![0u32; code.blocks.len()];
    for (index, lp) in forest.loops.iter().enumerate() {
        if encloses[index] {
            continue;
        }
        let header = code.blocks[lp.header as usize].first as usize;
        if header == 0 || !shape_qualifies(code, header, &lp.blocks) {
            continue;
        }
        let mark = index as u32 + 1;
        for &b in &lp.blocks {
            marked_by[b as usize] = mark;
        }
        let in_loop = |i: usize| marked_by[code.block_of[i] as usize] == mark;
        // The loop's instructions lie between its first block's first and
        // its last block's last (blocks and `inserts` are in address
        // order, superblocks too, each within its blocks): what starts past
        // that or ends before it has nothing inside.
        let first = code.blocks[lp.blocks[0] as usize].first as usize;
        let last = code.blocks[*lp.blocks.last().unwrap() as usize].last();
        let inserts = &inserts[inserts.partition_point(|&(i, _)| i < first)..];
        let inserts = inserts.iter().take_while(|&&(i, _)| i <= last);
        let superblocks = superblocks.iter().take_while(|block| block.at <= last);
        let mut taken: Vec<Register> = Vec::new();
        // Checks that would save their scratch below the red zone.
        let mut saving: Vec<usize> = Vec::new();
        let mut counted = 0;
        let mut wholly_inside = true;
        for &(i, insert) in inserts.filter(|&&(i, _)| in_loop(i)) {
            // A lone load's probe needs the flags dead for `sub reg, 1`.
            if !matches!(
                insert,
                Insert::Soft {
                    fast: FastPath::FlagsDead,
                    ..
                }
            ) {
                wholly_inside = false;
                break;
            }
            counted += 1;
            note_check(spatial.get(&i), i, &mut taken, &mut saving);
        }
        for block in superblocks.take_while(|_| wholly_inside) {
            if block.last < first {
                continue;
            }
            let inside = (block.at..=block.last).filter(|&i| in_loop(i)).count();
            if inside == 0 {
                continue;
            }
            if inside != block.last - block.at + 1 {
                wholly_inside = false;
                break;
            }
            counted += 1;
            for &(i, _, fast) in &block.loads {
                match fast {
                    FastPath::SaveIn(reg) => taken.push(reg),
                    FastPath::FlagsDead | FastPath::RcxDead | FastPath::Stack => {}
                }
                note_check(spatial.get(&i), i, &mut taken, &mut saving);
            }
        }
        if !wholly_inside || counted == 0 {
            continue;
        }
        let Some(used) = registers_used(code, &lp.blocks, &mut usages) else {
            continue;
        };
        taken.extend(used);
        let mut free = CANDIDATES.into_iter().filter(|r| !taken.contains(r));
        let Some(reg) = free.next() else {
            continue;
        };
        let spare = free.next().filter(|_| !saving.is_empty());
        if let Some(spare) = spare {
            for i in saving {
                if let Some((_, check)) = spatial.get_mut(&i) {
                    check.scratch = spare;
                    check.save_scratch = false;
                }
            }
        }
        out.push(RegisterLoop {
            header,
            blocks: lp.blocks.clone(),
            reg,
            spare,
        });
    }
    out.sort_by_key(|l| l.header);
    out
}

/// Notes the spatial check of load `i`, if any: its scratch register is
/// taken when dead there, else the check is one that saves it.
fn note_check(
    check: Option<&(u32, SpatialProbe)>,
    i: usize,
    taken: &mut Vec<Register>,
    saving: &mut Vec<usize>,
) {
    match check {
        Some(&(_, check)) if check.save_scratch => saving.push(i),
        Some(&(_, check)) => taken.push(check.scratch),
        None => {}
    }
}

/// Whether every block of the loop of `blocks` (its header's first
/// instruction `header`) ends so that its exits can be instrumented: a
/// fall-through, a conditional branch or a jump inside the function, and
/// none falls through into the header.
fn shape_qualifies(code: &FunctionCode, header: usize, blocks: &[u32]) -> bool {
    let header_block = code.block_of[header];
    blocks.iter().all(|&b| {
        let block = &code.blocks[b as usize];
        match block.terminator {
            Terminator::Jump => true,
            Terminator::FallThrough | Terminator::Conditional => {
                let next = b as usize + 1;
                next < code.blocks.len()
                    && code.blocks[next].start == block.end
                    && next as u32 != header_block
            }
            _ => false,
        }
    })
}

/// The full general registers the instructions of the loop of `blocks`
/// read or write, or `None` when one names `rsp`, calls, returns, traps or
/// makes a system call.
fn registers_used(
    code: &FunctionCode,
    blocks: &[u32],
    usages: &mut Usages,
) -> Option<Vec<Register>> {
    let mut used = Vec::new();
    for &b in blocks {
        for i in code.blocks[b as usize].instructions() {
            let insn = &code.instructions[i];
            if !matches!(
                insn.flow_control(),
                FlowControl::Next
                    | FlowControl::ConditionalBranch
                    | FlowControl::UnconditionalBranch
            ) || matches!(insn.code(), Code::Syscall | Code::Sysenter)
            {
                return None;
            }
            // Bit k is the register `RAX + k`.
            let named = usages.gpr_effects(insn).used();
            if named & 1 << (Register::RSP as u32 - Register::RAX as u32) != 0 {
                return None;
            }
            used.extend(
                (0..16u32)
                    .filter(|k| named & 1 << k != 0)
                    .map(|k| Register::RAX + k),
            );
        }
    }
    Some(used)
}

/// Where each instruction's register loop is, for the copy.
pub(crate) struct LoopMap<'a> {
    code: &'a FunctionCode,
    loops: &'a [RegisterLoop],
    /// Block index → loop index (empty without loops): indexed, not
    /// hashed, as it is asked of every instruction of the copy.
    of_block: Vec<Option<u32>>,
    /// Each loop's label past its entry (the target of its back edges).
    bodies: Vec<u64>,
}

impl<'a> LoopMap<'a> {
    /// Indexes `loops` of `code`, drawing each loop's body label from
    /// `next_label`.
    pub(crate) fn new(
        code: &'a FunctionCode,
        loops: &'a [RegisterLoop],
        next_label: &mut dyn FnMut() -> u64,
    ) -> LoopMap<'a> {
        let mut of_block = Vec::new();
        if !loops.is_empty() {
            of_block.resize(code.blocks.len(), None);
            for (n, lp) in loops.iter().enumerate() {
                for &b in &lp.blocks {
                    of_block[b as usize] = Some(n as u32);
                }
            }
        }
        let bodies = loops.iter().map(|_| next_label()).collect();
        LoopMap {
            code,
            loops,
            of_block,
            bodies,
        }
    }

    /// The loop of instruction `i`, if any.
    pub(crate) fn of(&self, i: usize) -> Option<usize> {
        // A copy without register loops may be encoded without its blocks.
        if self.loops.is_empty() {
            return None;
        }
        self.of_block[self.code.block_of[i] as usize].map(|n| n as usize)
    }

    /// The register of loop `n`.
    pub(crate) fn reg(&self, n: usize) -> Register {
        self.loops[n].reg
    }

    /// Whether original address `target` lies in loop `n`, and the label an
    /// edge from inside it jumps to: the body label for the header.
    fn inside(&self, n: usize, target: u64) -> (bool, u64) {
        let lp = &self.loops[n];
        if target == self.code.instructions[lp.header].ip() {
            return (true, self.bodies[n]);
        }
        let inside = self
            .code
            .instruction_at(target)
            .is_some_and(|i| lp.contains(self.code.block_of[i]));
        (inside, target)
    }

    /// Appends loop entry code at instruction `i`, in loop `in_loop`
    /// ([`LoopMap::of`]), when it is the loop's header; its first
    /// instruction takes `label`. Returns the label the next instruction
    /// must take. A loop head aligned at the entry (the last of `aligned`,
    /// `(instruction index, last branch back)`) moves to the body, where
    /// the back edges go.
    #[inline]
    pub(crate) fn enter(
        &self,
        (i, in_loop): (usize, Option<usize>),
        label: u64,
        out: &mut Vec<Instruction>,
        aligned: &mut [(usize, Option<usize>)],
    ) -> u64 {
        // Asked of every instruction copied: the answer for all but the
        // headers is found where it is asked, without a call.
        match in_loop.filter(|&n| self.loops[n].header == i) {
            Some(n) => self.enter_header(n, label, out, aligned),
            None => label,
        }
    }

    /// [`Self::enter`] at the header of loop `n`.
    #[inline(never)]
    fn enter_header(
        &self,
        n: usize,
        label: u64,
        out: &mut Vec<Instruction>,
        aligned: &mut [(usize, Option<usize>)],
    ) -> u64 {
        let (reg, spare) = (self.loops[n].reg, self.loops[n].spare);
        let start = out.len();
        out.push(with_ip(lea_rsp(-FRAME), label));
        out.push(i2(Code::Mov_rm64_r64, stack_word(), reg));
        if let Some(spare) = spare {
            out.push(i2(Code::Mov_rm64_r64, spare_word(), spare));
        }
        out.push(i2(Code::Mov_r64_rm64, reg, fs_countdown()));
        if let Some(head) = aligned.last_mut().filter(|head| head.0 == start) {
            head.0 = out.len();
        }
        self.bodies[n]
    }

    /// Appends a superblock's check of `loads` at `label` and its stub at
    /// `stub`, which continues in the counting fragment at `fragment`: in
    /// memory, or in the register of loop `n`.
    pub(crate) fn block_check(
        &self,
        n: Option<usize>,
        loads: u32,
        (label, stub, fragment): (u64, u64, u64),
        (out, stubs): (&mut Vec<Instruction>, &mut Vec<Instruction>),
    ) {
        match n {
            Some(n) => {
                block_check(self.loops[n].reg, loads, label, stub, out);
                block_stub(self.loops[n].reg, loads, stub, fragment, stubs);
            }
            None => {
                super::probe::block_check(loads, label, stub, out);
                super::probe::block_stub(loads, stub, fragment, stubs);
            }
        }
    }

    /// Points branch `insn` (instruction `i` of loop `n`) at what its edge
    /// needs: the body label for a back edge, a stub that adds `skipped`
    /// loads back (a superblock's side exit) and leaves the loop when the
    /// target is outside.
    pub(crate) fn branch(
        &self,
        n: usize,
        insn: &mut Instruction,
        skipped: Option<u32>,
        next_label: &mut dyn FnMut() -> u64,
        stubs: &mut Vec<Instruction>,
    ) {
        if !matches!(
            insn.flow_control(),
            FlowControl::ConditionalBranch | FlowControl::UnconditionalBranch
        ) {
            return;
        }
        let lp = &self.loops[n];
        let (inside, target) = self.inside(n, insn.near_branch_target());
        if inside && skipped.is_none() {
            insn.set_near_branch64(target);
            return;
        }
        let stub = next_label();
        let start = stubs.len();
        if let Some(loads) = skipped {
            stubs.push(count_register_by(lp.reg, loads, false));
        }
        if !inside {
            leave(lp, stubs);
        }
        stubs.push(jump(target));
        stubs[start] = with_ip(stubs[start], stub);
        insn.set_near_branch64(stub);
    }

    /// Appends the inline exit after instruction `i` of loop `n` when it
    /// ends a block that falls through out of the loop.
    pub(crate) fn fall_out(&self, n: usize, i: usize, out: &mut Vec<Instruction>) {
        let b = self.code.block_of[i];
        let block = &self.code.blocks[b as usize];
        if block.last() != i
            || !matches!(
                block.terminator,
                Terminator::FallThrough | Terminator::Conditional
            )
            || self.loops[n].contains(b + 1)
        {
            return;
        }
        leave(&self.loops[n], out);
    }

    /// Points every branch of a counting fragment of loop `n` (`fragment`,
    /// just appended) that goes back into the function at a stub that
    /// reloads the register from the countdown, or leaves the loop.
    pub(crate) fn fragment_exits(
        &self,
        n: usize,
        fragment: &mut [Instruction],
        next_label: &mut dyn FnMut() -> u64,
        stubs: &mut Vec<Instruction>,
    ) {
        let lp = &self.loops[n];
        let range = self.code.start..self.code.end;
        for insn in fragment.iter_mut() {
            if !matches!(
                insn.flow_control(),
                FlowControl::ConditionalBranch | FlowControl::UnconditionalBranch
            ) || !range.contains(&insn.near_branch_target())
            {
                continue;
            }
            let (inside, target) = self.inside(n, insn.near_branch_target());
            let stub = next_label();
            let start = stubs.len();
            if inside {
                stubs.push(i2(Code::Mov_r64_rm64, lp.reg, fs_countdown()));
            } else {
                restore(lp, stubs);
            }
            stubs[start] = with_ip(stubs[start], stub);
            stubs.push(jump(target));
            insn.set_near_branch64(stub);
        }
    }
}

/// Appends the counting probe of a lone load in a register loop (flags
/// dead there): `sub reg, 1; jb slow`, the first taking `ip`. Its slow
/// stub is the flags-dead one, which stores 0 to the countdown in memory,
/// and returns through [`reload`].
pub(crate) fn probe(reg: Register, ip: u64, slow: u64, out: &mut Vec<Instruction>) {
    out.push(with_ip(count_register_by(reg, 1, true), ip));
    out.push(branch(Code::Jb_rel32_64, slow));
}

/// Appends a stub at `label` that reloads `reg` from the countdown in
/// memory and jumps to `target`.
pub(crate) fn reload(reg: Register, label: u64, target: u64, out: &mut Vec<Instruction>) {
    out.push(with_ip(i2(Code::Mov_r64_rm64, reg, fs_countdown()), label));
    out.push(jump(target));
}

/// Appends a block check subtracting `loads` from the countdown in `reg`
/// (flags dead); its first instruction takes `ip`.
fn block_check(reg: Register, loads: u32, ip: u64, stub: u64, out: &mut Vec<Instruction>) {
    out.push(with_ip(count_register_by(reg, loads, true), ip));
    out.push(branch(Code::Jbe_rel32_64, stub));
}

/// Appends the stub of a register block check: gives the `loads` back,
/// stores the countdown for the counting fragment at `fragment`.
fn block_stub(reg: Register, loads: u32, stub: u64, fragment: u64, out: &mut Vec<Instruction>) {
    out.push(with_ip(count_register_by(reg, loads, false), stub));
    out.push(i2(Code::Mov_rm64_r64, fs_countdown(), reg));
    out.push(jump(fragment));
}

/// Stores the countdown and restores the loop's registers and `rsp`
/// (flags kept).
fn leave(lp: &RegisterLoop, out: &mut Vec<Instruction>) {
    out.push(i2(Code::Mov_rm64_r64, fs_countdown(), lp.reg));
    restore(lp, out);
}

/// Restores the loop's registers and `rsp` (flags kept).
fn restore(lp: &RegisterLoop, out: &mut Vec<Instruction>) {
    out.push(i2(Code::Mov_r64_rm64, lp.reg, stack_word()));
    if let Some(spare) = lp.spare {
        out.push(i2(Code::Mov_r64_rm64, spare, spare_word()));
    }
    out.push(lea_rsp(FRAME));
}

/// `[rsp]` after the entry: the register's saved value.
fn stack_word() -> MemoryOperand {
    MemoryOperand::with_base(Register::RSP)
}

/// `[rsp+8]` after the entry: the spare register's saved value.
fn spare_word() -> MemoryOperand {
    MemoryOperand::with_base_displ(Register::RSP, 8)
}

fn lea_rsp(disp: i64) -> Instruction {
    Instruction::with2(
        Code::Lea_r64_m,
        Register::RSP,
        MemoryOperand::with_base_displ(Register::RSP, disp),
    )
    .expect("valid lea")
}

fn jump(target: u64) -> Instruction {
    branch(Code::Jmp_rel32_64, target)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::binary::FlatMemory;
    use foldhash::HashMapExt;
    use iced_x86::code_asm::*;

    const BASE: u64 = 0x1000;

    /// [`plan`] written directly: each loop's membership by a
    /// search of its sorted blocks, every load and superblock asked of
    /// every innermost loop. The reference for the marked blocks and the
    /// loops' spans.
    fn plan_by_search(
        code: &FunctionCode,
        inserts: &[(usize, Insert)],
        superblocks: &[Superblock],
        spatial: &mut HashMap<usize, (u32, SpatialProbe)>,
    ) -> Vec<RegisterLoop> {
        if code.unresolved_indirect_jumps() > 0 {
            return Vec::new();
        }
        let forest = code.loops();
        let mut usages = Usages::new();
        let mut out = Vec::new();
        for (index, lp) in forest.loops.iter().enumerate() {
            if (forest.loops.iter()).any(|other| other.parent == Some(index as u32)) {
                continue;
            }
            let header = code.blocks[lp.header as usize].first as usize;
            if header == 0 || !shape_qualifies(code, header, &lp.blocks) {
                continue;
            }
            let in_loop = |i: usize| lp.contains(code.block_of[i]);
            let (mut taken, mut saving) = (Vec::new(), Vec::new());
            let mut counted = 0;
            let mut wholly_inside = true;
            for &(i, insert) in inserts.iter().filter(|&&(i, _)| in_loop(i)) {
                if !matches!(
                    insert,
                    Insert::Soft {
                        fast: FastPath::FlagsDead,
                        ..
                    }
                ) {
                    wholly_inside = false;
                    break;
                }
                counted += 1;
                note_check(spatial.get(&i), i, &mut taken, &mut saving);
            }
            for block in superblocks.iter().take_while(|_| wholly_inside) {
                let inside = (block.at..=block.last).filter(|&i| in_loop(i)).count();
                if inside == 0 {
                    continue;
                }
                if inside != block.last - block.at + 1 {
                    wholly_inside = false;
                    break;
                }
                counted += 1;
                for &(i, _, fast) in &block.loads {
                    if let FastPath::SaveIn(reg) = fast {
                        taken.push(reg);
                    }
                    note_check(spatial.get(&i), i, &mut taken, &mut saving);
                }
            }
            if !wholly_inside || counted == 0 {
                continue;
            }
            let Some(used) = registers_used(code, &lp.blocks, &mut usages) else {
                continue;
            };
            taken.extend(used);
            let mut free = CANDIDATES.into_iter().filter(|r| !taken.contains(r));
            let Some(reg) = free.next() else {
                continue;
            };
            let spare = free.next().filter(|_| !saving.is_empty());
            for &i in saving.iter().filter(|_| spare.is_some()) {
                if let Some((_, check)) = spatial.get_mut(&i) {
                    check.scratch = spare.unwrap();
                    check.save_scratch = false;
                }
            }
            out.push(RegisterLoop {
                header,
                blocks: lp.blocks.clone(),
                reg,
                spare,
            });
        }
        out.sort_by_key(|l| l.header);
        out
    }

    /// [`plan`] agrees with [`plan_by_search`] on every function of this
    /// test executable, with a probe before each load the planner would
    /// probe, superblocks and spatial checks chosen as it chooses them.
    #[test]
    fn marked_loops_plan_as_a_search_of_their_blocks() {
        use crate::rewrite::{choose_fast_path, choose_spatial_probe, form_superblocks, liveness};
        let binary = crate::binary::Binary::open(std::env::current_exe().unwrap()).unwrap();
        let mut loops = 0;
        for function in binary.functions() {
            let code = binary.function_code(function);
            let live = liveness::live_before(&code);
            let loads = (code.instructions.iter().enumerate()).filter(|(_, insn)| {
                (0..insn.op_count()).any(|k| insn.op_kind(k) == iced_x86::OpKind::Memory)
                    && crate::rewrite::probe::unsupported_operand(insn).is_none()
            });
            let mut inserts = Vec::new();
            let mut spatial = HashMap::new();
            for (n, (i, insn)) in loads.enumerate() {
                let fast = choose_fast_path(live[i]);
                inserts.push((i, Insert::Soft { id: n as u32, fast }));
                if crate::rewrite::probe::spatial_checkable(insn) {
                    spatial.insert(i, (n as u32, choose_spatial_probe(insn, live[i])));
                }
            }
            if inserts.is_empty() {
                continue;
            }
            let superblocks = form_superblocks(&code, &live, &mut inserts);
            let mut searched = spatial.clone();
            let planned = plan(&code, &inserts, &superblocks, &mut spatial);
            let expected = plan_by_search(&code, &inserts, &superblocks, &mut searched);
            assert_eq!(planned, expected, "function at {:#x}", code.start);
            assert_eq!(spatial, searched, "function at {:#x}", code.start);
            loops += planned.len();
        }
        assert!(loops > 1_000, "only {loops} register loops planned");
    }

    /// `test rsi, rsi; jle done; lea rcx, [rdi+rsi*8]; xor eax, eax;
    /// top: mov rdx, [rdi + load_disp] (or [rsp+8]); add rdi, 8; add rax,
    /// rdx; cmp rdi, rcx; jne top; done: ret` — the strided kernel's loop.
    fn strided(through_rsp: bool) -> FunctionCode {
        let mut a = CodeAssembler::new(64).unwrap();
        let mut top = a.create_label();
        let mut done = a.create_label();
        a.test(rsi, rsi).unwrap();
        a.jle(done).unwrap();
        a.lea(rcx, qword_ptr(rdi + rsi * 8)).unwrap();
        a.xor(eax, eax).unwrap();
        a.set_label(&mut top).unwrap();
        if through_rsp {
            a.mov(rdx, qword_ptr(rsp + 8)).unwrap();
        } else {
            a.mov(rdx, qword_ptr(rdi)).unwrap();
        }
        a.add(rdi, 8).unwrap();
        a.add(rax, rdx).unwrap();
        a.cmp(rdi, rcx).unwrap();
        a.jne(top).unwrap();
        a.set_label(&mut done).unwrap();
        a.ret().unwrap();
        let bytes = a.assemble(BASE).unwrap();
        let memory = FlatMemory {
            base: BASE,
            bytes: &bytes,
        };
        FunctionCode::build(&bytes, BASE, &memory)
    }

    fn load(fast: FastPath) -> Vec<(usize, Insert)> {
        vec![(4, Insert::Soft { id: 1, fast })]
    }

    #[test]
    fn a_call_free_loop_keeps_its_countdown_in_a_register_it_never_names() {
        let code = strided(false);
        let loops = plan(&code, &load(FastPath::FlagsDead), &[], &mut HashMap::new());
        assert_eq!(loops.len(), 1);
        assert_eq!(loops[0].header, 4);
        assert_eq!(loops[0].reg, Register::R11);
        // A spatial check borrowing r11 (dead there) moves it on.
        let check = SpatialProbe {
            scratch: Register::R11,
            save_scratch: false,
            save_flags: false,
        };
        let mut spatial = HashMap::from_iter([(4, (1, check))]);
        let loops = plan(&code, &load(FastPath::FlagsDead), &[], &mut spatial);
        assert_eq!(loops[0].reg, Register::R10);
        assert_eq!(loops[0].spare, None, "no check saves its scratch");
    }

    #[test]
    fn a_check_without_a_dead_register_takes_the_loops_spare_register() {
        let code = strided(false);
        let saving = SpatialProbe {
            scratch: Register::RCX,
            save_scratch: true,
            save_flags: false,
        };
        let mut spatial = HashMap::from_iter([(4, (1, saving))]);
        let loops = plan(&code, &load(FastPath::FlagsDead), &[], &mut spatial);
        assert_eq!(loops[0].reg, Register::R11);
        assert_eq!(loops[0].spare, Some(Register::R10));
        let check = spatial[&4].1;
        assert_eq!(check.scratch, Register::R10);
        assert!(!check.save_scratch);
        assert_eq!(check.pushed(), 0, "the check leaves rsp alone");

        let mut label = 0xf000_0000;
        let mut next = || {
            label += 1;
            label
        };
        let map = LoopMap::new(&code, &loops, &mut next);
        let mut out = Vec::new();
        let mut aligned = [(0, None)];
        map.enter(
            (4, map.of(4)),
            code.instructions[4].ip(),
            &mut out,
            &mut aligned,
        );
        assert_eq!(aligned[0].0, 4, "the body is aligned, not the entry");
        let text =
            |out: &[Instruction]| -> Vec<String> { out.iter().map(|i| format!("{i}")).collect() };
        assert_eq!(
            text(&out),
            [
                "lea rsp,[rsp-90h]",
                "mov [rsp],r11",
                "mov [rsp+8],r10",
                "mov r11,fs:[38h]"
            ]
        );
        out.clear();
        map.fall_out(0, 8, &mut out);
        assert_eq!(
            text(&out),
            [
                "mov fs:[38h],r11",
                "mov r11,[rsp]",
                "mov r10,[rsp+8]",
                "lea rsp,[rsp+90h]"
            ]
        );
        // A counting fragment's branch out of the loop restores both.
        let mut fragment = [branch(Code::Jmp_rel32_64, code.instructions[9].ip())];
        let mut stubs = Vec::new();
        map.fragment_exits(0, &mut fragment, &mut next, &mut stubs);
        assert_eq!(fragment[0].near_branch_target(), stubs[0].ip());
        assert_eq!(
            text(&stubs[..3]),
            ["mov r11,[rsp]", "mov r10,[rsp+8]", "lea rsp,[rsp+90h]"]
        );
        assert_eq!(stubs[3].near_branch_target(), code.instructions[9].ip());
    }

    #[test]
    fn loops_naming_rsp_or_with_flags_live_probes_keep_the_memory_countdown() {
        let code = strided(true);
        assert!(plan(&code, &load(FastPath::FlagsDead), &[], &mut HashMap::new()).is_empty());
        let code = strided(false);
        assert!(plan(&code, &load(FastPath::Stack), &[], &mut HashMap::new()).is_empty());
        // Nothing counted in the loop: nothing to gain.
        assert!(plan(&code, &[], &[], &mut HashMap::new()).is_empty());
    }

    #[test]
    fn the_entry_saves_below_the_red_zone_and_every_exit_restores() {
        let code = strided(false);
        let loops = plan(&code, &load(FastPath::FlagsDead), &[], &mut HashMap::new());
        let mut label = 0xf000_0000;
        let mut next = || {
            label += 1;
            label
        };
        let map = LoopMap::new(&code, &loops, &mut next);
        let mut out = Vec::new();
        assert_eq!(
            map.enter((3, map.of(3)), 0x1234, &mut out, &mut []),
            0x1234,
            "not a header"
        );
        let mut aligned = [(0, None)];
        let body = map.enter(
            (4, map.of(4)),
            code.instructions[4].ip(),
            &mut out,
            &mut aligned,
        );
        assert_eq!(aligned[0].0, 3, "the body is aligned, not the entry");
        assert_ne!(body, code.instructions[4].ip());
        let text: Vec<String> = out.iter().map(|i| format!("{i}")).collect();
        assert_eq!(
            text,
            ["lea rsp,[rsp-90h]", "mov [rsp],r11", "mov r11,fs:[38h]"]
        );
        // The back edge goes past the entry; the fall-through out of the
        // loop stores the countdown and restores r11 and rsp.
        let mut jne = code.instructions[8];
        let mut stubs = Vec::new();
        map.branch(0, &mut jne, None, &mut next, &mut stubs);
        assert_eq!(jne.near_branch_target(), body);
        assert!(stubs.is_empty());
        out.clear();
        map.fall_out(0, 8, &mut out);
        let text: Vec<String> = out.iter().map(|i| format!("{i}")).collect();
        assert_eq!(
            text,
            ["mov fs:[38h],r11", "mov r11,[rsp]", "lea rsp,[rsp+90h]"]
        );
        // A side exit that skips loads adds them back before the back edge.
        let mut jne = code.instructions[8];
        map.branch(0, &mut jne, Some(2), &mut next, &mut stubs);
        assert_eq!(stubs.len(), 2);
        assert_eq!(format!("{}", stubs[0]), "add r11,2");
        assert_eq!(stubs[1].near_branch_target(), body);
        assert_eq!(jne.near_branch_target(), stubs[0].ip());
    }
}
