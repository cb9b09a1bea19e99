//! The opt-in phase timer (`MEMGAZE_TIMINGS`): with the variable set to
//! anything but empty or `0`, each phase of instrumenting a file prints
//! one line to stderr as it ends:
//!
//! ```text
//! memgaze timings: <phase>  <start>-<end> s  wall <W> s  cpu <C> s (<C/W> cores)  own <T> s
//! ```
//!
//! `start` and `end` are wall seconds since instrumenting began, `cpu` the
//! whole process's CPU time during the phase and `own` the CPU time of the
//! thread that ran it. A phase whose `own` is about its `cpu` ran on one
//! thread while the other cores had nothing of this process to do (its
//! serial wall is what the other cores wait for), whatever the machine's
//! load. Phases run beside each other (on other threads) overlap in wall.
//! Off, a phase costs one atomic load.

use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// When instrumenting began, if timings are on (read once per process).
static BEGAN: OnceLock<Option<Instant>> = OnceLock::new();

/// Whether `MEMGAZE_TIMINGS` asks for timings: set, not empty, not `0`.
fn wanted() -> bool {
    std::env::var_os("MEMGAZE_TIMINGS").is_some_and(|v| !v.is_empty() && v != "0")
}

/// Starts the clock phases are measured from (the first call does; later
/// ones keep it), if timings are on.
pub(crate) fn begin() {
    let _ = BEGAN.get_or_init(|| wanted().then(Instant::now));
}

/// A phase under way: its line is printed when it is dropped. `None`
/// unless timings are on.
#[must_use = "the phase ends when this is dropped"]
pub(crate) struct Phase {
    name: &'static str,
    began: Instant,
    start: Instant,
    process_cpu: Duration,
    thread_cpu: Duration,
}

/// Starts timing the phase `name` (printed when the result is dropped).
pub(crate) fn phase(name: &'static str) -> Option<Phase> {
    let began = (*BEGAN.get()?)?;
    Some(Phase {
        name,
        began,
        start: Instant::now(),
        process_cpu: cpu_time(libc::CLOCK_PROCESS_CPUTIME_ID),
        thread_cpu: cpu_time(libc::CLOCK_THREAD_CPUTIME_ID),
    })
}

/// Phases one after the other: each starts as the one before ends (the
/// last ends when this is dropped).
pub(crate) struct Phases(Option<Phase>);

/// Starts timing `first` of a sequence of phases.
pub(crate) fn phases(first: &'static str) -> Phases {
    Phases(phase(first))
}

impl Phases {
    /// Ends the phase under way and starts `name`.
    pub(crate) fn next(&mut self, name: &'static str) {
        self.0 = None;
        self.0 = phase(name);
    }

    /// Ends the phase under way.
    pub(crate) fn end(&mut self) {
        self.0 = None;
    }
}

impl Drop for Phase {
    fn drop(&mut self) {
        let end = Instant::now();
        let wall = end - self.start;
        let cpu = cpu_time(libc::CLOCK_PROCESS_CPUTIME_ID).saturating_sub(self.process_cpu);
        let own = cpu_time(libc::CLOCK_THREAD_CPUTIME_ID).saturating_sub(self.thread_cpu);
        let cores = cpu.as_secs_f64() / wall.as_secs_f64().max(1e-9);
        eprintln!(
            "memgaze timings: {:<34} {:7.3}-{:7.3} s  wall {:6.3} s  cpu {:6.3} s ({cores:4.2} cores)  own {:6.3} s",
            self.name,
            (self.start - self.began).as_secs_f64(),
            (end - self.began).as_secs_f64(),
            wall.as_secs_f64(),
            cpu.as_secs_f64(),
            own.as_secs_f64(),
        );
    }
}

/// The CPU time `clock` has counted (zero if it cannot be read).
fn cpu_time(clock: libc::clockid_t) -> Duration {
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `now` is a valid timespec for the call to fill.
    if unsafe { libc::clock_gettime(clock, &mut now) } != 0 {
        return Duration::ZERO;
    }
    Duration::new(now.tv_sec as u64, now.tv_nsec as u32)
}
