//! Jump tables translated to copy addresses.
//!
//! A copy that jumped through the original table would land in the original
//! code and rely on a `jmp rel32` patched at every target. Targets closer
//! than 5 bytes, targets in a function's split-off `.cold` part (another
//! symbol, so not patched as part of the function) and computed-goto
//! interpreters whose 256-entry tables mix both defeat that. Instead each
//! copy reads a translated table in the new segment, entry for entry the
//! original's with every target mapped to its copy (a target in no copy
//! keeps its original address and is reported as an escape):
//!
//! * `jmp [T + i*8]` / `mov r, [T + i*8]` without a base register (non-PIE
//!   code): the displacement becomes the translated table's address, whose
//!   entries are absolute copy addresses;
//! * `mov r, [b + i*8 + d]` … `jmp r`, `b` holding the constant `T - d`: the
//!   displacement moves by the distance between the tables, the entries
//!   hold copy addresses minus `b`'s value, and `lea r, [r + b]` before the
//!   jump adds the base back (the load address, not the link address: PIE
//!   needs no run-time relocation);
//! * relative tables (`movsxd r, [b + i*4]` … `add r, b'` … `jmp r`): the
//!   displacement moves, entries stay offsets from `b'`.
//!
//! Tables are placed before the copies so their addresses are known while
//! the copies are encoded; their contents are written once the copies are
//! laid out.

use super::relocate::{CopyMap, TableRedirect};
use crate::binary::{FunctionCode, IndirectJumpKind, JumpTableBound, JumpTableEntries};
use foldhash::{HashMap, HashMapExt};
use iced_x86::{FlowControl, InstructionInfoFactory, Mnemonic, OpAccess, OpKind, Register};

/// One translated table.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Translated {
    /// Its address in the new segment.
    va: u64,
    /// The original entries' targets.
    targets: Vec<u64>,
    /// Bytes per entry (8 or 4).
    entry_size: u64,
    /// What each entry is relative to (0: absolute).
    relative_to: u64,
}

/// The translated tables of all copies.
#[derive(Debug, Default)]
pub(super) struct Tables {
    tables: Vec<Translated>,
    /// Address of the first table.
    va: u64,
    /// Bytes they take.
    pub len: u64,
    /// Jumps redirected (their address).
    pub jumps: Vec<u64>,
}

/// A jump whose table could not be translated, with why.
pub(super) type Untranslated = (u64, &'static str);

impl Tables {
    /// Plans translated tables at `va` for every jump table of `codes` (one
    /// per function, in plan order) that a redirect can serve. Returns the
    /// tables and each function's redirects, and the jumps left reading
    /// the original table.
    pub(super) fn plan(
        codes: &[&FunctionCode],
        va: u64,
        pie: bool,
    ) -> (
        Tables,
        Vec<HashMap<usize, TableRedirect>>,
        Vec<Untranslated>,
    ) {
        let mut tables = Tables {
            va,
            ..Tables::default()
        };
        let mut by_key: HashMap<(u64, u64, u64, usize), usize> = HashMap::new();
        let mut redirects = Vec::with_capacity(codes.len());
        let mut untranslated = Vec::new();
        let mut info = InstructionInfoFactory::new();
        for code in codes {
            let mut own: HashMap<usize, TableRedirect> = HashMap::new();
            for j in &code.indirect_jumps {
                let IndirectJumpKind::JumpTable(t) = j.kind else {
                    continue;
                };
                let table = &code.jump_tables[t];
                let Some(form) = form_of(code, j.instruction as usize, table, pie, &mut info)
                else {
                    untranslated.push((j.ip, "jump-table read of a form not redirected"));
                    continue;
                };
                let key = (
                    table.table,
                    form.entry_size,
                    form.relative_to,
                    table.targets.len(),
                );
                let k = *by_key.entry(key).or_insert_with(|| {
                    let at = tables.va + tables.len;
                    tables.len +=
                        (table.targets.len() as u64 * form.entry_size).next_multiple_of(8);
                    tables.tables.push(Translated {
                        va: at,
                        targets: table.targets.clone(),
                        entry_size: form.entry_size,
                        relative_to: form.relative_to,
                    });
                    tables.tables.len() - 1
                });
                let at = tables.tables[k].va;
                let load = &code.instructions[form.load];
                let displacement = if form.absolute_displacement {
                    at
                } else {
                    load.memory_displacement64()
                        .wrapping_add(at.wrapping_sub(table.table))
                };
                let fits = if form.absolute_displacement {
                    displacement < 1 << 31
                } else {
                    i32::try_from(displacement as i64).is_ok()
                };
                if !fits {
                    untranslated.push((
                        j.ip,
                        "translated table out of a 32-bit displacement's reach",
                    ));
                    continue;
                }
                own.insert(form.load, TableRedirect::Displacement(displacement));
                if let Some((target, base)) = form.add_base {
                    own.insert(
                        j.instruction as usize,
                        TableRedirect::AddBase { target, base },
                    );
                }
                tables.jumps.push(j.ip);
            }
            redirects.push(own);
        }
        (tables, redirects, untranslated)
    }

    /// The tables' bytes once the copies are laid out (`maps`, any order),
    /// and the targets that are in no copy (they keep their original
    /// address).
    pub(super) fn fill(&self, maps: &[CopyMap]) -> (Vec<u8>, Vec<u64>) {
        let mut ranges: Vec<(u64, u64, usize)> = maps
            .iter()
            .enumerate()
            .map(|(k, m)| (m.original_start, m.original_end, k))
            .collect();
        ranges.sort_unstable();
        let copy_of = |target: u64| -> Option<u64> {
            let i = ranges.partition_point(|&(start, _, _)| start <= target);
            let &(_, end, k) = ranges.get(i.checked_sub(1)?)?;
            (target < end).then(|| maps[k].map(target)).flatten()
        };
        let mut bytes = Vec::with_capacity(self.len as usize);
        let mut unmapped = Vec::new();
        for table in &self.tables {
            debug_assert_eq!(self.va + bytes.len() as u64, table.va);
            for &target in &table.targets {
                let to = copy_of(target).unwrap_or_else(|| {
                    unmapped.push(target);
                    target
                });
                let entry = to.wrapping_sub(table.relative_to);
                if table.entry_size == 8 {
                    bytes.extend_from_slice(&entry.to_le_bytes());
                } else {
                    // A copy out of a 32-bit offset's reach keeps the
                    // original target (the original entry's own value).
                    let offset = i32::try_from(entry as i64).unwrap_or_else(|_| {
                        unmapped.push(target);
                        target.wrapping_sub(table.relative_to) as i32
                    });
                    bytes.extend_from_slice(&offset.to_le_bytes());
                }
            }
            bytes.resize(bytes.len().next_multiple_of(8), 0);
        }
        unmapped.sort_unstable();
        unmapped.dedup();
        (bytes, unmapped)
    }
}

/// How one jump reads its table, when a translated table can serve it.
struct Form {
    /// Instruction index of the entry load.
    load: usize,
    entry_size: u64,
    relative_to: u64,
    /// The new displacement is the table's address (no base register).
    absolute_displacement: bool,
    /// `(jump register, base register)` for a `lea` before the jump.
    add_base: Option<(Register, Register)>,
}

/// The form of jump `j`'s table read, if a translated table can serve it.
fn form_of(
    code: &FunctionCode,
    j: usize,
    table: &crate::binary::JumpTable,
    pie: bool,
    info: &mut InstructionInfoFactory,
) -> Option<Form> {
    // A table whose length was guessed (entries read while they looked
    // valid) may be longer than what was read: the program could index past
    // the translated copy. Only counted tables are translated.
    let counted = match table.bound {
        JumpTableBound::Compare(_) | JumpTableBound::Mask(_) => true,
        JumpTableBound::Scanned(n) => n == 256 && table.targets.len() == 256,
    };
    if !counted {
        return None;
    }
    let load_index = code.instruction_at(table.load)?;
    let load = &code.instructions[load_index];
    let jump = &code.instructions[j];
    if !(0..load.op_count()).any(|k| load.op_kind(k) == OpKind::Memory)
        || load.is_ip_rel_memory_operand()
        || load.memory_segment() != Register::DS && load.memory_segment() != Register::None
    {
        return None;
    }
    let base = load.memory_base();
    match table.entries {
        JumpTableEntries::Relative { base: relative_to } => Some(Form {
            load: load_index,
            entry_size: 4,
            relative_to,
            absolute_displacement: false,
            add_base: None,
        }),
        JumpTableEntries::Absolute if base == Register::None => (!pie).then_some(Form {
            load: load_index,
            entry_size: 8,
            relative_to: 0,
            absolute_displacement: true,
            add_base: None,
        }),
        JumpTableEntries::Absolute => {
            // `mov r, [b + i*8 + d]` … `jmp r` in one block, `b` untouched
            // in between: the entries become offsets from `b`.
            let is_register_jump = jump.flow_control() == FlowControl::IndirectBranch
                && jump.op0_kind() == OpKind::Register;
            let target = is_register_jump.then(|| jump.op0_register())?;
            let base_value = table.table.wrapping_sub(load.memory_displacement64());
            let same_block = code.block_of[load_index] == code.block_of[j] && load_index < j;
            let simple = load.mnemonic() == Mnemonic::Mov
                && load.op0_kind() == OpKind::Register
                && load.op0_register() == target
                && u64::from(load.memory_index_scale()) == 8
                && base.is_gpr()
                && base.size() == 8
                && base != target
                && target.size() == 8;
            let untouched = (load_index + 1..j).all(|k| {
                info.info(&code.instructions[k])
                    .used_registers()
                    .iter()
                    .all(|u| {
                        u.register().full_register() != base
                            || matches!(u.access(), OpAccess::Read | OpAccess::CondRead)
                    })
            });
            (same_block && simple && untouched).then_some(Form {
                load: load_index,
                entry_size: 8,
                relative_to: base_value,
                absolute_displacement: false,
                add_base: Some((target, base)),
            })
        }
    }
}
