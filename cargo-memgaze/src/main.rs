//! `cargo-memgaze`: the cargo subcommand binary.
//!
//! Parses the command line, runs the command and maps its outcome to the
//! exit codes of docs/CLI.md. Errors are printed as one line; a panic (a bug)
//! is also reduced to one line rather than a backtrace.

use clap::Parser;
use memgaze::cli::{self, CargoCli};
use memgaze_error::{self as error, Exit};

fn main() {
    std::panic::set_hook(Box::new(|info| {
        let message = info
            .payload()
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| info.payload().downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "unknown panic".to_string());
        // `cargo memgaze bench | head`: the reader left; stop quietly, as
        // a shell pipeline expects (print! panics on a closed stdout).
        if message.starts_with("failed printing to stdout") && message.contains("Broken pipe") {
            std::process::exit(0);
        }
        let location = info
            .location()
            .map(|l| format!(" at {}:{}", l.file(), l.line()))
            .unwrap_or_default();
        eprintln!(
            "error: internal error (a bug in cargo memgaze, please report it): {message}{location}"
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
            eprintln!("error: {}", error::one_line(&e));
            error::exit_for(&e)
        }
        Err(_) => Exit::Error,
    };
    std::process::exit(exit.code());
}
