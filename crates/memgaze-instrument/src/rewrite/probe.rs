//! The code inserted before an instrumented load.
//!
//! # Soft mode
//!
//! Every instrumented-load execution is counted against the thread's
//! countdown (`fs:0x38`, see [`super::runtime`]); the runtime is called when
//! it is zero (a sample window is open, or the skip budget ran out).
//!
//! *Superblocks* — a basic block and the blocks it falls through into over
//! conditional branches, each with no other predecessor — are counted at
//! once: a *block check* at a point of the first block where the status
//! flags are dead, before the first counted load, subtracts the
//! superblock's `k` loads: `sub qword fs:[0x38], k; jbe stub`, and the loads
//! themselves run unmodified. A side exit taken before the end adds back the
//! loads it skips (`add qword fs:[0x38], n` on the taken edge; the flags are
//! dead at its target). When the countdown does not cover the superblock,
//! the stub adds `k` back and runs the superblock's *counting fragment*, an
//! out-of-line copy of it in which every load has its own counting probe;
//! the fragment ends by jumping back into the copy. One read-modify-write of
//! the counter per superblock keeps the store-to-load chain through it short
//! and the store buffer free; the fragments run only near and inside sample
//! windows, and count exactly wherever a window starts or ends.
//!
//! Loads outside superblocks (alone in theirs, or without a flags-dead point
//! before them) have a counting probe in the copy itself. It keeps the
//! application's state intact in one of four ways, chosen from register and
//! flags liveness:
//!
//! | variant | when | probe |
//! |---|---|---|
//! | `FastPath::FlagsDead` | status flags dead | `sub qword fs:[0x38],1; jb slow` |
//! | `FastPath::RcxDead` | flags live, rcx dead | `mov rcx,fs:[0x38]; jrcxz slow; lea rcx,[rcx-1]; mov fs:[0x38],rcx` |
//! | `FastPath::SaveIn` | flags and rcx live, another register dead | the same between `mov r,rcx` … `mov rcx,r` |
//! | `FastPath::Stack` | nothing dead | the same between `lea rsp,[rsp-128]; push rcx` … `pop rcx; lea rsp,[rsp+128]` (red zone) |
//!
//! The `sub`/`jb` form wraps a zero countdown to −1; zero is stored back
//! before the runtime records (by its stub, or by the runtime's
//! `probe_append` it calls), so every variant sees the same state. A slow
//! stub computes the load's effective address with a `lea` of the load's
//! own operand, calls the runtime, and returns to the load. A bit test at
//! a register offset (`bt [mem], reg`) reads the byte `offset >> 3` past
//! its operand (`bit_offset_register`): its stub adds that, between
//! `pushfq` and `popfq` (the shift changes the flags, which may be live),
//! and always calls the runtime's `record`.
//!
//! Inside a sample window (and all through a full trace) every execution
//! reaches the slow stub, so a flags-dead stub calls the runtime's
//! `probe_append` instead of `record`: it zeroes the countdown, claims a
//! record of the thread's grant with one `xadd` on the slot (see
//! [`super::runtime::slot::CLAIM`]) and writes the address and the load
//! id, saving two registers and not the flags, and goes on to `record`
//! only without a slot or a grant. Fewer instructions and stores per
//! record keep the program's own cache misses overlapping: `record` (40
//! instructions, 13 stores with its pushes) filled the reorder buffer and
//! the store queue. The stub moves `rsp` past the red zone with `add`/`sub
//! rsp, -128` (4 bytes each, the flags being dead) instead of `lea`s (5 and
//! 8). Why one shared routine: the same append written into each stub
//! (17 instructions, 126 bytes a stub) was half of a large executable's
//! copies (docs/performance.md); a stub is now 32 to 40 bytes. The
//! exception is a load in an innermost loop that keeps its countdown in a
//! register (`rewrite::reg_countdown`; in a superblock's counting fragment
//! too): windows run those stubs back to back, where the call, the return
//! and the four saves cost a full trace of the irregular kernel 15%, so
//! their stubs append inline (`inline_append`, the same claim and stores
//! with two registers saved) and call `record` only without a slot or a
//! grant; they are 2% of a large executable's copies.
//!
//! # Spatial checks
//!
//! A Strided or Irregular load (not a Constant one, nor one through `fs:`
//! or a bit test at a register offset) also gets a *spatial check* right
//! before it, on the path of the executions that no window records (after
//! its counting probe, whose slow stub resumes past the check at the load;
//! in a superblock's body, where no window is open): `lea r, [operand];
//! shr r, 6; imul r32, r32, m; cmp r32, t; jb stub` with `r` a register
//! dead there and the flags dead — a shift, a multiply and a compare on the
//! address, no load: the block `b` is tracked iff `(b mod 2^32) · m mod
//! 2^32 < t` (`SpatialHash`), which is the trace's hash with the words
//! `m · 2^32` and `t · 2^32` (`memgaze_trace::SpatialSampling`). The
//! checks are emitted with the default rate's `m` and `t`; the runtime
//! writes another rate's over them at entry, or skips the checks of runs
//! that take no spatial samples (below). Every rate the trace header can
//! hold is exact in this one form (rates in steps of `2^-32`). Why: the
//! loads of the two config words the check used to read cost most of it
//! (docs/performance.md). Where no register or the flags are not dead, they are saved
//! below the red zone around the check (`SpatialProbe`), except that a
//! check inside a loop that keeps its countdown in a register takes that
//! loop's spare register instead, saved once at loop entry
//! (`rewrite::reg_countdown`). The stub calls
//! the runtime with the address and the load id, and resumes at the load:
//! where the flags are dead at the load, its `spatial_append`, which
//! claims a record of the thread's *spatial grant* with one `xadd` on
//! [`super::runtime::slot::SPATIAL_CLAIM`] (the cold path keeps one open outside every
//! window, see [`super::runtime`]) and writes it, saving only two
//! registers; elsewhere, and without a grant, `spatial`, which saves
//! everything and issues the next grant. Why: `spatial` alone (its
//! pushes, `pushfq`/`popfq`, the slot lookup and taking and giving back a
//! grant per record) cost the strided kernel as much as its checks, and
//! the append written into every stub instead of one shared routine made a
//! large executable a sixth larger (docs/performance.md).
//!
//! In an executable instrumented for a CPU with BMI2
//! (`InstrumentOptions::spatial_bmi2`: the instrumenting CPU's, or
//! `MEMGAZE_SPATIAL_BMI2`), the check of a load whose address is one 64-bit
//! register (`[base]`, no index or displacement: `rorx_source`) takes
//! its block with one instruction, `rorx r, base, 6` for `lea r, [base];
//! shr r, 6` (the rotated-in bits land above the 32 the hash reads). The
//! segment header then masks BMI2's CPUID bit
//! (`super::runtime::header::CPU_FEATURES`) and the entry hook refuses a
//! CPU without it, in one line and exit 1, before the program runs;
//! the annotation lists `bmi2` in `cpu_features`. Libraries (whose
//! initialisers run before the executable's entry hook) and ptwrite mode
//! (no entry hook) keep `lea; shr`. Why: one µop fewer per check, which on
//! a loop bound by its misses (the irregular kernel) leaves more iterations
//! in flight (docs/performance.md).
//!
//! # Spatial checks off, or at another rate
//!
//! A run that takes no spatial samples would still pay for every check (on
//! a strided loop of one volatile load, more than the counting probe).
//! The rewriter lists every check with the offsets of its two immediates
//! (`spatial_immediates`) and its replacement (`spatial_skip`: at most
//! three long `nop`s, or a `jmp` to the load where the check moves `rsp`)
//! in a table that the segment header locates
//! (`super::runtime::header::SPATIAL_SKIPS`); when the threshold is still
//! 0 at the end of the entry hook, the runtime writes the replacements over
//! the checks, and at another rate or multiplier it writes the immediates
//! (`mprotect` to writable and back). The check's first byte is the only
//! label in it, so nothing branches into the replaced bytes.
//!
//! # String instructions
//!
//! A traced string instruction (`movs`, `lods`, `cmps`, `scas`, with or
//! without `rep`; [`crate::classify::operands::string_reads`]) is reached
//! through a jump to its *string stub*, which records every element it is
//! about to read as one execution of its load (two for `cmps`: `es:[rdi]`,
//! then `[rsi]`, Valgrind's order) and jumps back to it. Before the instruction `rsi`,
//! `rdi`, `rcx` and the direction flag give the range: `n` elements from
//! the source registers, `size` bytes apart, downwards when DF is set; `n`
//! is `rcx` with a `rep` prefix, else 1. For `repe`/`repne` `cmps`/`scas`
//! the count depends on the data: the stub runs the instruction itself on
//! the saved registers (it only reads) and takes `n` = `rcx` before minus
//! `rcx` after, which is exact unless another thread writes the data in
//! between. The elements go to the countdown as consecutive executions:
//! whole elements the countdown covers are subtracted at once, the others
//! (in and near a window) take the ordinary slow path, one `record` call
//! each. No cap: every element inside a window, all of them in a full
//! trace, is a record. Every register and the flags are saved around it
//! (`cld` before the calls: the runtime's own copies go forwards).
//!
//! # Ptwrite mode
//!
//! `ptwrite r64` of the base and then the index register of the load's
//! operand (none for RIP-relative or absolute operands): the annotation's
//! scale and displacement let the PT decoder rebuild the address. Every
//! execution writes them, so a PT time sample sees every load.
//!
//! A Strided or Irregular load first gets the same spatial check as in soft
//! mode (the block hash test) with the default rate's immediates (there is
//! no runtime to receive another rate). Its stub (`spatial_ptwrite_stub`) writes
//! the load's whole address with one `ptwrite`, a site marked
//! `PtwriteOperand::Address` (the spatial mark), and resumes at the operand
//! `ptwrite`s.

use super::runtime::{TCB_COUNTDOWN, TCB_SLOT, slot};
pub(crate) use crate::classify::operands::bit_offset_register;
use iced_x86::{Code, Instruction, MemoryOperand, OpKind, Register};
use memgaze_trace::protocol::RECORD_BYTES;

/// How a probe's fast path keeps the application's state intact.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum FastPath {
    /// Flags are dead: `sub`/`jb` on the countdown, no register needed.
    FlagsDead,
    /// `rcx` is dead: `jrcxz` form without saving it.
    RcxDead,
    /// `rcx` is saved in this dead register around the `jrcxz` form.
    SaveIn(Register),
    /// Nothing is dead: `rcx` is pushed below the red zone.
    Stack,
}

impl FastPath {
    /// Short name for reports.
    pub fn name(self) -> &'static str {
        match self {
            FastPath::FlagsDead => "flags-dead",
            FastPath::RcxDead => "rcx-dead",
            FastPath::SaveIn(_) => "register-save",
            FastPath::Stack => "stack-save",
        }
    }
}

/// How a spatial check keeps the application's state intact.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct SpatialProbe {
    /// The register that takes the address and its hash.
    pub scratch: Register,
    /// `scratch` is live: saved below the red zone around the check.
    pub(crate) save_scratch: bool,
    /// The flags are live: saved (`pushfq`) around the check.
    pub(crate) save_flags: bool,
}

impl SpatialProbe {
    /// Bytes the check moved `rsp` by when it reaches its `lea`.
    pub(crate) fn pushed(self) -> i64 {
        if self.save_scratch || self.save_flags {
            RED_ZONE + 8 * i64::from(self.save_scratch) + 8 * i64::from(self.save_flags)
        } else {
            0
        }
    }
}

/// The block hash a spatial check tests, as its two immediates: the block
/// `b` of the address is tracked iff `(b mod 2^32) · multiplier mod 2^32 <
/// threshold` (`memgaze_trace::SpatialSampling` with both words multiples
/// of `2^32`). Threshold 0: never tracked.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct SpatialHash {
    /// The 32-bit multiplier.
    pub multiplier: u32,
    /// The 32-bit threshold.
    pub threshold: u32,
}

impl SpatialHash {
    /// The hash of the recorders' default rate ([`super::DEFAULT_SPATIAL_RATE`]).
    pub(crate) fn default_rate() -> SpatialHash {
        let (multiplier, threshold) =
            memgaze_trace::SpatialSampling::with_rate(super::DEFAULT_SPATIAL_RATE)
                .and_then(|s| s.immediates())
                .expect("the default rate has immediates");
        SpatialHash {
            multiplier,
            threshold,
        }
    }
}

/// Appends the spatial check of `load` (see the module documentation); its
/// first instruction takes `ip`. `hash` gives its immediates (the runtime
/// may patch them, see [`spatial_immediates`]); `stub` is the check's stub;
/// with `rorx`, a load through one 64-bit register takes its block number
/// with one `rorx` (BMI2, see [`rorx_source`]). Gives the index in `out`
/// of its `imul`, which its `cmp` follows.
#[cfg(test)]
pub(crate) fn spatial_check(
    load: &Instruction,
    probe: SpatialProbe,
    (ip, stub): (u64, u64),
    (hash, rorx): (SpatialHash, bool),
    out: &mut Vec<Instruction>,
) -> usize {
    let start = out.len();
    spatial_save(probe, out);
    let block = spatial_block(load, probe, rorx);
    out.push(block);
    let shift = block.code() != Code::VEX_Rorx_r64_rm64_imm8;
    let multiply = spatial_hash(probe, shift, (hash, stub), out);
    out[start] = with_ip(out[start], ip);
    multiply
}

/// [`spatial_check`] appended to `out` as its block's instruction between
/// two templates (the first only where the check saves anything). Gives
/// the index in `out.insns` of the second, which holds the hash's
/// immediates, and their offsets in it.
pub(crate) fn spatial_check_code(
    load: &Instruction,
    probe: SpatialProbe,
    (ip, stub): (u64, u64),
    (hash, rorx): (SpatialHash, bool),
    out: &mut ProbeCode,
) -> (usize, [u8; 2]) {
    let templates = &*STUB_TEMPLATES;
    let mut label = ip;
    let (saves, n) = (
        StubTemplates::check_saves(probe),
        gpr64_number(probe.scratch),
    );
    if saves > 0 {
        out.push_template(
            &templates.check_save[16 * (saves - 1) + n],
            label,
            [0; 2],
            [0; 2],
        );
        label = 0;
    }
    let block = spatial_block(load, probe, rorx);
    out.insns.push(with_ip(block, label));
    let shift = block.code() != Code::VEX_Rorx_r64_rm64_imm8;
    let at = out.insns.len();
    let template = &templates.check_hash[4 * (2 * n + usize::from(shift)) + saves];
    let immediates = [hash.multiplier, hash.threshold];
    out.push_template(template, 0, immediates, [stub, 0]);
    let offsets = template.value_offsets();
    (at, [offsets[0], offsets[1]])
}

/// A spatial check's saves: `rsp` below the red zone, then the scratch
/// register and the flags pushed, where it saves them.
fn spatial_save(probe: SpatialProbe, out: &mut Vec<Instruction>) {
    if probe.pushed() > 0 {
        out.push(lea(Register::RSP, Register::RSP, -RED_ZONE));
    }
    if probe.save_scratch {
        out.push(push(probe.scratch));
    }
    if probe.save_flags {
        out.push(Instruction::with(Code::Pushfq));
    }
}

/// The instruction that starts a spatial check's hash: `rorx` of the
/// block number, or the `lea` of the address that a `shr` follows.
fn spatial_block(load: &Instruction, probe: SpatialProbe, rorx: bool) -> Instruction {
    let n = gpr64_number(probe.scratch);
    match rorx_source(load, probe).filter(|_| rorx) {
        // Bits 6..38 of the address in the low half: the block mod 2^32.
        Some(address) => STUB_PARTS.block_rorx[n][gpr64_number(address)],
        None => effective_address(load, probe.scratch, probe.pushed()),
    }
}

/// A spatial check's end after its block's instruction: the `shr` of the
/// address (`shift`), the hash's multiply and compare, the branch to
/// `stub`, the restores. Gives the index in `out` of its `imul`, which its
/// `cmp` follows.
fn spatial_hash(
    probe: SpatialProbe,
    shift: bool,
    (hash, stub): (SpatialHash, u64),
    out: &mut Vec<Instruction>,
) -> usize {
    let parts = &*STUB_PARTS;
    let n = gpr64_number(probe.scratch);
    if shift {
        out.push(parts.block_shift[n]);
    }
    // 32-bit forms with full immediates: no load, and the runtime can
    // patch both (their widths never depend on the values).
    let multiply = out.len();
    out.push(StubParts::with_id(parts.hash_multiply[n], hash.multiplier));
    out.push(StubParts::with_id(parts.hash_compare[n], hash.threshold));
    out.push(branch(Code::Jb_rel32_64, stub));
    spatial_restore(probe, out);
    multiply
}

/// The register that holds `load`'s whole address at its spatial check,
/// where there is one: a 64-bit base without index or displacement (`rsp`
/// only where the check has not moved it). One `rorx r, base, 6` then
/// replaces `lea r, [base]; shr r, 6`: its low 32 bits, all the hash
/// reads, are the block's.
pub(crate) fn rorx_source(load: &Instruction, probe: SpatialProbe) -> Option<Register> {
    let base = load.memory_base();
    let plain = base.is_gpr64()
        && load.memory_index() == Register::None
        && load.memory_displacement64() == 0
        && (base != Register::RSP || probe.pushed() == 0);
    plain.then_some(base)
}

/// The offsets, from a spatial check's first byte, of its multiplier's
/// and its threshold's immediates, found by decoding its `bytes` (the
/// check as emitted by [`spatial_check`]); `None` when `bytes` is not one.
pub(crate) fn spatial_immediates(bytes: &[u8]) -> Option<(u32, u32)> {
    let mut decoder = iced_x86::Decoder::new(64, bytes, 0);
    let (mut multiplier, mut threshold) = (None, None);
    let mut at = 0u32;
    while decoder.can_decode() {
        let insn = decoder.decode();
        let end = at + insn.len() as u32;
        match insn.code() {
            Code::Imul_r32_rm32_imm32 => multiplier = Some(end - 4),
            Code::Cmp_rm32_imm32 => threshold = Some(end - 4),
            Code::INVALID => return None,
            _ => {}
        }
        at = end;
    }
    multiplier.zip(threshold)
}

fn spatial_restore(probe: SpatialProbe, out: &mut Vec<Instruction>) {
    if probe.save_flags {
        out.push(Instruction::with(Code::Popfq));
    }
    if probe.save_scratch {
        out.push(pop(probe.scratch));
    }
    if probe.pushed() > 0 {
        out.push(lea(Register::RSP, Register::RSP, RED_ZONE));
    }
}

/// The bytes that replace a spatial check of `len` bytes when the run
/// takes no spatial samples (see "Spatial checks off" in the module
/// documentation): at most three long `nop`s where the check leaves `rsp`
/// alone, else a `jmp` over it (a `nop` run through the saves would decode
/// as many instructions, and the unwind information of their addresses
/// describes the moved `rsp`). Appended to `out`, which holds the skips
/// of every check.
pub(crate) fn append_spatial_skip(out: &mut Vec<u8>, len: usize, moves_rsp: bool) {
    /// `nop word [rax+rax*1+0]` with a 32-bit displacement, and prefixes.
    const NOP_10: [u8; 10] = [0x66, 0x2e, 0x0f, 0x1f, 0x84, 0x00, 0x00, 0x00, 0x00, 0x00];
    use super::relocate::NOPS;
    let end = out.len() + len;
    if !moves_rsp && len <= 3 * NOP_10.len() {
        // Equal pieces: as few instructions as the length allows.
        let pieces = len.div_ceil(NOP_10.len());
        for k in 0..pieces {
            let n = len / pieces + usize::from(k < len % pieces);
            if n == NOP_10.len() {
                out.extend_from_slice(&NOP_10);
            } else {
                out.extend_from_slice(NOPS[n - 1]);
            }
        }
    } else if len - 2 <= i8::MAX as usize {
        out.extend_from_slice(&[0xeb, (len - 2) as u8]);
        out.resize(end, 0xcc);
    } else {
        out.push(0xe9);
        out.extend_from_slice(&((len - 5) as i32).to_le_bytes());
        out.resize(end, 0xcc);
    }
}

/// Where a spatial check's stub takes a record.
#[derive(Clone, Copy, Debug)]
pub(crate) struct SpatialEntry {
    /// The runtime's `spatial` entry.
    pub spatial: u64,
    /// The runtime's `spatial_append` (it clobbers the flags), for checks
    /// whose flags are dead; 0: none, every record calls `spatial`.
    pub append: u64,
}

/// Appends the stub of a spatial check at `stub` as instructions (what
/// [`spatial_stub_code`]'s templates encode): restores what the check
/// saved (leaving `rsp` below the red zone, where the check moved it),
/// calls the runtime's `spatial_append` where the flags are dead at the
/// load, else its `spatial` (`rdi` = address, `esi` = `id`), and jumps to
/// `resume` (the load).
#[cfg(test)]
pub(crate) fn spatial_stub(
    load: &Instruction,
    id: u32,
    probe: SpatialProbe,
    (stub, resume): (u64, u64),
    entry: SpatialEntry,
    out: &mut Vec<Instruction>,
) {
    let start = out.len();
    spatial_stub_start(probe, out);
    out.push(effective_address(load, Register::RDI, RED_ZONE + 16));
    let target = spatial_entry(probe, entry);
    call_and_resume(id, target, resume, !probe.save_flags, out);
    out[start] = with_ip(out[start], stub);
}

/// [`spatial_stub`] appended to `out` as two templates and its `lea`.
pub(crate) fn spatial_stub_code(
    load: &Instruction,
    id: u32,
    probe: SpatialProbe,
    (stub, resume): (u64, u64),
    entry: SpatialEntry,
    out: &mut ProbeCode,
) {
    let templates = &*STUB_TEMPLATES;
    let start = &templates.spatial_start[StubTemplates::spatial_form(probe)];
    out.push_template(start, stub, [0; 2], [0; 2]);
    out.insns
        .push(effective_address(load, Register::RDI, RED_ZONE + 16));
    let end = &templates.call_and_resume[usize::from(!probe.save_flags)];
    out.push_template(end, 0, [id, 0], [spatial_entry(probe, entry), resume]);
}

/// A spatial stub's start, up to its `lea`: restores what the check saved
/// and leaves `rsp` below the red zone with `rdi` and `rsi` pushed.
fn spatial_stub_start(probe: SpatialProbe, out: &mut Vec<Instruction>) {
    if probe.save_flags {
        out.push(Instruction::with(Code::Popfq));
    }
    if probe.save_scratch {
        out.push(pop(probe.scratch));
    }
    if probe.pushed() == 0 {
        out.push(skip_red_zone(!probe.save_flags));
    }
    out.push(push(Register::RDI));
    out.push(push(Register::RSI));
}

/// The runtime entry a spatial stub calls: `spatial_append` where the
/// flags are dead at the load and there is one, else `spatial`.
fn spatial_entry(probe: SpatialProbe, entry: SpatialEntry) -> u64 {
    match entry.append {
        0 => entry.spatial,
        _ if probe.save_flags => entry.spatial,
        append => append,
    }
}

/// A stub's end after its `lea rdi, [operand]`: `mov esi, id; call
/// target`, `rsi` and `rdi` popped, `rsp` back over the red zone (by
/// `sub` where the flags are dead), `jmp resume`. Gives the index in `out`
/// of its `mov esi, id`.
fn call_and_resume(
    id: u32,
    target: u64,
    resume: u64,
    flags_dead: bool,
    out: &mut Vec<Instruction>,
) -> usize {
    let at = out.len();
    out.push(StubParts::with_id(STUB_PARTS.esi_id, id));
    out.push(branch(Code::Call_rel32_64, target));
    out.push(pop(Register::RSI));
    out.push(pop(Register::RDI));
    out.push(return_over_red_zone(flags_dead));
    out.push(branch(Code::Jmp_rel32_64, resume));
    at
}

/// Appends the stub of a ptwrite-mode spatial check at `stub`: restores
/// what the check saved, writes the load's address (`ptwrite rdi`, `rdi`
/// saved below the red zone) and jumps to `resume` (the operand
/// `ptwrite`s). Returns the index in `out` of its `ptwrite`.
pub(crate) fn spatial_ptwrite_stub(
    load: &Instruction,
    probe: SpatialProbe,
    stub: u64,
    resume: u64,
    out: &mut Vec<Instruction>,
) -> usize {
    let start = out.len();
    spatial_restore(probe, out);
    out.push(lea(Register::RSP, Register::RSP, -RED_ZONE));
    out.push(push(Register::RDI));
    out.push(effective_address(load, Register::RDI, RED_ZONE + 8));
    let at = out.len();
    out.push(Instruction::with1(Code::Ptwrite_rm64, Register::RDI).expect("ptwrite"));
    out.push(pop(Register::RDI));
    out.push(lea(Register::RSP, Register::RSP, RED_ZONE));
    out.push(branch(Code::Jmp_rel32_64, resume));
    out[start] = with_ip(out[start], stub);
    at
}

/// Whether a spatial check can compute `load`'s address with one `lea`
/// (not through `fs:`, not a bit test at a register offset).
pub(crate) fn spatial_checkable(load: &Instruction) -> bool {
    load.memory_segment() != Register::FS && bit_offset_register(load).is_none()
}

/// Red zone below `rsp` the System V ABI lets leaf code use.
const RED_ZONE: i64 = 128;

/// `fs:[0x38]`, the thread's countdown.
pub(super) fn fs_countdown() -> MemoryOperand {
    fs_at(TCB_COUNTDOWN)
}

/// `fs:[offset]`: a word of the thread's TCB (disp32, no base).
fn fs_at(offset: u64) -> MemoryOperand {
    MemoryOperand::new(
        Register::None,
        Register::None,
        1,
        offset as i64,
        4,
        false,
        Register::FS,
    )
}

/// `insn` at `ip` (a label branches can target).
pub(super) fn with_ip(mut insn: Instruction, ip: u64) -> Instruction {
    insn.set_ip(ip);
    insn
}

/// A two-operand instruction of registers, memory and immediates.
pub(super) fn i2(code: Code, a: impl Into<Op>, b: impl Into<Op>) -> Instruction {
    let (a, b) = (a.into(), b.into());
    match (a, b) {
        (Op::Reg(r), Op::Reg(s)) => Instruction::with2(code, r, s),
        (Op::Reg(r), Op::Mem(m)) => Instruction::with2(code, r, m),
        (Op::Mem(m), Op::Reg(r)) => Instruction::with2(code, m, r),
        (Op::Mem(m), Op::Imm(i)) => Instruction::with2(code, m, i),
        (Op::Reg(r), Op::Imm(i)) => Instruction::with2(code, r, i),
        _ => unreachable!("unused operand combination"),
    }
    .expect("valid instruction")
}

/// An operand of [`i2`].
pub(super) enum Op {
    Reg(Register),
    Mem(MemoryOperand),
    Imm(i32),
}

impl From<Register> for Op {
    fn from(r: Register) -> Op {
        Op::Reg(r)
    }
}
impl From<MemoryOperand> for Op {
    fn from(m: MemoryOperand) -> Op {
        Op::Mem(m)
    }
}
impl From<i32> for Op {
    fn from(i: i32) -> Op {
        Op::Imm(i)
    }
}

fn lea(dst: Register, base: Register, disp: i64) -> Instruction {
    if (dst, base) == (Register::RSP, Register::RSP) {
        if disp == RED_ZONE {
            return STUB_PARTS.rsp_above_red_zone;
        }
        if disp == -RED_ZONE {
            return STUB_PARTS.rsp_below_red_zone;
        }
    }
    built_lea(dst, base, disp)
}

fn built_lea(dst: Register, base: Register, disp: i64) -> Instruction {
    // 1 = "disp8 if it fits, else the address size" for iced's encoder.
    let size = if disp == 0 { 0 } else { 1 };
    i2(
        Code::Lea_r64_m,
        dst,
        MemoryOperand::with_base_displ_size(base, disp, size),
    )
}

fn push(reg: Register) -> Instruction {
    STUB_PARTS.push[gpr64_number(reg)]
}

fn pop(reg: Register) -> Instruction {
    STUB_PARTS.pop[gpr64_number(reg)]
}

/// The number (0 for `rax` to 15 for `r15`) of `reg`, a 64-bit general
/// register: the index of its instructions in [`StubParts`].
fn gpr64_number(reg: Register) -> usize {
    assert!(reg.is_gpr64(), "{reg:?} is not a 64-bit general register");
    reg.number()
}

/// The 64-bit general register number `number`.
fn gpr64(number: usize) -> Register {
    use Register::*;
    const BY_NUMBER: [Register; 16] = [
        RAX, RCX, RDX, RBX, RSP, RBP, RSI, RDI, R8, R9, R10, R11, R12, R13, R14, R15,
    ];
    BY_NUMBER[number]
}

/// The instructions the probes' fast paths and slow stubs repeat, built
/// once: constructing them with iced's validating constructors for every
/// probe was a sizeable part of building the copies. Those with a load id
/// or a register are kept for every register (by number) with a zero
/// immediate, which a probe sets ([`StubParts::with_id`]).
struct StubParts {
    /// `push`/`pop` of each register.
    push: [Instruction; 16],
    pop: [Instruction; 16],
    /// `lea rsp, [rsp ∓ 128]`: below the red zone and back.
    rsp_below_red_zone: Instruction,
    rsp_above_red_zone: Instruction,
    /// `add rsp, -128` and `sub rsp, -128`: the same where the flags are
    /// dead, shorter.
    rsp_below_red_zone_by_add: Instruction,
    rsp_above_red_zone_by_sub: Instruction,
    /// `sub qword fs:[countdown], 1`.
    countdown_sub_1: Instruction,
    /// `mov qword fs:[countdown], 0`.
    countdown_clear: Instruction,
    /// `mov rcx, fs:[countdown]`, `lea rcx, [rcx - 1]`, `mov fs:[countdown],
    /// rcx`: the `jrcxz` fast path's.
    rcx_from_countdown: Instruction,
    rcx_less_1: Instruction,
    countdown_from_rcx: Instruction,
    /// `mov esi, id` (id 0).
    esi_id: Instruction,
    /// Per register: a spatial check's `shr reg, SPATIAL_BLOCK_SHIFT`,
    /// `imul reg32, reg32, multiplier` and `cmp reg32, threshold` (both
    /// immediates 0).
    block_shift: [Instruction; 16],
    hash_multiply: [Instruction; 16],
    hash_compare: [Instruction; 16],
    /// Per (scratch register, address register): `rorx scratch, address,
    /// SPATIAL_BLOCK_SHIFT`.
    block_rorx: [[Instruction; 16]; 16],
    /// `sub`/`add qword fs:[countdown], loads` ([`count_by`]), by
    /// [`StubParts::count_form`], with a zero immediate.
    countdown_by: [Instruction; 4],
    /// `sub`/`add reg, loads` by [`StubParts::count_form`], then register,
    /// with a zero immediate: a register loop's countdown.
    register_by: [[Instruction; 16]; 4],
}

static STUB_PARTS: std::sync::LazyLock<Box<StubParts>> =
    std::sync::LazyLock::new(|| Box::new(StubParts::build()));

impl StubParts {
    /// Builds every part with iced's constructors.
    fn build() -> StubParts {
        let per_register =
            |build: &dyn Fn(Register) -> Instruction| std::array::from_fn(|n| build(gpr64(n)));
        let per_pair = |build: &dyn Fn(Register, Register) -> Instruction| {
            std::array::from_fn(|a| std::array::from_fn(|b| build(gpr64(a), gpr64(b))))
        };
        StubParts {
            push: per_register(&|r| Instruction::with1(Code::Push_r64, r).expect("push")),
            pop: per_register(&|r| Instruction::with1(Code::Pop_r64, r).expect("pop")),
            rsp_below_red_zone: built_lea(Register::RSP, Register::RSP, -RED_ZONE),
            rsp_above_red_zone: built_lea(Register::RSP, Register::RSP, RED_ZONE),
            rsp_below_red_zone_by_add: i2(Code::Add_rm64_imm8, Register::RSP, -RED_ZONE as i32),
            rsp_above_red_zone_by_sub: i2(Code::Sub_rm64_imm8, Register::RSP, -RED_ZONE as i32),
            countdown_sub_1: i2(Code::Sub_rm64_imm8, fs_countdown(), 1),
            countdown_clear: i2(Code::Mov_rm64_imm32, fs_countdown(), 0),
            rcx_from_countdown: i2(Code::Mov_r64_rm64, Register::RCX, fs_countdown()),
            rcx_less_1: built_lea(Register::RCX, Register::RCX, -1),
            countdown_from_rcx: i2(Code::Mov_rm64_r64, fs_countdown(), Register::RCX),
            esi_id: built_esi_id(0),
            block_shift: per_register(&built_block_shift),
            hash_multiply: per_register(&|r| built_hash_multiply(r, 0)),
            hash_compare: per_register(&|r| built_hash_compare(r, 0)),
            block_rorx: per_pair(&built_block_rorx),
            countdown_by: std::array::from_fn(|form| {
                let (code, _) = Self::COUNT_FORMS[form];
                i2(code, fs_countdown(), 0)
            }),
            register_by: std::array::from_fn(|form| {
                let (code, _) = Self::COUNT_FORMS[form];
                per_register(&|r| i2(code, r, 0))
            }),
        }
    }

    /// The codes of [`count_by`]'s forms and whether each takes a
    /// sign-extended 8-bit immediate.
    const COUNT_FORMS: [(Code, bool); 4] = [
        (Code::Sub_rm64_imm8, true),
        (Code::Sub_rm64_imm32, false),
        (Code::Add_rm64_imm8, true),
        (Code::Add_rm64_imm32, false),
    ];

    /// The form of `sub`/`add` (`subtract`) of `loads`: its index in
    /// [`StubParts::COUNT_FORMS`].
    fn count_form(loads: u32, subtract: bool) -> usize {
        2 * usize::from(!subtract) + usize::from(loads > 127)
    }

    /// `sub`/`add qword fs:[countdown], loads`.
    fn countdown_by(&self, loads: u32, subtract: bool) -> Instruction {
        let form = Self::count_form(loads, subtract);
        Self::with_count(self.countdown_by[form], form, loads)
    }

    /// `sub`/`add reg, loads`.
    fn register_by(&self, reg: Register, loads: u32, subtract: bool) -> Instruction {
        let form = Self::count_form(loads, subtract);
        Self::with_count(self.register_by[form][gpr64_number(reg)], form, loads)
    }

    /// `insn`, a part of count form `form`, with the immediate `loads`.
    fn with_count(mut insn: Instruction, form: usize, loads: u32) -> Instruction {
        if Self::COUNT_FORMS[form].1 {
            insn.set_immediate8to64(i64::from(loads));
        } else {
            insn.set_immediate32to64(i64::from(loads));
        }
        insn
    }

    /// `insn`, a part with a zero 32-bit immediate, with `value` (a load
    /// id, a hash's multiplier or threshold) instead.
    fn with_id(mut insn: Instruction, value: u32) -> Instruction {
        insn.set_immediate32(value);
        insn
    }
}

/// A stretch of probe code encoded once, as bytes: a use copies them,
/// writes its 32-bit value (a load id) into them and gives the targets of
/// their rel32 branches, which the layout writes where the code lands.
/// Built and measured as iced `Instruction`s, a slow or spatial stub's ten
/// instructions were most of a copy's and each went through the encoding
/// cache; as two templates and its `lea`, it is three pieces of code.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Template {
    /// The encoding, then zeros (copied whole: a copy of fixed length).
    bytes: [u8; Template::MAX_LEN],
    len: u8,
    /// Offsets of the 32-bit immediates a use sets, in order.
    value_at: [u8; 2],
    values: u8,
    /// Offsets past each rel32 displacement (the 4 bytes before), in
    /// order: a use gives their targets in the same order.
    rel32_ends: [u8; 2],
    rel32s: u8,
}

impl Template {
    /// Longest template, in bytes.
    pub(crate) const MAX_LEN: usize = 40;

    /// The template of `insns` encoded one after another, the immediates of
    /// the instructions at the indices `values` (32-bit ones) being what a
    /// use sets. Every relative branch must be a rel32 form ending in its
    /// displacement.
    fn of(insns: &[Instruction], values: &[usize]) -> Template {
        let mut encoder = iced_x86::Encoder::new(64);
        let mut template = Template {
            bytes: [0; Template::MAX_LEN],
            len: 0,
            value_at: [0; 2],
            values: 0,
            rel32_ends: [0; 2],
            rel32s: 0,
        };
        let mut code = Vec::new();
        for (k, insn) in insns.iter().enumerate() {
            let at = code.len();
            let ip = 0x1000 + at as u64;
            let size = encoder.encode(insn, ip).expect("a template's instruction");
            let offsets = encoder.get_constant_offsets();
            code.extend_from_slice(&encoder.take_buffer());
            if insn.is_call_near() || insn.is_jmp_near() || insn.is_jcc_near() {
                assert!(
                    offsets.immediate_size() == 4 && offsets.immediate_offset() + 4 == size,
                    "{insn}: a rel32 branch ending in its displacement"
                );
                template.rel32_ends[usize::from(template.rel32s)] = (at + size) as u8;
                template.rel32s += 1;
            } else if values.contains(&k) {
                assert_eq!(offsets.immediate_size(), 4, "{insn}: a 32-bit immediate");
                let value_at = (at + offsets.immediate_offset()) as u8;
                template.value_at[usize::from(template.values)] = value_at;
                template.values += 1;
            }
        }
        assert!(
            code.len() <= Template::MAX_LEN,
            "a template of {} bytes",
            code.len()
        );
        template.bytes[..code.len()].copy_from_slice(&code);
        template.len = code.len() as u8;
        template
    }

    /// Its length in bytes.
    pub(crate) fn len(&self) -> usize {
        usize::from(self.len)
    }

    /// Appends its bytes with `values` written in to `out`.
    pub(crate) fn append_to(&self, values: [u32; 2], out: &mut Vec<u8>) {
        let from = out.len();
        out.extend_from_slice(&self.bytes);
        out.truncate(from + self.len());
        for (&at, value) in self.value_offsets().iter().zip(values) {
            let at = from + usize::from(at);
            out[at..at + 4].copy_from_slice(&value.to_le_bytes());
        }
    }

    /// Offsets of the immediates a use sets, in order.
    pub(crate) fn value_offsets(&self) -> &[u8] {
        &self.value_at[..usize::from(self.values)]
    }

    /// Offsets past each of its rel32 displacements, in order.
    pub(crate) fn rel32_ends(&self) -> &[u8] {
        &self.rel32_ends[..usize::from(self.rel32s)]
    }
}

/// One use of a [`Template`] in a copy's code.
#[derive(Clone, Copy, Debug)]
pub(crate) struct TemplateUse {
    pub(crate) template: &'static Template,
    /// What its 32-bit immediates say, in order (unused without them).
    pub(crate) values: [u32; 2],
    /// The targets of its rel32 branches, in order.
    pub(crate) targets: [u64; 2],
}

/// Code of a copy (its body, its counting fragments or its stubs) as it is
/// built: instructions, some of which stand for a [`TemplateUse`] (a
/// placeholder, `INVALID` so that no encoder takes it, whose address is
/// the template's label), listed by index in order.
#[derive(Default)]
pub(crate) struct ProbeCode {
    pub(crate) insns: Vec<Instruction>,
    /// `(index in insns, use)` of each template, in order.
    pub(crate) templates: Vec<(u32, TemplateUse)>,
}

impl ProbeCode {
    /// The code of `insns`, without templates.
    #[cfg(test)]
    pub(crate) fn of(insns: Vec<Instruction>) -> ProbeCode {
        ProbeCode {
            insns,
            templates: Vec::new(),
        }
    }

    /// Empties it for the next copy.
    pub(crate) fn clear(&mut self) {
        self.insns.clear();
        self.templates.clear();
    }

    /// Appends `template` at `label` (0: none) with `value` and `targets`.
    fn push_template(
        &mut self,
        template: &'static Template,
        label: u64,
        values: [u32; 2],
        targets: [u64; 2],
    ) {
        let at = self.insns.len() as u32;
        self.insns.push(with_ip(Instruction::default(), label));
        let template_use = TemplateUse {
            template,
            values,
            targets,
        };
        self.templates.push((at, template_use));
    }
}

/// The probes' templates, encoded once from the instructions the probes
/// would otherwise be built of ([`StubTemplates::build`]).
struct StubTemplates {
    /// A plain slow stub's start, before its `lea rdi, [operand]`, by
    /// [`StubTemplates::slow_form`].
    slow_start: [Template; 3 + 16],
    /// A spatial stub's start, before its `lea rdi, [operand]`, by
    /// [`StubTemplates::spatial_form`].
    spatial_start: [Template; 2 * 17],
    /// A stub's end after its `lea`: `mov esi, id; call target; pop rsi;
    /// pop rdi`, `rsp` back over the red zone, `jmp resume`; by whether
    /// the flags are dead (which moves `rsp` by `sub` instead of `lea`).
    call_and_resume: [Template; 2],
    /// A spatial check's saves, by kind of save ([`StubTemplates::check_saves`]
    /// less 1) and then scratch register.
    check_save: [Template; 3 * 16],
    /// A spatial check's end after its block's instruction
    /// ([`spatial_hash`]), by scratch register, then by whether it shifts,
    /// then by [`StubTemplates::check_saves`].
    check_hash: [Template; 16 * 2 * 4],
    /// A flags-dead fast path, `sub qword fs:[countdown], 1; jb slow`.
    flags_dead_fast_path: Template,
}

static STUB_TEMPLATES: std::sync::LazyLock<Box<StubTemplates>> =
    std::sync::LazyLock::new(|| Box::new(StubTemplates::build()));

impl StubTemplates {
    /// Encodes every template from the instructions of
    /// [`slow_stub_start`], [`spatial_stub_start`] and
    /// [`call_and_resume`].
    fn build() -> StubTemplates {
        let encoded = |insns: &[Instruction]| Template::of(insns, &[]);
        StubTemplates {
            slow_start: std::array::from_fn(|form| {
                let mut insns = Vec::new();
                slow_stub_start(Self::slow_fast_path(form), &mut insns);
                encoded(&insns)
            }),
            spatial_start: std::array::from_fn(|form| {
                let mut insns = Vec::new();
                spatial_stub_start(Self::spatial_probe(form), &mut insns);
                encoded(&insns)
            }),
            call_and_resume: std::array::from_fn(|flags_dead| {
                let mut insns = Vec::new();
                let value = call_and_resume(0, 0x1000, 0x1000, flags_dead == 1, &mut insns);
                Template::of(&insns, &[value])
            }),
            check_save: std::array::from_fn(|form| {
                let mut insns = Vec::new();
                spatial_save(Self::check_probe(form % 16, 1 + form / 16), &mut insns);
                encoded(&insns)
            }),
            check_hash: std::array::from_fn(|form| {
                let (n, shift, saves) = (form / 8, form / 4 % 2 == 1, form % 4);
                let mut insns = Vec::new();
                let hash = SpatialHash {
                    multiplier: 0,
                    threshold: 0,
                };
                let probe = Self::check_probe(n, saves);
                let multiply = spatial_hash(probe, shift, (hash, 0x1000), &mut insns);
                Template::of(&insns, &[multiply, multiply + 1])
            }),
            flags_dead_fast_path: {
                let mut insns = Vec::new();
                soft_fast_path(FastPath::FlagsDead, 0, 0x1000, &mut insns);
                encoded(&insns)
            },
        }
    }

    /// What a spatial check saves: 0 nothing, 1 its scratch register, 2
    /// the flags, 3 both.
    fn check_saves(probe: SpatialProbe) -> usize {
        usize::from(probe.save_scratch) + 2 * usize::from(probe.save_flags)
    }

    /// The check with scratch register number `n` that saves `saves`
    /// ([`StubTemplates::check_saves`]).
    fn check_probe(n: usize, saves: usize) -> SpatialProbe {
        SpatialProbe {
            scratch: gpr64(n),
            save_scratch: saves & 1 != 0,
            save_flags: saves & 2 != 0,
        }
    }

    /// The fast path of [`StubTemplates::slow_start`]'s entry `form`.
    fn slow_fast_path(form: usize) -> FastPath {
        match form {
            0 => FastPath::FlagsDead,
            1 => FastPath::RcxDead,
            2 => FastPath::Stack,
            n => FastPath::SaveIn(gpr64(n - 3)),
        }
    }

    /// The entry of [`StubTemplates::slow_start`] for `fast`.
    fn slow_form(fast: FastPath) -> usize {
        match fast {
            FastPath::FlagsDead => 0,
            FastPath::RcxDead => 1,
            FastPath::Stack => 2,
            FastPath::SaveIn(reg) => 3 + gpr64_number(reg),
        }
    }

    /// The check of [`StubTemplates::spatial_start`]'s entry `form`.
    fn spatial_probe(form: usize) -> SpatialProbe {
        let (save_flags, scratch) = (form / 17 == 1, form % 17);
        SpatialProbe {
            scratch: gpr64(scratch.saturating_sub(1)),
            save_scratch: scratch > 0,
            save_flags,
        }
    }

    /// The entry of [`StubTemplates::spatial_start`] for `probe`.
    fn spatial_form(probe: SpatialProbe) -> usize {
        let scratch = if probe.save_scratch {
            1 + gpr64_number(probe.scratch)
        } else {
            0
        };
        17 * usize::from(probe.save_flags) + scratch
    }
}

/// `shr r, SPATIAL_BLOCK_SHIFT`: the block number of the address in `r`.
fn built_block_shift(r: Register) -> Instruction {
    i2(
        Code::Shr_rm64_imm8,
        r,
        super::runtime::SPATIAL_BLOCK_SHIFT as i32,
    )
}

/// `rorx r, address, SPATIAL_BLOCK_SHIFT`.
fn built_block_rorx(r: Register, address: Register) -> Instruction {
    let shift = super::runtime::SPATIAL_BLOCK_SHIFT as i32;
    Instruction::with3(Code::VEX_Rorx_r64_rm64_imm8, r, address, shift)
        .expect("rorx r64, r64, imm8")
}

/// `imul r32, r32, multiplier`.
fn built_hash_multiply(r: Register, multiplier: u32) -> Instruction {
    let r32 = r.full_register32();
    Instruction::with3(Code::Imul_r32_rm32_imm32, r32, r32, multiplier)
        .expect("imul r32, r32, imm32")
}

/// `cmp r32, threshold`.
fn built_hash_compare(r: Register, threshold: u32) -> Instruction {
    i2(Code::Cmp_rm32_imm32, r.full_register32(), threshold as i32)
}

/// `mov esi, id`.
fn built_esi_id(id: u32) -> Instruction {
    i2(Code::Mov_r32_imm32, Register::ESI, id as i32)
}

/// A relative branch to `target`.
///
/// The probes' 64-bit near branches are set field by field, as iced's
/// `with_branch` sets them: its look-up of the operand's kind and its
/// `Result`, out of line, cost more than the rest of the branch.
#[inline]
pub(super) fn branch(code: Code, target: u64) -> Instruction {
    if !is_probe_near_branch(code) {
        return Instruction::with_branch(code, target).expect("valid branch");
    }
    let mut insn = Instruction::default();
    insn.set_code(code);
    insn.set_op0_kind(OpKind::NearBranch64);
    insn.set_near_branch64(target);
    insn
}

/// Whether `code` is one of the near branches the probes build, whose one
/// operand is a 64-bit near branch target.
fn is_probe_near_branch(code: Code) -> bool {
    matches!(
        code,
        Code::Jmp_rel32_64
            | Code::Call_rel32_64
            | Code::Jb_rel32_64
            | Code::Jbe_rel32_64
            | Code::Jae_rel32_64
            | Code::Je_rel32_64
            | Code::Jne_rel32_64
            | Code::Jmp_rel8_64
            | Code::Jne_rel8_64
            | Code::Jrcxz_rel8_64
    )
}

/// Appends a load's fast path; its first instruction takes `ip` (the
/// load's original address, so branches to the load run the probe).
pub(crate) fn soft_fast_path(fast: FastPath, ip: u64, slow: u64, out: &mut Vec<Instruction>) {
    let start = out.len();
    match fast {
        FastPath::FlagsDead => {
            out.push(STUB_PARTS.countdown_sub_1);
            out.push(branch(Code::Jb_rel32_64, slow));
        }
        FastPath::RcxDead => countdown_jrcxz(slow, out),
        FastPath::SaveIn(reg) => {
            out.push(i2(Code::Mov_r64_rm64, reg, Register::RCX));
            countdown_jrcxz(slow, out);
            out.push(i2(Code::Mov_r64_rm64, Register::RCX, reg));
        }
        FastPath::Stack => {
            out.push(lea(Register::RSP, Register::RSP, -RED_ZONE));
            out.push(push(Register::RCX));
            countdown_jrcxz(slow, out);
            out.push(pop(Register::RCX));
            out.push(lea(Register::RSP, Register::RSP, RED_ZONE));
        }
    }
    out[start] = with_ip(out[start], ip);
}

/// [`soft_fast_path`] appended to `out`, as a template where the flags are
/// dead.
pub(crate) fn soft_fast_path_code(fast: FastPath, ip: u64, slow: u64, out: &mut ProbeCode) {
    match fast {
        FastPath::FlagsDead => {
            let template = &STUB_TEMPLATES.flags_dead_fast_path;
            out.push_template(template, ip, [0; 2], [slow, 0]);
        }
        _ => soft_fast_path(fast, ip, slow, &mut out.insns),
    }
}

fn countdown_jrcxz(slow: u64, out: &mut Vec<Instruction>) {
    let parts = &*STUB_PARTS;
    out.push(parts.rcx_from_countdown);
    out.push(branch(Code::Jrcxz_rel8_64, slow));
    out.push(parts.rcx_less_1);
    out.push(parts.countdown_from_rcx);
}

/// Appends a block check subtracting `loads` from the countdown (flags must
/// be dead); its first instruction takes `ip`. Branches to `stub` when the
/// countdown does not cover the block.
pub(crate) fn block_check(loads: u32, ip: u64, stub: u64, out: &mut Vec<Instruction>) {
    out.push(with_ip(STUB_PARTS.countdown_by(loads, true), ip));
    out.push(branch(Code::Jbe_rel32_64, stub));
}

/// Appends the stub of a block check at `stub`: gives the `loads` back to
/// the countdown and continues in the counting fragment at `fragment`.
/// Flags are dead at a block check.
pub(crate) fn block_stub(loads: u32, stub: u64, fragment: u64, out: &mut Vec<Instruction>) {
    out.push(with_ip(add_countdown(loads), stub));
    out.push(branch(Code::Jmp_rel32_64, fragment));
}

/// Appends a side-exit compensation at `stub`: gives back the `loads` the
/// exit skips and jumps to `target` (flags are dead there).
pub(crate) fn exit_stub(loads: u32, stub: u64, target: u64, out: &mut Vec<Instruction>) {
    out.push(with_ip(add_countdown(loads), stub));
    out.push(branch(Code::Jmp_rel32_64, target));
}

fn add_countdown(loads: u32) -> Instruction {
    STUB_PARTS.countdown_by(loads, false)
}

/// [`count_by`] of a register loop's countdown in `reg` (a 64-bit general
/// register), from the parts built once.
pub(super) fn count_register_by(reg: Register, loads: u32, subtract: bool) -> Instruction {
    STUB_PARTS.register_by(reg, loads, subtract)
}

/// `sub counter, loads` (`subtract`) or `add counter, loads`, the counter
/// the memory countdown or a register holding it, built by iced's
/// constructors (what the parts are checked against).
#[cfg(test)]
pub(super) fn count_by(counter: impl Into<Op>, loads: u32, subtract: bool) -> Instruction {
    let code = match (subtract, loads <= 127) {
        (true, true) => Code::Sub_rm64_imm8,
        (true, false) => Code::Sub_rm64_imm32,
        (false, true) => Code::Add_rm64_imm8,
        (false, false) => Code::Add_rm64_imm32,
    };
    i2(code, counter, loads as i32)
}

/// What an escape check compares a jump's target with (see
/// [`escape_stub`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EscapeCheck {
    /// Start of the original code of the relocated functions.
    pub original_start: u64,
    /// End of it.
    pub original_end: u64,
    /// Start of the copies: an entry or jump-table patch is a `jmp rel32`
    /// to at or above it, which no original instruction jumps to.
    pub copies: u64,
    /// Address of the config word holding the process block's address
    /// (0 while the runtime records nothing).
    pub process: u64,
    /// Address of the config word that is non-zero while loads are
    /// recorded (inside a measured region, or always without regions):
    /// escapes outside it are not counted, as its loads are not.
    pub enabled: u64,
    /// Offset of the first escape counter in the process block.
    pub counters: i32,
    /// For a shared library's copies, its own counters, which the fields
    /// above (the library's own config, always zero) do not reach.
    pub library: Option<LibraryCounters>,
}

/// Where an instrumented shared library's escape checks count (see
/// [`super::library`]): counters the executable's runtime sends, in its
/// process block, reached through words of the library's own state that
/// its runtime fills when the library registers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LibraryCounters {
    /// Address of the word holding the executable runtime's config block
    /// (0 until registered): its region switch says whether loads are
    /// recorded.
    pub config: u64,
    /// Address of the word holding the library's first counter (set
    /// before `config`).
    pub counters: u64,
    /// The library runtime's registration routine: `rax` = the
    /// executable runtime's config, or 0 while the thread has no slot to
    /// find it through; every other register kept, the flags clobbered.
    pub register: u64,
}

/// Bytes the escape stub keeps below the jump's `rsp`: the red zone and its
/// three saved words.
const ESCAPE_FRAME: i64 = 128 + 24;

/// Appends the out-of-line check of an indirect jump `jump` of a copy that
/// may land in original code; its first instruction takes `stub`, and the
/// copy jumps here instead of executing `jump`. The stub computes the
/// target, and when it lies in the original code of the relocated
/// functions at an address without a patch into the copies (no `jmp rel32`
/// there whose destination is at or above [`EscapeCheck::copies`]) while
/// loads are recorded ([`EscapeCheck::enabled`]), adds one to the site's
/// counter in the process block with a `lock add`
/// (threads and `vfork` children share it). Then it restores `rax`, `rcx`,
/// the flags and `rsp` and executes `jump` itself. Only these jumps pay for
/// it; probes are unchanged.
pub fn escape_stub(
    jump: &Instruction,
    site: u32,
    check: &EscapeCheck,
    stub: u64,
    mut next_label: impl FnMut() -> u64,
    out: &mut Vec<Instruction>,
) {
    let done = next_label();
    let count = next_label();
    out.push(with_ip(lea(Register::RSP, Register::RSP, -128), stub));
    out.push(push(Register::RAX));
    out.push(push(Register::RCX));
    out.push(Instruction::with(Code::Pushfq));
    // rax = the target, read as the jump would (rax and rcx still hold the
    // program's values).
    if jump.op0_kind() == OpKind::Register {
        let reg = jump.op0_register();
        if reg != Register::RAX {
            out.push(i2(Code::Mov_r64_rm64, Register::RAX, reg));
        }
    } else {
        let base = jump.memory_base();
        let mut disp = jump.memory_displacement64() as i64;
        let mut size = jump.memory_displ_size();
        if base == Register::RSP {
            disp += ESCAPE_FRAME;
            size = 1;
        }
        let segment = match jump.segment_prefix() {
            Register::FS | Register::GS => jump.segment_prefix(),
            _ => Register::None,
        };
        let operand = MemoryOperand::new(
            base,
            jump.memory_index(),
            jump.memory_index_scale(),
            disp,
            size,
            false,
            segment,
        );
        out.push(i2(Code::Mov_r64_rm64, Register::RAX, operand));
    }
    let rip = |target: u64| MemoryOperand::with_base_displ(Register::RIP, target as i64);
    out.push(i2(
        Code::Lea_r64_m,
        Register::RCX,
        rip(check.original_start),
    ));
    out.push(i2(Code::Cmp_r64_rm64, Register::RAX, Register::RCX));
    out.push(branch(Code::Jb_rel32_64, done));
    out.push(i2(Code::Lea_r64_m, Register::RCX, rip(check.original_end)));
    out.push(i2(Code::Cmp_r64_rm64, Register::RAX, Register::RCX));
    out.push(branch(Code::Jae_rel32_64, done));
    out.push(
        Instruction::with2(
            Code::Cmp_rm8_imm8,
            MemoryOperand::with_base(Register::RAX),
            0xe9,
        )
        .expect("valid cmp"),
    );
    out.push(branch(Code::Jne_rel32_64, count));
    out.push(i2(
        Code::Movsxd_r64_rm32,
        Register::RCX,
        MemoryOperand::with_base_displ_size(Register::RAX, 1, 1),
    ));
    out.push(i2(
        Code::Lea_r64_m,
        Register::RAX,
        MemoryOperand::new(Register::RAX, Register::RCX, 1, 5, 1, false, Register::None),
    ));
    out.push(i2(Code::Lea_r64_m, Register::RCX, rip(check.copies)));
    out.push(i2(Code::Cmp_r64_rm64, Register::RAX, Register::RCX));
    out.push(branch(Code::Jae_rel32_64, done));
    count_while_recorded(site, check, (count, done), &mut next_label, out);
    out.push(with_ip(Instruction::with(Code::Popfq), done));
    out.push(pop(Register::RCX));
    out.push(pop(Register::RAX));
    out.push(lea(Register::RSP, Register::RSP, 128));
    let mut original = *jump;
    original.set_ip(0);
    out.push(original);
}

/// While loads are recorded, adds one to counter `site` (`lock add`,
/// through `rax`), else jumps to `done`: the count an escape stub and an
/// untraced load share. The executable's counters are in its process
/// block (none while no block is mapped); a library's are reached through
/// its own state once registered, which the first count tries. The first
/// instruction takes `at`. Clobbers `rax` and the flags.
fn count_while_recorded(
    site: u32,
    check: &EscapeCheck,
    (at, done): (u64, u64),
    next_label: &mut impl FnMut() -> u64,
    out: &mut Vec<Instruction>,
) {
    let rip = |target: u64| MemoryOperand::with_base_displ(Register::RIP, target as i64);
    let counter_base = match &check.library {
        None => {
            out.push(with_ip(
                Instruction::with2(Code::Cmp_rm64_imm8, rip(check.enabled), 0).expect("valid cmp"),
                at,
            ));
            out.push(branch(Code::Je_rel32_64, done));
            out.push(i2(Code::Mov_r64_rm64, Register::RAX, rip(check.process)));
            out.push(i2(Code::Test_rm64_r64, Register::RAX, Register::RAX));
            out.push(branch(Code::Je_rel32_64, done));
            i64::from(check.counters)
        }
        Some(library) => {
            let registered = next_label();
            out.push(with_ip(
                i2(Code::Mov_r64_rm64, Register::RAX, rip(library.config)),
                at,
            ));
            out.push(i2(Code::Test_rm64_r64, Register::RAX, Register::RAX));
            out.push(branch(Code::Jne_rel32_64, registered));
            out.push(branch(Code::Call_rel32_64, library.register));
            out.push(i2(Code::Test_rm64_r64, Register::RAX, Register::RAX));
            out.push(branch(Code::Je_rel32_64, done));
            out.push(with_ip(
                Instruction::with2(
                    Code::Cmp_rm64_imm8,
                    MemoryOperand::with_base_displ(
                        Register::RAX,
                        i64::from(super::runtime::cfg::ENABLED),
                    ),
                    0,
                )
                .expect("valid cmp"),
                registered,
            ));
            out.push(branch(Code::Je_rel32_64, done));
            out.push(i2(Code::Mov_r64_rm64, Register::RAX, rip(library.counters)));
            0
        }
    };
    let mut add = i2(
        Code::Add_rm64_imm8,
        MemoryOperand::with_base_displ_size(
            Register::RAX,
            counter_base + 8 * i64::from(site),
            1, // disp8 if it fits, else the address size
        ),
        1,
    );
    add.set_has_lock_prefix(true);
    out.push(add);
}

/// Appends, before an explicit load no probe can trace (a gather, a `gs:`
/// source), the count of its execution as [`escape_stub`] counts an escape:
/// while loads are recorded, one `lock add` to counter `site` of the
/// process block, with `rax`, the flags and the red zone kept. Inline, as
/// the load runs in place after it; the first instruction takes `ip`, so
/// branches to the load count it too. Only these loads pay for it.
pub fn untraced_load_count(
    site: u32,
    check: &EscapeCheck,
    ip: u64,
    mut next_label: impl FnMut() -> u64,
    out: &mut Vec<Instruction>,
) {
    let done = next_label();
    out.push(with_ip(lea(Register::RSP, Register::RSP, -128), ip));
    out.push(push(Register::RAX));
    out.push(Instruction::with(Code::Pushfq));
    // No label on the count: nothing branches to it.
    count_while_recorded(site, check, (0, done), &mut next_label, out);
    out.push(with_ip(Instruction::with(Code::Popfq), done));
    out.push(pop(Register::RAX));
    out.push(lea(Register::RSP, Register::RSP, 128));
}

/// Why a load's operand cannot be recomputed by a probe.
pub fn unsupported_operand(load: &Instruction) -> Option<&'static str> {
    let base = load.memory_base();
    let index = load.memory_index();
    if index.is_xmm() || index.is_ymm() || index.is_zmm() {
        return Some("gather load (VSIB operand)");
    }
    match load.memory_segment() {
        Register::GS => return Some("gs-relative load"),
        Register::FS
        | Register::DS
        | Register::SS
        | Register::ES
        | Register::CS
        | Register::None => {}
        _ => return Some("unusual segment"),
    }
    if base == Register::EIP {
        return Some("32-bit instruction-pointer-relative operand");
    }
    if (base != Register::None && !base.is_gpr() && base != Register::RIP)
        || (index != Register::None && !index.is_gpr())
    {
        return Some("operand with a non-general register");
    }
    // `xlat` reads `[rbx + al]`: no `lea` can take an 8-bit index.
    if index.is_gpr8() || index.is_gpr16() {
        return Some("operand indexed by a byte register (xlat)");
    }
    // The stub's pushes move `rsp`; a bitmap offset in it is never seen.
    if bit_offset_register(load).is_some_and(|r| r.full_register() == Register::RSP) {
        return Some("bit test at an offset in rsp");
    }
    None
}

/// Appends the slow stub at `slow` for the load `load` with id `id`; it
/// ends with a jump to `resume` (the load's IP in the copy). `record` is
/// the runtime's slow path and `append` its `probe_append` for the load
/// (see [`super::runtime`]), which a flags-dead stub calls instead: it
/// zeroes the countdown and appends the record without saving the flags.
/// With `append_inline` (an unused label, for loads in innermost register
/// loops) a flags-dead stub appends inline instead and calls `record` at
/// that label when it cannot.
pub(crate) fn soft_slow_stub(
    fast: FastPath,
    load: &Instruction,
    id: u32,
    (slow, resume): (u64, u64),
    (record, append): (u64, u64),
    append_inline: Option<u64>,
    out: &mut Vec<Instruction>,
) {
    let start = out.len();
    let bit_offset = bit_offset_register(load);
    let flags_dead_append = fast == FastPath::FlagsDead
        && load.memory_segment() != Register::FS
        && bit_offset.is_none();
    let inline_fallback = append_inline.filter(|_| flags_dead_append);
    // An inline append clears the countdown itself and calls `record`
    // only when it cannot append.
    let appends = flags_dead_append && inline_fallback.is_none();
    slow_stub_restore(fast, (appends, flags_dead_append), out);
    if let Some(fallback) = inline_fallback {
        inline_append(load, id, resume, fallback, out);
    }
    out.push(push(Register::RDI));
    out.push(push(Register::RSI));
    match bit_offset {
        None => out.push(effective_address(load, Register::RDI, RED_ZONE + 16)),
        Some(offset) => {
            out.push(Instruction::with(Code::Pushfq));
            // Read the offset before `rdi` takes the address (it may be
            // the offset), sign-extended from its width.
            let extend = if offset.is_gpr64() {
                Code::Mov_r64_rm64
            } else if offset.is_gpr32() {
                Code::Movsxd_r64_rm32
            } else {
                Code::Movsx_r64_rm16
            };
            out.push(i2(extend, Register::RSI, offset));
            out.push(effective_address(load, Register::RDI, RED_ZONE + 24));
            out.push(i2(Code::Sar_rm64_imm8, Register::RSI, 3));
            out.push(i2(
                Code::Lea_r64_m,
                Register::RDI,
                MemoryOperand::with_base_index(Register::RDI, Register::RSI),
            ));
            out.push(Instruction::with(Code::Popfq));
        }
    }
    if load.memory_segment() == Register::FS {
        // glibc keeps the TCB's own address at fs:0 (its fs base).
        out.push(i2(Code::Mov_r64_rm64, Register::RSI, fs_at(0)));
        out.push(i2(
            Code::Lea_r64_m,
            Register::RDI,
            MemoryOperand::with_base_index(Register::RDI, Register::RSI),
        ));
    }
    let target = if appends { append } else { record };
    call_and_resume(id, target, resume, flags_dead_append, out);
    out[start] = with_ip(out[start], slow);
}

/// [`soft_slow_stub`] appended to `out`: as two templates and its `lea`
/// where the stub is plain (no bit test at a register offset, no `fs:`
/// operand, no inline append), else as its instructions.
pub(crate) fn soft_slow_stub_code(
    fast: FastPath,
    load: &Instruction,
    id: u32,
    (slow, resume): (u64, u64),
    (record, append): (u64, u64),
    append_inline: Option<u64>,
    out: &mut ProbeCode,
) {
    let flags_dead = fast == FastPath::FlagsDead;
    let plain = bit_offset_register(load).is_none()
        && load.memory_segment() != Register::FS
        && !(flags_dead && append_inline.is_some());
    if !plain {
        let (labels, entries) = ((slow, resume), (record, append));
        soft_slow_stub(
            fast,
            load,
            id,
            labels,
            entries,
            append_inline,
            &mut out.insns,
        );
        return;
    }
    let templates = &*STUB_TEMPLATES;
    let start = &templates.slow_start[StubTemplates::slow_form(fast)];
    out.push_template(start, slow, [0; 2], [0; 2]);
    out.insns
        .push(effective_address(load, Register::RDI, RED_ZONE + 16));
    // A plain flags-dead stub calls the append, as in `soft_slow_stub`.
    let target = if flags_dead { append } else { record };
    let end = &templates.call_and_resume[usize::from(flags_dead)];
    out.push_template(end, 0, [id, 0], [target, resume]);
}

/// A slow stub's start, up to its inline append or its pushes: restores
/// what the fast path `fast` saved, clears the countdown unless the stub
/// `appends` (which clears it), and moves `rsp` below the red zone (by
/// `add` where `flags_dead`).
fn slow_stub_restore(
    fast: FastPath,
    (appends, flags_dead): (bool, bool),
    out: &mut Vec<Instruction>,
) {
    match fast {
        _ if appends => {}
        FastPath::FlagsDead => out.push(STUB_PARTS.countdown_clear),
        FastPath::RcxDead => {}
        FastPath::SaveIn(reg) => out.push(i2(Code::Mov_r64_rm64, Register::RCX, reg)),
        FastPath::Stack => {
            out.push(pop(Register::RCX));
            out.push(lea(Register::RSP, Register::RSP, RED_ZONE));
        }
    }
    out.push(skip_red_zone(flags_dead));
}

/// A plain slow stub's start, up to its `lea`: [`slow_stub_restore`] and
/// `rdi` and `rsi` pushed.
fn slow_stub_start(fast: FastPath, out: &mut Vec<Instruction>) {
    let flags_dead = fast == FastPath::FlagsDead;
    slow_stub_restore(fast, (flags_dead, flags_dead), out);
    out.push(push(Register::RDI));
    out.push(push(Register::RSI));
}

/// The inline append of a flags-dead slow stub (after its countdown clear
/// and red-zone skip): claims a record of the thread's grant with one
/// `xadd` (see [`super::runtime::slot::CLAIM`]), writes the address and
/// then the load id, and jumps to `resume`; without a slot or a grant it
/// goes on at `fallback`, with every register as it found it, into the
/// stub's call of `record` (whose cold path issues the next grant). Two
/// scratch registers the load's operand does not use are saved below the
/// red zone. What the runtime's `probe_append` does, without the call,
/// the return and the saves of its arguments: used where windows run a
/// load back to back (innermost loops), at ~90 bytes more per stub.
fn inline_append(
    load: &Instruction,
    id: u32,
    resume: u64,
    fallback: u64,
    out: &mut Vec<Instruction>,
) {
    let (slot_reg, claim) = two_scratch(load);
    let limit = slot_field(slot_reg, slot::LIMIT);
    out.push(push(slot_reg));
    out.push(push(claim));
    // The thread's slot pointer.
    out.push(i2(Code::Mov_r64_rm64, slot_reg, fs_at(TCB_SLOT)));
    out.push(i2(Code::Test_rm64_r64, slot_reg, slot_reg));
    out.push(branch(Code::Je_rel32_64, fallback));
    out.push(i2(
        Code::Mov_r32_imm32,
        claim.full_register32(),
        RECORD_BYTES as i32,
    ));
    out.push(i2(
        Code::Xadd_rm64_r64,
        slot_field(slot_reg, slot::CLAIM),
        claim,
    ));
    out.push(i2(Code::Cmp_r64_rm64, claim, limit));
    out.push(branch(Code::Jae_rel32_64, fallback));
    out.push(effective_address(load, slot_reg, RED_ZONE + 16));
    out.push(i2(Code::Mov_rm64_r64, slot_field(claim, 4), slot_reg));
    out.push(
        Instruction::with2(Code::Mov_rm32_imm32, slot_field(claim, 0), id).expect("valid mov"),
    );
    out.push(pop(claim));
    out.push(pop(slot_reg));
    out.push(STUB_PARTS.rsp_above_red_zone_by_sub);
    out.push(branch(Code::Jmp_rel32_64, resume));
    out.push(with_ip(pop(claim), fallback));
    out.push(pop(slot_reg));
}

/// Two of `rdi`, `rsi`, `rcx`, `rdx` that the operand of `load` does not
/// use: an inline append's slot and claim registers.
fn two_scratch(load: &Instruction) -> (Register, Register) {
    let operand = [load.memory_base(), load.memory_index()].map(|r| {
        if r.is_gpr() {
            r.full_register()
        } else {
            Register::None
        }
    });
    let mut scratch = [Register::RDI, Register::RSI, Register::RCX, Register::RDX]
        .into_iter()
        .filter(|r| !operand.contains(r));
    (scratch.next().unwrap(), scratch.next().unwrap())
}

/// `[base + disp]`, a field of the slot or of a record.
fn slot_field(base: Register, disp: i32) -> MemoryOperand {
    MemoryOperand::new(
        base,
        Register::None,
        1,
        i64::from(disp),
        1,
        false,
        Register::None,
    )
}

/// `rsp` moved below the red zone: `add rsp, -128` where the flags are
/// dead (`flags_dead`; 4 bytes), else `lea rsp, [rsp - 128]` (5 bytes).
fn skip_red_zone(flags_dead: bool) -> Instruction {
    if flags_dead {
        STUB_PARTS.rsp_below_red_zone_by_add
    } else {
        STUB_PARTS.rsp_below_red_zone
    }
}

/// `rsp` moved back over the red zone: `sub rsp, -128` where the flags are
/// dead (`flags_dead`; 4 bytes, where `+128` takes a 32-bit immediate or
/// displacement), else `lea rsp, [rsp + 128]` (8 bytes).
fn return_over_red_zone(flags_dead: bool) -> Instruction {
    if flags_dead {
        STUB_PARTS.rsp_above_red_zone_by_sub
    } else {
        STUB_PARTS.rsp_above_red_zone
    }
}

/// `lea dst, [operand of load]`, with `rsp_adjust` added when the base is
/// `rsp` (bytes the stub pushed since the load's `rsp`).
///
/// Set field by field, as iced's `with2` sets them, and inlined: built
/// through `with2` (out of line, its `MemoryOperand` and `Result` copied)
/// it was most of a stub's building, once per probe.
#[inline]
pub(crate) fn effective_address(load: &Instruction, dst: Register, rsp_adjust: i64) -> Instruction {
    let base = load.memory_base();
    let mut disp = load.memory_displacement64();
    let mut size = load.memory_displ_size();
    if base == Register::RSP || base == Register::ESP {
        disp = disp.wrapping_add(rsp_adjust as u64);
        size = 1; // disp8 if it fits, else the address size
    }
    // 32-bit base/index registers keep the 32-bit address size (and its
    // wrap-around) through the encoder's address-size prefix.
    let mut lea = Instruction::default();
    lea.set_code(Code::Lea_r64_m);
    lea.set_op0_register(dst);
    lea.set_op1_kind(OpKind::Memory);
    lea.set_memory_base(base);
    lea.set_memory_index(load.memory_index());
    lea.set_memory_index_scale(load.memory_index_scale());
    lea.set_memory_displ_size(size);
    lea.set_memory_displacement64(disp);
    lea
}

/// Appends the string stub of `insn` at `stub` (see the module
/// documentation): `ids` are the load ids of its first and second source
/// (equal without a second), `record` the runtime's slow path; it ends with
/// a jump to `resume`, the instruction.
pub(crate) fn string_stub(
    insn: &Instruction,
    ids: [u32; 2],
    stub: u64,
    resume: u64,
    record: u64,
    next_label: &mut dyn FnMut() -> u64,
    out: &mut Vec<Instruction>,
) {
    use Register::{R8, R9, RAX, RCX, RDI, RDX, RSI, RSP};
    let reads = crate::classify::operands::string_reads(insn).expect("a traced string instruction");
    let sources = reads.sources();
    let two = sources.len() == 2;
    let (done, forward, next) = (next_label(), next_label(), next_label());
    let partial = next_label();
    let slot = |disp: i64| MemoryOperand::with_base_displ(RSP, disp);
    // Frame: r9, r8, rdi, rsi, rdx, rcx, rax at [rsp + 8k], the flags at
    // [rsp + 56], then the red zone.
    out.push(with_ip(lea(RSP, RSP, -RED_ZONE), stub));
    out.push(Instruction::with(Code::Pushfq));
    for r in [RAX, RCX, RDX, RSI, RDI, R8, R9] {
        out.push(push(r));
    }
    // rcx = the element count.
    if reads.conditional() {
        out.push(i2(Code::Mov_r64_rm64, RDX, RCX));
        let mut again = *insn;
        again.set_ip(0);
        out.push(again);
        out.push(i2(Code::Sub_r64_rm64, RDX, RCX));
        out.push(i2(Code::Mov_r64_rm64, RCX, RDX));
        out.push(i2(Code::Mov_r64_rm64, RSI, slot(24)));
        out.push(i2(Code::Mov_r64_rm64, RDI, slot(16)));
    } else if !reads.rep {
        out.push(i2(Code::Mov_r32_imm32, Register::ECX, 1));
    }
    // r8 (r9) = the source addresses; rdx = the signed step.
    out.push(i2(Code::Mov_r64_rm64, R8, sources[0]));
    if two {
        out.push(i2(Code::Mov_r64_rm64, R9, sources[1]));
    }
    out.push(i2(Code::Mov_r32_imm32, Register::EDX, reads.size as i32));
    out.push(i2(Code::Test_rm64_imm32, slot(56), 0x400));
    out.push(branch(Code::Je_rel32_64, forward));
    out.push(Instruction::with1(Code::Neg_rm64, RDX).expect("neg"));
    out.push(with_ip(Instruction::with(Code::Cld), forward));
    // Loop: rcx elements left.
    let top = next_label();
    out.push(with_ip(i2(Code::Test_rm64_r64, RCX, RCX), top));
    out.push(branch(Code::Je_rel32_64, done));
    out.push(i2(Code::Mov_r64_rm64, RAX, fs_countdown()));
    if two {
        out.push(i2(Code::Shr_rm64_imm8, RAX, 1));
    }
    // rax = whole elements the countdown covers.
    out.push(i2(Code::Cmp_r64_rm64, RAX, RCX));
    out.push(branch(Code::Jb_rel32_64, partial));
    out.push(i2(Code::Mov_r64_rm64, RAX, RCX));
    if two {
        out.push(i2(Code::Add_r64_rm64, RAX, RAX));
    }
    out.push(i2(Code::Sub_rm64_r64, fs_countdown(), RAX));
    out.push(branch(Code::Jmp_rel32_64, done));
    // Skip the rax covered elements, then one element execution by
    // execution.
    out.push(with_ip(i2(Code::Sub_r64_rm64, RCX, RAX), partial));
    out.push(i2(Code::Mov_r64_rm64, RSI, RAX));
    if two {
        out.push(i2(Code::Add_r64_rm64, RSI, RSI));
    }
    out.push(i2(Code::Sub_rm64_r64, fs_countdown(), RSI));
    out.push(i2(Code::Imul_r64_rm64, RAX, RDX));
    out.push(i2(Code::Add_r64_rm64, R8, RAX));
    if two {
        out.push(i2(Code::Add_r64_rm64, R9, RAX));
    }
    // One execution per source: the ordinary fast path, else `record`.
    let mut label = 0;
    for (k, &source) in [R8, R9].iter().enumerate().take(sources.len()) {
        let skip = if k + 1 == sources.len() {
            next
        } else {
            next_label()
        };
        out.push(with_ip(i2(Code::Sub_rm64_imm8, fs_countdown(), 1), label));
        out.push(branch(Code::Jae_rel32_64, skip));
        out.push(i2(Code::Mov_rm64_imm32, fs_countdown(), 0));
        out.push(i2(Code::Mov_r64_rm64, RDI, source));
        out.push(i2(Code::Mov_r32_imm32, Register::ESI, ids[k] as i32));
        out.push(branch(Code::Call_rel32_64, record));
        label = skip;
    }
    out.push(with_ip(i2(Code::Add_r64_rm64, R8, RDX), next));
    if two {
        out.push(i2(Code::Add_r64_rm64, R9, RDX));
    }
    out.push(Instruction::with1(Code::Dec_rm64, RCX).expect("dec"));
    out.push(branch(Code::Jmp_rel32_64, top));
    out.push(with_ip(pop(R9), done));
    for r in [R8, RDI, RSI, RDX, RCX, RAX] {
        out.push(pop(r));
    }
    out.push(Instruction::with(Code::Popfq));
    out.push(lea(RSP, RSP, RED_ZONE));
    out.push(branch(Code::Jmp_rel32_64, resume));
}

/// Appends `ptwrite` of the load's base and index registers; the first
/// takes `ip`. Returns how many were emitted.
pub fn ptwrite(load: &Instruction, ip: u64, out: &mut Vec<Instruction>) -> usize {
    let start = out.len();
    for reg in [load.memory_base(), load.memory_index()] {
        if reg.is_gpr() {
            let full = reg.full_register();
            out.push(Instruction::with1(Code::Ptwrite_rm64, full).expect("ptwrite"));
        }
    }
    if out.len() > start {
        out[start] = with_ip(out[start], ip);
    }
    out.len() - start
}

#[cfg(test)]
mod tests {
    use super::*;
    use iced_x86::Mnemonic;
    use iced_x86::{BlockEncoder, BlockEncoderOptions, Decoder, DecoderOptions, InstructionBlock};
    use std::collections::HashMap;

    fn decode_one(bytes: &[u8]) -> Instruction {
        Decoder::with_ip(64, bytes, 0x1000, DecoderOptions::NONE).decode()
    }

    /// One check's skip alone, after bytes already in the buffer (which
    /// it must leave as they are).
    fn spatial_skip(len: usize, moves_rsp: bool) -> Vec<u8> {
        let mut out = vec![0xf4; 3];
        append_spatial_skip(&mut out, len, moves_rsp);
        assert_eq!(out[..3], [0xf4; 3]);
        out.split_off(3)
    }

    /// `a` and `b` are the same instruction, down to the fields `==`
    /// leaves out.
    fn assert_same(a: Instruction, b: Instruction, what: &str) {
        assert!(a == b, "{what}: {a} != {b}");
        assert_eq!(
            (a.ip(), a.len(), a.code_size()),
            (b.ip(), b.len(), b.code_size()),
            "{what}"
        );
        let encode = |insn: &Instruction| {
            let mut encoder = iced_x86::Encoder::new(64);
            encoder.encode(insn, 0x1000).expect("encodable");
            encoder.take_buffer()
        };
        assert_eq!(encode(&a), encode(&b), "{what}");
    }

    #[test]
    fn stub_parts_are_the_instructions_iced_builds_for_every_register_and_id() {
        let parts = &*STUB_PARTS;
        let ids = [0, 1, 0x7f, 0x80, 0xff, 0x7fff_ffff, 0x8000_0000, u32::MAX];
        for a in 0..16 {
            let r = gpr64(a);
            assert_eq!(gpr64_number(r), a);
            let push_built = Instruction::with1(Code::Push_r64, r).unwrap();
            let pop_built = Instruction::with1(Code::Pop_r64, r).unwrap();
            assert_same(push(r), push_built, "push");
            assert_same(pop(r), pop_built, "pop");
        }
        for id in ids {
            let esi = StubParts::with_id(parts.esi_id, id);
            assert_same(esi, built_esi_id(id), "mov esi");
        }
        for a in 0..16 {
            let r = gpr64(a);
            assert_same(parts.block_shift[a], built_block_shift(r), "shr");
            for value in ids {
                let multiply = StubParts::with_id(parts.hash_multiply[a], value);
                assert_same(multiply, built_hash_multiply(r, value), "imul");
                let compare = StubParts::with_id(parts.hash_compare[a], value);
                assert_same(compare, built_hash_compare(r, value), "cmp");
            }
            for b in 0..16 {
                let rorx = built_block_rorx(r, gpr64(b));
                assert_same(parts.block_rorx[a][b], rorx, "rorx");
            }
        }
        let counts = (0..=300).chain([0x7fff_ffff, 0x8000_0000, u32::MAX]);
        for loads in counts {
            for subtract in [true, false] {
                let built = count_by(fs_countdown(), loads, subtract);
                assert_same(parts.countdown_by(loads, subtract), built, "count");
                for reg in (0..16).map(gpr64) {
                    let built = count_by(reg, loads, subtract);
                    assert_same(count_register_by(reg, loads, subtract), built, "count reg");
                }
            }
        }
        for (dst, base) in [
            (Register::RSP, Register::RSP),
            (Register::RCX, Register::RCX),
        ] {
            for disp in [-RED_ZONE - 8, -RED_ZONE, -1, 0, 1, RED_ZONE, RED_ZONE + 8] {
                let built = built_lea(dst, base, disp);
                assert_same(lea(dst, base, disp), built, "lea");
            }
        }
        let countdown = [
            (parts.countdown_sub_1, Code::Sub_rm64_imm8, 1),
            (parts.countdown_clear, Code::Mov_rm64_imm32, 0),
        ];
        for (part, code, imm) in countdown {
            assert_same(part, i2(code, fs_countdown(), imm), "countdown");
        }
        let rcx = i2(Code::Mov_r64_rm64, Register::RCX, fs_countdown());
        assert_same(parts.rcx_from_countdown, rcx, "mov rcx");
        assert_same(
            parts.rcx_less_1,
            built_lea(Register::RCX, Register::RCX, -1),
            "lea rcx",
        );
        let back = i2(Code::Mov_rm64_r64, fs_countdown(), Register::RCX);
        assert_same(parts.countdown_from_rcx, back, "mov countdown");
        // The flags-dead forms of the red-zone skip move rsp as the `lea`s
        // do, in 4 bytes each.
        let moves = [
            (skip_red_zone(true), Code::Add_rm64_imm8, 5),
            (return_over_red_zone(true), Code::Sub_rm64_imm8, 8),
        ];
        for (part, code, lea_len) in moves {
            let built = i2(code, Register::RSP, -RED_ZONE as i32);
            assert_same(part, built, "rsp by add/sub");
            assert_eq!(part.immediate8to64(), -RED_ZONE);
            let mut encoder = iced_x86::Encoder::new(64);
            assert_eq!(encoder.encode(&part, 0).unwrap(), 4);
            let lea = if code == Code::Add_rm64_imm8 {
                skip_red_zone(false)
            } else {
                return_over_red_zone(false)
            };
            assert_eq!(encoder.encode(&lea, 0).unwrap(), lea_len);
        }
    }

    /// The bytes of `insns` encoded one after another from `ip` (relative
    /// branches to their absolute targets) and the address of each label.
    fn encoded_instructions(insns: &[Instruction], ip: u64) -> (Vec<u8>, Vec<(u64, u64)>) {
        let mut encoder = iced_x86::Encoder::new(64);
        let (mut code, mut labels) = (Vec::new(), Vec::new());
        for insn in insns {
            let here = ip + code.len() as u64;
            if insn.ip() != 0 {
                labels.push((insn.ip(), here));
            }
            encoder.encode(insn, here).expect("encodable");
            code.extend_from_slice(&encoder.take_buffer());
        }
        (code, labels)
    }

    /// The bytes of `stubs` from `ip` as [`encoded_instructions`] gives
    /// them, its templates written as the layout writes them: their bytes
    /// with their value, and each rel32 to its target.
    fn encoded_stub_code(stubs: &ProbeCode, ip: u64) -> (Vec<u8>, Vec<(u64, u64)>) {
        let (code, labels, _) = encoded_probe_code(stubs, ip);
        (code, labels)
    }

    /// [`encoded_stub_code`], and the offset where each instruction or
    /// template starts.
    fn encoded_probe_code(stubs: &ProbeCode, ip: u64) -> (Vec<u8>, Vec<(u64, u64)>, Vec<usize>) {
        let mut encoder = iced_x86::Encoder::new(64);
        let (mut code, mut labels, mut starts) = (Vec::new(), Vec::new(), Vec::new());
        let mut templates = stubs.templates.iter().peekable();
        for (i, insn) in stubs.insns.iter().enumerate() {
            starts.push(code.len());
            let here = ip + code.len() as u64;
            if insn.ip() != 0 {
                labels.push((insn.ip(), here));
            }
            match templates.next_if(|&&(k, _)| k as usize == i) {
                Some((_, used)) => {
                    assert_eq!(insn.code(), Code::INVALID, "a template's placeholder");
                    let from = code.len();
                    used.template.append_to(used.values, &mut code);
                    let ends = used.template.rel32_ends();
                    for (&end, &target) in ends.iter().zip(&used.targets) {
                        let end = from + usize::from(end);
                        let rel = target.wrapping_sub(ip + end as u64) as i64;
                        let rel = i32::try_from(rel).expect("in reach");
                        code[end - 4..end].copy_from_slice(&rel.to_le_bytes());
                    }
                }
                None => {
                    encoder.encode(insn, here).expect("encodable");
                    code.extend_from_slice(&encoder.take_buffer());
                }
            }
        }
        assert!(
            templates.next().is_none(),
            "every template has its placeholder"
        );
        (code, labels, starts)
    }

    /// Loads of every addressing form a stub's `lea` copies: base and
    /// index, `rsp`-based (adjusted), `r13` with a zero displacement,
    /// RIP-relative, 32-bit registers, negative and 32-bit displacements.
    fn loads_of_every_form() -> Vec<Instruction> {
        let forms: [&[u8]; 8] = [
            &[0x8b, 0x04, 0x8f],                               // mov eax,[rdi+rcx*4]
            &[0x48, 0x8b, 0x44, 0x24, 0x08],                   // mov rax,[rsp+8]
            &[0x48, 0x8b, 0x04, 0x16],                         // mov rax,[rsi+rdx]
            &[0x41, 0x8b, 0x45, 0x00],                         // mov eax,[r13]
            &[0x8b, 0x05, 0x00, 0x01, 0x00, 0x00],             // mov eax,[rip+0x100]
            &[0x67, 0x8b, 0x07],                               // mov eax,[edi]
            &[0x42, 0x0f, 0xb6, 0x44, 0xe3, 0x80],             // movzx eax,byte [rbx+r12*8-0x80]
            &[0x48, 0x8b, 0x84, 0x24, 0x00, 0x10, 0x00, 0x00], // mov rax,[rsp+0x1000]
        ];
        forms.iter().map(|bytes| decode_one(bytes)).collect()
    }

    #[test]
    fn slow_stub_templates_are_iceds_encoding_of_the_stubs_instructions_in_every_form() {
        let ids = [0, 1, 0x7f, 0x80, 0x7fff_ffff, u32::MAX];
        let mut fast_paths = vec![FastPath::FlagsDead, FastPath::RcxDead, FastPath::Stack];
        fast_paths.extend((0..16).map(|n| FastPath::SaveIn(gpr64(n))));
        let (slow, resume, entries) = (0x40_2000, 0x40_1000, (0x50_3000, 0x30_4000));
        let mut templated = 0;
        for load in loads_of_every_form() {
            for &fast in &fast_paths {
                for id in ids {
                    for inline in [None, Some(0x40_5000)] {
                        let what = format!("{load} {fast:?} id {id:#x} inline {inline:?}");
                        let labels = (slow, resume);
                        let mut expected = Vec::new();
                        soft_slow_stub(fast, &load, id, labels, entries, inline, &mut expected);
                        let mut stubs = ProbeCode::default();
                        soft_slow_stub_code(fast, &load, id, labels, entries, inline, &mut stubs);
                        templated += stubs.templates.len();
                        for ip in [0x41_0000, 0x41_0007] {
                            assert_eq!(
                                encoded_stub_code(&stubs, ip),
                                encoded_instructions(&expected, ip),
                                "{what} at {ip:#x}"
                            );
                        }
                    }
                }
            }
        }
        // Every form but the inline appends takes two templates.
        assert_eq!(templated, 2 * 8 * 6 * (19 * 2 - 1));
    }

    #[test]
    fn spatial_stub_templates_are_iceds_encoding_of_the_stubs_instructions_in_every_form() {
        let ids = [0, 1, 0x80, u32::MAX];
        let (stub, resume) = (0x40_2000, 0x40_1000);
        let mut forms = 0;
        for load in loads_of_every_form() {
            for save_flags in [false, true] {
                for scratch in (0..16).map(gpr64) {
                    for save_scratch in [false, true] {
                        let probe = SpatialProbe {
                            scratch,
                            save_scratch,
                            save_flags,
                        };
                        for append in [0, 0x30_4000] {
                            let entry = SpatialEntry {
                                spatial: 0x50_3000,
                                append,
                            };
                            for id in ids {
                                let what = format!("{load} {probe:?} {entry:?} id {id:#x}");
                                let labels = (stub, resume);
                                let mut expected = Vec::new();
                                spatial_stub(&load, id, probe, labels, entry, &mut expected);
                                let mut stubs = ProbeCode::default();
                                spatial_stub_code(&load, id, probe, labels, entry, &mut stubs);
                                assert_eq!(stubs.templates.len(), 2, "{what}");
                                assert_eq!(
                                    encoded_stub_code(&stubs, 0x41_0003),
                                    encoded_instructions(&expected, 0x41_0003),
                                    "{what}"
                                );
                                forms += 1;
                            }
                        }
                    }
                }
            }
        }
        assert_eq!(forms, 8 * 2 * 16 * 2 * 2 * 4);
    }

    #[test]
    fn spatial_check_templates_are_iceds_encoding_of_the_checks_instructions_in_every_form() {
        let hashes = [(0, 0), (0x9e37_79b9, 0x0100_0000), (u32::MAX, 1)];
        let mut forms = 0;
        for load in loads_of_every_form() {
            for n in 0..16 {
                for saves in 0..4 {
                    let probe = StubTemplates::check_probe(n, saves);
                    for rorx in [false, true] {
                        for (multiplier, threshold) in hashes {
                            for ip in [0, 0x40_1000] {
                                let what = format!("{load} {probe:?} rorx {rorx} ip {ip:#x}");
                                let hash = SpatialHash {
                                    multiplier,
                                    threshold,
                                };
                                let labels = (ip, 0x40_2000);
                                let mut expected = Vec::new();
                                spatial_check(&load, probe, labels, (hash, rorx), &mut expected);
                                let mut check = ProbeCode::default();
                                let (at, offsets) = spatial_check_code(
                                    &load,
                                    probe,
                                    labels,
                                    (hash, rorx),
                                    &mut check,
                                );
                                let (code, marks, starts) = encoded_probe_code(&check, 0x41_0005);
                                assert_eq!(
                                    (code.clone(), marks),
                                    encoded_instructions(&expected, 0x41_0005),
                                    "{what}"
                                );
                                // The offsets given are the immediates'.
                                let immediates =
                                    offsets.map(|o| (starts[at] + usize::from(o)) as u32);
                                assert_eq!(
                                    spatial_immediates(&code),
                                    Some(immediates.into()),
                                    "{what}"
                                );
                                let value = |from: u32| {
                                    let from = from as usize;
                                    u32::from_le_bytes(code[from..from + 4].try_into().unwrap())
                                };
                                assert_eq!(
                                    immediates.map(value),
                                    [multiplier, threshold],
                                    "{what}"
                                );
                                forms += 1;
                            }
                        }
                    }
                }
            }
        }
        assert_eq!(forms, 8 * 16 * 4 * 2 * 3 * 2);
    }

    #[test]
    fn the_flags_dead_fast_path_template_is_iceds_encoding_of_its_instructions() {
        let mut fast_paths = vec![FastPath::FlagsDead, FastPath::RcxDead, FastPath::Stack];
        fast_paths.extend((0..16).map(|n| FastPath::SaveIn(gpr64(n))));
        for fast in fast_paths {
            for ip in [0, 0x40_1000] {
                let mut expected = Vec::new();
                soft_fast_path(fast, ip, 0x40_2000, &mut expected);
                let mut code = ProbeCode::default();
                soft_fast_path_code(fast, ip, 0x40_2000, &mut code);
                if fast == FastPath::FlagsDead {
                    assert_eq!(code.templates.len(), 1);
                    assert_eq!(
                        encoded_stub_code(&code, 0x41_0000),
                        encoded_instructions(&expected, 0x41_0000),
                        "at {ip:#x}"
                    );
                } else {
                    // The `jrcxz` forms stay instructions (a rel8 branch
                    // the layout expands).
                    assert!(code.templates.is_empty());
                    assert!(code.insns == expected, "{fast:?}");
                }
            }
        }
    }

    #[test]
    fn xlat_is_refused_with_a_reason() {
        // `xlatb` (0xd7): al ← [rbx + al].
        let xlat = decode_one(&[0xd7]);
        assert_eq!(
            unsupported_operand(&xlat),
            Some("operand indexed by a byte register (xlat)")
        );
        // mov rax, [rbx + rcx*8]
        let mov = decode_one(&[0x48, 0x8b, 0x04, 0xcb]);
        assert_eq!(unsupported_operand(&mov), None);
    }

    fn assemble(insns: &[Instruction], base: u64) -> Vec<Instruction> {
        let r = BlockEncoder::encode(
            64,
            InstructionBlock::new(insns, base),
            BlockEncoderOptions::NONE,
        )
        .unwrap();
        let mut d = Decoder::with_ip(64, &r.code_buffer, base, DecoderOptions::NONE);
        let mut out = Vec::new();
        while d.can_decode() {
            out.push(d.decode());
        }
        out
    }

    /// [`effective_address`] as iced's validating constructor builds it.
    fn effective_address_by_iced(
        load: &Instruction,
        dst: Register,
        rsp_adjust: i64,
    ) -> Instruction {
        let base = load.memory_base();
        let mut disp = load.memory_displacement64() as i64;
        let mut size = load.memory_displ_size();
        if base == Register::RSP || base == Register::ESP {
            disp += rsp_adjust;
            size = 1;
        }
        let (index, scale) = (load.memory_index(), load.memory_index_scale());
        let operand = MemoryOperand::new(base, index, scale, disp, size, false, Register::None);
        Instruction::with2(Code::Lea_r64_m, dst, operand).unwrap()
    }

    #[test]
    fn effective_addresses_are_the_instructions_iced_builds_for_every_form_and_register() {
        let mut loads = loads_of_every_form();
        // Every base and index register (64- and 32-bit), each scale, and
        // displacements of every size.
        let displacements = [0i64, 8, -0x80, 0x7f, 0x80, -0x81, 0x7fff_ffff, -0x8000_0000];
        for n in 0..16 {
            for wide in [true, false] {
                let register = |k: usize| {
                    let r = gpr64(k);
                    if wide { r } else { r.full_register32() }
                };
                let (base, index) = (register(n), register((n + 5) % 16));
                let index = if index.full_register() == Register::RSP {
                    Register::None
                } else {
                    index
                };
                for (k, &disp) in displacements.iter().enumerate() {
                    let scale = 1 << (k % 4);
                    let size = if wide { 8 } else { 4 };
                    let operand =
                        MemoryOperand::new(base, index, scale, disp, size, false, Register::None);
                    loads.push(
                        Instruction::with2(Code::Mov_r64_rm64, Register::RAX, operand).unwrap(),
                    );
                    let alone = MemoryOperand::with_base_displ_size(base, disp, 1);
                    loads.push(
                        Instruction::with2(Code::Mov_r64_rm64, Register::RAX, alone).unwrap(),
                    );
                }
            }
        }
        for load in &loads {
            for dst in (0..16).map(gpr64) {
                for adjust in [0, 8, RED_ZONE + 8, RED_ZONE + 16, RED_ZONE + 24, 144] {
                    let direct = effective_address(load, dst, adjust);
                    let built = effective_address_by_iced(load, dst, adjust);
                    assert!(
                        direct.eq_all_bits(&built),
                        "{load}, {dst:?}, {adjust}: {direct} against {built}"
                    );
                }
            }
        }
    }

    #[test]
    fn branches_are_the_instructions_iced_builds_for_every_code_set_directly() {
        let direct: Vec<Code> = Code::values()
            .filter(|&c| is_probe_near_branch(c))
            .collect();
        assert_eq!(direct.len(), 10, "{direct:?}");
        for code in direct {
            for target in [0, 0x1000, 0x7fff_ffff, 0xffff_ffff_ffff_fff0, FAKE_TARGET] {
                let built = Instruction::with_branch(code, target).unwrap();
                assert!(
                    branch(code, target).eq_all_bits(&built),
                    "{code:?} to {target:#x}"
                );
            }
        }
    }

    /// A fake label's address, far above any code.
    const FAKE_TARGET: u64 = 1 << 62;

    #[test]
    fn rsp_relative_operands_account_for_the_stub_pushes() {
        // mov rax, [rsp+8]
        let load = decode_one(&[0x48, 0x8b, 0x44, 0x24, 0x08]);
        let lea = effective_address(&load, Register::RDI, 144);
        assert_eq!(lea.memory_base(), Register::RSP);
        assert_eq!(lea.memory_displacement64(), 152);
    }

    #[test]
    fn rip_relative_operands_keep_their_absolute_target() {
        // mov rax, [rip+0x100] at 0x1000 → target 0x1107
        let load = decode_one(&[0x48, 0x8b, 0x05, 0x00, 0x01, 0x00, 0x00]);
        let lea = effective_address(&load, Register::RDI, 144);
        let out = assemble(&[lea], 0x5000);
        assert_eq!(out[0].memory_displacement64(), 0x1107);
    }

    #[test]
    fn fast_paths_assemble_and_only_the_first_keeps_the_load_ip() {
        for fast in [
            FastPath::FlagsDead,
            FastPath::RcxDead,
            FastPath::SaveIn(Register::R11),
            FastPath::Stack,
        ] {
            let mut insns = Vec::new();
            soft_fast_path(fast, 0x1000, 0x2000, &mut insns);
            assert_eq!(insns[0].ip(), 0x1000);
            assert!(insns[1..].iter().all(|i| i.ip() == 0));
            let mut stub = Vec::new();
            let load = decode_one(&[0x8b, 0x04, 0x8f]); // mov eax,[rdi+rcx*4]
            soft_slow_stub(
                fast,
                &load,
                7,
                (0x2000, 0x1000),
                (0x3000, 0x4000),
                None,
                &mut stub,
            );
            assert_eq!(stub[0].ip(), 0x2000);
            let decoded = assemble(&stub, 0x2000);
            let calls: Vec<u64> = decoded
                .iter()
                .filter(|i| i.code() == Code::Call_rel32_64)
                .map(|i| i.near_branch_target())
                .collect();
            // Only the flags-dead stub appends (the append clobbers them).
            let called = if fast == FastPath::FlagsDead {
                0x4000
            } else {
                0x3000
            };
            assert_eq!(calls, [called], "{fast:?}");
            assert_eq!(decoded.last().unwrap().near_branch_target(), 0x1000);
        }
    }

    #[test]
    fn flags_dead_stubs_pass_the_address_and_id_to_the_append_and_restore_rsp() {
        // mov eax,[rdi+rcx*4]; mov rax,[rsp+8]
        for (bytes, base) in [
            (&[0x8b, 0x04, 0x8f][..], Register::RDI),
            (&[0x48, 0x8b, 0x44, 0x24, 0x08][..], Register::RSP),
        ] {
            let load = decode_one(bytes);
            let mut stub = Vec::new();
            let entries = (0x3000, 0x4000);
            soft_slow_stub(
                FastPath::FlagsDead,
                &load,
                7,
                (0x2000, 0x1000),
                entries,
                None,
                &mut stub,
            );
            let decoded = assemble(&stub, 0x2000);
            // The append zeroes the countdown: the stub stores nothing to it.
            assert!(decoded.iter().all(|i| i.memory_segment() != Register::FS));
            let mut rsp = 0i64;
            let mut at_call = None;
            for insn in &decoded {
                match insn.code() {
                    Code::Push_r64 => rsp -= 8,
                    Code::Pop_r64 => rsp += 8,
                    Code::Add_rm64_imm8 if insn.op0_register() == Register::RSP => {
                        rsp += insn.immediate8to64()
                    }
                    Code::Sub_rm64_imm8 if insn.op0_register() == Register::RSP => {
                        rsp -= insn.immediate8to64()
                    }
                    Code::Lea_r64_m if insn.op0_register() == Register::RDI => {
                        assert_eq!(insn.memory_base(), base);
                        // The load's rsp is 128 + 16 bytes above the stub's.
                        let expected = if base == Register::RSP { 8 - rsp } else { 0 };
                        assert_eq!(insn.memory_displacement64() as i64, expected);
                    }
                    Code::Mov_r32_imm32 => assert_eq!(insn.immediate32(), 7),
                    Code::Call_rel32_64 => at_call = Some(rsp),
                    _ => {}
                }
            }
            // Below the red zone at the call, as it found it at the jump.
            assert_eq!(at_call, Some(-RED_ZONE - 16));
            assert_eq!(rsp, 0);
            let code: usize = decoded.iter().map(|i| i.len()).sum();
            assert!(code <= 40, "{code} bytes");
        }
    }

    #[test]
    fn inline_appends_write_the_record_and_fall_back_to_record_with_registers_restored() {
        // mov eax,[rdi+rcx*4]; mov rax,[rsp+8]; mov rax,[rsi+rdx]
        for (bytes, base) in [
            (&[0x8b, 0x04, 0x8f][..], Register::RDI),
            (&[0x48, 0x8b, 0x44, 0x24, 0x08][..], Register::RSP),
            (&[0x48, 0x8b, 0x04, 0x16][..], Register::RSI),
        ] {
            let load = decode_one(bytes);
            let mut stub = Vec::new();
            let fallback = 0x5000;
            soft_slow_stub(
                FastPath::FlagsDead,
                &load,
                7,
                (0x2000, 0x1000),
                (0x3000, 0x4000),
                Some(fallback),
                &mut stub,
            );
            let fallback_at = stub.iter().position(|i| i.ip() == fallback).unwrap();
            let (append, call) = stub.split_at(fallback_at);
            // The straight path: countdown cleared, record claimed and
            // written, every register and rsp restored, back to the load.
            assert_eq!(append[0].code(), Code::Mov_rm64_imm32);
            assert_eq!(append[0].memory_segment(), Register::FS);
            let mut rsp = 0i64;
            let mut pushed = Vec::new();
            let mut address = None;
            let mut stored = Vec::new();
            for insn in append.iter().take_while(|i| i.code() != Code::Jmp_rel32_64) {
                match insn.code() {
                    Code::Push_r64 => {
                        rsp -= 8;
                        pushed.push(insn.op0_register());
                    }
                    Code::Pop_r64 => {
                        rsp += 8;
                        assert_eq!(pushed.pop(), Some(insn.op0_register()));
                    }
                    Code::Add_rm64_imm8 => rsp += insn.immediate8to64(),
                    Code::Sub_rm64_imm8 => rsp -= insn.immediate8to64(),
                    Code::Lea_r64_m => {
                        assert_eq!(insn.memory_base(), base);
                        let expected = if base == Register::RSP { 8 - rsp } else { 0 };
                        assert_eq!(insn.memory_displacement64() as i64, expected);
                        assert!(!pushed.is_empty() && pushed.contains(&insn.op0_register()));
                        address = Some(insn.op0_register());
                    }
                    Code::Xadd_rm64_r64 => {
                        assert_eq!(rsp, -RED_ZONE - 16);
                        let operand = [load.memory_base(), load.memory_index()];
                        assert!(!operand.contains(&insn.op1_register()));
                        assert!(!operand.contains(&insn.memory_base()));
                    }
                    Code::Mov_rm64_r64 => {
                        assert_eq!(Some(insn.op1_register()), address);
                        stored.push(insn.memory_displacement64());
                    }
                    Code::Mov_rm32_imm32 => {
                        assert_eq!(insn.immediate32(), 7);
                        stored.push(insn.memory_displacement64());
                    }
                    Code::Call_rel32_64 => panic!("the straight path calls nothing"),
                    _ => {}
                }
            }
            // The address, then the id: the writer's last store.
            assert_eq!(stored, [4, 0]);
            assert_eq!(rsp, 0);
            assert!(pushed.is_empty());
            let jump = append.iter().find(|i| i.code() == Code::Jmp_rel32_64);
            assert_eq!(jump.map(|i| i.near_branch_target()), Some(0x1000));
            // The fallback: the scratch registers back, then `record`
            // (the countdown already zero), never `probe_append`.
            let mut rsp = -RED_ZONE - 16;
            let mut calls = Vec::new();
            for insn in call {
                match insn.code() {
                    Code::Push_r64 => rsp -= 8,
                    Code::Pop_r64 => rsp += 8,
                    Code::Sub_rm64_imm8 => rsp -= insn.immediate8to64(),
                    Code::Call_rel32_64 => calls.push((insn.near_branch_target(), rsp)),
                    _ => {}
                }
            }
            assert_eq!(calls, [(0x3000, -RED_ZONE - 16)]);
            assert_eq!(rsp, 0);
            assert_eq!(call.last().unwrap().near_branch_target(), 0x1000);
        }
    }

    #[test]
    fn vsib_and_gs_loads_are_refused() {
        // vpgatherdd ymm0, [rdi+ymm1*4], ymm2
        let gather = decode_one(&[0xc4, 0xe2, 0x6d, 0x90, 0x04, 0x8f]);
        assert!(unsupported_operand(&gather).is_some());
        // mov rax, gs:[0]
        let gs = decode_one(&[0x65, 0x48, 0x8b, 0x04, 0x25, 0, 0, 0, 0]);
        assert!(unsupported_operand(&gs).is_some());
        let plain = decode_one(&[0x8b, 0x04, 0x8f]);
        assert!(unsupported_operand(&plain).is_none());
    }

    #[test]
    fn bit_tests_at_a_register_offset_add_the_byte_offset_with_flags_saved() {
        // bt [rdi], rsi; btr dword [rip+0x100], eax; btc word [rdx], cx
        let loads = [
            (decode_one(&[0x48, 0x0f, 0xa3, 0x37]), Code::Mov_r64_rm64),
            (
                decode_one(&[0x0f, 0xb3, 0x05, 0x00, 0x01, 0x00, 0x00]),
                Code::Movsxd_r64_rm32,
            ),
            (decode_one(&[0x66, 0x0f, 0xbb, 0x0a]), Code::Movsx_r64_rm16),
        ];
        for (load, extend) in loads {
            assert!(bit_offset_register(&load).is_some(), "{load}");
            assert_eq!(unsupported_operand(&load), None);
            let mut stub = Vec::new();
            let entries = (0x3000, 0x4000);
            soft_slow_stub(
                FastPath::FlagsDead,
                &load,
                7,
                (0x2000, 0x1000),
                entries,
                None,
                &mut stub,
            );
            let decoded = assemble(&stub, 0x2000);
            let codes: Vec<Code> = decoded.iter().map(|i| i.code()).collect();
            // No append (it would record the operand): the stub zeroes the
            // countdown and calls the slow path.
            assert_eq!(codes[0], Code::Mov_rm64_imm32, "{codes:?}");
            let call = decoded.iter().find(|i| i.code() == Code::Call_rel32_64);
            assert_eq!(call.unwrap().near_branch_target(), 0x3000);
            let at = |c: Code| codes.iter().position(|&x| x == c).unwrap();
            let p = at(Code::Pushfq);
            assert_eq!(
                codes[p..p + 6],
                [
                    Code::Pushfq,
                    extend,
                    Code::Lea_r64_m,
                    Code::Sar_rm64_imm8,
                    Code::Lea_r64_m,
                    Code::Popfq
                ],
                "{codes:?}"
            );
            assert!(p + 6 < at(Code::Call_rel32_64));
        }
        // The immediate form reads within its operand.
        let imm = decode_one(&[0x48, 0x0f, 0xba, 0x27, 0x2d]); // bt qword [rdi], 45
        assert_eq!(bit_offset_register(&imm), None);
        // The stub's pushes move rsp: an offset in it is refused.
        let rsp = decode_one(&[0x48, 0x0f, 0xa3, 0x27]); // bt [rdi], rsp
        assert!(unsupported_operand(&rsp).is_some());
    }

    #[test]
    fn spatial_checks_shift_multiply_compare_and_save_only_what_is_live() {
        let load = decode_one(&[0x48, 0x8b, 0x44, 0x24, 0x08]); // mov rax,[rsp+8]
        let hash = SpatialHash::default_rate();
        // Dead register and flags: five instructions, rsp untouched.
        let free = SpatialProbe {
            scratch: Register::RDX,
            save_scratch: false,
            save_flags: false,
        };
        let mut out = Vec::new();
        spatial_check(&load, free, (0x1000, 0x2000), (hash, false), &mut out);
        let decoded = assemble(&out, 0x1000);
        let codes: Vec<Code> = decoded.iter().map(|i| i.code()).collect();
        assert_eq!(
            codes,
            [
                Code::Lea_r64_m,
                Code::Shr_rm64_imm8,
                Code::Imul_r32_rm32_imm32,
                Code::Cmp_rm32_imm32,
                Code::Jb_rel32_64
            ]
        );
        // No memory operand but the load's own in the `lea`.
        assert!(
            decoded[1..]
                .iter()
                .all(|i| i.op_kinds().all(|k| k != OpKind::Memory))
        );
        assert_eq!(decoded[0].memory_displacement64(), 8);
        assert_eq!(decoded[2].immediate32(), hash.multiplier);
        assert_eq!(decoded[3].immediate32(), hash.threshold);
        assert_eq!(decoded[2].op0_register(), Register::EDX);
        // Nothing dead: the register and the flags are saved below the red
        // zone, and the operand's rsp accounts for it.
        let saving = SpatialProbe {
            scratch: Register::RCX,
            save_scratch: true,
            save_flags: true,
        };
        let mut out = Vec::new();
        spatial_check(&load, saving, (0x1000, 0x2000), (hash, false), &mut out);
        let decoded = assemble(&out, 0x1000);
        let codes: Vec<Code> = decoded.iter().map(|i| i.code()).collect();
        assert_eq!(codes[..3], [Code::Lea_r64_m, Code::Push_r64, Code::Pushfq]);
        assert_eq!(decoded[3].memory_displacement64(), 8 + 128 + 16);
        assert_eq!(
            codes[codes.len() - 3..],
            [Code::Popfq, Code::Pop_r64, Code::Lea_r64_m]
        );
        // The stub undoes the saves before its call, staying below the red
        // zone for its own, and resumes at the load.
        let mut stub = Vec::new();
        let entry = SpatialEntry {
            spatial: 0x3000,
            append: 0x4000,
        };
        spatial_stub(&load, 9, saving, (0x2000, 0x1000), entry, &mut stub);
        let decoded = assemble(&stub, 0x2000);
        let codes: Vec<Code> = decoded.iter().map(|i| i.code()).collect();
        assert_eq!(codes[..3], [Code::Popfq, Code::Pop_r64, Code::Push_r64]);
        let call = decoded
            .iter()
            .find(|i| i.code() == Code::Call_rel32_64)
            .unwrap();
        assert_eq!(call.near_branch_target(), 0x3000);
        assert_eq!(decoded.last().unwrap().near_branch_target(), 0x1000);
        assert!(spatial_checkable(&load));
        let fs = decode_one(&[0x64, 0x48, 0x8b, 0x04, 0x25, 0x28, 0, 0, 0]); // mov rax,fs:[0x28]
        assert!(!spatial_checkable(&fs));
    }

    #[test]
    fn spatial_stubs_call_the_append_only_where_the_flags_are_dead() {
        // mov rax,[rdi+rsi*8+16]
        let load = decode_one(&[0x48, 0x8b, 0x44, 0xf7, 0x10]);
        let flags_dead = SpatialProbe {
            scratch: Register::RDX,
            save_scratch: false,
            save_flags: false,
        };
        let flags_live = SpatialProbe {
            save_flags: true,
            ..flags_dead
        };
        let entry = SpatialEntry {
            spatial: 0x3000,
            append: 0x4000,
        };
        let library = SpatialEntry { append: 0, ..entry };
        let stub_of = |probe: SpatialProbe, entry: SpatialEntry| {
            let mut stub = Vec::new();
            spatial_stub(&load, 9, probe, (0x2000, 0x1000), entry, &mut stub);
            assemble(&stub, 0x2000)
        };
        for (probe, entry, called) in [
            (flags_dead, entry, 0x4000),
            (flags_live, entry, 0x3000),
            (flags_dead, library, 0x3000),
        ] {
            let decoded = stub_of(probe, entry);
            let calls: Vec<u64> = decoded
                .iter()
                .filter(|i| i.code() == Code::Call_rel32_64)
                .map(|i| i.near_branch_target())
                .collect();
            assert_eq!(calls, [called]);
            // The address (red zone and the two pushes past rsp) in rdi,
            // the plain id in esi (the runtime adds the spatial flag).
            let lea = decoded
                .iter()
                .find(|i| i.code() == Code::Lea_r64_m && i.op0_register() == Register::RDI)
                .unwrap();
            assert_eq!(
                (lea.memory_base(), lea.memory_index()),
                (Register::RDI, Register::RSI)
            );
            let id = decoded
                .iter()
                .find(|i| i.code() == Code::Mov_r32_imm32)
                .unwrap();
            assert_eq!((id.op0_register(), id.immediate32()), (Register::ESI, 9));
            assert_eq!(decoded.last().unwrap().near_branch_target(), 0x1000);
        }
        // From the check's jump through its stub, rsp comes back to the
        // load's, whatever the check saved.
        let saving = [
            flags_dead,
            flags_live,
            SpatialProbe {
                save_scratch: true,
                ..flags_dead
            },
            SpatialProbe {
                save_scratch: true,
                ..flags_live
            },
        ];
        for probe in saving {
            let mut code = Vec::new();
            let hash = SpatialHash::default_rate();
            spatial_check(&load, probe, (0x1000, 0x2000), (hash, false), &mut code);
            let jump = code
                .iter()
                .position(|i| i.code() == Code::Jb_rel32_64)
                .unwrap();
            code.truncate(jump);
            spatial_stub(&load, 9, probe, (0x2000, 0x1000), entry, &mut code);
            let mut rsp = 0i64;
            for insn in assemble(&code, 0x1000) {
                rsp += match insn.code() {
                    Code::Push_r64 | Code::Pushfq => -8,
                    Code::Pop_r64 | Code::Popfq => 8,
                    Code::Add_rm64_imm8 => insn.immediate8to64(),
                    Code::Sub_rm64_imm8 => -insn.immediate8to64(),
                    Code::Lea_r64_m if insn.op0_register() == Register::RSP => {
                        insn.memory_displacement64() as i64
                    }
                    Code::Lea_r64_m if insn.op0_register() == Register::RDI => {
                        // The address of [rdi+rsi*8+16], not rsp-relative.
                        assert_eq!(insn.memory_displacement64(), 16);
                        0
                    }
                    Code::Call_rel32_64 => {
                        assert!(rsp <= -RED_ZONE - 16, "{probe:?}: {rsp}");
                        0
                    }
                    _ => 0,
                };
            }
            assert_eq!(rsp, 0, "{probe:?}");
        }
        // The same length either way: the append costs no stub bytes.
        let sizes: Vec<usize> = [(flags_dead, entry), (flags_dead, library)]
            .into_iter()
            .map(|(p, e)| {
                let mut stub = Vec::new();
                spatial_stub(&load, 9, p, (0x2000, 0x1000), e, &mut stub);
                stub.len()
            })
            .collect();
        assert_eq!(sizes[0], sizes[1]);
    }

    /// Runs the decoded check (`lea` and `shr` or `rorx`, `imul`, `cmp`, `jb`) on the
    /// given registers: whether the `jb` is taken.
    fn run_check(check: &[Instruction], regs: &HashMap<Register, u64>) -> bool {
        let mut r = 0u64;
        let mut below = false;
        for insn in check {
            match insn.code() {
                Code::Lea_r64_m => {
                    let reg = |x: Register| if x == Register::None { 0 } else { regs[&x] };
                    r = reg(insn.memory_base())
                        .wrapping_add(
                            reg(insn.memory_index())
                                .wrapping_mul(u64::from(insn.memory_index_scale())),
                        )
                        .wrapping_add(insn.memory_displacement64());
                }
                Code::Shr_rm64_imm8 => r >>= insn.immediate8(),
                Code::VEX_Rorx_r64_rm64_imm8 => {
                    r = regs[&insn.op1_register()].rotate_right(u32::from(insn.immediate8()));
                }
                // A 32-bit destination zero-extends into the register.
                Code::Imul_r32_rm32_imm32 => {
                    r = u64::from((r as u32).wrapping_mul(insn.immediate32()));
                }
                Code::Cmp_rm32_imm32 => below = (r as u32) < insn.immediate32(),
                Code::Jb_rel32_64 | Code::Jb_rel8_64 => return below,
                other => panic!("unexpected {other:?} in a spatial check"),
            }
        }
        panic!("no jb")
    }

    #[test]
    fn ptwrite_mode_spatial_check_writes_the_address_of_tracked_blocks() {
        let load = decode_one(&[0x48, 0x8b, 0x44, 0xcb, 0x40]); // mov rax,[rbx+rcx*8+0x40]
        let (stub, resume) = (0x2000u64, 0x1100u64);
        let check = SpatialProbe {
            scratch: Register::RDX,
            save_scratch: false,
            save_flags: false,
        };
        let mut all = Vec::new();
        spatial_check(
            &load,
            check,
            (0x1000, stub),
            (SpatialHash::default_rate(), false),
            &mut all,
        );
        assert_eq!(ptwrite(&load, resume, &mut all), 2);
        all.push(with_ip(load, 0x1200));
        let mut stubs = Vec::new();
        let at = spatial_ptwrite_stub(&load, check, stub, resume, &mut stubs);
        assert_eq!(stubs[at].code(), Code::Ptwrite_rm64);
        all.extend(stubs);
        let decoded = assemble(&all, 0x1000);
        // The encoder shortens the branches: compare mnemonics.
        let codes: Vec<Mnemonic> = decoded.iter().map(|i| i.mnemonic()).collect();
        assert_eq!(
            codes,
            [
                // In line: the block hash test, the operand ptwrites, the load.
                Mnemonic::Lea,
                Mnemonic::Shr,
                Mnemonic::Imul,
                Mnemonic::Cmp,
                Mnemonic::Jb,
                Mnemonic::Ptwrite,
                Mnemonic::Ptwrite,
                Mnemonic::Mov,
                // The stub: the address, written, then back to the ptwrites.
                Mnemonic::Lea,
                Mnemonic::Push,
                Mnemonic::Lea,
                Mnemonic::Ptwrite,
                Mnemonic::Pop,
                Mnemonic::Lea,
                Mnemonic::Jmp,
            ]
        );
        assert_eq!(decoded[5].op0_register(), Register::RBX);
        assert_eq!(decoded[6].op0_register(), Register::RCX);
        let stub_start = decoded[8].ip();
        assert_eq!(decoded[4].near_branch_target(), stub_start);
        assert_eq!(decoded[11].op0_register(), Register::RDI);
        assert_eq!(decoded[10].op0_register(), Register::RDI);
        assert_eq!(decoded[14].near_branch_target(), decoded[5].ip());
        // The stub's address is the load's: same registers, scale, displacement.
        let (a, b) = (&decoded[0], &decoded[10]);
        assert_eq!(
            (
                a.memory_base(),
                a.memory_index(),
                a.memory_index_scale(),
                a.memory_displacement64()
            ),
            (
                b.memory_base(),
                b.memory_index(),
                b.memory_index_scale(),
                b.memory_displacement64()
            )
        );
        // Executed on addresses, the test tracks exactly the blocks the
        // trace's hash tracks at the default rate, and 1/128 of them.
        let sampling = memgaze_trace::SpatialSampling::with_rate(1.0 / 128.0).unwrap();
        let mut rng = 0x1234_5678_9abc_def0u64;
        let mut tracked = 0u64;
        let n = 200_000u64;
        for k in 0..n {
            rng = rng
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            // Half sequential blocks, half scattered addresses.
            let (rbx, rcx) = if k % 2 == 0 {
                (0x7f00_0000_0000, k * 8)
            } else {
                (rng >> 17, rng & 0xfff)
            };
            let regs = HashMap::from([(Register::RBX, rbx), (Register::RCX, rcx)]);
            let taken = run_check(&decoded[..5], &regs);
            let address = rbx.wrapping_add(rcx.wrapping_mul(8)).wrapping_add(0x40);
            assert_eq!(taken, sampling.tracks(address), "address {address:#x}");
            tracked += u64::from(taken);
        }
        let rate = tracked as f64 / n as f64;
        assert!((rate - 1.0 / 128.0).abs() < 0.002, "tracked share {rate}");
    }

    #[test]
    fn rorx_takes_the_block_only_from_a_plain_64_bit_register() {
        let free = SpatialProbe {
            scratch: Register::RDX,
            save_scratch: false,
            save_flags: false,
        };
        let saving = SpatialProbe {
            save_scratch: true,
            ..free
        };
        let cases: [(&[u8], SpatialProbe, Option<Register>); 7] = [
            (&[0x48, 0x8b, 0x07], free, Some(Register::RDI)), // mov rax,[rdi]
            (&[0x49, 0x8b, 0x00], saving, Some(Register::R8)), // mov rax,[r8]
            (&[0x48, 0x8b, 0x04, 0x24], free, Some(Register::RSP)), // mov rax,[rsp]
            (&[0x48, 0x8b, 0x04, 0x24], saving, None),        // rsp moved by the saves
            (&[0x48, 0x8b, 0x47, 0x08], free, None),          // mov rax,[rdi+8]
            (&[0x48, 0x8b, 0x04, 0xcf], free, None),          // mov rax,[rdi+rcx*8]
            (&[0x67, 0x48, 0x8b, 0x07], free, None),          // mov rax,[edi]
        ];
        for (bytes, probe, source) in cases {
            let load = decode_one(bytes);
            assert_eq!(rorx_source(&load, probe), source, "{load}");
            let hash = SpatialHash::default_rate();
            for rorx in [false, true] {
                let mut out = Vec::new();
                spatial_check(&load, probe, (0x1000, 0x2000), (hash, rorx), &mut out);
                let codes: Vec<Code> = assemble(&out, 0x1000).iter().map(|i| i.code()).collect();
                let uses_rorx = codes.contains(&Code::VEX_Rorx_r64_rm64_imm8);
                assert_eq!(uses_rorx, rorx && source.is_some(), "{load}");
                assert_eq!(!uses_rorx, codes.contains(&Code::Shr_rm64_imm8), "{load}");
            }
        }
    }

    #[test]
    fn a_skipped_spatial_check_decodes_to_nops_or_one_jump_to_the_load() {
        let load = decode_one(&[0x48, 0x8b, 0x04, 0x24]); // mov rax,[rsp]
        let cases = [
            (
                SpatialProbe {
                    scratch: Register::RDX,
                    save_scratch: false,
                    save_flags: false,
                },
                true,
            ),
            (
                SpatialProbe {
                    scratch: Register::RCX,
                    save_scratch: true,
                    save_flags: true,
                },
                false,
            ),
        ];
        for ((probe, nops), rorx) in cases.into_iter().flat_map(|c| [(c, false), (c, true)]) {
            let mut out = Vec::new();
            let hash = SpatialHash::default_rate();
            spatial_check(&load, probe, (0x1000, 0x2000), (hash, rorx), &mut out);
            let len = assemble(&out, 0x1000)
                .iter()
                .map(Instruction::len)
                .sum::<usize>();
            let bytes = spatial_skip(len, probe.pushed() > 0);
            assert_eq!(bytes.len(), len);
            let mut decoder = iced_x86::Decoder::with_ip(64, &bytes, 0x1000, 0);
            let first = decoder.decode();
            if nops {
                let mut all = vec![first];
                all.extend(decoder.iter());
                assert!(all.len() <= 3, "{all:?}");
                assert!(all.iter().all(|i| i.mnemonic() == iced_x86::Mnemonic::Nop));
            } else {
                assert_eq!(first.mnemonic(), iced_x86::Mnemonic::Jmp);
                assert_eq!(first.near_branch_target(), 0x1000 + len as u64);
            }
        }
        for len in [1, 2, 11, 20, 21, 29, 30] {
            let bytes = spatial_skip(len, false);
            let decoded: Vec<Instruction> = iced_x86::Decoder::with_ip(64, &bytes, 0, 0)
                .iter()
                .collect();
            assert_eq!(decoded.iter().map(Instruction::len).sum::<usize>(), len);
            assert!(
                decoded
                    .iter()
                    .all(|i| i.mnemonic() == iced_x86::Mnemonic::Nop)
            );
        }
        let far = spatial_skip(300, true);
        assert_eq!(
            iced_x86::Decoder::with_ip(64, &far, 0, 0)
                .decode()
                .near_branch_target(),
            300
        );
    }

    /// The emitted check, its immediates patched as the runtime patches
    /// them (at the offsets the rewriter's table records), decides exactly
    /// as the trace's hash of the same words, for every rate and multiplier
    /// in a sample, and the same for every address of a block; in both
    /// forms (`lea; shr` and `rorx`).
    #[test]
    fn patched_spatial_checks_test_the_traces_hash_of_any_rate() {
        let indexed = decode_one(&[0x4a, 0x8b, 0x04, 0xc7]); // mov rax,[rdi+r8*8]
        let plain = decode_one(&[0x48, 0x8b, 0x07]); // mov rax,[rdi]
        let mut rng = 0x0123_4567_89ab_cdefu64;
        let mut next = || crate::binary::xorshift64(&mut rng);
        let probes = [
            SpatialProbe {
                scratch: Register::R11,
                save_scratch: false,
                save_flags: false,
            },
            SpatialProbe {
                scratch: Register::RCX,
                save_scratch: true,
                save_flags: true,
            },
        ];
        let forms = [
            (indexed, false),
            (indexed, true),
            (plain, false),
            (plain, true),
        ];
        for (probe, (load, rorx)) in probes.into_iter().flat_map(|p| forms.map(|f| (p, f))) {
            let mut out = Vec::new();
            spatial_check(
                &load,
                probe,
                (0x1000, 0x2000),
                (SpatialHash::default_rate(), rorx),
                &mut out,
            );
            let mut encoder = iced_x86::Encoder::new(64);
            let mut bytes = Vec::new();
            for insn in &out {
                encoder.encode(insn, 0x1000 + bytes.len() as u64).unwrap();
                bytes.extend(encoder.take_buffer());
            }
            let uses_rorx = out.iter().any(|i| i.code() == Code::VEX_Rorx_r64_rm64_imm8);
            assert_eq!(uses_rorx, rorx && load.memory_index() == Register::None);
            let (m_at, t_at) = spatial_immediates(&bytes).unwrap();
            for rate in [1.0, 0.5, 1.0 / 3.0, 0.01, 1.0 / 128.0, 1e-6, 1e-12] {
                let mut sampling = memgaze_trace::SpatialSampling::with_rate(rate).unwrap();
                if rate < 0.1 {
                    sampling.multiplier = (next() | 1) << 32;
                }
                let (m, t) = sampling.immediates().unwrap();
                let mut patched = bytes.clone();
                patched[m_at as usize..][..4].copy_from_slice(&m.to_le_bytes());
                patched[t_at as usize..][..4].copy_from_slice(&t.to_le_bytes());
                let decoded: Vec<Instruction> = iced_x86::Decoder::with_ip(64, &patched, 0x1000, 0)
                    .iter()
                    // The check's saves and restores: not part of the test.
                    .filter(|i| {
                        let saves = matches!(
                            i.code(),
                            Code::Pushfq | Code::Popfq | Code::Push_r64 | Code::Pop_r64
                        );
                        let moves_rsp =
                            i.code() == Code::Lea_r64_m && i.op0_register() == Register::RSP;
                        !saves && !moves_rsp
                    })
                    .collect();
                for _ in 0..20_000 {
                    let (rdi, r8) = (next() >> 16, next() & 0xffff);
                    let address = match load.memory_index() {
                        Register::None => rdi,
                        _ => rdi.wrapping_add(r8 * 8),
                    };
                    let regs = HashMap::from([(Register::RDI, rdi), (Register::R8, r8)]);
                    let taken = run_check(&decoded, &regs);
                    assert_eq!(taken, sampling.tracks(address), "rate {rate} {address:#x}");
                    let block = address & !63;
                    assert_eq!(sampling.tracks(block), sampling.tracks(block + 63));
                }
            }
        }
        assert_eq!(spatial_immediates(&[0x0f, 0x0b]), None);
    }

    #[test]
    fn ptwrite_writes_base_then_index() {
        let load = decode_one(&[0x8b, 0x04, 0x8f]); // mov eax,[rdi+rcx*4]
        let mut out = Vec::new();
        assert_eq!(ptwrite(&load, 0x1000, &mut out), 2);
        assert_eq!(out[0].op0_register(), Register::RDI);
        assert_eq!(out[1].op0_register(), Register::RCX);
        let rip = decode_one(&[0x48, 0x8b, 0x05, 0x00, 0x01, 0x00, 0x00]);
        assert_eq!(ptwrite(&rip, 0x1000, &mut Vec::new()), 0);
    }
}
