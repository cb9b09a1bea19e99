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

use crate::binary::{FunctionCode, IndirectJumpKind, Terminator};
use iced_x86::{
    Code, FlowControl, Instruction, InstructionInfoFactory, InstructionInfoOptions, OpAccess,
    OpKind, Register, RflagsBits,
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

fn flag_bits(rflags: u32) -> u32 {
    let mut out = 0;
    for (i, f) in [
        RflagsBits::OF,
        RflagsBits::SF,
        RflagsBits::ZF,
        RflagsBits::AF,
        RflagsBits::CF,
        RflagsBits::PF,
    ]
    .into_iter()
    .enumerate()
    {
        if rflags & f != 0 {
            out |= 1 << (16 + i);
        }
    }
    out
}

/// Registers read (`uses`) and fully overwritten (`defs`) by one instruction.
fn transfer(insn: &Instruction, cache: &mut TransferCache) -> (u32, u32) {
    match insn.flow_control() {
        FlowControl::Call | FlowControl::IndirectCall => return (ALL_GPRS, FLAGS),
        FlowControl::Return => return (ALL_GPRS, FLAGS),
        FlowControl::Interrupt | FlowControl::Exception => return (ALL_GPRS | FLAGS, 0),
        _ => {}
    }
    if matches!(insn.code(), Code::Syscall | Code::Sysenter) || insn.is_invalid() {
        return (ALL_GPRS | FLAGS, 0);
    }
    // The flags from the instruction itself: a shift by an immediate
    // count of 0 changes none, so they are no function of its shape.
    let (uses, defs) = cache.gpr_transfer(insn);
    (
        uses | flag_bits(insn.rflags_read()),
        defs | flag_bits(insn.rflags_modified()),
    )
}

/// The general-purpose registers of [`transfer`] for an instruction that
/// falls through, from iced's register usage.
fn gpr_transfer(insn: &Instruction, info: &mut InstructionInfoFactory) -> (u32, u32) {
    // Register usage alone: iced lists a memory operand's base and index
    // among the registers either way, and the memory list is not read.
    let facts = info.info_options(insn, InstructionInfoOptions::NO_MEMORY_USAGE);
    let (mut uses, mut defs) = (0, 0);
    for used in facts.used_registers() {
        fold_gpr_use(used.register(), used.access(), &mut uses, &mut defs);
    }
    (uses, defs)
}

/// How [`direct_gpr_transfer`] reads the explicit operands of a code.
#[derive(Clone, Copy)]
enum OperandUse {
    /// The first operand is written and the second read.
    WriteRead,
    /// The first operand is read and written, the second read.
    ReadWriteRead,
    /// Both operands are read.
    ReadRead,
    /// `xor` and `sub`: as `ReadWriteRead`, but a register with itself is
    /// only written (iced's clearing idiom).
    ClearingIdiom,
    /// `push r64`: the operand is read, `rsp` read and written.
    Push,
    /// `pop r64`: the operand is written, `rsp` read and written.
    Pop,
}

/// The operand use of the common codes whose general-purpose registers are
/// their explicit operands alone (plus `rsp` for push and pop), or `None`.
fn operand_use(code: Code) -> Option<OperandUse> {
    use Code::*;
    Some(match code {
        Mov_rm8_r8 | Mov_rm16_r16 | Mov_rm32_r32 | Mov_rm64_r64 | Mov_r8_rm8 | Mov_r16_rm16
        | Mov_r32_rm32 | Mov_r64_rm64 | Mov_r32_imm32 | Mov_r64_imm64 | Mov_rm8_imm8
        | Mov_rm16_imm16 | Mov_rm32_imm32 | Mov_rm64_imm32 | Movzx_r32_rm8 | Movzx_r32_rm16
        | Movzx_r64_rm8 | Movzx_r64_rm16 | Movsx_r32_rm8 | Movsx_r32_rm16 | Movsx_r64_rm8
        | Movsx_r64_rm16 | Movsxd_r64_rm32 | Lea_r32_m | Lea_r64_m => OperandUse::WriteRead,
        Add_rm8_r8 | Add_rm32_r32 | Add_rm64_r64 | Add_r8_rm8 | Add_r32_rm32 | Add_r64_rm64
        | Add_AL_imm8 | Add_EAX_imm32 | Add_RAX_imm32 | Add_rm8_imm8 | Add_rm32_imm8
        | Add_rm64_imm8 | Add_rm32_imm32 | Add_rm64_imm32 | And_rm8_r8 | And_rm32_r32
        | And_rm64_r64 | And_r8_rm8 | And_r32_rm32 | And_r64_rm64 | And_AL_imm8 | And_EAX_imm32
        | And_RAX_imm32 | And_rm8_imm8 | And_rm32_imm8 | And_rm64_imm8 | And_rm32_imm32
        | And_rm64_imm32 | Or_rm8_r8 | Or_rm32_r32 | Or_rm64_r64 | Or_r8_rm8 | Or_r32_rm32
        | Or_r64_rm64 | Or_AL_imm8 | Or_EAX_imm32 | Or_RAX_imm32 | Or_rm8_imm8 | Or_rm32_imm8
        | Or_rm64_imm8 | Or_rm32_imm32 | Or_rm64_imm32 | Imul_r32_rm32 | Imul_r64_rm64 => {
            OperandUse::ReadWriteRead
        }
        Xor_rm8_r8 | Xor_rm32_r32 | Xor_rm64_r64 | Xor_r8_rm8 | Xor_r32_rm32 | Xor_r64_rm64
        | Xor_AL_imm8 | Xor_EAX_imm32 | Xor_RAX_imm32 | Xor_rm8_imm8 | Xor_rm32_imm8
        | Xor_rm64_imm8 | Xor_rm32_imm32 | Xor_rm64_imm32 | Sub_rm8_r8 | Sub_rm32_r32
        | Sub_rm64_r64 | Sub_r8_rm8 | Sub_r32_rm32 | Sub_r64_rm64 | Sub_AL_imm8 | Sub_EAX_imm32
        | Sub_RAX_imm32 | Sub_rm8_imm8 | Sub_rm32_imm8 | Sub_rm64_imm8 | Sub_rm32_imm32
        | Sub_rm64_imm32 => OperandUse::ClearingIdiom,
        Cmp_rm8_r8 | Cmp_rm16_r16 | Cmp_rm32_r32 | Cmp_rm64_r64 | Cmp_r8_rm8 | Cmp_r32_rm32
        | Cmp_r64_rm64 | Cmp_AL_imm8 | Cmp_EAX_imm32 | Cmp_RAX_imm32 | Cmp_rm8_imm8
        | Cmp_rm16_imm8 | Cmp_rm32_imm8 | Cmp_rm64_imm8 | Cmp_rm16_imm16 | Cmp_rm32_imm32
        | Cmp_rm64_imm32 | Test_rm8_r8 | Test_rm16_r16 | Test_rm32_r32 | Test_rm64_r64
        | Test_AL_imm8 | Test_EAX_imm32 | Test_RAX_imm32 | Test_rm8_imm8 | Test_rm32_imm32
        | Test_rm64_imm32 => OperandUse::ReadRead,
        Push_r64 => OperandUse::Push,
        Pop_r64 => OperandUse::Pop,
        _ => return None,
    })
}

/// [`gpr_transfer`] of the codes [`operand_use`] knows, from the decoded
/// operands instead of iced's register usage (most instructions are of a
/// few such codes, and iced's general tables cost ten times as much);
/// `None` for the rest.
fn direct_gpr_transfer(insn: &Instruction) -> Option<(u32, u32)> {
    let operand_use = operand_use(insn.code())?;
    let (mut uses, mut defs) = (0, 0);
    let mut add = |reg: Register, access: OpAccess| fold_gpr_use(reg, access, &mut uses, &mut defs);
    let (first, second) = match operand_use {
        OperandUse::WriteRead => (OpAccess::Write, OpAccess::Read),
        OperandUse::ReadWriteRead => (OpAccess::ReadWrite, OpAccess::Read),
        OperandUse::ReadRead => (OpAccess::Read, OpAccess::Read),
        OperandUse::ClearingIdiom => {
            let same_register = insn.op1_kind() == OpKind::Register
                && insn.op0_kind() == OpKind::Register
                && insn.op0_register() == insn.op1_register();
            if same_register {
                (OpAccess::Write, OpAccess::None)
            } else {
                (OpAccess::ReadWrite, OpAccess::Read)
            }
        }
        OperandUse::Push | OperandUse::Pop => {
            add(Register::RSP, OpAccess::ReadWrite);
            let access = match operand_use {
                OperandUse::Push => OpAccess::Read,
                _ => OpAccess::Write,
            };
            (access, OpAccess::None)
        }
    };
    for (k, access) in [(0, first), (1, second)] {
        if k >= insn.op_count() {
            break;
        }
        match insn.op_kind(k) {
            OpKind::Register => add(insn.op_register(k), access),
            OpKind::Memory => {
                // Base and index are read whatever the operand's access.
                add(insn.memory_base(), OpAccess::Read);
                add(insn.memory_index(), OpAccess::Read);
            }
            _ => {}
        }
    }
    Some((uses, defs))
}

/// Adds one register use of iced's kind to `uses` and `defs` (nothing for
/// a register outside the general-purpose ones).
fn fold_gpr_use(reg: Register, access: OpAccess, uses: &mut u32, defs: &mut u32) {
    let Some(bit) = gpr_bit(reg) else { return };
    // Only 32- and 64-bit writes replace the whole register.
    let whole = reg.size() >= 4;
    match access {
        OpAccess::Read | OpAccess::CondRead => *uses |= bit,
        OpAccess::Write if whole => *defs |= bit,
        OpAccess::Write | OpAccess::ReadWrite | OpAccess::CondWrite | OpAccess::ReadCondWrite => {
            *uses |= bit;
            if whole && access == OpAccess::ReadWrite {
                *defs |= bit;
            }
        }
        OpAccess::None | OpAccess::NoMemAccess => {}
    }
}

/// [`gpr_transfer`] by instruction, with the answers for the shapes
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
            slots: vec![(Instruction::default(), (0, 0)); Self::SLOTS].into_boxed_slice(),
        }
    }

    /// [`gpr_transfer`] of `insn` (valid).
    fn gpr_transfer(&mut self, insn: &Instruction) -> (u32, u32) {
        if let Some(answer) = direct_gpr_transfer(insn) {
            return answer;
        }
        let shape = shape(insn);
        let slot = &mut self.slots[Self::slot_of(&shape)];
        if slot.0 == shape {
            return slot.1;
        }
        let answer = gpr_transfer(&shape, &mut self.info);
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
}

thread_local! {
    static LIVENESS_BUFFERS: std::cell::RefCell<LivenessBuffers> =
        std::cell::RefCell::default();
}

/// Live registers and flags before every instruction of `code`.
pub(crate) fn live_before(code: &FunctionCode) -> Vec<RegSet> {
    LIVENESS_BUFFERS.with_borrow_mut(|bufs| live_before_in(code, bufs))
}

/// [`live_before`] with the thread's buffers.
fn live_before_in(code: &FunctionCode, bufs: &mut LivenessBuffers) -> Vec<RegSet> {
    let n = code.instructions.len();
    let transfers = &mut bufs.transfers;
    transfers.clear();
    TRANSFER_CACHE.with_borrow_mut(|cache| {
        let cache = cache.get_or_insert_with(TransferCache::new);
        transfers.extend((code.instructions.iter()).map(|insn| transfer(insn, cache)));
    });
    let exit_live = &mut bufs.exit_live;
    exit_live.clear();
    exit_live.extend(code.blocks.iter().map(|b| {
        let last = &code.instructions[b.last()];
        match b.terminator {
            Terminator::FallThrough
            | Terminator::Jump
            | Terminator::Conditional
            | Terminator::Call => 0,
            Terminator::Return => ALL_GPRS,
            Terminator::TailCall => {
                ALL_GPRS
                    | if last.flow_control() == FlowControl::ConditionalBranch {
                        FLAGS
                    } else {
                        0
                    }
            }
            Terminator::IndirectJump => {
                let kind = code
                    .indirect_jumps
                    .iter()
                    .find(|j| j.ip == last.ip())
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
    }));
    bufs.live_in.clear();
    bufs.live_in.resize(code.blocks.len(), 0);
    // Slices from here: indexing through the buffers' `Vec`s reloaded
    // their lengths in the loops below.
    let (transfers, exit_live) = (&bufs.transfers[..], &bufs.exit_live[..]);
    let live_in = &mut bufs.live_in[..];
    let block_in = |b: usize, live_in: &[u32]| -> u32 {
        let block = &code.blocks[b];
        let mut live = exit_live[b];
        for &s in &block.successors {
            live |= live_in[s as usize];
        }
        for i in block.instructions().rev() {
            let (uses, defs) = transfers[i];
            live = (live & !defs) | uses;
        }
        live
    };
    // Iterate to a fixed point, visiting blocks in reverse order (most
    // successors come later in address order).
    let mut changed = true;
    while changed {
        changed = false;
        for b in (0..code.blocks.len()).rev() {
            let new = block_in(b, live_in);
            if new != live_in[b] {
                live_in[b] = new;
                changed = true;
            }
        }
    }
    let mut out = vec![RegSet::ALL; n];
    for (b, block) in code.blocks.iter().enumerate() {
        let mut live = exit_live[b];
        for &s in &block.successors {
            live |= live_in[s as usize];
        }
        for i in block.instructions().rev() {
            let (uses, defs) = transfers[i];
            live = (live & !defs) | uses;
            out[i] = RegSet(live | RSP_BIT);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::binary::{FlatMemory, FunctionCode};

    fn code(bytes: &[u8]) -> FunctionCode {
        let memory = FlatMemory {
            base: 0x1000,
            bytes,
        };
        FunctionCode::build(bytes, 0x1000, &memory)
    }

    /// [`direct_gpr_transfer`] against iced on every encoding of the codes
    /// it covers: each REX prefix (and none, and operand size), each one-
    /// and two-byte opcode, each ModRM byte, and each SIB byte where the
    /// ModRM has one, so every register pair, base, index and the
    /// register-with-itself forms are met.
    #[test]
    fn direct_transfers_are_iceds() {
        let mut info = InstructionInfoFactory::new();
        let mut seen = std::collections::HashSet::new();
        let mut compared = 0usize;
        let mut compare = |bytes: &[u8], info: &mut InstructionInfoFactory| -> bool {
            let mut decoder =
                iced_x86::Decoder::with_ip(64, bytes, 0x1000, iced_x86::DecoderOptions::NONE);
            let insn = decoder.decode();
            let Some(direct) = direct_gpr_transfer(&insn) else {
                return false;
            };
            assert_eq!(
                direct,
                gpr_transfer(&insn, info),
                "{insn} ({:?})",
                insn.code()
            );
            seen.insert(insn.code());
            compared += 1;
            true
        };
        // No prefix, operand size, and the REX prefixes that pick other
        // registers (R, X, B) at either operand size.
        let prefixes: Vec<Vec<u8>> = std::iter::once(vec![])
            .chain(std::iter::once(vec![0x66]))
            .chain((0x40..=0x4fu8).map(|rex| vec![rex]))
            .collect();
        let tail = [0x11u8, 0x22, 0x33, 0x44, 0x55, 0x66, 0x77, 0x88, 0x99, 0xaa];
        for prefix in &prefixes {
            for escape in [None, Some(0x0fu8)] {
                for opcode in 0..=255u8 {
                    let mut bytes = prefix.to_vec();
                    bytes.extend(escape);
                    bytes.push(opcode);
                    let at = bytes.len();
                    let mut any = false;
                    for modrm in 0..=255u8 {
                        bytes.truncate(at);
                        bytes.push(modrm);
                        bytes.extend(tail);
                        any |= compare(&bytes, &mut info);
                    }
                    if !any {
                        continue;
                    }
                    for modrm in (0..=255u8).filter(|m| m >> 6 != 3 && m & 7 == 4) {
                        for sib in 0..=255u8 {
                            bytes.truncate(at);
                            bytes.extend([modrm, sib]);
                            bytes.extend(tail);
                            compare(&bytes, &mut info);
                        }
                    }
                }
            }
        }
        let uncovered: Vec<Code> = Code::values()
            .filter(|&c| operand_use(c).is_some() && !seen.contains(&c))
            .collect();
        assert!(uncovered.is_empty(), "codes never generated: {uncovered:?}");
        assert!(compared > 1_000_000, "{compared} instructions compared");
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
                gpr_transfer(insn, &mut info),
                "{insn}"
            );
        }
        assert!(
            reshaped_hits > 50_000,
            "{reshaped_hits} hits of a changed shape"
        );
        assert!(shapes.len() > 20_000, "{} shapes", shapes.len());
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
