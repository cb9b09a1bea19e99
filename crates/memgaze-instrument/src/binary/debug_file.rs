//! Separate debug files: the `.symtab` that `objcopy --only-keep-debug`
//! keeps and `strip` removes, as distributions ship it (Debian's `*-dbg`
//! packages, e.g. `libc6-dbg`).
//!
//! A stripped binary's debug file is found the way gdb finds it: by its
//! GNU build-id note at `/usr/lib/debug/.build-id/xx/rest.debug`, else by
//! the file name its `.gnu_debuglink` section names, beside the binary, in
//! the `.debug/` directory beside it, or under `/usr/lib/debug/` plus the
//! binary's directory; a file found by that name must have the CRC-32 the
//! section records.

use super::file_bytes::FileBytes;
use goblin::container::{Container, Ctx, Endian};
use goblin::elf::section_header::{SHT_SYMTAB, SectionHeader};
use goblin::elf::sym::Symtab;
use goblin::strtab::Strtab;
use std::path::{Path, PathBuf};

/// Where distributions install separate debug files.
const DEBUG_ROOT: &str = "/usr/lib/debug";

/// What a binary says about its separate debug file.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct DebugLink<'a> {
    /// The `NT_GNU_BUILD_ID` note's bytes.
    pub build_id: Option<&'a [u8]>,
    /// `.gnu_debuglink`: the debug file's name and its CRC-32.
    pub link: Option<(&'a str, u32)>,
}

/// The name and CRC-32 of a `.gnu_debuglink` section: the file name, a NUL,
/// padding to 4 bytes, the CRC as a 4-byte little-endian word.
pub(crate) fn parse_debuglink(bytes: &[u8]) -> Option<(&str, u32)> {
    let nul = bytes.iter().position(|&b| b == 0)?;
    let name = std::str::from_utf8(&bytes[..nul]).ok()?;
    let at = (nul + 1).next_multiple_of(4);
    let crc = bytes.get(at..at + 4)?;
    let safe = !name.is_empty() && !name.contains('/');
    safe.then(|| (name, u32::from_le_bytes(crc.try_into().unwrap_or([0; 4]))))
}

/// The separate debug file of the binary at `path`, if one is installed.
pub(crate) fn find(path: &Path, link: DebugLink<'_>) -> Option<PathBuf> {
    if let Some(id) = link.build_id.filter(|id| id.len() >= 2) {
        let rest: String = super::hex(&id[1..]);
        let candidate = Path::new(DEBUG_ROOT)
            .join(".build-id")
            .join(super::hex(&id[..1]))
            .join(format!("{rest}.debug"));
        if candidate.is_file() {
            return Some(candidate);
        }
    }
    let (name, crc) = link.link?;
    let dir = std::fs::canonicalize(path)
        .ok()
        .and_then(|p| p.parent().map(Path::to_path_buf))?;
    let own = std::fs::canonicalize(path).ok();
    [
        dir.join(name),
        dir.join(".debug").join(name),
        Path::new(DEBUG_ROOT)
            .join(dir.strip_prefix("/").unwrap_or(&dir))
            .join(name),
    ]
    .into_iter()
    // The binary's own file may carry the link's name.
    .filter(|c| std::fs::canonicalize(c).ok() != own)
    .find(|c| c.is_file() && crc32_of(c) == Some(crc))
}

/// The CRC-32 (the zlib one, as `.gnu_debuglink` records) of a file.
fn crc32_of(path: &Path) -> Option<u32> {
    use std::io::Read;
    let mut file = std::fs::File::open(path).ok()?;
    let mut hasher = crc32fast::Hasher::new();
    let mut block = vec![0; 1 << 20];
    loop {
        match file.read(&mut block) {
            Ok(0) => return Some(hasher.finalize()),
            Ok(n) => hasher.update(&block[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => return None,
        }
    }
}

/// The sized function symbols of the `.symtab` of the debug file at
/// `path`, read without the rest of the file (its program headers describe
/// sections it no longer holds). The error says why the file is unusable.
pub(crate) fn function_symbols(
    path: &Path,
) -> Result<Vec<super::functions::SymbolCandidate>, String> {
    let bytes = FileBytes::open(path).map_err(|e| e.to_string())?;
    let data = bytes.as_slice();
    super::elf::check_ident(data).map_err(|e| e.to_string())?;
    let header = goblin::elf::Elf::parse_header(data).map_err(|e| e.to_string())?;
    let ctx = Ctx::new(Container::Big, Endian::Little);
    let sections = SectionHeader::parse(
        data,
        header.e_shoff as usize,
        usize::from(header.e_shnum),
        ctx,
    )
    .map_err(|e| format!("unreadable section headers ({e})"))?;
    let symtab = sections
        .iter()
        .find(|s| s.sh_type == SHT_SYMTAB)
        .ok_or("no .symtab")?;
    let strings = sections
        .get(symtab.sh_link as usize)
        .ok_or("no string table for .symtab")?;
    let count = (symtab.sh_size / symtab.sh_entsize.max(1)) as usize;
    let table = Symtab::parse(data, symtab.sh_offset as usize, count, ctx)
        .map_err(|e| format!("unreadable .symtab ({e})"))?;
    let strtab = Strtab::parse(
        data,
        strings.sh_offset as usize,
        strings.sh_size as usize,
        0,
    )
    .map_err(|e| format!("unreadable .strtab ({e})"))?;
    Ok(super::function_symbols(&table, &strtab))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debuglink_is_name_then_aligned_crc() {
        let mut section = b"libx.so.debug\0\0\0".to_vec();
        section.extend_from_slice(&0x1234_5678u32.to_le_bytes());
        assert_eq!(
            parse_debuglink(&section),
            Some(("libx.so.debug", 0x1234_5678))
        );
        // A name ending on a 4-byte boundary still has its NUL, then 3 bytes
        // of padding.
        let mut section = b"abc\0".to_vec();
        section.extend_from_slice(&7u32.to_le_bytes());
        assert_eq!(parse_debuglink(&section), Some(("abc", 7)));
        // Truncated, no name, a path: none.
        assert_eq!(parse_debuglink(b"abc\0\x01\x02"), None);
        assert_eq!(parse_debuglink(b"\0\0\0\0\x01\x02\x03\x04"), None);
        assert_eq!(parse_debuglink(b"../x\0\0\0\0\x01\x02\x03\x04"), None);
    }
}
