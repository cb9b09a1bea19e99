//! The stack frame and what each instruction defines.
//!
//! To follow induction variables that live in memory (every local at `-O0`,
//! spilled counters in register-starved optimised loops), stack slots are
//! treated as variables next to the 16 general-purpose registers. A slot is
//! named by its `StackPos`: the offset from the stack pointer at function
//! entry, or from the point where the function realigned the stack
//! (`and rsp, -32` before AVX spills). The stack position at each
//! instruction comes from a forward pass over the blocks (`push`/`pop`/
//! `sub rsp, imm`/…), and `rbp`-relative slots are translated when `rbp` is
//! a frame pointer (`mov rbp, rsp` in the entry block and no other writes).
//! Slots whose address escapes are not modelled: a store through another
//! pointer is assumed not to alias them.

use super::values::bits_of;
use crate::binary::stack::{self, StackPos};
use crate::binary::usage::Usages;
use crate::binary::{FunctionCode, LoopForest};
use iced_x86::{FlowControl, Instruction, OpAccess, Register, UsedMemory};

/// A variable: registers 0..16 (iced register numbers of the 64-bit GPRs),
/// stack slots from 16 on.
pub(crate) type Var = u16;

/// Number of register variables.
pub(crate) const GPRS: Var = 16;

/// The variable of a general-purpose register (any width), if it is one.
pub(crate) fn gpr_var(reg: Register) -> Option<Var> {
    let full = reg.full_register();
    full.is_gpr64().then(|| full.number() as Var)
}

/// How an instruction defines a variable.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum DefKind {
    /// The instruction's result (register destination, or a store of a
    /// register/immediate to exactly this slot).
    Value,
    /// A call clobbering a caller-saved register.
    CallClobber,
    /// A store overlapping the slot without matching it exactly.
    Clobber,
}

/// Whether iced may list a memory location at `rsp` or `rbp` for `insn`:
/// a stack instruction (`push`, `call`, `leave`, …) or one with an
/// explicit operand based on either (`operands_at_frame_are_explicit_or_stack`
/// in the tests checks this on instructions of every kind).
fn may_access_frame(insn: &Instruction) -> bool {
    insn.is_stack_instruction() || matches!(insn.memory_base(), Register::RSP | Register::RBP)
}

/// The slots of frame accesses `(position, size)` into `slots`: each
/// position once, in order, with its widest size. Sorted as packed keys
/// ([`slot_key`], in `keys`), in the tuples' order: sorting the tuples
/// themselves, compared field by field, was an eighth of the frame's
/// instructions.
fn widest_slots(
    accesses: impl Iterator<Item = (StackPos, u32)>,
    keys: &mut Vec<u128>,
    slots: &mut Vec<(StackPos, u32)>,
) {
    keys.clear();
    keys.extend(accesses.map(|(pos, size)| slot_key(pos, size)));
    keys.sort_unstable();
    slots.clear();
    for &key in keys.iter() {
        let (pos, size) = slot_of_key(key);
        match slots.last_mut() {
            // Sizes ascend within a position: the last is the widest.
            Some(last) if last.0 == pos => last.1 = size,
            _ => slots.push((pos, size)),
        }
    }
}

/// Widens each of `slots` (sorted, each position once) to the widest of
/// `accesses` at its position; accesses elsewhere add no slot. The slots
/// of the accesses inside loops, widened by those outside, are the slots of
/// all accesses restricted to the positions accessed inside loops: the
/// only ones the evaluator asks about, in the same order, with the same
/// widths, so the same overlaps. Sorting only the loops' accesses spares
/// the sort of every other frame access of the function.
fn widen_slots(accesses: impl Iterator<Item = (StackPos, u32)>, slots: &mut [(StackPos, u32)]) {
    if slots.is_empty() {
        return;
    }
    for (pos, size) in accesses {
        if let Ok(k) = slots.binary_search_by_key(&pos, |s| s.0) {
            slots[k].1 = slots[k].1.max(size);
        }
    }
}

/// A slot access as one number ordered as the tuple `(pos, size)`:
/// anchor, offset (its sign bit flipped, so that unsigned order is signed
/// order) and size, from the most significant bits down.
fn slot_key(pos: StackPos, size: u32) -> u128 {
    let offset = (pos.offset as u64) ^ (1 << 63);
    (u128::from(pos.anchor) << 96) | (u128::from(offset) << 32) | u128::from(size)
}

/// The access [`slot_key`] packed.
fn slot_of_key(key: u128) -> (StackPos, u32) {
    let offset = ((key >> 32) as u64 ^ (1 << 63)) as i64;
    let pos = StackPos {
        anchor: (key >> 96) as u32,
        offset,
    };
    (pos, key as u32)
}

/// A frame-candidate memory access (`rsp`/`rbp` base, no index):
/// instruction, base, displacement, size and whether it writes.
type FrameAccess = (u32, Register, u64, u32, bool);

/// Frame facts and per-instruction definitions of one function.
#[derive(Debug)]
pub(crate) struct Frame {
    /// Where `rsp` points before each instruction, when known.
    pub(crate) rsp_delta: Vec<Option<StackPos>>,
    /// Entry-relative offset `rbp` holds when it is a frame pointer.
    pub(crate) frame_pointer: Option<i64>,
    /// The slots accessed inside loops, each with the widest access at
    /// its position anywhere in the function, sorted; index = var - GPRS.
    pub slots: Vec<(StackPos, u32)>,
    /// Definitions: `defs[def_start[i]..def_start[i+1]]` for instruction `i`.
    def_start: Vec<u32>,
    defs: Vec<(Var, DefKind)>,
    /// The lists the computation works in, kept with the frame so that
    /// [`Frame::into_buffers`] hands them on.
    scratch: FrameScratch,
}

/// The working lists of [`Frame::compute_in`].
#[derive(Debug, Default)]
struct FrameScratch {
    /// Per instruction, the general-purpose registers it writes (bit =
    /// variable), where the computation asked (0 elsewhere).
    written: Vec<u16>,
    /// The frame-candidate accesses inside loops, in instruction order.
    accesses: Vec<FrameAccess>,
    /// Those outside loops: they widen the slots accessed inside loops
    /// ([`widen_slots`]) and name no slot of their own.
    outer_accesses: Vec<FrameAccess>,
    /// The slot keys of [`widest_slots`].
    keys: Vec<u128>,
}

/// The allocations of a [`Frame`], kept from one function to the next
/// ([`Frame::compute_in`], [`Frame::into_buffers`]): made anew for every
/// function with loops, each per-instruction list would be allocated, its
/// fresh pages faulted in, and freed again. Nothing in them outlives a
/// function but their capacity.
#[derive(Debug, Default)]
pub(crate) struct FrameBuffers {
    rsp_delta: Vec<Option<StackPos>>,
    slots: Vec<(StackPos, u32)>,
    def_start: Vec<u32>,
    defs: Vec<(Var, DefKind)>,
    scratch: FrameScratch,
}

const CALLER_SAVED: [Register; 9] = [
    Register::RAX,
    Register::RCX,
    Register::RDX,
    Register::RSI,
    Register::RDI,
    Register::R8,
    Register::R9,
    Register::R10,
    Register::R11,
];

/// Whether iced's access kind writes.
fn is_write(access: OpAccess) -> bool {
    matches!(
        access,
        OpAccess::Write | OpAccess::ReadWrite | OpAccess::CondWrite | OpAccess::ReadCondWrite
    )
}

impl FrameScratch {
    /// The instructions' usage, block by block: the GPRs each instruction
    /// writes (`written`) and its frame-candidate accesses (`accesses`
    /// inside loops, `outer_accesses` outside).
    ///
    /// Only the instructions inside loops have their writes read (the
    /// evaluator asks about no others), and, when the entry block sets
    /// `rbp` up as a frame pointer that is not yet known
    /// (`rbp_writes_asked`), every instruction's. The blocks outside loops
    /// are read here only then; otherwise [`FrameScratch::read_outer_accesses`]
    /// reads them once the slots are known, and only if there are any.
    fn read_usage(
        &mut self,
        code: &FunctionCode,
        loops: &LoopForest,
        usages: &mut Usages,
        rbp_writes_asked: bool,
    ) {
        self.written.clear();
        self.written.resize(code.instructions.len(), 0);
        self.accesses.clear();
        self.outer_accesses.clear();
        for (b, block) in code.blocks.iter().enumerate() {
            let in_loop = loops.innermost(b as u32).is_some();
            if !in_loop && !rbp_writes_asked {
                continue;
            }
            let accesses = if in_loop {
                &mut self.accesses
            } else {
                &mut self.outer_accesses
            };
            read_block(
                code,
                block.instructions(),
                usages,
                true,
                &mut self.written,
                accesses,
            );
        }
    }

    /// The frame-candidate accesses of the blocks outside loops
    /// (`outer_accesses`), when [`FrameScratch::read_usage`] left them.
    /// Outside loops the instructions' register and memory usage (most of
    /// this pass) is asked only where the answer matters: frame accesses,
    /// whose widths are those of the slots at their positions (the
    /// overlaps of stores in loops depend on them). Without slots they
    /// widen nothing, and are not read.
    fn read_outer_accesses(
        &mut self,
        code: &FunctionCode,
        loops: &LoopForest,
        usages: &mut Usages,
    ) {
        for (b, block) in code.blocks.iter().enumerate() {
            if loops.innermost(b as u32).is_none() {
                let range = block.instructions();
                read_block(
                    code,
                    range,
                    usages,
                    false,
                    &mut self.written,
                    &mut self.outer_accesses,
                );
            }
        }
    }
}

/// Reads the instructions `range` of a block: the GPRs each writes into
/// `written` when `writes_asked`, and its frame-candidate accesses into
/// `accesses`.
#[inline(always)]
fn read_block(
    code: &FunctionCode,
    range: std::ops::Range<usize>,
    usages: &mut Usages,
    writes_asked: bool,
    written: &mut [u16],
    accesses: &mut Vec<FrameAccess>,
) {
    let insns = code.instructions[range.clone()].iter();
    for ((i, insn), written) in range.clone().zip(insns).zip(&mut written[range]) {
        if !may_access_frame(insn) {
            // Only a frame access can list a location kept here: the
            // others' memory usage (iced's memory list, most of their
            // cost) is not asked.
            if writes_asked {
                *written = usages.gpr_effects(insn).written;
            }
            continue;
        }
        let memory = if writes_asked {
            // The effects' bits are the variables' numbers.
            let (effects, memory) = usages.of(insn);
            *written = effects.written;
            memory
        } else {
            usages.memory_of(insn)
        };
        push_frame_accesses(accesses, i, memory);
    }
}

/// Appends to `accesses` those of `memory` (instruction `i`'s locations)
/// that are frame candidates: `rsp` or `rbp` plus a displacement.
#[inline(always)]
fn push_frame_accesses(accesses: &mut Vec<FrameAccess>, i: usize, memory: &[UsedMemory]) {
    for m in memory {
        if m.index() == Register::None && matches!(m.base(), Register::RSP | Register::RBP) {
            accesses.push((
                i as u32,
                m.base(),
                m.displacement(),
                m.memory_size().size() as u32,
                is_write(m.access()),
            ));
        }
    }
}

impl Frame {
    /// Analyses the frame of `code`, whose loops are `loops`.
    #[cfg(test)]
    pub fn compute(code: &FunctionCode, loops: &LoopForest, usages: &mut Usages) -> Frame {
        Frame::compute_in(code, loops, usages, None, FrameBuffers::default())
    }

    /// Analyses the frame of `code`, whose loops are `loops`, in the
    /// allocations of `buffers` (from [`Frame::into_buffers`] or new): the
    /// same frame as with new ones, whatever they held. `frame_pointer`:
    /// [`stack::frame_pointer`] of `code` when the caller has it already
    /// (then the writes of `rbp` outside loops are not read again).
    pub(crate) fn compute_in(
        code: &FunctionCode,
        loops: &LoopForest,
        usages: &mut Usages,
        frame_pointer: Option<Option<i64>>,
        buffers: FrameBuffers,
    ) -> Frame {
        let FrameBuffers {
            mut rsp_delta,
            slots,
            def_start,
            defs,
            mut scratch,
        } = buffers;
        let rbp_writes_asked = frame_pointer.is_none() && stack::has_frame_setup(code);
        scratch.read_usage(code, loops, usages, rbp_writes_asked);
        let rbp_bit = 1u16 << gpr_var(Register::RBP).expect("gpr");
        let frame_pointer = frame_pointer.unwrap_or_else(|| {
            stack::frame_pointer_with(code, |i| scratch.written[i] & rbp_bit != 0)
        });
        if scratch.accesses.is_empty() {
            // No frame access inside loops: no slots, and the stack
            // positions, asked only on the way to a slot, are not walked.
            rsp_delta.clear();
            rsp_delta.resize(code.instructions.len(), None);
        } else {
            stack::positions_into(code, frame_pointer, &mut rsp_delta);
        }
        let mut frame = Frame {
            rsp_delta,
            frame_pointer,
            slots,
            def_start,
            defs,
            scratch: FrameScratch::default(),
        };
        // Slots: every frame access inside a loop, as wide as the widest
        // access at its position anywhere.
        let mut slots = std::mem::take(&mut frame.slots);
        widest_slots(
            frame.access_slots(&scratch.accesses),
            &mut scratch.keys,
            &mut slots,
        );
        if !rbp_writes_asked && !slots.is_empty() {
            scratch.read_outer_accesses(code, loops, usages);
        }
        widen_slots(frame.access_slots(&scratch.outer_accesses), &mut slots);
        frame.slots = slots;
        frame.list_defs(code, loops, &scratch.written, &scratch.accesses);
        frame.scratch = scratch;
        frame
    }

    /// The positions and sizes of `accesses` whose positions are known.
    fn access_slots<'s>(
        &'s self,
        accesses: &'s [FrameAccess],
    ) -> impl Iterator<Item = (StackPos, u32)> + 's {
        accesses.iter().filter_map(|&(i, base, disp, size, _)| {
            Some((
                self.slot_offset(i as usize, base, Register::None, disp)?,
                size,
            ))
        })
    }

    /// The frame's allocations, for the next function's.
    pub(crate) fn into_buffers(self) -> FrameBuffers {
        FrameBuffers {
            rsp_delta: self.rsp_delta,
            slots: self.slots,
            def_start: self.def_start,
            defs: self.defs,
            scratch: self.scratch,
        }
    }

    /// Lists the definitions of the instructions inside loops, from the
    /// registers each instruction writes (`written`, bit = variable) and
    /// the frame accesses (`accesses`, in instruction order). The others
    /// get none: the evaluator asks only about definitions inside the loop
    /// it evaluates, and listing every call's clobbers and every push's
    /// slot in a function was a sixth of this pass's own instructions.
    /// Block by block: a block outside loops is one fill of its starts.
    fn list_defs(
        &mut self,
        code: &FunctionCode,
        loops: &LoopForest,
        written: &[u16],
        accesses: &[FrameAccess],
    ) {
        let widest = self
            .slots
            .iter()
            .map(|s| i64::from(s.1))
            .max()
            .unwrap_or(1)
            .max(1);
        let invariant_mask = (1u16 << gpr_var(Register::RSP).expect("gpr"))
            | if self.frame_pointer.is_some() {
                1u16 << gpr_var(Register::RBP).expect("gpr")
            } else {
                0
            };
        self.def_start.clear();
        self.def_start.reserve(code.instructions.len() + 1);
        self.defs.clear();
        let mut next_access = 0;
        for (b, block) in code.blocks.iter().enumerate() {
            let range = block.instructions();
            if loops.innermost(b as u32).is_none() {
                let at = self.defs.len() as u32;
                self.def_start.extend(std::iter::repeat_n(at, range.len()));
                continue;
            }
            for (i, insn) in range.clone().zip(&code.instructions[range]) {
                self.def_start.push(self.defs.len() as u32);
                while next_access < accesses.len() && (accesses[next_access].0 as usize) < i {
                    next_access += 1;
                }
                let first_access = next_access;
                while next_access < accesses.len() && accesses[next_access].0 as usize == i {
                    next_access += 1;
                }
                let defined = bits_of(u128::from(written[i] & !invariant_mask));
                self.defs
                    .extend(defined.map(|v| (v as Var, DefKind::Value)));
                if matches!(
                    insn.flow_control(),
                    FlowControl::Call | FlowControl::IndirectCall
                ) {
                    for r in CALLER_SAVED {
                        let v = gpr_var(r).expect("gpr");
                        if written[i] & (1 << v) == 0 {
                            self.defs.push((v, DefKind::CallClobber));
                        }
                    }
                }
                for &(_, base, disp, size, write) in &accesses[first_access..next_access] {
                    if write {
                        self.list_slot_writes(i, base, disp, size, widest);
                    }
                }
            }
        }
        self.def_start.push(self.defs.len() as u32);
    }

    /// Lists the slots a write `[base + disp]` of `size` bytes at
    /// instruction `i` defines: the slot it matches exactly as a value,
    /// those it overlaps otherwise as clobbered (`widest`: the widest
    /// slot's size).
    fn list_slot_writes(&mut self, i: usize, base: Register, disp: u64, size: u32, widest: i64) {
        let Some(off) = self.slot_offset(i, base, Register::None, disp) else {
            return;
        };
        let size = i64::from(size).max(1);
        // Slots overlapping [off, off + size): they start below its end and
        // at most `widest` bytes before it.
        let from = self.slots.partition_point(|s| s.0 < off.plus(-widest));
        for (k, s) in self.slots.iter().enumerate().skip(from) {
            if s.0 >= off.plus(size) {
                break;
            }
            let overlaps = s.0.anchor == off.anchor
                && s.0.offset < off.offset + size
                && off.offset < s.0.offset + i64::from(s.1).max(1);
            if !overlaps {
                continue;
            }
            let kind = if s.0 == off {
                DefKind::Value
            } else {
                DefKind::Clobber
            };
            self.defs.push((GPRS + k as Var, kind));
        }
    }

    /// Variables instruction `i` defines, if it lies inside a loop (none
    /// are listed for the others).
    pub(crate) fn defs(&self, i: usize) -> &[(Var, DefKind)] {
        &self.defs[self.def_start[i] as usize..self.def_start[i + 1] as usize]
    }

    /// How instruction `i` defines `v`, if it does.
    pub(crate) fn def_kind(&self, i: usize, v: Var) -> Option<DefKind> {
        self.defs(i).iter().find(|d| d.0 == v).map(|d| d.1)
    }

    /// `rsp`, and `rbp` when it is the frame pointer: their values do not
    /// change within a loop iteration in any way that matters for address
    /// classes (frame accesses are slots).
    pub(crate) fn is_invariant_register(&self, reg: Register) -> bool {
        match reg.full_register() {
            Register::RSP | Register::RIP | Register::None => true,
            Register::RBP => self.frame_pointer.is_some(),
            _ => false,
        }
    }

    /// Stack position of a frame access `[base + disp]` (no index) at
    /// instruction `i`.
    pub(crate) fn slot_offset(
        &self,
        i: usize,
        base: Register,
        index: Register,
        disp: u64,
    ) -> Option<StackPos> {
        if index != Register::None {
            return None;
        }
        let disp = disp as i64;
        match base {
            Register::RSP => Some(self.rsp_delta[i]?.plus(disp)),
            Register::RBP => Some(StackPos::entry(self.frame_pointer? + disp)),
            _ => None,
        }
    }

    /// The variable of the slot at that position, if one was seen.
    pub(crate) fn slot_var(&self, offset: StackPos) -> Option<Var> {
        self.slots
            .binary_search_by_key(&offset, |s| s.0)
            .ok()
            .map(|k| GPRS + k as Var)
    }

    /// The slot variable an instruction's explicit memory operand names.
    pub(crate) fn operand_slot(&self, i: usize, insn: &Instruction) -> Option<Var> {
        let off = self.slot_offset(
            i,
            insn.memory_base(),
            insn.memory_index(),
            insn.memory_displacement64(),
        )?;
        self.slot_var(off)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use iced_x86::InstructionInfoFactory;

    /// [`widest_slots`] against the tuples sorted and merged directly, on
    /// pseudo-random accesses around the sign and anchor boundaries.
    #[test]
    fn widest_slots_match_sorted_tuples() {
        let mut state = 0x2545_f491_4f6c_dd1du64;
        let mut next = || crate::binary::xorshift64(&mut state);
        let offsets = [
            i64::MIN,
            i64::MIN + 1,
            -4096,
            -9,
            -8,
            -1,
            0,
            1,
            8,
            4095,
            i64::MAX,
        ];
        for round in 0..200 {
            let accesses: Vec<(StackPos, u32)> = (0..round)
                .map(|_| {
                    let r = next();
                    let pos = StackPos {
                        anchor: [0, 1, 7, u32::MAX][(r % 4) as usize],
                        offset: if r & 0x10 == 0 {
                            offsets[(r >> 8) as usize % offsets.len()]
                        } else {
                            (r >> 20) as i64 % 64 - 32
                        },
                    };
                    let size = [0, 1, 2, 4, 8, 16, 32, u32::MAX][(r >> 5) as usize % 8];
                    (pos, size)
                })
                .collect();
            let mut expected = accesses.clone();
            expected.sort_unstable();
            expected.dedup_by(|a, b| {
                if a.0 == b.0 {
                    b.1 = b.1.max(a.1);
                    true
                } else {
                    false
                }
            });
            let mut slots = Vec::new();
            widest_slots(accesses.into_iter(), &mut Vec::new(), &mut slots);
            assert_eq!(slots, expected);
        }
    }

    /// [`widest_slots`] of the accesses inside loops, [`widen_slots`] by
    /// those outside, against [`widest_slots`] of all of them restricted to
    /// the positions accessed inside loops, on pseudo-random accesses
    /// (positions and sizes drawn from few values, so that they meet).
    #[test]
    fn widened_slots_match_all_accesses_restricted() {
        let mut state = 0x6a09_e667_f3bc_c908u64;
        let mut next = || crate::binary::xorshift64(&mut state);
        for round in 0..400 {
            let accesses: Vec<(StackPos, u32, bool)> = (0..round)
                .map(|_| {
                    let r = next();
                    let pos = StackPos {
                        anchor: (r % 2) as u32,
                        offset: (r >> 8) as i64 % 24 - 12,
                    };
                    let size = [0, 1, 4, 8, 16][(r >> 4) as usize % 5];
                    (pos, size, r & 0x80 == 0)
                })
                .collect();
            let mut all = Vec::new();
            widest_slots(
                accesses.iter().map(|&(pos, size, _)| (pos, size)),
                &mut Vec::new(),
                &mut all,
            );
            all.retain(|s| accesses.iter().any(|&(pos, _, inner)| inner && pos == s.0));
            let mut slots = Vec::new();
            widest_slots(
                accesses
                    .iter()
                    .filter(|a| a.2)
                    .map(|&(pos, size, _)| (pos, size)),
                &mut Vec::new(),
                &mut slots,
            );
            widen_slots(
                accesses
                    .iter()
                    .filter(|a| !a.2)
                    .map(|&(pos, size, _)| (pos, size)),
                &mut slots,
            );
            assert_eq!(slots, all, "round {round}");
        }
    }

    /// [`Frame::compute`]'s slots on this test executable's functions with
    /// loops, against the widest of all the function's frame accesses
    /// (every instruction's usage read, inside loops or not, at the stack
    /// positions of a walk of the whole function) at each position
    /// accessed inside a loop: the accesses outside loops, read only when
    /// there are such slots, widen them as all would, and the positions,
    /// walked only when a loop accesses the frame, are those of a walk.
    #[test]
    fn slots_are_the_widest_of_all_frame_accesses() {
        let binary = crate::binary::Binary::open(std::env::current_exe().unwrap()).unwrap();
        let mut usages = Usages::new();
        let mut with_slots = 0;
        for f in binary.functions() {
            let code = binary.function_code(f);
            let loops = code.loops();
            if loops.loops.is_empty() {
                continue;
            }
            let frame = Frame::compute(&code, loops, &mut usages);
            let positions = stack::positions(&code, frame.frame_pointer);
            let mut accesses = Vec::new();
            for (b, block) in code.blocks.iter().enumerate() {
                let in_loop = loops.innermost(b as u32).is_some();
                for i in block.instructions() {
                    for m in usages.of(&code.instructions[i]).1 {
                        if m.index() != Register::None
                            || !matches!(m.base(), Register::RSP | Register::RBP)
                        {
                            continue;
                        }
                        let disp = m.displacement() as i64;
                        let pos = match m.base() {
                            Register::RSP => positions[i].map(|p| p.plus(disp)),
                            _ => frame.frame_pointer.map(|fp| StackPos::entry(fp + disp)),
                        };
                        if let Some(pos) = pos {
                            accesses.push((pos, m.memory_size().size() as u32, in_loop));
                        }
                    }
                }
            }
            let mut expected: Vec<(StackPos, u32)> = Vec::new();
            for &(pos, _, _) in accesses.iter().filter(|a| a.2) {
                if !expected.iter().any(|s| s.0 == pos) {
                    let widest = accesses.iter().filter(|a| a.0 == pos).map(|a| a.1).max();
                    expected.push((pos, widest.unwrap_or(0)));
                }
            }
            expected.sort_unstable();
            with_slots += usize::from(!expected.is_empty());
            assert_eq!(frame.slots, expected, "function {:#x}", code.start);
        }
        assert!(with_slots > 100, "{with_slots} functions with slots");
    }

    /// [`may_access_frame`] on the instructions of pseudo-random bytes:
    /// every `rsp`/`rbp` location iced lists is behind an instruction it
    /// accepts.
    #[test]
    fn operands_at_frame_are_explicit_or_stack() {
        let insns = crate::binary::random_instructions(0x9e37_79b9_7f4a_7c15, 1 << 20);
        let mut info = InstructionInfoFactory::new();
        let mut at_frame = 0;
        for insn in insns.iter().filter(|i| !i.is_invalid()) {
            let listed = info
                .info(insn)
                .used_memory()
                .iter()
                .any(|m| matches!(m.base(), Register::RSP | Register::RBP));
            assert!(!listed || may_access_frame(insn), "{insn}");
            at_frame += usize::from(listed);
        }
        assert!(at_frame > 5_000, "{at_frame} instructions at the frame");
    }
}
