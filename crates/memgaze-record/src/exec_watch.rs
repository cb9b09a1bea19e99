//! How long exec'd, untraced programs ran. A process that sends an `Exec`
//! message is about to become another program; when that program is not
//! instrumented (it never joins the trace), its run is time the trace does
//! not cover. The recorder is not its parent, so a `pidfd` (Linux ≥ 5.3)
//! tells when it ends: readable once the process has exited, reaped or
//! not. The time counted is wall time from the `Exec` message's arrival to
//! the exit (the `exec` itself included); a program still running when the
//! recording ends counts until then.

use std::collections::HashMap;
use std::os::fd::{FromRawFd, OwnedFd, RawFd};
use std::sync::mpsc::{self, Receiver, Sender, TryRecvError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Watches the processes that sent an `Exec` for their exit, on a thread of
/// its own.
pub(crate) struct ExecWatch {
    /// Process ids to watch, with the `Exec` message's arrival; `None`
    /// ends the watch.
    sender: Sender<Option<(u32, Instant)>>,
    thread: JoinHandle<HashMap<u32, Ended>>,
}

/// When a watched process's `Exec` arrived and when it ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Ended {
    /// Arrival of the `Exec` message.
    pub exec: Instant,
    /// The exit seen (`None`: still running when the watch ended).
    pub exit: Option<Instant>,
}

/// How often the watch thread looks for new processes while it waits.
const TICK: Duration = Duration::from_millis(20);

impl ExecWatch {
    /// Starts the watch thread.
    pub(crate) fn start() -> ExecWatch {
        let (sender, receiver) = mpsc::channel();
        let thread = std::thread::spawn(move || watch(&receiver));
        ExecWatch { sender, thread }
    }

    /// Watches `pid`, whose `Exec` message arrived `at`.
    pub(crate) fn add(&self, pid: u32, at: Instant) {
        // The thread outlives every sender call (it ends on `None`).
        let _ = self.sender.send(Some((pid, at)));
    }

    /// Ends the watch: every process watched, by pid (the last `Exec` of
    /// each).
    pub(crate) fn finish(self) -> HashMap<u32, Ended> {
        let _ = self.sender.send(None);
        self.thread.join().unwrap_or_default()
    }
}

/// The watch thread: pidfds polled for readability.
fn watch(receiver: &Receiver<Option<(u32, Instant)>>) -> HashMap<u32, Ended> {
    let mut ended: HashMap<u32, Ended> = HashMap::new();
    let mut open: Vec<(u32, OwnedFd)> = Vec::new();
    loop {
        let mut stop = false;
        loop {
            let next = if open.is_empty() {
                match receiver.recv_timeout(TICK) {
                    Ok(next) => next,
                    Err(_) => break,
                }
            } else {
                match receiver.try_recv() {
                    Ok(next) => next,
                    Err(TryRecvError::Empty) => break,
                    Err(TryRecvError::Disconnected) => None,
                }
            };
            let Some((pid, exec)) = next else {
                stop = true;
                break;
            };
            open.retain(|(p, _)| *p != pid);
            match pidfd_open(pid) {
                Some(fd) => {
                    ended.insert(pid, Ended { exec, exit: None });
                    open.push((pid, fd));
                }
                // Gone already: it ended between its message and now.
                None => {
                    ended.insert(
                        pid,
                        Ended {
                            exec,
                            exit: Some(Instant::now()),
                        },
                    );
                }
            }
        }
        if !open.is_empty() {
            let mut fds: Vec<libc::pollfd> = open
                .iter()
                .map(|(_, fd)| libc::pollfd {
                    fd: std::os::fd::AsRawFd::as_raw_fd(fd),
                    events: libc::POLLIN,
                    revents: 0,
                })
                .collect();
            let timeout = if stop { 0 } else { TICK.as_millis() as i32 };
            // SAFETY: `fds` is valid for its length.
            let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, timeout) };
            if n > 0 {
                let now = Instant::now();
                let mut i = 0;
                open.retain(|(pid, _)| {
                    let done = fds[i].revents != 0;
                    i += 1;
                    if done && let Some(e) = ended.get_mut(pid) {
                        e.exit = Some(now);
                    }
                    !done
                });
            }
        }
        if stop {
            return ended;
        }
    }
}

/// A pidfd for `pid`, or `None` if it is gone (or pidfds are unsupported).
fn pidfd_open(pid: u32) -> Option<OwnedFd> {
    // SAFETY: a plain system call; the descriptor returned is ours.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0) };
    (fd >= 0).then(|| unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A child that sleeps 0.3 s is seen ending after about that long (not
    /// when it is reaped, 1.5 s in).
    #[test]
    fn exits_are_seen() {
        let watch = ExecWatch::start();
        let mut child = std::process::Command::new("sleep")
            .arg("0.3")
            .spawn()
            .unwrap();
        let start = Instant::now();
        watch.add(child.id(), start);
        std::thread::sleep(Duration::from_millis(1500));
        child.wait().unwrap();
        let ended = watch.finish();
        let e = ended[&child.id()];
        let took = e.exit.unwrap() - e.exec;
        assert!(took >= Duration::from_millis(250), "{took:?}");
        assert!(took < Duration::from_millis(1400), "{took:?}");
    }
}
