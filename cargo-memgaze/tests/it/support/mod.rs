//! Helpers shared by the integration tests.

pub mod mutate;
pub mod results;
pub mod svg;
pub mod synthetic;

use std::path::{Path, PathBuf};
use std::process::Command;

/// A fresh directory `<CARGO_TARGET_TMPDIR>/<tag>-<pid>` for state the
/// tests of this process share. A `static` is never dropped, so a
/// `TempDir` held in one would leak a directory per run; instead each run
/// removes the `<tag>-<pid>` directories of test processes that are gone.
pub fn process_scratch(tag: &str) -> PathBuf {
    let root = Path::new(env!("CARGO_TARGET_TMPDIR"));
    let prefix = format!("{tag}-");
    if let Ok(entries) = std::fs::read_dir(root) {
        for entry in entries.flatten() {
            let name = entry.file_name();
            let pid = name
                .to_str()
                .and_then(|n| n.strip_prefix(&prefix))
                .and_then(|p| p.parse::<u32>().ok());
            if pid.is_some_and(|pid| !Path::new(&format!("/proc/{pid}")).exists()) {
                let _ = std::fs::remove_dir_all(entry.path());
            }
        }
    }
    let dir = root.join(format!("{prefix}{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("test scratch directory");
    dir
}

/// The instrumented-library cache of the whole test run (`MEMGAZE_LIBS_CACHE`,
/// in the target directory): every recording instruments libc, libm and
/// libgcc_s by default, and tests run outside any cargo project's target
/// directory, so without it each recording would instrument them anew.
/// Entries are renamed into place whole, so parallel tests share it safely.
pub const LIBS_CACHE: &str = concat!(env!("CARGO_TARGET_TMPDIR"), "/memgaze-libs");

/// `cargo-memgaze` with the test run's library cache.
pub fn memgaze_command() -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_cargo-memgaze"));
    command.env("MEMGAZE_LIBS_CACHE", LIBS_CACHE);
    command
}
