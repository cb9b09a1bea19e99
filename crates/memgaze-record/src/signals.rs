//! SIGINT, SIGTERM, SIGHUP and SIGQUIT while a program is being recorded.
//!
//! While at least one `Catch` guard lives, these signals are caught
//! by a handler that does only async-signal-safe work: it bumps a
//! per-signal counter and writes one byte to a pipe (the self-pipe trick).
//! The collector polls the pipe's read end beside the recorder socket, so a
//! signal wakes it at once; it learns *which* signals came from the
//! counters (`received`), not from the bytes, so several recordings in
//! one process (the library's tests) can share the pipe: whichever drains
//! it, each compares the counters with its own snapshot (and polls with a
//! bounded timeout, `POLL_CAP`, in case another drained the byte meant to
//! wake it).
//!
//! A caught signal's disposition is reset to the default by `exec`, so the
//! program starts with the signals it would have had (the spawn resets
//! `SIG_IGN` ones too). The first guard also ignores `SIGXFSZ`, for the
//! rest of the process: a trace written past `ulimit -f` then fails with
//! `EFBIG` and one error line instead of killing `cargo memgaze` silently
//! (the shared record buffers' `ftruncate` is subject to the limit too).

use std::os::fd::RawFd;
use std::sync::Mutex;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, Ordering};
use std::time::Duration;

/// The signals a recording catches and forwards to the program. SIGQUIT
/// (the terminal's `^\\`) is one of them: its default action would kill
/// `cargo memgaze` with a core dump and lose the trace.
pub const INTERRUPTS: [i32; SIGNALS] = [libc::SIGINT, libc::SIGTERM, libc::SIGHUP, libc::SIGQUIT];

/// How many signals [`INTERRUPTS`] holds.
pub const SIGNALS: usize = 4;

/// Longest a collector sleeps in `poll` without looking at the counters
/// (see the module documentation).
pub(crate) const POLL_CAP: Duration = Duration::from_millis(250);

/// Signals received so far, per entry of [`INTERRUPTS`].
static RECEIVED: [AtomicU64; SIGNALS] = [const { AtomicU64::new(0) }; SIGNALS];

/// The write end of the self-pipe (-1 until it exists). Read by the handler.
static PIPE_WRITE: AtomicI32 = AtomicI32::new(-1);

/// The self-pipe, made once and kept for the life of the process: closing
/// it could let a handler running in another thread write its byte into
/// whatever file reused the descriptor number.
static PIPE: OnceLock<Option<(RawFd, RawFd)>> = OnceLock::new();

/// Set once a guard asked to keep the handler for good.
static KEPT: AtomicBool = AtomicBool::new(false);

/// Guards alive, and the dispositions they replaced.
static INSTALLED: Mutex<Installed> = Mutex::new(Installed {
    guards: 0,
    previous: Vec::new(),
});

struct Installed {
    guards: usize,
    previous: Vec<(i32, libc::sigaction)>,
}

// SAFETY (for the `Send` the Mutex needs): `sigaction` is plain data.
unsafe impl Send for Installed {}

extern "C" fn on_signal(signal: libc::c_int) {
    // Only atomics and write(2) here: both async-signal-safe. errno is
    // saved because the interrupted code may be about to read it.
    // SAFETY: __errno_location is this thread's errno.
    let saved = unsafe { *libc::__errno_location() };
    if let Some(index) = INTERRUPTS.iter().position(|&s| s == signal) {
        RECEIVED[index].fetch_add(1, Ordering::SeqCst);
    }
    let fd = PIPE_WRITE.load(Ordering::SeqCst);
    if fd >= 0 {
        let byte = signal as u8;
        // SAFETY: a valid pipe descriptor that is never closed; the write
        // is non-blocking (a full pipe already wakes the reader).
        unsafe { libc::write(fd, (&byte as *const u8).cast(), 1) };
    }
    // SAFETY: as above.
    unsafe { *libc::__errno_location() = saved };
}

/// The self-pipe's read end (non-blocking), made on first use; `None` if
/// the pipe cannot be made (then only the [`POLL_CAP`] timeout notices
/// signals).
pub(crate) fn wake_fd() -> Option<RawFd> {
    PIPE.get_or_init(|| {
        let mut fds = [0; 2];
        // SAFETY: fds has room for two descriptors.
        if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC | libc::O_NONBLOCK) } != 0 {
            return None;
        }
        PIPE_WRITE.store(fds[1], Ordering::SeqCst);
        Some((fds[0], fds[1]))
    })
    .map(|(read, _)| read)
}

/// Empties the self-pipe (its bytes only wake; the counters tell).
pub(crate) fn drain() {
    if let Some(fd) = wake_fd() {
        let mut buffer = [0u8; 64];
        // SAFETY: non-blocking reads into a local buffer.
        while unsafe { libc::read(fd, buffer.as_mut_ptr().cast(), buffer.len()) } > 0 {}
    }
}

/// Signals of [`INTERRUPTS`] received so far (counts, in that order).
pub fn received() -> [u64; SIGNALS] {
    std::array::from_fn(|i| RECEIVED[i].load(Ordering::SeqCst))
}

/// The first signal of [`INTERRUPTS`] received since `before` (a
/// [`received`] snapshot), if any.
pub(crate) fn first_since(before: [u64; SIGNALS]) -> Option<i32> {
    let now = received();
    (0..SIGNALS)
        .find(|&i| now[i] > before[i])
        .map(|i| INTERRUPTS[i])
}

/// A whole command's watch for `INTERRUPTS`: they are caught (not
/// fatal) for as long as it lives, and [`Watch::signal`] tells whether one
/// came since it started. Commands that record hold one so that a signal
/// arriving outside a recording (while instrumenting, analysing, between
/// benches) stops them cleanly at the next check instead of killing them
/// halfway through writing something; during a recording the recorder
/// forwards it to the program.
pub struct Watch {
    _catch: Catch,
    before: [u64; SIGNALS],
}

impl Watch {
    /// Starts watching.
    pub fn start() -> Watch {
        let catch = Catch::install();
        Watch {
            _catch: catch,
            before: received(),
        }
    }

    /// The first signal received since the watch started, if any.
    pub fn signal(&self) -> Option<i32> {
        first_since(self.before)
    }

    /// The exit code for a signal received since the watch started (128 +
    /// N), with a line saying what was cut short; `None` without one.
    pub fn stopped(&self, what: &str) -> Option<i32> {
        let signal = self.signal()?;
        eprintln!(
            "memgaze: interrupted by {} {what}",
            memgaze_trace::Interruption::Signal(signal).name()
        );
        Some(128 + signal)
    }
}

/// Catches [`INTERRUPTS`] (and ignores `SIGXFSZ`) while it lives.
///
/// The last guard dropped restores the previous dispositions, unless
/// `keep` was called on any guard: after an interruption the command is on
/// its way out, and a second signal must not kill it while it finishes the
/// trace (it is counted and stops the next recording at once instead).
pub(crate) struct Catch {
    keep: bool,
}

impl Catch {
    /// Installs the handler (the first guard does) and returns a guard.
    pub(crate) fn install() -> Catch {
        wake_fd();
        let mut installed = INSTALLED.lock().unwrap_or_else(|e| e.into_inner());
        if installed.guards == 0 && installed.previous.is_empty() {
            for signal in INTERRUPTS {
                let previous =
                    set_disposition(signal, on_signal as extern "C" fn(libc::c_int) as usize);
                if signal == libc::SIGHUP && previous.sa_sigaction == libc::SIG_IGN {
                    // `nohup`: keep ignoring it, as the program would have.
                    // (A background job's ignored SIGINT is not kept: it is
                    // about the terminal's ^C, which no longer reaches the
                    // program's own process group, while `kill -INT` must
                    // still stop the recording.)
                    // SAFETY: restoring what sigaction returned.
                    unsafe { libc::sigaction(signal, &previous, std::ptr::null_mut()) };
                }
                installed.previous.push((signal, previous));
            }
            // Not restored: the trace is finished (and its buffer
            // flushed) after the last guard is gone, and `cargo memgaze`
            // never wants to die of SIGXFSZ.
            set_disposition(libc::SIGXFSZ, libc::SIG_IGN);
        }
        installed.guards += 1;
        Catch { keep: false }
    }

    /// Leaves the handler installed for the rest of the process.
    pub(crate) fn keep(&mut self) {
        self.keep = true;
    }
}

impl Drop for Catch {
    fn drop(&mut self) {
        let mut installed = INSTALLED.lock().unwrap_or_else(|e| e.into_inner());
        installed.guards -= 1;
        if self.keep {
            KEPT.store(true, Ordering::SeqCst);
        }
        if installed.guards == 0 && !KEPT.load(Ordering::SeqCst) {
            for (signal, action) in installed.previous.drain(..) {
                // SAFETY: restoring a disposition sigaction returned.
                unsafe { libc::sigaction(signal, &action, std::ptr::null_mut()) };
            }
        }
    }
}

fn zeroed_action() -> libc::sigaction {
    // SAFETY: sigaction is plain data; all zeroes is SIG_DFL.
    unsafe { std::mem::zeroed() }
}

/// Sets `signal`'s handler (`SA_RESTART`, so other threads' system calls
/// are not disturbed) and returns the previous disposition.
fn set_disposition(signal: i32, handler: libc::sighandler_t) -> libc::sigaction {
    let mut action = zeroed_action();
    action.sa_sigaction = handler;
    action.sa_flags = libc::SA_RESTART;
    // SAFETY: a valid, empty mask.
    unsafe { libc::sigemptyset(&mut action.sa_mask) };
    let mut previous = zeroed_action();
    // SAFETY: valid action structures.
    unsafe { libc::sigaction(signal, &action, &mut previous) };
    previous
}
