//! Coloured `warning:`, `error:`, `regression:` and `note:` prefixes, as
//! cargo prints them, following `--color` and the `NO_COLOR` convention
//! (<https://no-color.org>): `auto` colours a stream that is a terminal
//! unless `NO_COLOR` is set to a non-empty value; `always` and `never` are
//! obeyed whatever the environment says.

use super::ColorChoice;
use std::io::IsTerminal;
use std::sync::OnceLock;

/// Whether stdout and stderr get colours, decided once per process.
static CHOICE: OnceLock<Streams> = OnceLock::new();

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Streams {
    stdout: bool,
    stderr: bool,
}

/// Where a line goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stream {
    /// Results.
    Stdout,
    /// Progress, notes, warnings, errors.
    Stderr,
}

/// Whether a stream gets colours under `choice`, given whether it is a
/// terminal and the value of `NO_COLOR`.
pub fn colors_for(choice: ColorChoice, terminal: bool, no_color: Option<&str>) -> bool {
    match choice {
        ColorChoice::Always => true,
        ColorChoice::Never => false,
        ColorChoice::Auto => terminal && no_color.is_none_or(str::is_empty),
    }
}

/// Decides the colours of this process from `--color` (the first call
/// wins; commands call it before printing anything).
pub fn init(choice: ColorChoice) {
    let no_color = std::env::var("NO_COLOR").ok();
    let _ = CHOICE.set(Streams {
        stdout: colors_for(choice, std::io::stdout().is_terminal(), no_color.as_deref()),
        stderr: colors_for(choice, std::io::stderr().is_terminal(), no_color.as_deref()),
    });
}

/// Whether `stream` gets colours (`--color auto` until [`init`] runs).
pub fn enabled(stream: Stream) -> bool {
    let streams = *CHOICE.get_or_init(|| {
        let no_color = std::env::var("NO_COLOR").ok();
        Streams {
            stdout: colors_for(
                ColorChoice::Auto,
                std::io::stdout().is_terminal(),
                no_color.as_deref(),
            ),
            stderr: colors_for(
                ColorChoice::Auto,
                std::io::stderr().is_terminal(),
                no_color.as_deref(),
            ),
        }
    });
    match stream {
        Stream::Stdout => streams.stdout,
        Stream::Stderr => streams.stderr,
    }
}

/// A line's kind, which its prefix names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Prefix {
    /// `error:`, bold red.
    Error,
    /// `warning:`, bold yellow.
    Warning,
    /// `regression:`, bold red.
    Regression,
    /// `note:`, bold cyan.
    Note,
}

impl Prefix {
    fn text(self) -> &'static str {
        match self {
            Prefix::Error => "error:",
            Prefix::Warning => "warning:",
            Prefix::Regression => "regression:",
            Prefix::Note => "note:",
        }
    }

    /// The SGR sequence of the prefix's colour.
    fn sgr(self) -> &'static str {
        match self {
            Prefix::Error | Prefix::Regression => "\x1b[1;31m",
            Prefix::Warning => "\x1b[1;33m",
            Prefix::Note => "\x1b[1;36m",
        }
    }

    /// The prefix, coloured or not.
    pub fn paint(self, color: bool) -> String {
        if color {
            format!("{}{}\x1b[0m", self.sgr(), self.text())
        } else {
            self.text().to_string()
        }
    }

    /// The prefix for a line on `stream`.
    pub fn on(self, stream: Stream) -> String {
        self.paint(enabled(stream))
    }
}

/// `line` with a leading `error:`, `warning:`, `regression:` or `note:`
/// coloured when `color` is set (other lines unchanged).
pub fn paint_line(line: &str, color: bool) -> String {
    if !color {
        return line.to_string();
    }
    for prefix in [
        Prefix::Error,
        Prefix::Warning,
        Prefix::Regression,
        Prefix::Note,
    ] {
        if let Some(rest) = line.strip_prefix(prefix.text()) {
            return format!("{}{rest}", prefix.paint(true));
        }
    }
    line.to_string()
}

/// [`paint_line`] for each line of `text` on `stream` (line ends kept).
pub fn paint_text(text: &str, stream: Stream) -> String {
    let color = enabled(stream);
    if !color {
        return text.to_string();
    }
    text.split_inclusive('\n')
        .map(|line| paint_line(line, true))
        .collect()
}

/// `eprintln!` whose line's leading `error:`, `warning:`, `regression:`
/// or `note:` is coloured when stderr gets colours.
macro_rules! styled_eprintln {
    ($($arg:tt)*) => {
        eprintln!(
            "{}",
            $crate::cli::style::paint_line(
                &format!($($arg)*),
                $crate::cli::style::enabled($crate::cli::style::Stream::Stderr),
            )
        )
    };
}
pub(crate) use styled_eprintln;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_color_turns_auto_off_but_not_an_explicit_choice() {
        assert!(colors_for(ColorChoice::Auto, true, None));
        assert!(colors_for(ColorChoice::Auto, true, Some("")));
        assert!(!colors_for(ColorChoice::Auto, true, Some("1")));
        assert!(!colors_for(ColorChoice::Auto, false, None));
        assert!(colors_for(ColorChoice::Always, false, Some("1")));
        assert!(!colors_for(ColorChoice::Never, true, None));
    }

    #[test]
    fn only_the_prefix_is_coloured() {
        assert_eq!(
            paint_line("warning: x: 3 samples", true),
            "\x1b[1;33mwarning:\x1b[0m x: 3 samples"
        );
        assert_eq!(
            paint_line("regression: a/b/c: dF 1 → 2", true),
            "\x1b[1;31mregression:\x1b[0m a/b/c: dF 1 → 2"
        );
        assert_eq!(paint_line("error: no", false), "error: no");
        assert_eq!(paint_line("bench  A  F", true), "bench  A  F");
        assert_eq!(Prefix::Note.paint(false), "note:");
    }
}
