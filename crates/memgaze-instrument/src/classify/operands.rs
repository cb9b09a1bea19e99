//! Which instructions are loads, and the memory operand each one reads.
//!
//! A load is an instruction with an **explicit** memory operand that it
//! reads: `mov`, `movzx`, arithmetic with a memory source (`add reg,[mem]`),
//! compares (`cmp [mem],imm`), read-modify-write forms (`add [mem],reg`,
//! `lock xadd`), SIMD and masked loads, gathers, `push [mem]`, and
//! `call`/`jmp [mem]` (they read a code pointer).
//!
//! Not loads: `lea` and multi-byte `nop`s (no access), pure stores,
//! prefetches and cache-line maintenance (`prefetch*`, `clflush*`, `clwb`,
//! `cldemote`: hints that read no data into a register). Implicit reads are
//! not explicit operands and are counted apart so that coverage figures stay
//! honest: stack pops (`pop`, `ret`, `leave`, `popf`) and string
//! instructions (`movs`, `lods`, `cmps`, `scas`, `outs`, with or without
//! `rep`; one count per instruction). `xlat` (`al ← [rbx + al]`) is decoded
//! with an explicit memory operand and is an explicit load.
//!
//! String instructions with 64-bit addresses and no `fs:`/`gs:` override
//! (`movs`, `lods`, `cmps`, `scas`; [`string_reads`]) are loads nonetheless:
//! one operand per register they read through (`[rsi]`, `es:[rdi]`, both for
//! `cmps`, `rdi` first as Valgrind reads them) with the element size, marked [`LoadOperand::string`]; each
//! execution reads a range of elements that the rewriter's string probe
//! records element by element. Only the rest (`outs`, 32-bit address size,
//! segment overrides) stay implicit and counted.
//!
//! A bit test of memory at a register bit offset (`bt`/`bts`/`btr`/`btc
//! [mem], reg`) reads outside its operand: the byte `offset >> 3` (signed)
//! past the operand's address (`bit_offset_register`), which is what
//! Valgrind Lackey reports and what probes record.

use iced_x86::{
    Code, CodeSize, Instruction, InstructionInfoFactory, InstructionInfoOptions, Mnemonic,
    OpAccess, OpKind, Register,
};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU16, Ordering};

/// One explicit memory read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LoadOperand {
    /// Index of the instruction in its function's instruction list.
    pub instruction: u32,
    /// Address of the instruction.
    pub ip: u64,
    /// Instruction length in bytes.
    pub len: u8,
    /// Base register (`Register::RIP` for RIP-relative, `None` if absent).
    pub base: Register,
    /// Index register (a vector register for gathers).
    pub index: Register,
    /// Scale of the index (1, 2, 4, 8).
    pub scale: u8,
    /// Displacement; for RIP-relative operands the absolute target address.
    pub displacement: u64,
    /// `fs`/`gs` segment override (thread-local storage), else `None`.
    pub segment: Register,
    /// Bytes read (the element size for broadcasts and gathers).
    pub size: u32,
    /// The instruction also writes the location (`add [mem], reg`).
    pub read_modify_write: bool,
    /// A gather (VSIB addressing).
    pub gather: bool,
    /// `call [mem]` / `jmp [mem]`: the read value is a code pointer.
    pub control: bool,
    /// A string instruction's read through `base` (`rsi` or `rdi`): one
    /// element of `size` bytes per iteration ([`string_reads`]).
    pub string: bool,
}

impl LoadOperand {
    /// Whether it reads thread-local storage (`fs:`/`gs:`).
    pub fn is_tls(&self) -> bool {
        self.segment != Register::None
    }
}

/// Implicit memory reads of an instruction, counted apart.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ImplicitLoad {
    /// None.
    #[default]
    None,
    /// `pop`, `ret`, `leave`, `popf`, `iret`.
    Stack,
    /// `movs`, `lods`, `cmps`, `scas`, `outs`.
    String,
}

fn is_cache_hint(m: Mnemonic) -> bool {
    matches!(
        m,
        Mnemonic::Prefetch
            | Mnemonic::Prefetchnta
            | Mnemonic::Prefetcht0
            | Mnemonic::Prefetcht1
            | Mnemonic::Prefetcht2
            | Mnemonic::Prefetchw
            | Mnemonic::Prefetchwt1
            | Mnemonic::Prefetchit0
            | Mnemonic::Prefetchit1
            | Mnemonic::Clflush
            | Mnemonic::Clflushopt
            | Mnemonic::Clwb
            | Mnemonic::Cldemote
    )
}

/// The bit-offset register of a bit test of memory at a register offset
/// (`bt`/`bts`/`btr`/`btc [mem], reg`), which reads the byte `offset >> 3`
/// (the offset sign-extended from the register's width) past its operand's
/// address: a bitmap walk moves through memory while the operand stays put.
/// `None` for every other instruction, the immediate forms included (their
/// offset stays within the operand).
pub(crate) fn bit_offset_register(insn: &Instruction) -> Option<Register> {
    let bit_test = matches!(
        insn.mnemonic(),
        Mnemonic::Bt | Mnemonic::Bts | Mnemonic::Btr | Mnemonic::Btc
    );
    (bit_test && insn.op0_kind() == OpKind::Memory && insn.op1_kind() == OpKind::Register)
        .then(|| insn.op1_register())
}

/// Whether `insn` may have an explicit load: iced gives a memory operand a
/// base, an index or a displacement size, and leaves all three empty on an
/// instruction without one. Three field reads that pass over most
/// instructions without the call and the operand scan of
/// [`explicit_load`] (a table by `Code` would need iced's opcode table,
/// built on first use at about 20M instructions).
#[inline(always)]
pub(crate) fn may_load_explicitly(insn: &Instruction) -> bool {
    insn.memory_base() != Register::None
        || insn.memory_index() != Register::None
        || insn.memory_displ_size() != 0
}

/// The explicit load of `insn`, if it has one (an x86 instruction has at
/// most one explicit memory operand).
pub(crate) fn explicit_load(
    info: &mut InstructionInfoFactory,
    insn: &Instruction,
    index: u32,
) -> Option<LoadOperand> {
    let op = (0..insn.op_count()).find(|&i| insn.op_kind(i) == OpKind::Memory)?;
    let mnemonic = insn.mnemonic();
    if matches!(mnemonic, Mnemonic::Lea | Mnemonic::Nop) || is_cache_hint(mnemonic) {
        return None;
    }
    let access = memory_access(info, insn, op);
    let reads = matches!(
        access,
        OpAccess::Read | OpAccess::ReadWrite | OpAccess::CondRead | OpAccess::ReadCondWrite
    );
    if !reads {
        return None;
    }
    let segment = match insn.segment_prefix() {
        Register::FS | Register::GS => insn.segment_prefix(),
        _ => Register::None,
    };
    Some(LoadOperand {
        instruction: index,
        ip: insn.ip(),
        len: insn.len() as u8,
        base: insn.memory_base(),
        index: insn.memory_index(),
        scale: insn.memory_index_scale() as u8,
        displacement: insn.memory_displacement64(),
        segment,
        size: insn.memory_size().size() as u32,
        read_modify_write: matches!(access, OpAccess::ReadWrite | OpAccess::ReadCondWrite),
        gather: insn.is_vsib(),
        control: matches!(
            insn.flow_control(),
            iced_x86::FlowControl::IndirectCall | iced_x86::FlowControl::IndirectBranch
        ),
        string: false,
    })
}

/// How `insn` accesses its memory operand `op`.
///
/// iced's instruction info is most of the cost of finding the loads (its
/// implied accesses are worked out even when no list is asked for), and
/// it gives the same access for every instruction of a `Code` in 64-bit
/// code without an opmask (only an opmask's merging changes a
/// destination's access), so those are kept per `Code` in
/// [`MEMORY_ACCESS`], shared by all threads.
fn memory_access(info: &mut InstructionInfoFactory, insn: &Instruction, op: u32) -> OpAccess {
    let cacheable = !insn.has_op_mask() && insn.code_size() == CodeSize::Code64;
    let slot = MEMORY_ACCESS
        .get_or_init(|| {
            (0..Code::values().len())
                .map(|_| AtomicU16::new(0))
                .collect()
        })
        .get(insn.code() as usize)
        .filter(|_| cacheable);
    // An entry is `(op + 1) << 8 | access`; 0 = not known yet.
    if let Some(known) = slot.map(|s| s.load(Ordering::Relaxed))
        && known >> 8 == op as u16 + 1
        && let Ok(access) = OpAccess::try_from(usize::from(known & 0xff))
    {
        return access;
    }
    // The operands' accesses do not depend on the register and memory
    // lists, which are not built.
    let access = info
        .info_options(
            insn,
            InstructionInfoOptions::NO_REGISTER_USAGE | InstructionInfoOptions::NO_MEMORY_USAGE,
        )
        .op_access(op);
    if let Some(slot) = slot {
        slot.store((op as u16 + 1) << 8 | access as u16, Ordering::Relaxed);
    }
    access
}

/// Per `Code`, the access of its memory operand as [`memory_access`]
/// keeps it (any thread may fill an entry in: each has one value).
static MEMORY_ACCESS: OnceLock<Box<[AtomicU16]>> = OnceLock::new();

/// The string-instruction families whose reads are traced.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StringKind {
    /// `movs`: reads `[rsi]`, writes `es:[rdi]`.
    Movs,
    /// `lods`: reads `[rsi]`.
    Lods,
    /// `cmps`: reads `es:[rdi]` and `[rsi]` (in Lackey's order: `rdi`
    /// first); `repe`/`repne` stop early.
    Cmps,
    /// `scas`: reads `es:[rdi]`; `repe`/`repne` stop early.
    Scas,
}

/// What one traced string instruction reads per iteration.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StringReads {
    /// The family.
    pub kind: StringKind,
    /// Element size in bytes (1, 2, 4, 8).
    pub size: u32,
    /// A `rep`/`repe`/`repne` prefix: `rcx` iterations (at most, for
    /// `cmps`/`scas`); without it one.
    pub rep: bool,
}

impl StringReads {
    /// The registers it reads through, in the order of its reads.
    pub fn sources(self) -> &'static [Register] {
        match self.kind {
            StringKind::Movs | StringKind::Lods => &[Register::RSI],
            StringKind::Cmps => &[Register::RDI, Register::RSI],
            StringKind::Scas => &[Register::RDI],
        }
    }

    /// Whether the iteration count is known only once it ran (`repe`/`repne`
    /// `cmps`/`scas`).
    pub fn conditional(self) -> bool {
        self.rep && matches!(self.kind, StringKind::Cmps | StringKind::Scas)
    }
}

/// The reads of a string instruction that is traced: 64-bit address size
/// (`[rsi]`/`es:[rdi]`, not `[esi]`) and no `fs:`/`gs:` override on the
/// source. `None` for every other instruction, the SSE2 `movsd`/`cmpsd`
/// included.
pub fn string_reads(insn: &Instruction) -> Option<StringReads> {
    use Mnemonic as M;
    let (kind, size) = match insn.mnemonic() {
        M::Movsb => (StringKind::Movs, 1),
        M::Movsw => (StringKind::Movs, 2),
        M::Movsd => (StringKind::Movs, 4),
        M::Movsq => (StringKind::Movs, 8),
        M::Lodsb => (StringKind::Lods, 1),
        M::Lodsw => (StringKind::Lods, 2),
        M::Lodsd => (StringKind::Lods, 4),
        M::Lodsq => (StringKind::Lods, 8),
        M::Cmpsb => (StringKind::Cmps, 1),
        M::Cmpsw => (StringKind::Cmps, 2),
        M::Cmpsd => (StringKind::Cmps, 4),
        M::Cmpsq => (StringKind::Cmps, 8),
        M::Scasb => (StringKind::Scas, 1),
        M::Scasw => (StringKind::Scas, 2),
        M::Scasd => (StringKind::Scas, 4),
        M::Scasq => (StringKind::Scas, 8),
        _ => return None,
    };
    let kinds: Vec<OpKind> = (0..insn.op_count()).map(|i| insn.op_kind(i)).collect();
    let wide = |k: OpKind| matches!(k, OpKind::MemorySegRSI | OpKind::MemoryESRDI);
    // The SSE2 namesakes have no string operand; 32- and 16-bit address
    // sizes have other kinds.
    if !kinds.iter().any(|&k| wide(k)) || kinds.iter().any(|&k| is_string_operand(k) && !wide(k)) {
        return None;
    }
    if matches!(insn.segment_prefix(), Register::FS | Register::GS) {
        return None;
    }
    let rep = insn.has_rep_prefix() || insn.has_repne_prefix();
    Some(StringReads { kind, size, rep })
}

/// The load operands of a traced string instruction (see [`string_reads`]):
/// one per source register, in the order of its reads.
pub(crate) fn string_loads(
    insn: &Instruction,
    index: u32,
) -> Option<impl Iterator<Item = LoadOperand>> {
    let reads = string_reads(insn)?;
    let (ip, len) = (insn.ip(), insn.len() as u8);
    Some(reads.sources().iter().map(move |&base| LoadOperand {
        instruction: index,
        ip,
        len,
        base,
        index: Register::None,
        scale: 1,
        displacement: 0,
        segment: Register::None,
        size: reads.size,
        read_modify_write: false,
        gather: false,
        control: false,
        string: true,
    }))
}

/// Whether `insn` may make an implicit read ([`string_reads`],
/// [`implicit_load`]): only stack and string instructions do (iced's
/// flags, a table read and a few comparisons of the code). Both matches
/// over the mnemonic, asked of every instruction without an explicit load,
/// cost about as much as finding the explicit loads.
pub(crate) fn may_load_implicitly(insn: &Instruction) -> bool {
    insn.is_stack_instruction() || insn.is_string_instruction()
}

/// The implicit read `insn` makes, if any.
pub fn implicit_load(insn: &Instruction) -> ImplicitLoad {
    match insn.mnemonic() {
        Mnemonic::Pop
        | Mnemonic::Popf
        | Mnemonic::Popfq
        | Mnemonic::Ret
        | Mnemonic::Retf
        | Mnemonic::Leave
        | Mnemonic::Iret
        | Mnemonic::Iretq => ImplicitLoad::Stack,
        Mnemonic::Movsb
        | Mnemonic::Movsw
        | Mnemonic::Movsd
        | Mnemonic::Movsq
        | Mnemonic::Lodsb
        | Mnemonic::Lodsw
        | Mnemonic::Lodsd
        | Mnemonic::Lodsq
        | Mnemonic::Cmpsb
        | Mnemonic::Cmpsw
        | Mnemonic::Cmpsd
        | Mnemonic::Cmpsq
        | Mnemonic::Scasb
        | Mnemonic::Scasw
        | Mnemonic::Scasd
        | Mnemonic::Scasq
        | Mnemonic::Outsb
        | Mnemonic::Outsw
        | Mnemonic::Outsd
            // Only the string forms: `movsd`/`cmpsd` are also SSE2 scalar
            // instructions (register or explicit memory operands), and
            // `lods`/`scas`/`outs` have a register operand besides their
            // string one, so the test is the `[rsi]`/`es:[rdi]` operand.
            if (0..insn.op_count()).any(|i| is_string_operand(insn.op_kind(i))) =>
        {
            ImplicitLoad::String
        }
        _ => ImplicitLoad::None,
    }
}

/// The implicit `[rsi]`/`es:[rdi]` operand kinds of string instructions.
fn is_string_operand(kind: OpKind) -> bool {
    matches!(
        kind,
        OpKind::MemorySegSI
            | OpKind::MemorySegESI
            | OpKind::MemorySegRSI
            | OpKind::MemoryESDI
            | OpKind::MemoryESEDI
            | OpKind::MemoryESRDI
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use iced_x86::code_asm::*;

    fn decode(build: impl FnOnce(&mut CodeAssembler) -> Result<(), IcedError>) -> Vec<Instruction> {
        let mut a = CodeAssembler::new(64).unwrap();
        build(&mut a).unwrap();
        let bytes = a.assemble(0x1000).unwrap();
        let mut out = Vec::new();
        crate::binary::decode_bytes(&bytes, 0x1000, &mut out);
        out
    }

    /// The kept accesses are iced's, on instructions of every kind: those
    /// of pseudo-random bytes (opmasks, VEX/EVEX, prefixes, all widths).
    #[test]
    fn kept_memory_accesses_are_iceds() {
        let insns = crate::binary::random_instructions(0x2545_f491_4f6c_dd1d, 1 << 20);
        let mut info = InstructionInfoFactory::new();
        let mut checked = 0;
        for insn in insns.iter().filter(|i| !i.is_invalid()) {
            let Some(op) = (0..insn.op_count()).find(|&i| insn.op_kind(i) == OpKind::Memory) else {
                continue;
            };
            let iced = info.info(insn).op_access(op);
            // Once to fill the entry in, once to read it back.
            assert_eq!(memory_access(&mut info, insn, op), iced, "{insn}");
            assert_eq!(memory_access(&mut info, insn, op), iced, "{insn}");
            checked += 1;
        }
        assert!(checked > 50_000, "{checked} memory operands");
    }

    /// [`may_load_explicitly`] on the instructions of pseudo-random bytes
    /// (every encoding family, opmasks, prefixes, address sizes): every
    /// memory operand has a base, an index or a displacement size, and
    /// every instruction it passes over has no explicit load by the full
    /// path.
    #[test]
    fn explicit_loads_are_of_instructions_that_may_load() {
        let insns = crate::binary::random_instructions(0x6a09_e667_f3bc_c908, 1 << 20);
        let mut info = InstructionInfoFactory::new();
        let (mut passed, mut loads) = (0, 0);
        for (i, insn) in insns.iter().enumerate() {
            let memory = (0..insn.op_count()).any(|k| insn.op_kind(k) == OpKind::Memory);
            let load = explicit_load(&mut info, insn, i as u32);
            if may_load_explicitly(insn) {
                loads += usize::from(load.is_some());
            } else {
                assert!(!memory, "{insn}");
                assert_eq!(load, None, "{insn}");
                passed += 1;
            }
        }
        assert!(passed > 100_000, "{passed} instructions passed over");
        assert!(loads > 50_000, "{loads} explicit loads");
    }

    /// [`may_load_implicitly`] on the instructions of pseudo-random bytes:
    /// none it passes over has a string read or an implicit load.
    #[test]
    fn implicit_reads_are_of_stack_and_string_instructions() {
        let insns = crate::binary::random_instructions(0x9e37_79b9_7f4a_7c15, 1 << 20);
        let (mut passed, mut implicit) = (0, 0);
        for insn in insns.iter().filter(|i| !i.is_invalid()) {
            let loads = implicit_load(insn) != ImplicitLoad::None || string_reads(insn).is_some();
            if may_load_implicitly(insn) {
                implicit += usize::from(loads);
            } else {
                assert!(!loads, "{insn}");
                passed += 1;
            }
        }
        assert!(passed > 100_000, "{passed} instructions passed over");
        assert!(implicit > 1_000, "{implicit} implicit reads");
    }

    #[test]
    fn explicit_reads_are_loads_and_nothing_else_is() {
        let insns = decode(|a| {
            a.mov(rax, qword_ptr(rdi + rcx * 8 + 16))?; // load
            a.add(eax, dword_ptr(rsi))?; // load
            a.cmp(byte_ptr(rdi), 0)?; // load
            a.add(qword_ptr(rsp + 8), rax)?; // read-modify-write load
            a.movzx(eax, word_ptr(rdx))?; // load
            a.movdqu(xmm0, xmmword_ptr(rdi))?; // vector load
            a.vpgatherdd_3(xmm0, dword_ptr(rdi + xmm1 * 4), xmm2)?; // gather
            a.call(qword_ptr(rax + 16))?; // code pointer load
            a.push(qword_ptr(rbx))?; // load
            a.lea(rax, ptr(rdi + 8))?; // no access
            a.nop_1(dword_ptr(rax))?; // no access
            a.mov(qword_ptr(rdi), rax)?; // store
            a.prefetcht0(byte_ptr(rdi + 64))?; // hint
            a.pop(rbx)?; // implicit stack
            a.ret()?; // implicit stack
            a.rep().movsb()?; // string
            a.mov(rax, qword_ptr(0x28).fs())?; // TLS load
            Ok(())
        });
        let mut info = InstructionInfoFactory::new();
        let loads: Vec<Option<LoadOperand>> = insns
            .iter()
            .enumerate()
            .map(|(i, insn)| explicit_load(&mut info, insn, i as u32))
            .collect();
        let is_load: Vec<bool> = loads.iter().map(Option::is_some).collect();
        assert_eq!(
            is_load,
            [
                true, true, true, true, true, true, true, true, true, false, false, false, false,
                false, false, false, true
            ]
        );
        let first = loads[0].unwrap();
        assert_eq!(
            (
                first.base,
                first.index,
                first.scale,
                first.displacement,
                first.size
            ),
            (Register::RDI, Register::RCX, 8, 16, 8)
        );
        assert!(loads[3].unwrap().read_modify_write);
        assert_eq!(loads[5].unwrap().size, 16);
        assert!(loads[6].unwrap().gather);
        assert!(loads[7].unwrap().control);
        assert!(loads[16].unwrap().is_tls());
        let implicit: Vec<ImplicitLoad> = insns.iter().map(implicit_load).collect();
        assert_eq!(implicit[13], ImplicitLoad::Stack);
        assert_eq!(implicit[14], ImplicitLoad::Stack);
        assert_eq!(implicit[15], ImplicitLoad::String);
        assert_eq!(implicit[0], ImplicitLoad::None);
    }

    #[test]
    fn string_reads_are_implicit_and_their_sse_namesakes_are_not() {
        let insns = decode(|a| {
            a.rep().movsb()?; // 0: reads [rsi]
            a.repe().cmpsb()?; // 1: reads [rsi] and [rdi]
            a.lodsb()?; // 2: al ← [rsi]
            a.lodsq()?; // 3: rax ← [rsi]
            a.repne().scasb()?; // 4: compares al with [rdi]
            a.outsb()?; // 5: port dx ← [rsi]
            a.rep().stosb()?; // 6: a store
            a.movsd_2(xmm0, qword_ptr(rdi))?; // 7: SSE2 move, explicit load
            a.movsd_2(xmm0, xmm1)?; // 8: SSE2 move, no memory
            a.cmpsd_3(xmm0, xmm1, 0)?; // 9: SSE2 compare, no memory
            a.movsd()?; // 10: the string `movsd`
            a.cmpsd()?; // 11: the string `cmpsd`
            a.xlatb()?; // 12: al ← [rbx + al], decoded as an explicit operand
            Ok(())
        });
        let implicit: Vec<ImplicitLoad> = insns.iter().map(implicit_load).collect();
        use ImplicitLoad::{None as N, String as S};
        assert_eq!(implicit, [S, S, S, S, S, S, N, N, N, N, S, S, N]);
        let mut info = InstructionInfoFactory::new();
        let explicit: Vec<bool> = insns
            .iter()
            .map(|insn| explicit_load(&mut info, insn, 0).is_some())
            .collect();
        assert_eq!(
            explicit,
            [
                false, false, false, false, false, false, false, true, false, false, false, false,
                true
            ]
        );
    }

    #[test]
    fn string_reads_give_the_sources_size_and_prefix_of_traced_forms_only() {
        let insns = decode(|a| {
            a.rep().movsb()?; // 0
            a.repe().cmpsq()?; // 1
            a.lodsw()?; // 2
            a.repne().scasd()?; // 3
            a.outsb()?; // 4: not traced
            a.rep().stosb()?; // 5: a store
            a.movsd_2(xmm0, qword_ptr(rdi))?; // 6: SSE2
            a.movsd()?; // 7: the string `movsd`
            Ok(())
        });
        let reads: Vec<Option<StringReads>> = insns.iter().map(string_reads).collect();
        let r = |kind, size, rep| Some(StringReads { kind, size, rep });
        use StringKind::{Cmps, Lods, Movs, Scas};
        assert_eq!(
            reads,
            [
                r(Movs, 1, true),
                r(Cmps, 8, true),
                r(Lods, 2, false),
                r(Scas, 4, true),
                None,
                None,
                None,
                r(Movs, 4, false),
            ]
        );
        use Register::{RDI, RSI};
        assert_eq!(reads[0].unwrap().sources(), [RSI]);
        assert_eq!(reads[1].unwrap().sources(), [RDI, RSI]);
        assert_eq!(reads[3].unwrap().sources(), [RDI]);
        assert!(string_reads(&insns[1]).unwrap().conditional());
        assert!(!string_reads(&insns[0]).unwrap().conditional());
        // `addr32 movsb` reads [esi]; `fs movsb` reads fs:[rsi]: implicit.
        let mut out = Vec::new();
        crate::binary::decode_bytes(&[0x67, 0xa4, 0x64, 0xa4], 0x1000, &mut out);
        assert_eq!(out.len(), 2);
        for insn in &out {
            assert_eq!(string_reads(insn), None, "{insn}");
            assert_eq!(implicit_load(insn), ImplicitLoad::String);
        }
        let loads: Vec<LoadOperand> = string_loads(&insns[1], 5).unwrap().collect();
        assert_eq!(loads.len(), 2);
        assert!(
            loads
                .iter()
                .all(|l| l.string && l.size == 8 && l.instruction == 5)
        );
        assert_eq!((loads[0].base, loads[1].base), (RDI, RSI));
    }
}
