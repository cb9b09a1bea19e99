//! The collector's second door: an abstract `AF_UNIX` `SOCK_SEQPACKET`
//! socket where instrumented programs that do not hold the recorder socket
//! (it is close-on-exec: every exec'd or spawned program) connect anew
//! (`protocol::LISTEN_ENV`). Abstract names are visible to the whole network
//! namespace, so the name is random and a connection is kept only from a
//! process of the same user that belongs to the traced program's process
//! group or descends from it.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

/// The listening socket and its name.
pub(crate) struct Listener {
    socket: OwnedFd,
    /// The abstract name, without its leading NUL.
    pub(crate) name: String,
}

impl Listener {
    /// A non-blocking, close-on-exec listening socket under a fresh random
    /// name; `None` where the system refuses one (exec'd programs then run
    /// untraced, counted as before).
    pub(crate) fn open() -> Option<Listener> {
        let mut random = [0u8; 16];
        // SAFETY: the buffer is valid for its length.
        let got = unsafe { libc::getrandom(random.as_mut_ptr().cast(), random.len(), 0) };
        if got != random.len() as isize {
            return None;
        }
        let name: String = std::iter::once("memgaze-".to_string())
            .chain(random.iter().map(|b| format!("{b:02x}")))
            .collect();
        // SAFETY: plain socket call; the descriptor is owned at once.
        let fd = unsafe {
            libc::socket(
                libc::AF_UNIX,
                libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK,
                0,
            )
        };
        if fd < 0 {
            return None;
        }
        // SAFETY: a fresh descriptor we own.
        let socket = unsafe { OwnedFd::from_raw_fd(fd) };
        // SAFETY: sockaddr_un is plain data; all zero is a valid value.
        let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
        addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
        for (to, &from) in addr.sun_path[1..].iter_mut().zip(name.as_bytes()) {
            *to = from as libc::c_char;
        }
        let len = std::mem::size_of::<libc::sa_family_t>() + 1 + name.len();
        // SAFETY: addr is valid for `len` bytes.
        let bound = unsafe { libc::bind(fd, (&raw const addr).cast(), len as libc::socklen_t) };
        // SAFETY: a bound socket of ours.
        if bound != 0 || unsafe { libc::listen(fd, 64) } != 0 {
            return None;
        }
        Some(Listener { socket, name })
    }

    /// The listening descriptor (to poll).
    pub(crate) fn fd(&self) -> RawFd {
        self.socket.as_raw_fd()
    }

    /// Every connection waiting, non-blocking: those of processes of the
    /// traced program (`group`: its pid, its process group's id), with the
    /// connecting pid; the count of those refused.
    pub(crate) fn accept(&self, group: u32) -> (Vec<(OwnedFd, u32)>, u64) {
        let mut accepted = Vec::new();
        let mut refused = 0;
        loop {
            // SAFETY: no address wanted; flags valid for accept4.
            let fd = unsafe {
                libc::accept4(
                    self.fd(),
                    std::ptr::null_mut(),
                    std::ptr::null_mut(),
                    libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK,
                )
            };
            if fd < 0 {
                if std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted {
                    continue;
                }
                break;
            }
            // SAFETY: a fresh descriptor we own.
            let connection = unsafe { OwnedFd::from_raw_fd(fd) };
            match peer(&connection).filter(|&(pid, uid)| {
                // SAFETY: getuid cannot fail.
                uid == unsafe { libc::getuid() } && of_the_program(pid, group)
            }) {
                Some((pid, _)) => accepted.push((connection, pid)),
                None => refused += 1,
            }
        }
        (accepted, refused)
    }
}

/// The connecting process's pid and uid (`SO_PEERCRED`).
fn peer(connection: &OwnedFd) -> Option<(u32, u32)> {
    // SAFETY: ucred is plain data; all zero is a valid value.
    let mut cred: libc::ucred = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: cred is valid for len bytes.
    let got = unsafe {
        libc::getsockopt(
            connection.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&raw mut cred).cast(),
            &raw mut len,
        )
    };
    (got == 0 && cred.pid > 0).then_some((cred.pid as u32, cred.uid))
}

/// Whether `pid` is in process group `group` or descends from process
/// `group` (by the parent links in `/proc`). A process already gone (a
/// short-lived child that connected, sent everything and was reaped before
/// the accept) cannot be checked: it is taken (its user was checked by the
/// kernel's `SO_PEERCRED`).
fn of_the_program(pid: u32, group: u32) -> bool {
    let mut p = pid;
    for step in 0..4096 {
        let Some((parent, pgid)) = stat_links(p) else {
            return step == 0;
        };
        if p == group || pgid == group {
            return true;
        }
        if parent <= 1 {
            return false;
        }
        p = parent;
    }
    false
}

/// Parent pid and process group of `pid` from `/proc/<pid>/stat`.
fn stat_links(pid: u32) -> Option<(u32, u32)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name may hold spaces and parentheses: fields follow the
    // last `)`.
    let rest = &stat[stat.rfind(')')? + 1..];
    let mut fields = rest.split_whitespace();
    let _state = fields.next()?;
    let parent = fields.next()?.parse().ok()?;
    let pgid = fields.next()?.parse().ok()?;
    Some((parent, pgid))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn connect(name: &str) -> OwnedFd {
        // SAFETY: plain socket call.
        let fd = unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_SEQPACKET, 0) };
        assert!(fd >= 0);
        // SAFETY: a fresh descriptor we own.
        let socket = unsafe { OwnedFd::from_raw_fd(fd) };
        // SAFETY: all zero is valid.
        let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
        addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
        for (to, &from) in addr.sun_path[1..].iter_mut().zip(name.as_bytes()) {
            *to = from as libc::c_char;
        }
        let len = std::mem::size_of::<libc::sa_family_t>() + 1 + name.len();
        // SAFETY: addr valid for len.
        let r = unsafe { libc::connect(fd, (&raw const addr).cast(), len as libc::socklen_t) };
        assert_eq!(r, 0, "{}", std::io::Error::last_os_error());
        socket
    }

    #[test]
    fn a_connection_of_the_program_is_kept_and_a_strangers_refused() {
        let a = Listener::open().expect("listener");
        let b = Listener::open().expect("listener");
        assert_ne!(a.name, b.name, "names are random");
        assert_eq!(a.name.len(), "memgaze-".len() + 32);
        let _ours = connect(&a.name);
        let me = std::process::id();
        let (kept, refused) = a.accept(me);
        assert_eq!((kept.len(), refused), (1, 0));
        assert_eq!(kept[0].1, me);
        // This process neither descends from pid 1's group nor is in it.
        let _stranger = connect(&a.name);
        let (kept, refused) = a.accept(u32::MAX);
        assert_eq!((kept.len(), refused), (0, 1));
    }

    #[test]
    fn a_process_descends_from_its_ancestors_only() {
        let me = std::process::id();
        let parent = stat_links(me).expect("own stat").0;
        assert!(of_the_program(me, parent));
        assert!(!of_the_program(parent, me));
    }
}
