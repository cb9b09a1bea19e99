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

/// The annotation of the instrumented `program` and the key of its bytes
/// (`None` when it was not read as one file's bytes; errors are those of
/// [`instrument::read_annotation`]).
pub fn read_annotation_keyed(program: &Path) -> anyhow::Result<(Annotation, Option<u64>)> {
    if let Ok(bytes) = std::fs::read(instrument::annotation_path(program))
        && let Ok(annotation) = Annotation::from_bytes(&bytes)
    {
        return Ok((annotation, Some(content_key(&bytes))));
    }
    // Read again for the error it names.
    Ok((instrument::read_annotation(program)?, None))
}

/// The encoded sites of `program`, whose annotation (with key `key`) is
/// `annotation`: from the cache when it matches, else encoded now and
/// cached. `None` when they cannot be encoded (the caller builds the whole
/// header, which reports why).
pub fn cached_sites(program: &Path, annotation: &Annotation, key: u64) -> Option<EncodedSites> {
    let path = sites_path(program);
    if let Ok(bytes) = std::fs::read(&path)
        && let Some(sites) = EncodedSites::from_bytes(&bytes)
        && sites.key == key
        && sites.loads() == annotation.loads.len()
        && sites.functions() == annotation.functions.len()
    {
        return Some(sites);
    }
    let sites = memgaze_record::encode_sites(annotation, key).ok()?;
    // Best effort: the cache only saves time.
    if let Ok(mut file) = memgaze_output::AtomicFile::create(&path) {
        use std::io::Write;
        if file.write_all(&sites.to_bytes()).is_ok() {
            let _ = file.commit();
        }
    }
    Some(sites)
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
