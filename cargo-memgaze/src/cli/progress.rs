//! Progress of the commands that run a suite of benches (`bench`, `golden`,
//! `validate`): an indicatif bar on a terminal, plain status lines on
//! stderr otherwise, nothing but errors with `-q`.

use super::style::{Stream, enabled, paint_line};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use std::io::IsTerminal;

/// Status output on stderr for a run of `total` steps.
pub struct Progress {
    bar: ProgressBar,
    /// Print status lines (no bar on stderr, not quiet).
    lines: bool,
}

impl Progress {
    /// A bar over `total` steps; `quiet` hides everything.
    pub fn new(total: u64, quiet: bool) -> Progress {
        let terminal = std::io::stderr().is_terminal();
        let target = if quiet || !terminal {
            ProgressDrawTarget::hidden()
        } else {
            ProgressDrawTarget::stderr()
        };
        let bar = ProgressBar::with_draw_target(Some(total), target);
        // `--color never` and `NO_COLOR` reach the bar through its template.
        let template = if enabled(Stream::Stderr) {
            "{prefix:>12.cyan.bold} [{bar:25}] {pos}/{len} {wide_msg} {elapsed:>4}"
        } else {
            "{prefix:>12} [{bar:25}] {pos}/{len} {wide_msg} {elapsed:>4}"
        };
        bar.set_style(
            ProgressStyle::with_template(template)
                .expect("a valid template")
                .progress_chars("=> "),
        );
        bar.set_prefix("Running");
        Progress {
            bar,
            lines: !quiet && !terminal,
        }
    }

    /// A step begins: `verb` (`Recording`) what (`microbenches/micro str1`).
    pub fn start(&self, verb: &str, what: &str) {
        self.bar.set_prefix(verb.to_string());
        self.bar.set_message(what.to_string());
        if self.lines {
            eprintln!("{verb:>12} {what}");
        }
    }

    /// The current step is done.
    pub fn advance(&self) {
        self.bar.inc(1);
    }

    /// Prints a note on stderr above the bar (not with `-q`).
    pub fn note(&self, line: &str) {
        if self.lines || !self.bar.is_hidden() {
            let line = paint_line(line, enabled(Stream::Stderr));
            self.bar.suspend(|| eprintln!("{line}"));
        }
    }

    /// Prints an `error:` line on stderr above the bar, also with `-q`:
    /// quiet hides progress and notes, never what went wrong.
    pub fn error(&self, line: &str) {
        let line = paint_line(line, enabled(Stream::Stderr));
        self.bar.suspend(|| eprintln!("{line}"));
    }

    /// Prints a `warning:` line on stderr above the bar, also with `-q`
    /// (as rustc's warnings show under `cargo -q`): a warning says a result
    /// may mislead (low dynamic coverage, too few samples, nothing recorded).
    pub fn warning(&self, line: &str) {
        self.error(line);
    }

    /// Runs `f` (which prints to stdout) with the bar out of the way.
    pub fn print<R>(&self, f: impl FnOnce() -> R) -> R {
        self.bar.suspend(f)
    }

    /// Removes the bar.
    pub fn finish(&self) {
        self.bar.finish_and_clear();
    }
}
