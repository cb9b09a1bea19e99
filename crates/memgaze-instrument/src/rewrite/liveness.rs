//! Which general-purpose registers and status flags are dead before each
//! instruction of a function: a probe may then use them without saving.
//!
//! Classic backward dataflow over the basic blocks of
//! [`FunctionCode`], conservative wherever the CFG is open: calls read
//! every register (arguments are unknown, `al` counts vector arguments of
//! variadic calls), returns and tail calls read every register (the caller's
//! callee-saved ones and return values) but no flags (the ABI does not pass
//! flags), and anything unknown (unresolved indirect jumps, traps, undecoded
//! bytes, `syscall`) reads everything.

use crate::binary::usage::{self, OperandUse, RegisterFold};
use crate::binary::{BasicBlock, FunctionCode, IndirectJumpKind, Terminator};
use iced_x86::{
    Code, FlowControl, Instruction, InstructionInfoFactory, InstructionInfoOptions, OpAccess,
    OpKind, Register,
};

/// A set of the 16 general-purpose registers (bit = iced register number −
/// `RAX`) and the six status flags (bits 16–21).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub(crate) struct RegSet(pub u32);

/// The status flags as one unit of `RegSet`.
pub(crate) const FLAGS: u32 = 0x3f << 16;
/// Every general-purpose register.
pub(crate) const ALL_GPRS: u32 = 0xffff;
const RSP_BIT: u32 = 1 << 4;

impl RegSet {
    /// Everything live.
    pub const ALL: RegSet = RegSet(ALL_GPRS | FLAGS);

    /// Whether `reg` (any width) is in the set.
    pub(crate) fn has_gpr(self, reg: Register) -> bool {
        gpr_bit(reg).is_some_and(|b| self.0 & b != 0)
    }

    /// Whether any status flag is in the set.
    pub(crate) fn has_flags(self) -> bool {
        self.0 & FLAGS != 0
    }
}

/// Bit of the 64-bit register containing `reg`, for general-purpose
/// registers.
pub(crate) fn gpr_bit(reg: Register) -> Option<u32> {
    let full = reg.full_register();
    if full.is_gpr64() {
        Some(1 << (full as u32 - Register::RAX as u32))
    } else {
        None
    }
}

/// The status flags of iced's `rflags` in [`RegSet`]'s bits: iced numbers
/// OF, SF, ZF, AF, CF and PF as its bits 0–5, in the order of bits 16–21
/// here, so the six are moved as one field.
#[inline(always)]
fn flag_bits(rflags: u32) -> u32 {
    (rflags & 0x3f) << 16
}

/// Registers read (`uses`) and fully overwritten (`defs`) by one instruction.
/// Inlined into the function's one loop over its instructions: as a call it
/// cost a sixth of its own work in saving and restoring registers.
#[inline(always)]
fn transfer(insn: &Instruction, cache: &mut TransferCache) -> (u32, u32) {
    let CodeEntry { facts, operand_use } = cache.codes[insn.code() as usize];
    if let Some(fixed) = facts.fixed() {
        return fixed;
    }
    let (uses, defs) = cache.gpr_transfer_of(insn, operand_use);
    let (read, modified) = facts.flags().unwrap_or_else(|| iced_flags(insn));
    (uses | read, defs | modified)
}

/// The transfer of the codes whose registers are no function of their
/// operands (calls, returns, traps, system calls, undecoded bytes), or
/// `None`: what [`transfer`] answers before it looks at the operands.
fn fixed_transfer(code: Code) -> Option<(u32, u32)> {
    match code.flow_control() {
        FlowControl::Call | FlowControl::IndirectCall => return Some((ALL_GPRS, FLAGS)),
        FlowControl::Return => return Some((ALL_GPRS, FLAGS)),
        FlowControl::Interrupt | FlowControl::Exception => return Some((ALL_GPRS | FLAGS, 0)),
        _ => {}
    }
    matches!(code, Code::Syscall | Code::Sysenter | Code::INVALID).then_some((ALL_GPRS | FLAGS, 0))
}

/// The status flags `insn` reads and modifies, as iced reports them, in
/// [`RegSet`]'s bits.
fn iced_flags(insn: &Instruction) -> (u32, u32) {
    (
        flag_bits(insn.rflags_read()),
        flag_bits(insn.rflags_modified()),
    )
}

/// What [`transfer`] needs of an instruction's code, looked up once per
/// instruction instead of iced's flow control and its two flag tables:
/// a [`fixed_transfer`], or the flags the code reads and modifies, or that
/// they depend on the instruction (a shift's or rotate's immediate count,
/// or `xor`/`sub` of a register with itself) and are asked of iced.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct CodeFacts(u16);

impl CodeFacts {
    /// Every register and flag read, none defined.
    const EVERYTHING: u16 = 1 << 15;
    /// Every register read, the flags defined (calls and returns).
    const CALL: u16 = 1 << 14;
    /// The flags depend on the instruction: ask iced.
    const ASK_FLAGS: u16 = 1 << 13;

    /// The facts of `code`, from iced's answers for instructions of it
    /// whose count immediates and register operands vary the ways iced's
    /// flags depend on.
    fn of(code: Code) -> CodeFacts {
        match fixed_transfer(code) {
            Some((uses, 0)) if uses == ALL_GPRS | FLAGS => return CodeFacts(Self::EVERYTHING),
            Some((ALL_GPRS, FLAGS)) => return CodeFacts(Self::CALL),
            Some(other) => unreachable!("no fixed transfer {other:?}"),
            None => {}
        }
        let variants = Self::flag_variants(code).map(|insn| iced_flags(&insn));
        if variants.iter().any(|&v| v != variants[0]) {
            return CodeFacts(Self::ASK_FLAGS);
        }
        let (read, modified) = variants[0];
        CodeFacts((read >> 16 | modified >> 10) as u16)
    }

    /// Instructions of `code`: iced's flags differ among them where they
    /// depend on anything but the code (an immediate count of 0, 1 or more;
    /// the same register as both operands or two others).
    fn flag_variants(code: Code) -> [Instruction; 4] {
        let mut variants = [Instruction::default(); 4];
        for (k, insn) in variants.iter_mut().enumerate() {
            insn.set_code(code);
            insn.set_op0_kind(OpKind::Register);
            insn.set_op1_kind(OpKind::Register);
            insn.set_op0_register(Register::RCX);
            insn.set_op1_register(if k == 0 { Register::RCX } else { Register::RDX });
            insn.set_immediate8(k.saturating_sub(1) as u8);
        }
        variants
    }

    /// The transfer of a code with a fixed one.
    #[inline(always)]
    fn fixed(self) -> Option<(u32, u32)> {
        if self.0 & Self::EVERYTHING != 0 {
            Some((ALL_GPRS | FLAGS, 0))
        } else if self.0 & Self::CALL != 0 {
            Some((ALL_GPRS, FLAGS))
        } else {
            None
        }
    }

    /// The flags read and modified, in [`RegSet`]'s bits, unless they are
    /// asked of iced.
    #[inline(always)]
    fn flags(self) -> Option<(u32, u32)> {
        let bits = u32::from(self.0);
        (self.0 & Self::ASK_FLAGS == 0).then_some(((bits & 0x3f) << 16, (bits >> 6 & 0x3f) << 16))
    }
}

/// What [`transfer`] looks up of an instruction's code, in one entry:
/// [`usage::operand_use`]'s own table, asked apart, was a second lookup
/// (and an initialisation check) an instruction.
#[derive(Clone, Copy, Debug)]
struct CodeEntry {
    facts: CodeFacts,
    /// [`usage::operand_use`] of the code.
    operand_use: Option<OperandUse>,
}

/// [`CodeEntry`] of every code, by code number.
static CODE_ENTRIES: std::sync::LazyLock<Box<[CodeEntry]>> = std::sync::LazyLock::new(|| {
    Code::values()
        .map(|code| CodeEntry {
            facts: CodeFacts::of(code),
            operand_use: usage::operand_use(code),
        })
        .collect()
});

/// The general-purpose registers of [`transfer`] for an instruction that
/// falls through: `.0` those it reads or writes only partly or
/// conditionally (used), `.1` those it replaces wholly (defined).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct GprTransfer(u32, u32);

impl RegisterFold for GprTransfer {
    #[inline(always)]
    fn add(&mut self, reg: Register, access: OpAccess) {
        // Only 32- and 64-bit writes replace the whole register.
        let Some((bit, whole)) = usage::gpr_bit_and_whole(reg) else {
            return;
        };
        let bit = u32::from(bit);
        match access {
            OpAccess::Read | OpAccess::CondRead => self.0 |= bit,
            OpAccess::Write if whole => self.1 |= bit,
            OpAccess::ReadWrite if whole => {
                self.0 |= bit;
                self.1 |= bit;
            }
            OpAccess::Write
            | OpAccess::ReadWrite
            | OpAccess::CondWrite
            | OpAccess::ReadCondWrite => self.0 |= bit,
            OpAccess::None | OpAccess::NoMemAccess => {}
        }
    }
}

/// [`GprTransfer`] of iced's register usage.
fn iced_gpr_transfer(info: &mut InstructionInfoFactory, insn: &Instruction) -> GprTransfer {
    // Register usage alone: iced lists a memory operand's base and index
    // among the registers either way, and the memory list is not read.
    let facts = info.info_options(insn, InstructionInfoOptions::NO_MEMORY_USAGE);
    GprTransfer::of_iced(facts.used_registers())
}

/// [`GprTransfer`] by instruction, with the answers for the shapes
/// met last kept: iced's register usage per instruction was most of the
/// analysis, and a function's instructions repeat a few shapes (same code,
/// operands and registers, other displacements and immediates).
///
/// What iced reports of the registers (the flags are not asked of it) is a
/// function of what `Instruction`'s
/// `==` compares, less a memory operand's displacement and the immediates
/// of immediate operands, which only address memory or are data (the one
/// immediate that counts, `enter`'s nesting level, is `Immediate8_2nd` and
/// kept): [`shape`] clears those.
struct TransferCache {
    info: InstructionInfoFactory,
    /// [`CODE_ENTRIES`], read without its initialisation check.
    codes: &'static [CodeEntry],
    /// Direct-mapped by hash, a newer shape replacing the one in its slot;
    /// an empty slot holds an invalid instruction, which no query has.
    slots: Box<[(Instruction, (u32, u32))]>,
}

impl TransferCache {
    /// Slots of the cache (a power of two).
    const SLOTS: usize = 2048;

    fn new() -> Self {
        TransferCache {
            info: InstructionInfoFactory::new(),
            codes: &CODE_ENTRIES,
            slots: vec![(Instruction::default(), (0, 0)); Self::SLOTS].into_boxed_slice(),
        }
    }

    /// [`GprTransfer`] of `insn` (valid), as `(uses, defs)`.
    #[cfg(test)]
    fn gpr_transfer(&mut self, insn: &Instruction) -> (u32, u32) {
        self.gpr_transfer_of(insn, usage::operand_use(insn.code()))
    }

    /// [`GprTransfer`] of `insn` (valid), whose code's
    /// [`usage::operand_use`] is `operand_use`, as `(uses, defs)`.
    #[inline(always)]
    fn gpr_transfer_of(
        &mut self,
        insn: &Instruction,
        operand_use: Option<OperandUse>,
    ) -> (u32, u32) {
        // The common codes from their operands, the rest through the cache.
        match operand_use.and_then(|u| usage::direct_registers_of(insn, u)) {
            Some(GprTransfer(uses, defs)) => (uses, defs),
            None => self.shaped_gpr_transfer(insn),
        }
    }

    /// [`Self::gpr_transfer_of`] of an instruction not answered directly, kept
    /// out of line so that the common path stays small where it is inlined.
    #[inline(never)]
    fn shaped_gpr_transfer(&mut self, insn: &Instruction) -> (u32, u32) {
        let shape = shape(insn);
        let slot = &mut self.slots[Self::slot_of(&shape)];
        if slot.0 == shape {
            return slot.1;
        }
        let GprTransfer(uses, defs) = iced_gpr_transfer(&mut self.info, &shape);
        let answer = (uses, defs);
        *slot = (shape, answer);
        answer
    }

    /// The slot of `shape`, from the fields that tell most shapes apart
    /// (`==` on a hit compares all of them).
    fn slot_of(shape: &Instruction) -> usize {
        use std::hash::BuildHasher;
        let fields = super::distinguishing_fields(shape);
        let hash = foldhash::fast::FixedState::with_seed(0).hash_one(fields);
        hash as usize & (Self::SLOTS - 1)
    }
}

/// `insn` with a memory operand's displacement and the immediates of its
/// immediate operands (branch targets included) zeroed: see
/// [`TransferCache`].
fn shape(insn: &Instruction) -> Instruction {
    let mut shape = *insn;
    for k in 0..insn.op_count() {
        match insn.op_kind(k) {
            OpKind::Memory => shape.set_memory_displacement64(0),
            OpKind::Immediate8
            | OpKind::Immediate16
            | OpKind::Immediate32
            | OpKind::Immediate8to16
            | OpKind::Immediate8to32
            | OpKind::Immediate8to64
            | OpKind::Immediate32to64 => shape.set_immediate32(0),
            OpKind::Immediate64 => shape.set_immediate64(0),
            OpKind::NearBranch16 | OpKind::NearBranch32 | OpKind::NearBranch64 => {
                shape.set_near_branch64(0)
            }
            _ => {}
        }
    }
    shape
}

thread_local! {
    /// The worker thread's [`TransferCache`], kept from one function to the
    /// next (a function's own shapes are too few to fill one).
    static TRANSFER_CACHE: std::cell::RefCell<Option<TransferCache>> =
        const { std::cell::RefCell::new(None) };
}

/// The lists [`live_before`] fills and drops, kept per thread from one
/// function to the next (made anew, they were three allocations per
/// function planned).
#[derive(Default)]
struct LivenessBuffers {
    /// Per instruction, its (uses, defs).
    transfers: Vec<(u32, u32)>,
    /// Per block, what escapes the function at its end.
    exit_live: Vec<u32>,
    /// Per block, what is live at its entry.
    live_in: Vec<u32>,
    /// Per block, its instructions' transfers composed ([`BlockTransfer`]).
    block_transfers: Vec<BlockTransfer>,
    /// Per block, whether the fixed point visits it again.
    dirty: Vec<bool>,
}

/// A block's instructions' transfers composed into one: live at its entry
/// is `uses | (live at its end & !defs)`. The fixed point is iterated over
/// these, a step per block instead of one per instruction.
#[derive(Clone, Copy, Default)]
struct BlockTransfer {
    /// Read before any instruction of the block writes them.
    uses: u32,
    /// Written by some instruction of the block.
    defs: u32,
}

impl BlockTransfer {
    /// This transfer followed by an instruction's `(uses, defs)`: composed
    /// forwards, as the instructions' transfers are found, rather than in a
    /// second pass over them.
    #[inline(always)]
    fn then(self, (uses, defs): (u32, u32)) -> BlockTransfer {
        BlockTransfer {
            uses: self.uses | (uses & !self.defs),
            defs: self.defs | defs,
        }
    }

    /// Live at the block's entry, given `live` at its end.
    fn live_before(self, live: u32) -> u32 {
        self.uses | (live & !self.defs)
    }
}

thread_local! {
    static LIVENESS_BUFFERS: std::cell::RefCell<LivenessBuffers> =
        std::cell::RefCell::default();
}

/// Live registers and flags before every instruction of `code`.
pub(crate) fn live_before(code: &FunctionCode) -> Vec<RegSet> {
    LIVENESS_BUFFERS.with_borrow_mut(|bufs| live_before_in(code, bufs))
}

/// What block `b` of `code` leaves live beyond the function at its end
/// (all registers at a return or a jump out: liveness treats a return as
/// reading every register).
fn live_at_exit(code: &FunctionCode, b: &BasicBlock) -> u32 {
    // The last instruction is looked up only for the rare ends that ask
    // about it, not for every block.
    let last = || &code.instructions[b.last()];
    match b.terminator {
        Terminator::FallThrough | Terminator::Jump | Terminator::Conditional | Terminator::Call => {
            0
        }
        Terminator::Return => ALL_GPRS,
        Terminator::TailCall => {
            ALL_GPRS
                | if last().flow_control() == FlowControl::ConditionalBranch {
                    FLAGS
                } else {
                    0
                }
        }
        Terminator::IndirectJump => {
            let ip = last().ip();
            let kind = code
                .indirect_jumps
                .iter()
                .find(|j| j.ip == ip)
                .map(|j| j.kind);
            match kind {
                Some(IndirectJumpKind::JumpTable(t)) => {
                    // Targets outside the function are exits.
                    let leaves = code.jump_tables[t]
                        .targets
                        .iter()
                        .any(|&x| x < code.start || x >= code.end);
                    if leaves { ALL_GPRS | FLAGS } else { 0 }
                }
                Some(IndirectJumpKind::TailCall) => ALL_GPRS,
                _ => ALL_GPRS | FLAGS,
            }
        }
        Terminator::Trap | Terminator::Invalid | Terminator::End => ALL_GPRS | FLAGS,
    }
}

/// [`live_before`] with the thread's buffers.
fn live_before_in(code: &FunctionCode, bufs: &mut LivenessBuffers) -> Vec<RegSet> {
    let n = code.instructions.len();
    block_transfers_into(code, bufs);
    bufs.live_in.clear();
    bufs.live_in.resize(code.blocks.len(), 0);
    // Slices from here: indexing through the buffers' `Vec`s reloaded
    // their lengths in the loops below.
    let (transfers, exit_live) = (&bufs.transfers[..], &bufs.exit_live[..]);
    let block_transfers = &bufs.block_transfers[..];
    let live_in = &mut bufs.live_in[..];
    // Live at block `b`'s end: what leaves the function there and what its
    // successors need.
    let live_at_end = |b: usize, live_in: &[u32]| -> u32 {
        let successors = code.blocks[b].successors.iter();
        successors.fold(exit_live[b], |live, &s| live | live_in[s as usize])
    };
    // Iterate to a fixed point, visiting blocks in reverse order (most
    // successors come later in address order). The first round sees every
    // successor final but across an edge to the same or an earlier block:
    // only the sources of such edges are visited again, and after that only
    // the predecessors of a block whose live set grew (every other block
    // would find what it holds; whole rounds of those were most of the
    // iteration's visits).
    let dirty = &mut bufs.dirty;
    dirty.clear();
    dirty.resize(code.blocks.len(), false);
    // One past the highest block to visit again.
    let mut top = 0;
    for b in (0..code.blocks.len()).rev() {
        let successors = code.blocks[b].successors.iter();
        if successors.clone().any(|&s| s as usize <= b) {
            dirty[b] = true;
            top = top.max(b + 1);
        }
        live_in[b] = block_transfers[b].live_before(live_at_end(b, live_in));
    }
    while top > 0 {
        let end = std::mem::take(&mut top);
        for b in (0..end).rev() {
            if !std::mem::take(&mut dirty[b]) {
                continue;
            }
            let new = block_transfers[b].live_before(live_at_end(b, live_in));
            if new != live_in[b] {
                live_in[b] = new;
                // Earlier predecessors are visited later in this round,
                // the others in the next.
                for &p in &code.blocks[b].predecessors {
                    dirty[p as usize] = true;
                    if p as usize >= b {
                        top = top.max(p as usize + 1);
                    }
                }
            }
        }
    }
    let mut out = vec![RegSet::ALL; n];
    for (b, block) in code.blocks.iter().enumerate() {
        let mut live = live_at_end(b, live_in);
        let range = block.instructions();
        // Zipped slices: indexing both lists checked two bounds an
        // instruction.
        for (out, &(uses, defs)) in (out[range.clone()].iter_mut()).zip(&transfers[range]).rev() {
            live = (live & !defs) | uses;
            *out = RegSet(live | RSP_BIT);
        }
    }
    out
}

/// Fills `bufs`' per-instruction transfers and per-block composed
/// transfers and exits of `code`, in one pass over its blocks (they cover
/// its instructions in order).
fn block_transfers_into(code: &FunctionCode, bufs: &mut LivenessBuffers) {
    let LivenessBuffers {
        transfers,
        exit_live,
        block_transfers,
        ..
    } = bufs;
    transfers.clear();
    transfers.resize(code.instructions.len(), (0, 0));
    exit_live.clear();
    exit_live.reserve(code.blocks.len());
    block_transfers.clear();
    block_transfers.reserve(code.blocks.len());
    TRANSFER_CACHE.with_borrow_mut(|cache| {
        let cache = cache.get_or_insert_with(TransferCache::new);
        for block in &code.blocks {
            let range = block.instructions();
            let mut composed = BlockTransfer::default();
            for (slot, insn) in (transfers[range.clone()].iter_mut()).zip(&code.instructions[range])
            {
                *slot = transfer(insn, cache);
                composed = composed.then(*slot);
            }
            block_transfers.push(composed);
            exit_live.push(live_at_exit(code, block));
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::binary::{FlatMemory, FunctionCode};
    use iced_x86::RflagsBits;

    /// The fixed point iterated an instruction at a time, each block's
    /// instructions walked at every step: the reference for the block
    /// transfers' iteration.
    fn live_before_by_instruction(code: &FunctionCode) -> Vec<RegSet> {
        let mut cache = TransferCache::new();
        let transfers: Vec<(u32, u32)> = (code.instructions.iter())
            .map(|insn| transfer(insn, &mut cache))
            .collect();
        let live_after_block = |b: usize, live_in: &[u32]| {
            let block = &code.blocks[b];
            let successors = block.successors.iter().map(|&s| live_in[s as usize]);
            successors.fold(live_at_exit(code, block), |live, s| live | s)
        };
        let mut live_in = vec![0u32; code.blocks.len()];
        let mut changed = true;
        while changed {
            changed = false;
            for b in 0..code.blocks.len() {
                let mut live = live_after_block(b, &live_in);
                for i in code.blocks[b].instructions().rev() {
                    live = (live & !transfers[i].1) | transfers[i].0;
                }
                changed |= live != live_in[b];
                live_in[b] = live;
            }
        }
        let mut out = vec![RegSet::ALL; code.instructions.len()];
        for b in 0..code.blocks.len() {
            let mut live = live_after_block(b, &live_in);
            for i in code.blocks[b].instructions().rev() {
                live = (live & !transfers[i].1) | transfers[i].0;
                out[i] = RegSet(live | RSP_BIT);
            }
        }
        out
    }

    /// Liveness iterated over the blocks' composed transfers is the
    /// per-instruction fixed point, on every function of this test
    /// executable (loops, jump tables and tail calls among them).
    #[test]
    fn block_transfers_reach_the_per_instruction_fixed_point() {
        let binary = crate::binary::Binary::open(std::env::current_exe().unwrap()).unwrap();
        let mut blocks = 0;
        for function in binary.functions() {
            let code = binary.function_code(function);
            blocks += code.blocks.len();
            assert_eq!(
                live_before(&code),
                live_before_by_instruction(&code),
                "function at {:#x}",
                code.start
            );
        }
        assert!(blocks > 10_000, "only {blocks} blocks compared");
    }

    fn code(bytes: &[u8]) -> FunctionCode {
        let memory = FlatMemory {
            base: 0x1000,
            bytes,
        };
        FunctionCode::build(bytes, 0x1000, &memory)
    }

    /// [`TransferCache`] on the instructions of pseudo-random bytes: every
    /// answer is iced's for the instruction itself, hits included (and
    /// there are hits of other displacements and immediates).
    #[test]
    fn cached_transfers_are_iceds() {
        let insns = crate::binary::random_instructions(0x2d35_8dcc_aa6c_78a5, 1 << 20);
        let mut info = InstructionInfoFactory::new();
        let mut cache = TransferCache::new();
        let mut shapes = std::collections::HashSet::new();
        let mut reshaped_hits = 0;
        for insn in insns.iter().filter(|i| !i.is_invalid()) {
            let shape = shape(insn);
            let held = cache.slots[TransferCache::slot_of(&shape)].0 == shape;
            reshaped_hits += usize::from(held && shape != *insn);
            shapes.insert(shape);
            assert_eq!(
                cache.gpr_transfer(insn),
                {
                    let GprTransfer(uses, defs) = iced_gpr_transfer(&mut info, insn);
                    (uses, defs)
                },
                "{insn}"
            );
        }
        assert!(
            reshaped_hits > 50_000,
            "{reshaped_hits} hits of a changed shape"
        );
        assert!(shapes.len() > 20_000, "{} shapes", shapes.len());
    }

    /// [`GprTransfer`] is a summary of [`usage::GprEffects`] (used: read
    /// or kept, defined: replaced), so `direct_usage_is_iceds` holds for it
    /// too: checked on iced's lists and the direct answers of the
    /// instructions of pseudo-random bytes.
    #[test]
    fn transfers_summarise_the_register_effects() {
        let insns = crate::binary::random_instructions(0x6a09_e667_f3bc_c908, 1 << 18);
        let mut info = InstructionInfoFactory::new();
        let summary =
            |e: usage::GprEffects| GprTransfer(u32::from(e.read | e.kept), u32::from(e.replaced));
        let mut direct = 0;
        for insn in insns.iter().filter(|i| !i.is_invalid()) {
            let used = info.info(insn).used_registers();
            assert_eq!(
                GprTransfer::of_iced(used),
                summary(usage::GprEffects::of_iced(used)),
                "{insn}"
            );
            if let Some(effects) = usage::direct_gpr_effects(insn) {
                assert_eq!(
                    usage::direct_registers(insn),
                    Some(summary(effects)),
                    "{insn}"
                );
                direct += 1;
            }
        }
        assert!(direct > 1_000, "{direct} answered directly");
    }

    /// [`transfer`] asked of iced's flow control and flags for each
    /// instruction: the reference for [`CodeFacts`].
    fn transfer_by_iced(insn: &Instruction, cache: &mut TransferCache) -> (u32, u32) {
        match insn.flow_control() {
            FlowControl::Call | FlowControl::IndirectCall => return (ALL_GPRS, FLAGS),
            FlowControl::Return => return (ALL_GPRS, FLAGS),
            FlowControl::Interrupt | FlowControl::Exception => return (ALL_GPRS | FLAGS, 0),
            _ => {}
        }
        if matches!(insn.code(), Code::Syscall | Code::Sysenter) || insn.is_invalid() {
            return (ALL_GPRS | FLAGS, 0);
        }
        let (uses, defs) = cache.gpr_transfer(insn);
        (
            uses | flag_bits(insn.rflags_read()),
            defs | flag_bits(insn.rflags_modified()),
        )
    }

    /// [`transfer`] through [`CodeFacts`] is [`transfer_by_iced`] on the
    /// instructions of pseudo-random bytes and on every code's instructions
    /// of varied counts and operands, and shifts by an immediate ask iced
    /// for their flags.
    #[test]
    fn code_facts_give_iceds_transfer() {
        let mut cache = TransferCache::new();
        let mut reference = TransferCache::new();
        let random = crate::binary::random_instructions(0x510e_527f_ade6_82d1, 1 << 20);
        let mut shifts = random.clone();
        for insn in random.iter().filter(|i| i.op_kind(1) == OpKind::Immediate8) {
            for count in [0, 1, 2, 9, 17, 31, 32, 63, 64, 255] {
                let mut varied = *insn;
                varied.set_immediate8(count);
                shifts.push(varied);
            }
        }
        let variants = Code::values().flat_map(CodeFacts::flag_variants);
        for insn in shifts.iter().copied().chain(variants) {
            assert_eq!(
                transfer(&insn, &mut cache),
                transfer_by_iced(&insn, &mut reference),
                "{insn} ({:?})",
                insn.code()
            );
        }
        let asks = |code| CODE_ENTRIES[code as usize].facts == CodeFacts(CodeFacts::ASK_FLAGS);
        assert!(asks(Code::Shl_rm64_imm8) && asks(Code::Sar_rm32_imm8));
        assert!(!asks(Code::Shl_rm64_CL) && !asks(Code::Add_r64_rm64));
    }

    /// [`flag_bits`] places each of iced's six status flags on its own bit
    /// and ignores every other flag iced reports.
    #[test]
    fn flag_bits_place_each_status_flag() {
        let order = [
            RflagsBits::OF,
            RflagsBits::SF,
            RflagsBits::ZF,
            RflagsBits::AF,
            RflagsBits::CF,
            RflagsBits::PF,
        ];
        for rflags in 0..1u32 << 12 {
            let expected = (order.iter().enumerate())
                .filter(|&(_, &f)| rflags & f != 0)
                .fold(0, |bits, (i, _)| bits | 1 << (16 + i));
            assert_eq!(flag_bits(rflags), expected, "{rflags:#x}");
        }
        assert_eq!(flag_bits(u32::MAX), FLAGS);
    }

    #[test]
    fn a_shift_by_zero_changes_no_flags_though_one_by_one_does() {
        // 0: cmp rdi, rsi   3: shl rax, 0   7: jne +0   9: shl rax, 1   13: jne +0   15: ret
        let c = code(&[
            0x48, 0x39, 0xf7, 0x48, 0xc1, 0xe0, 0x00, 0x75, 0x00, 0x48, 0xc1, 0xe0, 0x01, 0x75,
            0x00, 0xc3,
        ]);
        let live = live_before(&c);
        assert!(live[1].has_flags(), "shl by 0 leaves cmp's flags for jne");
        assert!(!live[3].has_flags(), "shl by 1 sets the flags jne reads");
    }

    #[test]
    fn load_destination_is_dead_before_the_load_and_flags_before_a_cmp() {
        // 0: mov eax, [rdi+rcx*4]   3: add eax, 1   6: cmp eax, esi   8: ret
        let c = code(&[0x8b, 0x04, 0x8f, 0x83, 0xc0, 0x01, 0x39, 0xf0, 0xc3]);
        let live = live_before(&c);
        assert!(!live[0].has_gpr(Register::RAX));
        assert!(live[0].has_gpr(Register::RDI));
        assert!(live[0].has_gpr(Register::RCX));
        assert!(!live[0].has_flags(), "add overwrites the flags");
        // Returns read every register.
        assert!(live[3].has_gpr(Register::RDX));
    }

    #[test]
    fn flags_read_by_a_later_branch_are_live() {
        // 0: cmp rdi, rsi   3: mov rax, [rdx]   6: jne +1   8: ret   9: ret
        let c = code(&[0x48, 0x39, 0xf7, 0x48, 0x8b, 0x02, 0x75, 0x01, 0xc3, 0xc3]);
        let live = live_before(&c);
        assert!(live[1].has_flags());
        assert!(!live[1].has_gpr(Register::RAX));
    }

    #[test]
    fn a_branch_into_another_function_keeps_everything_live() {
        // 0: mov rax, [rdi]   3: test rax, rax   6: js 0xf0c (a `.cold`
        // part, below the function)   12: xor ebx, ebx   14: ret
        let c = code(&[
            0x48, 0x8b, 0x07, 0x48, 0x85, 0xc0, 0x0f, 0x88, 0x00, 0xff, 0xff, 0xff, 0x31, 0xdb,
            0xc3,
        ]);
        let live = live_before(&c);
        // Dead on the fall-through alone (xor writes it); the other
        // function may read it.
        assert!(live[0].has_gpr(Register::RBX));
        assert!(live[2].has_gpr(Register::RBX));
        assert!(!live[3].has_gpr(Register::RBX));
    }

    #[test]
    fn partial_writes_keep_the_register_live() {
        // 0: mov al, [rdi]   2: ret
        let c = code(&[0x8a, 0x07, 0xc3]);
        assert!(live_before(&c)[0].has_gpr(Register::RAX));
    }

    #[test]
    fn calls_keep_everything_live() {
        // 0: mov rax, [rdi]  3: call +0  8: ret
        let c = code(&[0x48, 0x8b, 0x07, 0xe8, 0x00, 0x00, 0x00, 0x00, 0xc3]);
        let live = live_before(&c);
        assert!(!live[0].has_gpr(Register::RAX), "the load writes rax");
        assert!(live[1].has_gpr(Register::R11));
    }
}
