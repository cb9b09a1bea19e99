//! [`ResultsLock`]: one `cargo memgaze` command at a time per results tree.
//!
//! `bench`, `golden` and `validate` hold an exclusive advisory lock
//! (`flock(2)` through [`std::fs::File::lock`]) on
//! `<target-dir>/memgaze/.memgaze-lock` from after the build until they
//! exit, as cargo locks its build directory: a second command in the same
//! target directory waits, saying so once ("Blocking waiting for file lock
//! on …"), rather than interleaving its traces, analyses, report and
//! baseline with the first one's. The lock goes with the process (the
//! kernel drops it when the file is closed, also on a crash or SIGKILL), so
//! no stale lock is ever left behind. The wait polls, so that a signal the
//! command's watch catches (`kill -INT` to a background job, whose SIGINT
//! the shell ignores) stops it there as it would during the build.

use super::ResultsLayout;
use anyhow::Context;
use memgaze_record::signals::Watch;
use std::fs::{File, TryLockError};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The lock file's name under the results root.
pub const LOCK_FILE: &str = ".memgaze-lock";

/// How often a waiting command tries the lock again and looks for a signal.
const RETRY: Duration = Duration::from_millis(50);

/// A held lock on a results tree; released when dropped.
#[derive(Debug)]
pub struct ResultsLock {
    _file: File,
    path: PathBuf,
}

impl ResultsLock {
    /// The lock file.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl ResultsLayout {
    /// Takes the exclusive lock of this results tree, waiting for another
    /// command holding it (and saying so on stderr unless `quiet`); a
    /// signal `watch` catches meanwhile ends the wait with an
    /// [`memgaze_error::Interrupted`] error.
    pub fn lock(&self, quiet: bool, watch: &Watch) -> anyhow::Result<ResultsLock> {
        self.lock_unless(quiet, || watch.signal())
    }

    /// [`ResultsLayout::lock`] with the caught signal asked of `signal`:
    /// tests must not depend on the process-wide signal counts that other
    /// tests in the same process raise signals into.
    fn lock_unless(
        &self,
        quiet: bool,
        signal: impl Fn() -> Option<i32>,
    ) -> anyhow::Result<ResultsLock> {
        let root = self.root();
        std::fs::create_dir_all(root)
            .with_context(|| format!("{}: cannot create", root.display()))?;
        let path = root.join(LOCK_FILE);
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .with_context(|| format!("{}: cannot open the lock file", path.display()))?;
        let mut said = quiet;
        loop {
            match file.try_lock() {
                Ok(()) => return Ok(ResultsLock { _file: file, path }),
                Err(TryLockError::WouldBlock) => {}
                Err(TryLockError::Error(e)) => {
                    return Err(e).with_context(|| format!("{}: cannot lock", path.display()));
                }
            }
            if !said {
                eprintln!(
                    "{:>12} waiting for file lock on {}",
                    "Blocking",
                    path.display()
                );
                said = true;
            }
            if let Some(signal) = signal() {
                return Err(memgaze_error::Interrupted {
                    code: 128 + signal,
                    what: format!(
                        "interrupted by {} while waiting for file lock on {}",
                        memgaze_trace::Interruption::Signal(signal).name(),
                        path.display()
                    ),
                }
                .into());
            }
            std::thread::sleep(RETRY);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_lock_waits_for_the_first() {
        let dir = tempfile::tempdir().unwrap();
        let layout = ResultsLayout::new(dir.path());
        let first = layout.lock_unless(true, || None).unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        let waiter = std::thread::spawn(move || {
            let second = layout.lock_unless(true, || None).unwrap();
            tx.send(()).unwrap();
            drop(second);
        });
        assert!(
            rx.recv_timeout(std::time::Duration::from_millis(300))
                .is_err(),
            "the second lock was granted while the first was held"
        );
        assert!(first.path().ends_with(LOCK_FILE));
        drop(first);
        rx.recv_timeout(std::time::Duration::from_secs(10)).unwrap();
        waiter.join().unwrap();
    }

    #[test]
    fn a_signal_ends_the_wait_with_its_exit_code() {
        let dir = tempfile::tempdir().unwrap();
        let layout = ResultsLayout::new(dir.path());
        let _first = layout.lock_unless(true, || None).unwrap();
        let error = layout.lock_unless(true, || Some(2)).unwrap_err();
        let interrupted = error.downcast_ref::<memgaze_error::Interrupted>().unwrap();
        assert_eq!(interrupted.code, 130);
        assert!(
            interrupted
                .what
                .contains("SIGINT while waiting for file lock on")
        );
    }
}
