//! Helpers shared by the integration tests.

pub mod mutate;
pub mod results;
pub mod svg;
pub mod synthetic;

use std::process::Command;

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
