//! A trace header's functions and load sites encoded once, for every
//! recording of the same instrumented program.
//!
//! They depend only on the annotation, and on a large program they are
//! most of the header: encoding them as JSON and compressing that took
//! two thirds of the recorder's start-up on `rg` (137,879 load sites).
//! [`EncodedSites`] holds them as one zstd frame of the header's JSON
//! text `"functions":[…],"loads":[…]`; [`crate::TraceWriter::with_sites`]
//! writes the header chunk as three frames (the JSON before, this one, the
//! JSON after), which zstd decompresses as one payload. The file format
//! does not change: every reader sees the same header JSON as with
//! [`crate::TraceWriter::new`].

use super::error::TraceError;
use super::model::{FunctionEntry, LoadEntry, TraceHeader};

/// First bytes of [`EncodedSites::to_bytes`].
const MAGIC: [u8; 8] = *b"MGZSITE1";
/// Fixed part of [`EncodedSites::to_bytes`]: magic, key, counts, raw
/// length, frame checksum.
const FIXED_LEN: usize = 8 + 8 + 8 + 8 + 8 + 4 + 4;
/// The frame is made once per program, so a slow level costs nothing per
/// run: on `rg`'s 11 MB of site JSON, 9 gives 0.60 MB in 0.2 s where the
/// records' level 1 gives 0.81 MB (3 gave 0.91 MB).
const SITES_ZSTD_LEVEL: i32 = 9;
/// What a header without functions and loads holds between the command
/// and the labels (a JSON string cannot hold these bare quotes).
const HOLE: &[u8] = br#""functions":[],"loads":[]"#;

/// A header's functions and loads as one compressed JSON frame, with the
/// key of what they were derived from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EncodedSites {
    /// Identifies the source (e.g. the annotation's length and checksum):
    /// a cache whose key differs is stale.
    pub key: u64,
    functions: u64,
    loads: u64,
    raw_len: u32,
    frame: Vec<u8>,
}

impl EncodedSites {
    /// Encodes `functions` and `loads` as a header would hold them. Refuses
    /// what a header may not hold (a function or proxy index out of range).
    pub fn encode(
        key: u64,
        functions: &[FunctionEntry],
        loads: &[LoadEntry],
    ) -> Result<Self, TraceError> {
        let mut probe = super::format::placeholder_header();
        probe.functions = functions.to_vec();
        probe.loads = loads.to_vec();
        super::format::validate_header(&probe)
            .map_err(|what| TraceError::InvalidHeader { what })?;
        let encode_error = |source| TraceError::Encode {
            what: "cannot encode trace header",
            source,
        };
        let mut json = br#""functions":"#.to_vec();
        serde_json::to_writer(&mut json, functions).map_err(encode_error)?;
        json.extend_from_slice(br#","loads":"#);
        serde_json::to_writer(&mut json, loads).map_err(encode_error)?;
        let raw_len = u32::try_from(json.len()).map_err(|_| TraceError::InvalidHeader {
            what: "trace header larger than 4 GiB".into(),
        })?;
        let frame = zstd::bulk::compress(&json, SITES_ZSTD_LEVEL)
            .map_err(TraceError::io("zstd compression failed"))?;
        Ok(EncodedSites {
            key,
            functions: functions.len() as u64,
            loads: loads.len() as u64,
            raw_len,
            frame,
        })
    }

    /// Number of load sites.
    pub fn loads(&self) -> usize {
        self.loads as usize
    }

    /// Number of functions.
    pub fn functions(&self) -> usize {
        self.functions as usize
    }

    /// The bytes of a cache file.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(FIXED_LEN + self.frame.len());
        out.extend_from_slice(&MAGIC);
        out.extend_from_slice(&self.key.to_le_bytes());
        out.extend_from_slice(&self.functions.to_le_bytes());
        out.extend_from_slice(&self.loads.to_le_bytes());
        out.extend_from_slice(&u64::from(self.raw_len).to_le_bytes());
        out.extend_from_slice(&crc32fast::hash(&self.frame).to_le_bytes());
        out.extend_from_slice(&(self.frame.len() as u32).to_le_bytes());
        out.extend_from_slice(&self.frame);
        out
    }

    /// Reads what [`EncodedSites::to_bytes`] wrote; `None` for anything
    /// else (wrong magic, truncated, damaged frame): the caller encodes
    /// again.
    pub fn from_bytes(bytes: &[u8]) -> Option<Self> {
        let word = |at: usize| -> Option<u64> {
            Some(u64::from_le_bytes(bytes.get(at..at + 8)?.try_into().ok()?))
        };
        if bytes.len() < FIXED_LEN || bytes[..8] != MAGIC {
            return None;
        }
        let crc = u32::from_le_bytes(bytes[40..44].try_into().ok()?);
        let len = u32::from_le_bytes(bytes[44..48].try_into().ok()?) as usize;
        let frame = bytes.get(FIXED_LEN..)?;
        if frame.len() != len || crc32fast::hash(frame) != crc {
            return None;
        }
        Some(EncodedSites {
            key: word(8)?,
            functions: word(16)?,
            loads: word(24)?,
            raw_len: u32::try_from(word(32)?).ok()?,
            frame: frame.to_vec(),
        })
    }
}

/// The header chunk's payload as zstd frames: `header` (whose functions
/// and loads must be empty) with `sites` in place of its empty lists.
/// Returns the stored bytes and the raw length.
pub(crate) fn header_frames(
    header: &TraceHeader,
    sites: &EncodedSites,
    compressor: &mut zstd::bulk::Compressor<'static>,
) -> Result<(Vec<u8>, u32), TraceError> {
    if !header.functions.is_empty() || !header.loads.is_empty() {
        return Err(TraceError::Misuse {
            what: "a header written with encoded sites must list no functions or loads".into(),
        });
    }
    let json = serde_json::to_vec(header).map_err(|source| TraceError::Encode {
        what: "cannot encode trace header",
        source,
    })?;
    let at = json
        .windows(HOLE.len())
        .position(|w| w == HOLE)
        .ok_or_else(|| TraceError::Misuse {
            what: "trace header JSON has no functions and loads fields".into(),
        })?;
    let (before, after) = (&json[..at], &json[at + HOLE.len()..]);
    let compress = |c: &mut zstd::bulk::Compressor<'static>, raw: &[u8]| {
        c.compress(raw)
            .map_err(TraceError::io("zstd compression failed"))
    };
    let mut stored = compress(compressor, before)?;
    stored.extend_from_slice(&sites.frame);
    stored.extend_from_slice(&compress(compressor, after)?);
    let raw_len = (before.len() + after.len())
        .checked_add(sites.raw_len as usize)
        .and_then(|n| u32::try_from(n).ok())
        .ok_or_else(|| TraceError::InvalidHeader {
            what: "trace header larger than 4 GiB".into(),
        })?;
    Ok((stored, raw_len))
}
