//! The trace header's functions and load sites of an instrumented program,
//! encoded once and kept beside its annotation (`<copy>.memgaze.sites`).
//!
//! On a large program they are most of `record`'s start-up (encoding 137,879
//! load sites of `rg` as JSON and compressing it took two thirds of it);
//! they depend only on the annotation, so the cache file is keyed by the
//! annotation's content and made again whenever it differs. A cache that
//! cannot be written (a read-only directory) only costs the encoding on
//! every run; a damaged one is not used.

use crate::pipeline::libs::Libraries;
use memgaze_instrument::rewrite as instrument;
use memgaze_metadata::annotation::{Annotation, LoadFlags};
use memgaze_trace::EncodedSites;
use sha2::{Digest, Sha256};
use std::path::{Path, PathBuf};

/// Where the sites of the instrumented `program` are cached.
pub fn sites_path(program: &Path) -> PathBuf {
    let mut name = program.as_os_str().to_owned();
    name.push(".memgaze.sites");
    PathBuf::from(name)
}

/// Where the sites of the instrumented `program` followed by those of its
/// instrumented libraries are cached: a file of its own, so that recording
/// with and without libraries in turn does not make either again.
pub fn sites_with_libraries_path(program: &Path) -> PathBuf {
    let mut name = program.as_os_str().to_owned();
    name.push(".memgaze.libs.sites");
    PathBuf::from(name)
}

/// Which header sites a recording will use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SitesFor {
    /// The executable alone: its cached sites are read (or made) now.
    Executable,
    /// The executable and instrumented libraries: the annotation is read as
    /// an outline, and [`with_libraries`] finds the sites once the
    /// libraries are known.
    WithLibraries,
}

/// What `record` reads of an instrumented program.
pub struct RecordInputs {
    /// Its annotation; an outline (no loads: `outline`) when `sites` came
    /// from the cache (the header takes the loads from there).
    pub annotation: Annotation,
    /// Each load's flags, in order (whole or outline).
    pub load_flags: Vec<LoadFlags>,
    /// Whether `annotation` is an outline ([`Annotation::outline_from_bytes`]).
    pub outline: bool,
    /// The header's functions and loads, encoded once; always there for an
    /// outline.
    pub sites: Option<EncodedSites>,
    /// The key of the annotation's bytes, when read ([`SitesFor::WithLibraries`]).
    key: Option<u64>,
}

impl RecordInputs {
    /// The inputs of a whole `annotation`, without sites.
    fn whole(annotation: Annotation, key: Option<u64>) -> RecordInputs {
        RecordInputs {
            load_flags: annotation.loads.iter().map(LoadFlags::of).collect(),
            annotation,
            outline: false,
            sites: None,
            key,
        }
    }

    /// The inputs of an outline, with `sites` or to be given them.
    fn outline(
        (annotation, load_flags): (Annotation, Vec<LoadFlags>),
        sites: Option<EncodedSites>,
        key: u64,
    ) -> RecordInputs {
        RecordInputs {
            annotation,
            load_flags,
            outline: true,
            sites,
            key: Some(key),
        }
    }
}

/// Reads the annotation of the instrumented `program` and, for
/// [`SitesFor::Executable`], its encoded sites: from the cache when it
/// matches the annotation's bytes (the annotation is then read as an
/// outline), else encoded now and cached. Errors are those of
/// [`instrument::read_annotation`]; sites that cannot be encoded are left
/// out (the caller builds the whole header, which reports why).
pub fn read_for_record(program: &Path, sites_for: SitesFor) -> anyhow::Result<RecordInputs> {
    let Ok(bytes) = std::fs::read(instrument::annotation_path(program)) else {
        return whole(program);
    };
    let key = content_key(&bytes);
    if sites_for == SitesFor::WithLibraries {
        return match Annotation::outline_from_bytes(&bytes) {
            Ok(outline) => Ok(RecordInputs::outline(outline, None, key)),
            Err(_) => whole(program),
        };
    }
    let path = sites_path(program);
    if let Ok(cached) = std::fs::read(&path)
        && let Some(sites) = EncodedSites::from_bytes(&cached)
        && sites.key == key
        && let Ok(outline) = Annotation::outline_from_bytes(&bytes)
        && sites.loads() == outline.1.len()
        && sites.functions() == outline.0.functions.len()
    {
        return Ok(RecordInputs::outline(outline, Some(sites), key));
    }
    let Ok(annotation) = Annotation::from_bytes(&bytes) else {
        return whole(program);
    };
    let sites = memgaze_record::encode_sites(&annotation, key).ok();
    if let Some(sites) = &sites {
        store(&path, sites);
    }
    Ok(RecordInputs {
        sites,
        ..RecordInputs::whole(annotation, Some(key))
    })
}

/// Finds the sites of `inputs` (read with [`SitesFor::WithLibraries`])
/// followed by those of `libraries`: from the cache beside `program` when
/// its key matches the annotation's bytes and every library's copy (whose
/// cache entry names the content it was made from), else encoded now from
/// the whole annotations (read again: `inputs` and `libraries` then hold
/// them whole) and cached. Without instrumented libraries, the
/// executable's own cached sites. Errors are those of reading an
/// annotation; where the sites cannot be encoded, `inputs` is left whole
/// without them.
pub fn with_libraries(
    program: &Path,
    inputs: &mut RecordInputs,
    libraries: &mut Libraries,
) -> anyhow::Result<()> {
    let Some(executable_key) = inputs.key else {
        return Ok(());
    };
    if libraries.instrumented.is_empty() {
        *inputs = read_for_record(program, SitesFor::Executable)?;
        return Ok(());
    }
    let mut hasher = Sha256::new();
    hasher.update(executable_key.to_le_bytes());
    for library in &libraries.instrumented {
        hasher.update(library.object.to_le_bytes());
        hasher.update(library.library.name.as_bytes());
        hasher.update([0]);
        hasher.update(library.path.as_os_str().as_encoded_bytes());
        hasher.update([0]);
    }
    let digest = hasher.finalize();
    let key = u64::from_le_bytes(digest[..8].try_into().unwrap_or([0; 8]));
    let functions = inputs.annotation.functions.len()
        + libraries
            .instrumented
            .iter()
            .map(|l| l.annotation.functions.len())
            .sum::<usize>();
    let loads = inputs.load_flags.len()
        + libraries
            .instrumented
            .iter()
            .map(|l| l.load_flags.len())
            .sum::<usize>();
    let path = sites_with_libraries_path(program);
    if let Ok(cached) = std::fs::read(&path)
        && let Some(sites) = EncodedSites::from_bytes(&cached)
        && sites.key == key
        && sites.loads() == loads
        && sites.functions() == functions
    {
        inputs.sites = Some(sites);
        return Ok(());
    }
    // Made now, from everything whole.
    *inputs = RecordInputs::whole(instrument::read_annotation(program)?, inputs.key);
    libraries.read_whole()?;
    let mut header = memgaze_record::trace_header(
        &inputs.annotation,
        memgaze_trace::Sampling::full(),
        Vec::new(),
    );
    libraries.extend_header(&mut header);
    inputs.sites = EncodedSites::encode(key, &header.functions, &header.loads).ok();
    if let Some(sites) = &inputs.sites {
        store(&path, sites);
    }
    Ok(())
}

/// Writes `sites` to `path`, atomically; best effort: the cache only saves
/// time.
fn store(path: &Path, sites: &EncodedSites) {
    if let Ok(mut file) = memgaze_output::AtomicFile::create(path) {
        use std::io::Write;
        if file.write_all(&sites.to_bytes()).is_ok() {
            let _ = file.commit();
        }
    }
}

/// The annotation read as every command reads it, for its error.
fn whole(program: &Path) -> anyhow::Result<RecordInputs> {
    Ok(RecordInputs::whole(
        instrument::read_annotation(program)?,
        None,
    ))
}

/// 64 bits of the SHA-256 of an annotation's bytes.
fn content_key(bytes: &[u8]) -> u64 {
    let digest = Sha256::digest(bytes);
    u64::from_le_bytes(digest[..8].try_into().unwrap_or([0; 8]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_key_follows_the_annotation_bytes() {
        assert_eq!(content_key(b"abc"), content_key(b"abc"));
        assert_ne!(content_key(b"abc"), content_key(b"abd"));
        assert_eq!(
            sites_path(Path::new("/x/prog")),
            PathBuf::from("/x/prog.memgaze.sites")
        );
    }
}
