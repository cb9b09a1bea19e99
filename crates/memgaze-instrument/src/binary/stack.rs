//! Where the stack pointer is, instruction by instruction.
//!
//! A forward pass over the blocks follows `push`/`pop`/`call`/`sub rsp,
//! imm`/`add rsp, imm`/`lea rsp, [rsp+d]`, frame-pointer restores (`mov rsp,
//! rbp`, `leave`, `lea rsp, [rbp+d]`) and realignments (`and rsp, -32`,
//! which start a new anchor). Positions are relative to the stack pointer at
//! function entry (where the return address sits), so a position of
//! `(0, 0)` at a `jmp` means the frame is torn down: a tail call.

use super::FunctionCode;
use super::usage::Usages;
use iced_x86::{Instruction, Mnemonic, OpKind, Register};
use std::cell::RefCell;

/// A stack address: `offset` bytes from an anchor, the stack pointer at
/// function entry (`anchor` 0) or right after the realignment at
/// instruction `anchor - 1`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) struct StackPos {
    /// 0 = function entry; `k + 1` = after `and rsp, …` at instruction `k`.
    pub anchor: u32,
    /// Byte offset from the anchor.
    pub offset: i64,
}

impl StackPos {
    /// `offset` bytes from the entry stack pointer.
    pub fn entry(offset: i64) -> StackPos {
        StackPos { anchor: 0, offset }
    }

    /// Moved by `d` bytes.
    pub fn plus(self, d: i64) -> StackPos {
        StackPos {
            anchor: self.anchor,
            offset: self.offset + d,
        }
    }
}

/// `Some(delta)` when `rbp` is a frame pointer: set once by `mov rbp, rsp`
/// and otherwise only restored (`pop rbp`, `leave`).
pub(crate) fn frame_pointer(code: &FunctionCode, usages: &mut Usages) -> Option<i64> {
    frame_pointer_with(code, |i| {
        usages
            .gpr_effects(&code.instructions[i])
            .writes(Register::RBP)
    })
}

/// `frame_pointer` with a precomputed "instruction `i` writes `rbp`".
pub(crate) fn frame_pointer_with(
    code: &FunctionCode,
    mut writes_rbp: impl FnMut(usize) -> bool,
) -> Option<i64> {
    // Without a `mov rbp, rsp` in the entry block there is none, whatever
    // the other instructions write: `writes_rbp` (iced's instruction info
    // for every instruction) is not asked.
    if !has_frame_setup(code) {
        return None;
    }
    let mut set_at: Option<usize> = None;
    for (i, insn) in code.instructions.iter().enumerate() {
        let writes_rbp = writes_rbp(i);
        if !writes_rbp {
            continue;
        }
        let is_setup = is_frame_setup(insn);
        if is_setup && set_at.is_none() && code.block_of[i] == 0 {
            set_at = Some(i);
        } else if !matches!(insn.mnemonic(), Mnemonic::Pop | Mnemonic::Leave) {
            return None;
        }
    }
    let at = set_at?;
    // The delta at the `mov rbp, rsp`: pushes before it in the entry block.
    let mut delta = 0i64;
    for insn in &code.instructions[..at] {
        match stack_effect(insn, None) {
            StackEffect::Add(d) => delta += d,
            _ => return None,
        }
    }
    Some(delta)
}

/// Whether the entry block has a `mov rbp, rsp`, without which `rbp` is
/// not a frame pointer.
pub(crate) fn has_frame_setup(code: &FunctionCode) -> bool {
    code.blocks.first().is_some_and(|entry| {
        code.instructions[entry.instructions()]
            .iter()
            .any(is_frame_setup)
    })
}

/// `mov rbp, rsp`.
fn is_frame_setup(insn: &Instruction) -> bool {
    insn.mnemonic() == Mnemonic::Mov
        && insn.op0_register() == Register::RBP
        && insn.op1_kind() == OpKind::Register
        && insn.op1_register() == Register::RSP
}

/// How an instruction moves `rsp`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum StackEffect {
    /// Adds this many bytes.
    Add(i64),
    /// Sets it relative to the frame pointer (`mov rsp, rbp`, `leave`,
    /// `lea rsp, [rbp+d]`): the entry-relative offset.
    FromFramePointer(i64),
    /// Realigns it (`and rsp, imm`): a new anchor.
    Realign,
    /// Something not followed.
    Unknown,
}

/// How `insn` moves `rsp`, `frame_pointer` being `rbp`'s entry-relative
/// offset when it is a frame pointer.
fn stack_effect(insn: &Instruction, frame_pointer: Option<i64>) -> StackEffect {
    if !may_move_rsp(insn) {
        return StackEffect::Add(0);
    }
    mnemonic_stack_effect(insn, writes_rsp_operand(insn), frame_pointer)
}

/// Whether `insn` may move `rsp`: most instructions neither name `rsp` as
/// their destination nor are stack instructions (iced's flag, one table
/// read), and leave it without the match over the mnemonic.
#[inline(always)]
fn may_move_rsp(insn: &Instruction) -> bool {
    writes_rsp_operand(insn) || insn.is_stack_instruction()
}

/// Whether `insn`'s first operand is `rsp`. The register is compared
/// first: a field read that is false for almost every instruction, where
/// the operand count is a table read.
#[inline(always)]
fn writes_rsp_operand(insn: &Instruction) -> bool {
    insn.op0_register() == Register::RSP
        && insn.op_count() > 0
        && insn.op0_kind() == OpKind::Register
}

/// [`stack_effect`] by the mnemonic, `rsp_dst` telling whether the first
/// operand is `rsp`.
fn mnemonic_stack_effect(
    insn: &Instruction,
    rsp_dst: bool,
    frame_pointer: Option<i64>,
) -> StackEffect {
    let imm = |insn: &Instruction| insn.immediate(1) as i64;
    let from_fp = |d: i64| match frame_pointer {
        Some(fp) => StackEffect::FromFramePointer(fp + d),
        None => StackEffect::Unknown,
    };
    match insn.mnemonic() {
        Mnemonic::Push | Mnemonic::Pushfq => StackEffect::Add(-8),
        Mnemonic::Pop if rsp_dst => StackEffect::Unknown,
        Mnemonic::Pop | Mnemonic::Popfq => StackEffect::Add(8),
        Mnemonic::Call | Mnemonic::Ret => StackEffect::Add(0),
        Mnemonic::Sub if rsp_dst && is_imm(insn.op1_kind()) => StackEffect::Add(-imm(insn)),
        Mnemonic::Add if rsp_dst && is_imm(insn.op1_kind()) => StackEffect::Add(imm(insn)),
        Mnemonic::And if rsp_dst && is_imm(insn.op1_kind()) => StackEffect::Realign,
        Mnemonic::Lea if rsp_dst && insn.memory_index() == Register::None => {
            match insn.memory_base() {
                Register::RSP => StackEffect::Add(insn.memory_displacement64() as i64),
                Register::RBP => from_fp(insn.memory_displacement64() as i64),
                _ => StackEffect::Unknown,
            }
        }
        Mnemonic::Mov
            if rsp_dst
                && insn.op1_kind() == OpKind::Register
                && insn.op1_register() == Register::RBP =>
        {
            from_fp(0)
        }
        Mnemonic::Leave => from_fp(8),
        _ if rsp_dst => StackEffect::Unknown,
        Mnemonic::Enter => StackEffect::Unknown,
        _ => StackEffect::Add(0),
    }
}

fn is_imm(kind: OpKind) -> bool {
    matches!(
        kind,
        OpKind::Immediate8
            | OpKind::Immediate8to32
            | OpKind::Immediate8to64
            | OpKind::Immediate32
            | OpKind::Immediate32to64
    )
}

/// Stack position before each instruction; `None` where paths disagree
/// or an instruction sets `rsp` in a way not followed.
pub(crate) fn positions(code: &FunctionCode, frame_pointer: Option<i64>) -> Vec<Option<StackPos>> {
    let mut out = Vec::new();
    positions_into(code, frame_pointer, &mut out);
    out
}

/// [`positions`] into `out` (emptied first), reusing its allocation.
pub(crate) fn positions_into(
    code: &FunctionCode,
    frame_pointer: Option<i64>,
    out: &mut Vec<Option<StackPos>>,
) {
    let n = code.instructions.len();
    out.clear();
    out.resize(n, None);
    if n == 0 {
        return;
    }
    POSITIONS_BUFFERS.with_borrow_mut(|buffers| {
        let PositionsBuffers { entry, work } = buffers;
        entry.clear();
        entry.resize(code.blocks.len(), None);
        entry[0] = Some(Some(StackPos::entry(0)));
        work.clear();
        work.push(0);
        walk_blocks(code, frame_pointer, out, entry, work);
    });
    // Instructions of blocks never reached keep `None`.
}

/// The buffers of [`positions_into`], kept by each thread: allocated for
/// every function, they were two allocations per function classified.
#[derive(Default)]
struct PositionsBuffers {
    /// Block entry states: None = not reached yet, Some(None) = conflict.
    entry: Vec<Option<Option<StackPos>>>,
    /// Blocks whose entry state changed, to walk again.
    work: Vec<u32>,
}

thread_local! {
    static POSITIONS_BUFFERS: RefCell<PositionsBuffers> = RefCell::default();
}

/// The walk of [`positions_into`]: each block in `work` is walked from
/// its entry state, each instruction's position written to `out`, and
/// its successors whose entry state changes are queued.
fn walk_blocks(
    code: &FunctionCode,
    frame_pointer: Option<i64>,
    out: &mut [Option<StackPos>],
    entry: &mut [Option<Option<StackPos>>],
    work: &mut Vec<u32>,
) {
    while let Some(b) = work.pop() {
        let block = &code.blocks[b as usize];
        let mut pos = entry[b as usize].flatten();
        // Zipped rather than indexed: the bounds are checked once per block.
        let range = block.instructions();
        let insns = range.clone().zip(&code.instructions[range.clone()]);
        for ((i, insn), slot) in insns.zip(&mut out[range]) {
            *slot = pos;
            // Checked here so that the instructions that leave `rsp` (most)
            // cost no call and no update of the position.
            if !may_move_rsp(insn) {
                continue;
            }
            pos = match stack_effect(insn, frame_pointer) {
                StackEffect::Add(d) => pos.map(|p| p.plus(d)),
                StackEffect::FromFramePointer(off) => Some(StackPos::entry(off)),
                StackEffect::Realign => Some(StackPos {
                    anchor: i as u32 + 1,
                    offset: 0,
                }),
                StackEffect::Unknown => None,
            };
        }
        for &s in &block.successors {
            let slot = &mut entry[s as usize];
            let merged = match *slot {
                None => Some(pos),
                Some(prev) if prev == pos => continue,
                Some(_) => Some(None),
            };
            if *slot != merged {
                *slot = merged;
                work.push(s);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// [`stack_effect`]'s shortcut on the instructions of pseudo-random
    /// bytes (pushes, pops, `leave`, `enter` and `rsp` destinations among
    /// them): the same effect as the mnemonic's match, with and without a
    /// frame pointer.
    #[test]
    fn shortcut_matches_the_mnemonics() {
        let insns = crate::binary::random_instructions(0x517c_c1b7_2722_0a95, 1 << 20);
        let (mut skipped, mut moving) = (0, 0);
        for insn in &insns {
            let rsp_dst = writes_rsp_operand(insn);
            for fp in [None, Some(-8)] {
                let effect = stack_effect(insn, fp);
                assert_eq!(effect, mnemonic_stack_effect(insn, rsp_dst, fp), "{insn}");
                moving += usize::from(effect != StackEffect::Add(0));
            }
            skipped += usize::from(!rsp_dst && !insn.is_stack_instruction());
        }
        assert!(skipped > 100_000, "{skipped} instructions skipped");
        assert!(moving > 10_000, "{moving} effects that move rsp");
    }
}
