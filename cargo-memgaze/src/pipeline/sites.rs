//! The trace header's functions and load sites of an instrumented program,
//! encoded once and kept beside its annotation (`<copy>.memgaze.sites`).
//!
//! On a large program they are most of `record`'s start-up (encoding 137,879
//! load sites of `rg` as JSON and compressing it took two thirds of it);
//! they depend only on the annotation, so the cache file is keyed by the
//! annotation's content and made again whenever it differs. A cache that
//! cannot be written (a read-only directory) only costs the encoding on
//! every run; a damaged one is not used.

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
}

/// Reads the annotation of the instrumented `program` and, with
/// `want_sites`, its encoded sites: from the cache when it matches the
/// annotation's bytes (the annotation is then decoded without its loads'
/// texts), else encoded now and cached. Errors are those of
/// [`instrument::read_annotation`]; sites that cannot be encoded are left
/// out (the caller builds the whole header, which reports why).
pub fn read_for_record(program: &Path, want_sites: bool) -> anyhow::Result<RecordInputs> {
    let Ok(bytes) = std::fs::read(instrument::annotation_path(program)) else {
        return whole(program);
    };
    if !want_sites {
        return match Annotation::from_bytes(&bytes) {
            Ok(annotation) => Ok(RecordInputs {
                annotation,
                sites: None,
                without_load_texts: false,
            }),
            Err(_) => whole(program),
        };
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
        });
    }
    let Ok(annotation) = Annotation::from_bytes(&bytes) else {
        return whole(program);
    };
    let sites = memgaze_record::encode_sites(&annotation, key).ok();
    if let Some(sites) = &sites {
        // Best effort: the cache only saves time.
        if let Ok(mut file) = memgaze_output::AtomicFile::create(&path) {
            use std::io::Write;
            if file.write_all(&sites.to_bytes()).is_ok() {
                let _ = file.commit();
            }
        }
    }
    Ok(RecordInputs {
        annotation,
        sites,
        without_load_texts: false,
    })
}

/// The annotation read as every command reads it, for its error.
fn whole(program: &Path) -> anyhow::Result<RecordInputs> {
    Ok(RecordInputs {
        annotation: instrument::read_annotation(program)?,
        sites: None,
        without_load_texts: false,
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
