//! The ELF container: header checks, sections, segments and the dynamic
//! table, copied out of goblin's borrowed view into plain owned types.
//!
//! Every check that can reject a file happens here, before anything else
//! reads it, so that bad input produces one precise message
//! ([`BinaryError`]) instead of a parse failure deep inside the analysis.

use goblin::elf::dynamic::{DF_1_PIE, DT_FLAGS_1};
use goblin::elf::header::{EM_X86_64, ET_CORE, ET_DYN, ET_EXEC, ET_REL, machine_to_str};
use goblin::elf::program_header::{PF_R, PF_W, PF_X, PT_INTERP, PT_LOAD};
use goblin::elf::section_header::{SHF_ALLOC, SHF_COMPRESSED, SHF_EXECINSTR, SHT_NOBITS};

/// Why a file cannot be analysed. The message names the problem; the caller
/// adds the path.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum BinaryError {
    /// The file does not start with the ELF magic.
    #[error("not an ELF file (it starts with {0})")]
    NotElf(String),
    /// A 32-bit ELF file.
    #[error("a 32-bit ELF file; only x86-64 (64-bit) executables are supported")]
    Not64Bit,
    /// A big-endian ELF file.
    #[error("a big-endian ELF file; only x86-64 executables are supported")]
    BigEndian,
    /// Another architecture.
    #[error("an ELF file for {machine} (e_machine {code}); only x86-64 executables are supported")]
    NotX86_64 {
        /// Readable architecture name.
        machine: &'static str,
        /// Raw `e_machine`.
        code: u16,
    },
    /// A shared library where an executable was expected.
    #[error(
        "a shared object (library), not an executable: it has neither PT_INTERP nor the DF_1_PIE flag"
    )]
    SharedObject,
    /// An object file (`.o`).
    #[error("a relocatable object file (.o), not a linked executable")]
    Relocatable,
    /// A core dump.
    #[error("a core dump, not an executable")]
    Core,
    /// Some other `e_type`.
    #[error("an ELF file of unsupported type e_type {0}")]
    UnknownType(u16),
    /// The file ends before something its headers describe.
    #[error("truncated: {0}")]
    Truncated(String),
    /// The headers are inconsistent in some other way.
    #[error("malformed ELF: {0}")]
    Malformed(String),
}

/// Whether the loader maps the executable at a fixed address or anywhere.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum ExecutableKind {
    /// `ET_EXEC`: linked at fixed addresses.
    Fixed,
    /// `ET_DYN` with `PT_INTERP` or `DF_1_PIE`: position-independent.
    Pie,
    /// `ET_DYN` without either: a shared library (only from
    /// [`super::Binary::open_any`]).
    SharedObject,
}

/// One section header, owned.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Section {
    /// Index in the section header table.
    pub index: usize,
    /// Name from `.shstrtab` (empty when it has none).
    pub name: String,
    /// `sh_type`.
    pub kind: u32,
    /// `sh_flags`.
    pub flags: u64,
    /// `sh_addr`: virtual address when loaded (0 when not allocated).
    pub addr: u64,
    /// `sh_offset`: position in the file.
    pub offset: u64,
    /// `sh_size` in bytes.
    pub size: u64,
    /// `sh_addralign`.
    pub align: u64,
    /// `sh_entsize`.
    pub(crate) entry_size: u64,
}

impl Section {
    /// One past the last virtual address.
    pub fn end(&self) -> u64 {
        self.addr.saturating_add(self.size)
    }

    /// Whether it holds machine code (`SHF_EXECINSTR`).
    pub fn is_executable(&self) -> bool {
        self.flags & u64::from(SHF_EXECINSTR) != 0
    }

    /// Whether it is mapped at run time (`SHF_ALLOC`).
    pub(crate) fn is_alloc(&self) -> bool {
        self.flags & u64::from(SHF_ALLOC) != 0
    }

    /// Whether its contents are stored compressed (`SHF_COMPRESSED`).
    pub(crate) fn is_compressed(&self) -> bool {
        self.flags & u64::from(SHF_COMPRESSED) != 0
    }

    /// Whether it occupies bytes in the file (everything but `SHT_NOBITS`).
    pub(crate) fn has_file_data(&self) -> bool {
        self.kind != SHT_NOBITS
    }

    /// Whether `addr` lies inside it.
    pub fn contains(&self, addr: u64) -> bool {
        self.is_alloc() && addr >= self.addr && addr < self.end()
    }

    /// Procedure-linkage-table stubs (`.plt`, `.plt.got`, `.plt.sec`,
    /// `.iplt`): executable, but not functions of the program.
    pub(crate) fn is_plt(&self) -> bool {
        self.name.starts_with(".plt") || self.name == ".iplt"
    }
}

/// One program header, owned.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Segment {
    /// Index in the program header table.
    pub index: usize,
    /// `p_type`.
    pub kind: u32,
    /// `p_flags` (`PF_R`, `PF_W`, `PF_X`).
    pub flags: u32,
    /// `p_offset`.
    pub offset: u64,
    /// `p_vaddr`.
    pub vaddr: u64,
    /// `p_paddr`.
    pub(crate) paddr: u64,
    /// `p_filesz`.
    pub file_size: u64,
    /// `p_memsz`.
    pub mem_size: u64,
    /// `p_align`.
    pub align: u64,
}

impl Segment {
    /// A `PT_LOAD` segment.
    pub fn is_load(&self) -> bool {
        self.kind == PT_LOAD
    }

    /// Mapped executable.
    pub fn is_executable(&self) -> bool {
        self.flags & PF_X != 0
    }

    /// Mapped writable.
    pub fn is_writable(&self) -> bool {
        self.flags & PF_W != 0
    }

    /// Mapped readable.
    pub fn is_readable(&self) -> bool {
        self.flags & PF_R != 0
    }

    /// Whether the virtual address lies in the file-backed part.
    pub(crate) fn contains_file_vaddr(&self, vaddr: u64) -> bool {
        vaddr >= self.vaddr && vaddr - self.vaddr < self.file_size
    }
}

/// One `.dynamic` entry (`d_tag`, `d_val`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DynamicEntry {
    /// `d_tag`, e.g. `DT_FINI` (13).
    pub tag: u64,
    /// `d_val` / `d_ptr`.
    pub value: u64,
}

/// Checks the ELF identification and header fields that decide whether the
/// file is something we analyse, before goblin parses the rest.
pub(crate) fn check_ident(data: &[u8]) -> Result<(), BinaryError> {
    if data.len() < 4 || &data[..4] != b"\x7fELF" {
        return Err(BinaryError::NotElf(describe_start(data)));
    }
    let truncated = || {
        BinaryError::Truncated(format!(
            "the file has {} bytes, fewer than an ELF header (64)",
            data.len()
        ))
    };
    match data.get(4) {
        Some(2) => {}
        Some(1) => return Err(BinaryError::Not64Bit),
        Some(other) => {
            return Err(BinaryError::Malformed(format!(
                "unknown ELF class {other} in e_ident"
            )));
        }
        None => return Err(truncated()),
    }
    if data.get(5).is_some_and(|&d| d != 1) {
        return Err(BinaryError::BigEndian);
    }
    if data.len() < 64 {
        return Err(truncated());
    }
    let machine = u16::from_le_bytes([data[18], data[19]]);
    if machine != EM_X86_64 {
        return Err(BinaryError::NotX86_64 {
            machine: machine_name(machine),
            code: machine,
        });
    }
    let kind = u16::from_le_bytes([data[16], data[17]]);
    match kind {
        ET_EXEC | ET_DYN => Ok(()),
        ET_REL => Err(BinaryError::Relocatable),
        ET_CORE => Err(BinaryError::Core),
        other => Err(BinaryError::UnknownType(other)),
    }
}

/// A readable name for the architectures people are likely to pass by
/// mistake; goblin's table for the rest.
fn machine_name(machine: u16) -> &'static str {
    match machine {
        3 => "i386 (32-bit x86)",
        40 => "32-bit ARM",
        183 => "AArch64 (64-bit ARM)",
        243 => "RISC-V",
        other => machine_to_str(other),
    }
}

fn describe_start(data: &[u8]) -> String {
    if data.is_empty() {
        return "nothing: the file is empty".to_string();
    }
    if let Some(line) = data.strip_prefix(b"#!") {
        let line = line.split(|&b| b == b'\n').next().unwrap_or_default();
        let line = String::from_utf8_lossy(&line[..line.len().min(80)]);
        return format!(
            "`#!{}`: a script; run its interpreter, an ELF executable, with the script as its argument",
            line.trim()
        );
    }
    let head: Vec<String> = data.iter().take(4).map(|b| format!("{b:02x}")).collect();
    format!("bytes {}", head.join(" "))
}

/// Verifies that every header table, section and segment lies inside the
/// file, naming the first one that does not.
pub(crate) fn check_extents(
    file_len: u64,
    header: &goblin::elf::Header,
    sections: &[Section],
    segments: &[Segment],
) -> Result<(), BinaryError> {
    let table = |what: &str, offset: u64, count: u64, entry: u64| {
        let end = offset
            .checked_add(count.saturating_mul(entry))
            .ok_or_else(|| BinaryError::Malformed(format!("{what} offset overflows")))?;
        if end > file_len {
            return Err(BinaryError::Truncated(format!(
                "the {what} ends at byte {end} but the file has {file_len} bytes"
            )));
        }
        Ok(())
    };
    table(
        "program header table",
        header.e_phoff,
        u64::from(header.e_phnum),
        u64::from(header.e_phentsize),
    )?;
    table(
        "section header table",
        header.e_shoff,
        u64::from(header.e_shnum),
        u64::from(header.e_shentsize),
    )?;
    for s in sections.iter().filter(|s| s.has_file_data() && s.size > 0) {
        let end = s.offset.saturating_add(s.size);
        if end > file_len {
            return Err(BinaryError::Truncated(format!(
                "section {} ends at byte {end} but the file has {file_len} bytes",
                if s.name.is_empty() {
                    format!("#{}", s.index)
                } else {
                    s.name.clone()
                }
            )));
        }
    }
    for p in segments.iter().filter(|p| p.file_size > 0) {
        let end = p.offset.saturating_add(p.file_size);
        if end > file_len {
            return Err(BinaryError::Truncated(format!(
                "segment #{} (p_type {:#x}) ends at byte {end} but the file has {file_len} bytes",
                p.index, p.kind
            )));
        }
    }
    Ok(())
}

/// Classifies an `ET_EXEC`/`ET_DYN` file.
pub(crate) fn executable_kind(
    e_type: u16,
    segments: &[Segment],
    dynamic: &[DynamicEntry],
) -> ExecutableKind {
    if e_type == ET_EXEC {
        return ExecutableKind::Fixed;
    }
    let has_interp = segments.iter().any(|p| p.kind == PT_INTERP);
    let pie_flag = dynamic
        .iter()
        .any(|d| d.tag == DT_FLAGS_1 && d.value & DF_1_PIE != 0);
    if has_interp || pie_flag {
        ExecutableKind::Pie
    } else {
        ExecutableKind::SharedObject
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(class: u8, data: u8, e_type: u16, machine: u16) -> Vec<u8> {
        let mut h = vec![0u8; 64];
        h[..4].copy_from_slice(b"\x7fELF");
        h[4] = class;
        h[5] = data;
        h[6] = 1;
        h[16..18].copy_from_slice(&e_type.to_le_bytes());
        h[18..20].copy_from_slice(&machine.to_le_bytes());
        h
    }

    #[test]
    fn rejects_non_elf_and_says_what_it_starts_with() {
        assert_eq!(
            check_ident(b"#!/bin/sh -e\necho\n"),
            Err(BinaryError::NotElf(
                "`#!/bin/sh -e`: a script; run its interpreter, an ELF executable, with the script as its argument".into()
            ))
        );
        assert_eq!(
            check_ident(b"MZ\x90\x00"),
            Err(BinaryError::NotElf("bytes 4d 5a 90 00".into()))
        );
        assert!(matches!(check_ident(b""), Err(BinaryError::NotElf(_))));
    }

    #[test]
    fn rejects_wrong_class_endianness_machine_and_type() {
        assert_eq!(
            check_ident(&header(1, 1, ET_EXEC, 3)),
            Err(BinaryError::Not64Bit)
        );
        assert_eq!(
            check_ident(&header(2, 2, ET_EXEC, EM_X86_64)),
            Err(BinaryError::BigEndian)
        );
        assert_eq!(
            check_ident(&header(2, 1, ET_EXEC, 183)),
            Err(BinaryError::NotX86_64 {
                machine: "AArch64 (64-bit ARM)",
                code: 183
            })
        );
        assert_eq!(
            check_ident(&header(2, 1, ET_REL, EM_X86_64)),
            Err(BinaryError::Relocatable)
        );
        assert_eq!(
            check_ident(&header(2, 1, ET_CORE, EM_X86_64)),
            Err(BinaryError::Core)
        );
        assert_eq!(check_ident(&header(2, 1, ET_DYN, EM_X86_64)), Ok(()));
        assert!(matches!(
            check_ident(&header(2, 1, ET_EXEC, EM_X86_64)[..40]),
            Err(BinaryError::Truncated(_))
        ));
    }

    #[test]
    fn pie_needs_interp_or_flag() {
        let interp = Segment {
            index: 0,
            kind: PT_INTERP,
            flags: PF_R,
            offset: 0,
            vaddr: 0,
            paddr: 0,
            file_size: 0,
            mem_size: 0,
            align: 1,
        };
        assert_eq!(executable_kind(ET_EXEC, &[], &[]), ExecutableKind::Fixed);
        assert_eq!(executable_kind(ET_DYN, &[interp], &[]), ExecutableKind::Pie);
        let flag = DynamicEntry {
            tag: DT_FLAGS_1,
            value: DF_1_PIE,
        };
        assert_eq!(executable_kind(ET_DYN, &[], &[flag]), ExecutableKind::Pie);
        assert_eq!(
            executable_kind(ET_DYN, &[], &[]),
            ExecutableKind::SharedObject
        );
    }
}
