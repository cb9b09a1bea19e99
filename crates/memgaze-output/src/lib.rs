//! Outputs written whole or not at all, only where they were asked for.
//!
//! Every file cargo memgaze writes (traces, analyses, reports, snapshots,
//! annotations, instrumented executables, baselines) goes through
//! [`AtomicFile`] or [`write_atomic`]: the bytes go to a fresh temporary
//! file in the destination's directory (created with `O_EXCL`, so a planted
//! file or link of that name is never followed) and are renamed over the
//! destination only once complete. A reader sees the old file or the new
//! one, never half of one; an interrupted or failed write leaves the old
//! file (or nothing) and no 0-byte output.
//!
//! [`check_output`] is what a command calls for an output it writes late,
//! before it starts the program: a destination that is a directory, a
//! read-only file, in a directory that cannot be written, or a symbolic link
//! pointing out of its directory fails at once with one line naming it.
//!
//! This is a crate of its own, below every crate that writes files, so the
//! trace writer, the annotation and the command layer share one rule.

#![warn(missing_docs)]

use std::fs::{File, Permissions};
use std::io;
use std::io::{BufWriter, Write};
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::path::{Path, PathBuf};
use tempfile::{TempDir, TempPath};

mod staged;
use staged::StagedSlot;
pub use staged::{ENDING_SIGNALS, SLOTS as STAGED_SLOTS, remove_staged_files_on_signals};

/// Why an output cannot be written. The message names the destination as
/// the user gave it.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OutputError {
    /// The destination is refused before anything is written: a directory,
    /// a read-only file, a missing or unwritable directory, a symbolic link
    /// out of its directory.
    #[error("{}: {reason}", path.display())]
    Refused {
        /// The destination as named.
        path: PathBuf,
        /// Why, as a person reads it.
        reason: String,
    },
    /// An operation on the destination or its temporary file failed.
    #[error("{}: {what}", path.display())]
    Io {
        /// The destination as named.
        path: PathBuf,
        /// What could not be done (`cannot write`).
        what: String,
        /// The system's reason.
        #[source]
        source: io::Error,
    },
}

/// The result of this crate's functions.
pub type Result<T> = std::result::Result<T, OutputError>;

fn refused(path: &Path, reason: String) -> OutputError {
    OutputError::Refused {
        path: path.to_path_buf(),
        reason,
    }
}

fn io_error(path: &Path, what: impl Into<String>) -> impl FnOnce(io::Error) -> OutputError {
    let path = path.to_path_buf();
    let what = what.into();
    move |source| OutputError::Io { path, what, source }
}

/// Mode of ordinary outputs before the umask (as `File::create` uses).
pub(crate) const FILE_MODE: u32 = 0o666;
/// Mode of executable outputs before the umask.
pub const EXECUTABLE_MODE: u32 = 0o777;

/// Where an output really goes: `path`, or for a symbolic link to a file in
/// the same directory, the file it points to.
///
/// Refused, with one line naming `path`: a directory, an existing file this
/// user may not write, a parent directory that does not exist or cannot be
/// written, and a symbolic link whose target lies outside `path`'s
/// directory (or that dangles).
pub fn check_output(path: &Path) -> Result<PathBuf> {
    let target = resolve_link(path)?;
    if in_place(&target) {
        return Ok(target);
    }
    match std::fs::metadata(&target) {
        Ok(meta) if meta.is_dir() => {
            return Err(refused(path, "cannot write: is a directory".to_string()));
        }
        Ok(meta) if meta.is_file() => {
            if !writable(&target) {
                return Err(refused(
                    path,
                    "cannot write: permission denied (the file is read-only)".to_string(),
                ));
            }
        }
        // A device or FIFO (`-o /dev/null`) is written in place.
        Ok(_) => return Ok(target),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(io_error(path, "cannot write")(e)),
    }
    let dir = parent_dir(&target);
    match std::fs::metadata(dir) {
        Ok(meta) if meta.is_dir() => {}
        Ok(_) => {
            return Err(refused(
                path,
                format!("cannot write: {} is not a directory", dir.display()),
            ));
        }
        Err(e) => {
            return Err(io_error(
                path,
                format!("cannot write: directory {}", dir.display()),
            )(e));
        }
    }
    if !writable(dir) {
        return Err(refused(
            path,
            format!(
                "cannot write: permission denied in directory {}",
                dir.display()
            ),
        ));
    }
    Ok(target)
}

/// `path`'s directory (`.` for a bare file name).
fn parent_dir(path: &Path) -> &Path {
    match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir,
        _ => Path::new("."),
    }
}

/// `path` itself, or the file a symbolic link at `path` points to when it
/// stays within `path`'s directory (see [`check_output`]).
fn resolve_link(path: &Path) -> Result<PathBuf> {
    match std::fs::symlink_metadata(path) {
        Ok(meta) if meta.file_type().is_symlink() => {}
        _ => return Ok(path.to_path_buf()),
    }
    if in_place(path) {
        return Ok(path.to_path_buf());
    }
    let dir = parent_dir(path);
    let link = std::fs::read_link(path).unwrap_or_default();
    let refuse = |why: &str| -> Result<PathBuf> {
        Err(refused(
            path,
            format!(
                "refusing to write through a symbolic link to {} ({why})",
                link.display()
            ),
        ))
    };
    let Ok(resolved) = std::fs::canonicalize(path) else {
        return refuse("it dangles");
    };
    let Ok(home) = std::fs::canonicalize(dir) else {
        return refuse("its directory cannot be resolved");
    };
    if resolved.parent().is_some_and(|p| p.starts_with(&home)) {
        Ok(resolved)
    } else {
        refuse(&format!("outside {}", dir.display()))
    }
}

/// Whether `path` is written in place rather than replaced: a device or
/// pipe (`-o /dev/null`; renaming over it would replace the device), or one
/// of this process's open files (`-o /dev/stdout`, `/dev/fd/N`, which the
/// caller opened and asked for).
fn in_place(path: &Path) -> bool {
    let own_fd = ["/dev/stdout", "/dev/stderr", "/dev/fd/", "/proc/self/fd/"]
        .iter()
        .any(|p| path.as_os_str().to_string_lossy().starts_with(p));
    own_fd
        || std::fs::metadata(path).is_ok_and(|m| {
            let kind = m.file_type();
            kind.is_char_device() || kind.is_fifo()
        })
}

/// Whether this process may write `path` (`access(2)`, `W_OK`).
fn writable(path: &Path) -> bool {
    use std::os::unix::ffi::OsStrExt;
    let Ok(c_path) = std::ffi::CString::new(path.as_os_str().as_bytes()) else {
        return false;
    };
    // SAFETY: a valid NUL-terminated path; access only reads it.
    unsafe { libc::access(c_path.as_ptr(), libc::W_OK) == 0 }
}

/// An output file being written: a temporary file beside the destination,
/// renamed over it by [`AtomicFile::commit`]. Dropped without a commit, it
/// removes the temporary file and leaves the destination as it was.
///
/// Writes are buffered; their errors name the destination.
#[must_use = "an AtomicFile that is not committed is discarded"]
pub struct AtomicFile {
    out: BufWriter<File>,
    /// The temporary file (`None` for a device or FIFO written in place).
    temp: Option<TempPath>,
    /// The destination, as the user named it (for messages).
    named: PathBuf,
    /// The destination after [`check_output`] resolved links.
    target: PathBuf,
    /// The temporary file's place among those a signal removes.
    staged: StagedSlot,
}

impl AtomicFile {
    /// Starts writing an ordinary output (mode 0666 less the umask, or the
    /// replaced file's mode).
    pub fn create(path: &Path) -> Result<AtomicFile> {
        AtomicFile::create_with_mode(path, FILE_MODE)
    }

    /// Starts writing an output with `mode` (less the umask) when it is new,
    /// or the replaced file's mode when it exists; [`EXECUTABLE_MODE`]
    /// also keeps a replaced file executable.
    pub fn create_with_mode(path: &Path, mode: u32) -> Result<AtomicFile> {
        let target = check_output(path)?;
        let existing = std::fs::metadata(&target).ok();
        if in_place(&target) || existing.as_ref().is_some_and(|m| !m.is_file()) {
            if in_place(&target) {
                let file = std::fs::OpenOptions::new()
                    .write(true)
                    .open(&target)
                    .map_err(io_error(path, "cannot write"))?;
                return Ok(AtomicFile {
                    out: BufWriter::with_capacity(1 << 16, file),
                    temp: None,
                    named: path.to_path_buf(),
                    target,
                    staged: StagedSlot::none(),
                });
            }
            return Err(refused(
                path,
                "cannot write: not a regular file".to_string(),
            ));
        }
        let name = target
            .file_name()
            .map_or_else(|| "output".into(), |n| n.to_string_lossy().into_owned());
        let temp = tempfile::Builder::new()
            .prefix(&format!(".{name}."))
            .suffix(".tmp")
            .permissions(Permissions::from_mode(mode))
            .tempfile_in(parent_dir(&target))
            .map_err(io_error(path, "cannot write"))?;
        if let Some(meta) = &existing {
            let mut keep = meta.permissions().mode() & 0o7777;
            if mode & 0o111 != 0 {
                // Execute wherever the old file could be read (`r` moved
                // onto `x`), and at least for the owner.
                keep |= 0o111 & ((keep >> 2) | 0o100);
            }
            std::fs::set_permissions(temp.path(), Permissions::from_mode(keep))
                .map_err(io_error(path, "cannot write"))?;
        }
        let staged = StagedSlot::hold(temp.path());
        let (file, temp) = temp.into_parts();
        Ok(AtomicFile {
            out: BufWriter::with_capacity(1 << 16, file),
            temp: Some(temp),
            named: path.to_path_buf(),
            target,
            staged,
        })
    }

    /// The destination as it was named.
    pub fn path(&self) -> &Path {
        &self.named
    }

    /// The temporary file, for writes at offsets (`pwrite`), after what
    /// was written through [`Write`]; `None` for a device or FIFO written
    /// in place, which may not take them.
    pub fn regular_file(&mut self) -> Result<Option<&File>> {
        if self.temp.is_none() {
            return Ok(None);
        }
        self.out
            .flush()
            .map_err(io_error(&self.named, "cannot write"))?;
        Ok(Some(self.out.get_ref()))
    }

    /// Flushes and renames the file into place.
    pub fn commit(self) -> Result<()> {
        // `_staged` keeps the temporary file removable by a signal until
        // it is in place.
        let AtomicFile {
            out,
            temp,
            named,
            target,
            staged: _staged,
        } = self;
        let file = out
            .into_inner()
            .map_err(|e| e.into_error())
            .map_err(io_error(&named, "cannot write"))?;
        drop(file);
        if let Some(temp) = temp {
            move_into_place(temp, &target).map_err(io_error(&named, "cannot write"))?;
        }
        Ok(())
    }

    /// Writes `bytes` after what was written and flushes them; an error
    /// names the file once (`X: cannot write: File too large`), where
    /// [`Write`]'s carry the name for callers that add none.
    pub fn write_bytes(&mut self, bytes: &[u8]) -> Result<()> {
        self.out
            .write_all(bytes)
            .and_then(|()| self.out.flush())
            .map_err(io_error(&self.named, "cannot write"))
    }

    fn error(&self, e: std::io::Error) -> std::io::Error {
        std::io::Error::new(e.kind(), format!("{}: {e}", self.named.display()))
    }
}

impl Write for AtomicFile {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.out.write(buf).map_err(|e| self.error(e))
    }

    fn write_all(&mut self, buf: &[u8]) -> std::io::Result<()> {
        self.out.write_all(buf).map_err(|e| self.error(e))
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.out.flush().map_err(|e| self.error(e))
    }
}

/// Moves the complete `temp` to `target`. A regular file already at
/// `target` is exchanged with it and then removed under the temporary
/// name: renaming over an existing file, ext4 (`auto_da_alloc`) first
/// starts writing the new file's delayed blocks to disk inside the rename
/// (0.27–0.29 s for a 186 MB instrumented executable), which an exchange,
/// like a rename to a new name, does not. Readers see the old or the new
/// file either way.
fn move_into_place(temp: TempPath, target: &Path) -> std::io::Result<()> {
    let replaces_a_file = std::fs::symlink_metadata(target).is_ok_and(|m| m.is_file());
    if replaces_a_file && exchange(&temp, target).is_ok() {
        // The old file, now under the temporary name, goes with it.
        drop(temp);
        return Ok(());
    }
    temp.persist(target).map_err(|e| e.error)
}

/// Exchanges two paths atomically (`renameat2` with `RENAME_EXCHANGE`);
/// fails where the file system cannot.
pub fn exchange(a: &Path, b: &Path) -> std::io::Result<()> {
    use std::os::unix::ffi::OsStrExt;
    let c = |p: &Path| {
        std::ffi::CString::new(p.as_os_str().as_bytes())
            .map_err(|_| std::io::Error::from(std::io::ErrorKind::InvalidInput))
    };
    let (a, b) = (c(a)?, c(b)?);
    // SAFETY: two valid NUL-terminated paths relative to the working
    // directory; the call only reads them.
    let rc = unsafe {
        libc::renameat2(
            libc::AT_FDCWD,
            a.as_ptr(),
            libc::AT_FDCWD,
            b.as_ptr(),
            libc::RENAME_EXCHANGE,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// Writes `bytes` to `path` whole (see [`AtomicFile`]).
pub fn write_atomic(path: &Path, bytes: impl AsRef<[u8]>) -> Result<()> {
    write_atomic_mode(path, bytes, FILE_MODE)
}

/// [`write_atomic`] with a mode for a new file ([`EXECUTABLE_MODE`] for
/// programs).
pub(crate) fn write_atomic_mode(path: &Path, bytes: impl AsRef<[u8]>, mode: u32) -> Result<()> {
    let mut file = AtomicFile::create_with_mode(path, mode)?;
    file.write_bytes(bytes.as_ref())?;
    file.commit()
}

/// Creates `dir` and its missing parents below `root` (which it creates
/// too), refusing to go through a directory below `root` that is a
/// symbolic link (or not a directory): results, baselines and the
/// instrumented-copy cache stay inside the tree they were asked for, never
/// where a planted link points. `root` itself may be a link (a user's
/// choice of where results live). `dir` must lie under `root`.
pub fn create_dir_within(root: &Path, dir: &Path) -> Result<()> {
    std::fs::create_dir_all(root).map_err(io_error(root, "cannot create"))?;
    let Ok(relative) = dir.strip_prefix(root) else {
        return Err(refused(
            dir,
            format!("cannot create: not inside {}", root.display()),
        ));
    };
    let mut at = root.to_path_buf();
    for part in relative.components() {
        at.push(part);
        match std::fs::symlink_metadata(&at) {
            Ok(meta) if meta.file_type().is_symlink() => {
                let link = std::fs::read_link(&at).unwrap_or_default();
                return Err(refused(
                    &at,
                    format!(
                        "refusing to write through a symbolic link to {} (a directory inside {})",
                        link.display(),
                        root.display()
                    ),
                ));
            }
            Ok(meta) if meta.is_dir() => {}
            Ok(_) => {
                return Err(refused(&at, "cannot create: not a directory".to_string()));
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => match std::fs::create_dir(&at) {
                Ok(()) => {}
                // Another command created it meanwhile: checked again below.
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                    if !std::fs::symlink_metadata(&at).is_ok_and(|m| m.is_dir()) {
                        return Err(refused(&at, "cannot create: not a directory".to_string()));
                    }
                }
                Err(e) => return Err(io_error(&at, "cannot create")(e)),
            },
            Err(e) => return Err(io_error(&at, "cannot create")(e)),
        }
    }
    Ok(())
}

/// The name prefix of [`private_tempdir`]'s directories; the owner's
/// process id follows it.
const OWNED_PREFIX: &str = ".memgaze.";

/// A temporary directory only this user can enter (mode 0700), under the
/// system's temporary directory, named `.memgaze.<pid>.<random>` after this
/// process.
///
/// It is removed when dropped; a process killed before that (SIGKILL)
/// cannot remove it, so this first removes the directories of earlier
/// owners that no longer run ([`sweep_orphaned_tempdirs`]): what a killed
/// command left is gone at the next one.
pub fn private_tempdir() -> std::io::Result<TempDir> {
    let parent = std::env::temp_dir();
    sweep_orphaned_tempdirs(&parent);
    tempfile::Builder::new()
        .prefix(&format!("{OWNED_PREFIX}{}.", std::process::id()))
        .permissions(Permissions::from_mode(0o700))
        .tempdir_in(parent)
}

/// Removes the directories of [`private_tempdir`] in `parent` whose owner
/// process has ended: named `.memgaze.<pid>.…`, a real directory (not a
/// link) of this user, and no process `pid` exists. Returns how many were
/// removed. A pid that was reused by another process keeps its directory
/// until that one ends too, so nothing of a running command is touched.
pub fn sweep_orphaned_tempdirs(parent: &Path) -> usize {
    use std::os::unix::fs::MetadataExt;
    let Ok(entries) = std::fs::read_dir(parent) else {
        return 0;
    };
    // SAFETY: geteuid has no preconditions.
    let uid = unsafe { libc::geteuid() };
    let mut removed = 0;
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = name
            .to_str()
            .and_then(|n| n.strip_prefix(OWNED_PREFIX))
            .and_then(|rest| rest.split_once('.'))
            .and_then(|(pid, _)| pid.parse::<libc::pid_t>().ok())
            .filter(|&pid| pid > 0)
        else {
            continue;
        };
        let path = entry.path();
        let Ok(meta) = std::fs::symlink_metadata(&path) else {
            continue;
        };
        if !meta.is_dir() || meta.uid() != uid || process_exists(pid) {
            continue;
        }
        if std::fs::remove_dir_all(&path).is_ok() {
            removed += 1;
        }
    }
    removed
}

/// Whether a process `pid` exists (ours or another user's).
fn process_exists(pid: libc::pid_t) -> bool {
    // SAFETY: signal 0 only checks that the process exists.
    let ok = unsafe { libc::kill(pid, 0) } == 0;
    ok || io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
}

/// A temporary directory (mode 0700) in `dir` named
/// `.memgaze.<pid>.<label><random>` after this process, as
/// [`private_tempdir`]'s are: the directories that killed owners left in
/// `dir` are removed first ([`sweep_orphaned_tempdirs`]). For work staged
/// in a directory of results or caches and renamed into place there.
pub fn owned_tempdir_in(dir: &Path, label: &str) -> std::io::Result<TempDir> {
    sweep_orphaned_tempdirs(dir);
    private_tempdir_in(
        dir,
        &format!("{OWNED_PREFIX}{}.{label}", std::process::id()),
    )
}

/// A temporary directory (mode 0700) in `dir` whose name starts with
/// `prefix`.
pub fn private_tempdir_in(dir: &Path, prefix: &str) -> std::io::Result<TempDir> {
    tempfile::Builder::new()
        .prefix(prefix)
        .permissions(Permissions::from_mode(0o700))
        .tempdir_in(dir)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Directories below the root are created; a link among them, or a
    /// file in a directory's place, is refused with the path named and
    /// nothing is created where it points; the root may be a link.
    #[test]
    fn directories_are_created_within_the_root_only() {
        let top = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        let root = top.path().join("memgaze");
        create_dir_within(&root, &root.join("pkg/bench/x")).unwrap();
        assert!(root.join("pkg/bench/x").is_dir());
        std::os::unix::fs::symlink(outside.path(), root.join("pkg/linked")).unwrap();
        let e = create_dir_within(&root, &root.join("pkg/linked/x")).unwrap_err();
        let line = e.to_string();
        assert!(
            line.starts_with(&format!("{}: refusing", root.join("pkg/linked").display()))
                && line.contains(&outside.path().display().to_string()),
            "{line}"
        );
        assert_eq!(std::fs::read_dir(outside.path()).unwrap().count(), 0);
        std::fs::write(root.join("pkg/file"), "").unwrap();
        let e = create_dir_within(&root, &root.join("pkg/file/x")).unwrap_err();
        assert!(e.to_string().ends_with("not a directory"), "{e}");
        assert!(create_dir_within(&root, outside.path()).is_err());
        // A linked root is followed.
        let linked_root = top.path().join("elsewhere");
        std::os::unix::fs::symlink(outside.path(), &linked_root).unwrap();
        create_dir_within(&linked_root, &linked_root.join("a/b")).unwrap();
        assert!(outside.path().join("a/b").is_dir());
    }

    /// The directories of processes that ended are removed by the next
    /// one; those of running processes, links and foreign names are not.
    #[test]
    fn orphaned_tempdirs_are_swept_and_live_ones_kept() {
        let parent = tempfile::tempdir().unwrap();
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let dead = child.id();
        child.wait().unwrap();
        let orphan = parent.path().join(format!(".memgaze.{dead}.abc123"));
        std::fs::create_dir(&orphan).unwrap();
        std::fs::write(orphan.join("program"), "x").unwrap();
        let live = parent
            .path()
            .join(format!(".memgaze.{}.def456", std::process::id()));
        std::fs::create_dir(&live).unwrap();
        let old_style = parent.path().join(".memgaze.Xy12ab");
        std::fs::create_dir(&old_style).unwrap();
        let outside = tempfile::tempdir().unwrap();
        let link = parent.path().join(format!(".memgaze.{dead}.link00"));
        std::os::unix::fs::symlink(outside.path(), &link).unwrap();
        assert_eq!(sweep_orphaned_tempdirs(parent.path()), 1);
        assert!(!orphan.exists());
        assert!(live.is_dir() && old_style.is_dir() && outside.path().is_dir());
        assert!(link.symlink_metadata().is_ok());
    }

    #[test]
    fn an_uncommitted_file_leaves_the_old_one_and_no_debris() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("out.json");
        std::fs::write(&path, "old").unwrap();
        let mut file = AtomicFile::create(&path).unwrap();
        file.write_all(b"new, half").unwrap();
        drop(file);
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "old");
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
        write_atomic(&path, "new").unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "new");
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
    }

    #[test]
    fn a_replaced_file_stays_whole_for_its_readers_and_leaves_no_debris() {
        use std::io::Read;
        use std::os::unix::fs::MetadataExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("out.bin");
        std::fs::write(&path, "old").unwrap();
        let mut reader = File::open(&path).unwrap();
        let old_inode = std::fs::metadata(&path).unwrap().ino();
        write_atomic(&path, "new").unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "new");
        assert_ne!(std::fs::metadata(&path).unwrap().ino(), old_inode);
        let mut old = String::new();
        reader.read_to_string(&mut old).unwrap();
        assert_eq!(old, "old", "an open reader keeps the old file");
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["out.bin"]);
    }

    /// Writes at offsets follow the buffered ones and are committed with
    /// them; a device written in place takes none.
    #[test]
    fn writes_at_offsets_land_in_the_committed_file() {
        use std::os::unix::fs::FileExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("out.bin");
        let mut file = AtomicFile::create(&path).unwrap();
        file.write_all(b"head").unwrap();
        let positioned = file.regular_file().unwrap().expect("a temporary file");
        positioned.write_all_at(b"tail", 8).unwrap();
        positioned.write_all_at(b"EA", 1).unwrap();
        file.commit().unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"hEAd\0\0\0\0tail");
        let mut device = AtomicFile::create(Path::new("/dev/null")).unwrap();
        assert!(device.regular_file().unwrap().is_none());
    }

    #[test]
    fn links_out_of_the_directory_are_refused_and_links_within_followed() {
        let dir = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        let victim = outside.path().join("victim");
        std::fs::write(&victim, "keep").unwrap();
        let link = dir.path().join("t.trace");
        std::os::unix::fs::symlink(&victim, &link).unwrap();
        let e = write_atomic(&link, "x").unwrap_err();
        assert!(matches!(e, OutputError::Refused { .. }), "{e:?}");
        let line = e.to_string();
        assert!(
            line.contains("refusing to write through a symbolic link"),
            "{line}"
        );
        assert!(line.contains("t.trace"), "{line}");
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "keep");
        assert!(
            std::fs::symlink_metadata(&link)
                .unwrap()
                .file_type()
                .is_symlink()
        );

        let dangling = dir.path().join("d.trace");
        std::os::unix::fs::symlink(outside.path().join("nothing"), &dangling).unwrap();
        assert!(write_atomic(&dangling, "x").is_err());
        assert!(!outside.path().join("nothing").exists());

        // A link to a device (`/dev/stdout`, here /dev/null) is written in
        // place.
        let null = dir.path().join("null.trace");
        std::os::unix::fs::symlink("/dev/null", &null).unwrap();
        write_atomic(&null, "x").unwrap();
        assert!(
            std::fs::symlink_metadata(&null)
                .unwrap()
                .file_type()
                .is_symlink()
        );

        let real = dir.path().join("real.trace");
        std::fs::write(&real, "old").unwrap();
        let inner = dir.path().join("latest.trace");
        std::os::unix::fs::symlink("real.trace", &inner).unwrap();
        write_atomic(&inner, "new").unwrap();
        assert_eq!(std::fs::read_to_string(&real).unwrap(), "new");
        assert!(
            std::fs::symlink_metadata(&inner)
                .unwrap()
                .file_type()
                .is_symlink()
        );
    }

    #[test]
    fn unwritable_destinations_fail_early_with_their_name() {
        let dir = tempfile::tempdir().unwrap();
        let e = check_output(dir.path()).unwrap_err();
        assert!(e.to_string().contains("is a directory"), "{e}");
        let missing = dir.path().join("no/such/dir/t.trace");
        let e = check_output(&missing).unwrap_err();
        assert!(matches!(e, OutputError::Io { .. }), "{e:?}");
        let e = e.to_string();
        assert!(e.contains("no/such/dir/t.trace"), "{e}");
        // Writing into /dev/null works in place, without replacing it.
        let mut null = AtomicFile::create(Path::new("/dev/null")).unwrap();
        null.write_all(b"x").unwrap();
        null.commit().unwrap();
        assert!(
            std::fs::metadata("/dev/null")
                .unwrap()
                .file_type()
                .is_char_device()
        );
    }

    #[test]
    fn modes_follow_the_umask_or_the_replaced_file() {
        let dir = tempfile::tempdir().unwrap();
        let exe = dir.path().join("prog");
        write_atomic_mode(&exe, "x", EXECUTABLE_MODE).unwrap();
        let mode = std::fs::metadata(&exe).unwrap().permissions().mode();
        assert_eq!(mode & 0o100, 0o100, "{mode:o}");
        let private = dir.path().join("private");
        std::fs::write(&private, "old").unwrap();
        std::fs::set_permissions(&private, Permissions::from_mode(0o600)).unwrap();
        write_atomic(&private, "new").unwrap();
        let mode = std::fs::metadata(&private).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        let tmp = private_tempdir().unwrap();
        let mode = std::fs::metadata(tmp.path()).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o700);
    }
}
