//! Staged outputs removed when a signal ends the process.
//!
//! An [`AtomicFile`](crate::AtomicFile) removes its temporary file when it
//! is dropped, but a process killed by SIGINT, SIGTERM, SIGHUP or SIGQUIT
//! runs no destructor: `cargo memgaze instrument` interrupted while it
//! writes a large executable would leave `.<name>.XXXXXX.tmp` files of
//! up to hundreds of megabytes beside the destination. With
//! [`remove_staged_files_on_signals`] installed, each of those signals first
//! removes every temporary file still staged, then ends the process with the
//! signal's own default action, so the exit status (128 + N in a shell) and
//! a core dump for SIGQUIT stay what they were.
//!
//! The handler may only do async-signal-safe work, so the staged paths are
//! kept where it can read them without a lock: a fixed table of pointers to
//! NUL-terminated paths. A path is allocated when its file is staged and
//! deliberately never freed (a handler running on another thread could be
//! reading it): a few hundred bytes per output for the life of the process.
//! When more than [`SLOTS`] outputs are staged at once, the rest are not
//! removed by a signal (their destructors still remove them otherwise).

use std::ffi::{CString, c_char, c_int};
use std::path::Path;
use std::ptr::null_mut;
use std::sync::atomic::{AtomicPtr, Ordering};

/// How many outputs can be staged at once and still be removed by a signal.
pub const SLOTS: usize = 64;

/// The signals whose default action ends the process that
/// [`remove_staged_files_on_signals`] catches.
pub const ENDING_SIGNALS: [c_int; 4] = [libc::SIGINT, libc::SIGTERM, libc::SIGHUP, libc::SIGQUIT];

/// The staged paths, each a leaked NUL-terminated string, or null.
static STAGED: [AtomicPtr<c_char>; SLOTS] = [const { AtomicPtr::new(null_mut()) }; SLOTS];

/// A staged temporary file's place in the table; leaving the table when
/// dropped (after the file was committed or removed).
#[derive(Debug)]
pub(crate) struct StagedSlot(Option<usize>);

impl StagedSlot {
    /// No slot: an output written in place.
    pub(crate) fn none() -> StagedSlot {
        StagedSlot(None)
    }

    /// Notes `path` (a temporary file just created) for removal by a
    /// signal; no slot when the table is full or the path cannot be made
    /// absolute.
    pub(crate) fn hold(path: &Path) -> StagedSlot {
        use std::os::unix::ffi::OsStrExt;
        // Absolute, so a change of working directory cannot redirect it.
        let Ok(absolute) = std::path::absolute(path) else {
            return StagedSlot(None);
        };
        let Ok(c_path) = CString::new(absolute.as_os_str().as_bytes()) else {
            return StagedSlot(None);
        };
        let leaked = Box::leak(c_path.into_boxed_c_str()).as_ptr().cast_mut();
        for (slot, place) in STAGED.iter().enumerate() {
            if place
                .compare_exchange(null_mut(), leaked, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
            {
                return StagedSlot(Some(slot));
            }
        }
        StagedSlot(None)
    }
}

impl Drop for StagedSlot {
    fn drop(&mut self) {
        if let Some(slot) = self.0 {
            STAGED[slot].store(null_mut(), Ordering::Release);
        }
    }
}

/// Makes SIGINT, SIGTERM, SIGHUP and SIGQUIT remove every output still
/// staged before they end the process as they would have (see the module
/// documentation). A signal this process ignores stays ignored, and a
/// handler installed before is kept. Code that catches these signals for a
/// while (a recording forwarding them to its program) restores this
/// handler afterwards as it would any other.
pub fn remove_staged_files_on_signals() {
    for signal in ENDING_SIGNALS {
        // SAFETY: reads the current disposition and, when it is the
        // default, installs an async-signal-safe handler; the sigaction
        // structs are fully initialised.
        unsafe {
            let mut current: libc::sigaction = std::mem::zeroed();
            if libc::sigaction(signal, std::ptr::null(), &mut current) != 0
                || current.sa_sigaction != libc::SIG_DFL
            {
                continue;
            }
            let mut action: libc::sigaction = std::mem::zeroed();
            action.sa_sigaction =
                remove_staged_and_end as extern "C" fn(c_int) as libc::sighandler_t;
            // Back to the default on entry: the signal raised again below
            // is delivered, with the default action, once the handler returns.
            action.sa_flags = libc::SA_RESETHAND;
            libc::sigfillset(&mut action.sa_mask);
            libc::sigaction(signal, &action, std::ptr::null_mut());
        }
    }
}

/// The handler: removes the staged files, then raises `signal` again under
/// its default disposition (blocked until this handler returns).
extern "C" fn remove_staged_and_end(signal: c_int) {
    for place in &STAGED {
        let path = place.load(Ordering::Acquire);
        if !path.is_null() {
            // SAFETY: a leaked, never freed, NUL-terminated path; `unlink`
            // is async-signal-safe.
            unsafe { libc::unlink(path) };
        }
    }
    // SAFETY: `raise` is async-signal-safe.
    unsafe { libc::raise(signal) };
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::process::ExitStatusExt;

    /// The variable that makes the test below its own child.
    const CHILD_DIR: &str = "MEMGAZE_OUTPUT_TEST_SIGNAL_DIR";

    /// A process ended by SIGTERM while it stages an output leaves no
    /// temporary file, keeps an output committed before and still dies of
    /// the signal. The test runs itself as the child that is killed.
    #[test]
    fn a_signal_removes_staged_files_and_still_ends_the_process() {
        if let Some(dir) = std::env::var_os(CHILD_DIR) {
            let dir = Path::new(&dir);
            remove_staged_files_on_signals();
            let mut kept = crate::AtomicFile::create(&dir.join("kept")).unwrap();
            kept.write_bytes(b"committed").unwrap();
            kept.commit().unwrap();
            let mut staged = crate::AtomicFile::create(&dir.join("out")).unwrap();
            staged.write_bytes(&[7; 1 << 16]).unwrap();
            let mut other = crate::AtomicFile::create(&dir.join("other")).unwrap();
            other.write_bytes(b"x").unwrap();
            // Both temporary files exist now; the parent checks they are gone.
            std::fs::write(
                dir.join("staged-count"),
                std::fs::read_dir(dir).unwrap().count().to_string(),
            )
            .unwrap();
            // SAFETY: raising a signal at this process.
            unsafe { libc::raise(libc::SIGTERM) };
            std::process::exit(0);
        }
        let dir = tempfile::tempdir().unwrap();
        let status = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "staged::tests::a_signal_removes_staged_files_and_still_ends_the_process",
                "--test-threads=1",
            ])
            .env(CHILD_DIR, dir.path())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status()
            .unwrap();
        assert_eq!(status.signal(), Some(libc::SIGTERM), "{status:?}");
        // kept, two temporary files and the count itself were there.
        let count = std::fs::read_to_string(dir.path().join("staged-count")).unwrap();
        assert_eq!(count, "3");
        let mut left: Vec<String> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        left.sort();
        assert_eq!(left, ["kept", "staged-count"]);
        assert_eq!(
            std::fs::read(dir.path().join("kept")).unwrap(),
            b"committed"
        );
    }

    /// A slot is given back when its output is committed or dropped, so
    /// staging more files than the table holds, one after another, never
    /// runs out of slots.
    #[test]
    fn slots_are_given_back() {
        let dir = tempfile::tempdir().unwrap();
        for i in 0..SLOTS * 3 {
            let file = crate::AtomicFile::create(&dir.path().join(format!("f{i}"))).unwrap();
            assert!(file.staged.0.is_some(), "no slot for file {i}");
            if i % 2 == 0 {
                file.commit().unwrap();
            }
        }
    }
}
