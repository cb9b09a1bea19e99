//! The annotation: what the binary analysis knows about every load.
//!
//! Written by `classify`/`instrument` beside the instrumented executable and
//! read by the rewriter, the collectors (to map recorded load ids back to
//! original IPs) and the Intel PT address reconstruction (scale and
//! displacement literals). Two encodings of the same value: the compact
//! binary file ([`compact`], the default on disk) and versioned JSON
//! (`schema`, on request). [`Annotation::read`] tells them apart by the
//! first bytes and refuses any other schema with a clear message.

pub mod compact;
mod text;

pub use text::{InlineChain, Text, TextTable};

use crate::model::{BinaryIdentity, LoadClass};
use serde::{Deserialize, Serialize};
use std::io;
use std::num::NonZeroU64;
use std::path::{Path, PathBuf};

/// Schema tag of the current annotation format.
pub const ANNOTATION_SCHEMA: &str = "memgaze.annotation.v1";

/// How a load's instrumentation records it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum InstrumentationMode {
    /// Software recorder stub (countdown fast path, sampled buffer).
    Soft,
    /// Intel PT `ptwrite` of each source register before the load.
    Ptwrite,
}

/// Per-load facts.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LoadSite {
    /// Stable index of this load in [`Annotation::loads`]; the software
    /// recorder writes it into each record.
    pub id: u32,
    /// Address of the load instruction in the original binary.
    pub ip: u64,
    /// Length of the instruction in bytes.
    pub len: u8,
    /// Its class.
    pub class: LoadClass,
    /// Whether the load carries instrumentation (a probe).
    pub instrumented: bool,
    /// Constant loads a probe stands for besides itself (proxy compression).
    pub implied: u32,
    /// For an uninstrumented Constant load: the IP of the probe whose
    /// execution implies it (never 0, so an absent one takes no room).
    pub proxy: Option<NonZeroU64>,
    /// Base register (iced-x86 name, lower case, e.g. `rdi`), if any.
    pub base: Option<Text>,
    /// Index register, if any.
    pub index: Option<Text>,
    /// Scale applied to the index (1, 2, 4 or 8).
    pub scale: u8,
    /// Displacement literal (for RIP-relative operands: the absolute target).
    pub displacement: i64,
    /// Bytes read.
    pub size: u32,
    /// Index into [`Annotation::functions`].
    pub function: u32,
    /// `file:line` when DWARF line tables exist: the innermost position
    /// (inside inlined code, e.g. the standard library's `BTreeMap::get`).
    pub line: Option<Text>,
    /// Where the load's code is inlined (DWARF inlined subroutines): `line`,
    /// then each call it was inlined at, innermost first, out to the line of
    /// the function that holds it. Empty when not inlined.
    #[serde(default, skip_serializing_if = "InlineChain::is_empty")]
    pub inline_chain: InlineChain,
    /// Why the load could not be instrumented, when it could not.
    pub skipped: Option<Text>,
    /// `fs`/`gs` for thread-local loads (the rewriter may skip them).
    #[serde(default)]
    pub segment: Option<Segment>,
    /// A gather (VSIB): `index` names a vector register.
    #[serde(default)]
    pub gather: bool,
    /// The instruction also writes the location (`add [mem], reg`).
    #[serde(default)]
    pub read_modify_write: bool,
    /// `call [mem]` / `jmp [mem]`: the load reads a code pointer.
    #[serde(default)]
    pub control: bool,
}

/// The segment override of a thread-local load: one byte in a
/// [`LoadSite`] (a shared text was eight), written as its lower-case name.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Segment {
    /// `fs`: glibc's thread pointer on x86-64.
    Fs,
    /// `gs`.
    Gs,
}

impl Segment {
    /// The register's name as the annotation writes it (`fs`, `gs`).
    pub fn as_str(self) -> &'static str {
        match self {
            Segment::Fs => "fs",
            Segment::Gs => "gs",
        }
    }

    /// The segment named `name` ([`Segment::as_str`]), if it is one.
    pub fn from_name(name: &str) -> Option<Segment> {
        match name {
            "fs" => Some(Segment::Fs),
            "gs" => Some(Segment::Gs),
            _ => None,
        }
    }
}

/// What a recording needs of one load: [`Annotation::outline_from_bytes`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LoadFlags {
    /// [`LoadSite::instrumented`]: records may name it.
    pub instrumented: bool,
    /// It is instrumented, or implied by an instrumented load
    /// ([`LoadSite::proxy`]): counted as covered.
    pub covered: bool,
}

impl LoadFlags {
    /// The flags of `load`.
    pub fn of(load: &LoadSite) -> LoadFlags {
        LoadFlags {
            instrumented: load.instrumented,
            covered: load.instrumented || load.proxy.is_some(),
        }
    }
}

impl LoadSite {
    /// The line a reader should see: the first entry of the inline chain
    /// that `is_user` accepts (its file is the user's code), else `line`.
    /// `is_user` gets the file part of a `file:line`.
    pub fn user_line(&self, is_user: impl Fn(&str) -> bool) -> Option<&str> {
        self.inline_chain
            .iter()
            .find(|place| {
                is_user(
                    place
                        .rsplit_once(':')
                        .map_or(place.as_str(), |(file, _)| file),
                )
            })
            .map(Text::as_str)
            .or(self.line.as_deref())
    }
}

/// Per-function facts.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FunctionSite {
    /// Demangled name, or `sub_<hex start>` when unnamed.
    pub name: String,
    /// Mangled/raw symbol name when it differs from `name`.
    pub raw_name: Option<String>,
    /// First address.
    pub start: u64,
    /// Size in bytes.
    pub size: u64,
    /// Whether the function was relocated and instrumented.
    pub instrumented: bool,
    /// Why not, when it was selected but could not be instrumented.
    pub skipped: Option<String>,
    /// Implicit stack reads (`pop`, `ret`, `leave`): loads with no memory
    /// operand, never instrumented by design (the classifier's count).
    #[serde(default)]
    pub stack_loads: u32,
    /// Implicit string reads (`movs`, `lods`, `cmps`, `scas`, `outs`, with
    /// or without `rep`): never instrumented by design (the classifier's
    /// count).
    #[serde(default)]
    pub string_loads: u32,
}

/// The annotation of one binary.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Annotation {
    /// Always [`ANNOTATION_SCHEMA`].
    pub schema: String,
    /// The original binary.
    pub binary: BinaryIdentity,
    /// How the loads are instrumented; `None` for a `classify`-only result.
    pub mode: Option<InstrumentationMode>,
    /// Functions analysed.
    pub functions: Vec<FunctionSite>,
    /// Every explicit load found in them.
    pub loads: Vec<LoadSite>,
    /// `ptwrite` mode: every `ptwrite` the rewriter emitted. The PT decoder
    /// gets the address of each PTWRITE from the FUP that follows its
    /// packet and looks it up here to find the load and operand. Empty in
    /// soft mode.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ptwrites: Vec<PtwriteSite>,
    /// The shared libraries the binary names in `DT_NEEDED`, in order:
    /// their code is not instrumented, so their loads are not traced
    /// (absent for a static binary and in older annotations).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub shared_libraries: Vec<String>,
    /// Soft mode: the indirect jumps of the copies whose executions into
    /// original code the runtime counts, in counter order (absent when
    /// there are none, and in older annotations).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub escapes: Vec<EscapeSite>,
    /// Soft mode: the CPU features beyond x86-64's baseline that the
    /// instrumented code uses, by their `/proc/cpuinfo` names (`bmi2`: the
    /// spatial checks' `rorx`), chosen from the instrumenting CPU's; the
    /// entry hook refuses to run on a CPU without them (absent when none,
    /// and in older annotations).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub cpu_features: Vec<String>,
}

/// An indirect jump of a copy that may land in original (uninstrumented)
/// code: the runtime counts each execution that does (docs/METRICS.md,
/// "Dynamic coverage").
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct EscapeSite {
    /// Original address of the jump.
    pub at: u64,
    /// [`FunctionSite`] index of the function the escape lands in (that of
    /// its first known unpatched target, else the jump's own).
    pub function: u32,
    /// Explicit loads, instrumented or implied, of the original code one
    /// escape reaches (each block once, up to a patched address): the
    /// estimate of the untraced loads per escape, in the units of `Â`.
    pub loads: u32,
    /// Of `loads`, those with a probe: the estimate in units of the
    /// recorder's execution count.
    pub probed: u32,
    /// Not a jump: an explicit load of an instrumented function that the
    /// rewriter could not trace (a gather, a `gs:` source), counted at each
    /// execution (`at` its address, `loads` 1, `probed` 0).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub untraced_load: bool,
}

/// How an annotation file is encoded.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum AnnotationFormat {
    /// The compact binary file ([`compact`]): small and fast to read.
    #[default]
    Compact,
    /// JSON text, schema [`ANNOTATION_SCHEMA`]: for people and other tools.
    Json,
}

/// Which operand register a `ptwrite` writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum PtwriteOperand {
    /// The load's base register ([`LoadSite::base`]).
    Base,
    /// The load's index register ([`LoadSite::index`]).
    Index,
    /// The load's whole address, written by the stub of its spatial check
    /// when the block is tracked: a spatial record, not an operand.
    Address,
}

/// One `ptwrite` instruction emitted before a load (ptwrite mode).
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct PtwriteSite {
    /// Address of the `ptwrite` in the **instrumented** binary (link-time
    /// virtual address, as the FUP reports it minus the load bias).
    pub ip: u64,
    /// [`LoadSite::id`] of the load whose operand it writes.
    pub load: u32,
    /// Which register of the operand it writes (the full 64-bit register).
    pub operand: PtwriteOperand,
}

impl Annotation {
    /// The annotation as JSON text.
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).expect("annotation serialises")
    }

    /// Parses JSON text, checking the schema first so that an annotation
    /// from another version gets a clear message rather than a field error.
    pub fn from_json(text: &str) -> Result<Annotation, AnnotationError> {
        #[derive(Deserialize)]
        struct Head {
            schema: Option<String>,
        }
        let head: Head = serde_json::from_str(text).map_err(AnnotationError::NotJson)?;
        match head.schema.as_deref() {
            Some(ANNOTATION_SCHEMA) => {}
            Some(other) => {
                return Err(AnnotationError::UnsupportedSchema {
                    schema: other.to_string(),
                });
            }
            None => return Err(AnnotationError::NoSchema),
        }
        serde_json::from_str(text).map_err(AnnotationError::Malformed)
    }

    /// The annotation encoded as `format`.
    pub fn to_bytes(&self, format: AnnotationFormat) -> Vec<u8> {
        match format {
            AnnotationFormat::Compact => compact::encode(self),
            AnnotationFormat::Json => self.to_json().into_bytes(),
        }
    }

    /// Decodes either encoding, told apart by [`compact::COMPACT_MAGIC`].
    pub fn from_bytes(bytes: &[u8]) -> Result<Annotation, AnnotationError> {
        if compact::is_compact(bytes) {
            return compact::decode(bytes);
        }
        let text = std::str::from_utf8(bytes).map_err(|e| {
            AnnotationError::NotJson(serde_json::Error::io(io::Error::new(
                io::ErrorKind::InvalidData,
                e,
            )))
        })?;
        Annotation::from_json(text)
    }

    /// [`Annotation::from_bytes`] with every load's texts left empty
    /// (`base`, `index`, `line`, `inline_chain`, `skipped`, `segment`) when
    /// the bytes are compact (JSON is decoded whole): for a reader that
    /// needs the loads' numbers only.
    pub fn from_bytes_without_load_texts(bytes: &[u8]) -> Result<Annotation, AnnotationError> {
        if compact::is_compact(bytes) {
            return compact::decode_without_load_texts(bytes);
        }
        Annotation::from_bytes(bytes)
    }

    /// The annotation without its loads (`loads` empty) and, in their
    /// order, each load's [`LoadFlags`]: what a recording needs when its
    /// trace header's sites come from a cache. Decoding hundreds of
    /// thousands of loads into [`LoadSite`]s (200 bytes each) was most of
    /// the recorder's start-up on a large program and on libc.
    pub fn outline_from_bytes(
        bytes: &[u8],
    ) -> Result<(Annotation, Vec<LoadFlags>), AnnotationError> {
        if compact::is_compact(bytes) {
            return compact::decode_outline(bytes);
        }
        let mut annotation = Annotation::from_bytes(bytes)?;
        let flags = annotation.loads.iter().map(LoadFlags::of).collect();
        annotation.loads = Vec::new();
        Ok((annotation, flags))
    }

    /// Writes the annotation to `path` in the compact format.
    pub fn write(&self, path: &Path) -> Result<(), AnnotationError> {
        self.write_as(path, AnnotationFormat::Compact)
    }

    /// Writes the annotation to `path` encoded as `format`.
    pub fn write_as(&self, path: &Path, format: AnnotationFormat) -> Result<(), AnnotationError> {
        memgaze_output::write_atomic(path, self.to_bytes(format)).map_err(AnnotationError::Output)
    }

    /// Reads an annotation written by [`Annotation::write`] or
    /// [`Annotation::write_as`], in either format.
    pub fn read(path: &Path) -> Result<Annotation, AnnotationError> {
        let bytes = std::fs::read(path).map_err(|source| AnnotationError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        Annotation::from_bytes(&bytes).map_err(|source| AnnotationError::InFile {
            path: path.to_path_buf(),
            source: Box::new(source),
        })
    }

    /// The load at original address `ip` (loads are sorted by `ip`).
    pub fn load_at(&self, ip: u64) -> Option<&LoadSite> {
        self.loads
            .binary_search_by_key(&ip, |l| l.ip)
            .ok()
            .map(|i| &self.loads[i])
    }
}

/// Why an annotation could not be loaded or saved.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AnnotationError {
    /// The text is not JSON at all.
    #[error("not a JSON annotation")]
    NotJson(#[source] serde_json::Error),
    /// JSON without a `schema` field: not an annotation.
    #[error("not a memgaze annotation (no \"schema\" field)")]
    NoSchema,
    /// An annotation of another schema (an older or newer cargo memgaze).
    #[error(
        "annotation schema {schema} is not supported (this cargo memgaze reads {}); re-run `cargo memgaze instrument`",
        ANNOTATION_SCHEMA
    )]
    UnsupportedSchema {
        /// The schema the file declares.
        schema: String,
    },
    /// The right schema, but fields that do not parse.
    #[error("malformed annotation")]
    Malformed(#[source] serde_json::Error),
    /// A compact annotation whose bytes do not decode (damaged or cut).
    #[error("damaged compact annotation: {what}")]
    Corrupt {
        /// What is wrong, and where in the file.
        what: String,
    },
    /// An annotation file could not be read.
    #[error("{}: cannot read annotation", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// An annotation file could not be written (the message names it).
    #[error(transparent)]
    Output(#[from] memgaze_output::OutputError),
    /// The annotation file `path` holds no valid annotation.
    #[error("{}", path.display())]
    InFile {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        #[source]
        source: Box<AnnotationError>,
    },
    /// An executable without the annotation `cargo memgaze instrument`
    /// writes beside it.
    #[error(
        "{}: not instrumented by cargo memgaze (no annotation {} beside it; run `cargo memgaze instrument` first)",
        executable.display(),
        path.display()
    )]
    NotInstrumented {
        /// The executable.
        executable: PathBuf,
        /// Where its annotation should be.
        path: PathBuf,
        /// Why it could not be read.
        #[source]
        source: io::Error,
    },
    /// The annotation beside an executable does not parse.
    #[error("{}: invalid annotation", path.display())]
    Invalid {
        /// The annotation file.
        path: PathBuf,
        /// The parser's complaint.
        #[source]
        source: serde_json::Error,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Annotation {
        Annotation {
            schema: ANNOTATION_SCHEMA.into(),
            binary: BinaryIdentity {
                path: "a.out".into(),
                size: 10,
                sha256: "00".into(),
                build_id: None,
            },
            mode: Some(InstrumentationMode::Soft),
            functions: vec![FunctionSite {
                name: "f".into(),
                raw_name: None,
                start: 0x1000,
                size: 16,
                instrumented: true,
                skipped: None,
                stack_loads: 1,
                string_loads: 0,
            }],
            loads: vec![LoadSite {
                id: 0,
                ip: 0x1004,
                len: 4,
                class: LoadClass::Strided,
                instrumented: true,
                implied: 2,
                proxy: None,
                base: Some("rdi".into()),
                index: Some("rcx".into()),
                scale: 8,
                displacement: -16,
                size: 8,
                function: 0,
                line: Some("a.c:3".into()),
                inline_chain: InlineChain::default(),
                skipped: None,
                segment: None,
                gather: false,
                read_modify_write: false,
                control: false,
            }],
            ptwrites: Vec::new(),
            shared_libraries: Vec::new(),
            escapes: Vec::new(),
            cpu_features: Vec::new(),
        }
    }

    #[test]
    fn round_trips_through_a_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.memgaze.json");
        let a = sample();
        a.write(&path).unwrap();
        assert_eq!(Annotation::read(&path).unwrap(), a);
        assert_eq!(a.load_at(0x1004).unwrap().id, 0);
        assert!(a.load_at(0x1005).is_none());
    }

    /// `sample()` with every optional field set on a second load, a
    /// second function, ptwrites and libraries, so that each presence bit
    /// and each string of the compact format is exercised.
    fn full_sample() -> Annotation {
        let mut a = sample();
        a.binary.build_id = Some("abcd".into());
        a.mode = Some(InstrumentationMode::Ptwrite);
        a.functions.push(FunctionSite {
            name: "g<T>".into(),
            raw_name: Some("_ZN1g".into()),
            start: 0x2000,
            size: 0x40,
            instrumented: false,
            skipped: Some("undecodable bytes".into()),
            stack_loads: 0,
            string_loads: 7,
        });
        a.loads.push(LoadSite {
            id: 1,
            ip: 0x1000,
            len: 9,
            class: LoadClass::Constant,
            instrumented: false,
            implied: 0,
            proxy: NonZeroU64::new(0x1004),
            base: None,
            index: Some("ymm3".into()),
            scale: 4,
            displacement: i64::MIN,
            size: 32,
            function: 1,
            line: Some("a.c:3".into()),
            inline_chain: vec!["/rustc/h/library/core/src/cmp.rs:9".into(), "a.c:3".into()].into(),
            skipped: Some("gather".into()),
            segment: Some(Segment::Fs),
            gather: true,
            read_modify_write: true,
            control: true,
        });
        a.escapes.push(EscapeSite {
            at: 0x1010,
            function: 1,
            loads: 12,
            probed: 7,
            untraced_load: false,
        });
        a.escapes.push(EscapeSite {
            at: 0x1020,
            function: 1,
            loads: 1,
            probed: 0,
            untraced_load: true,
        });
        a.ptwrites = vec![
            PtwriteSite {
                ip: 0x9000,
                load: 0,
                operand: PtwriteOperand::Base,
            },
            PtwriteSite {
                ip: 0x8ff0,
                load: 1,
                operand: PtwriteOperand::Index,
            },
            PtwriteSite {
                ip: 0x9100,
                load: 1,
                operand: PtwriteOperand::Address,
            },
        ];
        a.shared_libraries = vec!["libc.so.6".into(), "libm.so.6".into()];
        a.cpu_features = vec!["bmi2".into()];
        a
    }

    #[test]
    fn decoding_without_load_texts_keeps_everything_else() {
        let a = full_sample();
        let mut expected = a.clone();
        for load in &mut expected.loads {
            load.base = None;
            load.index = None;
            load.line = None;
            load.inline_chain = InlineChain::default();
            load.skipped = None;
            load.segment = None;
        }
        let compact = a.to_bytes(AnnotationFormat::Compact);
        assert_eq!(
            Annotation::from_bytes_without_load_texts(&compact).unwrap(),
            expected
        );
        // JSON has no cheaper path: decoded whole.
        let json = a.to_bytes(AnnotationFormat::Json);
        assert_eq!(Annotation::from_bytes_without_load_texts(&json).unwrap(), a);
        // A damaged string index is still refused.
        let mut cut = compact.clone();
        cut.truncate(cut.len() - 3);
        assert!(Annotation::from_bytes_without_load_texts(&cut).is_err());
    }

    #[test]
    fn an_outline_keeps_everything_but_the_loads_and_flags_each_load() {
        let a = full_sample();
        assert!(a.loads.iter().any(|l| l.instrumented) && a.loads.iter().any(|l| !l.instrumented));
        let mut expected = a.clone();
        expected.loads.clear();
        let flags: Vec<LoadFlags> = a.loads.iter().map(LoadFlags::of).collect();
        for format in [AnnotationFormat::Compact, AnnotationFormat::Json] {
            let bytes = a.to_bytes(format);
            let (outline, got) = Annotation::outline_from_bytes(&bytes).unwrap();
            assert_eq!(outline, expected, "{format:?}");
            assert_eq!(got, flags, "{format:?}");
        }
        let mut cut = a.to_bytes(AnnotationFormat::Compact);
        cut.truncate(cut.len() - 3);
        assert!(Annotation::outline_from_bytes(&cut).is_err());
    }

    #[test]
    fn both_formats_round_trip_and_are_told_apart_by_their_first_bytes() {
        let dir = tempfile::tempdir().unwrap();
        for a in [sample(), full_sample()] {
            for format in [AnnotationFormat::Compact, AnnotationFormat::Json] {
                let path = dir.path().join(format!("{format:?}"));
                a.write_as(&path, format).unwrap();
                let bytes = std::fs::read(&path).unwrap();
                assert_eq!(
                    compact::is_compact(&bytes),
                    format == AnnotationFormat::Compact
                );
                assert_eq!(Annotation::read(&path).unwrap(), a, "{format:?}");
            }
        }
        // JSON written before the compact format existed reads unchanged.
        let path = dir.path().join("old.memgaze.json");
        std::fs::write(&path, full_sample().to_json()).unwrap();
        assert_eq!(Annotation::read(&path).unwrap(), full_sample());
    }

    /// Untraced-load sites survive the compact format with and without
    /// CPU features (their section follows those), and so do escapes
    /// without any.
    #[test]
    fn untraced_load_sites_round_trip_in_the_compact_format() {
        let mut a = full_sample();
        assert!(a.escapes.iter().any(|e| e.untraced_load));
        for features in [vec!["bmi2".to_string()], Vec::new()] {
            a.cpu_features = features;
            let bytes = a.to_bytes(AnnotationFormat::Compact);
            assert_eq!(Annotation::from_bytes(&bytes).unwrap(), a);
        }
        a.escapes.iter_mut().for_each(|e| e.untraced_load = false);
        let plain = a.to_bytes(AnnotationFormat::Compact);
        assert_eq!(Annotation::from_bytes(&plain).unwrap(), a);
        a.escapes.truncate(1);
        a.escapes[0].untraced_load = true;
        let one = a.to_bytes(AnnotationFormat::Compact);
        assert_eq!(Annotation::from_bytes(&one).unwrap(), a);
    }

    /// [`full_sample`] with `count` loads made from its first, eight to a
    /// source line.
    fn sample_with_loads(count: u32) -> Annotation {
        let mut a = full_sample();
        let template = a.loads[0].clone();
        a.loads = (0..count)
            .map(|i| LoadSite {
                id: i,
                ip: 0x1000 + u64::from(i) * 5,
                line: Some(format!("src/lib.rs:{}", i / 8).into()),
                ..template.clone()
            })
            .collect();
        a
    }

    /// The next of Marsaglia's 32-bit xorshift numbers from `state`: loads
    /// drawn in an order of their own, the same every run.
    fn xorshift32(state: &mut u32) -> u32 {
        *state ^= *state << 13;
        *state ^= *state >> 17;
        *state ^= *state << 5;
        *state
    }

    /// Loads sharing their lines and register names (one string each,
    /// cloned), drawn in a pseudo-random order so that strings meeting in
    /// one of the encoder's recent-string slots alternate, round-trip in
    /// the compact format.
    #[test]
    fn shared_strings_in_any_order_round_trip() {
        let mut a = full_sample();
        let template = a.loads[0].clone();
        let lines: Vec<Text> = (0..1500)
            .map(|i| format!("src/{}.rs:{i}", i % 7).into())
            .collect();
        let registers: Vec<Text> = ["rax", "rbx", "rsi", "r8", "r15"].map(Text::from).to_vec();
        let mut state = 0x2545_f491_u32;
        a.loads = (0..20_000)
            .map(|i| {
                let x = xorshift32(&mut state);
                let pick = |texts: &[Text], by: u32| texts[(by as usize) % texts.len()].clone();
                LoadSite {
                    id: i,
                    ip: 0x1000 + u64::from(i) * 5,
                    line: Some(pick(&lines, x)),
                    base: Some(pick(&registers, x >> 11)),
                    index: (x & 1 == 0).then(|| pick(&registers, x >> 21)),
                    ..template.clone()
                }
            })
            .collect();
        let bytes = a.to_bytes(AnnotationFormat::Compact);
        assert_eq!(Annotation::from_bytes(&bytes).unwrap(), a);
    }

    /// Loads whose inline chains share places (the same texts at different
    /// depths, copies of them, other places in between, loads without a
    /// chain, runs of loads with one chain) encode to the bytes of the same
    /// loads with every text a copy of its own, whole or in small parts,
    /// and round-trip: the encoder's lookups by address (its recent slots,
    /// its map of addresses) and its copies of the last load's chain change
    /// no index.
    #[test]
    fn inline_chains_sharing_places_encode_as_unshared_ones() {
        let mut a = full_sample();
        let template = a.loads[0].clone();
        let places: Vec<Text> = (0..48)
            .map(|i| format!("src/inl{}.rs:{i}", i % 5).into())
            .collect();
        let mut state = 0x9e37_79b9_u32;
        a.loads = (0..6_000)
            .map(|i| {
                let x = xorshift32(&mut state);
                // The region's chain, innermost first; a load has its
                // outermost `depth` places.
                let region = (i / 40) as usize % 40;
                let depth = (x % 7) as usize;
                let mut chain: Vec<Text> = (0..depth)
                    .rev()
                    .map(|k| places[region + k].clone())
                    .collect();
                if depth > 0 && x & 0x300 == 0 {
                    chain[0] = places[(x >> 12) as usize % places.len()].clone();
                }
                if depth > 1 && x & 0xc00 == 0 {
                    chain[depth - 1] = Text::from(&*chain[depth - 1]);
                }
                LoadSite {
                    id: i,
                    ip: 0x1000 + u64::from(i) * 5,
                    inline_chain: chain.into(),
                    ..template.clone()
                }
            })
            .collect();
        for i in 1..a.loads.len() {
            if i % 3 != 0 {
                a.loads[i].inline_chain = a.loads[i - 1].inline_chain.clone();
            }
        }
        let copy = |t: &Text| Text::from(t.as_str());
        let mut unshared = a.clone();
        for load in &mut unshared.loads {
            load.inline_chain = load.inline_chain.iter().map(copy).collect();
            for text in [&mut load.base, &mut load.index, &mut load.line] {
                *text = text.as_ref().map(copy);
            }
        }
        let bytes = a.to_bytes(AnnotationFormat::Compact);
        assert_eq!(bytes, unshared.to_bytes(AnnotationFormat::Compact));
        assert_eq!(Annotation::from_bytes(&bytes).unwrap(), a);
        let parted = compact::encode_in_parts(&a, 200);
        assert_eq!(parted, compact::encode_in_parts(&unshared, 200));
        assert_eq!(Annotation::from_bytes(&parted).unwrap(), a);
    }

    #[test]
    fn compact_is_a_fraction_of_json_for_many_loads() {
        let a = sample_with_loads(20_000);
        let json = a.to_bytes(AnnotationFormat::Json).len();
        let compact = a.to_bytes(AnnotationFormat::Compact).len();
        assert!(compact * 10 < json, "compact {compact} bytes, JSON {json}");
        assert_eq!(
            Annotation::from_bytes(&a.to_bytes(AnnotationFormat::Compact)).unwrap(),
            a
        );
    }

    /// Loads whose numbers take the most LEB128 bytes each (64-bit
    /// differences of ten bytes, 32-bit numbers of five) round-trip: the
    /// encoder writes a load's numbers before its inline chain into a
    /// buffer of a fixed size.
    #[test]
    fn loads_with_the_widest_numbers_round_trip_in_the_compact_format() {
        let mut a = full_sample();
        let template = a.loads[0].clone();
        let widest = |ip: u64, proxy: u64, displacement: i64| LoadSite {
            id: u32::MAX,
            ip,
            len: u8::MAX,
            instrumented: true,
            implied: u32::MAX,
            proxy: NonZeroU64::new(proxy),
            base: Some("rax".into()),
            index: Some("rcx".into()),
            scale: u8::MAX,
            displacement,
            size: u32::MAX,
            function: u32::MAX,
            line: Some("a.c:1".into()),
            skipped: Some("why".into()),
            segment: Some(Segment::Fs),
            ..template.clone()
        };
        a.loads = vec![
            widest(1 << 63, 1, i64::MIN),
            widest(1, u64::MAX, i64::MAX),
            widest(u64::MAX, 1 << 63, -1),
        ];
        for part_bytes in [1, usize::MAX] {
            let bytes = compact::encode_in_parts(&a, part_bytes);
            assert_eq!(Annotation::from_bytes(&bytes).unwrap(), a);
        }
    }

    /// [`sample_with_loads`] with a register name of its own for every six
    /// loads, so that the string table grows as the loads are encoded.
    fn sample_with_growing_table(count: u32) -> Annotation {
        let mut a = sample_with_loads(count);
        for (i, load) in a.loads.iter_mut().enumerate() {
            load.base = Some(format!("r{}", i / 6).into());
        }
        a
    }

    /// The length of the header before a compact annotation's frames.
    const COMPACT_HEADER: usize = compact::COMPACT_MAGIC.len() + 12;

    /// The frames of a compact annotation, in order.
    fn compact_frames(bytes: &[u8]) -> Vec<&[u8]> {
        let mut frames = Vec::new();
        let mut rest = &bytes[COMPACT_HEADER..];
        while !rest.is_empty() {
            let len = zstd::zstd_safe::find_frame_compressed_size(rest).unwrap();
            frames.push(&rest[..len]);
            rest = &rest[len..];
        }
        frames
    }

    /// `frames` after `bytes`' header, as one file.
    fn with_frames(bytes: &[u8], frames: &[&[u8]]) -> Vec<u8> {
        let mut out = bytes[..COMPACT_HEADER].to_vec();
        for frame in frames {
            out.extend_from_slice(frame);
        }
        out
    }

    /// A body in many frames (the string table's count, the table in
    /// parts of its own, the rest in parts) decompresses to the body of one
    /// part, and decodes as that body does in one frame (files written
    /// before the parts) or in frames cut elsewhere (the table and the
    /// rest's first part in one, as written before the table's frames);
    /// a cut at any byte, a frame's end included, is refused.
    #[test]
    fn a_compact_body_in_parts_decodes_as_one_in_a_single_frame() {
        let a = sample_with_growing_table(300);
        let parted = compact::encode_in_parts(&a, 64);
        let frames = compact_frames(&parted);
        assert!(frames.len() > 20, "{} frames", frames.len());
        assert_eq!(Annotation::from_bytes(&parted).unwrap(), a);
        let raw = zstd::bulk::decompress(&parted[COMPACT_HEADER..], 1 << 20).unwrap();
        let one_part = compact::encode_in_parts(&a, usize::MAX);
        assert_eq!(compact_frames(&one_part).len(), 3);
        assert_eq!(
            zstd::bulk::decompress(&one_part[COMPACT_HEADER..], 1 << 20).unwrap(),
            raw
        );
        assert_eq!(parted[..COMPACT_HEADER], one_part[..COMPACT_HEADER]);
        // The first frame is the table's count alone (one LEB128 byte
        // here), the next ones the table, each ending at a string's end,
        // then the rest.
        let strings = usize::from(raw[0]);
        assert!(strings > 64 && strings < 128, "{strings} strings");
        let mut string_ends = vec![1];
        for _ in 0..strings {
            let at = string_ends[string_ends.len() - 1];
            string_ends.push(at + 1 + usize::from(raw[at]));
        }
        let table_end = string_ends[strings];
        let mut frame_ends = Vec::new();
        let mut at = 0;
        for frame in &frames {
            let part = zstd::bulk::decompress(frame, 1 << 20).unwrap();
            assert_eq!(part, raw[at..at + part.len()]);
            at += part.len();
            frame_ends.push(at);
        }
        assert_eq!(at, raw.len());
        assert_eq!(frame_ends[0], 1);
        let table_frames: Vec<usize> = frame_ends
            .iter()
            .copied()
            .filter(|&end| end > 1 && end <= table_end)
            .collect();
        assert!(table_frames.len() > 2, "{table_frames:?}");
        assert!(table_frames.iter().all(|end| string_ends.contains(end)));
        assert_eq!(table_frames.last(), Some(&table_end));
        // The same body in one frame, and cut into two frames anywhere.
        let framed = |pieces: &[&[u8]]| {
            let compressed: Vec<Vec<u8>> = pieces
                .iter()
                .map(|p| zstd::bulk::compress(p, 3).unwrap())
                .collect();
            let frames: Vec<&[u8]> = compressed.iter().map(Vec::as_slice).collect();
            with_frames(&parted, &frames)
        };
        assert_eq!(Annotation::from_bytes(&framed(&[&raw])).unwrap(), a);
        for cut in (1..raw.len()).step_by(97) {
            let bytes = framed(&[&raw[..cut], &raw[cut..]]);
            assert_eq!(Annotation::from_bytes(&bytes).unwrap(), a, "cut at {cut}");
        }
        for n in 0..parted.len() {
            assert!(Annotation::from_bytes(&parted[..n]).is_err(), "cut at {n}");
        }
    }

    /// Frames of a body in parts left out, repeated, cut short, or with a
    /// byte flipped give an error: each frame's checksum and the declared
    /// length hold for every frame, the table's count and parts included.
    #[test]
    fn damaged_frames_of_a_compact_body_give_an_error() {
        let a = sample_with_growing_table(200);
        let good = compact::encode_in_parts(&a, 64);
        let frames = compact_frames(&good);
        assert!(frames.len() > 10, "{} frames", frames.len());
        for i in 0..frames.len() {
            let mut without = frames.clone();
            without.remove(i);
            assert!(Annotation::from_bytes(&with_frames(&good, &without)).is_err());
            let mut repeated = frames.clone();
            repeated.insert(i, frames[i]);
            assert!(Annotation::from_bytes(&with_frames(&good, &repeated)).is_err());
            let mut cut = frames.clone();
            cut[i] = &frames[i][..frames[i].len() - 1];
            assert!(Annotation::from_bytes(&with_frames(&good, &cut)).is_err());
        }
        for at in COMPACT_HEADER..good.len() {
            let mut bad = good.clone();
            bad[at] ^= 0x04;
            assert!(Annotation::from_bytes(&bad).is_err(), "flip at {at}");
        }
    }

    #[test]
    fn damaged_compact_annotations_give_an_error_never_a_panic() {
        let good = full_sample().to_bytes(AnnotationFormat::Compact);
        // Every cut is refused.
        for n in 0..good.len() {
            assert!(Annotation::from_bytes(&good[..n]).is_err(), "cut at {n}");
        }
        // Bodies that decompress but are damaged: flip bytes of the raw
        // body and re-compress, so the decoder (not zstd) meets them.
        let header = compact::COMPACT_MAGIC.len() + 12;
        let raw = zstd::bulk::decompress(&good[header..], 1 << 20).unwrap();
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        for case in 0..3000 {
            let mut body = raw.clone();
            for _ in 0..=case % 4 {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                let at = (state % body.len() as u64) as usize;
                body[at] = (state >> 32) as u8;
            }
            let mut bytes = good[..header - 8].to_vec();
            bytes.extend_from_slice(&(body.len() as u64).to_le_bytes());
            bytes.extend_from_slice(&zstd::bulk::compress(&body, 1).unwrap());
            // Either an error or an annotation; reaching here is the test.
            let _ = Annotation::from_bytes(&bytes);
        }
        // A version this build does not know is named.
        let mut newer = good.clone();
        newer[8] = 9;
        let e = Annotation::from_bytes(&newer).unwrap_err();
        assert!(e.to_string().contains("compact v9"), "{e}");
        // A huge declared size is refused before any allocation.
        let mut huge = good;
        huge[12..20].copy_from_slice(&u64::MAX.to_le_bytes());
        assert!(matches!(
            Annotation::from_bytes(&huge),
            Err(AnnotationError::Corrupt { .. })
        ));
    }

    /// The compressed body carries zstd's checksum of each frame's
    /// content: any byte flipped in it is an error, not an annotation with
    /// another file name or address. A flip zstd reads past gives the same
    /// bytes (the single-segment flag of a frame under 256 bytes, such as
    /// the string table's count, which turns its content size into its
    /// window size; a bit of a block's encoding that changes nothing).
    #[test]
    fn every_flipped_byte_of_a_compact_body_is_refused() {
        let sample = full_sample();
        let good = sample.to_bytes(AnnotationFormat::Compact);
        let mut refused = 0;
        for at in COMPACT_HEADER..good.len() {
            let mut bad = good.clone();
            bad[at] ^= 0x20;
            match Annotation::from_bytes(&bad) {
                Ok(decoded) => assert_eq!(decoded, sample, "flip at {at}"),
                Err(_) => refused += 1,
            }
        }
        assert!(
            refused + 8 > good.len() - COMPACT_HEADER,
            "{refused} refused"
        );
    }

    #[test]
    fn other_schemas_are_refused_by_name() {
        let text = sample()
            .to_json()
            .replace(ANNOTATION_SCHEMA, "memgaze.annotation.v0");
        let e = Annotation::from_json(&text).unwrap_err();
        assert!(
            matches!(&e, AnnotationError::UnsupportedSchema { schema } if schema == "memgaze.annotation.v0"),
            "{e}"
        );
        // The line people read names the schema and what to do.
        assert_eq!(
            e.to_string(),
            "annotation schema memgaze.annotation.v0 is not supported (this cargo memgaze reads memgaze.annotation.v1); re-run `cargo memgaze instrument`"
        );
        assert!(matches!(
            Annotation::from_json("{}"),
            Err(AnnotationError::NoSchema)
        ));
        assert!(matches!(
            Annotation::from_json("[1,2]"),
            Err(AnnotationError::NotJson(_))
        ));
    }

    /// The rewriter holds every load of a binary (450,000 on a large Rust
    /// executable) through its encoding, its memory's peak.
    #[test]
    fn a_load_site_takes_88_bytes() {
        assert_eq!(size_of::<LoadSite>(), 88);
    }

    #[test]
    fn a_segment_is_written_as_its_name_and_no_other_name_is_read() {
        assert_eq!(serde_json::to_string(&Segment::Gs).unwrap(), r#""gs""#);
        assert_eq!(
            serde_json::from_str::<Segment>(r#""fs""#).unwrap(),
            Segment::Fs
        );
        assert!(serde_json::from_str::<Segment>(r#""es""#).is_err());
        assert_eq!(Segment::from_name(Segment::Gs.as_str()), Some(Segment::Gs));
        assert_eq!(Segment::from_name("ds"), None);
    }

    #[test]
    fn the_user_line_is_the_first_inline_frame_in_user_code() {
        let mut load = sample().loads.remove(0);
        load.line = Some("/rustc/h/library/alloc/src/collections/btree/search.rs:9".into());
        assert_eq!(
            load.user_line(|f| f.starts_with("/w/")),
            load.line.as_deref()
        );
        load.inline_chain = vec![
            "/rustc/h/library/alloc/src/collections/btree/search.rs:9".into(),
            "/rustc/h/library/alloc/src/collections/btree/map.rs:700".into(),
            "/w/src/lib.rs:12".into(),
            "/w/benches/b.rs:30".into(),
        ]
        .into();
        assert_eq!(
            load.user_line(|f| f.starts_with("/w/")),
            Some("/w/src/lib.rs:12")
        );
        assert_eq!(
            load.user_line(|f| f.starts_with("/x/")),
            load.line.as_deref()
        );
    }
}
