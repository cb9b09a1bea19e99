//! `--timeout` and `--kill-after`: the time limits of every command that
//! records (`record`, `run`, `bench`, `golden`, `validate`).

use memgaze_record::{Limits, parse_duration};
use std::time::Duration;

/// Time-limit flags of the recording commands.
#[derive(clap::Args, Debug, Clone)]
pub struct LimitArgs {
    /// Stop the recorded program after DURATION (`30s`, `1.5m`, `500ms`;
    /// plain seconds; `0`: no limit): it is sent SIGTERM, then SIGKILL
    /// after --kill-after. The trace keeps what was recorded, marked
    /// interrupted; `record` and `run` exit with 124, and a bench that
    /// times out counts as a failed bench. Per program: each bench of
    /// `bench`, `golden` and `validate` gets the whole DURATION.
    #[arg(long, value_name = "DURATION", value_parser = duration, help_heading = "Time limits")]
    pub timeout: Option<Duration>,
    /// Grace period between forwarding SIGINT, SIGTERM or SIGHUP (or the
    /// SIGTERM of --timeout) to the program and killing it with SIGKILL. A
    /// second signal kills it at once.
    #[arg(long, value_name = "DURATION", default_value = "5s", value_parser = duration, help_heading = "Time limits")]
    pub kill_after: Duration,
}

impl LimitArgs {
    /// The limits these flags ask for.
    pub fn limits(&self) -> Limits {
        Limits {
            timeout: self.timeout.filter(|t| !t.is_zero()),
            kill_after: self.kill_after,
        }
    }
}

fn duration(text: &str) -> Result<Duration, String> {
    parse_duration(text)
}
