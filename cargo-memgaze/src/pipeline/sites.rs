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
use memgaze_metadata::annotation::Annotation;
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
    /// The executable and instrumented libraries: the annotation is decoded
    /// without load texts, and [`with_libraries`] finds the sites once the
    /// libraries are known.
    WithLibraries,
    /// None (the annotation is decoded whole).
    Nothing,
}

/// What `record` reads of an instrumented program.
pub struct RecordInputs {
    /// Its annotation; without the loads' texts when `sites` came from the
    /// cache (the header takes them from there).
    pub annotation: Annotation,
    /// The header's functions and loads, encoded once.
    pub sites: Option<EncodedSites>,
    /// Whether `annotation`'s loads were decoded without their texts
    /// ([`Annotation::from_bytes_without_load_texts`]).
    pub without_load_texts: bool,
    /// The key of the annotation's bytes, when read ([`SitesFor::WithLibraries`]).
    key: Option<u64>,
}

/// Reads the annotation of the instrumented `program` and, for
/// [`SitesFor::Executable`], its encoded sites: from the cache when it
/// matches the annotation's bytes (the annotation is then decoded without
/// its loads' texts), else encoded now and cached. Errors are those of
/// [`instrument::read_annotation`]; sites that cannot be encoded are left
/// out (the caller builds the whole header, which reports why).
pub fn read_for_record(program: &Path, sites_for: SitesFor) -> anyhow::Result<RecordInputs> {
    let Ok(bytes) = std::fs::read(instrument::annotation_path(program)) else {
        return whole(program);
    };
    let decoded = match sites_for {
        SitesFor::Executable => None,
        SitesFor::WithLibraries => Some(Annotation::from_bytes_without_load_texts(&bytes).map(
            |annotation| RecordInputs {
                annotation,
                sites: None,
                without_load_texts: true,
                key: Some(content_key(&bytes)),
            },
        )),
        SitesFor::Nothing => Some(
            Annotation::from_bytes(&bytes).map(|annotation| RecordInputs {
                annotation,
                sites: None,
                without_load_texts: false,
                key: None,
            }),
        ),
    };
    match decoded {
        Some(Ok(inputs)) => return Ok(inputs),
        Some(Err(_)) => return whole(program),
        None => {}
    }
    let key = content_key(&bytes);
    let path = sites_path(program);
    if let Ok(cached) = std::fs::read(&path)
        && let Some(sites) = EncodedSites::from_bytes(&cached)
        && sites.key == key
        && let Ok(annotation) = Annotation::from_bytes_without_load_texts(&bytes)
        && sites.loads() == annotation.loads.len()
        && sites.functions() == annotation.functions.len()
    {
        return Ok(RecordInputs {
            annotation,
            sites: Some(sites),
            without_load_texts: true,
            key: Some(key),
        });
    }
    let Ok(annotation) = Annotation::from_bytes(&bytes) else {
        return whole(program);
    };
    let sites = memgaze_record::encode_sites(&annotation, key).ok();
    if let Some(sites) = &sites {
        store(&path, sites);
    }
    Ok(RecordInputs {
        annotation,
        sites,
        without_load_texts: false,
        key: Some(key),
    })
}

/// Finds the sites of `inputs` (read with [`SitesFor::WithLibraries`])
/// followed by those of `libraries`: from the cache beside `program` when
/// its key matches the annotation's bytes and every library's copy (whose
/// cache entry names the content it was made from), else encoded now from
/// the whole annotations (read again: `inputs` and `libraries` then hold
/// them whole) and cached. Without instrumented libraries, the
/// executable's own cached sites. Errors are those of reading an
/// annotation; sites that cannot be encoded are left out.
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
    let loads = inputs.annotation.loads.len()
        + libraries
            .instrumented
            .iter()
            .map(|l| l.annotation.loads.len())
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
    inputs.annotation = instrument::read_annotation(program)?;
    inputs.without_load_texts = false;
    for library in libraries
        .instrumented
        .iter_mut()
        .filter(|l| l.without_load_texts)
    {
        library.annotation = instrument::read_annotation(&library.path)?;
        library.without_load_texts = false;
    }
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
    Ok(RecordInputs {
        annotation: instrument::read_annotation(program)?,
        sites: None,
        without_load_texts: false,
        key: None,
    })
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
