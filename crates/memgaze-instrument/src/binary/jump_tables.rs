//! Jump-table recognition for indirect `jmp`s.
//!
//! Recognised shapes (what gcc, clang and rustc emit for dense `switch`/
//! `match`):
//!
//! * absolute: `jmp [T + idx*8]`, or `mov r, [T + idx*8]` … `jmp r`
//!   (non-PIC code), also with the table base in a register set by
//!   `lea b, [rip+T]`;
//! * relative (PIC): `lea b, [rip+T]` … `movsxd r, dword [b + idx*4]` …
//!   `add r, b` … `jmp r` (entries are offsets from `T`).
//!
//! The entry count comes from the bounds check guarding the jump:
//! `cmp idx, N` with `ja`/`jae` (or `jbe`/`jb` towards the table),
//! followed through register copies and zero/sign extensions, or an
//! `and idx, mask`. Without one (LLVM omits it for exhaustive `match`es on
//! enums) entries are read while they land on instructions of the function,
//! stopping at another table of the same function. Every entry of a table
//! with a known bound must land on an instruction start of the function or
//! outside it (split-off cold code), else the jump stays unresolved. An
//! index zero-extended from a byte bounds the table at 256 entries, and
//! then entries outside the function are read too: computed-goto
//! interpreters (CPython's `opcode_targets`) send unused opcodes to a
//! handler in the function's `.cold` part. A table of 8-byte pointers none
//! of which lands in the function is a dispatch of function pointers, a
//! tail call.
//!
//! The backward slice follows the linear predecessor of each instruction,
//! or the single branch that reaches it when nothing falls through into it;
//! at a merge it stops.

use super::cfg::{BranchSources, Memory};
use super::usage::Usages;
use foldhash::{HashSet, HashSetExt};
use iced_x86::{FlowControl, Instruction, Mnemonic, OpAccess, OpKind, Register};

/// Longest backward slice examined, in instructions.
const SLICE_LIMIT: usize = 48;
/// Most entries read from a table.
const MAX_ENTRIES: u64 = 4096;
/// Entries a byte-wide index can select.
const BYTE_ENTRIES: u32 = 256;

/// How the entries encode targets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum JumpTableEntries {
    /// 8-byte absolute addresses.
    Absolute,
    /// 4-byte signed offsets added to `base` (normally the table address).
    Relative {
        /// What the offsets are relative to.
        base: u64,
    },
}

impl JumpTableEntries {
    /// Bytes per entry.
    pub(crate) fn entry_size(self) -> u64 {
        match self {
            JumpTableEntries::Absolute => 8,
            JumpTableEntries::Relative { .. } => 4,
        }
    }
}

/// Where the number of entries came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum JumpTableBound {
    /// A `cmp`/`ja`-style bounds check: exactly this many entries.
    Compare(u32),
    /// An `and idx, mask`: exactly `mask + 1` entries.
    Mask(u32),
    /// No bounds check found: entries read while they stay valid (at most
    /// this many, e.g. 256 for an index loaded as a byte).
    Scanned(u32),
}

/// A resolved jump table.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JumpTable {
    /// Address of the indirect `jmp`.
    pub jump: u64,
    /// Address of the first entry.
    pub table: u64,
    /// Entry encoding.
    pub entries: JumpTableEntries,
    /// Target of each entry, in table order (duplicates kept). With an
    /// exact bound, targets may lie outside the function (gcc's split-off
    /// `.cold` code): those are exits, not successors.
    pub targets: Vec<u64>,
    /// Where the count came from.
    pub bound: JumpTableBound,
    /// Address of the instruction that reads the entry (the `jmp` itself for
    /// `jmp [T + i*8]`).
    pub load: u64,
}

impl JumpTable {
    /// One past the table's last byte.
    pub fn table_end(&self) -> u64 {
        self.table + self.targets.len() as u64 * self.entries.entry_size()
    }
}

/// Walks instructions backwards along the unique path into each one.
pub(crate) struct Slicer<'a> {
    pub instructions: &'a [Instruction],
    /// Instruction index -> indices of direct branches targeting it.
    pub sources: &'a BranchSources,
}

/// How the slice reached an instruction from the one after it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Edge {
    FallThrough,
    Taken,
}

impl Slicer<'_> {
    fn prev(&self, i: usize) -> Option<(usize, Edge)> {
        let sources = self.sources.of_target(i as u32);
        let falls = i > 0 && falls_through(&self.instructions[i - 1]);
        match (falls, sources) {
            (true, []) => Some((i - 1, Edge::FallThrough)),
            (false, [one]) => Some((*one as usize, Edge::Taken)),
            _ => None,
        }
    }

    /// The instruction that last wrote `reg` before instruction `i`.
    fn find_def(&self, usages: &mut Usages, reg: Register, i: usize) -> Option<usize> {
        let mut at = i;
        for _ in 0..SLICE_LIMIT {
            let (p, _) = self.prev(at)?;
            if writes(usages, &self.instructions[p], reg) {
                return Some(p);
            }
            at = p;
        }
        None
    }

    /// Every instruction that may have last written `reg` before `i`,
    /// searching all known paths backwards (fall-through and direct
    /// branches). Paths into code reached only through unresolved indirect
    /// jumps add nothing; reaching the function entry, a call returning its
    /// value in `reg`, or too large a search gives `None`.
    fn reaching_defs(&self, usages: &mut Usages, reg: Register, i: usize) -> Option<Vec<usize>> {
        const VISIT_LIMIT: usize = 20_000;
        let mut defs = Vec::new();
        let mut seen = HashSet::new();
        let mut stack = vec![i];
        while let Some(at) = stack.pop() {
            let falls = at > 0 && falls_through(&self.instructions[at - 1]);
            let sources = self.sources.of_target(at as u32);
            if at == 0 {
                return None;
            }
            let preds = falls
                .then_some(at - 1)
                .into_iter()
                .chain(sources.iter().map(|&s| s as usize));
            for p in preds {
                if !seen.insert(p) {
                    continue;
                }
                if seen.len() > VISIT_LIMIT {
                    return None;
                }
                let insn = &self.instructions[p];
                if writes(usages, insn, reg) {
                    defs.push(p);
                } else if insn.flow_control() == FlowControl::Call
                    || insn.flow_control() == FlowControl::IndirectCall
                {
                    // A call returns its value in rax/rdx. Any other
                    // caller-saved register read after a call without being
                    // written again was not clobbered on a path that runs:
                    // the call does not return (`Perl_croak`, `abort`) or
                    // keeps it (gcc's `-fipa-ra`), so what reaches is what
                    // was written before the call.
                    if returns_in(reg) {
                        return None;
                    }
                    stack.push(p);
                } else {
                    stack.push(p);
                }
            }
        }
        Some(defs)
    }
}

/// Registers a call returns its value in (System V AMD64 ABI).
fn returns_in(reg: Register) -> bool {
    matches!(reg, Register::RAX | Register::RDX)
}

fn falls_through(insn: &Instruction) -> bool {
    matches!(
        insn.flow_control(),
        FlowControl::Next
            | FlowControl::ConditionalBranch
            | FlowControl::Call
            | FlowControl::IndirectCall
    ) && !insn.is_invalid()
}

/// Whether `insn` writes `reg` (any part of it), a full register (iced
/// names written registers by their full register: asked of a part, none
/// is).
fn writes(usages: &mut Usages, insn: &Instruction, reg: Register) -> bool {
    if reg.is_gpr64() {
        return usages.gpr_effects(insn).writes(reg);
    }
    if reg.is_gpr() {
        return false;
    }
    (usages.factory().info(insn).used_registers().iter()).any(|u| {
        u.register().full_register() == reg
            && matches!(
                u.access(),
                OpAccess::Write
                    | OpAccess::ReadWrite
                    | OpAccess::CondWrite
                    | OpAccess::ReadCondWrite
            )
    })
}

/// A recognised table load before its entries are read.
struct Shape {
    /// The instruction reading the entry.
    load: usize,
    /// Where the bound search starts, and what holds the index there.
    index_at: usize,
    index: Location,
    table: u64,
    entries: JumpTableEntries,
}

/// Something holding the table index: a register, or (unoptimised code) a
/// stack slot `[base + disp]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Location {
    Register(Register),
    Slot(Register, u64),
}

/// What an indirect jump turned out to be.
pub(crate) enum Recognised {
    Table(JumpTable),
    /// A jump to a code pointer read from memory: without an index, or from
    /// a constant table whose entries leave the function (dispatch tables of
    /// function pointers). A tail call.
    TailCall,
    /// `jmp r` with `r` computed in a way no jump table is (a function
    /// pointer from an argument or a call): unresolved unless the frame is
    /// torn down, which makes it a tail call.
    NotTableShaped,
}

/// Tries to resolve the indirect jump at instruction `j`.
pub(crate) fn recognise(
    slicer: &Slicer<'_>,
    j: usize,
    start: u64,
    end: u64,
    index_of: &super::cfg::IndexOf,
    memory: &dyn Memory,
) -> Option<Recognised> {
    let mut usages = Usages::new();
    let insns = slicer.instructions;
    let jmp = &insns[j];
    let shape = match jmp.op0_kind() {
        OpKind::Memory => table_operand(slicer, &mut usages, j, 8)?,
        OpKind::Register => {
            let r = jmp.op0_register().full_register();
            // Table dispatch computes the target right before the jump; a
            // register set on several paths is some other code pointer.
            let Some(d) = slicer.find_def(&mut usages, r, j) else {
                return Some(Recognised::NotTableShaped);
            };
            let def = &insns[d];
            match def.mnemonic() {
                Mnemonic::Mov if def.op1_kind() == OpKind::Memory => {
                    if def.memory_index() == Register::None {
                        return Some(Recognised::TailCall);
                    }
                    match table_operand(slicer, &mut usages, d, 8) {
                        Some(shape) => shape,
                        // Indexed from a non-constant base: a code pointer
                        // read from a data structure.
                        None => return Some(Recognised::NotTableShaped),
                    }
                }
                Mnemonic::Add
                    if def.op0_kind() == OpKind::Register && def.op1_kind() == OpKind::Register =>
                {
                    relative_shape(slicer, &mut usages, d)?
                }
                _ => return Some(Recognised::NotTableShaped),
            }
        }
        _ => return None,
    };
    let bound = find_bound(slicer, &mut usages, shape.index_at, shape.index);
    let limit = match bound {
        JumpTableBound::Compare(n) | JumpTableBound::Mask(n) | JumpTableBound::Scanned(n) => {
            u64::from(n).min(MAX_ENTRIES)
        }
    };
    let exact = !matches!(bound, JumpTableBound::Scanned(_));
    // A byte index: at most 256 entries, some of which may leave the
    // function (its cold part).
    let byte_wide = matches!(bound, JumpTableBound::Scanned(n) if n <= BYTE_ENTRIES);
    let size = shape.entries.entry_size();
    let mut targets = Vec::new();
    for k in 0..limit {
        let Some(bytes) = memory.read(shape.table + k * size, size as usize) else {
            break;
        };
        let target = match shape.entries {
            JumpTableEntries::Absolute => u64::from_le_bytes(bytes.try_into().ok()?),
            JumpTableEntries::Relative { base } => {
                let off = i32::from_le_bytes(bytes.try_into().ok()?);
                base.wrapping_add(off as i64 as u64)
            }
        };
        let inside = target >= start && target < end;
        if inside && !index_of.contains(target) {
            // Into the middle of an instruction: not a table of this code.
            if exact {
                return None;
            }
            break;
        }
        if !inside && !exact && !byte_wide {
            break;
        }
        targets.push(target);
    }
    let inside = targets.iter().filter(|&&t| t >= start && t < end).count();
    if inside == 0 {
        // Code pointers that leave the function: a dispatch tail call.
        let first_leaves = shape.entries == JumpTableEntries::Absolute
            && memory
                .read(shape.table, 8)
                .and_then(|b| b.try_into().ok())
                .map(u64::from_le_bytes)
                .is_some_and(|first| first < start || first >= end);
        return first_leaves.then_some(Recognised::TailCall);
    }
    if exact && targets.len() as u64 != limit {
        return None;
    }
    if byte_wide {
        // Entries past the last one inside the function are as likely to be
        // whatever follows the table.
        let last_inside = targets
            .iter()
            .rposition(|&t| t >= start && t < end)
            .expect("one entry is inside");
        if targets.len() as u64 != limit {
            targets.truncate(last_inside + 1);
        }
    }
    let bound = match bound {
        JumpTableBound::Scanned(_) => JumpTableBound::Scanned(targets.len() as u32),
        other => other,
    };
    Some(Recognised::Table(JumpTable {
        jump: jmp.ip(),
        table: shape.table,
        entries: shape.entries,
        targets,
        bound,
        load: insns[shape.load].ip(),
    }))
}

/// The value of `reg` before instruction `at` when it is a constant
/// address (`lea r,[rip+X]`, `mov r, imm`, plus constant offsets and
/// copies).
fn constant(
    slicer: &Slicer<'_>,
    usages: &mut Usages,
    reg: Register,
    at: usize,
    depth: u32,
) -> Option<u64> {
    if reg == Register::None {
        return Some(0);
    }
    if depth > 6 {
        return None;
    }
    let reg = reg.full_register();
    let d = match slicer.find_def(usages, reg, at) {
        Some(d) => d,
        None => {
            // Defined before a merge (a base hoisted out of a loop): the same
            // constant on every path.
            let defs = slicer.reaching_defs(usages, reg, at)?;
            let mut value = None;
            for d in defs {
                let v = constant_def(slicer, usages, d, depth)?;
                if value.is_some_and(|x| x != v) {
                    return None;
                }
                value = Some(v);
            }
            return value;
        }
    };
    constant_def(slicer, usages, d, depth)
}

/// The constant written by instruction `d`, if it writes one.
fn constant_def(slicer: &Slicer<'_>, usages: &mut Usages, d: usize, depth: u32) -> Option<u64> {
    let insn = &slicer.instructions[d];
    match insn.mnemonic() {
        Mnemonic::Lea if insn.memory_base() == Register::RIP => Some(insn.memory_displacement64()),
        Mnemonic::Lea if insn.memory_index() == Register::None => Some(
            constant(slicer, usages, insn.memory_base(), d, depth + 1)?
                .wrapping_add(insn.memory_displacement64()),
        ),
        Mnemonic::Mov if is_immediate(insn.op1_kind()) => Some(insn.immediate(1)),
        Mnemonic::Mov if insn.op1_kind() == OpKind::Register && insn.op1_register().size() == 8 => {
            constant(slicer, usages, insn.op1_register(), d, depth + 1)
        }
        Mnemonic::Add if is_immediate(insn.op1_kind()) => Some(
            constant(slicer, usages, insn.op0_register(), d, depth + 1)?
                .wrapping_add(insn.immediate(1)),
        ),
        _ => None,
    }
}

/// `(index location, where it is read, scale)` for a register used as a
/// table index before `at`: `lea r,[i*s]` and `shl r, k` are followed once
/// so that unoptimised code's pre-scaled indices are seen.
fn scaled_index(
    slicer: &Slicer<'_>,
    usages: &mut Usages,
    reg: Register,
    at: usize,
) -> (Register, usize, u64) {
    if let Some(d) = slicer.find_def(usages, reg.full_register(), at) {
        let insn = &slicer.instructions[d];
        match insn.mnemonic() {
            Mnemonic::Lea
                if insn.memory_base() == Register::None
                    && insn.memory_index() != Register::None
                    && insn.memory_displacement64() == 0 =>
            {
                return (insn.memory_index(), d, u64::from(insn.memory_index_scale()));
            }
            Mnemonic::Shl if is_immediate(insn.op1_kind()) && insn.immediate(1) <= 3 => {
                return (insn.op0_register(), d, 1 << insn.immediate(1));
            }
            _ => {}
        }
    }
    (reg, at, 1)
}

/// The table address and index of the memory operand of instruction `at`
/// reading `entry_size`-byte entries: `[T + i*s]`, `[b + i*s (+d)]` with
/// `b` constant, or (unoptimised) `[b + x]` with one of `b`, `x` constant
/// and the other a pre-scaled index.
fn table_operand(
    slicer: &Slicer<'_>,
    usages: &mut Usages,
    at: usize,
    entry_size: u64,
) -> Option<Shape> {
    let insn = &slicer.instructions[at];
    if u64::from(insn.memory_size().size() as u32) != entry_size {
        return None;
    }
    let (base, index, scale) = (
        insn.memory_base(),
        insn.memory_index(),
        u64::from(insn.memory_index_scale()),
    );
    let disp = insn.memory_displacement64();
    if index == Register::None || base == Register::RIP {
        return None;
    }
    let entries = if entry_size == 8 {
        JumpTableEntries::Absolute
    } else {
        // Filled in by the caller.
        JumpTableEntries::Relative { base: 0 }
    };
    if scale == entry_size {
        let t = constant(slicer, usages, base, at, 0)?;
        return Some(Shape {
            load: at,
            index_at: at,
            index: Location::Register(index),
            table: t.wrapping_add(disp),
            entries,
        });
    }
    if scale == 1 && base != Register::None {
        for (c, x) in [(base, index), (index, base)] {
            if let Some(t) = constant(slicer, usages, c, at, 0) {
                let (i, i_at, s) = scaled_index(slicer, usages, x, at);
                if s == entry_size {
                    return Some(Shape {
                        load: at,
                        index_at: i_at,
                        index: Location::Register(i),
                        table: t.wrapping_add(disp),
                        entries,
                    });
                }
            }
        }
    }
    None
}

/// `add r, s` where one operand is a sign-extended 32-bit entry load
/// (`movsxd x, dword [table]`, or `mov x32, dword [table]` then
/// `cdqe`/`movsxd`) and the other a constant base.
fn relative_shape(slicer: &Slicer<'_>, usages: &mut Usages, add: usize) -> Option<Shape> {
    let insns = slicer.instructions;
    let a = insns[add].op0_register().full_register();
    let b = insns[add].op1_register().full_register();
    for (value, other) in [(a, b), (b, a)] {
        let Some(load) = entry_load(slicer, usages, value, add) else {
            continue;
        };
        let Some(base) = constant(slicer, usages, other, add, 0) else {
            continue;
        };
        let mut shape = table_operand(slicer, usages, load, 4)?;
        shape.entries = JumpTableEntries::Relative { base };
        return Some(shape);
    }
    None
}

/// The instruction loading the 32-bit entry that ends up sign-extended in
/// `reg` before `at`.
fn entry_load(slicer: &Slicer<'_>, usages: &mut Usages, reg: Register, at: usize) -> Option<usize> {
    let d = slicer.find_def(usages, reg, at)?;
    let insn = &slicer.instructions[d];
    match insn.mnemonic() {
        Mnemonic::Movsxd if insn.op1_kind() == OpKind::Memory => Some(d),
        Mnemonic::Movsxd if insn.op1_kind() == OpKind::Register => {
            let l = slicer.find_def(usages, insn.op1_register().full_register(), d)?;
            let src = &slicer.instructions[l];
            (src.mnemonic() == Mnemonic::Mov && src.op1_kind() == OpKind::Memory).then_some(l)
        }
        Mnemonic::Cdqe => {
            let l = slicer.find_def(usages, Register::RAX, d)?;
            let src = &slicer.instructions[l];
            (src.mnemonic() == Mnemonic::Mov && src.op1_kind() == OpKind::Memory).then_some(l)
        }
        _ => None,
    }
}

/// The entry count implied by the code guarding the table load.
fn find_bound(
    slicer: &Slicer<'_>,
    usages: &mut Usages,
    start: usize,
    index: Location,
) -> JumpTableBound {
    let insns = slicer.instructions;
    let mut tracked: Vec<Location> = vec![match index {
        Location::Register(r) => Location::Register(r.full_register()),
        slot => slot,
    }];
    let mut cap = MAX_ENTRIES as u32;
    // The conditional branch most recently passed and how we came out of it.
    let mut pending: Option<(Mnemonic, Edge)> = None;
    let mut at = start;
    let slot_of = |insn: &Instruction| {
        (matches!(insn.memory_base(), Register::RBP | Register::RSP)
            && insn.memory_index() == Register::None)
            .then(|| Location::Slot(insn.memory_base(), insn.memory_displacement64()))
    };
    for _ in 0..SLICE_LIMIT {
        let Some((p, edge)) = slicer.prev(at) else {
            break;
        };
        let insn = &insns[p];
        at = p;
        if insn.flow_control() == FlowControl::ConditionalBranch {
            pending = Some((insn.mnemonic(), edge));
            continue;
        }
        if let Some((cc, edge)) = pending
            && insn.rflags_modified() != 0
        {
            pending = None;
            let compared = match insn.op0_kind() {
                OpKind::Register => Some(Location::Register(insn.op0_register().full_register())),
                OpKind::Memory => slot_of(insn),
                _ => None,
            };
            if insn.mnemonic() == Mnemonic::Cmp
                && compared.is_some_and(|c| tracked.contains(&c))
                && is_immediate(insn.op1_kind())
                && insn.immediate(1) < MAX_ENTRIES
            {
                let imm = insn.immediate(1) as u32;
                let count = match (cc, edge) {
                    (Mnemonic::Ja, Edge::FallThrough) | (Mnemonic::Jbe, Edge::Taken) => {
                        Some(imm + 1)
                    }
                    (Mnemonic::Jae, Edge::FallThrough) | (Mnemonic::Jb, Edge::Taken) => Some(imm),
                    _ => None,
                };
                if let Some(count) = count {
                    return JumpTableBound::Compare(count);
                }
            }
        }
        // Stores to a tracked slot end its tracking.
        if insn.op0_kind() == OpKind::Memory
            && let Some(slot) = slot_of(insn)
            && tracked.contains(&slot)
            && insn.mnemonic() != Mnemonic::Cmp
        {
            tracked.retain(|&t| t != slot);
        }
        let written: Vec<Register> = tracked
            .iter()
            .filter_map(|t| match *t {
                Location::Register(r) if writes(usages, insn, r) => Some(r),
                _ => None,
            })
            .collect();
        for r in written {
            tracked.retain(|&t| t != Location::Register(r));
            let copy = matches!(
                insn.mnemonic(),
                Mnemonic::Mov | Mnemonic::Movzx | Mnemonic::Movsxd | Mnemonic::Movsx
            );
            match insn.op1_kind() {
                OpKind::Register if copy => {
                    if insn.mnemonic() == Mnemonic::Movzx {
                        cap = cap.min(1 << (8 * insn.op1_register().size().min(2)));
                    }
                    tracked.push(Location::Register(insn.op1_register().full_register()));
                }
                OpKind::Memory if copy => {
                    if insn.mnemonic() == Mnemonic::Movzx {
                        cap = cap.min(1 << (8 * insn.memory_size().size().min(2)));
                    }
                    if let Some(slot) = slot_of(insn) {
                        tracked.push(slot);
                    }
                }
                kind if insn.mnemonic() == Mnemonic::And
                    && is_immediate(kind)
                    && insn.immediate(1) < MAX_ENTRIES =>
                {
                    return JumpTableBound::Mask(insn.immediate(1) as u32 + 1);
                }
                _ => {}
            }
        }
        if tracked.is_empty() {
            break;
        }
    }
    JumpTableBound::Scanned(cap)
}

fn is_immediate(kind: OpKind) -> bool {
    matches!(
        kind,
        OpKind::Immediate8
            | OpKind::Immediate16
            | OpKind::Immediate32
            | OpKind::Immediate64
            | OpKind::Immediate8to16
            | OpKind::Immediate8to32
            | OpKind::Immediate8to64
            | OpKind::Immediate32to64
    )
}

/// Cuts scanned tables where another table of the same function begins.
pub(crate) fn trim_overlapping(tables: &mut [JumpTable]) {
    let starts: Vec<u64> = tables.iter().map(|t| t.table).collect();
    for t in tables.iter_mut() {
        if !matches!(t.bound, JumpTableBound::Scanned(_)) {
            continue;
        }
        if let Some(&next) = starts.iter().filter(|&&s| s > t.table).min() {
            let size = t.entries.entry_size();
            let fit = ((next - t.table) / size) as usize;
            if fit < t.targets.len() {
                t.targets.truncate(fit.max(1));
                t.bound = JumpTableBound::Scanned(t.targets.len() as u32);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::binary::cfg::{FlatMemory, FunctionCode, IndirectJumpKind};
    use iced_x86::BlockEncoderOptions;
    use iced_x86::code_asm::*;

    /// Emits a switch: returns the table label and the case labels. Gets the
    /// case and table addresses of a first pass (empty on that pass) to fill
    /// in the entries.
    type Emit =
        dyn Fn(&mut CodeAssembler, &[u64], u64) -> Result<(CodeLabel, Vec<CodeLabel>), IcedError>;

    /// Assembles twice so that entries can hold real addresses; the function
    /// is the code up to the table, which follows it.
    fn switch(emit: &Emit) -> (FunctionCode, u64, Vec<u64>) {
        let pass = |cases: &[u64], table: u64| {
            let mut a = CodeAssembler::new(64).unwrap();
            let (t, labels) = emit(&mut a, cases, table).unwrap();
            let r = a
                .assemble_options(0x1000, BlockEncoderOptions::RETURN_NEW_INSTRUCTION_OFFSETS)
                .unwrap();
            let ips: Vec<u64> = labels.iter().map(|c| r.label_ip(c).unwrap()).collect();
            (r.inner.code_buffer.clone(), r.label_ip(&t).unwrap(), ips)
        };
        let (_, t, labels) = pass(&[], 0);
        let (bytes, t2, cs2) = pass(&labels, t);
        assert_eq!((t, &labels), (t2, &cs2), "layout changed between passes");
        let f = FunctionCode::build(
            &bytes[..(t - 0x1000) as usize],
            0x1000,
            &FlatMemory {
                base: 0x1000,
                bytes: &bytes,
            },
        );
        (f, t, labels)
    }

    fn relative(cases: &[u64], table: u64, n: usize) -> Vec<u32> {
        if cases.is_empty() {
            return vec![0; n];
        }
        cases
            .iter()
            .map(|&c| (c as i64 - table as i64) as i32 as u32)
            .collect()
    }

    fn cases(a: &mut CodeAssembler, n: usize) -> Result<Vec<CodeLabel>, IcedError> {
        let mut labels = Vec::new();
        for k in 0..n {
            let mut l = a.create_label();
            a.set_label(&mut l)?;
            a.mov(eax, k as u32)?;
            a.ret()?;
            labels.push(l);
        }
        Ok(labels)
    }

    #[test]
    fn pic_relative_table_bounded_by_cmp_ja() {
        let (f, table, case_ips) = switch(&|a, ips, t| {
            let mut table = a.create_label();
            let mut default = a.create_label();
            a.cmp(edi, 2)?;
            a.ja(default)?;
            a.mov(edi, edi)?;
            a.lea(rdx, ptr(table))?;
            a.movsxd(rax, dword_ptr(rdx + rdi * 4))?;
            a.add(rax, rdx)?;
            a.jmp(rax)?;
            let labels = cases(a, 3)?;
            a.set_label(&mut default)?;
            a.xor(eax, eax)?;
            a.ret()?;
            a.set_label(&mut table)?;
            a.dd(&relative(ips, t, 3))?;
            a.dd(&[0])?; // whatever follows is not an entry
            Ok((table, labels))
        });
        assert_eq!(f.indirect_jumps[0].kind, IndirectJumpKind::JumpTable(0));
        let jt = &f.jump_tables[0];
        assert_eq!(jt.table, table);
        assert_eq!(jt.entries, JumpTableEntries::Relative { base: table });
        assert_eq!(jt.bound, JumpTableBound::Compare(3));
        assert_eq!(jt.targets, case_ips);
        // The cases are blocks, successors of the jump's block.
        let jump_block = f.block_of_instruction(f.indirect_jumps[0].instruction as usize);
        assert_eq!(jump_block.successors.len(), 3);
        for ip in &case_ips {
            assert!(f.branch_targets.contains(ip));
            assert!(f.blocks.iter().any(|b| b.start == *ip));
        }
    }

    #[test]
    fn absolute_table_bounded_by_jbe_towards_the_table() {
        let (f, table, case_ips) = switch(&|a, ips, t| {
            let mut table = a.create_label();
            let mut dispatch = a.create_label();
            a.cmp(rdi, 3)?;
            a.jbe(dispatch)?;
            a.xor(eax, eax)?;
            a.ret()?;
            a.set_label(&mut dispatch)?;
            // No base register: the encoding always carries a disp32, so the
            // layout is the same in both passes.
            a.jmp(qword_ptr(rdi * 8 + t as i32))?;
            let labels = cases(a, 4)?;
            a.set_label(&mut table)?;
            let entries: Vec<u64> = if ips.is_empty() {
                vec![0; 4]
            } else {
                ips.to_vec()
            };
            a.dq(&entries)?;
            Ok((table, labels))
        });
        let jt = &f.jump_tables[0];
        assert_eq!(jt.entries, JumpTableEntries::Absolute);
        assert_eq!(jt.table, table);
        assert_eq!(jt.bound, JumpTableBound::Compare(4));
        assert_eq!(jt.targets, case_ips);
    }

    #[test]
    fn absolute_table_through_rip_lea_and_mov() {
        let (f, table, case_ips) = switch(&|a, ips, _| {
            let mut table = a.create_label();
            let mut dispatch = a.create_label();
            a.cmp(rdi, 3)?;
            a.jbe(dispatch)?;
            a.xor(eax, eax)?;
            a.ret()?;
            a.set_label(&mut dispatch)?;
            a.lea(rcx, ptr(table))?;
            a.mov(rax, qword_ptr(rcx + rdi * 8))?;
            a.jmp(rax)?;
            let labels = cases(a, 4)?;
            a.set_label(&mut table)?;
            let entries: Vec<u64> = if ips.is_empty() {
                vec![0; 4]
            } else {
                ips.to_vec()
            };
            a.dq(&entries)?;
            Ok((table, labels))
        });
        let jt = &f.jump_tables[0];
        assert_eq!(jt.entries, JumpTableEntries::Absolute);
        assert_eq!(jt.table, table);
        assert_eq!(jt.bound, JumpTableBound::Compare(4));
        assert_eq!(jt.targets, case_ips);
    }

    #[test]
    fn unbounded_table_is_scanned_until_an_invalid_entry() {
        let (f, table, case_ips) = switch(&|a, ips, t| {
            let mut table = a.create_label();
            a.movzx(eax, byte_ptr(rdi))?;
            a.lea(rcx, ptr(table))?;
            a.movsxd(rax, dword_ptr(rcx + rax * 4))?;
            a.add(rax, rcx)?;
            a.jmp(rax)?;
            let labels = cases(a, 3)?;
            a.set_label(&mut table)?;
            a.dd(&relative(ips, t, 3))?;
            a.dd(&[0x4000_0000])?; // points far outside the function
            Ok((table, labels))
        });
        let jt = &f.jump_tables[0];
        assert_eq!(jt.table, table);
        assert_eq!(jt.bound, JumpTableBound::Scanned(3));
        assert_eq!(jt.targets, case_ips);
    }

    /// CPython's dispatch: `movzx` of the opcode byte, then `jmp` through
    /// 256 absolute entries, the first (unused opcodes) in the function's
    /// cold part: a jump table that leaves the function, not a tail call.
    #[test]
    fn byte_indexed_table_keeps_the_entries_that_leave_the_function() {
        const COLD: u64 = 0x9000;
        let (f, table, case_ips) = switch(&|a, ips, t| {
            let mut table = a.create_label();
            a.movzx(eax, sil)?;
            a.jmp(qword_ptr(rax * 8 + t as i32))?;
            let labels = cases(a, 3)?;
            a.set_label(&mut table)?;
            let mut entries = vec![COLD; 256];
            if !ips.is_empty() {
                entries[1..4].copy_from_slice(ips);
            }
            a.dq(&entries)?;
            Ok((table, labels))
        });
        assert_eq!(f.indirect_jumps[0].kind, IndirectJumpKind::JumpTable(0));
        let jt = &f.jump_tables[0];
        assert_eq!(jt.table, table);
        assert_eq!(jt.bound, JumpTableBound::Scanned(256));
        assert_eq!(jt.targets.len(), 256);
        assert_eq!(jt.targets[0], COLD);
        assert_eq!(&jt.targets[1..4], &case_ips[..]);
        assert_eq!(jt.load, f.indirect_jumps[0].ip);
    }

    /// A computed-goto interpreter: the table base is set once at entry and
    /// each handler, reached only through the table, dispatches again; the
    /// handlers' jumps resolve along the first jump's table edges.
    #[test]
    fn handlers_reached_only_through_the_table_resolve_their_own_dispatch() {
        let (f, _, _) = switch(&|a, ips, _| {
            let mut table = a.create_label();
            let dispatch = |a: &mut CodeAssembler| -> Result<(), IcedError> {
                a.movzx(eax, byte_ptr(rdi))?;
                a.add(rdi, 1)?;
                a.mov(rax, qword_ptr(r9 + rax * 8))?;
                a.jmp(rax)
            };
            a.lea(r9, ptr(table))?;
            dispatch(a)?;
            let mut labels = Vec::new();
            let mut halt = a.create_label();
            a.set_label(&mut halt)?;
            a.xor(eax, eax)?;
            a.ret()?;
            labels.push(halt);
            for k in 0..2 {
                let mut l = a.create_label();
                a.set_label(&mut l)?;
                a.add(rsi, k + 1)?;
                dispatch(a)?;
                labels.push(l);
            }
            a.set_label(&mut table)?;
            let entries: Vec<u64> = if ips.is_empty() {
                vec![0; 3]
            } else {
                ips.to_vec()
            };
            a.dq(&entries)?;
            Ok((table, labels))
        });
        assert_eq!(f.indirect_jumps.len(), 3);
        for j in &f.indirect_jumps {
            assert!(
                matches!(j.kind, IndirectJumpKind::JumpTable(_)),
                "{:x}: {:?}",
                j.ip,
                j.kind
            );
        }
        assert_eq!(f.unresolved_indirect_jumps(), 0);
    }

    /// Perl's `Perl_leave_scope`: the base, hoisted out of the loop into
    /// caller-saved r11, reaches the jump on every path but one that falls
    /// out of a call that does not return (`Perl_croak`) into a block
    /// another branch reaches.
    #[test]
    fn a_hoisted_base_is_not_lost_behind_a_call_that_does_not_return() {
        let (f, table, _) = switch(&|a, ips, t| {
            let mut table = a.create_label();
            let mut top = a.create_label();
            let mut croak = a.create_label();
            let mut again = a.create_label();
            a.lea(r11, ptr(table))?;
            a.set_label(&mut top)?;
            a.cmp(edi, 2)?;
            a.ja(croak)?;
            a.movsxd(rax, dword_ptr(r11 + rdi * 4))?;
            a.add(rax, r11)?;
            a.jmp(rax)?;
            let labels = cases(a, 2)?;
            let mut last = a.create_label();
            a.set_label(&mut last)?;
            a.sub(edi, 1)?;
            a.jnz(again)?;
            a.ret()?;
            a.set_label(&mut croak)?;
            a.call(0x5000)?;
            a.set_label(&mut again)?;
            a.sub(esi, 1)?;
            a.jmp(top)?;
            a.set_label(&mut table)?;
            let mut entries = relative(ips, t, 2);
            let last_ip = ips.get(2).copied().unwrap_or(t);
            entries.push((last_ip as i64 - t as i64) as i32 as u32);
            a.dd(&entries)?;
            let mut all = labels;
            all.push(last);
            Ok((table, all))
        });
        assert_eq!(f.indirect_jumps[0].kind, IndirectJumpKind::JumpTable(0));
        assert_eq!(f.jump_tables[0].table, table);
        assert_eq!(f.jump_tables[0].targets.len(), 3);
    }

    #[test]
    fn bounded_table_with_a_bad_entry_stays_unresolved() {
        let (f, _, _) = switch(&|a, ips, t| {
            let mut table = a.create_label();
            let mut default = a.create_label();
            a.cmp(edi, 3)?;
            a.ja(default)?;
            a.lea(rdx, ptr(table))?;
            a.movsxd(rax, dword_ptr(rdx + rdi * 4))?;
            a.add(rax, rdx)?;
            a.jmp(rax)?;
            let labels = cases(a, 3)?;
            a.set_label(&mut default)?;
            a.ret()?;
            a.set_label(&mut table)?;
            let mut entries = relative(ips, t, 3);
            // The 4th entry the bound promises lands inside an instruction
            // (one byte into the first case).
            entries.push(entries[0].wrapping_add(1));
            a.dd(&entries)?;
            Ok((table, labels))
        });
        assert_eq!(f.indirect_jumps[0].kind, IndirectJumpKind::Unresolved);
        assert_eq!(f.unresolved_indirect_jumps(), 1);
    }
}
