//! Encoding the copies of all selected functions, with their probes, as one
//! block of code (see [`assemble`]).
//!
//! Every original instruction keeps its address as its identity, so a
//! branch to any instruction of any relocated function (its own loops, a
//! tail call, gcc's `.cold` parts) is re-targeted to the copy; branches
//! elsewhere keep their absolute target. The first inserted instruction
//! before a load takes the load's address (branches to the load run its
//! probe) and the load itself, like every label the probes need, gets a
//! unique fake address from a range no code uses.
//!
//! RIP-relative *memory operands* are not branches: a `lea` of a function's
//! address or a load of data that sits between functions must keep meaning
//! the original address, so [`assemble`] re-encodes them with their
//! absolute target, never resolved to a copy.

use super::probe::{self, FastPath};
use crate::annotation::{PtwriteOperand, PtwriteSite};
use crate::binary::FunctionCode;
use anyhow::{Result, anyhow, bail};
use iced_x86::{Code, Encoder, FlowControl, IcedError, Instruction, OpKind, Register};

/// What to insert before one instruction of a copy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Insert {
    /// A software counting probe for load `id`.
    Soft {
        /// Load id (annotation index) passed to the runtime.
        id: u32,
        /// Fast-path variant.
        fast: FastPath,
    },
    /// `ptwrite` of the source registers of load `id`.
    Ptwrite {
        /// Load id (annotation index).
        id: u32,
    },
}

/// A superblock whose instrumented loads are counted by one check (see
/// [`probe`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Superblock {
    /// Instruction index of the check (flags dead there).
    pub at: usize,
    /// Index of its last instruction.
    pub last: usize,
    /// The loads it counts: `(instruction index, load id, probe variant)`,
    /// in order; their probes live in the superblock's counting fragment.
    pub loads: Vec<(usize, u32, FastPath)>,
    /// Side exits: `(index of the conditional branch, loads it skips)`.
    pub exits: Vec<(usize, u32)>,
}

/// One function to copy.
pub struct CopyPlan<'a> {
    /// Its code and control flow.
    pub code: &'a FunctionCode,
    /// `(instruction index, insert)`, sorted by index.
    pub inserts: Vec<(usize, Insert)>,
    /// Superblocks counted by one check, sorted by index.
    pub superblocks: Vec<Superblock>,
    /// A call placed before the first instruction (region marker hooks).
    pub prologue_call: Option<u64>,
}

/// Where one copy landed.
#[derive(Clone, Debug)]
pub struct CopyMap {
    /// Original start.
    pub original_start: u64,
    /// Original end.
    pub original_end: u64,
    /// Address of the copy.
    pub start: u64,
    /// End of the copied body (its slow stubs follow).
    pub body_end: u64,
    /// End of the copy including stubs.
    pub end: u64,
    /// Copy address of each original instruction (of its probe, if any).
    pub addresses: Vec<u64>,
    /// Original address of each instruction.
    pub original: Vec<u64>,
}

impl CopyMap {
    /// The copy address for an original instruction boundary or the end.
    pub fn map(&self, addr: u64) -> Option<u64> {
        if addr == self.original_end {
            return Some(self.body_end);
        }
        self.original
            .binary_search(&addr)
            .ok()
            .map(|i| self.addresses[i])
    }
}

/// The encoded copies.
pub struct Copies {
    /// Machine code, to be placed at the base passed to [`encode`].
    pub code: Vec<u8>,
    /// One map per plan, in plan order.
    pub maps: Vec<CopyMap>,
    /// Every `ptwrite` emitted (ptwrite mode), with its final address.
    pub ptwrites: Vec<PtwriteSite>,
}

/// Fake addresses for labels: far above any user-space address.
const FAKE_BASE: u64 = 0xffff_f000_0000_0000;

/// Encodes the copies of `plans` at `base`. `record` is the runtime's slow
/// path. Fails with the address of an instruction the encoder refused.
pub fn encode(plans: &[CopyPlan<'_>], base: u64, record: u64) -> Result<Copies> {
    let mut all: Vec<Instruction> = Vec::new();
    let mut fake = FAKE_BASE;
    let mut next_fake = || {
        fake += 1;
        fake
    };
    // Per plan: index in `all` of each original instruction's first emitted
    // instruction, of the body end, and of the plan end.
    let mut firsts: Vec<Vec<usize>> = Vec::with_capacity(plans.len());
    let mut body_ends = Vec::with_capacity(plans.len());
    let mut ends = Vec::with_capacity(plans.len());
    // (index in `all`, load id, operand) of every emitted ptwrite.
    let mut ptwrite_at: Vec<(usize, u32, PtwriteOperand)> = Vec::new();

    for plan in plans {
        let code = plan.code;
        let mut first = Vec::with_capacity(code.instructions.len());
        let mut stubs: Vec<Instruction> = Vec::new();
        let mut fragments: Vec<Instruction> = Vec::new();
        let mut inserts = plan.inserts.iter().peekable();
        let mut checks = plan.superblocks.iter().peekable();
        // Side exits of superblocks: branch index → loads to give back.
        let exits: std::collections::HashMap<usize, u32> = plan
            .superblocks
            .iter()
            .flat_map(|b| b.exits.iter().copied())
            .collect();
        for (i, original) in code.instructions.iter().enumerate() {
            first.push(all.len());
            let ip = original.ip();
            // The address the next emitted instruction must carry: the
            // original one first, then a block check's resume label.
            let mut label = ip;
            if i == 0
                && let Some(target) = plan.prologue_call
            {
                let mut call = Instruction::with_branch(Code::Call_rel32_64, target)?;
                call.set_ip(label);
                all.push(call);
                label = 0;
            }
            if let Some(block) = checks.next_if(|b| b.at == i) {
                let loads = block.loads.len() as u32;
                let stub = next_fake();
                let fragment = next_fake();
                probe::block_check(loads, label, stub, &mut all);
                probe::block_stub(loads, stub, fragment, &mut stubs);
                label = 0;
                counting_fragment(
                    code,
                    block,
                    fragment,
                    record,
                    &mut next_fake,
                    &mut fragments,
                    &mut stubs,
                );
            }
            let mut insn = *original;
            match inserts
                .next_if(|&&(index, _)| index == i)
                .map(|&(_, ins)| ins)
            {
                Some(Insert::Soft { id, fast }) => {
                    let slow = next_fake();
                    let resume = next_fake();
                    probe::soft_fast_path(fast, label, slow, &mut all);
                    label = 0;
                    insn.set_ip(resume);
                    probe::soft_slow_stub(fast, &insn, id, slow, resume, record, &mut stubs);
                }
                Some(Insert::Ptwrite { id }) => {
                    let at = all.len();
                    if probe::ptwrite(&insn, label, &mut all) > 0 {
                        label = 0;
                    }
                    for (k, j) in (at..all.len()).enumerate() {
                        let operand = if k == 0 && insn.memory_base().is_gpr() {
                            PtwriteOperand::Base
                        } else {
                            PtwriteOperand::Index
                        };
                        ptwrite_at.push((j, id, operand));
                    }
                }
                None => {}
            }
            if let Some(&skipped) = exits.get(&i) {
                let stub = next_fake();
                probe::exit_stub(skipped, stub, insn.near_branch_target(), &mut stubs);
                insn.set_near_branch64(stub);
            }
            if insn.ip() == ip {
                insn.set_ip(label);
            }
            all.push(insn);
        }
        body_ends.push(all.len());
        all.extend(fragments);
        all.extend(stubs);
        ends.push(all.len());
        firsts.push(first);
    }

    let (code, offsets) = assemble(&all, base)?;
    let code_len = code.len() as u64;
    let address_of = |i: usize| -> u64 {
        match offsets.get(i) {
            Some(&offset) => base + offset,
            None => base + code_len,
        }
    };

    let maps = plans
        .iter()
        .enumerate()
        .map(|(p, plan)| CopyMap {
            original_start: plan.code.start,
            original_end: plan.code.end,
            start: address_of(firsts[p][0]),
            body_end: address_of(body_ends[p]),
            end: address_of(ends[p]),
            addresses: firsts[p].iter().map(|&i| address_of(i)).collect(),
            original: plan.code.instructions.iter().map(|i| i.ip()).collect(),
        })
        .collect();
    let ptwrites = ptwrite_at
        .into_iter()
        .map(|(i, load, operand)| PtwriteSite {
            ip: address_of(i),
            load,
            operand,
        })
        .collect();
    Ok(Copies {
        code,
        maps,
        ptwrites,
    })
}

/// How an instruction is laid out by [`assemble`].
enum Piece {
    /// Position-independent: these bytes of the pool.
    Fixed(u32, u8),
    /// A relative branch in its rel32 form, re-encoded at its address.
    Near,
    /// `jrcxz`/`loop`-style rel8-only branch of this size, expanded to
    /// `jcx L1; jmp short L2; L1: jmp rel32 target; L2:`.
    Short(u8),
    /// A RIP-relative memory operand, re-encoded at its address (it keeps
    /// its absolute target).
    RipRelative(u8),
}

/// Lays out and encodes `all` at `base`: every branch in its rel32 form
/// (so sizes are known in one pass; no relaxation), branch targets that
/// are the address of an instruction of the list resolved to its new
/// address, every other target and every RIP-relative operand kept
/// absolute. Returns the code and each instruction's offset.
///
/// One encoding per instruction (two for branches and RIP-relative
/// operands): iced's `BlockEncoder`, which encodes each instruction several
/// times while it shrinks branches, was most of the rewriter's time.
fn assemble(all: &[Instruction], base: u64) -> Result<(Vec<u8>, Vec<u64>)> {
    let mut encoder = Encoder::new(64);
    let mut pool: Vec<u8> = Vec::with_capacity(all.len() * 5);
    let mut pieces = Vec::with_capacity(all.len());
    let mut offsets = Vec::with_capacity(all.len());
    let mut at = 0u64;
    let fail = |insn: &Instruction, e: IcedError| {
        anyhow!(
            "cannot encode {:?} (from {:#x}): {e}",
            insn.code(),
            insn.ip()
        )
    };
    for insn in all {
        offsets.push(at);
        let piece = if is_relative_branch(insn) {
            let short = matches!(
                insn.code(),
                Code::Jrcxz_rel8_64
                    | Code::Jecxz_rel8_64
                    | Code::Loop_rel8_64_RCX
                    | Code::Loop_rel8_64_ECX
                    | Code::Loope_rel8_64_RCX
                    | Code::Loope_rel8_64_ECX
                    | Code::Loopne_rel8_64_RCX
                    | Code::Loopne_rel8_64_ECX
            );
            if short {
                let mut probe = *insn;
                probe.set_near_branch64(base + 2);
                let size = encoder.encode(&probe, base).map_err(|e| fail(insn, e))? as u8;
                discard(&mut encoder);
                at += u64::from(size) + 2 + 5;
                Piece::Short(size)
            } else {
                let mut near = *insn;
                near.as_near_branch();
                if near.code() == Code::Xbegin_rel16 {
                    near.set_code(Code::Xbegin_rel32);
                }
                near.set_near_branch64(base);
                let size = encoder.encode(&near, base).map_err(|e| fail(insn, e))?;
                discard(&mut encoder);
                at += size as u64;
                Piece::Near
            }
        } else if insn.is_ip_rel_memory_operand() {
            let size = encoder.encode(insn, base).map_err(|e| fail(insn, e))? as u8;
            discard(&mut encoder);
            at += u64::from(size);
            Piece::RipRelative(size)
        } else {
            let size = encoder.encode(insn, 0).map_err(|e| fail(insn, e))?;
            let start = pool.len() as u32;
            drain_into(&mut encoder, &mut pool);
            at += size as u64;
            Piece::Fixed(start, size as u8)
        };
        pieces.push(piece);
    }
    // Label → instruction (addresses carried by more than one instruction
    // are refused: the first inserted instruction takes a load's address,
    // the load itself a fake one).
    let mut labels: Vec<(u64, u32)> = all
        .iter()
        .enumerate()
        .filter(|(_, i)| i.ip() != 0)
        .map(|(n, i)| (i.ip(), n as u32))
        .collect();
    labels.sort_unstable();
    if let Some(w) = labels.windows(2).find(|w| w[0].0 == w[1].0) {
        bail!("two instructions claim address {:#x}", w[0].0);
    }
    let resolve = |target: u64| -> u64 {
        match labels.binary_search_by_key(&target, |&(ip, _)| ip) {
            Ok(i) => base + offsets[labels[i].1 as usize],
            Err(_) => target,
        }
    };
    let mut code = Vec::with_capacity(at as usize);
    for (n, (insn, piece)) in all.iter().zip(&pieces).enumerate() {
        let here = base + offsets[n];
        debug_assert_eq!(code.len() as u64, offsets[n]);
        match *piece {
            Piece::Fixed(start, size) => {
                code.extend_from_slice(&pool[start as usize..start as usize + size as usize])
            }
            Piece::Near => {
                let mut near = *insn;
                near.as_near_branch();
                if near.code() == Code::Xbegin_rel16 {
                    near.set_code(Code::Xbegin_rel32);
                }
                near.set_near_branch64(resolve(insn.near_branch_target()));
                encoder.encode(&near, here).map_err(|e| fail(insn, e))?;
                drain_into(&mut encoder, &mut code);
            }
            Piece::Short(size) => {
                let mut jcx = *insn;
                let over = here + u64::from(size) + 2;
                jcx.set_near_branch64(over);
                encoder.encode(&jcx, here).map_err(|e| fail(insn, e))?;
                drain_into(&mut encoder, &mut code);
                code.extend_from_slice(&[0xeb, 0x05]); // jmp short past the jmp rel32
                let target = resolve(insn.near_branch_target());
                let rel = i32::try_from(target as i64 - (over + 5) as i64)
                    .map_err(|_| anyhow!("branch target {target:#x} out of reach"))?;
                code.push(0xe9);
                code.extend_from_slice(&rel.to_le_bytes());
            }
            Piece::RipRelative(size) => {
                let written = encoder.encode(insn, here).map_err(|e| fail(insn, e))?;
                if written != size as usize {
                    bail!("RIP-relative {:?} changed size", insn.code());
                }
                drain_into(&mut encoder, &mut code);
            }
        }
    }
    Ok((code, offsets))
}

/// Moves the encoder's output to `out`, keeping its buffer's allocation.
fn drain_into(encoder: &mut Encoder, out: &mut Vec<u8>) {
    let mut buffer = encoder.take_buffer();
    out.extend_from_slice(&buffer);
    buffer.clear();
    encoder.set_buffer(buffer);
}

/// Drops the encoder's output (a size probe).
fn discard(encoder: &mut Encoder) {
    let mut buffer = encoder.take_buffer();
    buffer.clear();
    encoder.set_buffer(buffer);
}

/// Whether `insn` has a relative branch target (near `jmp`/`jcc`/`call`,
/// `jrcxz`/`loop`, `xbegin`).
fn is_relative_branch(insn: &Instruction) -> bool {
    matches!(
        insn.op0_kind(),
        OpKind::NearBranch64 | OpKind::NearBranch32 | OpKind::NearBranch16
    )
}

/// Appends the counting fragment of a superblock at `label`: its
/// instructions from the check on, with a counting probe before each of its
/// loads, ending with a jump back into the copy (before a final call, which
/// stays in the copy so that return addresses keep their unwind
/// information). Its branches go straight into the copy: a side exit taken
/// here skips loads that were never counted.
fn counting_fragment(
    code: &FunctionCode,
    block: &Superblock,
    label: u64,
    record: u64,
    next_fake: &mut dyn FnMut() -> u64,
    out: &mut Vec<Instruction>,
    stubs: &mut Vec<Instruction>,
) {
    let mut first = label;
    let mut loads = block.loads.iter().peekable();
    for i in block.at..=block.last {
        let original = code.instructions[i];
        if i == block.last
            && matches!(
                original.flow_control(),
                FlowControl::Call | FlowControl::IndirectCall
            )
        {
            let mut back =
                Instruction::with_branch(Code::Jmp_rel32_64, original.ip()).expect("valid jmp");
            back.set_ip(first);
            out.push(back);
            return;
        }
        let mut insn = original;
        insn.set_ip(0);
        if let Some(&(_, id, fast)) = loads.next_if(|&&(index, _, _)| index == i) {
            let slow = next_fake();
            let resume = next_fake();
            probe::soft_fast_path(fast, first, slow, out);
            insn.set_ip(resume);
            probe::soft_slow_stub(fast, &insn, id, slow, resume, record, stubs);
        } else if first != 0 {
            insn.set_ip(first);
        }
        first = 0;
        out.push(insn);
    }
    let last = &code.instructions[block.last];
    if !matches!(
        last.flow_control(),
        FlowControl::Return | FlowControl::UnconditionalBranch | FlowControl::IndirectBranch
    ) {
        let next = last.next_ip();
        out.push(Instruction::with_branch(Code::Jmp_rel32_64, next).expect("valid jmp"));
    }
}

/// Why a function's code cannot be copied faithfully, if it cannot.
pub fn unrelocatable(code: &FunctionCode) -> Option<String> {
    if code.instructions.is_empty() {
        return Some("no instructions".into());
    }
    if code.invalid_instructions > 0 {
        return Some("bytes that do not decode as instructions".into());
    }
    for insn in &code.instructions {
        let next = insn.next_ip();
        if matches!(insn.code(), Code::Call_rel32_64) && insn.near_branch_target() == next {
            return Some(format!(
                "call to the next instruction at {:#x} (reads its own address)",
                insn.ip()
            ));
        }
        if insn.is_ip_rel_memory_operand() && insn.memory_base() == Register::EIP {
            return Some(format!("32-bit EIP-relative operand at {:#x}", insn.ip()));
        }
        if matches!(
            insn.op0_kind(),
            OpKind::NearBranch16 | OpKind::NearBranch32 | OpKind::FarBranch16 | OpKind::FarBranch32
        ) {
            return Some(format!("unusual branch at {:#x}", insn.ip()));
        }
        if insn.is_jcc_short_or_near() || insn.is_jmp_short_or_near() || insn.is_call_near() {
            let target = insn.near_branch_target();
            if target >= code.start && target < code.end && code.instruction_at(target).is_none() {
                return Some(format!(
                    "branch at {:#x} into the middle of an instruction ({target:#x})",
                    insn.ip()
                ));
            }
        }
    }
    None
}
