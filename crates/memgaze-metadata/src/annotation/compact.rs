//! The compact annotation file: [`COMPACT_MAGIC`], a little-endian `u32`
//! version ([`COMPACT_VERSION`]), a `u64` length of the encoded body, then
//! the body as zstd frames, one after another, which decompress to the
//! body as one frame of it would: the string table's count, the table's
//! strings in parts, then the rest in parts (of at most [`PART_BYTES`],
//! smaller for fewer loads).
//! Files written with other frame boundaries (the whole body in one frame,
//! the table and the rest's first part in one) decode alike.
//!
//! The body is the [`Annotation`] field by field: unsigned integers as
//! LEB128, signed ones zigzag-encoded, addresses as the difference from the
//! previous load's (loads are sorted by `ip`), optional values behind a
//! presence bit, and every register name, `file:line`, reason and library
//! name as an index into a table of distinct strings written first; the
//! CPU features, where there are any, come next (a body without them ends
//! at the escapes, as older ones do), then the indices of the escape sites
//! that are untraced loads, where there are any. A load
//! is about 12 bytes before compression, against about 300 of JSON, and it
//! decodes without a parser.
//!
//! Arbitrary bytes give an error, never a panic: every read is bounds
//! checked, counts are checked against the bytes left before anything is
//! allocated, and the decompressed size is bounded by the declared one.

use super::{
    Annotation, AnnotationError, EscapeSite, FunctionSite, InlineChain, InstrumentationMode,
    LoadFlags, LoadSite, PtwriteOperand, PtwriteSite, Segment, Text,
};
use crate::model::{BinaryIdentity, LoadClass};
use std::num::NonZeroU64;
use std::sync::{Mutex, mpsc};

/// First bytes of a compact annotation (a JSON annotation starts with `{`).
pub const COMPACT_MAGIC: &[u8; 8] = b"\x89MGA\r\n\x1a\n";

/// Version of the compact encoding this build writes and reads.
pub const COMPACT_VERSION: u32 = 1;

/// zstd level: level 1 (`ZSTD_fast`) compresses the own binary's 20.4 MB
/// body in about two thirds of level 3's time (`ZSTD_dfast`) for 8% more
/// bytes (5.38 against 4.98 MB), and the compression ends the run.
const ZSTD_LEVEL: i32 = 1;

/// The largest part: the string table and the rest of the body are each
/// cut into parts (the rest at the first load boundary past the part's
/// size), each a zstd frame compressed on another thread while the next is
/// encoded (one frame of the whole body was compressed on one thread after
/// all of it; a first part led by the table, known only at the end, waited
/// for all of it).
pub const PART_BYTES: usize = 4 << 20;

/// The smallest part: each frame starts without the previous one's window
/// (at level 1, the microbenchmarks' body in parts of 256 KiB was 0.9%
/// larger than in one frame, in parts of 512 KiB 0.3%).
const MIN_PART_BYTES: usize = 256 << 10;

/// Bytes of the body's rest per load, about, for [`part_bytes_for`].
const BYTES_PER_LOAD: usize = 12;

/// Parts the loads' bytes are cut into: the last part's compression is
/// what the encoding's end waits for, shared by the cores.
const PARTS_OF_THE_LOADS: usize = 4;

/// Threads that compress the parts beside the encoding, each started when a
/// part is ready for it (the encoding's thread compresses the last parts
/// and, with them, the ones not yet taken): with one, the last parts were
/// still compressed, one after the other, after the body was encoded, with
/// the other core idle.
const COMPRESSING_THREADS: usize = 2;

/// Loads per distinct string the encoder's tables are first made for (the
/// own release binary: 474,000 loads, 57,500 strings, mostly `file:line`
/// texts): grown from empty, each doubling hashed every string again.
const LOADS_PER_STRING: usize = 8;

/// The largest decompressed body accepted per compressed byte: the body
/// compresses about 3–6×, so a larger declared size is a damaged header
/// (and must not become an allocation).
const MAX_EXPANSION: u64 = 256;

// Presence and flag bits of a load.
const L_INSTRUMENTED: u32 = 1;
const L_PROXY: u32 = 1 << 1;
const L_BASE: u32 = 1 << 2;
const L_INDEX: u32 = 1 << 3;
const L_LINE: u32 = 1 << 4;
const L_SKIPPED: u32 = 1 << 5;
const L_SEGMENT: u32 = 1 << 6;
const L_GATHER: u32 = 1 << 7;
const L_READ_MODIFY_WRITE: u32 = 1 << 8;
const L_CONTROL: u32 = 1 << 9;
const L_ALL: u32 = (1 << 10) - 1;

// Presence and flag bits of a function.
const F_INSTRUMENTED: u32 = 1;
const F_RAW_NAME: u32 = 1 << 1;
const F_SKIPPED: u32 = 1 << 2;
const F_ALL: u32 = (1 << 3) - 1;

/// `flag` when `set`.
fn bit(set: bool, flag: u32) -> u32 {
    if set { flag } else { 0 }
}

/// Whether `bytes` start like a compact annotation.
pub fn is_compact(bytes: &[u8]) -> bool {
    bytes.starts_with(COMPACT_MAGIC)
}

/// The annotation in the compact format.
pub fn encode(annotation: &Annotation) -> Vec<u8> {
    encode_in_parts(annotation, part_bytes_for(annotation.loads.len()))
}

/// The size of the body's parts for `loads` loads: the loads' bytes shared
/// by [`PARTS_OF_THE_LOADS`] parts, so that a body of a few MB is
/// compressed in several beside its encoding, within [`MIN_PART_BYTES`]
/// and [`PART_BYTES`].
fn part_bytes_for(loads: usize) -> usize {
    (loads.saturating_mul(BYTES_PER_LOAD) / PARTS_OF_THE_LOADS).clamp(MIN_PART_BYTES, PART_BYTES)
}

/// The frames of the body in their order in the file: the string table's
/// count, then the table's strings, then the rest, each by the number of
/// its part.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Frame {
    TableCount,
    Table(usize),
    Rest(usize),
}

/// A part of the body and the frame it is compressed into.
type Part = (Frame, Vec<u8>);

/// [`encode`], in parts of about `part_bytes`.
pub(super) fn encode_in_parts(annotation: &Annotation, part_bytes: usize) -> Vec<u8> {
    let (sender, receiver) = mpsc::channel::<Part>();
    let queue = Mutex::new(receiver);
    std::thread::scope(|scope| {
        let mut compressing = Vec::new();
        let (threads, queue) = (&mut compressing, &queue);
        let last_parts = sender.clone();
        let mut send = move |frame: Frame, part: Vec<u8>| {
            if threads.len() < COMPRESSING_THREADS {
                threads.push(scope.spawn(move || compress_queued(queue)));
            }
            // The receiver outlives the threads, so no send fails (a
            // compressing thread's panic is passed on by its join).
            let _ = sender.send((frame, part));
        };
        let mut body = Encoder::new(annotation.loads.len(), &mut send, part_bytes);
        body.annotation(annotation);
        let (raw_len, last) = body.finish();
        drop(send);
        // The last parts are compressed on this thread, with what the
        // threads have not yet taken, once the channel closes: no thread is
        // started for a body of one part.
        for part in last {
            let _ = last_parts.send(part);
        }
        drop(last_parts);
        let mut frames = compress_queued(queue);
        for thread in compressing {
            let compressed = thread
                .join()
                .unwrap_or_else(|panic| std::panic::resume_unwind(panic));
            frames.extend(compressed);
        }
        frames.sort_unstable_by_key(|&(frame, _)| frame);
        let compressed_len = frames.iter().map(|(_, f)| f.len()).sum::<usize>();
        let mut out = Vec::with_capacity(compressed_len + 20);
        out.extend_from_slice(COMPACT_MAGIC);
        out.extend_from_slice(&COMPACT_VERSION.to_le_bytes());
        out.extend_from_slice(&(raw_len as u64).to_le_bytes());
        for (_, frame) in &frames {
            out.extend_from_slice(frame);
        }
        out
    })
}

/// Compresses the parts from `queue` until it closes, each into its frame.
fn compress_queued(queue: &Mutex<mpsc::Receiver<Part>>) -> Vec<Part> {
    let mut compressor = Compressor::new();
    let mut frames = Vec::new();
    loop {
        // The lock is held while waiting, so each part goes to one thread;
        // it is let go before the part is compressed.
        let next = match queue.lock() {
            Ok(parts) => parts.recv(),
            Err(_) => break,
        };
        let Ok((frame, part)) = next else { break };
        frames.push((frame, compressor.frame(&part)));
    }
    frames
}

/// zstd at [`ZSTD_LEVEL`] with checksums, one frame per call.
struct Compressor(zstd::bulk::Compressor<'static>);

impl Compressor {
    fn new() -> Compressor {
        let mut compressor =
            zstd::bulk::Compressor::new(ZSTD_LEVEL).expect("zstd compresses in memory");
        // The frame's checksum makes a damaged byte an error: without it a
        // flip inside a literal decodes to another valid string (a load's
        // file name).
        compressor
            .set_parameter(zstd::zstd_safe::CParameter::ChecksumFlag(true))
            .expect("zstd takes a checksum flag");
        Compressor(compressor)
    }

    fn frame(&mut self, bytes: &[u8]) -> Vec<u8> {
        self.0.compress(bytes).expect("zstd compresses in memory")
    }
}

/// Decodes a compact annotation (`bytes` start with [`COMPACT_MAGIC`]).
pub fn decode(bytes: &[u8]) -> Result<Annotation, AnnotationError> {
    decode_with(bytes, Loads::Whole).map(|(annotation, _)| annotation)
}

/// [`decode`] with every load's texts left empty (`base`, `index`, `line`,
/// `inline_chain`, `skipped`, `segment`): checked, not copied. For a reader
/// that needs the loads' numbers only: copying those strings was most of
/// the recorder's start-up on a large program.
pub fn decode_without_load_texts(bytes: &[u8]) -> Result<Annotation, AnnotationError> {
    decode_with(bytes, Loads::WithoutTexts).map(|(annotation, _)| annotation)
}

/// [`decode`] with no loads kept (`loads` empty), only each load's
/// [`LoadFlags`], in order: every load is still checked.
pub fn decode_outline(bytes: &[u8]) -> Result<(Annotation, Vec<LoadFlags>), AnnotationError> {
    decode_with(bytes, Loads::Flags)
}

/// What the decoder keeps of each load.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Loads {
    Whole,
    WithoutTexts,
    Flags,
}

fn decode_with(
    bytes: &[u8],
    loads: Loads,
) -> Result<(Annotation, Vec<LoadFlags>), AnnotationError> {
    let corrupt = |what: &str| AnnotationError::Corrupt {
        what: what.to_string(),
    };
    let rest = bytes
        .strip_prefix(COMPACT_MAGIC.as_slice())
        .ok_or_else(|| corrupt("no compact annotation magic"))?;
    if rest.len() < 12 {
        return Err(corrupt("truncated header"));
    }
    let version = u32::from_le_bytes(rest[..4].try_into().expect("4 bytes"));
    if version != COMPACT_VERSION {
        return Err(AnnotationError::UnsupportedSchema {
            schema: format!("compact v{version}"),
        });
    }
    let declared = u64::from_le_bytes(rest[4..12].try_into().expect("8 bytes"));
    let compressed = &rest[12..];
    if declared > (compressed.len() as u64 + 64) * MAX_EXPANSION {
        return Err(corrupt("declared size out of range"));
    }
    let raw = zstd::bulk::decompress(compressed, declared as usize)
        .map_err(|e| corrupt(&format!("zstd: {e}")))?;
    if raw.len() as u64 != declared {
        return Err(corrupt("body shorter than declared"));
    }
    let mut d = Decoder {
        bytes: &raw,
        at: 0,
        table: Vec::new(),
        load_texts: loads == Loads::Whole,
        flags: (loads == Loads::Flags).then(Vec::new),
    };
    let a = d
        .annotation()
        .map_err(|what| corrupt(&format!("{what} at body byte {}", d.at)))?;
    if d.at != raw.len() {
        return Err(corrupt("bytes after the end"));
    }
    Ok((a, d.flags.unwrap_or_default()))
}

/// Slots of [`Encoder`]'s recently looked-up strings.
const RECENT_SLOTS: usize = 256;

/// [`Encoder`]'s recently looked-up strings, `(address, length, index)` by
/// slot, all empty at first (no string is `usize::MAX` bytes long).
struct RecentSlots(Box<[(usize, usize, u32); RECENT_SLOTS]>);

impl Default for RecentSlots {
    fn default() -> RecentSlots {
        RecentSlots(Box::new([(0, usize::MAX, 0); RECENT_SLOTS]))
    }
}

/// What takes each finished part of the body but the last ones.
type PartSink<'p> = &'p mut dyn FnMut(Frame, Vec<u8>);

/// Writes `v` as LEB128.
#[inline]
fn put_uint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// The part in `buffer`, which is left empty with room for the next: parts
/// are about equal, and a buffer grown from empty is copied at each
/// doubling.
fn take_part(buffer: &mut Vec<u8>) -> Vec<u8> {
    let room = buffer.len() + buffer.len() / 8;
    std::mem::replace(buffer, Vec::with_capacity(room))
}

/// `v` zigzag-encoded: small negative numbers as small unsigned ones.
fn zigzag(v: i64) -> u64 {
    ((v << 1) ^ (v >> 63)) as u64
}

/// The most bytes of a load before its inline chain: nine numbers of up
/// to 32 bits (five bytes each), three of 64 (ten), two of 8 (two).
const LOAD_HEAD_BYTES: usize = 5 * 9 + 10 * 3 + 2 * 2;

/// A load's bytes before its inline chain, written here and appended to
/// the body at once: pushed to the body one by one, each checked its room
/// and stored the body's length.
struct LoadHead {
    bytes: [u8; LOAD_HEAD_BYTES],
    len: usize,
}

impl LoadHead {
    fn new() -> LoadHead {
        LoadHead {
            bytes: [0; LOAD_HEAD_BYTES],
            len: 0,
        }
    }

    /// Writes `v` as LEB128.
    #[inline]
    fn uint(&mut self, mut v: u64) {
        while v >= 0x80 {
            self.bytes[self.len] = (v as u8) | 0x80;
            self.len += 1;
            v >>= 7;
        }
        self.bytes[self.len] = v as u8;
        self.len += 1;
    }

    fn int(&mut self, v: i64) {
        self.uint(zigzag(v));
    }

    /// Writes the index where there is one.
    fn optional(&mut self, index: Option<u32>) {
        if let Some(i) = index {
            self.uint(u64::from(i));
        }
    }

    fn as_slice(&self) -> &[u8] {
        &self.bytes[..self.len]
    }
}

struct Encoder<'a, 'p> {
    out: Vec<u8>,
    /// Hashed with foldhash: SipHash of every load's texts was a good part
    /// of the encoding; the table's order is that of first use either way.
    index: foldhash::HashMap<&'a str, u32>,
    /// The index of each string already seen by its address and length:
    /// a load's texts are shared [`Text`]s, so most lookups hash 16 bytes
    /// here instead of a whole `file:line` there.
    by_address: foldhash::HashMap<(usize, usize), u32>,
    /// The string last looked up in each of [`RECENT_SLOTS`] slots by its
    /// address: a load's register names and its neighbours' lines and
    /// inline places repeat from load to load, and a hit here hashes
    /// nothing.
    recent: RecentSlots,
    /// The strings in the table so far.
    strings: u32,
    /// The table's strings not yet sent, each as its length and bytes: the
    /// table is compressed in parts of its own as it grows, its count
    /// (known at the end) in a frame before them.
    table: Vec<u8>,
    /// Where each finished part goes.
    sink: PartSink<'p>,
    /// The size that finishes a part of the table or of the rest.
    part_bytes: usize,
    /// The parts of the table sent.
    table_parts: usize,
    /// The parts of the rest sent.
    rest_parts: usize,
    /// The last load's non-empty inline chain and where its bytes (count
    /// and indices) lie in `out`: the loads of one run of code mostly
    /// share their chain (clones of one), whose bytes are then copied
    /// instead of each text looked up again. None past the end of a part.
    last_chain: Option<(&'a InlineChain, std::ops::Range<usize>)>,
    /// The bytes of the parts sent.
    sent: usize,
}

impl<'a, 'p> Encoder<'a, 'p> {
    /// An encoder for an annotation of `loads` loads, whose parts of about
    /// `part_bytes` go to `sink`.
    fn new(loads: usize, sink: PartSink<'p>, part_bytes: usize) -> Encoder<'a, 'p> {
        let strings = loads / LOADS_PER_STRING;
        Encoder {
            out: Vec::new(),
            index: foldhash::HashMap::with_capacity_and_hasher(strings, Default::default()),
            by_address: foldhash::HashMap::with_capacity_and_hasher(strings, Default::default()),
            recent: RecentSlots::default(),
            strings: 0,
            table: Vec::new(),
            sink,
            part_bytes,
            table_parts: 0,
            rest_parts: 0,
            last_chain: None,
            sent: 0,
        }
    }

    fn uint(&mut self, v: u64) {
        put_uint(&mut self.out, v);
    }

    /// Sends the part of the rest in `out` to be compressed.
    fn end_part(&mut self) {
        self.last_chain = None;
        let part = take_part(&mut self.out);
        self.send(Frame::Rest(self.rest_parts), part);
        self.rest_parts += 1;
    }

    /// Sends the part of the table in `table` to be compressed.
    fn end_table_part(&mut self) {
        let part = take_part(&mut self.table);
        self.send(Frame::Table(self.table_parts), part);
        self.table_parts += 1;
    }

    /// Sends `part` to be compressed into `frame`.
    fn send(&mut self, frame: Frame, part: Vec<u8>) {
        self.sent += part.len();
        (self.sink)(frame, part);
    }

    /// The length of the whole body and its parts not yet sent: the
    /// table's count, the table's last part and the rest's, where not
    /// empty.
    fn finish(self) -> (usize, Vec<Part>) {
        let mut count = Vec::new();
        put_uint(&mut count, u64::from(self.strings));
        let mut last = vec![(Frame::TableCount, count)];
        if !self.table.is_empty() {
            last.push((Frame::Table(self.table_parts), self.table));
        }
        if !self.out.is_empty() {
            last.push((Frame::Rest(self.rest_parts), self.out));
        }
        let raw_len = self.sent + last.iter().map(|(_, part)| part.len()).sum::<usize>();
        (raw_len, last)
    }

    fn int(&mut self, v: i64) {
        self.uint(zigzag(v));
    }

    fn bytes(&mut self, b: &[u8]) {
        self.uint(b.len() as u64);
        self.out.extend_from_slice(b);
    }

    /// A string of the table (written by index). Inlined where strings are
    /// written: three in four lookups hit a recent slot, and a call for
    /// each cost more than the hit; the rest are looked up out of line.
    #[inline]
    fn string(&mut self, s: &'a str) {
        let i = self.string_index(s);
        self.uint(u64::from(i));
    }

    /// The index of `s` in the table (see [`Encoder::string`]).
    #[inline]
    fn string_index(&mut self, s: &'a str) -> u32 {
        let address = (s.as_ptr() as usize, s.len());
        let slot = ((address.0 >> 4) ^ (address.0 >> 14)) % RECENT_SLOTS;
        let (at, len, i) = self.recent.0[slot];
        if (at, len) == address {
            i
        } else {
            self.look_up(s, address, slot)
        }
    }

    /// The index of `s`, at `address`, not in its recent slot, which it
    /// then takes.
    #[inline(never)]
    fn look_up(&mut self, s: &'a str, address: (usize, usize), slot: usize) -> u32 {
        let i = self.index_of(s, address);
        self.recent.0[slot] = (address.0, address.1, i);
        i
    }

    /// The index of `s`, at `address`, in the table, added if new.
    fn index_of(&mut self, s: &'a str, address: (usize, usize)) -> u32 {
        if let Some(&i) = self.by_address.get(&address) {
            return i;
        }
        let next = self.strings;
        let i = *self.index.entry(s).or_insert(next);
        if i == next {
            self.strings += 1;
            put_uint(&mut self.table, s.len() as u64);
            self.table.extend_from_slice(s.as_bytes());
            if self.table.len() >= self.part_bytes {
                self.end_table_part();
            }
        }
        self.by_address.insert(address, i);
        i
    }

    /// A string of the table where there is one. Inlined: called for five
    /// fields of every load, the call cost more than its work.
    #[inline]
    fn optional(&mut self, s: Option<&'a str>) {
        if let Some(s) = s {
            self.string(s);
        }
    }

    fn annotation(&mut self, a: &'a Annotation) {
        // Destructured so that a new field cannot be forgotten here.
        let Annotation {
            schema,
            binary,
            mode,
            functions,
            loads,
            ptwrites,
            shared_libraries,
            escapes,
            cpu_features,
        } = a;
        self.bytes(schema.as_bytes());
        let BinaryIdentity {
            path,
            size,
            sha256,
            build_id,
        } = binary;
        self.bytes(path.as_bytes());
        self.uint(*size);
        self.bytes(sha256.as_bytes());
        match build_id {
            None => self.uint(0),
            Some(b) => {
                self.uint(1);
                self.bytes(b.as_bytes());
            }
        }
        self.uint(match mode {
            None => 0,
            Some(InstrumentationMode::Soft) => 1,
            Some(InstrumentationMode::Ptwrite) => 2,
        });
        self.uint(functions.len() as u64);
        for f in functions {
            self.function(f);
        }
        self.uint(loads.len() as u64);
        let mut previous = 0u64;
        for l in loads {
            self.load(l, previous);
            previous = l.ip;
            if self.out.len() >= self.part_bytes {
                self.end_part();
            }
        }
        self.uint(ptwrites.len() as u64);
        let mut previous = 0u64;
        for p in ptwrites {
            let PtwriteSite { ip, load, operand } = p;
            self.int(ip.wrapping_sub(previous) as i64);
            previous = *ip;
            self.uint(u64::from(*load));
            self.uint(match operand {
                PtwriteOperand::Base => 0,
                PtwriteOperand::Index => 1,
                PtwriteOperand::Address => 2,
            });
        }
        self.uint(shared_libraries.len() as u64);
        for s in shared_libraries {
            self.string(s);
        }
        self.uint(escapes.len() as u64);
        for e in escapes {
            let EscapeSite {
                at,
                function,
                loads,
                probed,
                untraced_load: _,
            } = e;
            self.uint(*at);
            self.uint(u64::from(*function));
            self.uint(u64::from(*loads));
            self.uint(u64::from(*probed));
        }
        // Only when there are any: older bodies end at the escapes (or at
        // the CPU features, before the untraced-load sites).
        let untraced_loads: Vec<usize> = escapes
            .iter()
            .enumerate()
            .filter(|(_, e)| e.untraced_load)
            .map(|(i, _)| i)
            .collect();
        if !cpu_features.is_empty() || !untraced_loads.is_empty() {
            self.uint(cpu_features.len() as u64);
            for f in cpu_features {
                self.string(f);
            }
        }
        if !untraced_loads.is_empty() {
            self.uint(untraced_loads.len() as u64);
            for i in untraced_loads {
                self.uint(i as u64);
            }
        }
    }

    fn function(&mut self, f: &'a FunctionSite) {
        let FunctionSite {
            name,
            raw_name,
            start,
            size,
            instrumented,
            skipped,
            stack_loads,
            string_loads,
        } = f;
        let flags = bit(*instrumented, F_INSTRUMENTED)
            | bit(raw_name.is_some(), F_RAW_NAME)
            | bit(skipped.is_some(), F_SKIPPED);
        self.uint(u64::from(flags));
        self.bytes(name.as_bytes());
        if let Some(raw) = raw_name {
            self.bytes(raw.as_bytes());
        }
        self.uint(*start);
        self.uint(*size);
        self.optional(skipped.as_deref());
        self.uint(u64::from(*stack_loads));
        self.uint(u64::from(*string_loads));
    }

    fn load(&mut self, l: &'a LoadSite, previous_ip: u64) {
        let LoadSite {
            id,
            ip,
            len,
            class,
            instrumented,
            implied,
            proxy,
            base,
            index,
            scale,
            displacement,
            size,
            function,
            line,
            inline_chain,
            skipped,
            segment,
            gather,
            read_modify_write,
            control,
        } = l;
        let flags = bit(*instrumented, L_INSTRUMENTED)
            | bit(proxy.is_some(), L_PROXY)
            | bit(base.is_some(), L_BASE)
            | bit(index.is_some(), L_INDEX)
            | bit(line.is_some(), L_LINE)
            | bit(skipped.is_some(), L_SKIPPED)
            | bit(segment.is_some(), L_SEGMENT)
            | bit(*gather, L_GATHER)
            | bit(*read_modify_write, L_READ_MODIFY_WRITE)
            | bit(*control, L_CONTROL);
        let mut head = LoadHead::new();
        head.uint(u64::from(flags));
        head.uint(u64::from(*id));
        head.int(ip.wrapping_sub(previous_ip) as i64);
        head.uint(u64::from(*len));
        head.uint(match class {
            LoadClass::Strided => 0,
            LoadClass::Irregular => 1,
            LoadClass::Constant => 2,
        });
        head.uint(u64::from(*implied));
        if let Some(p) = proxy {
            head.int(p.get().wrapping_sub(*ip) as i64);
        }
        head.optional(base.as_deref().map(|s| self.string_index(s)));
        head.optional(index.as_deref().map(|s| self.string_index(s)));
        head.uint(u64::from(*scale));
        head.int(*displacement);
        head.uint(u64::from(*size));
        head.uint(u64::from(*function));
        head.optional(line.as_deref().map(|s| self.string_index(s)));
        self.out.extend_from_slice(head.as_slice());
        self.inline_chain(inline_chain);
        self.optional(skipped.as_deref());
        self.optional(segment.map(Segment::as_str));
    }

    /// A load's inline chain: its length, then its texts; the last load's
    /// bytes where it is the same chain.
    fn inline_chain(&mut self, chain: &'a InlineChain) {
        if chain.is_empty() {
            self.uint(0);
            return;
        }
        let start = self.out.len();
        match &self.last_chain {
            Some((last, bytes)) if chain.is_shared_with(last) => {
                let bytes = bytes.clone();
                self.out.extend_from_within(bytes);
            }
            _ => {
                self.uint(chain.len() as u64);
                for place in chain {
                    self.string(place);
                }
            }
        }
        self.last_chain = Some((chain, start..self.out.len()));
    }
}

struct Decoder<'a> {
    bytes: &'a [u8],
    at: usize,
    table: Vec<Text>,
    /// Whether loads get their texts ([`decode_without_load_texts`]).
    load_texts: bool,
    /// Where [`decode_outline`] keeps each load's flags instead of the load.
    flags: Option<Vec<LoadFlags>>,
}

type Decoded<T> = Result<T, &'static str>;

impl Decoder<'_> {
    fn uint(&mut self) -> Decoded<u64> {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let b = *self.bytes.get(self.at).ok_or("truncated number")?;
            self.at += 1;
            v |= u64::from(b & 0x7f) << shift;
            if b & 0x80 == 0 {
                return Ok(v);
            }
        }
        Err("number too long")
    }

    fn int(&mut self) -> Decoded<i64> {
        let v = self.uint()?;
        Ok((v >> 1) as i64 ^ -((v & 1) as i64))
    }

    fn small<T: TryFrom<u64>>(&mut self) -> Decoded<T> {
        T::try_from(self.uint()?).map_err(|_| "number out of range")
    }

    /// A count of items each taking at least one byte: never more than the
    /// bytes left, so a damaged count cannot become a huge allocation.
    fn count(&mut self) -> Decoded<usize> {
        let n: usize = self.small()?;
        if n > self.bytes.len() - self.at {
            return Err("count larger than the data");
        }
        Ok(n)
    }

    fn text(&mut self) -> Decoded<String> {
        let n = self.count()?;
        let b = &self.bytes[self.at..self.at + n];
        self.at += n;
        String::from_utf8(b.to_vec()).map_err(|_| "string not UTF-8")
    }

    fn string(&mut self) -> Decoded<Text> {
        let i: usize = self.small()?;
        self.table
            .get(i)
            .cloned()
            .ok_or("string index out of range")
    }

    fn optional(&mut self, present: bool) -> Decoded<Option<String>> {
        if present {
            self.string().map(|s| Some(s.to_string()))
        } else {
            Ok(None)
        }
    }

    /// A load's text: [`Decoder::string`], or checked and left out.
    fn load_text(&mut self) -> Decoded<Option<Text>> {
        if self.load_texts {
            return self.string().map(Some);
        }
        let i: usize = self.small()?;
        if i >= self.table.len() {
            return Err("string index out of range");
        }
        Ok(None)
    }

    fn load_optional(&mut self, present: bool) -> Decoded<Option<Text>> {
        if present { self.load_text() } else { Ok(None) }
    }

    fn annotation(&mut self) -> Decoded<Annotation> {
        let strings = self.count()?;
        self.table = Vec::with_capacity(strings);
        for _ in 0..strings {
            let s = self.text()?;
            self.table.push(Text::from(s));
        }
        let schema = self.text()?;
        let binary = BinaryIdentity {
            path: self.text()?,
            size: self.uint()?,
            sha256: self.text()?,
            build_id: match self.uint()? {
                0 => None,
                1 => Some(self.text()?),
                _ => return Err("bad build-id tag"),
            },
        };
        let mode = match self.uint()? {
            0 => None,
            1 => Some(InstrumentationMode::Soft),
            2 => Some(InstrumentationMode::Ptwrite),
            _ => return Err("bad mode"),
        };
        let n = self.count()?;
        let mut functions = Vec::with_capacity(n);
        for _ in 0..n {
            functions.push(self.function()?);
        }
        let n = self.count()?;
        let mut loads = Vec::with_capacity(if self.flags.is_some() { 0 } else { n });
        if let Some(flags) = &mut self.flags {
            flags.reserve_exact(n);
        }
        let mut previous = 0u64;
        for _ in 0..n {
            let load = self.load(previous)?;
            previous = load.ip;
            match &mut self.flags {
                Some(flags) => flags.push(LoadFlags::of(&load)),
                None => loads.push(load),
            }
        }
        let n = self.count()?;
        let mut ptwrites = Vec::with_capacity(n);
        let mut previous = 0u64;
        for _ in 0..n {
            let ip = previous.wrapping_add(self.int()? as u64);
            previous = ip;
            ptwrites.push(PtwriteSite {
                ip,
                load: self.small()?,
                operand: match self.uint()? {
                    0 => PtwriteOperand::Base,
                    1 => PtwriteOperand::Index,
                    2 => PtwriteOperand::Address,
                    _ => return Err("bad ptwrite operand"),
                },
            });
        }
        let n = self.count()?;
        let mut shared_libraries = Vec::with_capacity(n);
        for _ in 0..n {
            shared_libraries.push(self.string()?.to_string());
        }
        let n = self.count()?;
        let mut escapes = Vec::with_capacity(n);
        for _ in 0..n {
            escapes.push(EscapeSite {
                at: self.uint()?,
                function: self.small()?,
                loads: self.small()?,
                probed: self.small()?,
                untraced_load: false,
            });
        }
        let mut cpu_features = Vec::new();
        if self.at < self.bytes.len() {
            let n = self.count()?;
            cpu_features.reserve(n);
            for _ in 0..n {
                cpu_features.push(self.string()?.to_string());
            }
        }
        if self.at < self.bytes.len() {
            let n = self.count()?;
            for _ in 0..n {
                let i = self.uint()?;
                let site = usize::try_from(i)
                    .ok()
                    .and_then(|i| escapes.get_mut(i))
                    .ok_or("untraced-load site out of range")?;
                site.untraced_load = true;
            }
        }
        Ok(Annotation {
            schema,
            binary,
            mode,
            functions,
            loads,
            ptwrites,
            shared_libraries,
            escapes,
            cpu_features,
        })
    }

    fn function(&mut self) -> Decoded<FunctionSite> {
        let flags: u32 = self.small()?;
        if flags & !F_ALL != 0 {
            return Err("unknown function flags");
        }
        Ok(FunctionSite {
            name: self.text()?,
            raw_name: if flags & F_RAW_NAME != 0 {
                Some(self.text()?)
            } else {
                None
            },
            start: self.uint()?,
            size: self.uint()?,
            instrumented: flags & F_INSTRUMENTED != 0,
            skipped: self.optional(flags & F_SKIPPED != 0)?,
            stack_loads: self.small()?,
            string_loads: self.small()?,
        })
    }

    fn load(&mut self, previous_ip: u64) -> Decoded<LoadSite> {
        let flags: u32 = self.small()?;
        if flags & !L_ALL != 0 {
            return Err("unknown load flags");
        }
        let id = self.small()?;
        let ip = previous_ip.wrapping_add(self.int()? as u64);
        let len = self.small()?;
        let class = match self.uint()? {
            0 => LoadClass::Strided,
            1 => LoadClass::Irregular,
            2 => LoadClass::Constant,
            _ => return Err("bad load class"),
        };
        let implied = self.small()?;
        let proxy = if flags & L_PROXY != 0 {
            Some(NonZeroU64::new(ip.wrapping_add(self.int()? as u64)).ok_or("proxy at address 0")?)
        } else {
            None
        };
        Ok(LoadSite {
            id,
            ip,
            len,
            class,
            instrumented: flags & L_INSTRUMENTED != 0,
            implied,
            proxy,
            base: self.load_optional(flags & L_BASE != 0)?,
            index: self.load_optional(flags & L_INDEX != 0)?,
            scale: self.small()?,
            displacement: self.int()?,
            size: self.small()?,
            function: self.small()?,
            line: self.load_optional(flags & L_LINE != 0)?,
            inline_chain: {
                let n = self.count()?;
                let mut chain = Vec::with_capacity(if self.load_texts { n } else { 0 });
                for _ in 0..n {
                    if let Some(place) = self.load_text()? {
                        chain.push(place);
                    }
                }
                InlineChain::from(chain)
            },
            skipped: self.load_optional(flags & L_SKIPPED != 0)?,
            segment: self
                .load_optional(flags & L_SEGMENT != 0)?
                .map(|name| Segment::from_name(&name).ok_or("bad segment register"))
                .transpose()?,
            gather: flags & L_GATHER != 0,
            read_modify_write: flags & L_READ_MODIFY_WRITE != 0,
            control: flags & L_CONTROL != 0,
        })
    }
}
