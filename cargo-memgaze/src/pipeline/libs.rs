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

use anyhow::{Context, Result, bail};
use memgaze_metadata::annotation::Annotation;
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
}

impl LibSelection {
    /// Parses `--libs`: `none`, or a comma-separated list of globs and
    /// `default` ([`DEFAULT_LIBS`]); `'*'` selects every library.
    pub fn parse(value: &str) -> Result<LibSelection, String> {
        let mut globs = Vec::new();
        if value == "none" {
            return Ok(LibSelection { globs });
        }
        for part in value.split(',').map(str::trim) {
            let patterns: Vec<&str> = match part {
                "" => return Err(format!("--libs {value}: empty library pattern")),
                "default" => DEFAULT_LIBS.to_vec(),
                "none" => return Err(format!("--libs {value}: `none` cannot be combined")),
                other => vec![other],
            };
            for pattern in patterns {
                let glob =
                    globset::Glob::new(pattern).map_err(|e| format!("--libs {value}: {e}"))?;
                globs.push(glob.compile_matcher());
            }
        }
        Ok(LibSelection { globs })
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
    let bytes =
        std::fs::read(program).with_context(|| format!("cannot read {}", program.display()))?;
    let Some(interpreter) = interpreter_of(&bytes) else {
        return Ok(Vec::new());
    };
    let output = Command::new(&interpreter)
        .arg("--list")
        .arg(program)
        .output()
        .with_context(|| format!("cannot run {} --list", interpreter.display()))?;
    if !output.status.success() {
        bail!(
            "{} --list {}: {}",
            interpreter.display(),
            program.display(),
            String::from_utf8_lossy(&output.stderr).trim()
        );
    }
    Ok(parse_list(&String::from_utf8_lossy(&output.stdout)))
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
    /// Its annotation.
    pub annotation: Annotation,
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
}

impl Libraries {
    /// Instruments the selected libraries of `program` into `cache` (or a
    /// temporary directory when `None`), calling `progress` before each
    /// one it instruments now.
    pub fn prepare(
        program: &Path,
        selection: &LibSelection,
        cache: Option<&Path>,
        mut progress: impl FnMut(&Path),
    ) -> Result<Libraries> {
        let mut libraries = Libraries::default();
        if selection.is_empty() {
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
        let selected = needed_libraries(program)?
            .into_iter()
            .filter(|l| selection.selects(&l.name));
        for library in selected {
            let object = libraries.instrumented.len() as u32 + 1;
            if object > memgaze_instrument::rewrite::library::MAX_OBJECT {
                libraries
                    .refused
                    .push((library, "more libraries than record ids can number".into()));
                continue;
            }
            let key = format!("library object {object}");
            let copy = crate::pipeline::instrumented::cached(
                &library.path,
                &cache,
                key.as_bytes(),
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
        let mut bases = vec![0];
        if self.instrumented.is_empty() {
            return Vec::new();
        }
        // Traced now: no longer named untraced.
        header.labels.retain(|(key, value)| {
            key != SHARED_LIBRARY_LABEL
                || !self.instrumented.iter().any(|l| &l.library.name == value)
        });
        for library in &self.instrumented {
            let lib =
                memgaze_record::trace_header(&library.annotation, header.sampling, Vec::new());
            let function_base = header.functions.len() as u32;
            let load_base = header.loads.len() as u32;
            bases.resize(library.object as usize + 1, u32::MAX);
            bases[library.object as usize] = load_base;
            header.labels.push((
                OBJECT_LABEL.to_string(),
                format!("{function_base} {load_base} {}", library.library.name),
            ));
            header
                .functions
                .extend(lib.functions.into_iter().map(|mut f| {
                    f.name = format!("{}!{}", library.library.name, f.name);
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
        bases
    }

    /// Which of the header's loads records may name (instrumented ones), in
    /// the order [`Libraries::extend_header`] appends them.
    pub fn valid_loads(&self, executable: &Annotation) -> Vec<bool> {
        std::iter::once(executable)
            .chain(self.instrumented.iter().map(|l| &l.annotation))
            .flat_map(|a| a.loads.iter().map(|l| l.instrumented))
            .collect()
    }
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
    if link != copy {
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
    fn libs_values() {
        assert!(LibSelection::parse("none").unwrap().is_empty());
        let d = LibSelection::parse("default").unwrap();
        assert!(d.selects("libc.so.6") && d.selects("libgcc_s.so.1") && !d.selects("libz.so.1"));
        let all = LibSelection::parse("*").unwrap();
        assert!(all.selects("libz.so.1"));
        let some = LibSelection::parse("default, libsqlite3*").unwrap();
        assert!(some.selects("libsqlite3.so.0") && some.selects("libm.so.6"));
        assert!(LibSelection::parse("none,libc*").is_err());
        assert!(LibSelection::parse("libc,").is_err());
        assert!(LibSelection::parse("[").is_err());
    }
}
