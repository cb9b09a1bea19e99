//! The bytes of an input file: mapped from the file (read-only, private)
//! when it can be, so that only the pages a stage reads are resident, and
//! those can be dropped again ([`FileBytes::release_resident`]); or owned.

use std::path::Path;

/// An input file's bytes.
#[derive(Debug)]
pub(crate) enum FileBytes {
    /// Read into memory (or handed over by a caller).
    Owned(Vec<u8>),
    /// Mapped from the file.
    Mapped(Mapping),
}

/// A read-only private mapping of a whole file, and the file (kept open so
/// that the kernel can copy its bytes without this process reading them).
#[derive(Debug)]
pub(crate) struct Mapping {
    ptr: *mut libc::c_void,
    len: usize,
    file: std::fs::File,
}

// SAFETY: the mapping is read-only and owned by one `Mapping`; shared
// references only read it.
unsafe impl Send for Mapping {}
// SAFETY: as above: nothing writes through it.
unsafe impl Sync for Mapping {}

impl FileBytes {
    /// Maps `path`, or reads it where it cannot be mapped (empty files,
    /// files that are not regular).
    pub(crate) fn open(path: &Path) -> std::io::Result<FileBytes> {
        use std::os::fd::AsRawFd;
        let file = std::fs::File::open(path)?;
        let metadata = file.metadata()?;
        let len = usize::try_from(metadata.len()).unwrap_or(0);
        if !metadata.is_file() || len == 0 {
            return std::fs::read(path).map(FileBytes::Owned);
        }
        // SAFETY: a fresh read-only private mapping of an open file. A
        // file truncated by
        // another process while mapped faults on access (SIGBUS), as with
        // any mapped input.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ,
                libc::MAP_PRIVATE,
                file.as_raw_fd(),
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return std::fs::read(path).map(FileBytes::Owned);
        }
        Ok(FileBytes::Mapped(Mapping { ptr, len, file }))
    }

    /// The file the bytes are mapped from (none when they are owned).
    pub(crate) fn mapped_file(&self) -> Option<&std::fs::File> {
        match self {
            FileBytes::Owned(_) => None,
            FileBytes::Mapped(m) => Some(&m.file),
        }
    }

    /// The bytes.
    pub(crate) fn as_slice(&self) -> &[u8] {
        match self {
            FileBytes::Owned(bytes) => bytes,
            // SAFETY: `ptr` maps `len` readable bytes until the mapping is
            // dropped, which borrowing `self` prevents.
            FileBytes::Mapped(m) => unsafe {
                std::slice::from_raw_parts(m.ptr.cast::<u8>(), m.len)
            },
        }
    }

    /// Drops the pages of a mapped file from memory; they are read from the
    /// page cache again when next touched (the file's bytes do not change).
    /// Owned bytes stay, and so do a small file's ([`super::SMALL_INPUT`]).
    pub(crate) fn release_resident(&self) {
        if let FileBytes::Mapped(m) = self
            && m.len > super::SMALL_INPUT
        {
            // SAFETY: discarding pages of a private read-only file mapping
            // never written: later reads see the file's bytes again.
            unsafe {
                libc::madvise(m.ptr, m.len, libc::MADV_DONTNEED);
            }
        }
    }
}

/// Drops the pages wholly inside the `len` bytes at `start` from memory
/// (`MADV_DONTNEED`), inside a region the caller may discard: a private
/// anonymous page reads as zeros afterwards, a private file page as the
/// file's bytes again.
fn drop_pages_of(start: *mut u8, len: usize) {
    // SAFETY: `sysconf` only reads a system value.
    let page = usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).unwrap_or(4096);
    let first = (start as usize).next_multiple_of(page);
    let end = (start as usize + len) / page * page;
    if end > first {
        // SAFETY: `first..end` lies inside the region the caller gave up;
        // discarding its pages changes no mapping, only their contents.
        unsafe {
            libc::madvise(first as *mut libc::c_void, end - first, libc::MADV_DONTNEED);
        }
    }
}

impl FileBytes {
    /// [`FileBytes::release_resident`] of the pages wholly inside `range`
    /// (out-of-range parts are ignored).
    pub(crate) fn release_resident_range(&self, range: std::ops::Range<usize>) {
        if let FileBytes::Mapped(m) = self
            && m.len > super::SMALL_INPUT
        {
            let end = range.end.min(m.len);
            if range.start < end {
                // The mapping is private and never written: its pages read
                // as the file's bytes again.
                drop_pages_of(
                    m.ptr.cast::<u8>().wrapping_add(range.start),
                    end - range.start,
                );
            }
        }
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: unmapping the region this `Mapping` mapped, once.
        unsafe {
            libc::munmap(self.ptr, self.len);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dropped_pages_read_as_zeros_and_partial_pages_are_kept() {
        let page = 4096;
        let mut bytes = vec![7u8; 7 * page];
        let at = bytes.as_ptr().align_offset(page);
        // From inside one page to inside the fourth after it: the three
        // pages between go.
        let dropped = &mut bytes[at + page / 2..at + 4 * page + 10];
        drop_pages_of(dropped.as_mut_ptr(), dropped.len());
        assert!(bytes[..at + page].iter().all(|&b| b == 7));
        assert!(bytes[at + page..at + 4 * page].iter().all(|&b| b == 0));
        assert!(bytes[at + 4 * page..].iter().all(|&b| b == 7));
    }

    #[test]
    fn a_released_range_of_a_mapped_file_reads_the_file_again() {
        // Past the size whose pages are kept, so that they are dropped.
        let len = super::super::SMALL_INPUT + 5 * 4096 + 123;
        let contents: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
        let file = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(file.path(), &contents).unwrap();
        let bytes = FileBytes::open(file.path()).unwrap();
        assert!(matches!(bytes, FileBytes::Mapped(_)));
        assert_eq!(bytes.as_slice(), contents.as_slice());
        bytes.release_resident_range(100..contents.len() + 4096);
        let (start, end) = (4096 * 3, 4096 * 2);
        bytes.release_resident_range(start..end);
        assert_eq!(bytes.as_slice(), contents.as_slice());
    }
}
