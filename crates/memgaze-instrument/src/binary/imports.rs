//! Imported functions reached through the procedure linkage table: which
//! `jmp qword [rip → GOT slot]` in `.plt`, `.plt.sec` or `.plt.got` leads to
//! which dynamic symbol.
//!
//! The rewriter puts stubs in front of some of them (`_exit`, the `exec`
//! family) so the recorder runtime learns that the process ends without
//! running `DT_FINI`. Calls that bypass the table (`-fno-plt`'s and Rust's
//! `call [rip → GOT]`) are found in the functions' code (`got_calls`); a
//! raw `syscall` or a slot's value called through a register is not seen.

use super::Binary;
use foldhash::{HashMap, HashMapExt, HashSet, HashSetExt};
use goblin::elf::Elf;
use goblin::elf::reloc::{R_X86_64_GLOB_DAT, R_X86_64_JUMP_SLOT, R_X86_64_RELATIVE};
use iced_x86::{Code, Register};
use rayon::prelude::*;

/// One PLT entry's indirect jump to an imported function.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct PltImport {
    /// The imported symbol's name (without version).
    pub name: String,
    /// Address of the `jmp qword [rip → got]` instruction.
    pub jump: u64,
    /// Its length in bytes (6, or 7 with a `bnd` prefix).
    pub(crate) jump_len: usize,
    /// The GOT slot it jumps through.
    pub got: u64,
}

/// Every PLT entry of `binary` that jumps through a GOT slot relocated to a
/// named dynamic symbol, in address order. Empty for a binary without a
/// PLT (static, or built with `-fno-plt`) or whose headers do not parse.
pub(crate) fn plt_imports(binary: &Binary) -> Vec<PltImport> {
    let slots = got_slots(binary);
    let mut imports = Vec::new();
    let mut insns = Vec::new();
    for section in binary.sections().iter().filter(|s| s.is_plt()) {
        let Some(bytes) = binary.section_data(section) else {
            continue;
        };
        insns.clear();
        super::decode_bytes(bytes, section.addr, &mut insns);
        for insn in &insns {
            if insn.code() != Code::Jmp_rm64 || insn.memory_base() != Register::RIP {
                continue;
            }
            let got = insn.memory_displacement64();
            if let Some(name) = slots.get(&got) {
                imports.push(PltImport {
                    name: name.clone(),
                    jump: insn.ip(),
                    jump_len: insn.len(),
                    got,
                });
            }
        }
    }
    imports.sort_by_key(|i| i.jump);
    imports
}

/// Names of every function the dynamic relocations bind to a GOT slot,
/// through a PLT entry or not (`-fno-plt` code calls through the slot).
pub(crate) fn got_imports(binary: &Binary) -> Vec<String> {
    let mut names: Vec<String> = got_slots(binary).into_values().collect();
    names.sort();
    names.dedup();
    names
}

/// Every GOT slot relocated to a dynamic symbol `wanted` accepts, with
/// the name, in slot order.
pub(crate) fn got_slots_named(
    binary: &Binary,
    wanted: impl Fn(&str) -> bool,
) -> Vec<(u64, String)> {
    let mut slots: Vec<(u64, String)> = got_slots(binary)
        .into_iter()
        .filter(|(_, name)| wanted(name))
        .collect();
    slots.sort();
    slots
}

/// One `call`/`jmp qword [rip → GOT slot]` in a function's code.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct GotCall {
    /// Address of the instruction.
    pub at: u64,
    /// Its length in bytes (6, or more with prefixes).
    pub len: usize,
    /// `call` (else `jmp`, a tail call).
    pub call: bool,
    /// The GOT slot it goes through.
    pub got: u64,
}

/// The `call`/`jmp qword [rip → slot]` instructions through one of `slots`
/// in the code of `binary`'s functions (each decoded from its start, as the
/// compiler laid it out), in address order. The functions are scanned on
/// all cores: the scan reads all the code, between the planning and the
/// copies, where nothing else runs.
pub(crate) fn got_calls(binary: &Binary, slots: &HashSet<u64>) -> Vec<GotCall> {
    if slots.is_empty() {
        return Vec::new();
    }
    let mut calls: Vec<GotCall> = binary
        .functions()
        .par_iter()
        .flat_map_iter(|f| {
            let mut calls = Vec::new();
            let Some(bytes) = binary.bytes_at(f.start, f.size as usize) else {
                return calls;
            };
            if !may_go_through(bytes, f.start, slots) {
                return calls;
            }
            let mut insns = Vec::new();
            super::decode_bytes(bytes, f.start, &mut insns);
            for insn in &insns {
                let call = match insn.code() {
                    Code::Call_rm64 => true,
                    Code::Jmp_rm64 => false,
                    _ => continue,
                };
                if insn.memory_base() != Register::RIP || insn.len() < 5 {
                    continue;
                }
                let got = insn.memory_displacement64();
                if slots.contains(&got) {
                    calls.push(GotCall {
                        at: insn.ip(),
                        len: insn.len(),
                        call,
                        got,
                    });
                }
            }
            calls
        })
        .collect();
    calls.sort_by_key(|c| c.at);
    calls.dedup();
    calls
}

/// Whether `bytes` (code at `start`) hold the opcode and ModRM of a `call`
/// or `jmp qword [rip + disp32]` (`ff 15`, `ff 25`) whose disp32 points into
/// `slots`: every instruction `got_calls` keeps has them, prefixes coming
/// before the opcode, so the functions without any are not decoded (most
/// of them; decoding every function again was 1% of instrumenting a large
/// binary, on the main thread). The `ff` bytes are found by `memchr`: a
/// test of every position was seven instructions a byte of code.
fn may_go_through(bytes: &[u8], start: u64, slots: &HashSet<u64>) -> bool {
    // Every position with six bytes from it.
    let Some(positions) = bytes.len().checked_sub(5) else {
        return false;
    };
    memchr::memchr_iter(0xff, &bytes[..positions]).any(|p| {
        let w = &bytes[p..p + 6];
        matches!(w[1], 0x15 | 0x25) && {
            let disp = i32::from_le_bytes([w[2], w[3], w[4], w[5]]);
            let next = start.wrapping_add(p as u64 + 6);
            slots.contains(&next.wrapping_add(disp as i64 as u64))
        }
    })
}

/// GOT slot → symbol name, from the `JUMP_SLOT` and `GLOB_DAT` relocations.
fn got_slots(binary: &Binary) -> HashMap<u64, String> {
    let mut slots: HashMap<u64, String> = HashMap::new();
    let Ok(elf) = Elf::parse(binary.data()) else {
        return slots;
    };
    for reloc in elf.pltrelocs.iter().chain(elf.dynrelas.iter()) {
        if reloc.r_type != R_X86_64_JUMP_SLOT && reloc.r_type != R_X86_64_GLOB_DAT {
            continue;
        }
        let name = elf
            .dynsyms
            .get(reloc.r_sym)
            .and_then(|sym| elf.dynstrtab.get_at(sym.st_name));
        if let Some(name) = name.filter(|n| !n.is_empty()) {
            slots.insert(reloc.r_offset, name.to_string());
        }
    }
    slots
}

/// Code addresses the binary stores as data: `e_entry`, the addends of
/// `R_X86_64_RELATIVE` relocations, and every aligned 8-byte word of an
/// allocated, non-executable section whose value lies in an executable
/// section (function-pointer tables and `.init_array` of fixed-address
/// binaries carry no relocations). A function found only by the gap scan
/// whose start is among them is entered through a pointer, so it is code.
///
/// Only the addresses of `among` (sorted) are kept: those are all the
/// caller asks about, and a set of every code address in the data, each
/// word looked up in every section, was the rewriter's largest serial
/// step on stripped binaries.
pub(crate) fn code_addresses_in_data(binary: &Binary, among: &[u64]) -> HashSet<u64> {
    let (Some(&low), Some(&high)) = (among.first(), among.last()) else {
        return HashSet::new();
    };
    let is_code =
        |a: u64| (low..=high).contains(&a) && among.binary_search(&a).is_ok() && binary.is_code(a);
    let mut out = HashSet::new();
    if is_code(binary.entry()) {
        out.insert(binary.entry());
    }
    if let Ok(elf) = Elf::parse(binary.data()) {
        for reloc in elf.dynrelas.iter() {
            if reloc.r_type == R_X86_64_RELATIVE
                && let Some(addend) = reloc.r_addend
                && let Ok(addr) = u64::try_from(addend)
                && is_code(addr)
            {
                out.insert(addr);
            }
        }
    }
    for section in binary
        .sections()
        .iter()
        .filter(|s| s.is_alloc() && !s.is_executable() && s.has_file_data())
    {
        let Some(bytes) = binary.section_data(section) else {
            continue;
        };
        let skip = (section.addr.wrapping_neg() & 7) as usize;
        for word in bytes.get(skip..).unwrap_or_default().chunks_exact(8) {
            let value = u64::from_le_bytes(word.try_into().expect("8-byte chunk"));
            if is_code(value) {
                out.insert(value);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn got_call_bytes_are_found_only_through_the_slots_asked_for() {
        // nop; call qword [rip + 0x10]; rex.w jmp qword [rip - 0x20]
        let code = [
            0x90, 0xff, 0x15, 0x10, 0x00, 0x00, 0x00, 0x48, 0xff, 0x25, 0xe0, 0xff, 0xff, 0xff,
        ];
        let start = 0x1000;
        let slots = |s: &[u64]| s.iter().copied().collect::<HashSet<u64>>();
        assert!(may_go_through(&code, start, &slots(&[0x1017])));
        assert!(may_go_through(&code, start, &slots(&[0x100e - 0x20])));
        assert!(!may_go_through(&code, start, &slots(&[0x1018, 0x100e])));
        // The same bytes cut before the call's displacement ends, and just
        // after.
        assert!(!may_go_through(&code[..6], start, &slots(&[0x1017])));
        assert!(may_go_through(&code[..7], start, &slots(&[0x1017])));
        let mut decoded = Vec::new();
        crate::binary::decode_bytes(&code, start, &mut decoded);
        let gots: Vec<u64> = decoded
            .iter()
            .filter(|i| matches!(i.code(), Code::Call_rm64 | Code::Jmp_rm64))
            .map(|i| i.memory_displacement64())
            .collect();
        assert_eq!(gots, [0x1017, 0x100e - 0x20]);
    }
}
