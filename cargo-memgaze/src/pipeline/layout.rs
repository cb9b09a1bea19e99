//! Running an instrumented copy where the original's relative paths still
//! lead to the same files.
//!
//! Many programs find their files relative to their own executable
//! (`/proc/self/exe`): cmake looks for `<exe dir>/../share/cmake-X.Y` and
//! exits 1 with "Could not find CMAKE_ROOT" without it, gcc's driver finds
//! `../libexec/gcc/…`, and the dynamic loader resolves `$ORIGIN` in
//! `DT_RUNPATH` from it. An instrumented copy in a cache directory breaks
//! all of them, although its code is faithful. [`mirror`] builds a *mirror*
//! of the original's path under a directory of ours: the directories on
//! the path are real, everything else in them is a symbolic link to the
//! original entry, and the executable itself is the instrumented copy. From
//! the copy's directory, `..`, siblings and every other relative path then
//! resolve as they did from the original's.

use anyhow::Context;
use std::collections::HashSet;
use std::ffi::OsString;
use std::io::ErrorKind;
use std::path::{Component, Path, PathBuf};

/// Places `instrumented` (the copy of `original`) at `root` + the
/// original's canonical path and links every other entry of the
/// directories on that path to the original's, returning where the copy
/// now is. Existing mirrors are completed rather than rebuilt (entries added
/// to the original's directories since appear; a link already there is
/// kept), so calling this before every run of a cached copy costs a few
/// directory listings.
pub fn mirror(original: &Path, instrumented: &Path, root: &Path) -> anyhow::Result<PathBuf> {
    let original = std::fs::canonicalize(original)
        .with_context(|| format!("cannot resolve {}", original.display()))?;
    let mut real = PathBuf::from("/");
    let mut shadow = root.to_path_buf();
    let components: Vec<OsString> = original
        .components()
        .filter_map(|c| match c {
            Component::Normal(name) => Some(name.to_os_string()),
            _ => None,
        })
        .collect();
    let Some((file_name, dirs)) = components.split_last() else {
        anyhow::bail!("{}: not a file", original.display());
    };
    for (depth, keep) in dirs.iter().chain(std::iter::once(file_name)).enumerate() {
        // A mirror of another path of the same name (one cache entry) linked
        // this directory to the original's: through that link the copy would
        // land beside the original, which would then run instead.
        if std::fs::symlink_metadata(&shadow).is_ok_and(|m| m.file_type().is_symlink()) {
            std::fs::remove_file(&shadow)
                .with_context(|| format!("cannot replace {}", shadow.display()))?;
        }
        std::fs::create_dir_all(&shadow)
            .with_context(|| format!("cannot create {}", shadow.display()))?;
        link_siblings(&real, &shadow, keep)?;
        if depth < dirs.len() {
            real.push(keep);
            shadow.push(keep);
        }
    }
    let copy = shadow.join(file_name);
    place_copy(instrumented, &copy)?;
    Ok(copy)
}

/// Links every entry of `real` except `keep` into `shadow`, where missing.
fn link_siblings(real: &Path, shadow: &Path, keep: &OsString) -> anyhow::Result<()> {
    let present: HashSet<OsString> = std::fs::read_dir(shadow)
        .with_context(|| format!("cannot list {}", shadow.display()))?
        .filter_map(Result::ok)
        .map(|e| e.file_name())
        .collect();
    // An unreadable directory on the path leaves its siblings out: the
    // program could not list them either, only open them by name.
    let Ok(listing) = std::fs::read_dir(real) else {
        return Ok(());
    };
    for entry in listing.filter_map(Result::ok) {
        let name = entry.file_name();
        if &name == keep || present.contains(&name) {
            continue;
        }
        match std::os::unix::fs::symlink(entry.path(), shadow.join(&name)) {
            Ok(()) => {}
            // Another run completing the same mirror.
            Err(e) if e.kind() == ErrorKind::AlreadyExists => {}
            Err(e) => {
                return Err(e).with_context(|| {
                    format!(
                        "cannot link {} into {}",
                        entry.path().display(),
                        shadow.display()
                    )
                });
            }
        }
    }
    Ok(())
}

/// Puts the instrumented file at `copy`: a hard link when the file system
/// allows one, else a copy renamed into place (never a half-written file).
fn place_copy(instrumented: &Path, copy: &Path) -> anyhow::Result<()> {
    if copy.is_file() {
        return Ok(());
    }
    match std::fs::hard_link(instrumented, copy) {
        Ok(()) => return Ok(()),
        Err(e) if e.kind() == ErrorKind::AlreadyExists => return Ok(()),
        Err(_) => {}
    }
    let staging = copy.with_extension("memgaze-staging");
    std::fs::copy(instrumented, &staging)
        .and_then(|_| std::fs::rename(&staging, copy))
        .with_context(|| {
            format!(
                "cannot copy {} to {}",
                instrumented.display(),
                copy.display()
            )
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn relative_paths_from_the_copy_reach_the_originals_files() {
        let tmp = tempfile::tempdir().unwrap();
        let prefix = tmp.path().join("prefix");
        std::fs::create_dir_all(prefix.join("bin")).unwrap();
        std::fs::create_dir_all(prefix.join("share/tool")).unwrap();
        std::fs::write(prefix.join("share/tool/data"), "data").unwrap();
        std::fs::write(prefix.join("bin/tool"), "original").unwrap();
        std::fs::write(prefix.join("bin/helper"), "helper").unwrap();
        std::fs::write(tmp.path().join("instrumented"), "copy").unwrap();
        let root = tmp.path().join("mirror");

        let copy = mirror(
            &prefix.join("bin/tool"),
            &tmp.path().join("instrumented"),
            &root,
        )
        .unwrap();
        let canonical = std::fs::canonicalize(&prefix).unwrap();
        assert_eq!(
            copy,
            root.join(canonical.strip_prefix("/").unwrap())
                .join("bin/tool")
        );
        assert_eq!(std::fs::read_to_string(&copy).unwrap(), "copy");
        let dir = copy.parent().unwrap();
        assert_eq!(
            std::fs::read_to_string(dir.join("helper")).unwrap(),
            "helper"
        );
        assert_eq!(
            std::fs::read_to_string(dir.join("../share/tool/data")).unwrap(),
            "data"
        );

        // Completed, not rebuilt: a new sibling appears, the copy stays.
        std::fs::write(prefix.join("bin/late"), "late").unwrap();
        let again = mirror(
            &prefix.join("bin/tool"),
            &tmp.path().join("instrumented"),
            &root,
        )
        .unwrap();
        assert_eq!(again, copy);
        assert_eq!(std::fs::read_to_string(dir.join("late")).unwrap(), "late");
        assert_eq!(std::fs::read_to_string(&copy).unwrap(), "copy");
    }

    #[test]
    fn a_missing_original_is_an_error_naming_it() {
        let tmp = tempfile::tempdir().unwrap();
        let err = mirror(&tmp.path().join("nope"), &tmp.path().join("x"), tmp.path()).unwrap_err();
        assert!(format!("{err:#}").contains("nope"), "{err:#}");
    }
}
