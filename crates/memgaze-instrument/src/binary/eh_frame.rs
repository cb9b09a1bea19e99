//! Function extents from `.eh_frame` call-frame information.
//!
//! Stripped executables keep `.eh_frame` because the unwinder needs it at run
//! time; each frame description entry (FDE) covers one function (or one
//! split-off part of it, such as gcc's `.cold` blocks) with its exact start
//! and length.

use foldhash::{HashMap, HashMapExt};
use gimli::{BaseAddresses, CieOrFde, EhFrame, LittleEndian, UnwindSection};

/// The address ranges of every FDE in an `.eh_frame` section.
#[derive(Debug, Default)]
pub(crate) struct FdeRanges {
    /// `(start, length)` of each FDE, in section order.
    pub ranges: Vec<(u64, u64)>,
    /// Whether parsing stopped early on malformed data (the ranges found
    /// before that point are kept).
    pub malformed: bool,
    /// FDEs of signal trampolines, left out of `ranges`.
    pub signal_trampolines: usize,
}

/// Reads every FDE of `data`, the contents of `.eh_frame` loaded at
/// `eh_frame_addr`. `text_addr` and `got_addr` resolve the rarely used
/// `DW_EH_PE_textrel`/`datarel` pointer encodings.
pub(crate) fn fde_ranges(
    data: &[u8],
    eh_frame_addr: u64,
    text_addr: u64,
    got_addr: u64,
) -> FdeRanges {
    let section = EhFrame::new(data, LittleEndian);
    let bases = BaseAddresses::default()
        .set_eh_frame(eh_frame_addr)
        .set_text(text_addr)
        .set_got(got_addr);
    let mut out = FdeRanges::default();
    let mut cies = HashMap::new();
    let mut entries = section.entries(&bases);
    loop {
        match entries.next() {
            Ok(None) => break,
            Ok(Some(CieOrFde::Cie(_))) => {}
            Ok(Some(CieOrFde::Fde(partial))) => {
                let fde = partial.parse(|section, bases, offset| {
                    if let Some(cie) = cies.get(&offset) {
                        return Ok(Clone::clone(cie));
                    }
                    let cie = section.cie_from_offset(bases, offset)?;
                    cies.insert(offset, cie.clone());
                    Ok(cie)
                });
                match fde {
                    // A signal trampoline (glibc's `__restore_rt`) is entered
                    // one byte past its FDE's start, which covers the `nop`
                    // before it for unwinders that look up `pc - 1`: an entry
                    // patch there would cut the code the kernel returns to.
                    // It has no loads; it stays out of every function.
                    Ok(fde) if fde.is_signal_trampoline() => out.signal_trampolines += 1,
                    Ok(fde) if fde.len() > 0 => out.ranges.push((fde.initial_address(), fde.len())),
                    Ok(_) => {}
                    Err(_) => out.malformed = true,
                }
            }
            Err(_) => {
                out.malformed = true;
                break;
            }
        }
    }
    out
}
