//! Exit codes and the errors that choose them.
//!
//! `docs/CLI.md` fixes the exit codes users and CI scripts rely on. Library
//! crates return typed errors (`TraceError`, `InstrumentError`…) whose text
//! names the problem; the command layer wraps them in `anyhow` context naming
//! the input, and turns an error into exactly one line on stderr and one of
//! these codes. Only the few errors that need a code other than 1 carry a
//! type of their own here ([`UsageError`]).

#![warn(missing_docs)]

use std::fmt;

/// The process exit codes of `cargo memgaze` (docs/CLI.md, "Exit codes").
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Exit {
    /// Everything worked and no gate failed.
    Ok,
    /// An error: bad input, a failed build, an I/O problem.
    Error,
    /// The command line itself was wrong.
    Usage,
    /// A regression, an accuracy limit exceeded, an undersampled benchmark,
    /// or golden snapshots that differ on CI.
    Regression,
    /// A benchmark body failed (panicked or exited non-zero). Wins over
    /// [`Exit::Regression`].
    BenchFailed,
    /// `record`/`run`: the recorded program's own exit status, passed
    /// through (128 + N when it died of signal N). Returned rather than
    /// exiting on the spot so that temporary files are removed first.
    Program(i32),
    /// The command was interrupted by a signal (128 + N: 130 for SIGINT,
    /// 143 for SIGTERM, 129 for SIGHUP) or its `--timeout` expired (124).
    /// Wins over every other outcome.
    Interrupted(i32),
}

impl Exit {
    /// The numeric code passed to `std::process::exit`.
    pub fn code(self) -> i32 {
        match self {
            Exit::Ok => 0,
            Exit::Error => 1,
            Exit::Usage => 2,
            Exit::Regression => 3,
            Exit::BenchFailed => 101,
            Exit::Program(code) | Exit::Interrupted(code) => code,
        }
    }

    /// Combines the outcomes of several benches or checks: the most severe
    /// one wins (101 over 3 over 0, errors over those, an interruption over
    /// everything).
    pub fn worst(self, other: Exit) -> Exit {
        fn rank(e: Exit) -> u8 {
            match e {
                Exit::Ok => 0,
                Exit::Program(_) => 1,
                Exit::Regression => 2,
                Exit::BenchFailed => 3,
                Exit::Usage => 4,
                Exit::Error => 5,
                Exit::Interrupted(_) => 6,
            }
        }
        if rank(other) > rank(self) {
            other
        } else {
            self
        }
    }
}

/// An error that must end the run with exit code 2 (bad usage) rather than 1.
///
/// Clap reports most usage errors itself; this covers the combinations it
/// cannot express (e.g. `--lackey` without `--binary`).
#[derive(Debug)]
pub struct UsageError(pub String);

impl fmt::Display for UsageError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for UsageError {}

/// Shorthand for returning a [`UsageError`] from a command, as whatever
/// error type the command returns (`anyhow::Error` in `cargo-memgaze`).
pub fn usage<E: From<UsageError>>(message: impl Into<String>) -> E {
    E::from(UsageError(message.into()))
}

/// An error that ends the run because a signal stopped it (exit 128 + N),
/// e.g. while cargo was building the benches.
#[derive(Debug)]
pub struct Interrupted {
    /// The exit code, 128 + the signal's number.
    pub code: i32,
    /// What was stopped, for the error line.
    pub what: String,
}

impl fmt::Display for Interrupted {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.what)
    }
}

impl std::error::Error for Interrupted {}

/// The exit code an error maps to.
///
/// A [`UsageError`] counts wherever it is in the chain: a library's typed
/// error carries one as its source (e.g. an invalid `--functions` glob); so
/// does an [`Interrupted`], which wins over it.
pub fn exit_for<E: AsRef<dyn std::error::Error + 'static> + ?Sized>(error: &E) -> Exit {
    exit_for_of(error.as_ref())
}

/// [`exit_for`] of a library's typed error and its sources.
pub fn exit_for_of(error: &(dyn std::error::Error + 'static)) -> Exit {
    let mut chain = std::iter::successors(Some(error), |cause| cause.source());
    if let Some(stop) = std::iter::successors(Some(error), |cause| cause.source())
        .find_map(|cause| cause.downcast_ref::<Interrupted>())
    {
        Exit::Interrupted(stop.code)
    } else if chain.any(|cause| cause.is::<UsageError>()) {
        Exit::Usage
    } else {
        Exit::Error
    }
}

/// Renders an error and its causes as one line: `outer: inner: root`.
///
/// Causes that merely repeat the text of the previous one (common when a
/// library error is wrapped with its own message) are dropped.
pub fn one_line<E: AsRef<dyn std::error::Error + 'static> + ?Sized>(error: &E) -> String {
    one_line_of(error.as_ref())
}

/// [`one_line`] of a library's typed error and its sources.
pub fn one_line_of(error: &(dyn std::error::Error + 'static)) -> String {
    let mut line = String::new();
    let mut previous = String::new();
    for cause in std::iter::successors(Some(error), |cause| cause.source()) {
        let text = cause.to_string().replace('\n', " ");
        let text = text.trim();
        if text.is_empty() || previous.ends_with(text) {
            continue;
        }
        if !line.is_empty() {
            line.push_str(": ");
        }
        line.push_str(text);
        previous = text.to_string();
    }
    line
}

#[cfg(test)]
mod tests {
    use super::*;
    use anyhow::Context;

    #[test]
    fn an_interruption_anywhere_in_the_chain_gives_its_code() {
        let e = anyhow::Error::new(Interrupted {
            code: 143,
            what: "interrupted by SIGTERM while building".into(),
        })
        .context("bench");
        assert_eq!(exit_for(&e), Exit::Interrupted(143));
        assert_eq!(one_line(&e), "bench: interrupted by SIGTERM while building");
        assert_eq!(exit_for(&usage::<anyhow::Error>("x")), Exit::Usage);
    }

    #[test]
    fn worst_prefers_bench_failure_over_regression() {
        assert_eq!(Exit::Regression.worst(Exit::BenchFailed), Exit::BenchFailed);
        assert_eq!(Exit::BenchFailed.worst(Exit::Regression), Exit::BenchFailed);
        assert_eq!(Exit::Ok.worst(Exit::Regression), Exit::Regression);
        assert_eq!(Exit::Ok.worst(Exit::Ok), Exit::Ok);
        assert_eq!(
            Exit::Error.worst(Exit::Interrupted(130)),
            Exit::Interrupted(130)
        );
        assert_eq!(Exit::Interrupted(124).code(), 124);
        assert_eq!(Exit::Program(7).code(), 7);
    }

    #[test]
    fn usage_errors_map_to_two_even_with_context() {
        let e = Err::<(), anyhow::Error>(usage("--lackey needs --binary"))
            .context("analyze")
            .unwrap_err();
        assert_eq!(exit_for(&e), Exit::Usage);
        assert_eq!(exit_for(&anyhow::anyhow!("boom")), Exit::Error);
        // As the source of a library's own error.
        #[derive(Debug)]
        struct Wrapper(UsageError);
        impl fmt::Display for Wrapper {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                self.0.fmt(f)
            }
        }
        impl std::error::Error for Wrapper {
            fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
                Some(&self.0)
            }
        }
        let e = anyhow::Error::new(Wrapper(UsageError("--functions [: bad".into()))).context("app");
        assert_eq!(exit_for(&e), Exit::Usage);
        assert_eq!(one_line(&e), "app: --functions [: bad");
    }

    #[test]
    fn one_line_joins_causes_and_flattens_newlines() {
        let e = Err::<(), _>(anyhow::anyhow!("bad magic\nat offset 0"))
            .context("trace.bin")
            .unwrap_err();
        assert_eq!(one_line(&e), "trace.bin: bad magic at offset 0");
    }
}
