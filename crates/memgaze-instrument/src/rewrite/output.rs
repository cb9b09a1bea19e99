//! Where the instrumented executable is written: at file offsets, as each
//! part is ready (the copies a batch at a time while they are encoded, then
//! the input, the patches and the rest of the segment), so that the whole
//! output is never held in memory beside the rewriter's working data.

use std::fs::File;
use std::os::unix::fs::FileExt;

/// An executable being written by offset. Writes do not fail here: a file
/// keeps its first error ([`FileOutput::error`]) for the caller to report
/// once the rewriter is done.
pub trait Output {
    /// Writes `bytes` at `offset`; what lies between the end so far and
    /// `offset` reads as zeros.
    fn write_at(&mut self, offset: u64, bytes: &[u8]);
    /// Reads `bytes.len()` bytes at `offset`, all of them written before.
    fn read_at(&mut self, offset: u64, bytes: &mut [u8]);
    /// Cuts or extends the output to `len` bytes.
    fn set_len(&mut self, len: u64);
}

impl Output for Vec<u8> {
    fn write_at(&mut self, offset: u64, bytes: &[u8]) {
        let at = usize::try_from(offset).expect("an output in memory fits the address space");
        if self.len() < at + bytes.len() {
            self.resize(at + bytes.len(), 0);
        }
        self[at..at + bytes.len()].copy_from_slice(bytes);
    }

    fn read_at(&mut self, offset: u64, bytes: &mut [u8]) {
        let at = usize::try_from(offset).expect("an output in memory fits the address space");
        bytes.copy_from_slice(&self[at..at + bytes.len()]);
    }

    fn set_len(&mut self, len: u64) {
        self.resize(
            usize::try_from(len).expect("an output in memory fits the address space"),
            0,
        );
    }
}

/// An output written straight to a regular file (`pwrite`): the written
/// pages are the kernel's page cache, not the process's memory.
pub struct FileOutput<'f> {
    file: &'f File,
    error: Option<std::io::Error>,
}

impl<'f> FileOutput<'f> {
    /// Writes into `file`, which must be a regular file (positional writes).
    pub fn new(file: &'f File) -> FileOutput<'f> {
        FileOutput { file, error: None }
    }

    /// The first error of a write, read or resize, if any: everything after
    /// it was skipped.
    pub fn error(self) -> Option<std::io::Error> {
        self.error
    }

    fn keep(&mut self, result: std::io::Result<()>) {
        if let Err(e) = result {
            self.error.get_or_insert(e);
        }
    }
}

impl Output for FileOutput<'_> {
    fn write_at(&mut self, offset: u64, bytes: &[u8]) {
        if self.error.is_none() {
            let result = self.file.write_all_at(bytes, offset);
            self.keep(result);
        }
    }

    fn read_at(&mut self, offset: u64, bytes: &mut [u8]) {
        if self.error.is_none() {
            let result = self.file.read_exact_at(bytes, offset);
            self.keep(result);
        }
    }

    fn set_len(&mut self, len: u64) {
        if self.error.is_none() {
            let result = self.file.set_len(len);
            self.keep(result);
        }
    }
}

/// An output that keeps nothing: encoding a copy only to learn whether the
/// encoder accepts it.
pub(crate) struct Discard;

impl Output for Discard {
    fn write_at(&mut self, _offset: u64, _bytes: &[u8]) {}

    fn read_at(&mut self, _offset: u64, bytes: &mut [u8]) {
        bytes.fill(0);
    }

    fn set_len(&mut self, _len: u64) {}
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write_the_same(out: &mut dyn Output) {
        out.write_at(10, b"tail");
        out.write_at(0, b"head");
        out.write_at(2, b"AD");
        let mut read = [0u8; 4];
        out.read_at(2, &mut read);
        assert_eq!(&read, b"AD\0\0");
        out.set_len(12);
    }

    #[test]
    fn a_file_and_a_vector_get_the_same_bytes() {
        let mut bytes = Vec::new();
        write_the_same(&mut bytes);
        assert_eq!(bytes, b"heAD\0\0\0\0\0\0ta");

        let file = tempfile::tempfile().unwrap();
        let mut out = FileOutput::new(&file);
        write_the_same(&mut out);
        assert!(out.error().is_none());
        let mut written = Vec::new();
        std::io::Read::read_to_end(&mut &file, &mut written).unwrap();
        assert_eq!(written, bytes);
    }

    #[test]
    fn a_file_keeps_its_first_error() {
        let file = File::open("/proc/self/exe").unwrap();
        let mut out = FileOutput::new(&file);
        out.write_at(0, b"x");
        out.set_len(0);
        let error = out.error().expect("a file opened read-only refuses writes");
        assert_eq!(error.raw_os_error(), Some(libc::EBADF));
    }
}
