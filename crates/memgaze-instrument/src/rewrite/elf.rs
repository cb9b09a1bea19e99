//! Editing an x86-64 ELF executable in place: one new code segment, a few
//! bytes of zero-initialised state, patched entry points.
//!
//! Layout (see ARCHITECTURE.md, "ELF layout"):
//! - the new code is appended at a page-aligned file offset and mapped by a
//!   `PT_LOAD R+X` made from a `PT_NOTE` header (a `PT_NOTE` that does not
//!   carry the GNU property note when there is a choice); the header moves
//!   right after the last `PT_LOAD` of the table and its address is above
//!   every other segment, because the kernel sizes the mapping from the
//!   first and last `PT_LOAD`;
//! - state lives past the end of the last writable `PT_LOAD` (its bss grows);
//! - `e_entry`, `DT_FINI` and `PT_GNU_EH_FRAME` are redirected by the caller
//!   through `ElfEditor`.
//!
//! Nothing is moved, so every address and offset of the original stays
//! valid. Past the segment come a new `.symtab` with a symbol per copy,
//! `.shstrtab` and the section headers, which gain a section over the copies
//! (`ElfEditor::name_copies`, module `symbols`); otherwise section
//! headers are left as they were.

use super::output::Output;
use super::relocate::CopyMap;
use super::symbols::CopySymbols;
use crate::error::ElfError;
use goblin::elf::header::{
    EI_CLASS, EI_DATA, ELFCLASS64, ELFDATA2LSB, ELFMAG, EM_X86_64, ET_DYN, ET_EXEC,
};
use goblin::elf64::dynamic::{DF_1_PIE, DT_FINI, DT_FLAGS_1, DT_NULL, Dyn, SIZEOF_DYN};
use goblin::elf64::header::{Header, SIZEOF_EHDR};
use goblin::elf64::program_header::{
    PF_R, PF_W, PF_X, PT_DYNAMIC, PT_GNU_EH_FRAME, PT_GNU_PROPERTY, PT_INTERP, PT_LOAD, PT_NOTE,
    ProgramHeader, SIZEOF_PHDR,
};
use goblin::elf64::section_header::{SIZEOF_SHDR, SectionHeader};
use scroll::{LE, Pread, Pwrite};
use std::fs::File;

/// Page size the new segment is aligned to.
pub const PAGE: u64 = 0x1000;

/// The first bytes of every segment cargo memgaze adds; finding them in a
/// `PT_LOAD` means the binary was already instrumented.
pub(crate) const SIGNATURE: &[u8; 32] = b"cargo-memgaze instrumented v1\0\0\0";

/// Whether the `PT_LOAD` at file `offset` with `file_size` bytes in the
/// file `bytes` starts with [`SIGNATURE`].
pub(crate) fn segment_is_signed(bytes: &[u8], offset: u64, file_size: u64) -> bool {
    file_size >= SIGNATURE.len() as u64
        && usize::try_from(offset)
            .ok()
            .and_then(|start| bytes.get(start..))
            .is_some_and(|segment| segment.starts_with(SIGNATURE))
}

/// Bytes of the input copied into the output between two releases of the
/// input's pages ([`ElfEditor::finish`]).
pub(crate) const COPY_CHUNK: usize = 4 << 20;

/// Whether `vaddr..vaddr + len` lies in the file-backed part of `h`.
fn contains_file(h: &ProgramHeader, vaddr: u64, len: u64) -> bool {
    vaddr >= h.p_vaddr && vaddr + len <= h.p_vaddr + h.p_filesz
}

/// An executable being edited. The input is borrowed, not copied: the
/// entry patches are kept aside and applied when the output is written
/// ([`ElfEditor::finish`]), so a large input is not held twice.
#[derive(Clone, Debug)]
pub(crate) struct ElfEditor<'a> {
    bytes: &'a [u8],
    /// `(file offset, range in `patched`)` of each patch, in order.
    patches: Vec<(usize, std::ops::Range<usize>)>,
    /// The patches' bytes.
    patched: Vec<u8>,
    /// The ELF header as read; `finish` changes `e_entry` and, when the
    /// copies are named, `e_shoff` and `e_shnum`.
    header: Header,
    headers: Vec<ProgramHeader>,
    /// Whether the binary is position independent (`ET_DYN`).
    pub pie: bool,
    /// Original `e_entry`.
    pub entry: u64,
    /// File offset of the `.dynamic` entry that is (or becomes) `DT_FINI`,
    /// and the original value if present.
    fini_slot: Option<(usize, Option<u64>)>,
    note_index: usize,
    rw_index: usize,
    /// Address of the reserved state (zero-initialised).
    pub state_va: u64,
    state_bytes: u64,
    /// Address and file offset of the new segment.
    pub(crate) segment_va: u64,
    segment_offset: u64,
    /// The copies' symbols and section, when [`ElfEditor::name_copies`]
    /// planned them.
    copy_symbols: Option<CopySymbols>,
}

impl<'a> ElfEditor<'a> {
    /// Parses `bytes` and plans the layout, reserving `state_bytes` of bss.
    ///
    /// Fails with a message fit for users on anything this rewriter does not
    /// handle: not x86-64 ELF, statically linked, already instrumented, no
    /// spare program header, no writable segment at the end.
    pub fn new(bytes: &'a [u8], state_bytes: u64) -> Result<ElfEditor<'a>, ElfError> {
        ElfEditor::open(bytes, state_bytes, false)
    }

    /// [`ElfEditor::new`] for a shared library (an `ET_DYN` with a dynamic
    /// section and no interpreter is accepted; static executables are not).
    pub fn new_library(bytes: &'a [u8], state_bytes: u64) -> Result<ElfEditor<'a>, ElfError> {
        ElfEditor::open(bytes, state_bytes, true)
    }

    fn open(bytes: &'a [u8], state_bytes: u64, library: bool) -> Result<ElfEditor<'a>, ElfError> {
        // The identification bytes are checked before goblin reads the
        // header, so that the message names what is wrong: goblin's 64-bit
        // reader would read a 32-bit header as a 64-bit one, and a
        // big-endian one without complaint.
        if bytes.len() < SIZEOF_EHDR || &bytes[..ELFMAG.len()] != ELFMAG {
            return Err(ElfError::NotElf);
        }
        if bytes[EI_CLASS] != ELFCLASS64 || bytes[EI_DATA] != ELFDATA2LSB {
            return Err(ElfError::NotElf64LittleEndian);
        }
        let header: Header = bytes.pread_with(0, LE).map_err(ElfError::Header)?;
        if header.e_machine != EM_X86_64 {
            return Err(ElfError::NotX86_64(header.e_machine));
        }
        let e_type = header.e_type;
        if e_type != ET_EXEC && e_type != ET_DYN {
            return Err(ElfError::NotExecutable(e_type));
        }
        let headers = read_program_headers(bytes, &header)?;
        let phnum = headers.len();
        if !headers.iter().any(|h| h.p_type == PT_INTERP) {
            if e_type == ET_DYN && !headers.iter().any(|h| h.p_type == PT_DYNAMIC) {
                return Err(ElfError::StaticPie);
            }
            if e_type == ET_DYN && !library {
                // A static-pie has `.dynamic` too (it relocates itself);
                // its `DF_1_PIE` flag tells it from a library.
                return Err(if pie_flagged(bytes, &headers)? {
                    ElfError::StaticPie
                } else {
                    ElfError::SharedLibrary
                });
            }
            if e_type != ET_DYN {
                return Err(ElfError::StaticallyLinked);
            }
        }
        if library && e_type != ET_DYN {
            return Err(ElfError::NotExecutable(e_type));
        }
        if let Some(section) = go_section(bytes, &header) {
            return Err(ElfError::GoProgram(section));
        }
        if headers
            .iter()
            .filter(|h| h.p_type == PT_LOAD)
            .any(|h| segment_is_signed(bytes, h.p_offset, h.p_filesz))
        {
            return Err(ElfError::AlreadyInstrumented);
        }
        let loads: Vec<usize> = (0..phnum)
            .filter(|&i| headers[i].p_type == PT_LOAD)
            .collect();
        let Some(&last_load) = loads.last() else {
            return Err(ElfError::NoLoadableSegment);
        };
        // The writable segment with the highest address gets the state.
        let rw_index = *loads
            .iter()
            .filter(|&&i| headers[i].p_flags & PF_W != 0)
            .max_by_key(|&&i| headers[i].p_vaddr)
            .ok_or(ElfError::NoWritableSegment)?;
        let rw = headers[rw_index];
        let highest = loads
            .iter()
            .map(|&i| headers[i].p_vaddr + headers[i].p_memsz)
            .max()
            .unwrap();
        if rw.p_vaddr + rw.p_memsz != highest {
            return Err(ElfError::WritableSegmentNotLast);
        }
        let property = headers
            .iter()
            .find(|h| h.p_type == PT_GNU_PROPERTY)
            .copied();
        let notes: Vec<usize> = (0..phnum)
            .filter(|&i| headers[i].p_type == PT_NOTE)
            .collect();
        let note_index = notes
            .iter()
            .copied()
            .find(|&i| property.is_none_or(|p| p.p_offset != headers[i].p_offset))
            .or_else(|| notes.first().copied())
            .ok_or(ElfError::NoNoteHeader)?;
        let _ = last_load;

        let state_va = align_up(rw.p_vaddr + rw.p_memsz, 64);
        let segment_va = align_up(state_va + state_bytes, PAGE);
        let segment_offset = align_up(bytes.len() as u64, PAGE);

        let fini_slot = find_fini(bytes, &headers)?;
        Ok(ElfEditor {
            pie: e_type == ET_DYN,
            entry: header.e_entry,
            fini_slot,
            note_index,
            rw_index,
            state_va,
            state_bytes,
            segment_va,
            segment_offset,
            copy_symbols: None,
            bytes,
            patches: Vec::new(),
            patched: Vec::new(),
            header,
            headers,
        })
    }

    /// The original `DT_FINI` function, if any.
    pub fn fini(&self) -> Option<u64> {
        self.fini_slot.and_then(|(_, value)| value)
    }

    /// Whether an exit hook can be installed through `DT_FINI`.
    pub(crate) fn can_hook_fini(&self) -> bool {
        self.fini_slot.is_some()
    }

    /// Whether the binary has a `PT_GNU_EH_FRAME` (how the unwinder finds
    /// FDEs; new FDEs are only useful with one).
    pub(crate) fn has_eh_frame_hdr(&self) -> bool {
        self.headers.iter().any(|h| h.p_type == PT_GNU_EH_FRAME)
    }

    /// The file offset of `vaddr` if `len` bytes from it are file-backed.
    pub fn offset_of(&self, vaddr: u64, len: u64) -> Option<usize> {
        self.headers
            .iter()
            .filter(|h| h.p_type == PT_LOAD)
            .find(|h| contains_file(h, vaddr, len))
            .map(|h| (vaddr - h.p_vaddr + h.p_offset) as usize)
    }

    /// Overwrites original bytes at `vaddr` (an entry patch).
    pub fn patch(&mut self, vaddr: u64, data: &[u8]) -> Result<(), ElfError> {
        let at = self
            .offset_of(vaddr, data.len() as u64)
            .ok_or(ElfError::PatchOutsideFile { vaddr })?;
        let from = self.patched.len();
        self.patched.extend_from_slice(data);
        self.patches.push((at, from..self.patched.len()));
        Ok(())
    }

    /// Names the copies in the output: a `.symtab` symbol for each of
    /// `copies` whose original has one, in a section over the copies'
    /// `len` bytes at `va`. Does nothing for a stripped input (see
    /// [`super::symbols`] for the other cases).
    pub(crate) fn name_copies(&mut self, va: u64, len: u64, copies: &[CopyMap]) {
        let section = (va, self.file_offset(va), len);
        self.copy_symbols = CopySymbols::plan(self.bytes, &self.header, section, copies);
    }

    /// Writes over `chunk`, the input's bytes from offset `from` on, the
    /// parts of `patches` (indices into the patches, in the order they were
    /// made: a later patch wins where two overlap) that fall in it.
    fn apply_patches(&self, chunk: &mut [u8], from: usize, patches: &[u32]) {
        let to = from + chunk.len();
        for &p in patches {
            let (at, range) = &self.patches[p as usize];
            let patch = &self.patched[range.clone()];
            let (start, end) = ((*at).max(from), (at + patch.len()).min(to));
            if start < end {
                chunk[start - from..end - from].copy_from_slice(&patch[start - at..end - at]);
            }
        }
    }

    /// The file offset of `va` in the new segment.
    pub(crate) fn file_offset(&self, va: u64) -> u64 {
        self.segment_offset + (va - self.segment_va)
    }

    /// Writes the final executable to `out`: the input, its patches, the
    /// entry point and `DT_FINI` redirected when given (`(entry, fini)`),
    /// `PT_GNU_EH_FRAME` moved when
    /// given (`(vaddr, size)` of a new `.eh_frame_hdr` inside the segment),
    /// and the segment of `segment_len` bytes mapped at
    /// `ElfEditor::segment_va`, which `write_segment` writes at the file
    /// offset it is given (starting with `SIGNATURE`) and gives the offset
    /// past; then the copies' symbols, if [`ElfEditor::name_copies`]
    /// planned them. `input_file`, when given, is the file `bytes` were
    /// read from, for the output to copy from; `release_input` is called
    /// with each range of the input once copied from `bytes`.
    pub fn finish(
        self,
        out: &mut dyn Output,
        segment_len: u64,
        write_segment: impl FnOnce(&mut dyn Output, u64) -> u64,
        (entry, fini): (Option<u64>, Option<u64>),
        eh_frame_hdr: Option<(u64, u64)>,
        (input_file, release_input): (Option<&File>, impl Fn(std::ops::Range<usize>)),
    ) -> Result<(), ElfError> {
        let _writing = crate::timings::phase("write executable");
        self.write_input(out, input_file, release_input);
        // What a patch holds past the input's end.
        for (at, range) in &self.patches {
            let patch = &self.patched[range.clone()];
            let past = self.bytes.len().clamp(*at, at + patch.len());
            if past < at + patch.len() {
                out.write_at(past as u64, &patch[past - at..]);
            }
        }
        if let Some(fini) = fini {
            let (at, _) = self.fini_slot.ok_or(ElfError::NoExitHook)?;
            // Either the existing DT_FINI gets a new value or a spare
            // DT_NULL becomes DT_FINI: the same entry is written in both.
            let entry = Dyn {
                d_tag: DT_FINI,
                d_val: fini,
            };
            write_struct(out, at, entry, SIZEOF_DYN)?;
        }
        let mut headers = self.headers.clone();
        headers[self.rw_index].p_memsz =
            self.state_va + self.state_bytes - headers[self.rw_index].p_vaddr;
        if let Some((vaddr, size)) = eh_frame_hdr {
            let offset = self.segment_offset + (vaddr - self.segment_va);
            for h in headers.iter_mut().filter(|h| h.p_type == PT_GNU_EH_FRAME) {
                h.p_offset = offset;
                h.p_vaddr = vaddr;
                h.p_paddr = vaddr;
                h.p_filesz = size;
                h.p_memsz = size;
            }
        }
        let new_load = ProgramHeader {
            p_type: PT_LOAD,
            p_flags: PF_R | PF_X,
            p_offset: self.segment_offset,
            p_vaddr: self.segment_va,
            p_paddr: self.segment_va,
            p_filesz: segment_len,
            p_memsz: segment_len,
            p_align: PAGE,
        };
        headers.remove(self.note_index);
        let last_load = headers
            .iter()
            .rposition(|h| h.p_type == PT_LOAD)
            .expect("a PT_LOAD exists");
        headers.insert(last_load + 1, new_load);
        // The table keeps its length (one PT_NOTE out, one PT_LOAD in), so
        // it is rewritten in place at its original entry size.
        let phoff = self.header.e_phoff as usize;
        let phentsize = usize::from(self.header.e_phentsize);
        for (i, h) in headers.into_iter().enumerate() {
            write_struct(out, phoff + i * phentsize, h, SIZEOF_PHDR)?;
        }
        // Zeros up to the segment (past an input that ends mid-page).
        let input_end = self.bytes.len() as u64;
        out.write_at(
            input_end,
            &vec![0; self.segment_offset.saturating_sub(input_end) as usize],
        );
        let segment_end = write_segment(out, self.segment_offset);
        assert_eq!(
            segment_end - self.segment_offset,
            segment_len,
            "the segment has the length announced"
        );
        let mut header = Header {
            e_entry: entry.unwrap_or(self.header.e_entry),
            ..self.header
        };
        let end = match self.copy_symbols {
            Some(symbols) => {
                let (shoff, shnum, end) = symbols.write(self.bytes, out, segment_end)?;
                header.e_shoff = shoff;
                header.e_shnum = shnum;
                end
            }
            None => segment_end,
        };
        if header != self.header {
            write_struct(out, 0, header, SIZEOF_EHDR)?;
        }
        // A first encoding the encoder refused may have written further.
        out.set_len(end);
        Ok(())
    }
}

impl ElfEditor<'_> {
    /// Writes the input with its patches applied. A chunk no patch touches
    /// is copied from `input_file` by the output itself where it can (the
    /// kernel copies page cache to page cache: nothing of it is mapped or
    /// read here); a patched one, or every one where the output cannot,
    /// from the input's bytes with the patches applied (a write per patch
    /// was tens of thousands of system calls on a large binary), whose
    /// pages are then given up (`release_input`), so that a mapped input
    /// is not resident beside its copy.
    fn write_input(
        &self,
        out: &mut dyn Output,
        mut input_file: Option<&File>,
        release_input: impl Fn(std::ops::Range<usize>),
    ) {
        let len = self.bytes.len();
        let by_piece = PatchesByPiece::new(&self.patches, len, PATCH_PIECE);
        let chunks = len.div_ceil(COPY_CHUNK);
        let pieces_per_chunk = COPY_CHUNK / PATCH_PIECE;
        let patched = |c: usize| by_piece.any_in(c * pieces_per_chunk..(c + 1) * pieces_per_chunk);
        let mut buffer = Vec::new();
        let mut from = 0;
        while from < len {
            let c = from / COPY_CHUNK;
            // Unpatched chunks in a row go in one copy.
            let unpatched = (c..chunks).take_while(|&c| !patched(c)).count();
            if unpatched > 0
                && let Some(file) = input_file
            {
                let to = (from + unpatched * COPY_CHUNK).min(len);
                if out.copy_from_file(from as u64, file, from as u64, (to - from) as u64) {
                    from = to;
                    continue;
                }
                input_file = None;
            }
            let to = (from + COPY_CHUNK).min(len);
            self.write_patched(out, from..to, &by_piece, &mut buffer);
            release_input(from..to);
            from = to;
        }
    }

    /// Writes the input's bytes in `range` (whole pieces of `by_piece`)
    /// with their patches applied, a piece at a time: a piece no patch
    /// touches straight from the input, a patched one through `buffer`.
    /// A buffer of a piece stays in the allocator's heap; one of a whole
    /// chunk was mapped apart and faulted in afresh (about a thousand
    /// page faults a run).
    fn write_patched(
        &self,
        out: &mut dyn Output,
        range: std::ops::Range<usize>,
        by_piece: &PatchesByPiece,
        buffer: &mut Vec<u8>,
    ) {
        let mut from = range.start;
        while from < range.end {
            let to = (from + by_piece.piece).min(range.end);
            let patches = by_piece.of(from / by_piece.piece);
            if patches.is_empty() {
                out.write_at(from as u64, &self.bytes[from..to]);
            } else {
                buffer.clear();
                buffer.extend_from_slice(&self.bytes[from..to]);
                self.apply_patches(buffer, from, patches);
                out.write_at(from as u64, buffer);
            }
            from = to;
        }
    }
}

/// Bytes of the input patched and written at a time ([`ElfEditor::finish`]);
/// divides [`COPY_CHUNK`].
const PATCH_PIECE: usize = 64 << 10;

/// The patches that touch each piece of the input (of `piece` bytes from
/// offset 0), each piece's in the order they were made: a piece is patched
/// by its own few, not by a walk of all of them.
struct PatchesByPiece {
    piece: usize,
    /// Where each piece's patches begin in `patches`, and one past the
    /// last piece's end.
    starts: Vec<u32>,
    /// Patch indices, piece by piece.
    patches: Vec<u32>,
}

impl PatchesByPiece {
    /// Buckets `patches` (`(file offset, range of bytes)`, in the order
    /// made) over the pieces of an input of `len` bytes; the parts of
    /// patches past `len` belong to no piece.
    fn new(patches: &[(usize, std::ops::Range<usize>)], len: usize, piece: usize) -> Self {
        let pieces_of = |(at, range): &(usize, std::ops::Range<usize>)| {
            let end = (at + range.len()).min(len);
            if *at < end {
                at / piece..(end - 1) / piece + 1
            } else {
                0..0
            }
        };
        // Each piece keeps the order made.
        let (starts, by_piece) = crate::binary::stable_buckets(
            len.div_ceil(piece),
            (patches.iter().enumerate())
                .flat_map(move |(index, p)| pieces_of(p).map(move |i| (i, index as u32))),
        );
        PatchesByPiece {
            piece,
            starts,
            patches: by_piece,
        }
    }

    /// The patches touching piece `i`, in the order made.
    fn of(&self, i: usize) -> &[u32] {
        match (self.starts.get(i), self.starts.get(i + 1)) {
            (Some(&start), Some(&end)) => &self.patches[start as usize..end as usize],
            _ => &[],
        }
    }

    /// Whether any piece in `pieces` is touched by a patch.
    fn any_in(&self, pieces: std::ops::Range<usize>) -> bool {
        let last = self.starts.len() - 1;
        self.starts[pieces.end.min(last)] > self.starts[pieces.start.min(last)]
    }
}

/// Writes `value`, `size` bytes in the file, at `at`.
fn write_struct<T, E>(
    out: &mut dyn Output,
    at: usize,
    value: T,
    size: usize,
) -> Result<(), ElfError>
where
    T: scroll::ctx::TryIntoCtx<scroll::Endian, Error = E>,
    E: From<scroll::Error>,
    ElfError: From<E>,
{
    let mut bytes = vec![0u8; size];
    bytes.pwrite_with(value, 0, LE)?;
    out.write_at(at as u64, &bytes);
    Ok(())
}

/// Reads the program header table, checking that it lies inside the file.
fn read_program_headers(bytes: &[u8], header: &Header) -> Result<Vec<ProgramHeader>, ElfError> {
    let phoff = header.e_phoff as usize;
    let phentsize = usize::from(header.e_phentsize);
    let phnum = usize::from(header.e_phnum);
    if phentsize < SIZEOF_PHDR || phoff + phentsize * phnum > bytes.len() {
        return Err(ElfError::ProgramHeadersOutsideFile);
    }
    (0..phnum)
        .map(|i| Ok(bytes.pread_with(phoff + i * phentsize, LE)?))
        .collect()
}

/// Sections only the Go toolchain writes (internal and external linking,
/// PIE or not).
const GO_SECTIONS: [&str; 4] = [
    ".go.buildinfo",
    ".gopclntab",
    ".data.rel.ro.gopclntab",
    ".note.go.buildid",
];

/// The first Go section of the file, if any. Section headers that lie
/// outside the file are ignored here (the rewriter does not use them).
fn go_section(bytes: &[u8], header: &Header) -> Option<&'static str> {
    let shoff = usize::try_from(header.e_shoff).ok()?;
    let shentsize = usize::from(header.e_shentsize);
    let shnum = usize::from(header.e_shnum);
    if shoff == 0 || shentsize < SIZEOF_SHDR {
        return None;
    }
    let section = |i: usize| -> Option<SectionHeader> {
        bytes
            .pread_with(shoff.checked_add(i.checked_mul(shentsize)?)?, LE)
            .ok()
    };
    let names = section(usize::from(header.e_shstrndx))?;
    let names = bytes.get(
        usize::try_from(names.sh_offset).ok()?
            ..usize::try_from(names.sh_offset.checked_add(names.sh_size)?).ok()?,
    )?;
    (0..shnum).filter_map(section).find_map(|s| {
        let name = names.get(usize::try_from(s.sh_name).ok()?..)?;
        let name = &name[..name.iter().position(|&b| b == 0)?];
        GO_SECTIONS.into_iter().find(|g| g.as_bytes() == name)
    })
}

/// Whether `.dynamic` holds `DT_FLAGS_1` with `DF_1_PIE`: a position-
/// independent executable, not a library.
fn pie_flagged(bytes: &[u8], headers: &[ProgramHeader]) -> Result<bool, ElfError> {
    let Some(dynamic) = headers.iter().find(|h| h.p_type == PT_DYNAMIC) else {
        return Ok(false);
    };
    let start = dynamic.p_offset as usize;
    let end = start.saturating_add(dynamic.p_filesz as usize);
    if end > bytes.len() {
        return Err(ElfError::DynamicOutsideFile);
    }
    for at in (start..end.saturating_sub(SIZEOF_DYN - 1)).step_by(SIZEOF_DYN) {
        let entry: Dyn = bytes.pread_with(at, LE)?;
        match entry.d_tag {
            DT_NULL => break,
            DT_FLAGS_1 if entry.d_val & DF_1_PIE != 0 => return Ok(true),
            _ => {}
        }
    }
    Ok(false)
}

/// Finds `DT_FINI` in `.dynamic`, or a spare `DT_NULL` slot that can become
/// one (`None` when neither exists).
fn find_fini(
    bytes: &[u8],
    headers: &[ProgramHeader],
) -> Result<Option<(usize, Option<u64>)>, ElfError> {
    let Some(dynamic) = headers.iter().find(|h| h.p_type == PT_DYNAMIC) else {
        return Ok(None);
    };
    let start = dynamic.p_offset as usize;
    let end = start + dynamic.p_filesz as usize;
    if end > bytes.len() {
        return Err(ElfError::DynamicOutsideFile);
    }
    let mut first_null = None;
    for at in (start..end + 1 - SIZEOF_DYN).step_by(SIZEOF_DYN) {
        let entry: Dyn = bytes.pread_with(at, LE)?;
        if entry.d_tag == DT_FINI {
            return Ok(Some((at, Some(entry.d_val))));
        }
        if entry.d_tag == DT_NULL {
            match first_null {
                None => first_null = Some(at),
                // A second DT_NULL: the first one is spare.
                Some(spare) => return Ok(Some((spare, None))),
            }
        }
    }
    Ok(None)
}

/// Rounds `value` up to a multiple of `align` (a power of two).
pub(crate) fn align_up(value: u64, align: u64) -> u64 {
    (value + align - 1) & !(align - 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rejects_what_it_cannot_edit() {
        assert!(ElfEditor::new(b"#!/bin/sh\n", 64).is_err());
        let class32: Vec<u8> = vec![0x7f, b'E', b'L', b'F', 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0]
            .into_iter()
            .chain(std::iter::repeat_n(0, 64))
            .collect();
        let err = ElfEditor::new(&class32, 64).unwrap_err();
        assert!(err.to_string().contains("64-bit"), "{err}");
    }

    #[test]
    fn reads_the_program_headers_goblins_parser_reads() {
        let bytes = std::fs::read("/proc/self/exe").unwrap();
        let parsed = goblin::elf::Elf::parse(&bytes).unwrap();
        let editor = ElfEditor::new(&bytes, 64).unwrap();
        assert_eq!(editor.headers.len(), parsed.program_headers.len());
        for (ours, theirs) in editor.headers.iter().zip(&parsed.program_headers) {
            assert_eq!(ours.p_type, theirs.p_type);
            assert_eq!(ours.p_flags, theirs.p_flags);
            assert_eq!(ours.p_offset, theirs.p_offset);
            assert_eq!(ours.p_vaddr, theirs.p_vaddr);
            assert_eq!(ours.p_filesz, theirs.p_filesz);
            assert_eq!(ours.p_memsz, theirs.p_memsz);
        }
        assert_eq!(editor.entry, parsed.entry);
    }

    #[test]
    fn patches_applied_a_chunk_at_a_time_are_written_one_after_another() {
        let bytes = std::fs::read("/proc/self/exe").unwrap();
        let mut editor = ElfEditor::new(&bytes, 64).unwrap();
        // Overlapping ones (the later wins) and ones across chunk bounds.
        for (at, fill, len) in [
            (4094, 1, 5),
            (4096, 2, 2),
            (100, 3, 8),
            (104, 4, 8),
            (8191, 5, 2),
        ] {
            let from = editor.patched.len();
            editor.patched.extend(std::iter::repeat_n(fill, len));
            editor.patches.push((at, from..editor.patched.len()));
        }
        let mut one_by_one = bytes[..3 * 4096].to_vec();
        for (at, range) in &editor.patches {
            one_by_one[*at..at + range.len()].copy_from_slice(&editor.patched[range.clone()]);
        }
        let by_piece = PatchesByPiece::new(&editor.patches, 3 * 4096, 4096);
        let mut chunked = Vec::new();
        for from in (0..3 * 4096).step_by(4096) {
            let mut chunk = bytes[from..from + 4096].to_vec();
            editor.apply_patches(&mut chunk, from, by_piece.of(from / 4096));
            chunked.extend(chunk);
        }
        assert!(chunked == one_by_one, "the patched bytes differ");
        assert_eq!(&chunked[100..112], &[3, 3, 3, 3, 4, 4, 4, 4, 4, 4, 4, 4]);
    }

    #[test]
    fn patches_are_bucketed_by_the_pieces_they_touch_in_the_order_made() {
        let patches = [
            (10, 0..4),   // piece 0
            (98, 0..4),   // pieces 0 and 1 (100 bytes a piece)
            (150, 0..1),  // piece 1
            (5, 0..10),   // piece 0, after the first two
            (299, 0..20), // piece 2, its part past the input's end in none
            (400, 0..8),  // wholly past the end
        ];
        let by_piece = PatchesByPiece::new(&patches, 300, 100);
        assert_eq!(by_piece.of(0), [0, 1, 3]);
        assert_eq!(by_piece.of(1), [1, 2]);
        assert_eq!(by_piece.of(2), [4]);
        assert!(by_piece.of(3).is_empty());
        assert!(by_piece.any_in(2..4));
        assert!(!by_piece.any_in(3..8));
        let none = PatchesByPiece::new(&[], 300, 100);
        assert!(!none.any_in(0..3));
        assert!(none.of(1).is_empty());
    }

    /// A file output that counts the copies it made from a file.
    struct CountingCopies<'f>(super::super::output::FileOutput<'f>, usize);

    impl Output for CountingCopies<'_> {
        fn write_at(&mut self, offset: u64, bytes: &[u8]) {
            self.0.write_at(offset, bytes);
        }
        fn read_at(&mut self, offset: u64, bytes: &mut [u8]) {
            self.0.read_at(offset, bytes);
        }
        fn set_len(&mut self, len: u64) {
            self.0.set_len(len);
        }
        fn copy_from_file(&mut self, offset: u64, source: &File, at: u64, len: u64) -> bool {
            let copied = self.0.copy_from_file(offset, source, at, len);
            self.1 += usize::from(copied);
            copied
        }
    }

    #[test]
    fn the_input_copied_from_its_file_has_the_patches_written_over_it() {
        let input = File::open("/proc/self/exe").unwrap();
        let bytes = std::fs::read("/proc/self/exe").unwrap();
        assert!(
            bytes.len() > 4 * COPY_CHUNK,
            "a test executable has several chunks"
        );
        let mut editor = ElfEditor::new(&bytes, 64).unwrap();
        // Patches in the first chunk, across the second and third, and in
        // the last: the chunks between are copied.
        for (at, fill, len) in [
            (100, 1, 8),
            (2 * COPY_CHUNK - 3, 2, 6),
            (bytes.len() - 10, 3, 4),
        ] {
            let from = editor.patched.len();
            editor.patched.extend(std::iter::repeat_n(fill, len));
            editor.patches.push((at, from..editor.patched.len()));
        }
        let mut in_memory = Vec::new();
        editor.write_input(&mut in_memory, None, |_| {});
        let mut expected = bytes.clone();
        for (at, range) in &editor.patches {
            expected[*at..at + range.len()].copy_from_slice(&editor.patched[range.clone()]);
        }
        assert!(in_memory == expected, "the patched bytes differ");

        // Beside the input: on the same file system, which the kernel can
        // copy within.
        let exe = std::env::current_exe().unwrap();
        let file = tempfile::tempfile_in(exe.parent().unwrap()).unwrap();
        let mut out = CountingCopies(super::super::output::FileOutput::new(&file), 0);
        let released = std::cell::RefCell::new(Vec::new());
        editor.write_input(&mut out, Some(&input), |range| {
            released.borrow_mut().push(range)
        });
        let copies = out.1;
        assert!(out.0.error().is_none());
        let mut written = Vec::new();
        std::io::Read::read_to_end(&mut &file, &mut written).unwrap();
        assert!(written == expected, "the copied and patched bytes differ");
        // The unpatched chunks between, in one copy; only the patched ones
        // were read here.
        assert_eq!(copies, 1);
        let last = (bytes.len() - 1) / COPY_CHUNK;
        let read: Vec<usize> = (released.borrow().iter())
            .map(|r| r.start / COPY_CHUNK)
            .collect();
        assert_eq!(read, [0, 1, 2, last]);
    }

    #[test]
    fn plans_state_and_segment_above_everything() {
        let bytes = std::fs::read("/proc/self/exe").unwrap();
        let editor = ElfEditor::new(&bytes, 256).unwrap();
        assert_eq!(editor.segment_va % PAGE, 0);
        assert!(editor.segment_va >= editor.state_va + 256);
        assert_eq!(editor.state_va % 64, 0);
    }
}
