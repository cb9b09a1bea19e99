//! Names for the copies: a symbol per copy in the output's `.symtab`, and a
//! section header over the copies for the symbols to belong to.
//!
//! Backtraces (std's symbolisation falls back to `.symtab` where no DWARF
//! covers an address), `perf` and `gdb` name code by its symbol; without
//! these the copies are raw addresses. Each copy gets a `STB_LOCAL`
//! `STT_FUNC` symbol with the name of its original (the original's `.strtab`
//! offset: the string table does not grow), the copy's address and size.
//! Local, because a copy is not a definition: lookups by name (`dlsym`
//! reads `.dynsym`, which is untouched; linkers and `gdb`'s global lookup)
//! keep finding the one global original, and two locals of a name are
//! ordinary (`static` functions).
//!
//! Locals come before the first global (`sh_info` of `.symtab`), so the new
//! table is the original's locals, the copies', then the original's
//! globals, written past the segment; so are `.shstrtab` with the new
//! section's name and the section header table, which gains the section
//! `.memgaze.text` (`perf` keeps only symbols of sections named `*text*`;
//! `gdb` only those of sections that hold code). The original table, names
//! and headers stay in the file unreferenced: nothing loaded moves.
//!
//! Nothing is added where the input has no `.symtab` (stripped: no names to
//! reuse), where moving the globals' indices would break a reference to
//! them (relocations kept with `--emit-relocs`, groups, extended section
//! indices), or where the section table is unusual (extended numbering, an
//! entry size other than the ELF64 one, anything outside the file).

use super::output::Output;
use super::relocate::CopyMap;
use goblin::elf::section_header::{
    SHF_ALLOC, SHF_EXECINSTR, SHN_LORESERVE, SHN_UNDEF, SHT_GROUP, SHT_PROGBITS, SHT_REL, SHT_RELA,
    SHT_SYMTAB, SHT_SYMTAB_SHNDX,
};
use goblin::elf::sym::{STB_GLOBAL, STB_LOCAL, STB_WEAK, STT_FUNC, STT_GNU_IFUNC};
use goblin::elf64::header::Header;
use goblin::elf64::section_header::{SIZEOF_SHDR, SectionHeader};
use goblin::elf64::sym::{SIZEOF_SYM, Sym};
use scroll::{LE, Pread, Pwrite};

/// Name of the section over the copies (`perf` wants `text` in it).
const SECTION_NAME: &[u8] = b".memgaze.text\0";

/// A planned `.symtab` with the copies' symbols, and the section headers
/// that describe it ([`CopySymbols::plan`], [`CopySymbols::write`]).
#[derive(Clone, Debug)]
pub(crate) struct CopySymbols {
    /// The output's section headers: the input's, then `.memgaze.text`.
    /// `.symtab` and `.shstrtab` get their offsets when written.
    sections: Vec<SectionHeader>,
    symtab_index: usize,
    shstrtab_index: usize,
    /// Symbols of the input's `.symtab` before its first global.
    locals: usize,
    /// The copies' symbols, by copy address.
    copies: Vec<Sym>,
}

/// The input's `.symtab`: where it is and how it splits.
struct InputSymtab<'a> {
    /// Its entries' bytes.
    bytes: &'a [u8],
    /// Index of the first non-local (`sh_info`).
    first_global: usize,
}

impl CopySymbols {
    /// Plans a symbol for each copy of `copies` whose original has one, in
    /// the section `(address, file offset, length)` over the copies, for
    /// the executable `bytes` with `header`; `None` where there is nothing
    /// to add or it could not be added safely (see the module's
    /// documentation).
    pub(crate) fn plan(
        bytes: &[u8],
        header: &Header,
        (address, offset, len): (u64, u64, u64),
        copies: &[CopyMap],
    ) -> Option<CopySymbols> {
        let mut sections = read_sections(bytes, header)?;
        let symtab_index = only_symtab(&sections)?;
        let input = input_symtab(bytes, &sections[symtab_index])?;
        let names = names_by_start(&input);
        let mut symbols: Vec<Sym> = copies
            .iter()
            .filter_map(|copy| {
                let original =
                    names.binary_search_by_key(&copy.original_start, |&(start, _)| start);
                let (_, name) = names[original.ok()?];
                Some((copy, name))
            })
            .map(|(copy, name)| Sym {
                st_name: name,
                st_info: (STB_LOCAL << 4) | STT_FUNC,
                st_other: 0,
                st_shndx: sections.len() as u16,
                st_value: copy.start,
                st_size: copy.end - copy.start,
            })
            .collect();
        if symbols.is_empty() {
            return None;
        }
        symbols.sort_by_key(|s| s.st_value);
        let shstrtab_index = usize::from(header.e_shstrndx);
        sections.push(SectionHeader {
            sh_name: sections[shstrtab_index].sh_size as u32,
            sh_type: SHT_PROGBITS,
            sh_flags: u64::from(SHF_ALLOC | SHF_EXECINSTR),
            sh_addr: address,
            sh_offset: offset,
            sh_size: len,
            sh_link: 0,
            sh_info: 0,
            sh_addralign: 64,
            sh_entsize: 0,
        });
        let symtab = &mut sections[symtab_index];
        symtab.sh_size += (symbols.len() * SIZEOF_SYM) as u64;
        symtab.sh_info += symbols.len() as u32;
        sections[shstrtab_index].sh_size += SECTION_NAME.len() as u64;
        Some(CopySymbols {
            locals: input.first_global,
            sections,
            symtab_index,
            shstrtab_index,
            copies: symbols,
        })
    }

    /// Writes the new `.symtab`, `.shstrtab` and section header table from
    /// `at` (past everything else) and gives the header's new `e_shoff` and
    /// `e_shnum`, and the end of the file.
    pub(crate) fn write(
        mut self,
        bytes: &[u8],
        out: &mut dyn Output,
        at: u64,
    ) -> Result<(u64, u16, u64), scroll::Error> {
        // Explicit zeros between the parts: a first encoding of the copies
        // that the encoder refused may have written past the segment.
        let symtab_at = pad_to(out, at, 8);
        let added_symbols = self.copies.len() * SIZEOF_SYM;
        let symtab = self.sections[self.symtab_index];
        let input_symtab = slice(
            bytes,
            symtab.sh_offset,
            symtab.sh_size - added_symbols as u64,
        )
        .expect("inside the file: checked by plan");
        let split = self.locals * SIZEOF_SYM;
        let mut copies = vec![0u8; added_symbols];
        for (i, symbol) in self.copies.iter().enumerate() {
            copies.pwrite_with(*symbol, i * SIZEOF_SYM, LE)?;
        }
        out.write_at(symtab_at, &input_symtab[..split]);
        out.write_at(symtab_at + split as u64, &copies);
        out.write_at(
            symtab_at + (split + added_symbols) as u64,
            &input_symtab[split..],
        );

        let names_at = symtab_at + symtab.sh_size;
        let names = self.sections[self.shstrtab_index];
        let input_names = slice(
            bytes,
            names.sh_offset,
            names.sh_size - SECTION_NAME.len() as u64,
        )
        .expect("inside the file: checked by plan");
        out.write_at(names_at, input_names);
        out.write_at(names_at + input_names.len() as u64, SECTION_NAME);

        self.sections[self.symtab_index].sh_offset = symtab_at;
        self.sections[self.shstrtab_index].sh_offset = names_at;
        let headers_at = pad_to(out, names_at + names.sh_size, 8);
        let mut headers = vec![0u8; self.sections.len() * SIZEOF_SHDR];
        for (i, section) in self.sections.iter().enumerate() {
            headers.pwrite_with(*section, i * SIZEOF_SHDR, LE)?;
        }
        out.write_at(headers_at, &headers);
        let count = u16::try_from(self.sections.len()).expect("checked by plan");
        Ok((headers_at, count, headers_at + headers.len() as u64))
    }
}

/// Writes zeros from `at` to its next multiple of `align` and gives that.
fn pad_to(out: &mut dyn Output, at: u64, align: u64) -> u64 {
    let to = super::elf::align_up(at, align);
    out.write_at(at, &[0; 64][..(to - at) as usize]);
    to
}

/// The bytes `offset..offset + len` of `bytes`, if inside.
fn slice(bytes: &[u8], offset: u64, len: u64) -> Option<&[u8]> {
    let start = usize::try_from(offset).ok()?;
    let end = start.checked_add(usize::try_from(len).ok()?)?;
    bytes.get(start..end)
}

/// The input's section headers, if in the file, in the ELF64 entry size,
/// with room for one more index below the reserved ones and a `.shstrtab`
/// inside the file.
fn read_sections(bytes: &[u8], header: &Header) -> Option<Vec<SectionHeader>> {
    let count = usize::from(header.e_shnum);
    let names = usize::from(header.e_shstrndx);
    if header.e_shoff == 0
        || usize::from(header.e_shentsize) != SIZEOF_SHDR
        || count == 0
        || count + 1 >= SHN_LORESERVE as usize
        || names >= count
    {
        return None;
    }
    let table = slice(bytes, header.e_shoff, (count * SIZEOF_SHDR) as u64)?;
    let sections: Vec<SectionHeader> = (0..count)
        .map(|i| table.pread_with(i * SIZEOF_SHDR, LE).ok())
        .collect::<Option<_>>()?;
    let shstrtab = &sections[names];
    slice(bytes, shstrtab.sh_offset, shstrtab.sh_size)?;
    Some(sections)
}

/// The index of the one `.symtab`, if no section refers to its symbols by
/// index (those indices of the globals move).
fn only_symtab(sections: &[SectionHeader]) -> Option<usize> {
    let mut tables = (0..sections.len()).filter(|&i| sections[i].sh_type == SHT_SYMTAB);
    let index = tables.next()?;
    if tables.next().is_some() {
        return None;
    }
    let by_index = [SHT_REL, SHT_RELA, SHT_GROUP, SHT_SYMTAB_SHNDX];
    let referred = sections
        .iter()
        .any(|s| by_index.contains(&s.sh_type) && s.sh_link as usize == index);
    (!referred).then_some(index)
}

/// The input's `.symtab`, if its entries are ELF64 symbols inside the file
/// and its first global is one of them.
fn input_symtab<'a>(bytes: &'a [u8], symtab: &SectionHeader) -> Option<InputSymtab<'a>> {
    let table = slice(bytes, symtab.sh_offset, symtab.sh_size)?;
    let count = table.len() / SIZEOF_SYM;
    let first_global = symtab.sh_info as usize;
    (symtab.sh_entsize == SIZEOF_SYM as u64
        && table.len() % SIZEOF_SYM == 0
        && (1..=count).contains(&first_global))
    .then_some(InputSymtab {
        bytes: table,
        first_global,
    })
}

/// `(start, .strtab offset of its name)` of each function with a sized
/// symbol, sorted by start. Where several name one start, the name
/// function discovery keeps: global, then weak, then local, the first in
/// the table among equals.
fn names_by_start(symtab: &InputSymtab<'_>) -> Vec<(u64, u32)> {
    let mut named: Vec<(u64, u8, usize, u32)> =
        (0..symtab.bytes.len() / SIZEOF_SYM)
            .filter_map(|i| {
                let sym: Sym = symtab.bytes.pread_with(i * SIZEOF_SYM, LE).ok()?;
                let kind = sym.st_info & 0xf;
                let rank = match sym.st_info >> 4 {
                    STB_GLOBAL => 0,
                    STB_WEAK => 1,
                    _ => 2,
                };
                let defined = sym.st_shndx != SHN_UNDEF as u16 && sym.st_name != 0;
                ((kind == STT_FUNC || kind == STT_GNU_IFUNC) && sym.st_size > 0 && defined)
                    .then_some((sym.st_value, rank, i, sym.st_name))
            })
            .collect();
    named.sort_unstable();
    named.dedup_by_key(|&mut (start, ..)| start);
    named
        .into_iter()
        .map(|(start, _, _, name)| (start, name))
        .collect()
}
