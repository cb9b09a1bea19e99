//! Progress of the commands that run a suite of benches (`bench`, `golden`,
//! `validate`): an indicatif bar on a terminal, plain status lines on
//! stderr otherwise, nothing but errors with `-q`.
//!
//! A long step must not look like a hang: on a terminal the bar's clock
//! keeps ticking while a bench records; in a log (CI), a step still under
//! way after a minute says so, and again every minute after, as
//! cargo-nextest's `SLOW` lines do.

use super::style::{Stream, enabled, paint_line};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use std::io::{IsTerminal, Write};
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How long a step runs before a log says it is still running (and how
/// often it says so again).
const STILL_RUNNING_EVERY: Duration = Duration::from_secs(60);

/// How often the bar's clock is redrawn on a terminal.
const TICK: Duration = Duration::from_millis(250);

/// Status output on stderr for a run of `total` steps.
pub struct Progress {
    bar: ProgressBar,
    /// Present where status lines are printed (no bar on stderr, not
    /// quiet): says in the log when a step runs long.
    lines: Option<StepWatch>,
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
        if !bar.is_hidden() {
            bar.enable_steady_tick(TICK);
        }
        let lines = (!quiet && !terminal)
            .then(|| StepWatch::new(STILL_RUNNING_EVERY, Box::new(std::io::stderr())));
        Progress { bar, lines }
    }

    /// A step begins: `verb` (`Recording`) what (`microbenches/micro str1`).
    pub fn start(&self, verb: &str, what: &str) {
        self.bar.set_prefix(verb.to_string());
        self.bar.set_message(what.to_string());
        if let Some(watch) = &self.lines {
            eprintln!("{verb:>12} {what}");
            watch.start(verb, what);
        }
    }

    /// The current step is done.
    pub fn advance(&self) {
        self.bar.inc(1);
        if let Some(watch) = &self.lines {
            watch.stop();
        }
    }

    /// Prints a note on stderr above the bar (not with `-q`).
    pub fn note(&self, line: &str) {
        if self.lines.is_some() || !self.bar.is_hidden() {
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
        if let Some(watch) = &self.lines {
            watch.stop();
        }
    }
}

/// A thread that writes `<verb> <what> still running after <N> s` each
/// `every` while one step lasts.
struct StepWatch {
    shared: Arc<(Mutex<WatchState>, Condvar)>,
    thread: Option<JoinHandle<()>>,
}

/// The step being watched, shared with the watching thread.
#[derive(Default)]
struct WatchState {
    /// The step under way: its verb and what, and when it began.
    step: Option<(String, String, Instant)>,
    /// Counts steps, so the thread knows a line is about a step still on.
    generation: u64,
    /// The watch is being dropped.
    ended: bool,
}

impl StepWatch {
    fn new(every: Duration, mut out: Box<dyn Write + Send>) -> StepWatch {
        let shared = Arc::new((Mutex::new(WatchState::default()), Condvar::new()));
        let watched = Arc::clone(&shared);
        let thread = std::thread::Builder::new()
            .name("memgaze-progress".into())
            .spawn(move || watch_steps(&watched, every, &mut *out))
            .ok();
        StepWatch { shared, thread }
    }

    fn start(&self, verb: &str, what: &str) {
        self.update(|state| {
            state.step = Some((verb.to_string(), what.to_string(), Instant::now()));
        });
    }

    fn stop(&self) {
        self.update(|state| state.step = None);
    }

    fn update(&self, change: impl FnOnce(&mut WatchState)) {
        let (state, changed) = &*self.shared;
        let mut state = state.lock().unwrap_or_else(PoisonError::into_inner);
        change(&mut state);
        state.generation += 1;
        changed.notify_one();
    }
}

impl Drop for StepWatch {
    fn drop(&mut self) {
        self.update(|state| state.ended = true);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// The watching thread: sleeps until the step under way has run another
/// `every`, writes its line, and starts over whenever the step changes.
fn watch_steps(shared: &(Mutex<WatchState>, Condvar), every: Duration, out: &mut dyn Write) {
    let (state, changed) = shared;
    let mut state = state.lock().unwrap_or_else(PoisonError::into_inner);
    loop {
        if state.ended {
            return;
        }
        let Some((_, _, began)) = &state.step else {
            state = changed.wait(state).unwrap_or_else(PoisonError::into_inner);
            continue;
        };
        let generation = state.generation;
        let ran = began.elapsed();
        // The next whole multiple of `every` since the step began.
        let periods = (ran.as_nanos() / every.as_nanos().max(1)) as u32 + 1;
        let due = every.saturating_mul(periods).saturating_sub(ran);
        let (next, timeout) = changed
            .wait_timeout(state, due)
            .unwrap_or_else(PoisonError::into_inner);
        state = next;
        if timeout.timed_out()
            && state.generation == generation
            && let Some((verb, what, began)) = &state.step
        {
            let _ = writeln!(
                out,
                "{verb:>12} {what} still running after {} s",
                began.elapsed().as_secs()
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A sink the test reads back.
    #[derive(Clone, Default)]
    struct Captured(Arc<Mutex<Vec<u8>>>);

    impl Write for Captured {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(bytes);
            Ok(bytes.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl Captured {
        fn text(&self) -> String {
            String::from_utf8(self.0.lock().unwrap().clone()).unwrap()
        }
    }

    #[test]
    fn a_long_step_is_said_to_be_still_running_each_period() {
        let captured = Captured::default();
        let watch = StepWatch::new(Duration::from_millis(40), Box::new(captured.clone()));
        watch.start("Recording", "micro str1");
        std::thread::sleep(Duration::from_millis(190));
        watch.stop();
        drop(watch);
        let text = captured.text();
        let lines: Vec<&str> = text.lines().collect();
        assert!(lines.len() >= 2, "{text:?}");
        for line in lines {
            assert!(
                line.starts_with("   Recording micro str1 still running after "),
                "{line:?}"
            );
        }
    }

    #[test]
    fn steps_that_end_in_time_say_nothing() {
        let captured = Captured::default();
        let watch = StepWatch::new(Duration::from_secs(5), Box::new(captured.clone()));
        for case in ["str1", "str2", "irr1"] {
            watch.start("Recording", case);
            watch.stop();
        }
        watch.start("Recording", "irr2");
        drop(watch);
        assert_eq!(captured.text(), "");
    }

    #[test]
    fn a_new_step_restarts_the_period() {
        let captured = Captured::default();
        let watch = StepWatch::new(Duration::from_millis(150), Box::new(captured.clone()));
        // Each step ends well before its period: nothing is said, although
        // the steps together outlast it.
        for case in ["a", "b", "c", "d", "e", "f"] {
            watch.start("Tracing", case);
            std::thread::sleep(Duration::from_millis(40));
        }
        watch.stop();
        drop(watch);
        assert_eq!(captured.text(), "");
    }
}
