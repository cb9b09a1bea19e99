//! Which general-purpose registers and memory an instruction reads and
//! writes: iced's instruction info, with the common codes (`mov`, `lea`,
//! `movzx`/`movsx`, `add`/`sub`/`and`/`or`/`xor`, `cmp`/`test`, `imul`,
//! `inc`/`dec`, shifts, `setcc`, `push`/`pop`, `call`/`ret`, jumps to a
//! displacement, the SSE moves) read from the decoded operands instead.
//! Most instructions are of those few codes, and iced's general tables
//! cost about ten times as much as reading the operands;
//! `direct_usage_is_iceds` compares both on every encoding of the codes
//! covered.

use iced_x86::{
    Code, CodeSize, Instruction, InstructionInfoFactory, InstructionInfoOptions, MemorySize,
    OpAccess, OpKind, Register, UsedMemory, UsedRegister,
};
use std::sync::LazyLock;

/// What an instruction does to the 16 general-purpose registers, a bit per
/// 64-bit register (bit = iced register number − `RAX`) whatever the width
/// it names.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct GprEffects {
    /// Registers read, conditionally or not.
    pub read: u16,
    /// Registers written in any way: wholly, partly or conditionally.
    pub written: u16,
    /// Registers whose whole value an unconditional 32- or 64-bit write
    /// replaces.
    pub replaced: u16,
    /// Registers written partly (8 or 16 bits) or conditionally: some of the
    /// old value may live on.
    pub kept: u16,
}

impl GprEffects {
    /// Whether the instruction writes `reg` (its full 64-bit register) in
    /// any way.
    pub(crate) fn writes(self, reg: Register) -> bool {
        gpr_bit(reg).is_some_and(|bit| self.written & bit != 0)
    }

    /// Registers read or written.
    pub(crate) fn used(self) -> u16 {
        self.read | self.written
    }

    /// Adds one register use of iced's kind (nothing for a register other
    /// than a general-purpose one).
    #[inline(always)]
    fn add(&mut self, reg: Register, access: OpAccess) {
        let Some((bit, whole)) = gpr_bit_and_whole(reg) else {
            return;
        };
        let (read, write, conditional) = match access {
            OpAccess::Read | OpAccess::CondRead => (true, false, false),
            OpAccess::Write => (false, true, false),
            OpAccess::ReadWrite => (true, true, false),
            OpAccess::CondWrite => (false, true, true),
            OpAccess::ReadCondWrite => (true, true, true),
            OpAccess::None | OpAccess::NoMemAccess => (false, false, false),
        };
        // Only unconditional 32- and 64-bit writes replace the whole
        // register. Masks rather than branches: the accesses vary from one
        // instruction to the next.
        let replaces = write && !conditional && whole;
        let mask = |on: bool| if on { bit } else { 0 };
        self.read |= mask(read);
        self.written |= mask(write);
        self.replaced |= mask(replaces);
        self.kept |= mask(write && !replaces);
    }
}

/// A fold of the register uses iced lists for an instruction, one at a
/// time: [`GprEffects`], or a caller's own summary of them (liveness keeps
/// two masks instead of four).
pub(crate) trait RegisterFold: Default {
    /// Adds one use of `reg` of iced's kind `access`.
    fn add(&mut self, reg: Register, access: OpAccess);

    /// The fold of iced's register list.
    fn of_iced(used: &[UsedRegister]) -> Self {
        let mut fold = Self::default();
        for u in used {
            fold.add(u.register(), u.access());
        }
        fold
    }
}

/// A fold that keeps no register: for the questions about memory alone,
/// whose register work then compiles away.
#[derive(Default)]
struct NoRegisters;

impl RegisterFold for NoRegisters {
    #[inline(always)]
    fn add(&mut self, _: Register, _: OpAccess) {}
}

impl RegisterFold for GprEffects {
    #[inline(always)]
    fn add(&mut self, reg: Register, access: OpAccess) {
        GprEffects::add(self, reg, access);
    }
}

/// Bit of the 64-bit register containing `reg`, for general-purpose
/// registers.
#[inline(always)]
pub(crate) fn gpr_bit(reg: Register) -> Option<u16> {
    gpr_bit_and_whole(reg).map(|(bit, _)| bit)
}

/// [`gpr_bit`] of `reg`, and whether a write of `reg` replaces its whole
/// 64-bit register (a 32- or 64-bit register), for general-purpose
/// registers.
#[inline(always)]
pub(crate) fn gpr_bit_and_whole(reg: Register) -> Option<(u16, bool)> {
    let facts = GPR_FACTS[reg as usize];
    (facts != 0).then_some((facts as u16, facts & WHOLE != 0))
}

/// [`GPR_FACTS`]' mark of a register whose write replaces the whole
/// 64-bit register.
const WHOLE: u32 = 1 << 16;

/// Per register number: the bit of its 64-bit register (low 16 bits) and
/// [`WHOLE`], 0 for registers other than general-purpose ones. One load
/// where iced looks up the full register and the size in its table of
/// register facts, each with a bounds check.
static GPR_FACTS: [u32; 256] = gpr_facts();

/// [`GPR_FACTS`], from iced's numbering: the 8-bit registers `al`–`bl`,
/// `ah`–`bh`, `spl`–`dil`, `r8l`–`r15l`, then the 16-, 32- and 64-bit ones
/// each in register order (checked against iced in `gpr_facts_are_iceds`).
const fn gpr_facts() -> [u32; 256] {
    let mut facts = [0u32; 256];
    let mut k = 0;
    while k < 20 {
        // `ah`–`bh` (4–7) are the second bytes of `rax`–`rbx`.
        let full = if k < 4 { k } else { k - 4 };
        facts[Register::AL as usize + k] = 1 << full;
        k += 1;
    }
    let mut k = 0;
    while k < 16 {
        facts[Register::AX as usize + k] = 1 << k;
        facts[Register::EAX as usize + k] = 1 << k | WHOLE;
        facts[Register::RAX as usize + k] = 1 << k | WHOLE;
        k += 1;
    }
    facts
}

/// How the covered codes use their explicit operands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum OperandUse {
    /// The first operand is written and the second read.
    WriteRead,
    /// The first operand is read and written, the second read.
    ReadWriteRead,
    /// Both operands are read.
    ReadRead,
    /// `xor` and `sub`: as `ReadWriteRead`, but a register with itself is
    /// only written (iced's clearing idiom).
    ClearingIdiom,
    /// `push r64` and `call rel32`: the operand is read, `rsp` read and
    /// written, the slot below the stack pointer written.
    Push,
    /// `pop r64` and `ret`: the operand is written, `rsp` read and
    /// written, the slot at the stack pointer read.
    Pop,
    /// Jumps to a displacement: their operand is no register or memory.
    Branch,
    /// `lea`: the first operand is written, the second's base and index
    /// read and no memory accessed.
    Lea,
}

/// [`listed_operand_use`] of every code, by code number: the match over the
/// listed codes compiles to a chain of comparisons, asked for every
/// instruction, where one byte is read here.
static OPERAND_USES: LazyLock<Box<[Option<OperandUse>]>> =
    LazyLock::new(|| Code::values().map(listed_operand_use).collect());

/// The operand use of the common codes whose general-purpose registers are
/// their explicit operands alone (plus `rsp` for push and pop), or `None`.
#[inline(always)]
pub(crate) fn operand_use(code: Code) -> Option<OperandUse> {
    OPERAND_USES[code as usize]
}

/// [`operand_use`], from the list of the codes covered.
fn listed_operand_use(code: Code) -> Option<OperandUse> {
    use Code::*;
    Some(match code {
        Mov_rm8_r8 | Mov_rm16_r16 | Mov_rm32_r32 | Mov_rm64_r64 | Mov_r8_rm8 | Mov_r16_rm16
        | Mov_r32_rm32 | Mov_r64_rm64 | Mov_r32_imm32 | Mov_r64_imm64 | Mov_rm8_imm8
        | Mov_rm16_imm16 | Mov_rm32_imm32 | Mov_rm64_imm32 | Movzx_r32_rm8 | Movzx_r32_rm16
        | Movzx_r64_rm8 | Movzx_r64_rm16 | Movsx_r32_rm8 | Movsx_r32_rm16 | Movsx_r64_rm8
        | Movsx_r64_rm16 | Movsxd_r64_rm32 | Seto_rm8 | Setno_rm8 | Setb_rm8 | Setae_rm8
        | Sete_rm8 | Setne_rm8 | Setbe_rm8 | Seta_rm8 | Sets_rm8 | Setns_rm8 | Setp_rm8
        | Setnp_rm8 | Setl_rm8 | Setge_rm8 | Setle_rm8 | Setg_rm8 | Movups_xmm_xmmm128
        | Movups_xmmm128_xmm | Movaps_xmm_xmmm128 | Movaps_xmmm128_xmm | Movupd_xmm_xmmm128
        | Movupd_xmmm128_xmm | Movapd_xmm_xmmm128 | Movapd_xmmm128_xmm | Movdqa_xmm_xmmm128
        | Movdqa_xmmm128_xmm | Movdqu_xmm_xmmm128 | Movdqu_xmmm128_xmm | Movss_xmm_xmmm32
        | Movss_xmmm32_xmm | Movsd_xmm_xmmm64 | Movsd_xmmm64_xmm => OperandUse::WriteRead,
        Lea_r32_m | Lea_r64_m => OperandUse::Lea,
        Add_rm8_r8 | Add_rm32_r32 | Add_rm64_r64 | Add_r8_rm8 | Add_r32_rm32 | Add_r64_rm64
        | Add_AL_imm8 | Add_EAX_imm32 | Add_RAX_imm32 | Add_rm8_imm8 | Add_rm32_imm8
        | Add_rm64_imm8 | Add_rm32_imm32 | Add_rm64_imm32 | And_rm8_r8 | And_rm32_r32
        | And_rm64_r64 | And_r8_rm8 | And_r32_rm32 | And_r64_rm64 | And_AL_imm8 | And_EAX_imm32
        | And_RAX_imm32 | And_rm8_imm8 | And_rm32_imm8 | And_rm64_imm8 | And_rm32_imm32
        | And_rm64_imm32 | Or_rm8_r8 | Or_rm32_r32 | Or_rm64_r64 | Or_r8_rm8 | Or_r32_rm32
        | Or_r64_rm64 | Or_AL_imm8 | Or_EAX_imm32 | Or_RAX_imm32 | Or_rm8_imm8 | Or_rm32_imm8
        | Or_rm64_imm8 | Or_rm32_imm32 | Or_rm64_imm32 | Imul_r32_rm32 | Imul_r64_rm64
        | Inc_rm8 | Inc_rm16 | Inc_rm32 | Inc_rm64 | Dec_rm8 | Dec_rm16 | Dec_rm32 | Dec_rm64
        | Shl_rm32_imm8 | Shl_rm64_imm8 | Shl_rm32_1 | Shl_rm64_1 | Shl_rm32_CL | Shl_rm64_CL
        | Shr_rm32_imm8 | Shr_rm64_imm8 | Shr_rm32_1 | Shr_rm64_1 | Shr_rm32_CL | Shr_rm64_CL
        | Sar_rm32_imm8 | Sar_rm64_imm8 | Sar_rm32_1 | Sar_rm64_1 | Sar_rm32_CL | Sar_rm64_CL => {
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
        Push_r64 | Call_rel32_64 => OperandUse::Push,
        Pop_r64 | Retnq => OperandUse::Pop,
        Jo_rel8_64 | Jno_rel8_64 | Jb_rel8_64 | Jae_rel8_64 | Je_rel8_64 | Jne_rel8_64
        | Jbe_rel8_64 | Ja_rel8_64 | Js_rel8_64 | Jns_rel8_64 | Jp_rel8_64 | Jnp_rel8_64
        | Jl_rel8_64 | Jge_rel8_64 | Jle_rel8_64 | Jg_rel8_64 | Jo_rel32_64 | Jno_rel32_64
        | Jb_rel32_64 | Jae_rel32_64 | Je_rel32_64 | Jne_rel32_64 | Jbe_rel32_64 | Ja_rel32_64
        | Js_rel32_64 | Jns_rel32_64 | Jp_rel32_64 | Jnp_rel32_64 | Jl_rel32_64 | Jge_rel32_64
        | Jle_rel32_64 | Jg_rel32_64 | Jmp_rel8_64 | Jmp_rel32_64 => OperandUse::Branch,
        _ => return None,
    })
}

/// [`direct_usage`]'s general-purpose registers alone.
#[inline]
pub(crate) fn direct_gpr_effects(insn: &Instruction) -> Option<GprEffects> {
    direct_registers(insn)
}

/// The register uses of [`direct_usage`], folded by `F`: the uses iced
/// lists, in another order.
#[inline]
pub(crate) fn direct_registers<F: RegisterFold>(insn: &Instruction) -> Option<F> {
    direct(insn, false).map(|(fold, _)| fold)
}

/// The general-purpose register effects and the memory location (iced's
/// list has at most one for these codes) of an instruction of a covered
/// code, as iced's instruction info gives them; `None` for other codes and
/// for memory operands not addressed in 64 bits.
#[inline]
pub(crate) fn direct_usage(insn: &Instruction) -> Option<(GprEffects, Option<UsedMemory>)> {
    direct(insn, true)
}

/// [`direct_usage`], the memory location built only when `with_memory`.
#[inline(always)]
fn direct<F: RegisterFold>(
    insn: &Instruction,
    with_memory: bool,
) -> Option<(F, Option<UsedMemory>)> {
    direct_of(insn, operand_use(insn.code())?, with_memory)
}

/// [`direct_registers`] of an instruction whose code's [`operand_use`] is
/// `operand_use`, for callers that keep it in a table of their own (one
/// lookup an instruction instead of two).
#[inline(always)]
pub(crate) fn direct_registers_of<F: RegisterFold>(
    insn: &Instruction,
    operand_use: OperandUse,
) -> Option<F> {
    direct_of(insn, operand_use, false).map(|(fold, _)| fold)
}

/// [`direct`] of an instruction whose code's [`operand_use`] is
/// `operand_use`.
#[inline(always)]
fn direct_of<F: RegisterFold>(
    insn: &Instruction,
    operand_use: OperandUse,
    with_memory: bool,
) -> Option<(F, Option<UsedMemory>)> {
    let mut effects = F::default();
    let mut memory = None;
    let (first, second) = match operand_use {
        OperandUse::WriteRead | OperandUse::Lea => (OpAccess::Write, OpAccess::Read),
        OperandUse::ReadWriteRead => (OpAccess::ReadWrite, OpAccess::Read),
        OperandUse::ReadRead => (OpAccess::Read, OpAccess::Read),
        OperandUse::Branch => (OpAccess::None, OpAccess::None),
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
            effects.add(Register::RSP, OpAccess::ReadWrite);
            let push = matches!(operand_use, OperandUse::Push);
            if with_memory {
                let (displacement, access) = if push {
                    (8u64.wrapping_neg(), OpAccess::Write)
                } else {
                    (0, OpAccess::Read)
                };
                memory = Some(UsedMemory::new2(
                    Register::SS,
                    Register::RSP,
                    Register::None,
                    1,
                    displacement,
                    MemorySize::UInt64,
                    access,
                    CodeSize::Code64,
                    0,
                ));
            }
            let access = if push {
                OpAccess::Read
            } else {
                OpAccess::Write
            };
            (access, OpAccess::None)
        }
    };
    for (k, access) in [(0, first), (1, second)] {
        if k >= insn.op_count() {
            break;
        }
        match insn.op_kind(k) {
            OpKind::Register => effects.add(insn.op_register(k), access),
            OpKind::Memory => {
                let (base, index) = (insn.memory_base(), insn.memory_index());
                // Base and index are read whatever the operand's access.
                effects.add(base, OpAccess::Read);
                effects.add(index, OpAccess::Read);
                if with_memory && !matches!(operand_use, OperandUse::Lea) {
                    memory = Some(explicit_memory(insn, access)?);
                }
            }
            _ => {}
        }
    }
    Some((effects, memory))
}

/// iced's location of the explicit memory operand of `insn`, accessed as
/// `access`, when its address is 64-bit (iced sizes other addresses from
/// the displacement's width; those are left to it).
fn explicit_memory(insn: &Instruction, access: OpAccess) -> Option<UsedMemory> {
    let (base, index) = (insn.memory_base(), insn.memory_index());
    let (base, index, scale) = match base {
        Register::RIP => (Register::None, Register::None, 1),
        _ if base.is_gpr64() || (base == Register::None && index.is_gpr64()) => {
            (base, index, insn.memory_index_scale())
        }
        _ => return None,
    };
    Some(UsedMemory::new2(
        insn.memory_segment(),
        base,
        index,
        scale,
        insn.memory_displacement64(),
        insn.memory_size(),
        access,
        CodeSize::Code64,
        0,
    ))
}

/// iced's instruction info behind the direct answers: reusable per thread
/// or per function.
pub(crate) struct Usages {
    info: InstructionInfoFactory,
    /// The direct answer's memory location, lent out by [`Usages::of`].
    direct_memory: Option<UsedMemory>,
}

impl Default for Usages {
    fn default() -> Self {
        Usages::new()
    }
}

impl Usages {
    /// A new one (iced's factory allocates its lists once).
    pub(crate) fn new() -> Usages {
        Usages {
            info: InstructionInfoFactory::new(),
            direct_memory: None,
        }
    }

    /// The general-purpose register effects and the memory locations of
    /// `insn`.
    #[inline]
    pub(crate) fn of(&mut self, insn: &Instruction) -> (GprEffects, &[UsedMemory]) {
        if let Some((effects, memory)) = direct_usage(insn) {
            self.direct_memory = memory;
            return (effects, self.direct_memory.as_slice());
        }
        let info = self.info.info(insn);
        (
            GprEffects::of_iced(info.used_registers()),
            info.used_memory(),
        )
    }

    /// The memory locations of [`Usages::of`], the registers not asked:
    /// frame accesses outside loops name their slots alone, and iced's
    /// register list was most of its work on the codes not answered
    /// directly.
    #[inline]
    pub(crate) fn memory_of(&mut self, insn: &Instruction) -> &[UsedMemory] {
        if let Some((NoRegisters, memory)) = direct(insn, true) {
            self.direct_memory = memory;
            return self.direct_memory.as_slice();
        }
        let info = self
            .info
            .info_options(insn, InstructionInfoOptions::NO_REGISTER_USAGE);
        info.used_memory()
    }

    /// The general-purpose register effects of `insn`.
    #[inline]
    pub(crate) fn gpr_effects(&mut self, insn: &Instruction) -> GprEffects {
        direct_gpr_effects(insn).unwrap_or_else(|| iced_gpr_effects(&mut self.info, insn))
    }

    /// iced's factory, for the questions asked of it alone.
    pub(crate) fn factory(&mut self) -> &mut InstructionInfoFactory {
        &mut self.info
    }
}

/// The general-purpose register effects of `insn` from iced's register
/// usage.
pub(crate) fn iced_gpr_effects(
    info: &mut InstructionInfoFactory,
    insn: &Instruction,
) -> GprEffects {
    // Register usage alone: iced lists a memory operand's base and index
    // among the registers either way, and the memory list is not read.
    let facts = info.info_options(insn, InstructionInfoOptions::NO_MEMORY_USAGE);
    GprEffects::of_iced(facts.used_registers())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// [`gpr_bit_and_whole`] of every register is iced's full register
    /// and size.
    #[test]
    fn gpr_facts_are_iceds() {
        for reg in Register::values() {
            let full = reg.full_register();
            let iced = full.is_gpr64().then(|| {
                (
                    1u16 << (full as u32 - Register::RAX as u32),
                    reg.size() >= 4,
                )
            });
            assert_eq!(gpr_bit_and_whole(reg), iced, "{reg:?}");
        }
    }

    /// [`direct_usage`] and [`direct_gpr_effects`] against iced on every
    /// encoding of the codes covered: each REX prefix (and none, operand
    /// size, address size, the `fs`/`gs` segments, `repne`/`rep`, which
    /// select the scalar and `movdqu` SSE moves), each one- and two-byte
    /// opcode, each ModRM byte, and each SIB byte where the ModRM has one,
    /// so every register pair, base, index, RIP-relative operand and the
    /// register-with-itself forms are met. The memory list is compared
    /// field by field (segment, base, index, scale, displacement, size,
    /// access, address size).
    #[test]
    fn direct_usage_is_iceds() {
        let mut info = InstructionInfoFactory::new();
        let mut seen = std::collections::HashSet::new();
        let (mut compared, mut with_memory, mut left_to_iced) = (0usize, 0usize, 0usize);
        let mut compare = |bytes: &[u8], info: &mut InstructionInfoFactory| -> bool {
            let mut decoder =
                iced_x86::Decoder::with_ip(64, bytes, 0x1000, iced_x86::DecoderOptions::NONE);
            let insn = decoder.decode();
            if operand_use(insn.code()).is_none() {
                return false;
            }
            let iced = info.info(&insn);
            let iced_effects = GprEffects::of_iced(iced.used_registers());
            match direct_usage(&insn) {
                Some((effects, memory)) => {
                    assert_eq!(effects, iced_effects, "{insn} ({:?})", insn.code());
                    assert_eq!(
                        memory.as_slice(),
                        iced.used_memory(),
                        "{insn} ({:?})",
                        insn.code()
                    );
                    with_memory += usize::from(memory.is_some());
                }
                None => left_to_iced += 1,
            }
            let gprs = direct_gpr_effects(&insn).expect("a covered code");
            assert_eq!(gprs, iced_effects, "{insn} ({:?})", insn.code());
            seen.insert(insn.code());
            compared += 1;
            true
        };
        let prefixes: Vec<Vec<u8>> = [
            vec![],
            vec![0x66],
            vec![0x67],
            vec![0x64],
            vec![0x65],
            vec![0xf2],
            vec![0xf3],
        ]
        .into_iter()
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
        assert!(
            with_memory > 500_000,
            "{with_memory} with a memory location"
        );
        // The 32-bit addresses of the address-size prefix.
        assert!(left_to_iced > 10_000, "{left_to_iced} left to iced");
    }

    /// [`Usages::of`] on the instructions of pseudo-random bytes, direct
    /// or not: iced's register effects and memory list.
    #[test]
    fn usages_are_iceds() {
        let insns = crate::binary::random_instructions(0x5851_f42d_4c95_7f2d, 1 << 18);
        let mut info = InstructionInfoFactory::new();
        let mut usages = Usages::new();
        let mut direct = 0;
        for insn in &insns {
            let iced = info.info(insn);
            // `GprEffects::used` is every register iced names: none with
            // no access.
            assert!(
                iced.used_registers().iter().all(|u| !u.register().is_gpr()
                    || !matches!(u.access(), OpAccess::None | OpAccess::NoMemAccess)),
                "{insn}"
            );
            let (effects, memory) = usages.of(insn);
            assert_eq!(
                effects,
                GprEffects::of_iced(iced.used_registers()),
                "{insn}"
            );
            assert_eq!(memory, iced.used_memory(), "{insn}");
            assert_eq!(usages.gpr_effects(insn), effects, "{insn}");
            direct += usize::from(direct_usage(insn).is_some());
        }
        assert!(direct > 1_000, "{direct} answered directly");
    }

    /// [`Usages::memory_of`] is the memory list of the full query, iced's
    /// with its registers, on every instruction of this test executable's
    /// functions and on the instructions of pseudo-random bytes.
    #[test]
    fn memory_alone_is_the_full_querys() {
        let binary = crate::binary::Binary::open(std::env::current_exe().unwrap()).unwrap();
        let mut insns = crate::binary::random_instructions(0x2545_f491_4f6c_dd1d, 1 << 18);
        for function in binary.functions() {
            insns.extend(binary.function_code(function).instructions.iter().copied());
        }
        let mut info = InstructionInfoFactory::new();
        let mut usages = Usages::new();
        let (mut with_memory, mut by_iced) = (0usize, 0usize);
        for insn in &insns {
            let full = info.info(insn).used_memory().to_vec();
            assert_eq!(usages.of(insn).1, &full[..], "{insn}");
            assert_eq!(usages.memory_of(insn), &full[..], "{insn}");
            with_memory += usize::from(!full.is_empty());
            by_iced += usize::from(!full.is_empty() && direct_usage(insn).is_none());
        }
        assert!(with_memory > 100_000, "{with_memory} with memory");
        assert!(by_iced > 10_000, "{by_iced} with memory asked of iced");
    }
}
