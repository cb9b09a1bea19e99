//! Instrumented shared libraries (`--libs`): which libraries a program
//! loads, their instrumented copies (cached by content like executables),
//! and the private library directory that makes the program load them.
//!
//! The libraries are the program's `DT_NEEDED` closure as its own dynamic
//! loader resolves it (`ld.so --list`, the loader's search order with the
//! user's environment). A selected library is instrumented as object
//! `1 + its position among the selected` (the high bits of its record ids,
//! see `memgaze_instrument::rewrite::library`); one that cannot be is
//! named and stays original. The copies' cache entries (a copy linked
//! there under its `DT_NEEDED` name where its file name differs; without a
//! cache, a private temporary directory of links) are put first on
//! `LD_LIBRARY_PATH`, so the loader finds them before the originals and
//! every object that needs the library (by its `DT_SONAME`) shares the
//! copy.

use crate::pipeline::instrumented::Decode;
use anyhow::{Context, Result, bail};
use memgaze_metadata::annotation::{Annotation, LoadFlags};
use memgaze_trace::{LoadEntry, OBJECT_LABEL, SHARED_LIBRARY_LABEL, TraceHeader};
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The libraries `--libs default` selects: where Rust and C programs spend
/// their library loads (copies, comparisons, string scans, the allocator,
/// maths, unwinding).
pub const DEFAULT_LIBS: &[&str] = &["libc.so.6", "libm.so.6", "libgcc_s.so.1"];

/// Which of a program's libraries to instrument: `--libs`.
#[derive(Clone, Debug, Default)]
pub struct LibSelection {
    /// Globs matched against the library's file name as the program needs
    /// it (`libc.so.6`); empty: none.
    globs: Vec<globset::GlobMatcher>,
    /// The patterns written out (not those `default` stands for), to tell
    /// the user of one that matches no library.
    written: Vec<(String, globset::GlobMatcher)>,
}

impl LibSelection {
    /// Parses `--libs`: `none`, or a comma-separated list of globs, `default`
    /// ([`DEFAULT_LIBS`]) and `all` (the same as `'*'`: every library, a
    /// keyword because no library is named `all` and users write it as
    /// they write `none`).
    pub fn parse(value: &str) -> Result<LibSelection, String> {
        let mut selection = LibSelection::default();
        if value == "none" {
            return Ok(selection);
        }
        for part in value.split(',').map(str::trim) {
            let patterns: Vec<&str> = match part {
                "" => return Err(format!("--libs {value}: empty library pattern")),
                "default" => DEFAULT_LIBS.to_vec(),
                "all" => vec!["*"],
                "none" => return Err(format!("--libs {value}: `none` cannot be combined")),
                other => vec![other],
            };
            for pattern in patterns {
                let glob = globset::Glob::new(pattern)
                    .map_err(|e| format!("--libs {value}: {e}"))?
                    .compile_matcher();
                if part != "default" {
                    selection.written.push((part.to_string(), glob.clone()));
                }
                selection.globs.push(glob);
            }
        }
        Ok(selection)
    }

    /// The patterns written out (not `default`'s) that match none of
    /// `names`: most likely a name mistyped or not written whole
    /// (`libsqlite3` for `libsqlite3.so.0`).
    pub fn unmatched<'a>(&'a self, names: &[String]) -> Vec<&'a str> {
        self.written
            .iter()
            .filter(|(_, glob)| !names.iter().any(|name| glob.is_match(name)))
            .map(|(pattern, _)| pattern.as_str())
            .collect()
    }

    /// Whether nothing is selected.
    pub fn is_empty(&self) -> bool {
        self.globs.is_empty()
    }

    /// Whether the library the program needs as `name` is selected.
    pub fn selects(&self, name: &str) -> bool {
        self.globs.iter().any(|g| g.is_match(name))
    }
}

/// One library of the program: the name it is needed by and the file the
/// loader maps.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NeededLibrary {
    /// `libc.so.6`.
    pub name: String,
    /// `/lib/x86_64-linux-gnu/libc.so.6`.
    pub path: PathBuf,
}

/// The libraries `program` loads at start, as its dynamic loader resolves
/// them (neither the loader itself nor the vDSO: they cannot be
/// instrumented). A library the loader does not find is left out (the
/// program will fail to start and say so itself).
pub fn needed_libraries(program: &Path) -> Result<Vec<NeededLibrary>> {
    let Some(interpreter) = interpreter_of_file(program)
        .with_context(|| format!("cannot read {}", program.display()))?
    else {
        return Ok(Vec::new());
    };
    let output = Command::new(&interpreter)
        .arg("--list")
        .arg(program)
        .output()
        .with_context(|| format!("cannot run {} --list", interpreter.display()))?;
    let stderr = String::from_utf8_lossy(&output.stderr);
    // The loader lists nothing and exits 127 when a library is missing:
    // the program itself fails the same way, with the loader's message.
    if !output.status.success() && !stderr.contains(LIBRARY_NOT_LOADED) {
        bail!(
            "{} --list {}: {}",
            interpreter.display(),
            program.display(),
            stderr.trim()
        );
    }
    Ok(parse_list(&String::from_utf8_lossy(&output.stdout)))
}

/// What glibc's loader says when a needed library cannot be loaded
/// (`--list` and a program's start alike).
const LIBRARY_NOT_LOADED: &str = "error while loading shared libraries";

/// How much of an executable [`interpreter_of_file`] reads first: its ELF
/// header, program headers and `PT_INTERP` string lie at its start.
const HEAD_BYTES: u64 = 64 * 1024;

/// `PT_INTERP` of the ELF file `path`, if any, from the file's first
/// [`HEAD_BYTES`] where they hold it: a bench executable with debug
/// information is 100 MB, and every recording with libraries asks.
fn interpreter_of_file(path: &Path) -> std::io::Result<Option<PathBuf>> {
    use std::io::Read;
    let mut head = Vec::new();
    std::fs::File::open(path)?
        .take(HEAD_BYTES)
        .read_to_end(&mut head)?;
    match interpreter_in_head(&head) {
        Some(found) => Ok(found),
        None => Ok(interpreter_of(&std::fs::read(path)?)),
    }
}

/// `PT_INTERP` of an ELF file whose first bytes are `head`: `None` when
/// `head` does not hold the program headers and the string they point to.
fn interpreter_in_head(head: &[u8]) -> Option<Option<PathBuf>> {
    use goblin::elf::{Elf, program_header};
    let header = Elf::parse_header(head).ok()?;
    let context = goblin::container::Ctx::new(header.container().ok()?, header.endianness().ok()?);
    let offset = usize::try_from(header.e_phoff).ok()?;
    let count = usize::from(header.e_phnum);
    let span = count.checked_mul(usize::from(header.e_phentsize))?;
    if offset.checked_add(span)? > head.len() {
        return None;
    }
    let headers = program_header::ProgramHeader::parse(head, offset, count, context).ok()?;
    let Some(interp) = headers
        .iter()
        .find(|h| h.p_type == program_header::PT_INTERP)
    else {
        return Some(None);
    };
    let start = usize::try_from(interp.p_offset).ok()?;
    let text = head.get(start..start.checked_add(usize::try_from(interp.p_filesz).ok()?)?)?;
    let text = text.split(|&b| b == 0).next().unwrap_or(text);
    Some(Some(PathBuf::from(std::str::from_utf8(text).ok()?)))
}

/// `PT_INTERP` of an ELF file, if any.
fn interpreter_of(bytes: &[u8]) -> Option<PathBuf> {
    let elf = goblin::elf::Elf::parse(bytes).ok()?;
    elf.interpreter.map(PathBuf::from)
}

/// The `name => path (address)` lines of `ld.so --list`.
fn parse_list(text: &str) -> Vec<NeededLibrary> {
    text.lines()
        .filter_map(|line| {
            let (name, rest) = line.trim().split_once(" => ")?;
            let path = rest.rsplit_once(" (").map_or(rest, |(p, _)| p).trim();
            path.starts_with('/').then(|| NeededLibrary {
                name: name.to_string(),
                path: PathBuf::from(path),
            })
        })
        .collect()
}

/// An instrumented library the program will load.
#[derive(Clone, Debug)]
pub struct InstrumentedLibrary {
    /// The library as the program needs it.
    pub library: NeededLibrary,
    /// Its object number (the high bits of its record ids).
    pub object: u32,
    /// The instrumented copy.
    pub path: PathBuf,
    /// Its annotation: an outline (no loads) when `outline`.
    pub annotation: Annotation,
    /// Each load's flags, in order.
    pub load_flags: Vec<LoadFlags>,
    /// Whether `annotation` is an outline ([`Libraries::prepare_as`] with
    /// [`Decode::Outline`]).
    pub outline: bool,
}

/// The libraries of one run: the instrumented ones, the private directory
/// that makes the program load them, and those left original.
#[derive(Debug, Default)]
pub struct Libraries {
    /// Instrumented, in object order.
    pub instrumented: Vec<InstrumentedLibrary>,
    /// Selected but left original, with the reason (one line).
    pub refused: Vec<(NeededLibrary, String)>,
    /// The directories put first on `LD_LIBRARY_PATH`: each copy's cache
    /// entry, or the private directory below.
    search: Vec<PathBuf>,
    /// Without a cache, the private directory (the copies and links to
    /// them under their needed names); removed with this value.
    directory: Option<tempfile::TempDir>,
    /// `--libs`.
    selection: LibSelection,
    /// With a cache, the file that remembers the selected libraries the
    /// program loaded after its start ([`Libraries::loaded_at_run`]).
    remembered: Option<PathBuf>,
    /// Names of every library the loader maps at start (`ld.so --list`:
    /// those the libraries need too), so that one the executable does not
    /// need itself is not taken for a `dlopen`ed one.
    at_start: Vec<String>,
    /// Patterns written in `--libs` that match none of the libraries
    /// loaded at start or remembered from earlier runs.
    pub unmatched: Vec<String>,
}

/// What [`Libraries::loaded_at_run`] found.
#[derive(Debug, Default)]
pub struct LoadedAtRun {
    /// Libraries the run loaded that ran uninstrumented and that the trace
    /// header did not name (`dlopen`ed ones, what those need, and those
    /// loaded at start because another library needs them): names.
    pub untraced: Vec<String>,
    /// Those of `untraced` loaded at start (needed by a library the
    /// executable needs), not by `dlopen`.
    pub at_start: Vec<String>,
    /// Those of `untraced` that are instrumented libraries whose original
    /// ran instead of the copy: the loader takes a `dlopen`ed path as it is
    /// (and a process that drops `LD_LIBRARY_PATH` finds the originals), so
    /// the copy offered by name was not used.
    pub originals: Vec<String>,
    /// Those of them `--libs` selects: instrumented from the next run on
    /// when `remembered`.
    pub selected: Vec<String>,
    /// Whether `selected` were remembered for the next run (there is a
    /// cache).
    pub remembered: bool,
}

impl LoadedAtRun {
    /// Names the libraries in `header` as untraced ones.
    pub fn name_in(&self, header: &mut TraceHeader) {
        header.labels.extend(
            self.untraced
                .iter()
                .map(|name| (SHARED_LIBRARY_LABEL.to_string(), name.clone())),
        );
    }

    /// The note naming the libraries loaded after the start and not
    /// traced, and what becomes of those `--libs` selects; `None` when
    /// there are none.
    pub fn note(&self) -> Option<String> {
        let opened: Vec<&str> = self
            .untraced
            .iter()
            .filter(|name| !self.at_start.contains(name) && !self.originals.contains(name))
            .map(String::as_str)
            .collect();
        let originals = (!self.originals.is_empty()).then(|| {
            format!(
                "instrumented libraries whose original was loaded instead of the copy ran untraced: {} (the loader takes a `dlopen`ed path as it is, and a process that drops LD_LIBRARY_PATH finds the originals)",
                self.originals.join(", ")
            )
        });
        if opened.is_empty() {
            return originals;
        }
        let mut note = format!(
            "libraries loaded after the start (dlopen) ran untraced: {}",
            opened.join(", ")
        );
        if !self.selected.is_empty() {
            note.push_str(&format!(
                "; --libs selects {}: {}",
                self.selected.join(", "),
                if self.remembered {
                    "instrumented from the next run on (remembered in the cache)"
                } else {
                    "not instrumented (no cache to remember them in for the next run)"
                }
            ));
        }
        if let Some(originals) = originals {
            note.push_str("; ");
            note.push_str(&originals);
        }
        Some(note)
    }
}

impl Libraries {
    /// Names of the libraries the loader maps at start, in its order
    /// (`ld.so --list`); empty when not resolved.
    pub fn at_start(&self) -> &[String] {
        &self.at_start
    }

    /// Instruments the selected libraries of `program` into `cache` (or a
    /// temporary directory when `None`), calling `progress` before each
    /// one it instruments now.
    pub fn prepare(
        program: &Path,
        selection: &LibSelection,
        cache: Option<&Path>,
        progress: impl FnMut(&Path),
    ) -> Result<Libraries> {
        Self::prepare_as(program, selection, cache, Decode::Whole, progress)
    }

    /// [`Libraries::prepare`], with the annotations of copies found in the
    /// cache decoded as `decode` says.
    pub fn prepare_as(
        program: &Path,
        selection: &LibSelection,
        cache: Option<&Path>,
        decode: Decode,
        mut progress: impl FnMut(&Path),
    ) -> Result<Libraries> {
        let mut libraries = Libraries {
            selection: selection.clone(),
            remembered: cache.map(|cache| remembered_file(cache, program)),
            ..Libraries::default()
        };
        if selection.is_empty() {
            // Only to tell libraries loaded at start from `dlopen`ed ones.
            libraries.at_start = needed_libraries(program)
                .unwrap_or_default()
                .into_iter()
                .map(|l| l.name)
                .collect();
            return Ok(libraries);
        }
        // With a cache, nothing temporary: a killed run leaves no directory.
        let directory = match cache {
            Some(_) => None,
            None => Some(
                memgaze_output::private_tempdir().context("cannot create a temporary directory")?,
            ),
        };
        let cache = match (cache, &directory) {
            (Some(cache), _) => cache.to_path_buf(),
            (None, Some(directory)) => directory.path().join("cache"),
            (None, None) => unreachable!("a directory without a cache"),
        };
        let needed = needed_libraries(program)?;
        libraries.at_start = needed.iter().map(|l| l.name.clone()).collect();
        let mut selected: Vec<NeededLibrary> = needed
            .into_iter()
            .filter(|l| selection.selects(&l.name))
            .collect();
        let remembered: Vec<NeededLibrary> = libraries
            .remembered
            .iter()
            .flat_map(|f| read_remembered(f))
            .collect();
        let known: Vec<String> = (libraries.at_start.iter().cloned())
            .chain(remembered.iter().map(|l| l.name.clone()))
            .collect();
        libraries.unmatched = selection
            .unmatched(&known)
            .into_iter()
            .map(str::to_string)
            .collect();
        // Loaded later by earlier runs (`dlopen`): offered under their names.
        for library in remembered {
            if selection.selects(&library.name)
                && library.path.is_file()
                && !selected.iter().any(|l| l.name == library.name)
            {
                selected.push(library);
            }
        }
        for library in selected {
            let object = libraries.instrumented.len() as u32 + 1;
            if object > memgaze_instrument::rewrite::library::MAX_OBJECT {
                libraries
                    .refused
                    .push((library, "more libraries than record ids can number".into()));
                continue;
            }
            let key = format!("library object {object}");
            let copy = crate::pipeline::instrumented::cached_as(
                &library.path,
                &cache,
                key.as_bytes(),
                decode,
                |input, output| {
                    progress(input);
                    let result =
                        memgaze_instrument::instrument_library_file(input, output, object)?;
                    Ok((result.annotation, result.report))
                },
            );
            match copy {
                Ok(copy) => {
                    let search =
                        link_under_needed_name(&copy.path, &library.name, directory.as_ref())?;
                    if !libraries.search.contains(&search) {
                        libraries.search.push(search);
                    }
                    libraries.instrumented.push(InstrumentedLibrary {
                        library,
                        object,
                        outline: copy.outline.is_some(),
                        load_flags: copy.outline.unwrap_or_else(|| {
                            copy.annotation.loads.iter().map(LoadFlags::of).collect()
                        }),
                        path: copy.path,
                        annotation: copy.annotation,
                    });
                }
                Err(e) => {
                    let reason = memgaze_error::one_line(&e);
                    libraries.refused.push((library, reason));
                }
            }
        }
        libraries.directory = directory;
        Ok(libraries)
    }

    /// Makes `command` load the instrumented copies: the private directory
    /// first on `LD_LIBRARY_PATH`.
    pub fn apply(&self, command: &mut Command) {
        if self.instrumented.is_empty() {
            return;
        }
        let mut value = OsString::new();
        for (i, directory) in self.search.iter().enumerate() {
            if i > 0 {
                value.push(":");
            }
            value.push(directory);
        }
        if let Some(old) = std::env::var_os("LD_LIBRARY_PATH").filter(|v| !v.is_empty()) {
            value.push(":");
            value.push(old);
        }
        command.env("LD_LIBRARY_PATH", value);
    }

    /// Adds the libraries' functions and loads to `header` (after the
    /// executable's), and returns the first trace load index of each object
    /// (object 0, the executable, first): the collector turns a record id
    /// `object << 24 | load` into `bases[object] + load`.
    pub fn extend_header(&self, header: &mut TraceHeader) -> Vec<u32> {
        let counts = (header.functions.len() as u32, header.loads.len() as u32);
        let bases = self.extend_labels(header, counts);
        for library in &self.instrumented {
            debug_assert!(!library.outline, "an outline has no loads to list");
            append_sites(header, &library.library.name, &library.annotation);
        }
        bases
    }

    /// The libraries in `loaded` (the files a run had mapped executable,
    /// `Recording::loaded_objects`) that ran uninstrumented and that
    /// `header` does not name yet, by `DT_SONAME` (else file name), leaving
    /// out `program`'s file, its dynamic loader and the instrumented
    /// copies; those `--libs` selects are remembered (with a cache) and
    /// instrumented by the next run, which offers them to `dlopen` by
    /// name. [`LoadedAtRun::name_in`] adds them to a header.
    pub fn loaded_at_run(
        &self,
        loaded: &[PathBuf],
        program: &Path,
        header: &TraceHeader,
    ) -> LoadedAtRun {
        let canonical = |p: &Path| std::fs::canonicalize(p).unwrap_or_else(|_| p.to_path_buf());
        let mut skip: Vec<PathBuf> = vec![canonical(program)];
        skip.extend(
            interpreter_of_file(program)
                .ok()
                .flatten()
                .map(|i| canonical(&i)),
        );
        skip.extend(self.instrumented.iter().map(|l| canonical(&l.path)));
        let named = |name: &str| {
            header
                .labels
                .iter()
                .any(|(key, value)| key == SHARED_LIBRARY_LABEL && value == name)
        };
        let mut found = LoadedAtRun::default();
        let mut remembered: Vec<NeededLibrary> = self
            .remembered
            .as_deref()
            .map(read_remembered)
            .unwrap_or_default();
        for path in loaded.iter().filter(|p| !skip.contains(p)) {
            let Some(name) = object_name(path) else {
                continue;
            };
            if found.untraced.contains(&name) {
                continue;
            }
            // Not the copy (copies are skipped), yet one of its names.
            if self.instrumented.iter().any(|l| l.library.name == name) {
                found.originals.push(name.clone());
                found.untraced.push(name);
                continue;
            }
            if named(&name) {
                continue;
            }
            if self.at_start.contains(&name) {
                // Selected ones were instrumented, or refused, at start.
                found.at_start.push(name.clone());
                found.untraced.push(name);
                continue;
            }
            if self.selection.selects(&name) && !self.refused.iter().any(|(l, _)| l.name == name) {
                found.selected.push(name.clone());
                if !remembered.iter().any(|l| l.name == name) {
                    remembered.push(NeededLibrary {
                        name: name.clone(),
                        path: path.clone(),
                    });
                }
            }
            found.untraced.push(name);
        }
        if !found.selected.is_empty()
            && let Some(file) = &self.remembered
        {
            found.remembered = write_remembered(file, &remembered).is_ok();
        }
        found
    }

    /// Leaves the annotations unfreed (the command is ending: the process
    /// exit frees them at no cost) and drops the rest, the private
    /// directory included.
    pub fn forget_annotations(mut self) {
        std::mem::forget(std::mem::take(&mut self.instrumented));
    }

    /// Reads the annotations of outlines again, whole.
    pub fn read_whole(&mut self) -> Result<()> {
        for library in self.instrumented.iter_mut().filter(|l| l.outline) {
            library.annotation = memgaze_instrument::rewrite::read_annotation(&library.path)?;
            library.outline = false;
        }
        Ok(())
    }

    /// [`Libraries::extend_header`] with every library's annotation whole:
    /// outlines are read again.
    pub fn extend_header_whole(&self, header: &mut TraceHeader) -> Result<Vec<u32>> {
        let counts = (header.functions.len() as u32, header.loads.len() as u32);
        let bases = self.extend_labels(header, counts);
        for library in &self.instrumented {
            if library.outline {
                let whole = memgaze_instrument::rewrite::read_annotation(&library.path)?;
                append_sites(header, &library.library.name, &whole);
            } else {
                append_sites(header, &library.library.name, &library.annotation);
            }
        }
        Ok(bases)
    }

    /// The labels [`Libraries::extend_header`] gives a header whose
    /// executable has `(functions, loads)` sites, without the sites
    /// themselves (they come encoded: `pipeline::sites`); returns the same
    /// object bases.
    pub fn extend_labels(
        &self,
        header: &mut TraceHeader,
        (functions, loads): (u32, u32),
    ) -> Vec<u32> {
        let mut bases = vec![0];
        if self.instrumented.is_empty() {
            return Vec::new();
        }
        // Traced now: no longer named untraced.
        header.labels.retain(|(key, value)| {
            key != SHARED_LIBRARY_LABEL
                || !self.instrumented.iter().any(|l| &l.library.name == value)
        });
        header.labels.push((
            memgaze_trace::LIBRARY_ESCAPES_LABEL.to_string(),
            memgaze_trace::LIBRARY_ESCAPES_COUNTED.to_string(),
        ));
        let (mut function_base, mut load_base) = (functions, loads);
        for library in &self.instrumented {
            bases.resize(library.object as usize + 1, u32::MAX);
            bases[library.object as usize] = load_base;
            header.labels.push((
                OBJECT_LABEL.to_string(),
                format!("{function_base} {load_base} {}", library.library.name),
            ));
            function_base += library.annotation.functions.len() as u32;
            load_base += library.load_flags.len() as u32;
        }
        bases
    }

    /// Each instrumented library's escape sites by object number
    /// ([`memgaze_record::Objects::library_escapes`]), their functions
    /// named as [`Libraries::extend_header`] names them
    /// (`<name>!<function>`).
    pub fn escape_sites(&self) -> Vec<Vec<memgaze_trace::EscapeCount>> {
        let mut by_object = Vec::new();
        for library in &self.instrumented {
            let object = library.object as usize;
            if by_object.len() <= object {
                by_object.resize(object + 1, Vec::new());
            }
            by_object[object] = memgaze_record::escape_sites(&library.annotation)
                .into_iter()
                .map(|mut escape| {
                    if !escape.function.is_empty() {
                        escape.function = format!("{}!{}", library.library.name, escape.function);
                    }
                    escape
                })
                .collect();
        }
        by_object
    }

    /// Which of the header's loads records may name (instrumented ones), in
    /// the order [`Libraries::extend_header`] appends them.
    pub fn valid_loads(&self, executable: &Annotation) -> Vec<bool> {
        let flags: Vec<LoadFlags> = executable.loads.iter().map(LoadFlags::of).collect();
        self.valid_loads_after(&flags)
    }

    /// [`Libraries::valid_loads`] for an executable whose loads have
    /// `executable` flags.
    pub fn valid_loads_after(&self, executable: &[LoadFlags]) -> Vec<bool> {
        executable
            .iter()
            .chain(self.instrumented.iter().flat_map(|l| &l.load_flags))
            .map(|flags| flags.instrumented)
            .collect()
    }
}

/// Where the cache `cache` remembers the selected libraries `program`
/// loaded after its start: one file per program path.
fn remembered_file(cache: &Path, program: &Path) -> PathBuf {
    use sha2::Digest;
    let program = std::fs::canonicalize(program).unwrap_or_else(|_| program.to_path_buf());
    let digest = sha2::Sha256::digest(program.as_os_str().as_encoded_bytes());
    let hex: String = digest[..8].iter().map(|b| format!("{b:02x}")).collect();
    cache.join("loaded-at-run").join(hex)
}

/// The `name<TAB>path` lines of a remembered file (none when it cannot be
/// read).
fn read_remembered(file: &Path) -> Vec<NeededLibrary> {
    std::fs::read_to_string(file)
        .unwrap_or_default()
        .lines()
        .filter_map(|line| {
            let (name, path) = line.split_once('\t')?;
            Some(NeededLibrary {
                name: name.to_string(),
                path: PathBuf::from(path),
            })
        })
        .collect()
}

/// Writes `libraries` as [`read_remembered`] reads them (whole or not at
/// all: a file beside it renamed over it).
fn write_remembered(file: &Path, libraries: &[NeededLibrary]) -> std::io::Result<()> {
    use std::fmt::Write;
    let mut text = String::new();
    for l in libraries {
        let _ = writeln!(text, "{}\t{}", l.name, l.path.display());
    }
    std::fs::create_dir_all(file.parent().unwrap_or(Path::new(".")))?;
    let partial = file.with_extension(format!("{}.partial", std::process::id()));
    std::fs::write(&partial, text)?;
    std::fs::rename(&partial, file)
}

/// The name a loaded library is needed by: its `DT_SONAME`, else its file
/// name; `None` for a file that is not a shared object.
fn object_name(path: &Path) -> Option<String> {
    let bytes = std::fs::read(path).ok()?;
    let elf = goblin::elf::Elf::parse(&bytes).ok()?;
    // A position-independent executable is `ET_DYN` too, with an
    // interpreter and no `DT_SONAME` (libc has both).
    if elf.header.e_type != goblin::elf::header::ET_DYN
        || (elf.interpreter.is_some() && elf.soname.is_none())
    {
        return None;
    }
    elf.soname
        .map(str::to_string)
        .or_else(|| Some(path.file_name()?.to_string_lossy().into_owned()))
}

/// Appends the functions (named `<name>!<function>`) and loads of the
/// library `name` to `header`, renumbered after those already there.
fn append_sites(header: &mut TraceHeader, name: &str, annotation: &Annotation) {
    let lib = memgaze_record::trace_header(annotation, header.sampling, Vec::new());
    let function_base = header.functions.len() as u32;
    let load_base = header.loads.len() as u32;
    header
        .functions
        .extend(lib.functions.into_iter().map(|mut f| {
            f.name = format!("{name}!{}", f.name);
            f
        }));
    header
        .loads
        .extend(lib.loads.into_iter().map(|l| LoadEntry {
            function: l.function.map(|f| f + function_base),
            proxy: l.proxy.map(|p| p + load_base),
            ..l
        }));
}

/// Makes the loader find `copy` as `needed` and returns the directory to
/// search: `directory` (the private one) with a link in it, else the copy's
/// own cache entry, with a link there where the copy's file name is not the
/// needed one. `LD_LIBRARY_PATH` cannot name a directory containing `:`.
fn link_under_needed_name(
    copy: &Path,
    needed: &str,
    directory: Option<&tempfile::TempDir>,
) -> Result<PathBuf> {
    let (search, target) = match directory {
        Some(directory) => (directory.path().to_path_buf(), copy.to_path_buf()),
        None => {
            let entry = copy.parent().context("a cached copy has a directory")?;
            let name = copy.file_name().context("a cached copy has a name")?;
            let entry = std::path::absolute(entry)
                .with_context(|| format!("{}: no absolute path", entry.display()))?;
            (entry, PathBuf::from(name))
        }
    };
    if search.as_os_str().as_encoded_bytes().contains(&b':') {
        bail!(
            "{}: a library directory whose name contains ':' cannot be put on LD_LIBRARY_PATH",
            search.display()
        );
    }
    let link = search.join(needed);
    // `copy` may be relative (a `target/` cache found from the current
    // directory) where `search` is absolute: compared as the same file, a
    // copy already under the needed name is not linked onto itself.
    let copy_absolute = std::path::absolute(copy)
        .with_context(|| format!("{}: no absolute path", copy.display()))?;
    if link != copy_absolute {
        match std::os::unix::fs::symlink(&target, &link) {
            Ok(()) => {}
            // Made by an earlier run (the cache entry is the same copy).
            Err(e)
                if e.kind() == std::io::ErrorKind::AlreadyExists
                    && std::fs::read_link(&link).is_ok_and(|t| t == target) => {}
            Err(e) => {
                return Err(e).with_context(|| format!("cannot link {}", link.display()));
            }
        }
    }
    Ok(search)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ld_so_list_lines_give_names_and_paths() {
        let text = "\tlinux-vdso.so.1 (0x00007ffd)\n\tlibc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x00007f)\n\tlibfoo.so => not found\n\t/lib64/ld-linux-x86-64.so.2 (0x00007f)\n";
        assert_eq!(
            parse_list(text),
            vec![NeededLibrary {
                name: "libc.so.6".into(),
                path: "/lib/x86_64-linux-gnu/libc.so.6".into()
            }]
        );
    }

    #[test]
    fn the_interpreter_is_read_from_the_head_of_the_file() {
        let exe = std::env::current_exe().unwrap();
        let whole = interpreter_of(&std::fs::read(&exe).unwrap());
        assert!(whole.is_some(), "test executables are dynamically linked");
        assert_eq!(interpreter_of_file(&exe).unwrap(), whole);
        let head = std::fs::read(&exe).unwrap()[..HEAD_BYTES as usize].to_vec();
        assert_eq!(interpreter_in_head(&head), Some(whole));
        // Cut before the string: not answered from the head.
        assert_eq!(interpreter_in_head(&head[..64]), None);
        assert_eq!(interpreter_in_head(b"not an ELF file"), None);
    }

    #[test]
    fn libs_values() {
        assert!(LibSelection::parse("none").unwrap().is_empty());
        let d = LibSelection::parse("default").unwrap();
        assert!(d.selects("libc.so.6") && d.selects("libgcc_s.so.1") && !d.selects("libz.so.1"));
        let all = LibSelection::parse("*").unwrap();
        assert!(all.selects("libz.so.1"));
        let keyword = LibSelection::parse("all").unwrap();
        assert!(keyword.selects("libz.so.1") && keyword.selects("libc.so.6"));
        assert_eq!(keyword.unmatched(&[]), ["all"]);
        assert!(
            LibSelection::parse("all, libz*")
                .unwrap()
                .unmatched(&["libc.so.6".into()])
                == ["libz*"]
        );
        let some = LibSelection::parse("default, libsqlite3*").unwrap();
        assert!(some.selects("libsqlite3.so.0") && some.selects("libm.so.6"));
        assert!(LibSelection::parse("none,libc*").is_err());
        assert!(LibSelection::parse("libc,").is_err());
        assert!(LibSelection::parse("[").is_err());
    }
}
