//! Keeping a recorded program under control: forwarding the signals
//! `cargo memgaze` receives, `--timeout`, the grace period before SIGKILL
//! (`--kill-after`), and killing it when the collector has to give up.
//!
//! The program runs in a process group of its own (so that a signal for
//! it reaches its children too, and a terminal's ^C reaches `cargo
//! memgaze`, which decides what to do). [`Supervisor`] is consulted by the
//! collector between messages and while it waits for the next one:
//!
//! - the first SIGINT, SIGTERM or SIGHUP (or the expiry of `--timeout`,
//!   which sends SIGTERM) is forwarded to the group, and the collector
//!   keeps reading so that what the program flushes as it ends is kept;
//! - `--kill-after` later, the group is sent SIGKILL;
//! - a second signal sends SIGKILL at once and stops reading: the trace
//!   is the prefix received so far.

use super::signals::{self, INTERRUPTS};
use memgaze_trace::Interruption;
use std::os::fd::RawFd;
use std::time::{Duration, Instant};

/// Default grace period between forwarding a signal and SIGKILL.
pub const DEFAULT_KILL_AFTER: Duration = Duration::from_secs(5);

/// Time limits of a recording.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Stop the program (SIGTERM, then SIGKILL after `kill_after`) once it
    /// has run this long.
    pub timeout: Option<Duration>,
    /// Grace period between a forwarded signal and SIGKILL.
    pub kill_after: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            timeout: None,
            kill_after: DEFAULT_KILL_AFTER,
        }
    }
}

/// Parses a duration as `timeout(1)` takes it: a number with an optional
/// unit `ms`, `s` (the default), `m`, `h` or `d`; fractions allowed
/// (`1.5s`, `0.5`).
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let trimmed = text.trim();
    let split = trimmed
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(trimmed.len());
    let (number, unit) = trimmed.split_at(split);
    let scale = match unit {
        "" | "s" => 1.0,
        "ms" => 0.001,
        "m" => 60.0,
        "h" => 3600.0,
        "d" => 86400.0,
        _ => {
            return Err(format!(
                "invalid duration {text:?}: the unit must be ms, s, m, h or d"
            ));
        }
    };
    let value: f64 = number
        .parse()
        .map_err(|_| format!("invalid duration {text:?}: expected a number such as 30s or 1.5m"))?;
    let seconds = value * scale;
    if !seconds.is_finite() || seconds > 1e9 {
        return Err(format!("invalid duration {text:?}: too long"));
    }
    Ok(Duration::from_secs_f64(seconds))
}

/// What the collector should do after a [`Supervisor`] check.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// Keep reading the program's messages.
    Continue,
    /// Stop reading now (the program was killed at once).
    Stop,
}

/// The state of one recording's program (see the module documentation).
pub(crate) struct Supervisor {
    group: libc::pid_t,
    limits: Limits,
    seen: [u64; signals::SIGNALS],
    deadline: Option<Instant>,
    kill_at: Option<Instant>,
    killed: bool,
    /// Why the recording was cut short, once it was.
    pub(crate) interrupted: Option<Interruption>,
}

impl Supervisor {
    /// Supervises the process group `group` (the program's pid) from now;
    /// signals received before this call do not count.
    pub(crate) fn new(group: u32, limits: Limits, seen: [u64; signals::SIGNALS]) -> Supervisor {
        Supervisor {
            group: group as libc::pid_t,
            limits,
            seen,
            deadline: limits.timeout.map(|t| Instant::now() + t),
            kill_at: None,
            killed: false,
            interrupted: None,
        }
    }

    /// Acts on new signals and passed deadlines.
    pub(crate) fn check(&mut self) -> Verdict {
        let now = signals::received();
        let mut verdict = Verdict::Continue;
        for (index, &count) in now.iter().enumerate() {
            while self.seen[index] < count {
                self.seen[index] += 1;
                if self.interrupted.is_some() {
                    // A second signal: no more grace.
                    self.kill();
                    verdict = Verdict::Stop;
                } else {
                    self.interrupt(Interruption::Signal(INTERRUPTS[index]), INTERRUPTS[index]);
                }
            }
        }
        if self.deadline.is_some() || self.kill_at.is_some() {
            let now = Instant::now();
            if self.interrupted.is_none() && self.deadline.is_some_and(|d| now >= d) {
                self.interrupt(Interruption::Timeout, libc::SIGTERM);
            }
            if self.kill_at.is_some_and(|k| now >= k) {
                self.kill();
            }
        }
        verdict
    }

    /// Waits until one of `sockets` is readable, a signal arrives, or the
    /// next deadline passes (at most `cap`, itself at most
    /// [`signals::POLL_CAP`]).
    pub(crate) fn wait(&self, sockets: &[RawFd], cap: Duration) {
        let mut fds: Vec<libc::pollfd> = std::iter::once(signals::wake_fd().unwrap_or(-1))
            .chain(sockets.iter().copied())
            .map(|fd| libc::pollfd {
                fd,
                events: libc::POLLIN,
                revents: 0,
            })
            .collect();
        let mut wait = signals::POLL_CAP.min(cap);
        let now = Instant::now();
        let pending = [
            self.deadline.filter(|_| self.interrupted.is_none()),
            self.kill_at.filter(|_| !self.killed),
        ];
        for at in pending.into_iter().flatten() {
            wait = wait.min(at.saturating_duration_since(now));
        }
        // Round up: a timeout of 0.3 ms must not become a busy loop of 0.
        let millis = wait.as_micros().div_ceil(1000) as libc::c_int;
        // SAFETY: valid pollfd entries (a negative fd is skipped).
        let ready = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, millis) };
        if ready > 0 && fds[0].revents != 0 {
            signals::drain();
        }
    }

    /// Sends SIGKILL to the program's group now (the collector gives up:
    /// a failed write, a second signal, the end of the grace period).
    pub(crate) fn kill(&mut self) {
        if !self.killed {
            self.killed = true;
            // SAFETY: a signal to the program's process group.
            unsafe { libc::killpg(self.group, libc::SIGKILL) };
        }
    }

    fn interrupt(&mut self, why: Interruption, signal: i32) {
        self.interrupted = Some(why);
        // SAFETY: a signal to the program's process group.
        unsafe { libc::killpg(self.group, signal) };
        self.kill_at = Some(Instant::now() + self.limits.kill_after);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_read_like_timeout_1() {
        let ok = |t: &str| parse_duration(t).unwrap();
        assert_eq!(ok("2s"), Duration::from_secs(2));
        assert_eq!(ok("2"), Duration::from_secs(2));
        assert_eq!(ok("1.5m"), Duration::from_secs(90));
        assert_eq!(ok("250ms"), Duration::from_millis(250));
        assert_eq!(ok("1h"), Duration::from_secs(3600));
        assert_eq!(ok("0"), Duration::ZERO);
        for bad in ["", "s", "2x", "-1s", "1e3", "inf", "1..2s"] {
            let e = parse_duration(bad).unwrap_err();
            assert!(e.contains(&format!("{bad:?}")), "{bad}: {e}");
        }
    }
}
