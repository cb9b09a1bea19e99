//! The instrumented output names its copies: a local `STT_FUNC` symbol per
//! copy in `.symtab`, with the original's name, the copy's address and
//! size, in a section over the copies; stripped inputs get nothing.

use memgaze_fixtures as common;

use goblin::elf::Elf;
use goblin::elf::program_header::PT_LOAD;
use goblin::elf::section_header::{SHF_ALLOC, SHF_EXECINSTR, SHT_PROGBITS, SHT_SYMTAB};
use goblin::elf::sym::{STB_LOCAL, STT_FUNC, STT_GNU_IFUNC};
use memgaze_instrument::rewrite::Instrumented;
use memgaze_metadata::annotation::InstrumentationMode;
use std::collections::BTreeMap;
use std::path::Path;

/// `(start, name)` of the sized function symbols of `elf`'s `.symtab`.
fn function_names(elf: &Elf<'_>) -> BTreeMap<u64, Vec<String>> {
    let mut names: BTreeMap<u64, Vec<String>> = BTreeMap::new();
    for sym in elf.syms.iter() {
        let function = sym.st_type() == STT_FUNC || sym.st_type() == STT_GNU_IFUNC;
        if function && sym.st_size > 0 && sym.st_shndx != 0 {
            let name = elf.strtab.get_at(sym.st_name).unwrap().to_string();
            names.entry(sym.st_value).or_default().push(name);
        }
    }
    names
}

/// The target of the `jmp rel32` patched over the entry at `start`.
fn entry_jump(elf: &Elf<'_>, bytes: &[u8], start: u64) -> u64 {
    let load = elf
        .program_headers
        .iter()
        .find(|h| h.p_type == PT_LOAD && h.vm_range().contains(&(start as usize)))
        .expect("the entry is loaded");
    let at = (start - load.p_vaddr + load.p_offset) as usize;
    assert_eq!(bytes[at], 0xe9, "no jump patched at {start:#x}");
    let rel = i32::from_le_bytes(bytes[at + 1..at + 5].try_into().unwrap());
    (start as i64 + 5 + i64::from(rel)) as u64
}

/// Checks the copies' symbols of `output`, instrumented from `input`, and
/// gives how many copies are named.
fn check_copy_symbols(input: &Path, output: &Path, instrumented: &Instrumented) -> usize {
    let input_bytes = std::fs::read(input).unwrap();
    let original = Elf::parse(&input_bytes).unwrap();
    let bytes = std::fs::read(output).unwrap();
    let elf = Elf::parse(&bytes).unwrap();
    let report = &instrumented.report;

    // The section over the copies, loaded where its file offset says.
    let (index, section) = elf
        .section_headers
        .iter()
        .enumerate()
        .find(|(_, s)| elf.shdr_strtab.get_at(s.sh_name) == Some(".memgaze.text"))
        .expect("a section over the copies");
    assert_eq!(index, original.section_headers.len(), "appended last");
    assert_eq!(section.sh_type, SHT_PROGBITS);
    assert_eq!(section.sh_flags, u64::from(SHF_ALLOC | SHF_EXECINSTR));
    assert_eq!(section.sh_addr, report.copies_start);
    assert_eq!(section.sh_size, report.copies_end - report.copies_start);
    let load = elf
        .program_headers
        .iter()
        .find(|h| h.p_type == PT_LOAD && h.vm_range().contains(&(section.sh_addr as usize)))
        .expect("the copies are loaded");
    assert_eq!(
        section.sh_offset - load.p_offset,
        section.sh_addr - load.p_vaddr
    );

    // Locals first, as sh_info says; every original symbol is kept, with
    // the string table unchanged.
    let symtab = elf
        .section_headers
        .iter()
        .find(|s| s.sh_type == SHT_SYMTAB)
        .unwrap();
    let first_global = symtab.sh_info as usize;
    for (i, sym) in elf.syms.iter().enumerate() {
        assert_eq!(sym.st_bind() == STB_LOCAL, i < first_global, "symbol {i}");
    }
    let copies: Vec<_> = elf.syms.iter().filter(|s| s.st_shndx == index).collect();
    assert_eq!(elf.syms.len(), original.syms.len() + copies.len());
    let names_of = |e: &Elf<'_>| {
        let symtab = e.section_headers.iter().find(|s| s.sh_type == SHT_SYMTAB);
        let strtab = &e.section_headers[symtab.unwrap().sh_link as usize];
        (strtab.sh_offset, strtab.sh_size)
    };
    assert_eq!(names_of(&elf), names_of(&original));

    // One symbol per copy of a named function: at the copy its entry jumps
    // to, with the original's name.
    let names = function_names(&original);
    let by_address: BTreeMap<u64, _> = copies.iter().map(|s| (s.st_value, s)).collect();
    assert_eq!(by_address.len(), copies.len(), "one symbol per copy");
    let mut named = 0;
    for function in instrumented
        .annotation
        .functions
        .iter()
        .filter(|f| f.instrumented)
    {
        let copy = entry_jump(&elf, &bytes, function.start);
        let Some(sym) = by_address.get(&copy) else {
            assert!(
                !names.contains_key(&function.start),
                "{} has a symbol and its copy none",
                function.name
            );
            continue;
        };
        assert_eq!(sym.st_type(), STT_FUNC);
        assert_eq!(sym.st_bind(), STB_LOCAL);
        let name = elf.strtab.get_at(sym.st_name).unwrap();
        let raw = function.raw_name.as_deref().unwrap_or(&function.name);
        assert_eq!(name, raw, "the copy of {:#x}", function.start);
        assert!(names[&function.start].iter().any(|n| n == name));
        named += 1;
    }
    assert_eq!(named, copies.len(), "every copy symbol is a copy's");

    // Sizes: the copies lie back to back, each up to the next one.
    let spans: Vec<(u64, u64)> = by_address
        .values()
        .map(|s| (s.st_value, s.st_value + s.st_size))
        .collect();
    for pair in spans.windows(2) {
        assert!(pair[0].0 < pair[0].1, "an empty copy at {:#x}", pair[0].0);
        assert!(pair[0].1 <= pair[1].0, "copies overlap at {:#x}", pair[1].0);
    }
    let section_end = section.sh_addr + section.sh_size;
    assert!(
        spans
            .iter()
            .all(|&(s, e)| s >= section.sh_addr && e <= section_end)
    );
    if named == instrumented.report.functions_instrumented {
        assert_eq!(spans[0].0, section.sh_addr);
        assert_eq!(spans.last().unwrap().1, section_end);
        assert!(spans.windows(2).all(|p| p[0].1 == p[1].0), "packed copies");
    }
    named
}

#[test]
fn every_copy_has_a_symbol_with_its_address_and_size() {
    let dir = tempfile::tempdir().unwrap();
    for input in [
        common::rustc("rewriter/panics.rs", &[], dir.path()),
        common::gcc("kernels.c", &["-O2"], dir.path()),
    ] {
        let output = input.with_extension("mg");
        let instrumented =
            memgaze_instrument::instrument_file(&input, &output, None, InstrumentationMode::Soft)
                .unwrap();
        let named = check_copy_symbols(&input, &output, &instrumented);
        assert!(named > 5, "{}: {named} copies named", input.display());
    }
}

#[test]
fn a_library_names_its_copies() {
    let dir = tempfile::tempdir().unwrap();
    let library = common::gcc(
        "rewriter/dl_sum.c",
        &["-O2", "-shared", "-fPIC"],
        dir.path(),
    );
    let output = library.with_extension("mg.so");
    let instrumented = memgaze_instrument::instrument_library_file(&library, &output, 1).unwrap();
    assert!(check_copy_symbols(&library, &output, &instrumented) >= 1);
}

#[test]
fn a_stripped_executable_gets_no_symbols_or_section() {
    let dir = tempfile::tempdir().unwrap();
    let input = common::stripped(&common::gcc("kernels.c", &["-O2"], dir.path()));
    let output = input.with_extension("mg");
    memgaze_instrument::instrument_file(&input, &output, None, InstrumentationMode::Soft).unwrap();
    let before = std::fs::read(&input).unwrap();
    let after = std::fs::read(&output).unwrap();
    let (before, after) = (Elf::parse(&before).unwrap(), Elf::parse(&after).unwrap());
    assert!(after.syms.is_empty());
    assert_eq!(after.section_headers.len(), before.section_headers.len());
}
