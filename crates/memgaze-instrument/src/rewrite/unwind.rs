//! Unwind information for relocated functions.
//!
//! Copies keep real `call`s, so return addresses point into the new
//! segment; for panics, C++ exceptions and backtraces to work through them,
//! every copy gets its own FDE (the original's CFI with its locations
//! remapped, pointing at the original CIE, so personality and encodings are
//! shared) and, when the original has one, its own LSDA (call-site table
//! remapped, action and type tables copied with PC-relative type entries
//! re-encoded). A new `.eh_frame_hdr` listing the original and the new FDEs
//! replaces the old one through `PT_GNU_EH_FRAME`, which is how the unwinder
//! (`dl_iterate_phdr`) finds FDEs.
//!
//! Entries are walked by hand over the section bytes: the translation
//! needs the exact byte layout (entry offsets, augmentation data, raw CFI
//! instructions), which gimli's `UnwindSection` reader hides, and writing
//! with `gimli::write` would re-encode every instruction of the original
//! CFI instead of copying it. The pieces gimli does expose are used: its
//! `DW_CFA_*`/`DW_EH_PE_*` constants and its LEB128 reader and writer.

use crate::error::UnwindError;
use gimli::leb128::write::Leb128;
use gimli::{DwCfa, DwEhPe, EndianSlice, LittleEndian, constants as dw};
use std::collections::BTreeSet;

/// The mask of a CFA opcode's "primary" part: `DW_CFA_advance_loc`,
/// `DW_CFA_offset` and `DW_CFA_restore` carry their operand in the low six
/// bits (DWARF 5, 6.4.2; gimli keeps its own mask private).
const CFA_PRIMARY_MASK: u8 = 0xc0;

/// A CIE, as far as FDE writing needs it.
#[derive(Clone, Debug)]
pub(crate) struct Cie {
    /// Address of the CIE's length field.
    pub addr: u64,
    /// `code_alignment_factor`.
    pub(crate) code_align: u64,
    /// Whether the augmentation string starts with `z`.
    pub(crate) has_augmentation_data: bool,
    /// Encoding of FDE `pc_begin`/`pc_range` (`R`), absptr by default.
    pub(crate) fde_encoding: DwEhPe,
    /// Encoding of the FDE's LSDA pointer (`L`), if any.
    pub(crate) lsda_encoding: Option<DwEhPe>,
}

/// An FDE of the original `.eh_frame`.
#[derive(Clone, Debug)]
pub(crate) struct Fde {
    /// Address of the FDE's length field.
    pub addr: u64,
    /// First covered address.
    pub(crate) pc_begin: u64,
    /// One past the last covered address.
    pub(crate) pc_end: u64,
    /// Index of its CIE in `EhFrame::cies`.
    pub(crate) cie: usize,
    /// Address of its LSDA.
    pub(crate) lsda: Option<u64>,
    /// Its call frame instructions.
    pub instructions: Vec<u8>,
}

/// The parsed `.eh_frame` section.
#[derive(Clone, Debug, Default)]
pub(crate) struct EhFrame {
    /// Section address.
    pub addr: u64,
    /// Every CIE.
    pub(crate) cies: Vec<Cie>,
    /// Every FDE, sorted by `pc_begin`.
    pub(crate) fdes: Vec<Fde>,
}

/// A little-endian cursor over a byte slice at a known address.
struct Cursor<'a> {
    data: &'a [u8],
    pos: usize,
    base: u64,
}

impl<'a> Cursor<'a> {
    fn new(data: &'a [u8], pos: usize, base: u64) -> Self {
        Cursor { data, pos, base }
    }
    fn addr(&self) -> u64 {
        self.base + self.pos as u64
    }
    fn bytes(&mut self, n: usize) -> Result<&'a [u8], UnwindError> {
        let Some(out) = self.data.get(self.pos..self.pos + n) else {
            return Err(UnwindError::EndsEarly { at: self.addr() });
        };
        self.pos += n;
        Ok(out)
    }
    /// Reads a LEB128 value with gimli's `read` over the rest of the data.
    fn leb<T>(
        &mut self,
        read: impl FnOnce(&mut EndianSlice<'a, LittleEndian>) -> gimli::Result<T>,
    ) -> Result<T, UnwindError> {
        let at = self.addr();
        let rest = self.data.get(self.pos..).unwrap_or_default();
        let mut reader = EndianSlice::new(rest, LittleEndian);
        match read(&mut reader) {
            Ok(value) => {
                self.pos += rest.len() - reader.len();
                Ok(value)
            }
            // Same message (and address: the first byte that is missing)
            // as every other read past the end.
            Err(gimli::Error::UnexpectedEof(_)) => Err(UnwindError::EndsEarly {
                at: self.base + self.pos.max(self.data.len()) as u64,
            }),
            Err(error) => Err(UnwindError::MalformedLeb128 { at, error }),
        }
    }
    fn u8(&mut self) -> Result<u8, UnwindError> {
        Ok(self.bytes(1)?[0])
    }
    fn u16(&mut self) -> Result<u16, UnwindError> {
        Ok(u16::from_le_bytes(self.bytes(2)?.try_into().unwrap()))
    }
    fn u32(&mut self) -> Result<u32, UnwindError> {
        Ok(u32::from_le_bytes(self.bytes(4)?.try_into().unwrap()))
    }
    fn u64(&mut self) -> Result<u64, UnwindError> {
        Ok(u64::from_le_bytes(self.bytes(8)?.try_into().unwrap()))
    }
    fn uleb(&mut self) -> Result<u64, UnwindError> {
        self.leb(gimli::leb128::read::unsigned)
    }
    fn sleb(&mut self) -> Result<i64, UnwindError> {
        self.leb(gimli::leb128::read::signed)
    }
    fn cstr(&mut self) -> Result<&'a [u8], UnwindError> {
        let start = self.pos;
        while self.u8()? != 0 {}
        Ok(&self.data[start..self.pos - 1])
    }
    /// Reads a pointer with a `DW_EH_PE_*` encoding (absolute and PC-relative
    /// applications only).
    fn pointer(&mut self, encoding: DwEhPe) -> Result<u64, UnwindError> {
        let at = self.addr();
        let raw = match encoding.format() {
            dw::DW_EH_PE_absptr | dw::DW_EH_PE_udata8 | dw::DW_EH_PE_sdata8 => self.u64()?,
            dw::DW_EH_PE_uleb128 => self.uleb()?,
            dw::DW_EH_PE_udata2 => u64::from(self.u16()?),
            dw::DW_EH_PE_udata4 => u64::from(self.u32()?),
            dw::DW_EH_PE_sleb128 => self.sleb()? as u64,
            dw::DW_EH_PE_sdata2 => self.u16()? as i16 as i64 as u64,
            dw::DW_EH_PE_sdata4 => self.u32()? as i32 as i64 as u64,
            other => return Err(UnwindError::PointerFormat(other.0)),
        };
        match encoding.application() {
            dw::DW_EH_PE_absptr => Ok(raw),
            dw::DW_EH_PE_pcrel => Ok(at.wrapping_add(raw)),
            other => Err(UnwindError::PointerApplication(other.0)),
        }
    }
}

/// Appends the minimal ULEB128 encoding of `value` (what compilers write,
/// see `translate_lsda`).
fn write_uleb(out: &mut Vec<u8>, value: u64) {
    out.extend_from_slice(Leb128::unsigned(value).bytes());
}

/// `encoding` without its `DW_EH_PE_indirect` bit: the pointer read or
/// written is the address of the value, which is all the rewriter needs.
fn direct(encoding: DwEhPe) -> DwEhPe {
    DwEhPe(encoding.0 & !dw::DW_EH_PE_indirect.0)
}

/// Appends `value` encoded with `encoding`, the encoded field starting at
/// address `at`.
fn write_pointer(
    out: &mut Vec<u8>,
    encoding: DwEhPe,
    value: u64,
    at: u64,
) -> Result<(), UnwindError> {
    let raw = match encoding.application() {
        dw::DW_EH_PE_absptr => value,
        dw::DW_EH_PE_pcrel => value.wrapping_sub(at),
        other => return Err(UnwindError::PointerApplication(other.0)),
    };
    match encoding.format() {
        dw::DW_EH_PE_absptr | dw::DW_EH_PE_udata8 | dw::DW_EH_PE_sdata8 => {
            out.extend_from_slice(&raw.to_le_bytes())
        }
        dw::DW_EH_PE_udata4 => out.extend_from_slice(&u32::try_from(raw)?.to_le_bytes()),
        dw::DW_EH_PE_sdata4 => out.extend_from_slice(&i32::try_from(raw as i64)?.to_le_bytes()),
        other => return Err(UnwindError::NewFdePointerFormat(other.0)),
    }
    Ok(())
}

impl EhFrame {
    /// Parses `.eh_frame` contents `data` loaded at `addr`.
    pub fn parse(data: &[u8], addr: u64) -> Result<EhFrame, UnwindError> {
        let mut frame = EhFrame {
            addr,
            ..EhFrame::default()
        };
        let mut cie_at: foldhash::HashMap<u64, usize> = Default::default();
        let mut pos = 0usize;
        while pos + 4 <= data.len() {
            let mut c = Cursor::new(data, pos, addr);
            let mut length = u64::from(c.u32()?);
            if length == 0 {
                break;
            }
            if length == 0xffff_ffff {
                length = c.u64()?;
            }
            let body = c.pos;
            let end = body + length as usize;
            if end > data.len() {
                return Err(UnwindError::EntryPastSection(addr + pos as u64));
            }
            let id_addr = c.addr();
            let id = c.u32()?;
            if id == 0 {
                let cie = parse_cie(
                    &mut Cursor::new(&data[..end], c.pos, addr),
                    addr + pos as u64,
                )?;
                cie_at.insert(cie.addr, frame.cies.len());
                frame.cies.push(cie);
            } else {
                let cie_addr = id_addr - u64::from(id);
                let Some(&cie_index) = cie_at.get(&cie_addr) else {
                    return Err(UnwindError::UnknownCie(addr + pos as u64));
                };
                let cie = &frame.cies[cie_index];
                let mut f = Cursor::new(&data[..end], c.pos, addr);
                let pc_begin = f.pointer(cie.fde_encoding)?;
                let pc_range = f.pointer(cie.fde_encoding.format())?;
                let mut lsda = None;
                if cie.has_augmentation_data {
                    let len = f.uleb()? as usize;
                    let aug_end = f.pos + len;
                    if let Some(enc) = cie.lsda_encoding
                        && len > 0
                    {
                        let value = f.pointer(enc)?;
                        if value != 0 {
                            lsda = Some(value);
                        }
                    }
                    f.pos = aug_end;
                }
                if pc_range > 0 {
                    frame.fdes.push(Fde {
                        addr: addr + pos as u64,
                        pc_begin,
                        pc_end: pc_begin.wrapping_add(pc_range),
                        cie: cie_index,
                        lsda,
                        instructions: data[f.pos..end].to_vec(),
                    });
                }
            }
            pos = end;
        }
        frame.fdes.sort_by_key(|f| f.pc_begin);
        Ok(frame)
    }

    /// The FDE whose range is exactly `[start, end)`, or the FDEs inside it.
    pub(crate) fn fdes_within(&self, start: u64, end: u64) -> impl Iterator<Item = &Fde> {
        let first = self.fdes.partition_point(|f| f.pc_begin < start);
        self.fdes[first..]
            .iter()
            .take_while(move |f| f.pc_begin < end)
    }

    /// Whether some FDE covers `addr`.
    pub fn covers(&self, addr: u64) -> bool {
        let i = self.fdes.partition_point(|f| f.pc_begin <= addr);
        i > 0 && self.fdes[i - 1].pc_end > addr
    }
}

fn parse_cie(c: &mut Cursor<'_>, addr: u64) -> Result<Cie, UnwindError> {
    let version = c.u8()?;
    let augmentation = c.cstr()?.to_vec();
    if augmentation.starts_with(b"eh") {
        c.u64()?;
    }
    let code_align = c.uleb()?;
    c.sleb()?;
    if version == 1 {
        c.u8()?;
    } else {
        c.uleb()?;
    }
    let mut cie = Cie {
        addr,
        code_align,
        has_augmentation_data: augmentation.first() == Some(&b'z'),
        fde_encoding: dw::DW_EH_PE_absptr,
        lsda_encoding: None,
    };
    if cie.has_augmentation_data {
        let len = c.uleb()? as usize;
        let end = c.pos + len;
        for &ch in &augmentation[1..] {
            match ch {
                b'L' => cie.lsda_encoding = Some(DwEhPe(c.u8()?)),
                b'R' => cie.fde_encoding = DwEhPe(c.u8()?),
                b'P' => {
                    let enc = DwEhPe(c.u8()?);
                    c.pointer(direct(enc))?;
                }
                b'S' | b'B' | b'G' => {}
                _ => break,
            }
        }
        c.pos = end;
    }
    Ok(cie)
}

/// Maps original code addresses (instruction boundaries of a relocated
/// function, and its end) to their addresses in the copy.
pub(crate) trait AddressMap {
    /// The copy's address for original `addr`, if `addr` is an instruction
    /// boundary of the relocated function (or its end).
    fn map(&self, addr: u64) -> Option<u64>;
}

impl<F: Fn(u64) -> Option<u64>> AddressMap for F {
    fn map(&self, addr: u64) -> Option<u64> {
        self(addr)
    }
}

/// Translates CFI `instructions` of an FDE starting at `pc_begin` for a
/// copy starting at `map(pc_begin)`, into `out` (cleared first), a buffer
/// the caller reuses for every FDE.
pub(crate) fn translate_cfi(
    instructions: &[u8],
    cie: &Cie,
    pc_begin: u64,
    map: &dyn AddressMap,
    out: &mut Vec<u8>,
) -> Result<(), UnwindError> {
    out.clear();
    if cie.code_align != 1 {
        return Err(UnwindError::CodeAlignment(cie.code_align));
    }
    let new_begin = map
        .map(pc_begin)
        .ok_or(UnwindError::FdeStartNotMapped(pc_begin))?;
    out.reserve(instructions.len() + 16);
    let mut c = Cursor::new(instructions, 0, 0);
    let mut loc = pc_begin;
    let mut new_loc = new_begin;
    let advance = |out: &mut Vec<u8>, loc: u64, new_loc: &mut u64| -> Result<(), UnwindError> {
        let Some(target) = map.map(loc) else {
            return Err(UnwindError::CfiRowNotOnBoundary(loc));
        };
        if target < *new_loc {
            return Err(UnwindError::CfiRowsOutOfOrder(loc));
        }
        // The shortest advance that fits, as the compiler chose for the
        // original.
        let delta = target - *new_loc;
        match delta {
            0 => {}
            1..=0x3f => out.push(dw::DW_CFA_advance_loc.0 | delta as u8),
            0x40..=0xff => out.extend_from_slice(&[dw::DW_CFA_advance_loc1.0, delta as u8]),
            0x100..=0xffff => {
                out.push(dw::DW_CFA_advance_loc2.0);
                out.extend_from_slice(&(delta as u16).to_le_bytes());
            }
            _ => {
                out.push(dw::DW_CFA_advance_loc4.0);
                out.extend_from_slice(&u32::try_from(delta)?.to_le_bytes());
            }
        }
        *new_loc = target;
        Ok(())
    };
    while c.pos < instructions.len() {
        let start = c.pos;
        let op = c.u8()?;
        // Advances are re-encoded for the copy; every other instruction is
        // skipped over by its operands and copied as it is.
        match DwCfa(op & CFA_PRIMARY_MASK) {
            dw::DW_CFA_advance_loc => {
                loc += u64::from(op & !CFA_PRIMARY_MASK);
                advance(out, loc, &mut new_loc)?;
                continue;
            }
            dw::DW_CFA_offset => {
                c.uleb()?;
            }
            dw::DW_CFA_restore => {}
            _ => match DwCfa(op) {
                dw::DW_CFA_nop | dw::DW_CFA_remember_state | dw::DW_CFA_restore_state => {}
                dw::DW_CFA_set_loc => {
                    loc = c.pointer(cie.fde_encoding.format())?;
                    advance(out, loc, &mut new_loc)?;
                    continue;
                }
                dw::DW_CFA_advance_loc1 => {
                    loc += u64::from(c.u8()?);
                    advance(out, loc, &mut new_loc)?;
                    continue;
                }
                dw::DW_CFA_advance_loc2 => {
                    loc += u64::from(c.u16()?);
                    advance(out, loc, &mut new_loc)?;
                    continue;
                }
                dw::DW_CFA_advance_loc4 => {
                    loc += u64::from(c.u32()?);
                    advance(out, loc, &mut new_loc)?;
                    continue;
                }
                dw::DW_CFA_restore_extended
                | dw::DW_CFA_undefined
                | dw::DW_CFA_same_value
                | dw::DW_CFA_def_cfa_register
                | dw::DW_CFA_def_cfa_offset
                | dw::DW_CFA_GNU_args_size => {
                    c.uleb()?;
                }
                dw::DW_CFA_offset_extended
                | dw::DW_CFA_register
                | dw::DW_CFA_def_cfa
                | dw::DW_CFA_val_offset
                | dw::DW_CFA_GNU_negative_offset_extended => {
                    c.uleb()?;
                    c.uleb()?;
                }
                dw::DW_CFA_offset_extended_sf
                | dw::DW_CFA_def_cfa_sf
                | dw::DW_CFA_val_offset_sf => {
                    c.uleb()?;
                    c.sleb()?;
                }
                dw::DW_CFA_def_cfa_offset_sf => {
                    c.sleb()?;
                }
                dw::DW_CFA_def_cfa_expression => {
                    let len = c.uleb()? as usize;
                    c.bytes(len)?;
                }
                dw::DW_CFA_expression | dw::DW_CFA_val_expression => {
                    c.uleb()?;
                    let len = c.uleb()? as usize;
                    c.bytes(len)?;
                }
                other => return Err(UnwindError::CfiOpcode(other.0)),
            },
        }
        out.extend_from_slice(&instructions[start..c.pos]);
    }
    Ok(())
}

/// An LSDA (`.gcc_except_table` entry) rewritten for a copy.
#[derive(Clone, Debug)]
pub(crate) struct Lsda {
    /// The bytes, valid only at the address they were built for.
    pub bytes: Vec<u8>,
}

/// Rewrites the LSDA at `lsda` (read through `read`, bounded by `limit`,
/// the address where the next LSDA or the section begins) for the copy of
/// the function starting at `func_start`, placing it at `new_addr`.
/// Call-site ranges and landing pads go through `map`.
pub(crate) fn translate_lsda(
    read: &dyn Fn(u64, usize) -> Option<Vec<u8>>,
    lsda: u64,
    limit: u64,
    func_start: u64,
    pie: bool,
    map: &dyn AddressMap,
    new_addr: u64,
) -> Result<Lsda, UnwindError> {
    let Some(data) = read(lsda, (limit - lsda) as usize) else {
        return Err(UnwindError::LsdaNotFileBacked(lsda));
    };
    let mut c = Cursor::new(&data, 0, lsda);
    let lpstart_enc = DwEhPe(c.u8()?);
    if lpstart_enc != dw::DW_EH_PE_omit {
        return Err(UnwindError::LandingPadBase);
    }
    let ttype_enc = DwEhPe(c.u8()?);
    let ttype_base = if ttype_enc != dw::DW_EH_PE_omit {
        let off = c.uleb()?;
        Some(c.pos as u64 + off)
    } else {
        None
    };
    let cs_enc = DwEhPe(c.u8()?);
    let cs_len = c.uleb()? as usize;
    let cs_start = c.pos;
    let cs_end = cs_start + cs_len;
    let new_start = map
        .map(func_start)
        .ok_or(UnwindError::FunctionStartNotMapped)?;
    // The new call-site table.
    let mut sites = Vec::new();
    let mut actions = BTreeSet::new();
    while c.pos < cs_end {
        let start = c.pointer(cs_enc.format())?;
        let len = c.pointer(cs_enc.format())?;
        let pad = c.pointer(cs_enc.format())?;
        let action = c.uleb()?;
        let (Some(a), Some(b)) = (
            map.map(func_start + start),
            map.map(func_start + start + len),
        ) else {
            return Err(UnwindError::CallSiteNotOnBoundaries {
                start: func_start + start,
                len,
            });
        };
        let new_pad = if pad == 0 {
            0
        } else {
            match map.map(func_start + pad) {
                Some(p) if p >= new_start => p - new_start,
                // A landing pad at offset 0 would read as "none".
                _ => return Err(UnwindError::LandingPadOutside(func_start + pad)),
            }
        };
        if new_pad == 0 && pad != 0 {
            return Err(UnwindError::LandingPadAtStart);
        }
        write_uleb(&mut sites, a - new_start);
        write_uleb(&mut sites, b - a);
        write_uleb(&mut sites, new_pad);
        write_uleb(&mut sites, action);
        if action > 0 {
            actions.insert(action);
        }
    }
    // Walk the action chains for the largest type index and the end of the
    // tables that follow the call sites.
    let mut tail_end = cs_end;
    let mut max_type = 0u64;
    let mut seen = BTreeSet::new();
    let mut spec_offsets = BTreeSet::new();
    for &first in &actions {
        let mut at = cs_end + first as usize - 1;
        while seen.insert(at) {
            let mut a = Cursor::new(&data, at, lsda);
            let filter = a.sleb()?;
            let next_at = a.pos;
            let next = a.sleb()?;
            tail_end = tail_end.max(a.pos);
            if filter > 0 {
                max_type = max_type.max(filter as u64);
            } else if filter < 0 {
                spec_offsets.insert((-filter - 1) as u64);
            }
            if next == 0 {
                break;
            }
            at = (next_at as i64 + next) as usize;
        }
    }
    let type_size: u64 = match ttype_enc.format() {
        dw::DW_EH_PE_absptr | dw::DW_EH_PE_udata8 | dw::DW_EH_PE_sdata8 => 8,
        dw::DW_EH_PE_udata2 | dw::DW_EH_PE_sdata2 => 2,
        dw::DW_EH_PE_udata4 | dw::DW_EH_PE_sdata4 => 4,
        _ if ttype_base.is_none() => 0,
        other => return Err(UnwindError::TypeTableFormat(other.0)),
    };
    if let Some(base) = ttype_base {
        tail_end = tail_end.max(base as usize);
        for &offset in &spec_offsets {
            let mut s = Cursor::new(&data, base as usize + offset as usize, lsda);
            loop {
                let index = s.uleb()?;
                if index == 0 {
                    break;
                }
                max_type = max_type.max(index);
            }
            tail_end = tail_end.max(s.pos);
        }
        if (base as usize) < cs_end || (max_type * type_size) > base {
            return Err(UnwindError::MalformedTypeTable);
        }
    } else if max_type > 0 || !spec_offsets.is_empty() {
        return Err(UnwindError::MissingTypeTable);
    }
    if tail_end > data.len() {
        return Err(UnwindError::LsdaPastSection(lsda));
    }

    // Assemble: header, call sites, verbatim action/type tables. Every
    // ULEB is minimal, as compilers write them: the personality routine
    // reads the header on each call, and padded fields would make the
    // instrumented program execute loads the original does not.
    let mut out = vec![dw::DW_EH_PE_omit.0, ttype_enc.0];
    let mut cs_len = Vec::new();
    write_uleb(&mut cs_len, sites.len() as u64);
    // The type-table offset counts from the end of its own field.
    let ttype_offset =
        ttype_base.map(|base| (1 + cs_len.len() + sites.len() + (base as usize - cs_end)) as u64);
    if let Some(offset) = ttype_offset {
        write_uleb(&mut out, offset);
    }
    out.push(dw::DW_EH_PE_uleb128.0);
    out.extend_from_slice(&cs_len);
    out.extend_from_slice(&sites);
    let new_cs_end = out.len();
    out.extend_from_slice(&data[cs_end..tail_end]);
    if let Some(base) = ttype_base {
        let new_base = new_cs_end + (base as usize - cs_end);
        for k in 1..=max_type {
            let old_pos = base as usize - (k * type_size) as usize;
            let new_pos = new_base - (k * type_size) as usize;
            let mut r = Cursor::new(&data, old_pos, lsda);
            let value = r.pointer(direct(ttype_enc))?;
            match ttype_enc.application() {
                dw::DW_EH_PE_pcrel => {
                    let mut enc = Vec::new();
                    write_pointer(
                        &mut enc,
                        direct(ttype_enc),
                        value,
                        new_addr + new_pos as u64,
                    )?;
                    out[new_pos..new_pos + enc.len()].copy_from_slice(&enc);
                }
                dw::DW_EH_PE_absptr if pie && value != 0 => {
                    return Err(UnwindError::TypeEntryNeedsRelocation);
                }
                _ => {}
            }
        }
    }
    Ok(Lsda { bytes: out })
}

/// The landing pads named by the LSDA at `lsda` of the function (FDE)
/// starting at `func_start`.
pub(crate) fn landing_pads(
    read: &dyn Fn(u64, usize) -> Option<Vec<u8>>,
    lsda: u64,
    limit: u64,
    func_start: u64,
) -> Result<Vec<u64>, UnwindError> {
    let Some(data) = read(lsda, (limit.saturating_sub(lsda)).min(1 << 20) as usize) else {
        return Err(UnwindError::LsdaNotFileBacked(lsda));
    };
    let mut c = Cursor::new(&data, 0, lsda);
    if DwEhPe(c.u8()?) != dw::DW_EH_PE_omit {
        return Err(UnwindError::LandingPadBase);
    }
    if DwEhPe(c.u8()?) != dw::DW_EH_PE_omit {
        c.uleb()?;
    }
    let cs_enc = DwEhPe(c.u8()?);
    let cs_end = c.uleb()? as usize + c.pos;
    let mut pads = Vec::new();
    while c.pos < cs_end {
        c.pointer(cs_enc.format())?;
        c.pointer(cs_enc.format())?;
        let pad = c.pointer(cs_enc.format())?;
        c.uleb()?;
        if pad != 0 {
            pads.push(func_start + pad);
        }
    }
    Ok(pads)
}

/// Appends to `out` an FDE for a copy, placed at `addr` (where the FDE's
/// first byte lands). Built in place, so that an FDE costs no allocation
/// of its own. On an error, `out` ends with part of the FDE.
pub(crate) fn build_fde(
    out: &mut Vec<u8>,
    cie: &Cie,
    addr: u64,
    pc_begin: u64,
    pc_len: u64,
    lsda: Option<u64>,
    instructions: &[u8],
) -> Result<(), UnwindError> {
    let start = out.len();
    // Length, CIE pointer, two pointers, augmentation length and LSDA
    // pointer (at most 8 bytes each), the instructions and the padding.
    out.reserve(4 + 4 + 8 + 8 + 1 + 8 + instructions.len() + 7);
    out.extend_from_slice(&[0; 4]);
    let cie_pointer = (addr + 4) - cie.addr;
    out.extend_from_slice(&u32::try_from(cie_pointer)?.to_le_bytes());
    let at = addr + (out.len() - start) as u64;
    write_pointer(out, cie.fde_encoding, pc_begin, at)?;
    write_pointer(out, cie.fde_encoding.format(), pc_len, 0)?;
    if cie.has_augmentation_data {
        match (cie.lsda_encoding, lsda) {
            (Some(enc), Some(lsda)) => {
                // The augmentation data is one pointer, at most 8 bytes:
                // its ULEB128 length is one byte, the length itself.
                let length_at = out.len();
                out.push(0);
                let at = addr + (out.len() - start) as u64;
                write_pointer(out, enc, lsda, at)?;
                out[length_at] = (out.len() - length_at - 1) as u8;
            }
            (_, None) => write_uleb(out, 0),
            (None, Some(_)) => return Err(UnwindError::NoLsdaEncoding),
        }
    } else if lsda.is_some() {
        return Err(UnwindError::NoAugmentationData);
    }
    out.extend_from_slice(instructions);
    while !(out.len() - start).is_multiple_of(8) {
        out.push(dw::DW_CFA_nop.0);
    }
    let length = (out.len() - start - 4) as u32;
    out[start..start + 4].copy_from_slice(&length.to_le_bytes());
    Ok(())
}

/// Builds an `.eh_frame_hdr` at `addr` for `entries` (`(pc_begin, fde
/// address)`), pointing at the `.eh_frame` section at `eh_frame`.
pub(crate) fn build_eh_frame_hdr(
    addr: u64,
    eh_frame: u64,
    entries: &mut [(u64, u64)],
) -> Result<Vec<u8>, UnwindError> {
    entries.sort_unstable();
    // Version 1; `eh_frame_ptr` PC-relative, the count as a plain u32 and
    // the search table relative to the header itself, as ld writes it and
    // as the unwinder's binary search expects.
    let mut out = vec![
        1u8,
        (dw::DW_EH_PE_pcrel | dw::DW_EH_PE_sdata4).0,
        dw::DW_EH_PE_udata4.0,
        (dw::DW_EH_PE_datarel | dw::DW_EH_PE_sdata4).0,
    ];
    out.extend_from_slice(&i32::try_from(eh_frame as i64 - (addr + 4) as i64)?.to_le_bytes());
    out.extend_from_slice(&u32::try_from(entries.len())?.to_le_bytes());
    for &(pc, fde) in entries.iter() {
        out.extend_from_slice(&i32::try_from(pc as i64 - addr as i64)?.to_le_bytes());
        out.extend_from_slice(&i32::try_from(fde as i64 - addr as i64)?.to_le_bytes());
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_lsda_whose_offsets_do_not_move_is_translated_byte_for_byte() {
        // lpstart omitted; type table udata4 at offset 12; call sites in
        // ULEB128 (4 bytes): [0, +4) lands at 8, action 1; action table
        // (filter 1, end); one type entry.
        let lsda = [
            0xff, 0x03, 0x0c, 0x01, 0x04, 0x00, 0x04, 0x08, 0x01, 0x01, 0x00, 0x34, 0x12, 0x00,
            0x00,
        ];
        let at = 0x5000u64;
        let read = |addr: u64, len: usize| {
            let from = usize::try_from(addr.checked_sub(at)?).ok()?;
            lsda.get(from..from + len).map(<[u8]>::to_vec)
        };
        let map = |a: u64| (0x100..=0x108).contains(&a).then_some(a + 0x8f00);
        let out = translate_lsda(
            &read,
            at,
            at + lsda.len() as u64,
            0x100,
            false,
            &map,
            0x7000,
        )
        .unwrap();
        // Minimal ULEBs as the compiler wrote them: the personality routine
        // reads exactly the bytes it reads in the original.
        assert_eq!(out.bytes, lsda);
        // A call site that moves gets longer offsets, and the type-table
        // offset follows.
        let far = |a: u64| match a {
            0x100 => Some(0x9000),
            0x104 => Some(0x9000 + 200),
            0x108 => Some(0x9000 + 300),
            _ => None,
        };
        let out = translate_lsda(
            &read,
            at,
            at + lsda.len() as u64,
            0x100,
            false,
            &far,
            0x7000,
        )
        .unwrap();
        assert_eq!(
            out.bytes,
            [
                0xff, 0x03, 0x0e, 0x01, 0x06, 0x00, 0xc8, 0x01, 0xac, 0x02, 0x01, 0x01, 0x00, 0x34,
                0x12, 0x00, 0x00
            ]
        );
    }

    #[test]
    fn leb128_round_trips_and_a_cut_value_names_its_address() {
        // The DWARF 5 specification's examples (7.6), and an over-long one.
        let data = [0xe5, 0x8e, 0x26, 0xc0, 0xbb, 0x78, 0x80];
        let mut c = Cursor::new(&data, 0, 0x1000);
        assert_eq!(c.uleb().unwrap(), 624_485);
        assert_eq!(c.sleb().unwrap(), -123_456);
        let err = c.uleb().unwrap_err().to_string();
        assert_eq!(err, "unwind data ends early at 0x1007");
        let mut out = Vec::new();
        write_uleb(&mut out, 624_485);
        assert_eq!(out, data[..3]);
        let too_long = [0xff; 11];
        assert!(Cursor::new(&too_long, 0, 0).uleb().is_err());
    }

    #[test]
    fn cfi_advances_are_remapped() {
        let cie = Cie {
            addr: 0,
            code_align: 1,
            has_augmentation_data: true,
            fde_encoding: dw::DW_EH_PE_pcrel | dw::DW_EH_PE_sdata4,
            lsda_encoding: None,
        };
        // advance 1; def_cfa_offset 16; offset r6 at cfa-16; advance 3; def_cfa_offset 8
        let cfi = [0x41, 0x0e, 0x10, 0x86, 0x02, 0x43, 0x0e, 0x08];
        let map = |a: u64| match a {
            0x100 => Some(0x9000),
            0x101 => Some(0x9010),
            0x104 => Some(0x9100),
            _ => None,
        };
        // A buffer used before is cleared first.
        let mut out = vec![0xaa; 3];
        translate_cfi(&cfi, &cie, 0x100, &map, &mut out).unwrap();
        assert_eq!(
            out,
            vec![0x50, 0x0e, 0x10, 0x86, 0x02, 0x02, 0xf0, 0x0e, 0x08]
        );
        let bad = |a: u64| if a == 0x100 { Some(0x9000) } else { None };
        assert!(translate_cfi(&cfi, &cie, 0x100, &bad, &mut out).is_err());
    }

    #[test]
    fn builds_an_fde_in_place_after_what_the_buffer_holds() {
        let cie = Cie {
            addr: 0x1000,
            code_align: 1,
            has_augmentation_data: true,
            fde_encoding: dw::DW_EH_PE_pcrel | dw::DW_EH_PE_sdata4,
            lsda_encoding: Some(dw::DW_EH_PE_pcrel | dw::DW_EH_PE_sdata4),
        };
        let cfi = [0x41, 0x0e, 0x10, 0x00];
        let with_lsda = [
            0x1c, 0, 0, 0, // length: 28 bytes follow
            0x04, 0x10, 0, 0, // CIE pointer: 0x2004 - 0x1000
            0xf8, 0x0f, 0, 0, // pc_begin: 0x3000 - 0x2008
            0x20, 0, 0, 0, // pc_range
            4, // augmentation data length
            0xef, 0x2f, 0, 0, // LSDA: 0x5000 - 0x2011
            0x41, 0x0e, 0x10, 0x00, // the CFI
            0, 0, 0, 0, 0, 0, 0, // DW_CFA_nop to a multiple of 8
        ];
        let mut out = Vec::new();
        build_fde(&mut out, &cie, 0x2000, 0x3000, 0x20, Some(0x5000), &cfi).unwrap();
        assert_eq!(out, with_lsda);
        // Appended after other bytes, an FDE for the same address is the same.
        let mut tail = vec![0xaa; 5];
        build_fde(&mut tail, &cie, 0x2000, 0x3000, 0x20, Some(0x5000), &cfi).unwrap();
        assert_eq!(tail[..5], [0xaa; 5]);
        assert_eq!(tail[5..], with_lsda);
        // Without an LSDA: an empty augmentation, the rest shifted.
        let mut out = vec![0xaa; 3];
        build_fde(&mut out, &cie, 0x2000, 0x3000, 0x20, None, &cfi).unwrap();
        let without = [
            0x14, 0, 0, 0, 0x04, 0x10, 0, 0, 0xf8, 0x0f, 0, 0, 0x20, 0, 0, 0, 0, 0x41, 0x0e, 0x10,
            0x00, 0, 0, 0,
        ];
        assert_eq!(out[3..], without);
        let no_encoding = Cie {
            lsda_encoding: None,
            ..cie
        };
        assert!(matches!(
            build_fde(
                &mut out,
                &no_encoding,
                0x2000,
                0x3000,
                0x20,
                Some(0x5000),
                &cfi
            ),
            Err(UnwindError::NoLsdaEncoding)
        ));
    }

    #[test]
    fn parses_this_test_binary_and_finds_lsdas() {
        let exe = std::fs::read("/proc/self/exe").unwrap();
        let elf = goblin::elf::Elf::parse(&exe).unwrap();
        let sh = elf
            .section_headers
            .iter()
            .find(|s| elf.shdr_strtab.get_at(s.sh_name) == Some(".eh_frame"))
            .unwrap();
        let data = &exe[sh.sh_offset as usize..(sh.sh_offset + sh.sh_size) as usize];
        let frame = EhFrame::parse(data, sh.sh_addr).unwrap();
        assert!(frame.fdes.len() > 1000);
        assert!(frame.fdes.iter().any(|f| f.lsda.is_some()));
        assert!(
            frame
                .fdes
                .windows(2)
                .all(|w| w[0].pc_begin <= w[1].pc_begin)
        );
    }
}
