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

/// A read-only private mapping of a whole file.
#[derive(Debug)]
pub(crate) struct Mapping {
    ptr: *mut libc::c_void,
    len: usize,
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
        // SAFETY: a fresh read-only private mapping of an open file; the
        // descriptor may be closed once mapped. A file truncated by
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
        Ok(FileBytes::Mapped(Mapping { ptr, len }))
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
    /// Owned bytes stay.
    pub(crate) fn release_resident(&self) {
        if let FileBytes::Mapped(m) = self {
            // SAFETY: discarding pages of a private read-only file mapping
            // never written: later reads see the file's bytes again.
            unsafe {
                libc::madvise(m.ptr, m.len, libc::MADV_DONTNEED);
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
