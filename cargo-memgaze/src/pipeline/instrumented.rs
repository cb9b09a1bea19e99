//! Instrumenting an executable once: classify its loads, rewrite it, and
//! keep the result in a content-addressed cache under
//! `<target-dir>/memgaze/instrumented/`.
//!
//! The cache key is the SHA-256 of the executable's bytes and file name, of
//! the selection (which functions, which mode: `run --functions` makes other
//! copies than `bench`) and of the running `cargo memgaze` binary (a rebuilt
//! instrumentor never reuses another's output). An entry is a directory
//! holding the instrumented executable and its annotation; it is written
//! under a temporary name and renamed into place, so an interrupted run never
//! leaves a half-written entry behind (its staging directory is removed by
//! the next run that stages one, once its process is gone).
//!
//! Every code change makes a new entry (tens of MB for a bench), so the
//! cache keeps the [`KEEP_PER_EXECUTABLE`] most recently used entries of an
//! executable name and removes older ones when it adds a new one.

use anyhow::Context;
use memgaze_instrument::rewrite::{self as instrument, Report};
use memgaze_metadata::annotation::{Annotation, AnnotationFormat, InstrumentationMode, LoadFlags};
use sha2::{Digest, Sha256};
use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::SystemTime;

/// Directory of the cache under the results root.
pub const CACHE_DIR: &str = "instrumented";

/// Cache entries kept per executable file name (cargo's file names carry a
/// hash of the target's metadata, not of its contents, so one name is one
/// bench target across rebuilds): the newest few, so that switching between
/// two branches does not re-instrument on every switch.
pub const KEEP_PER_EXECUTABLE: usize = 3;

/// An instrumented bench executable, ready to record.
#[derive(Clone, Debug)]
pub struct InstrumentedBench {
    /// The instrumented executable.
    pub path: PathBuf,
    /// What the recorder and the analysis need to know about its loads.
    pub annotation: Annotation,
    /// The rewriter's report, when it ran now (`None` for a cache hit).
    pub report: Option<Report>,
    /// Each load's flags when `annotation` is an outline (no loads:
    /// [`Decode::Outline`] on a cache hit).
    pub outline: Option<Vec<LoadFlags>>,
}

/// How [`cached_as`] decodes the annotation of a cache hit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Decode {
    /// Everything, as every command reads it.
    Whole,
    /// An outline: no loads, only their flags ([`Annotation::outline_from_bytes`]):
    /// all a recording needs when its trace header comes from a cache.
    Outline,
}

/// Returns the instrumented copy of `executable`, from the cache under
/// `results_root` when present, else made now with `instrumenter` (given the
/// original and where to write the copy; it writes the executable and
/// returns the annotation and report).
pub fn instrumented_with(
    executable: &Path,
    results_root: &Path,
    instrumenter: impl FnOnce(&Path, &Path) -> anyhow::Result<(Annotation, Report)>,
) -> anyhow::Result<InstrumentedBench> {
    cached(
        executable,
        &results_root.join(CACHE_DIR),
        &[],
        |input, output| {
            instrumenter(input, output)
                .with_context(|| format!("instrumenting {}", input.display()))
        },
    )
}

/// Returns the instrumented copy of `executable` for `selection` (bytes that
/// tell this instrumentation apart from others of the same executable;
/// empty for every function in soft mode) from the cache directory `cache`
/// when present, else made now with `instrumenter`, which is given the
/// original and where to write the copy; it writes the executable (and may
/// write its annotation beside it, else the cache does) and returns the
/// annotation and report. A new entry evicts the least recently used
/// entries of the same executable name beyond [`KEEP_PER_EXECUTABLE`]; a
/// hit marks its entry as used. Errors of `instrumenter` pass unchanged.
pub fn cached(
    executable: &Path,
    cache: &Path,
    selection: &[u8],
    instrumenter: impl FnOnce(&Path, &Path) -> anyhow::Result<(Annotation, Report)>,
) -> anyhow::Result<InstrumentedBench> {
    cached_as(executable, cache, selection, Decode::Whole, instrumenter)
}

/// [`cached`], with a cache hit's annotation decoded as `decode` says (a
/// copy made now has its whole annotation).
pub fn cached_as(
    executable: &Path,
    cache: &Path,
    selection: &[u8],
    decode: Decode,
    instrumenter: impl FnOnce(&Path, &Path) -> anyhow::Result<(Annotation, Report)>,
) -> anyhow::Result<InstrumentedBench> {
    let file_name = executable
        .file_name()
        .with_context(|| format!("{}: not a file", executable.display()))?;
    let mut hasher = Sha256::new();
    hash_file(&mut hasher, executable)
        .with_context(|| format!("cannot read {}", executable.display()))?;
    // The annotation names the original (its path, and the `<file>!` of
    // its functions once it joins a trace), and an entry holds its copy
    // under the original's file name: one content under two names is two
    // entries, never one entry looked up under a name it does not hold.
    hasher.update((file_name.len() as u64).to_le_bytes());
    hasher.update(file_name.as_encoded_bytes());
    if !selection.is_empty() {
        hasher.update((selection.len() as u64).to_le_bytes());
        hasher.update(selection);
    }
    hasher.update(tool_identity());
    // Function names come from a separate debug file when one is installed:
    // installing or removing it makes another copy.
    if let Some(debug) = memgaze_instrument::binary::separate_debug_file(executable) {
        let debug = debug.into_os_string();
        hasher.update(b"debug-file:");
        hasher.update((debug.len() as u64).to_le_bytes());
        hasher.update(debug.as_encoded_bytes());
    }
    // A copy without escape checks must not stand in for one with them.
    if !instrument::escape_checks_from_env() {
        hasher.update(instrument::NO_ESCAPE_CHECKS_ENV);
    }
    // A copy that needs BMI2 must not stand in for one made without it.
    if instrument::spatial_bmi2_from_env() {
        hasher.update(instrument::SPATIAL_BMI2_ENV);
    }
    let key: String = hasher.finalize()[..12]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    // A linked cache directory or entry would run whatever it points to.
    memgaze_output::create_dir_within(cache.parent().unwrap_or(Path::new(".")), cache)?;
    let entry = cache.join(&key);
    if std::fs::symlink_metadata(&entry).is_ok_and(|m| !m.is_dir()) {
        anyhow::bail!(
            "{}: refusing to use a cache entry that is not a directory (a symbolic link or a file): remove it",
            entry.display()
        );
    }
    let path = entry.join(file_name);
    let annotation_file = instrument::annotation_path(&path);
    if path.is_file() && annotation_file.is_file() {
        let (mut annotation, outline) = read_annotation(&annotation_file, decode)?;
        // One entry serves every path of this content under this name: the
        // annotation names the one asked for, as a copy made now would.
        annotation.binary.path = executable.display().to_string();
        mark_used(&entry);
        return Ok(InstrumentedBench {
            path,
            annotation,
            report: None,
            outline,
        });
    }
    // Build in a fresh temporary directory, then rename it into place; one
    // that a killed run left is removed once its process is gone.
    let staging = memgaze_output::owned_tempdir_in(cache, &format!("{key}{STAGING_MARK}"))
        .with_context(|| format!("cannot create a directory in {}", cache.display()))?;
    let staged = staging.path().join(file_name);
    let (annotation, report) = instrumenter(executable, &staged)?;
    let staged_annotation = instrument::annotation_path(&staged);
    if !staged_annotation.is_file() {
        let bytes = annotation.to_bytes(AnnotationFormat::Compact);
        std::fs::write(&staged_annotation, bytes)
            .with_context(|| format!("cannot write into {}", staging.path().display()))?;
    }
    let staging = staging.keep();
    let placed = place_entry(&staging, &entry, file_name);
    let _ = std::fs::remove_dir_all(&staging);
    placed.with_context(|| format!("cannot create {}", entry.display()))?;
    mark_used(&entry);
    evict(cache, file_name, &entry, KEEP_PER_EXECUTABLE);
    Ok(InstrumentedBench {
        path,
        annotation,
        report: Some(report),
        outline: None,
    })
}

/// Renames the directory `staging` (holding the copy `file_name` and its
/// annotation) to `entry`. Where `entry` is already there (made by a run
/// that won the race, or damaged: its copy or annotation missing), what it
/// holds is kept, its `mirror/` of `run` included, and only what it lacks
/// is moved in from `staging`: the annotation first, so that the entry
/// never looks whole before it is. The files are the same for the same key.
fn place_entry(staging: &Path, entry: &Path, file_name: &OsStr) -> std::io::Result<()> {
    let Err(e) = std::fs::rename(staging, entry) else {
        return Ok(());
    };
    if !std::fs::symlink_metadata(entry).is_ok_and(|m| m.is_dir()) {
        return Err(e);
    }
    let copy = Path::new(file_name);
    for name in [instrument::annotation_path(copy), copy.to_path_buf()] {
        if !entry.join(&name).is_file() {
            std::fs::rename(staging.join(&name), entry.join(&name))?;
        }
    }
    Ok(())
}

/// Feeds the contents of the file at `path` to `hasher` a block at a time:
/// held whole, the input (80 MB for a large bench) stayed resident through
/// its instrumentation.
fn hash_file(hasher: &mut Sha256, path: &Path) -> std::io::Result<()> {
    use std::io::Read;
    let mut file = std::fs::File::open(path)?;
    let mut block = vec![0; 1 << 20];
    loop {
        match file.read(&mut block) {
            Ok(0) => return Ok(()),
            Ok(n) => hasher.update(&block[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
}

/// Part of the name of an entry still being written.
const STAGING_MARK: &str = ".tmp";

/// Sets the entry's modification time to now: the cache's use order.
fn mark_used(entry: &Path) {
    // Best effort: a read-only cache still works, it only evicts by age.
    let _ = std::fs::File::open(entry).and_then(|dir| dir.set_modified(SystemTime::now()));
}

/// Removes the entries of `cache` holding a file named `file_name`, except
/// `current` and the `keep - 1` others used most recently; returns how many
/// it removed. Entries being staged are left alone, and failures (another
/// run removing the same entry) are ignored: the cache is only a cache.
fn evict(cache: &Path, file_name: &OsStr, current: &Path, keep: usize) -> usize {
    let Ok(listing) = std::fs::read_dir(cache) else {
        return 0;
    };
    let mut others: Vec<(SystemTime, PathBuf)> = listing
        .filter_map(Result::ok)
        .filter(|e| !e.file_name().to_string_lossy().contains(STAGING_MARK))
        .map(|e| e.path())
        .filter(|p| p.as_path() != current && p.join(file_name).is_file())
        .filter_map(|p| Some((std::fs::metadata(&p).ok()?.modified().ok()?, p)))
        .collect();
    // Newest first; equal times in name order, so the choice is stable.
    others.sort_by(|a, b| b.0.cmp(&a.0).then_with(|| a.1.cmp(&b.1)));
    others
        .iter()
        .skip(keep.saturating_sub(1))
        .filter(|(_, p)| std::fs::remove_dir_all(p).is_ok())
        .count()
}

/// [`instrumented_with`] the software-recorder instrumentation: every
/// function classified and rewritten.
pub fn instrumented(executable: &Path, results_root: &Path) -> anyhow::Result<InstrumentedBench> {
    instrumented_with(executable, results_root, instrument_soft)
}

/// Classifies every function of `input` and writes the instrumented
/// executable straight to `output` as it is made, its compact annotation
/// beside it.
pub fn instrument_soft(input: &Path, output: &Path) -> anyhow::Result<(Annotation, Report)> {
    let result =
        memgaze_instrument::instrument_file(input, output, None, InstrumentationMode::Soft)?;
    Ok((result.annotation, result.report))
}

fn read_annotation(
    path: &Path,
    decode: Decode,
) -> anyhow::Result<(Annotation, Option<Vec<LoadFlags>>)> {
    // A cache entry is written whole and renamed into place, so a bad one was
    // damaged afterwards; the entry is safe to delete and is rebuilt.
    let bad = || {
        let entry = path.parent().unwrap_or(path);
        format!("bad cache entry {} (delete it)", entry.display())
    };
    match decode {
        Decode::Whole => Ok((Annotation::read(path).with_context(bad)?, None)),
        Decode::Outline => std::fs::read(path)
            .map_err(anyhow::Error::from)
            .and_then(|bytes| Ok(Annotation::outline_from_bytes(&bytes)?))
            .map(|(annotation, flags)| (annotation, Some(flags)))
            .with_context(bad),
    }
}

/// What identifies the running `cargo memgaze` executable (computed once):
/// its GNU build ID, which the linker derives from the output's content,
/// else a digest of the whole file. Reading and hashing our own 75 MB
/// executable was most of `record --libs`'s start-up.
fn tool_identity() -> &'static [u8] {
    static IDENTITY: OnceLock<Vec<u8>> = OnceLock::new();
    IDENTITY.get_or_init(|| {
        let exe = std::env::current_exe().ok();
        if let Some(id) = exe.as_deref().and_then(gnu_build_id) {
            let mut identity = b"gnu-build-id:".to_vec();
            identity.extend_from_slice(&id);
            return identity;
        }
        let exe = exe
            .and_then(|p| std::fs::read(p).ok())
            .unwrap_or_else(|| env!("CARGO_PKG_VERSION").as_bytes().to_vec());
        Sha256::digest(&exe).to_vec()
    })
}

/// The `NT_GNU_BUILD_ID` of the 64-bit little-endian ELF file at `path`,
/// read from its program headers' notes only (not the whole file).
fn gnu_build_id(path: &Path) -> Option<Vec<u8>> {
    use std::os::unix::fs::FileExt;
    let file = std::fs::File::open(path).ok()?;
    let read = |at: u64, len: usize| -> Option<Vec<u8>> {
        let mut bytes = vec![0; len];
        file.read_exact_at(&mut bytes, at).ok()?;
        Some(bytes)
    };
    let header = read(0, 64)?;
    // ELF magic, 64-bit, little endian.
    if header[..4] != *b"\x7fELF" || header[4] != 2 || header[5] != 1 {
        return None;
    }
    let u16_at = |b: &[u8], at: usize| u16::from_le_bytes([b[at], b[at + 1]]);
    let u32_at =
        |b: &[u8], at: usize| u32::from_le_bytes(b[at..at + 4].try_into().unwrap_or([0; 4]));
    let u64_at =
        |b: &[u8], at: usize| u64::from_le_bytes(b[at..at + 8].try_into().unwrap_or([0; 8]));
    let (phoff, phentsize, phnum) = (
        u64_at(&header, 0x20),
        usize::from(u16_at(&header, 0x36)),
        usize::from(u16_at(&header, 0x38)),
    );
    if phentsize < 56 || phnum > 4096 {
        return None;
    }
    let headers = read(phoff, phentsize * phnum)?;
    for ph in headers.chunks_exact(phentsize) {
        const PT_NOTE: u32 = 4;
        let size = u64_at(ph, 32);
        if u32_at(ph, 0) != PT_NOTE || size > 1 << 16 {
            continue;
        }
        let notes = read(u64_at(ph, 8), size as usize)?;
        let mut at = 0;
        while at + 12 <= notes.len() {
            let (name_len, desc_len, kind) = (
                u32_at(&notes, at) as usize,
                u32_at(&notes, at + 4) as usize,
                u32_at(&notes, at + 8),
            );
            let name_at = at + 12;
            let desc_at = name_at + name_len.div_ceil(4) * 4;
            let end = desc_at + desc_len.div_ceil(4) * 4;
            const NT_GNU_BUILD_ID: u32 = 3;
            if kind == NT_GNU_BUILD_ID
                && notes.get(name_at..name_at + name_len) == Some(b"GNU\0".as_slice())
                && desc_len > 0
            {
                return notes.get(desc_at..desc_at + desc_len).map(<[u8]>::to_vec);
            }
            at = end;
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use memgaze_trace::BinaryIdentity;
    use std::cell::Cell;

    #[test]
    fn the_tool_is_identified_by_its_build_id_as_readelf_reads_it() {
        let exe = std::env::current_exe().unwrap();
        let out = std::process::Command::new("readelf")
            .arg("-n")
            .arg(&exe)
            .output()
            .expect("readelf (binutils) runs");
        let text = String::from_utf8_lossy(&out.stdout);
        let expected = text
            .lines()
            .find_map(|l| l.trim().strip_prefix("Build ID: "))
            .map(str::to_string);
        let got = gnu_build_id(&exe).map(|id| id.iter().map(|b| format!("{b:02x}")).collect());
        assert_eq!(got, expected);
        assert_eq!(gnu_build_id(Path::new("/nonexistent")), None);
        let dir = tempfile::tempdir().unwrap();
        let not_elf = executable(dir.path(), b"#!/bin/sh\nexit 0\n");
        assert_eq!(gnu_build_id(&not_elf), None);
    }

    fn executable(dir: &Path, contents: &[u8]) -> std::path::PathBuf {
        let path = dir.join("bench-0123");
        std::fs::write(&path, contents).unwrap();
        path
    }

    fn annotation() -> Annotation {
        Annotation {
            schema: memgaze_metadata::annotation::ANNOTATION_SCHEMA.into(),
            binary: BinaryIdentity {
                path: "x".into(),
                size: 1,
                sha256: "00".into(),
                build_id: None,
            },
            mode: Some(InstrumentationMode::Soft),
            functions: Vec::new(),
            loads: Vec::new(),
            ptwrites: Vec::new(),
            shared_libraries: Vec::new(),
            escapes: Vec::new(),
            cpu_features: Vec::new(),
        }
    }

    #[test]
    fn a_damaged_annotation_names_its_cache_entry() {
        let dir = tempfile::tempdir().unwrap();
        let entry = dir.path().join("0123abcd");
        std::fs::create_dir(&entry).unwrap();
        let path = entry.join("bench.annotation.json");
        std::fs::write(&path, b"{\"schema\": 7").unwrap();
        let line = memgaze_error::one_line(&read_annotation(&path, Decode::Whole).unwrap_err());
        assert!(
            line.starts_with(&format!(
                "bad cache entry {} (delete it): ",
                entry.display()
            )),
            "{line}"
        );
        assert!(line.contains("bench.annotation.json"), "{line}");
    }

    /// An instrumenter that writes a placeholder and counts its calls.
    fn fake_instrument(
        calls: &Cell<usize>,
        _input: &Path,
        output: &Path,
    ) -> anyhow::Result<(Annotation, Report)> {
        calls.set(calls.get() + 1);
        std::fs::write(output, b"instrumented").unwrap();
        Ok((annotation(), Report::default()))
    }

    #[test]
    fn an_executable_is_instrumented_once_per_content() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("memgaze");
        let calls = Cell::new(0);
        let fake = |input: &Path, out: &Path| fake_instrument(&calls, input, out);
        let exe = executable(tmp.path(), b"v1");
        let first = instrumented_with(&exe, &root, fake).unwrap();
        assert!(first.report.is_some());
        assert_eq!(std::fs::read(&first.path).unwrap(), b"instrumented");
        let again = instrumented_with(&exe, &root, fake).unwrap();
        assert!(again.report.is_none());
        assert_eq!((again.path.clone(), calls.get()), (first.path.clone(), 1));
        // A cached annotation names the path asked for.
        let mut expected = annotation();
        expected.binary.path = exe.display().to_string();
        assert_eq!(again.annotation, expected);
        // New contents, new entry.
        let exe = executable(tmp.path(), b"v2");
        let other = instrumented_with(&exe, &root, fake).unwrap();
        assert_ne!(other.path, first.path);
        assert_eq!(calls.get(), 2);
        // No staging directories are left behind.
        let entries = std::fs::read_dir(root.join(CACHE_DIR)).unwrap().count();
        assert_eq!(entries, 2);
    }

    /// Sets an entry's use time `hours` ago.
    fn used_hours_ago(entry: &Path, hours: u64) {
        let then = SystemTime::now() - std::time::Duration::from_secs(3600 * hours);
        std::fs::File::open(entry)
            .unwrap()
            .set_modified(then)
            .unwrap();
    }

    fn entry_of(bench: &InstrumentedBench) -> PathBuf {
        bench.path.parent().unwrap().to_path_buf()
    }

    #[test]
    fn a_new_entry_evicts_the_least_recently_used_of_its_name() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("memgaze");
        let calls = Cell::new(0);
        let fake = |input: &Path, out: &Path| fake_instrument(&calls, input, out);
        // Four builds of one bench, used 40, 30, 20 and 10 hours ago.
        let mut entries = Vec::new();
        for (version, hours) in [(1, 40), (2, 30), (3, 20), (4, 10)] {
            let exe = executable(tmp.path(), format!("v{version}").as_bytes());
            let made = instrumented_with(&exe, &root, fake).unwrap();
            used_hours_ago(&entry_of(&made), hours);
            entries.push(entry_of(&made));
        }
        // Only the three newest are left: the fourth build evicted the first.
        assert!(!entries[0].exists());
        assert!(entries[1..].iter().all(|e| e.is_dir()));
        // Another bench's entry and a staging directory are not counted
        // and not touched.
        let other = tmp.path().join("other-bench");
        std::fs::write(&other, b"other").unwrap();
        let other = entry_of(&instrumented_with(&other, &root, fake).unwrap());
        used_hours_ago(&other, 100);
        let staging = root.join(CACHE_DIR).join(format!("0123{STAGING_MARK}abc"));
        std::fs::create_dir(&staging).unwrap();
        std::fs::write(staging.join("bench-0123"), b"half").unwrap();
        // A hit makes build 2 the most recently used ...
        let exe = executable(tmp.path(), b"v2");
        let hit = instrumented_with(&exe, &root, fake).unwrap();
        assert!(hit.report.is_none());
        // ... so build 5 evicts build 3, the least recently used.
        let exe = executable(tmp.path(), b"v5");
        let fifth = entry_of(&instrumented_with(&exe, &root, fake).unwrap());
        assert!(!entries[2].exists());
        for kept in [&entries[1], &entries[3], &fifth, &other, &staging] {
            assert!(kept.is_dir(), "{} was removed", kept.display());
        }
        assert_eq!(std::fs::read_dir(root.join(CACHE_DIR)).unwrap().count(), 5);
    }

    #[test]
    fn a_selection_makes_its_own_entry() {
        let tmp = tempfile::tempdir().unwrap();
        let cache = tmp.path().join("cache");
        let calls = Cell::new(0);
        let fake = |input: &Path, out: &Path| fake_instrument(&calls, input, out);
        let exe = executable(tmp.path(), b"v1");
        let all = cached(&exe, &cache, b"", fake).unwrap();
        let some = cached(&exe, &cache, b"functions=main*", fake).unwrap();
        assert_ne!(all.path, some.path);
        let again = cached(&exe, &cache, b"functions=main*", fake).unwrap();
        assert_eq!((again.path, calls.get()), (some.path, 2));
        // Any other selection is another entry.
        let other = cached(&exe, &cache, b"functions=main", fake).unwrap();
        assert_eq!(calls.get(), 3);
        assert_ne!(other.path, all.path);
    }

    #[test]
    fn one_content_under_two_names_makes_an_entry_per_name() {
        let tmp = tempfile::tempdir().unwrap();
        let cache = tmp.path().join("cache");
        let calls = Cell::new(0);
        let fake = |input: &Path, out: &Path| fake_instrument(&calls, input, out);
        let exe = executable(tmp.path(), b"v1");
        let renamed = tmp.path().join("prog");
        std::fs::copy(&exe, &renamed).unwrap();
        let first = cached(&exe, &cache, b"", fake).unwrap();
        let second = cached(&renamed, &cache, b"", fake).unwrap();
        assert_ne!(first.path.parent(), second.path.parent());
        assert_eq!(second.path.file_name().unwrap(), "prog");
        let again = cached(&renamed, &cache, b"", fake).unwrap();
        assert_eq!((again.path, calls.get()), (second.path, 2));
    }

    #[test]
    fn an_entry_that_lost_a_file_is_completed_and_keeps_the_rest() {
        let tmp = tempfile::tempdir().unwrap();
        let cache = tmp.path().join("cache");
        let calls = Cell::new(0);
        let fake = |input: &Path, out: &Path| fake_instrument(&calls, input, out);
        let exe = executable(tmp.path(), b"v1");
        let made = cached(&exe, &cache, b"", fake).unwrap();
        let entry = entry_of(&made);
        std::fs::create_dir_all(entry.join("mirror/usr/bin")).unwrap();
        std::fs::write(entry.join("mirror/usr/bin/bench-0123"), b"linked").unwrap();
        for lost in [instrument::annotation_path(&made.path), made.path.clone()] {
            std::fs::remove_file(&lost).unwrap();
            let remade = cached(&exe, &cache, b"", fake).unwrap();
            assert!(remade.report.is_some());
            assert_eq!(remade.path, made.path);
            assert!(lost.is_file(), "{} is back", lost.display());
            let hit = cached(&exe, &cache, b"", fake).unwrap();
            assert!(hit.report.is_none(), "the completed entry is used");
        }
        assert_eq!(calls.get(), 3);
        assert!(entry.join("mirror/usr/bin/bench-0123").is_file());
        assert_eq!(std::fs::read_dir(&cache).unwrap().count(), 1);
    }

    #[test]
    fn a_staging_directory_left_by_a_killed_run_is_removed() {
        let tmp = tempfile::tempdir().unwrap();
        let cache = tmp.path().join("cache");
        std::fs::create_dir_all(&cache).unwrap();
        let mut gone = std::process::Command::new("true").spawn().unwrap();
        let gone_pid = gone.id();
        gone.wait().unwrap();
        let left = cache.join(format!(".memgaze.{gone_pid}.0123{STAGING_MARK}abc"));
        std::fs::create_dir(&left).unwrap();
        std::fs::write(left.join("bench-0123"), b"half").unwrap();
        let running = cache.join(format!(
            ".memgaze.{}.4567{STAGING_MARK}abc",
            std::process::id()
        ));
        std::fs::create_dir(&running).unwrap();
        let calls = Cell::new(0);
        let fake = |input: &Path, out: &Path| fake_instrument(&calls, input, out);
        let exe = executable(tmp.path(), b"v1");
        cached(&exe, &cache, b"", fake).unwrap();
        assert!(!left.exists(), "{} was left", left.display());
        assert!(running.is_dir(), "a running process's staging is kept");
    }

    #[test]
    fn the_key_hashes_the_whole_file_across_blocks() {
        let dir = tempfile::tempdir().unwrap();
        let contents: Vec<u8> = (0..(5u32 << 19) + 7)
            .map(|i| (i * 31 % 251) as u8)
            .collect();
        let path = executable(dir.path(), &contents);
        let mut hasher = Sha256::new();
        hash_file(&mut hasher, &path).unwrap();
        assert_eq!(
            hasher.finalize().to_vec(),
            Sha256::digest(&contents).to_vec()
        );
        let missing = hash_file(&mut Sha256::new(), &dir.path().join("missing"));
        assert_eq!(missing.unwrap_err().kind(), std::io::ErrorKind::NotFound);
    }

    #[test]
    fn a_failed_instrumentation_leaves_no_entry() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("memgaze");
        let exe = executable(tmp.path(), b"v1");
        let e = instrumented_with(&exe, &root, |_, _| anyhow::bail!("no entry point")).unwrap_err();
        assert_eq!(
            memgaze_error::one_line(&e),
            format!("instrumenting {}: no entry point", exe.display())
        );
        assert_eq!(std::fs::read_dir(root.join(CACHE_DIR)).unwrap().count(), 0);
    }
}
