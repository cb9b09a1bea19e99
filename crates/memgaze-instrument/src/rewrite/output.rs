//! Where the instrumented executable is written: at file offsets, as each
//! part is ready (the copies a run at a time while they are encoded, then
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
    /// Writes the `len` bytes of `source` at `source_offset` at `offset`,
    /// as [`Output::write_at`] of them would, and returns true; or writes
    /// nothing and returns false where this output cannot copy from a
    /// file, for the caller to write the bytes itself.
    fn copy_from_file(&mut self, offset: u64, source: &File, source_offset: u64, len: u64) -> bool {
        let _ = (offset, source, source_offset, len);
        false
    }
    /// [`Output::write_at`] of all of `bytes`, which the output may go on
    /// writing after it returns (ordered before anything done to it
    /// next); gives back a buffer for the caller to reuse: `bytes` itself,
    /// or one handed over earlier whose write is done.
    fn write_owned(&mut self, offset: u64, bytes: Vec<u8>) -> Vec<u8> {
        self.write_at(offset, &bytes);
        bytes
    }
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
    /// The thread [`Output::write_owned`] hands its writes to, once started.
    writer: Option<Writer>,
    /// Whether the writer has a write whose buffer is still to come back.
    writing: bool,
}

/// A thread that writes each buffer it is sent at its offset of the file
/// and sends it back with the result, one at a time, until its queue is
/// closed. One for every write: each thread's start and exit (its stack's
/// pages given back and faulted in again, its signal stack mapped) cost
/// about as much of the kernel's time as a run's write itself.
struct Writer {
    writes: std::sync::mpsc::Sender<(u64, Vec<u8>)>,
    written: std::sync::mpsc::Receiver<(Vec<u8>, std::io::Result<()>)>,
    thread: std::thread::JoinHandle<()>,
}

impl Writer {
    /// Starts a writer to a descriptor of its own for `file`.
    fn start(file: &File) -> std::io::Result<Writer> {
        let file = file.try_clone()?;
        let (writes, to_write) = std::sync::mpsc::channel::<(u64, Vec<u8>)>();
        let (done, written) = std::sync::mpsc::channel();
        let thread = std::thread::Builder::new()
            .name("memgaze-writer".into())
            .spawn(move || {
                for (offset, bytes) in to_write {
                    let result = file.write_all_at(&bytes, offset);
                    if done.send((bytes, result)).is_err() {
                        break;
                    }
                }
            })?;
        Ok(Writer {
            writes,
            written,
            thread,
        })
    }

    /// Closes the queue and waits for the thread to end.
    fn stop(self) {
        drop(self.writes);
        self.thread
            .join()
            .unwrap_or_else(|panic| std::panic::resume_unwind(panic));
    }
}

impl<'f> FileOutput<'f> {
    /// Writes into `file`, which must be a regular file (positional writes).
    pub fn new(file: &'f File) -> FileOutput<'f> {
        FileOutput {
            file,
            error: None,
            writer: None,
            writing: false,
        }
    }

    /// The first error of a write, read or resize, if any: everything after
    /// it was skipped.
    pub fn error(mut self) -> Option<std::io::Error> {
        self.wait();
        self.error.take()
    }

    fn keep(&mut self, result: std::io::Result<()>) {
        if let Err(e) = result {
            self.error.get_or_insert(e);
        }
    }

    /// Waits for the write left running, and gives back its buffer.
    fn wait(&mut self) -> Option<Vec<u8>> {
        if !std::mem::take(&mut self.writing) {
            return None;
        }
        let writer = self.writer.as_ref()?;
        match writer.written.recv() {
            Ok((buffer, result)) => {
                self.keep(result);
                Some(buffer)
            }
            // The writer ended without answering: it panicked, and its
            // panic goes on here.
            Err(_) => {
                if let Some(writer) = self.writer.take() {
                    writer.stop();
                }
                None
            }
        }
    }
}

impl Drop for FileOutput<'_> {
    fn drop(&mut self) {
        // Nothing written on behalf of this output outlives it.
        self.wait();
        if let Some(writer) = self.writer.take() {
            writer.stop();
        }
    }
}

impl Output for FileOutput<'_> {
    fn write_at(&mut self, offset: u64, bytes: &[u8]) {
        self.wait();
        if self.error.is_none() {
            let result = self.file.write_all_at(bytes, offset);
            self.keep(result);
        }
    }

    fn read_at(&mut self, offset: u64, bytes: &mut [u8]) {
        self.wait();
        if self.error.is_none() {
            let result = self.file.read_exact_at(bytes, offset);
            self.keep(result);
        }
    }

    fn set_len(&mut self, len: u64) {
        self.wait();
        if self.error.is_none() {
            let result = self.file.set_len(len);
            self.keep(result);
        }
    }

    /// On a thread of its own ([`Writer`]), so that the caller goes on
    /// making the next bytes meanwhile (writing is mostly the kernel's
    /// copying into the page cache: while the encoder's code was written,
    /// the other core had nothing to do). One write at a time: this one
    /// waits for the last and gives back its buffer.
    fn write_owned(&mut self, offset: u64, bytes: Vec<u8>) -> Vec<u8> {
        let spare = self.wait().unwrap_or_default();
        if self.error.is_some() {
            return bytes;
        }
        if self.writer.is_none() {
            match Writer::start(self.file) {
                Ok(writer) => self.writer = Some(writer),
                Err(_) => {
                    self.write_at(offset, &bytes);
                    return bytes;
                }
            }
        }
        let writer = self.writer.as_ref().expect("started above");
        match writer.writes.send((offset, bytes)) {
            Ok(()) => self.writing = true,
            // The writer is gone: it panicked, and its panic goes on here.
            Err(std::sync::mpsc::SendError((offset, bytes))) => {
                if let Some(writer) = self.writer.take() {
                    writer.stop();
                }
                self.write_at(offset, &bytes);
                return bytes;
            }
        }
        spare
    }

    /// With `copy_file_range`: the kernel moves the bytes from the source's
    /// page cache to the output's, and this process neither maps nor reads
    /// them (a mapped input's pages were most of the writer's page faults
    /// and a user-space copy of the whole input).
    fn copy_from_file(&mut self, offset: u64, source: &File, source_offset: u64, len: u64) -> bool {
        self.wait();
        if self.error.is_some() {
            return true;
        }
        match copy_file_range(source, source_offset, self.file, offset, len) {
            Copied::All => true,
            // Nothing copied: another file system, or a kernel or file
            // system without the call; the caller writes the bytes.
            Copied::Unsupported => false,
            Copied::Failed(e) => {
                self.error.get_or_insert(e);
                true
            }
        }
    }
}

/// What [`copy_file_range`] did.
enum Copied {
    All,
    Unsupported,
    Failed(std::io::Error),
}

/// Copies `len` bytes of `from` at `from_offset` to `to` at `to_offset` in
/// the kernel. `Unsupported` only when nothing was copied.
fn copy_file_range(from: &File, from_offset: u64, to: &File, to_offset: u64, len: u64) -> Copied {
    use std::os::fd::AsRawFd;
    let (Ok(mut off_in), Ok(mut off_out)) = (
        libc::off64_t::try_from(from_offset),
        libc::off64_t::try_from(to_offset),
    ) else {
        return Copied::Unsupported;
    };
    let mut left = len;
    while left > 0 {
        // At most 1 GiB a call: the kernel caps a call below 2 GiB anyway.
        let ask = usize::try_from(left.min(1 << 30)).unwrap_or(1 << 30);
        // SAFETY: both descriptors are open for the call; the offsets are
        // the kernel's to advance, the files' own positions stay.
        let copied = unsafe {
            libc::copy_file_range(
                from.as_raw_fd(),
                &mut off_in,
                to.as_raw_fd(),
                &mut off_out,
                ask,
                0,
            )
        };
        match copied {
            n if n > 0 => left -= n as u64,
            0 => {
                // The source ends early: it changed since it was mapped.
                return Copied::Failed(std::io::Error::new(
                    std::io::ErrorKind::UnexpectedEof,
                    "the input file got shorter while it was being copied",
                ));
            }
            _ => {
                let error = std::io::Error::last_os_error();
                let unsupported = matches!(
                    error.raw_os_error(),
                    Some(
                        libc::EXDEV | libc::EINVAL | libc::ENOSYS | libc::EOPNOTSUPP | libc::EPERM
                    )
                );
                if error.kind() == std::io::ErrorKind::Interrupted {
                    continue;
                }
                return if unsupported && left == len {
                    Copied::Unsupported
                } else {
                    Copied::Failed(error)
                };
            }
        }
    }
    Copied::All
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
    fn a_copy_from_a_file_writes_what_write_at_would() {
        let source = tempfile::tempfile().unwrap();
        let contents: Vec<u8> = (0..100_000u32).map(|i| (i % 253) as u8).collect();
        source.write_all_at(&contents, 0).unwrap();

        let mut bytes = b"0123456789".to_vec();
        assert!(!bytes.copy_from_file(2, &source, 10, 5), "a vector cannot");
        assert_eq!(bytes, b"0123456789", "and writes nothing");

        let file = tempfile::tempfile().unwrap();
        let mut out = FileOutput::new(&file);
        out.write_at(0, b"head");
        assert!(out.copy_from_file(2, &source, 1000, 90_000));
        out.write_at(5, b"x");
        assert!(out.error().is_none());
        let mut expected = b"he".to_vec();
        expected.extend_from_slice(&contents[1000..91_000]);
        expected[5] = b'x';
        let mut written = Vec::new();
        std::io::Read::read_to_end(&mut &file, &mut written).unwrap();
        assert!(written == expected, "the copied bytes differ");
    }

    #[test]
    fn a_copy_past_the_source_end_is_an_error() {
        let source = tempfile::tempfile().unwrap();
        source.write_all_at(b"short", 0).unwrap();
        let file = tempfile::tempfile().unwrap();
        let mut out = FileOutput::new(&file);
        assert!(out.copy_from_file(0, &source, 0, 10));
        let error = out.error().expect("the source ended early");
        assert_eq!(error.kind(), std::io::ErrorKind::UnexpectedEof);
    }

    #[test]
    fn writes_handed_over_land_before_what_comes_after() {
        let file = tempfile::tempfile().unwrap();
        let mut out = FileOutput::new(&file);
        let mut buffer = vec![1u8; 1 << 20];
        buffer = out.write_owned(0, buffer);
        assert!(buffer.is_empty(), "nothing written before to give back");
        buffer.resize(1 << 20, 2);
        let first = out.write_owned(1 << 20, buffer);
        assert_eq!(first, vec![1u8; 1 << 20], "the first buffer comes back");
        // A read waits for the write left running.
        let mut read = [0u8; 4];
        out.read_at((2 << 20) - 2, &mut read[..2]);
        assert_eq!(&read[..2], &[2, 2]);
        out.write_owned(0, b"ab".to_vec());
        out.write_at(1, b"c");
        assert!(out.error().is_none());
        file.read_exact_at(&mut read, 0).unwrap();
        assert_eq!(&read, &[b'a', b'c', 1, 1]);
        assert_eq!(file.metadata().unwrap().len(), 2 << 20);
    }

    #[test]
    fn many_writes_handed_over_go_in_order_through_one_writer() {
        let file = tempfile::tempfile().unwrap();
        let mut out = FileOutput::new(&file);
        let mut buffer = Vec::new();
        for i in 0..100u8 {
            buffer.clear();
            buffer.resize(4096 + usize::from(i), i);
            buffer = out.write_owned(u64::from(i) * 8192, buffer);
            if i > 0 {
                let previous = 4096 + usize::from(i - 1);
                assert_eq!(buffer, vec![i - 1; previous], "the last write's buffer");
            }
            let writer = out.writer.as_ref().expect("a writer is running");
            assert_eq!(writer.thread.thread().name(), Some("memgaze-writer"));
        }
        // Over the first half again: the later writes land last.
        for i in 0..50u8 {
            buffer = out.write_owned(u64::from(i) * 8192, vec![i + 100; 100]);
        }
        drop(buffer);
        assert!(out.error().is_none());
        let mut written = Vec::new();
        std::io::Read::read_to_end(&mut &file, &mut written).unwrap();
        assert_eq!(written.len(), 99 * 8192 + 4096 + 99);
        for i in 0..100u8 {
            let at = usize::from(i) * 8192;
            let len = 4096 + usize::from(i);
            let head = if i < 50 { 100 } else { 0 };
            assert!(written[at..at + head].iter().all(|&b| b == i + 100));
            assert!(written[at + head..at + len].iter().all(|&b| b == i));
            let gap = if i < 99 { at + 8192 } else { at + len };
            assert!(written[at + len..gap].iter().all(|&b| b == 0));
        }
    }

    #[test]
    fn a_write_handed_over_keeps_its_error() {
        let file = File::open("/proc/self/exe").unwrap();
        let mut out = FileOutput::new(&file);
        out.write_owned(0, b"x".to_vec());
        let error = out.error().expect("a file opened read-only refuses writes");
        assert_eq!(error.raw_os_error(), Some(libc::EBADF));
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
