//! `cargo-memgaze`: the cargo subcommand binary.
//!
//! Parses the command line, runs the command and maps its outcome to the
//! exit codes of docs/CLI.md. Errors are printed as one line; a panic (a bug)
//! is also reduced to one line rather than a backtrace.

use clap::Parser;
use memgaze::cli::style::{Prefix, Stream};
use memgaze::cli::{self, CargoCli};
use memgaze_error::{self as error, Exit};

fn main() {
    ignore_file_size_signal();
    memgaze_output::remove_staged_files_on_signals();
    std::panic::set_hook(Box::new(|info| {
        let message = info
            .payload()
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| info.payload().downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "unknown panic".to_string());
        // `cargo memgaze bench | head`: the reader left; stop quietly, as
        // a shell pipeline expects (print! panics on a closed stdout), with
        // the status of a program killed by SIGPIPE: under `pipefail` a run
        // cut short (a gate that gave no verdict) must not pass for success.
        if message.starts_with("failed printing to stdout") && message.contains("Broken pipe") {
            std::process::exit(128 + libc::SIGPIPE);
        }
        let location = info
            .location()
            .map(|l| format!(" at {}:{}", l.file(), l.line()))
            .unwrap_or_default();
        eprintln!(
            "{} internal error (a bug in cargo memgaze, please report it): {message}{location}",
            Prefix::Error.on(Stream::Stderr)
        );
    }));

    let args = cli::normalize_args(std::env::args_os().collect());
    let CargoCli::Memgaze(parsed) = match CargoCli::try_parse_from(args) {
        Ok(parsed) => parsed,
        Err(e) => {
            // Help and version go to stdout with exit 0; usage errors exit 2.
            let _ = e.print();
            std::process::exit(if e.use_stderr() {
                Exit::Usage.code()
            } else {
                0
            });
        }
    };

    let outcome = std::panic::catch_unwind(|| cli::dispatch(parsed));
    let exit = match outcome {
        Ok(Ok(exit)) => exit,
        Ok(Err(e)) => {
            eprintln!(
                "{} {}",
                Prefix::Error.on(Stream::Stderr),
                error::one_line(&e)
            );
            error::exit_for(&e)
        }
        Err(_) => Exit::Error,
    };
    std::process::exit(exit.code());
}

/// Under `ulimit -f`, a write past the limit raises SIGXFSZ, whose default
/// action kills the process without a word. With a handler that does
/// nothing, the write fails with EFBIG instead and the error names the
/// file. A handler (unlike SIG_IGN) is reset by `exec`, so the programs we
/// run keep the default.
fn ignore_file_size_signal() {
    extern "C" fn nothing(_: libc::c_int) {}
    // SAFETY: installs an async-signal-safe handler that does nothing; the
    // sigaction struct is fully initialised.
    unsafe {
        let mut action: libc::sigaction = std::mem::zeroed();
        action.sa_sigaction = nothing as extern "C" fn(libc::c_int) as libc::sighandler_t;
        action.sa_flags = libc::SA_RESTART;
        libc::sigemptyset(&mut action.sa_mask);
        libc::sigaction(libc::SIGXFSZ, &action, std::ptr::null_mut());
    }
}
