//! Function discovery: where each function starts and ends, and its name.
//!
//! Sources, most trusted first:
//! 1. `.symtab` function symbols with a size, in executable sections, and
//!    sized `.dynsym` ones at addresses `.symtab` has none for;
//! 2. `.eh_frame` FDEs, for code no sized symbol covers (in stripped
//!    binaries all but the exported functions), named as the entry point,
//!    `DT_INIT` and `DT_FINI` where those match, else `sub_<hex start>`;
//! 3. in stripped binaries only, code in the gaps between those (functions
//!    without unwind info, such as crt's `deregister_tm_clones`), split at
//!    padding after an unconditional jump or return.
//!
//! The result is sorted by start and free of overlaps.

use super::demangle::demangle;
use super::elf::Section;
use foldhash::{HashSet, HashSetExt};
use iced_x86::{Decoder, DecoderOptions, FlowControl, Mnemonic};
use serde::Serialize;

/// Where a function's extent came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum FunctionSource {
    /// A sized `STT_FUNC` symbol of `.symtab`.
    Symtab,
    /// A sized `STT_FUNC` symbol of `.dynsym` (when `.symtab` lacks it).
    Dynsym,
    /// A `.eh_frame` FDE.
    EhFrame,
    /// Code between known functions, found by scanning (stripped binaries).
    Gap,
}

impl FunctionSource {
    /// Spelling in tables and JSON.
    pub fn as_str(self) -> &'static str {
        match self {
            FunctionSource::Symtab => "symtab",
            FunctionSource::Dynsym => "dynsym",
            FunctionSource::EhFrame => "eh-frame",
            FunctionSource::Gap => "gap",
        }
    }
}

/// A function of the binary.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Function {
    /// Demangled name, the raw name when not mangled, or `sub_<hex start>`.
    pub name: String,
    /// The symbol as stored, when it differs from `name` (mangled names).
    pub raw_name: Option<String>,
    /// First address.
    pub start: u64,
    /// Size in bytes (> 0).
    pub size: u64,
    /// Where the extent came from.
    pub source: FunctionSource,
    /// Index of the section holding it.
    pub section: usize,
}

impl Function {
    /// One past the last address.
    pub fn end(&self) -> u64 {
        self.start + self.size
    }

    /// Whether `addr` lies in the function.
    pub fn contains(&self, addr: u64) -> bool {
        addr >= self.start && addr < self.end()
    }

    /// The name a user would search for (`--functions` globs match this and
    /// the raw name).
    pub fn display_name(&self) -> &str {
        &self.name
    }
}

/// Counts describing how discovery went, for reports and tests.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct DiscoveryStats {
    /// Whether the binary has a `.symtab`.
    pub has_symtab: bool,
    /// Functions by source.
    pub(crate) from_symtab: usize,
    /// See [`FunctionSource::Dynsym`].
    pub(crate) from_dynsym: usize,
    /// See [`FunctionSource::EhFrame`].
    pub from_eh_frame: usize,
    /// See [`FunctionSource::Gap`].
    pub from_gaps: usize,
    /// FDEs in `.eh_frame` (including PLT ones and ones covered by symbols).
    pub(crate) fdes: usize,
    /// Whether `.eh_frame` parsing stopped on malformed data.
    pub(crate) eh_frame_malformed: bool,
    /// Symbols dropped because another function fully contains them.
    pub(crate) nested_dropped: usize,
    /// Functions shortened because the next one starts inside them.
    pub truncated: usize,
}

/// A symbol candidate.
pub(crate) struct SymbolCandidate {
    pub name: String,
    pub start: u64,
    pub size: u64,
    /// 0 = global, 1 = weak, 2 = local (lower wins a tie at one address).
    pub(crate) binding_rank: u8,
}

/// Everything discovery needs from the ELF file.
pub(crate) struct DiscoveryInput<'a> {
    pub sections: &'a [Section],
    pub symtab: Vec<SymbolCandidate>,
    pub has_symtab: bool,
    pub dynsym: Vec<SymbolCandidate>,
    pub(crate) fdes: super::eh_frame::FdeRanges,
    /// Addresses with well-known names (entry point, `DT_INIT`, `DT_FINI`).
    pub(crate) known_names: Vec<(u64, &'static str)>,
    /// Bytes of a section's file data.
    pub(crate) section_bytes: &'a dyn Fn(&Section) -> Option<&'a [u8]>,
}

/// Runs discovery.
pub(crate) fn discover(mut input: DiscoveryInput<'_>) -> (Vec<Function>, DiscoveryStats) {
    let mut stats = DiscoveryStats {
        has_symtab: input.has_symtab,
        fdes: input.fdes.ranges.len(),
        eh_frame_malformed: input.fdes.malformed,
        ..Default::default()
    };
    let code_section = |addr: u64| {
        input
            .sections
            .iter()
            .find(|s| s.is_executable() && s.contains(addr))
    };
    let in_function_code = |addr: u64| code_section(addr).filter(|s| !s.is_plt());

    // 1 and 2: sized symbols, best name per address.
    let mut functions: Vec<Function> = best_symbols(
        [
            (std::mem::take(&mut input.symtab), FunctionSource::Symtab),
            (std::mem::take(&mut input.dynsym), FunctionSource::Dynsym),
        ],
        in_function_code,
    )
    .into_iter()
    .map(|(sym, source)| {
        let (name, raw_name) = names(sym.name);
        Function {
            name,
            raw_name,
            start: sym.start,
            size: sym.size,
            source,
            section: code_section(sym.start).map_or(0, |s| s.index),
        }
    })
    .collect();
    remove_overlaps(&mut functions, &mut stats);

    // FDEs not covered by a symbol. None starts where a sized symbol does:
    // each of those is a function by now, or lies inside one.
    let mut extra: Vec<Function> = Vec::new();
    for &(start, len) in &input.fdes.ranges {
        let Some(section) = in_function_code(start) else {
            continue;
        };
        if covered(&functions, start) {
            continue;
        }
        let size = len.min(section.end() - start);
        let raw = input
            .known_names
            .iter()
            .find(|(a, _)| *a == start)
            .map(|(_, n)| n.to_string());
        let (name, raw_name) = match raw {
            Some(raw) => names(raw),
            None => (format!("sub_{start:x}"), None),
        };
        extra.push(Function {
            name,
            raw_name,
            start,
            size,
            source: FunctionSource::EhFrame,
            section: section.index,
        });
    }
    extra.sort_by_key(|f| (f.start, std::cmp::Reverse(f.size)));
    extra.dedup_by_key(|f| f.start);
    functions.extend(extra);
    functions.sort_by_key(|f| f.start);
    remove_overlaps(&mut functions, &mut stats);

    // 3: gaps, only when there is no symbol table to trust.
    if !input.has_symtab {
        let gaps = gap_functions(&input, &functions);
        functions.extend(gaps);
        functions.sort_by_key(|f| f.start);
        remove_overlaps(&mut functions, &mut stats);
    }

    for f in &functions {
        match f.source {
            FunctionSource::Symtab => stats.from_symtab += 1,
            FunctionSource::Dynsym => stats.from_dynsym += 1,
            FunctionSource::EhFrame => stats.from_eh_frame += 1,
            FunctionSource::Gap => stats.from_gaps += 1,
        }
    }
    (functions, stats)
}

/// The sized symbols of `lists` (`.symtab`'s, then `.dynsym`'s) in code
/// `in_function_code` finds (trimmed to its end), one per address in
/// address order: the best-bound (global, weak, local), the first listed
/// among equals.
fn best_symbols<'s>(
    lists: [(Vec<SymbolCandidate>, FunctionSource); 2],
    in_function_code: impl Fn(u64) -> Option<&'s Section>,
) -> Vec<(SymbolCandidate, FunctionSource)> {
    let mut symbols: Vec<(SymbolCandidate, FunctionSource)> =
        Vec::with_capacity(lists.iter().map(|(list, _)| list.len()).sum());
    for (list, source) in lists {
        for mut sym in list {
            let Some(section) = in_function_code(sym.start) else {
                continue;
            };
            sym.size = sym.size.min(section.end() - sym.start);
            symbols.push((sym, source));
        }
    }
    // Stable: among symbols of one address and binding, the first listed
    // comes first.
    symbols.sort_by_key(|(sym, _)| (sym.start, sym.binding_rank));
    symbols.dedup_by_key(|(sym, _)| sym.start);
    symbols
}

fn names(raw: String) -> (String, Option<String>) {
    match demangle(&raw) {
        Some(d) => (d, Some(raw)),
        None => (raw, None),
    }
}

fn covered(sorted: &[Function], addr: u64) -> bool {
    let i = sorted.partition_point(|f| f.start <= addr);
    i > 0 && sorted[i - 1].contains(addr)
}

/// Drops functions nested in an earlier one and shortens partial overlaps,
/// so that every address belongs to at most one function. Input sorted by
/// start.
fn remove_overlaps(functions: &mut Vec<Function>, stats: &mut DiscoveryStats) {
    let mut out: Vec<Function> = Vec::with_capacity(functions.len());
    for f in functions.drain(..) {
        if let Some(prev) = out.last_mut()
            && f.start < prev.end()
        {
            if f.end() <= prev.end() {
                stats.nested_dropped += 1;
                continue;
            }
            prev.size = f.start - prev.start;
            stats.truncated += 1;
            if prev.size == 0 {
                out.pop();
            }
        }
        out.push(f);
    }
    *functions = out;
}

/// Whether an instruction only pads (alignment filler between functions).
fn is_padding(insn: &iced_x86::Instruction, bytes: &[u8]) -> bool {
    matches!(insn.mnemonic(), Mnemonic::Nop | Mnemonic::Int3) || bytes.iter().all(|&b| b == 0)
}

/// Code between known functions in executable, non-PLT sections.
fn gap_functions(input: &DiscoveryInput<'_>, known: &[Function]) -> Vec<Function> {
    let mut out = Vec::new();
    for section in input
        .sections
        .iter()
        .filter(|s| s.is_executable() && s.is_alloc() && !s.is_plt() && s.size > 0)
    {
        let Some(bytes) = (input.section_bytes)(section) else {
            continue;
        };
        // Known functions inside this section, sorted.
        let lo = known.partition_point(|f| f.start < section.addr);
        let hi = known.partition_point(|f| f.start < section.end());
        let mut cursor = section.addr;
        for f in known[lo..hi].iter().chain(std::iter::once(&Function {
            name: String::new(),
            raw_name: None,
            start: section.end(),
            size: 0,
            source: FunctionSource::Gap,
            section: section.index,
        })) {
            if f.start > cursor {
                let from = (cursor - section.addr) as usize;
                let to = (f.start - section.addr) as usize;
                scan_gap(&bytes[from..to], cursor, section.index, input, &mut out);
            }
            cursor = cursor.max(f.end());
        }
    }
    out
}

/// Splits one gap into functions: skip leading padding; a function runs
/// until an unconditional transfer (return, jump, `ud2`, `hlt`) followed by
/// padding that ends at a 16-byte boundary, unless a branch inside the
/// function targets what follows.
fn scan_gap(
    bytes: &[u8],
    base: u64,
    section: usize,
    input: &DiscoveryInput<'_>,
    out: &mut Vec<Function>,
) {
    let mut decoder = Decoder::with_ip(64, bytes, base, DecoderOptions::NONE);
    let mut insn = iced_x86::Instruction::default();
    let mut start: Option<u64> = None;
    let mut last_code_end = base;
    let mut after_terminator = false;
    let mut targets: HashSet<u64> = HashSet::new();
    let end = base + bytes.len() as u64;
    let finish = |start: &mut Option<u64>, code_end: u64, out: &mut Vec<Function>| {
        if let Some(s) = start.take()
            && code_end > s
        {
            let raw = input
                .known_names
                .iter()
                .find(|(a, _)| *a == s)
                .map(|(_, n)| n.to_string());
            let (name, raw_name) = match raw {
                Some(r) => names(r),
                None => (format!("sub_{s:x}"), None),
            };
            out.push(Function {
                name,
                raw_name,
                start: s,
                size: code_end - s,
                source: FunctionSource::Gap,
                section,
            });
        }
    };
    while decoder.can_decode() {
        decoder.decode_out(&mut insn);
        let off = (insn.ip() - base) as usize;
        let raw = &bytes[off..off + insn.len()];
        if insn.is_invalid() {
            // Data or garbage: close what is open, skip the byte.
            finish(&mut start, last_code_end, out);
            after_terminator = false;
            continue;
        }
        if is_padding(&insn, raw) {
            continue;
        }
        let ip = insn.ip();
        if start.is_some() && after_terminator && ip % 16 == 0 && !targets.contains(&ip) {
            finish(&mut start, last_code_end, out);
            targets.clear();
        }
        if start.is_none() {
            start = Some(ip);
        }
        if matches!(
            insn.flow_control(),
            FlowControl::ConditionalBranch | FlowControl::UnconditionalBranch
        ) && insn.near_branch_target() > ip
            && insn.near_branch_target() < end
        {
            targets.insert(insn.near_branch_target());
        }
        after_terminator = matches!(
            insn.flow_control(),
            FlowControl::Return
                | FlowControl::UnconditionalBranch
                | FlowControl::IndirectBranch
                | FlowControl::Exception
        ) || insn.mnemonic() == Mnemonic::Hlt;
        last_code_end = insn.next_ip();
    }
    finish(&mut start, last_code_end, out);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn func(start: u64, size: u64) -> Function {
        Function {
            name: format!("f{start}"),
            raw_name: None,
            start,
            size,
            source: FunctionSource::Symtab,
            section: 1,
        }
    }

    #[test]
    fn overlaps_are_removed_nested_dropped_partial_shortened() {
        let mut v = vec![func(0, 10), func(2, 3), func(8, 10), func(30, 5)];
        let mut stats = DiscoveryStats::default();
        remove_overlaps(&mut v, &mut stats);
        let extents: Vec<(u64, u64)> = v.iter().map(|f| (f.start, f.size)).collect();
        assert_eq!(extents, vec![(0, 8), (8, 10), (30, 5)]);
        assert_eq!(stats.nested_dropped, 1);
        assert_eq!(stats.truncated, 1);
    }

    #[test]
    fn gap_scan_splits_after_return_and_aligned_padding() {
        // f1: xor eax,eax; ret; padding to 16; f2 at 16: je +1 (over ud2) ... ret
        let mut code = vec![0x31, 0xc0, 0xc3];
        code.resize(16, 0x90);
        code.extend([0x74, 0x02, 0x0f, 0x0b, 0xc3]); // je 0x14; ud2; ret (at 0x14)
        code.resize(32, 0xcc);
        let section = Section {
            index: 1,
            name: ".text".into(),
            kind: 1,
            flags: 6,
            addr: 0x1000,
            offset: 0,
            size: code.len() as u64,
            align: 16,
            entry_size: 0,
        };
        let sections = [section.clone()];
        let code_ref: &[u8] = &code;
        let bytes = move |_: &Section| Some(code_ref);
        let input = DiscoveryInput {
            sections: &sections,
            symtab: vec![],
            has_symtab: false,
            dynsym: vec![],
            fdes: Default::default(),
            known_names: vec![(0x1000, "_start")],
            section_bytes: &bytes,
        };
        let (found, stats) = discover(input);
        let extents: Vec<(&str, u64, u64)> = found
            .iter()
            .map(|f| (f.name.as_str(), f.start, f.size))
            .collect();
        assert_eq!(
            extents,
            vec![("_start", 0x1000, 3), ("sub_1010", 0x1010, 5)]
        );
        assert_eq!(stats.from_gaps, 2);
    }
}
