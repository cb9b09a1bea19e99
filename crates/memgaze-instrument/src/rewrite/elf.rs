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
//!   through [`ElfEditor`].
//!
//! Nothing is moved, so every address and offset of the original stays
//! valid; section headers are left as they were.

use anyhow::{Context, Result, bail};

const PT_LOAD: u32 = 1;
const PT_DYNAMIC: u32 = 2;
const PT_INTERP: u32 = 3;
const PT_NOTE: u32 = 4;
const PT_GNU_EH_FRAME: u32 = 0x6474_e550;
const PT_GNU_PROPERTY: u32 = 0x6474_e553;
const PF_X: u32 = 1;
const PF_W: u32 = 2;
const PF_R: u32 = 4;
const DT_NULL: i64 = 0;
const DT_FINI: i64 = 13;
const ET_EXEC: u16 = 2;
const ET_DYN: u16 = 3;
const EM_X86_64: u16 = 62;

/// Page size the new segment is aligned to.
pub const PAGE: u64 = 0x1000;

/// The first bytes of every segment cargo memgaze adds; finding them in a
/// `PT_LOAD` means the binary was already instrumented.
pub const SIGNATURE: &[u8; 32] = b"cargo-memgaze instrumented v1\0\0\0";

/// One program header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProgramHeader {
    /// `p_type`.
    pub kind: u32,
    /// `p_flags`.
    pub flags: u32,
    /// `p_offset`.
    pub offset: u64,
    /// `p_vaddr`.
    pub vaddr: u64,
    /// `p_paddr`.
    pub paddr: u64,
    /// `p_filesz`.
    pub filesz: u64,
    /// `p_memsz`.
    pub memsz: u64,
    /// `p_align`.
    pub align: u64,
}

impl ProgramHeader {
    fn read(bytes: &[u8]) -> ProgramHeader {
        let u32_at = |at: usize| u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap());
        let u64_at = |at: usize| u64::from_le_bytes(bytes[at..at + 8].try_into().unwrap());
        ProgramHeader {
            kind: u32_at(0),
            flags: u32_at(4),
            offset: u64_at(8),
            vaddr: u64_at(16),
            paddr: u64_at(24),
            filesz: u64_at(32),
            memsz: u64_at(40),
            align: u64_at(48),
        }
    }

    fn write(&self, out: &mut [u8]) {
        out[0..4].copy_from_slice(&self.kind.to_le_bytes());
        out[4..8].copy_from_slice(&self.flags.to_le_bytes());
        out[8..16].copy_from_slice(&self.offset.to_le_bytes());
        out[16..24].copy_from_slice(&self.vaddr.to_le_bytes());
        out[24..32].copy_from_slice(&self.paddr.to_le_bytes());
        out[32..40].copy_from_slice(&self.filesz.to_le_bytes());
        out[40..48].copy_from_slice(&self.memsz.to_le_bytes());
        out[48..56].copy_from_slice(&self.align.to_le_bytes());
    }

    /// Whether `vaddr` lies in the file-backed part of this segment.
    fn contains_file(&self, vaddr: u64, len: u64) -> bool {
        vaddr >= self.vaddr && vaddr + len <= self.vaddr + self.filesz
    }
}

/// An executable being edited.
#[derive(Clone, Debug)]
pub struct ElfEditor {
    bytes: Vec<u8>,
    phoff: usize,
    phentsize: usize,
    headers: Vec<ProgramHeader>,
    /// Whether the binary is position independent (`ET_DYN`).
    pub pie: bool,
    /// Original `e_entry`.
    pub entry: u64,
    /// File offset of `DT_FINI`'s value, and the original value if present.
    fini_slot: Option<(usize, Option<u64>)>,
    note_index: usize,
    rw_index: usize,
    /// Address of the reserved state (zero-initialised).
    pub state_va: u64,
    state_bytes: u64,
    /// Address and file offset of the new segment.
    pub segment_va: u64,
    segment_offset: u64,
}

impl ElfEditor {
    /// Parses `bytes` and plans the layout, reserving `state_bytes` of bss.
    ///
    /// Fails with a message fit for users on anything this rewriter does not
    /// handle: not x86-64 ELF, statically linked, already instrumented, no
    /// spare program header, no writable segment at the end.
    pub fn new(bytes: Vec<u8>, state_bytes: u64) -> Result<ElfEditor> {
        if bytes.len() < 64 || &bytes[..4] != b"\x7fELF" {
            bail!("not an ELF file");
        }
        if bytes[4] != 2 || bytes[5] != 1 {
            bail!("not a 64-bit little-endian ELF file");
        }
        let u16_at = |at: usize| u16::from_le_bytes(bytes[at..at + 2].try_into().unwrap());
        let u64_at = |at: usize| u64::from_le_bytes(bytes[at..at + 8].try_into().unwrap());
        if u16_at(18) != EM_X86_64 {
            bail!("not an x86-64 executable (e_machine {})", u16_at(18));
        }
        let e_type = u16_at(16);
        if e_type != ET_EXEC && e_type != ET_DYN {
            bail!("not an executable (ELF type {e_type})");
        }
        let entry = u64_at(24);
        let phoff = u64_at(32) as usize;
        let phentsize = u16_at(54) as usize;
        let phnum = u16_at(56) as usize;
        if phentsize < 56 || phoff + phentsize * phnum > bytes.len() {
            bail!("program header table lies outside the file");
        }
        let headers: Vec<ProgramHeader> = (0..phnum)
            .map(|i| ProgramHeader::read(&bytes[phoff + i * phentsize..]))
            .collect();
        if !headers.iter().any(|h| h.kind == PT_INTERP) {
            if e_type == ET_DYN && !headers.iter().any(|h| h.kind == PT_DYNAMIC) {
                bail!(
                    "statically linked (static-pie) executable: only dynamically linked programs can be instrumented"
                );
            }
            if e_type == ET_DYN {
                bail!(
                    "shared library or dynamic loader (no program interpreter): only executables can be instrumented"
                );
            }
            bail!(
                "statically linked executable: only dynamically linked programs can be instrumented"
            );
        }
        for h in headers.iter().filter(|h| h.kind == PT_LOAD) {
            let start = h.offset as usize;
            if h.filesz >= SIGNATURE.len() as u64
                && bytes.get(start..start + SIGNATURE.len()) == Some(&SIGNATURE[..])
            {
                bail!("already instrumented by cargo memgaze (instrument the original binary)");
            }
        }
        let loads: Vec<usize> = (0..phnum).filter(|&i| headers[i].kind == PT_LOAD).collect();
        let Some(&last_load) = loads.last() else {
            bail!("no loadable segment");
        };
        // The writable segment with the highest address gets the state.
        let rw_index = *loads
            .iter()
            .filter(|&&i| headers[i].flags & PF_W != 0)
            .max_by_key(|&&i| headers[i].vaddr)
            .context("no writable segment to hold the recorder state")?;
        let rw = headers[rw_index];
        let highest = loads
            .iter()
            .map(|&i| headers[i].vaddr + headers[i].memsz)
            .max()
            .unwrap();
        if rw.vaddr + rw.memsz != highest {
            bail!("the writable segment is not the last one in memory: unsupported layout");
        }
        let property = headers.iter().find(|h| h.kind == PT_GNU_PROPERTY).copied();
        let notes: Vec<usize> = (0..phnum).filter(|&i| headers[i].kind == PT_NOTE).collect();
        let note_index = notes
            .iter()
            .copied()
            .find(|&i| property.is_none_or(|p| p.offset != headers[i].offset))
            .or_else(|| notes.first().copied())
            .context("no PT_NOTE program header to turn into the new code segment")?;
        let _ = last_load;

        let state_va = align_up(rw.vaddr + rw.memsz, 64);
        let segment_va = align_up(state_va + state_bytes, PAGE);
        let segment_offset = align_up(bytes.len() as u64, PAGE);

        let fini_slot = find_fini(&bytes, &headers)?;
        Ok(ElfEditor {
            pie: e_type == ET_DYN,
            entry,
            fini_slot,
            note_index,
            rw_index,
            state_va,
            state_bytes,
            segment_va,
            segment_offset,
            bytes,
            phoff,
            phentsize,
            headers,
        })
    }

    /// The original `DT_FINI` function, if any.
    pub fn fini(&self) -> Option<u64> {
        self.fini_slot.and_then(|(_, value)| value)
    }

    /// Whether an exit hook can be installed through `DT_FINI`.
    pub fn can_hook_fini(&self) -> bool {
        self.fini_slot.is_some()
    }

    /// Whether the binary has a `PT_GNU_EH_FRAME` (how the unwinder finds
    /// FDEs; new FDEs are only useful with one).
    pub fn has_eh_frame_hdr(&self) -> bool {
        self.headers.iter().any(|h| h.kind == PT_GNU_EH_FRAME)
    }

    /// The original file contents.
    pub fn original(&self) -> &[u8] {
        &self.bytes
    }

    /// The file offset of `vaddr` if `len` bytes from it are file-backed.
    pub fn offset_of(&self, vaddr: u64, len: u64) -> Option<usize> {
        self.headers
            .iter()
            .filter(|h| h.kind == PT_LOAD)
            .find(|h| h.contains_file(vaddr, len))
            .map(|h| (vaddr - h.vaddr + h.offset) as usize)
    }

    /// Reads `len` original bytes at `vaddr`.
    pub fn read(&self, vaddr: u64, len: usize) -> Option<&[u8]> {
        let at = self.offset_of(vaddr, len as u64)?;
        self.bytes.get(at..at + len)
    }

    /// Overwrites original bytes at `vaddr` (an entry patch).
    pub fn patch(&mut self, vaddr: u64, data: &[u8]) -> Result<()> {
        let at = self
            .offset_of(vaddr, data.len() as u64)
            .with_context(|| format!("patch at {vaddr:#x} is outside the file's segments"))?;
        self.bytes[at..at + data.len()].copy_from_slice(data);
        Ok(())
    }

    /// Writes the final executable: `segment` (which must start with
    /// [`SIGNATURE`]) mapped at [`ElfEditor::segment_va`], the entry point
    /// and `DT_FINI` redirected, and `PT_GNU_EH_FRAME` moved when given
    /// (`(vaddr, size)` of a new `.eh_frame_hdr` inside the segment).
    pub fn finish(
        mut self,
        segment: &[u8],
        entry: Option<u64>,
        fini: Option<u64>,
        eh_frame_hdr: Option<(u64, u64)>,
    ) -> Result<Vec<u8>> {
        assert!(segment.starts_with(SIGNATURE));
        if let Some(entry) = entry {
            self.bytes[24..32].copy_from_slice(&entry.to_le_bytes());
        }
        if let Some(fini) = fini {
            let (at, original) = self
                .fini_slot
                .context("no DT_FINI entry or spare .dynamic slot for the exit hook")?;
            if original.is_none() {
                // A spare DT_NULL becomes DT_FINI.
                self.bytes[at - 8..at].copy_from_slice(&DT_FINI.to_le_bytes());
            }
            self.bytes[at..at + 8].copy_from_slice(&fini.to_le_bytes());
        }
        let mut headers = self.headers.clone();
        headers[self.rw_index].memsz =
            self.state_va + self.state_bytes - headers[self.rw_index].vaddr;
        if let Some((vaddr, size)) = eh_frame_hdr {
            let offset = self.segment_offset + (vaddr - self.segment_va);
            for h in headers.iter_mut().filter(|h| h.kind == PT_GNU_EH_FRAME) {
                h.offset = offset;
                h.vaddr = vaddr;
                h.paddr = vaddr;
                h.filesz = size;
                h.memsz = size;
            }
        }
        let new_load = ProgramHeader {
            kind: PT_LOAD,
            flags: PF_R | PF_X,
            offset: self.segment_offset,
            vaddr: self.segment_va,
            paddr: self.segment_va,
            filesz: segment.len() as u64,
            memsz: segment.len() as u64,
            align: PAGE,
        };
        headers.remove(self.note_index);
        let last_load = headers
            .iter()
            .rposition(|h| h.kind == PT_LOAD)
            .expect("a PT_LOAD exists");
        headers.insert(last_load + 1, new_load);
        for (i, h) in headers.iter().enumerate() {
            let at = self.phoff + i * self.phentsize;
            h.write(&mut self.bytes[at..at + 56]);
        }
        let mut out = self.bytes;
        out.resize(self.segment_offset as usize, 0);
        out.extend_from_slice(segment);
        Ok(out)
    }
}

/// Finds `DT_FINI` in `.dynamic`, or a spare `DT_NULL` slot that can become
/// one (`None` when neither exists).
fn find_fini(bytes: &[u8], headers: &[ProgramHeader]) -> Result<Option<(usize, Option<u64>)>> {
    let Some(dynamic) = headers.iter().find(|h| h.kind == PT_DYNAMIC) else {
        return Ok(None);
    };
    let start = dynamic.offset as usize;
    let end = start + dynamic.filesz as usize;
    if end > bytes.len() {
        bail!(".dynamic lies outside the file");
    }
    let mut first_null = None;
    for at in (start..end - 15).step_by(16) {
        let tag = i64::from_le_bytes(bytes[at..at + 8].try_into().unwrap());
        let value = u64::from_le_bytes(bytes[at + 8..at + 16].try_into().unwrap());
        if tag == DT_FINI {
            return Ok(Some((at + 8, Some(value))));
        }
        if tag == DT_NULL {
            match first_null {
                None => first_null = Some(at),
                // A second DT_NULL: the first one is spare.
                Some(spare) => return Ok(Some((spare + 8, None))),
            }
        }
    }
    Ok(None)
}

/// Rounds `value` up to a multiple of `align` (a power of two).
pub fn align_up(value: u64, align: u64) -> u64 {
    (value + align - 1) & !(align - 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rejects_what_it_cannot_edit() {
        assert!(ElfEditor::new(b"#!/bin/sh\n".to_vec(), 64).is_err());
        let err = ElfEditor::new(
            vec![0x7f, b'E', b'L', b'F', 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0]
                .into_iter()
                .chain(std::iter::repeat_n(0, 64))
                .collect(),
            64,
        )
        .unwrap_err();
        assert!(err.to_string().contains("64-bit"), "{err}");
    }

    #[test]
    fn plans_state_and_segment_above_everything() {
        let bytes = std::fs::read("/proc/self/exe").unwrap();
        let editor = ElfEditor::new(bytes, 256).unwrap();
        assert_eq!(editor.segment_va % PAGE, 0);
        assert!(editor.segment_va >= editor.state_va + 256);
        assert_eq!(editor.state_va % 64, 0);
    }
}
