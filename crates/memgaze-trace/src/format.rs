//! The trace file format, version 3: a streaming, chunked, compressed
//! container for [`TraceHeader`], the records of every sample, and
//! [`TraceTotals`].
//!
//! # Layout
//!
//! ```text
//! file   := magic version chunk*            (all integers little endian)
//! magic  := 89 4D 47 5A 0D 0A 1A 0A          ("\x89MGZ\r\n\x1a\n", PNG-style: catches
//!                                             text-mode and 7-bit transfer damage)
//! version:= u32                              (3; a reader reads 2 and 3, refuses others)
//! chunk  := kind:u8  0:u8 0:u8 0:u8  stored_len:u32  raw_len:u32  crc32:u32  stored:[u8; stored_len]
//! ```
//!
//! `stored` is one zstd frame that decompresses to exactly `raw_len` bytes;
//! `crc32` (IEEE) covers the first 12 bytes of the chunk header *and* the
//! stored bytes, so a damaged length is caught as surely as damaged data.
//! Every error names the byte offset of the chunk (or header) at fault.
//!
//! Chunk kinds, in file order:
//!
//! * `H` — exactly one, first: the [`TraceHeader`] as JSON. Load sites are
//!   listed here once; records refer to them by index.
//! * `R` — any number: record events (below), at most ~1 MiB raw each, so a
//!   reader or writer never holds more than one chunk whatever the trace
//!   length (a full trace of 100 M records in one sample included).
//! * `T` — exactly one, last: the [`TraceTotals`] as JSON, followed by the
//!   end of the file. A file without it is truncated and is rejected.
//!
//! # Record events (`R` payload)
//!
//! ```text
//! payload := records:u32 samples:u32 events:u32 head:[u8; events] data:[u8]*
//! ```
//!
//! The counts are those of this chunk (readers check them). Each event
//! has one `head` byte, in order, and its numbers follow each other in
//! `data` (little endian, as few bytes as the head byte says). For a head
//! byte with low nibble `k` and high nibble `n`:
//!
//! ```text
//! k = 0..=8   a record. Load site: n (0..=11), or 12 + the next n - 11
//!             (1..=4) data bytes (n = 12..=15). Address delta: k = 0: the
//!             load site's previous delta repeats; k >= 1: zigzag(delta)
//!             in the next k data bytes.
//! k = 9       begin the next sample, recorded by thread  (n data bytes, n <= 4)
//! k = 10      the current sample continues with records of thread  (n data bytes)
//! k = 11      spatial records of thread follow  (n data bytes; version 3)
//! k = 12..=15 invalid
//! ```
//!
//! After a `k = 11` event every record is *spatial* ([`Record::spatial`]:
//! taken by spatial sampling outside any sample, docs/METRICS.md "Whole-run
//! locality"), from that thread, until the next event (`k = 9`, `k = 10` or
//! another `k = 11`); a `k = 10` event returns to the current sample. The
//! events only switch a mode, so the record decoder's loop is the same for
//! both kinds. Spatial records may come before the first sample; they
//! belong to no sample (readers report the last sample begun, 0 before
//! any, as their `sample`). They count in the chunk's `records`, not in
//! its `samples`; the totals count them apart
//! ([`TraceTotals::spatial_records`]).
//!
//! The address delta is taken against the previous address of the *same
//! load site* in the same chunk, and the previous delta of that load site
//! is its stride (both 0 at the start of each chunk, so chunks decode
//! independently): a strided load of one of the first 12 load sites costs
//! one byte per record before compression, two for the next 256, and an
//! irregular load one byte per 8 bits of its delta more; zstd takes the
//! rest. All data stays in `data` and all structure in `head`, so zstd
//! finds the repeats of the latter, and a decoder knows where each event's
//! data starts from the head bytes alone (no dependency on the previous
//! number's length: see *Speed*). Samples are numbered 0, 1, 2… in order of
//! their begin events; a sample may be empty. A sample whose records come
//! from several threads (`k = 10`) is split per thread by the analysis
//! (docs/METRICS.md).
//!
//! Version 2 is version 3 without spatial records (`k = 11` is invalid
//! there); readers read it. Version 1 (older cargo memgaze) interleaved
//! LEB128 tags and deltas; readers refuse it with a line that says to
//! record the trace again.
//!
//! # Speed
//!
//! Decoding LEB128 numbers one after the other is a chain: where a number
//! starts depends on the length of the one before, so every record waits
//! for the previous one's bytes (or for a guessed branch, mispredicted
//! whenever strided and irregular loads mix). With the head bytes apart,
//! the position of each record's data is a running sum of lengths read
//! from independent head bytes, and the decoder (a tight loop over a
//! chunk, branch-free number reads of 8 bytes from a payload padded with
//! zeros) decodes records mostly in parallel. It fills a small batch that
//! [`TraceReader::next_raw`] hands out, or calls a closure per record
//! ([`TraceReader::for_each_raw`]). The writer stores numbers 8 bytes at
//! a time into preallocated chunk buffers.

use super::error::TraceError;
use super::model::{LoadClass, Record, TraceHeader, TraceTotals};
use super::sites::{EncodedSites, header_frames};
use memgaze_output::AtomicFile;
use std::fs::File;
use std::io::{BufReader, Read, Write};
use std::path::Path;

/// First eight bytes of every trace file.
pub const MAGIC: [u8; 8] = *b"\x89MGZ\r\n\x1a\n";
/// The format version this code writes and the newest it reads.
pub const VERSION: u32 = 3;
/// The oldest format version this code reads (no spatial records).
pub(crate) const OLDEST_READABLE: u32 = 2;

const CHUNK_HEADER_LEN: usize = 16;
const KIND_HEADER: u8 = b'H';
const KIND_RECORDS: u8 = b'R';
const KIND_TOTALS: u8 = b'T';
/// A records chunk is closed once its raw payload reaches this size.
const CHUNK_TARGET_RAW: usize = 1 << 20;
/// Largest raw payload a reader accepts for a records chunk (a writer never
/// comes near it; the bound keeps a damaged file from asking for gigabytes).
const MAX_RAW_RECORDS: u32 = 64 << 20;
/// Largest raw payload of the header or totals chunk (JSON).
const MAX_RAW_META: u32 = 1 << 30;
/// zstd level: records compress within 1% as well at 1 as at 3 (the
/// random part of irregular addresses is all that is left), twice as fast.
const ZSTD_LEVEL: i32 = 1;
/// Zero bytes after a decompressed payload: the decoder reads numbers 8
/// bytes at a time (an event's data at most 12 bytes past its start).
const PAD: usize = 16;
/// Room after the writer's chunk target: numbers are stored 8 bytes at a
/// time, an event's at most 12 bytes past its start (a record's stores
/// take a 24-byte window at the data length).
const WRITE_SLACK: usize = 32;
/// Most bytes one record adds to a chunk: its head byte, a load site
/// number of up to 4 bytes and a delta of up to 8.
const MAX_RECORD_BYTES: usize = 13;
/// Load sites `0..INLINE_LOADS` are named by their head byte alone.
const INLINE_LOADS: u64 = 12;
/// Head byte low nibbles of the sample, thread and spatial events (0..=8
/// are records).
const EVENT_SAMPLE: u8 = 9;
const EVENT_THREAD: u8 = 10;
const EVENT_SPATIAL: u8 = 11;
/// Masks keeping the low `k` bytes of a number, by head byte nibble.
const LOW_BYTES: [u64; 16] = {
    let mut masks = [0u64; 16];
    let mut k = 1;
    while k < 8 {
        masks[k] = (1u64 << (8 * k)) - 1;
        k += 1;
    }
    masks[8] = u64::MAX;
    masks
};
/// Records decoded ahead for [`TraceReader::next_raw`].
const BATCH: usize = 512;

/// One record as stored: the load site index rather than its resolved
/// facts. [`TraceReader::next_raw`] yields these without a lookup.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct RawRecord {
    /// Index into [`TraceHeader::loads`].
    pub load: u32,
    /// Effective data address.
    pub addr: u64,
    /// Sample index (0-based, in file order).
    pub sample: u64,
    /// Thread that produced the record.
    pub thread: u32,
    /// Taken by spatial sampling outside any time sample
    /// ([`Record::spatial`](crate::model::Record::spatial)).
    pub spatial: bool,
}

/// Everything a trace file says between its header and its totals, in order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TraceEvent {
    /// A new sample starts (possibly empty).
    Sample {
        /// Its index.
        sample: u64,
        /// The thread its first records come from.
        thread: u32,
    },
    /// The current sample continues with records of another thread.
    Thread {
        /// The thread of the records that follow.
        thread: u32,
    },
    /// Spatial records of a thread follow (outside every sample).
    Spatial {
        /// The thread of the records that follow.
        thread: u32,
    },
    /// One record.
    Record(RawRecord),
}

/// Writes a trace file as records arrive; never holds more than one chunk.
///
/// Call [`TraceWriter::begin_sample`] before the first record of each
/// sample, [`TraceWriter::push`] per record and [`TraceWriter::finish`] at
/// the end: a writer dropped without `finish` leaves a file that readers
/// reject as truncated.
pub struct TraceWriter<W: Write> {
    out: W,
    compressor: zstd::bulk::Compressor<'static>,
    /// The chunk's head bytes (`head_len` written) and data (`data_len`
    /// written), each `CHUNK_TARGET_RAW + WRITE_SLACK` long.
    head: Vec<u8>,
    head_len: usize,
    data: Vec<u8>,
    data_len: usize,
    /// The payload put together for compression.
    raw: Vec<u8>,
    stored: Vec<u8>,
    loads: LoadStates,
    chunk_records: u32,
    chunk_samples: u32,
    records: u64,
    spatial_records: u64,
    samples: u64,
    in_sample: bool,
    /// Records pushed now are spatial (after [`TraceWriter::begin_spatial`]).
    spatial: bool,
}

impl<W: Write> TraceWriter<W> {
    /// Writes the magic, version and header chunk.
    pub fn new(out: W, header: &TraceHeader) -> Result<Self, TraceError> {
        validate_header(header).map_err(|what| TraceError::InvalidHeader { what })?;
        let mut writer = Self::start(out, header.loads.len())?;
        let json = serde_json::to_vec(header).map_err(|source| TraceError::Encode {
            what: "cannot encode trace header",
            source,
        })?;
        writer.write_chunk(KIND_HEADER, &json)?;
        writer.start_chunk();
        Ok(writer)
    }

    /// [`TraceWriter::new`] for `header` with the functions and loads of
    /// `sites` (encoded once per program: see [`crate::sites`]); `header`
    /// itself must list none. Readers see the same header as if `new` had
    /// written it with them.
    pub fn with_sites(
        out: W,
        header: &TraceHeader,
        sites: &EncodedSites,
    ) -> Result<Self, TraceError> {
        // The sites were checked when encoded; this checks the sampling.
        validate_header(header).map_err(|what| TraceError::InvalidHeader { what })?;
        let mut writer = Self::start(out, sites.loads())?;
        let (stored, raw_len) = header_frames(header, sites, &mut writer.compressor)?;
        writer.stored = stored;
        writer.write_stored(KIND_HEADER, raw_len)?;
        writer.start_chunk();
        Ok(writer)
    }

    /// A writer for `loads` load sites, with the magic and version written.
    fn start(out: W, loads: usize) -> Result<Self, TraceError> {
        u32::try_from(loads).map_err(|_| TraceError::InvalidHeader {
            what: "trace header lists more than 2^32 load sites".into(),
        })?;
        let mut writer = TraceWriter {
            out,
            compressor: zstd::bulk::Compressor::new(ZSTD_LEVEL)
                .map_err(TraceError::io("cannot create a zstd compressor"))?,
            head: vec![0; CHUNK_TARGET_RAW + WRITE_SLACK],
            head_len: 0,
            data: vec![0; CHUNK_TARGET_RAW + WRITE_SLACK],
            data_len: 0,
            raw: Vec::new(),
            stored: Vec::new(),
            loads: LoadStates::new(loads),
            chunk_records: 0,
            chunk_samples: 0,
            records: 0,
            spatial_records: 0,
            samples: 0,
            in_sample: false,
            spatial: false,
        };
        writer
            .out
            .write_all(&MAGIC)
            .map_err(TraceError::io("cannot write trace"))?;
        writer
            .out
            .write_all(&VERSION.to_le_bytes())
            .map_err(TraceError::io("cannot write trace"))?;
        Ok(writer)
    }

    /// Lets records name load sites up to `loads` (the header's count
    /// grows when another instrumented program joins a recording): the
    /// file's header must then be replaced by one listing them
    /// ([`replace_header`]) once the trace is finished.
    pub fn extend_loads(&mut self, loads: usize) {
        if loads > self.loads.entries.len() {
            self.loads.entries.resize(loads, LoadState::default());
        }
    }

    /// Starts the next sample (index = number of samples begun so far),
    /// whose records come from `thread`.
    pub fn begin_sample(&mut self, thread: u32) -> Result<(), TraceError> {
        self.control(EVENT_SAMPLE, thread);
        self.chunk_samples += 1;
        self.samples += 1;
        self.in_sample = true;
        self.spatial = false;
        self.maybe_flush()
    }

    /// Makes the records pushed next spatial records of `thread` (outside
    /// every sample), until the next [`TraceWriter::begin_sample`] or
    /// [`TraceWriter::switch_thread`] (which returns to the current sample).
    pub fn begin_spatial(&mut self, thread: u32) -> Result<(), TraceError> {
        self.control(EVENT_SPATIAL, thread);
        self.spatial = true;
        self.maybe_flush()
    }

    /// Continues the current sample with records of another thread (a
    /// recorder whose sample buffer interleaves threads). The analysis
    /// splits such samples per thread.
    pub fn switch_thread(&mut self, thread: u32) -> Result<(), TraceError> {
        if !self.in_sample {
            return Err(TraceError::Misuse {
                what: "switch_thread called before the first begin_sample".into(),
            });
        }
        self.control(EVENT_THREAD, thread);
        self.spatial = false;
        self.maybe_flush()
    }

    fn control(&mut self, kind: u8, thread: u32) {
        let bytes = byte_len(u64::from(thread));
        self.data[self.data_len..self.data_len + 8]
            .copy_from_slice(&u64::from(thread).to_le_bytes());
        self.data_len += bytes;
        self.head[self.head_len] = kind | (bytes as u8) << 4;
        self.head_len += 1;
    }

    /// Appends a record of load site `load` (index into the header's
    /// `loads`) that accessed `addr`.
    #[inline]
    pub fn push(&mut self, load: u32, addr: u64) -> Result<(), TraceError> {
        let generation = self.loads.generation;
        let Some(state) = self.loads.entries.get_mut(load as usize) else {
            return Err(self.unknown_load(load));
        };
        if !self.in_sample && !self.spatial {
            return Err(TraceError::Misuse {
                what: "push called before the first begin_sample".into(),
            });
        }
        self.data_len = encode_record(
            &mut self.head[self.head_len..],
            &mut self.data,
            self.data_len,
            state,
            generation,
            load,
            addr,
        );
        self.head_len += 1;
        self.chunk_records += 1;
        self.count_records(1);
        self.maybe_flush()
    }

    #[inline]
    fn count_records(&mut self, n: u64) {
        if self.spatial {
            self.spatial_records += n;
        } else {
            self.records += n;
        }
    }

    /// Appends several records, exactly as [`TraceWriter::push`] of each in
    /// turn (the same bytes, the same error at the same record), but with
    /// the sample check made once and the chunk-full check once per run of
    /// records that cannot fill the chunk: the collector's path for a
    /// message's records.
    pub fn push_records(&mut self, records: &[(u32, u64)]) -> Result<(), TraceError> {
        if records.is_empty() {
            return Ok(());
        }
        if !self.in_sample && !self.spatial {
            // `push`'s error for the first record.
            return self.push(records[0].0, records[0].1);
        }
        let mut rest = records;
        while !rest.is_empty() {
            // A record adds at most `MAX_RECORD_BYTES`: a run of `n` with
            // `n * MAX_RECORD_BYTES` below the room left cannot reach the
            // chunk target, so only its end needs the flush check (which
            // keeps chunk boundaries where `push` puts them).
            let room = CHUNK_TARGET_RAW.saturating_sub(self.head_len + self.data_len);
            let n = ((room.saturating_sub(1)) / MAX_RECORD_BYTES).clamp(1, rest.len());
            let (run, after) = rest.split_at(n);
            let generation = self.loads.generation;
            let states = &mut self.loads.entries[..];
            let head = &mut self.head[self.head_len..self.head_len + n];
            let data = &mut self.data[..];
            let mut data_len = self.data_len;
            let mut done = 0;
            for (h, &(load, addr)) in head.iter_mut().zip(run) {
                let Some(state) = states.get_mut(load as usize) else {
                    break;
                };
                data_len = encode_record(
                    std::slice::from_mut(h),
                    data,
                    data_len,
                    state,
                    generation,
                    load,
                    addr,
                );
                done += 1;
            }
            self.data_len = data_len;
            self.head_len += done;
            self.chunk_records += done as u32;
            self.count_records(done as u64);
            if done < n {
                let load = run[done].0;
                return Err(self.unknown_load(load));
            }
            self.maybe_flush()?;
            rest = after;
        }
        Ok(())
    }

    #[cold]
    fn unknown_load(&self, load: u32) -> TraceError {
        TraceError::UnknownLoad {
            load,
            loads: self.loads.entries.len(),
        }
    }

    /// Records pushed so far, spatial records not included.
    pub fn records(&self) -> u64 {
        self.records
    }

    /// Spatial records pushed so far.
    pub fn spatial_records(&self) -> u64 {
        self.spatial_records
    }

    /// Samples begun so far.
    pub fn samples(&self) -> u64 {
        self.samples
    }

    /// Writes the last records chunk and the totals, flushes, and returns
    /// the output. `totals.records`, `totals.spatial_records` and
    /// `totals.samples` must equal what was written (a mismatch is a
    /// collector bug and is refused).
    pub fn finish(mut self, totals: &TraceTotals) -> Result<W, TraceError> {
        if totals.records != self.records
            || totals.samples != self.samples
            || totals.spatial_records != self.spatial_records
        {
            return Err(TraceError::Misuse {
                what: format!(
                    "totals say {} records in {} samples and {} spatial records but {} records in {} samples and {} spatial records were written",
                    totals.records,
                    totals.samples,
                    totals.spatial_records,
                    self.records,
                    self.samples,
                    self.spatial_records
                ),
            });
        }
        if self.head_len > 0 {
            self.flush_chunk()?;
        }
        let json = serde_json::to_vec(totals).map_err(|source| TraceError::Encode {
            what: "cannot encode trace totals",
            source,
        })?;
        self.write_chunk(KIND_TOTALS, &json)?;
        self.out
            .flush()
            .map_err(TraceError::io("cannot write trace"))?;
        Ok(self.out)
    }

    #[inline]
    fn maybe_flush(&mut self) -> Result<(), TraceError> {
        if self.head_len + self.data_len >= CHUNK_TARGET_RAW {
            self.flush_chunk()?;
        }
        Ok(())
    }

    fn start_chunk(&mut self) {
        self.head_len = 0;
        self.data_len = 0;
        self.chunk_records = 0;
        self.chunk_samples = 0;
        self.loads.reset();
    }

    #[cold]
    fn flush_chunk(&mut self) -> Result<(), TraceError> {
        let mut raw = std::mem::take(&mut self.raw);
        raw.clear();
        raw.extend_from_slice(&self.chunk_records.to_le_bytes());
        raw.extend_from_slice(&self.chunk_samples.to_le_bytes());
        raw.extend_from_slice(&(self.head_len as u32).to_le_bytes());
        raw.extend_from_slice(&self.head[..self.head_len]);
        raw.extend_from_slice(&self.data[..self.data_len]);
        let result = self.write_chunk(KIND_RECORDS, &raw);
        self.raw = raw;
        self.start_chunk();
        result
    }

    fn write_chunk(&mut self, kind: u8, raw: &[u8]) -> Result<(), TraceError> {
        self.stored.clear();
        self.stored
            .reserve(zstd::zstd_safe::compress_bound(raw.len()));
        self.compressor
            .compress_to_buffer(raw, &mut self.stored)
            .map_err(TraceError::io("zstd compression failed"))?;
        self.write_stored(kind, raw.len() as u32)
    }

    /// Writes a chunk of `kind` whose stored bytes are in `self.stored`.
    fn write_stored(&mut self, kind: u8, raw_len: u32) -> Result<(), TraceError> {
        let header = chunk_header(kind, self.stored.len() as u32, raw_len, &self.stored);
        self.out
            .write_all(&header)
            .map_err(TraceError::io("cannot write trace"))?;
        self.out
            .write_all(&self.stored)
            .map_err(TraceError::io("cannot write trace"))?;
        Ok(())
    }
}

impl TraceWriter<AtomicFile> {
    /// Starts a trace file at `path` and writes the header. The records go
    /// to a temporary file beside it: `path` appears (or is replaced) only
    /// when the [`AtomicFile`] that [`TraceWriter::finish`] returns is
    /// committed, so no reader ever sees half a trace. Fails at once when
    /// `path` cannot be written (see [`memgaze_output::check_output`]).
    /// Errors other than a refused output do not name the path (the caller
    /// adds it: see [`TraceError`]).
    pub fn create(path: &Path, header: &TraceHeader) -> Result<Self, TraceError> {
        let file = AtomicFile::create(path)?;
        TraceWriter::new(file, header)
    }

    /// [`TraceWriter::create`] with [`TraceWriter::with_sites`].
    pub fn create_with_sites(
        path: &Path,
        header: &TraceHeader,
        sites: &EncodedSites,
    ) -> Result<Self, TraceError> {
        let file = AtomicFile::create(path)?;
        TraceWriter::with_sites(file, header, sites)
    }
}

/// Replaces the header of the finished trace file at `path` with `header`
/// (which must list at least the loads its records name: the old header
/// extended, see [`TraceWriter::extend_loads`]). Record chunks decode on
/// their own and the checksum covers no position, so every chunk after
/// the header is copied as it is; the file is replaced atomically.
pub fn replace_header(path: &Path, header: &TraceHeader) -> Result<(), TraceError> {
    validate_header(header).map_err(|what| TraceError::InvalidHeader { what })?;
    let old = std::fs::read(path).map_err(TraceError::io("cannot read trace"))?;
    // Magic, version and the old header chunk, checked by a reader.
    TraceReader::new(&old[..])?;
    let header_chunk = 12;
    let stored = u32::from_le_bytes(old[header_chunk + 4..header_chunk + 8].try_into().unwrap());
    let rest = header_chunk + CHUNK_HEADER_LEN + stored as usize;
    let json = serde_json::to_vec(header).map_err(|source| TraceError::Encode {
        what: "cannot encode trace header",
        source,
    })?;
    let compressed = zstd::bulk::compress(&json, ZSTD_LEVEL)
        .map_err(TraceError::io("zstd compression failed"))?;
    let mut out = AtomicFile::create(path)?;
    let chunk = chunk_header(
        KIND_HEADER,
        compressed.len() as u32,
        json.len() as u32,
        &compressed,
    );
    for part in [&old[..header_chunk], &chunk[..], &compressed, &old[rest..]] {
        out.write_all(part)
            .map_err(TraceError::io("cannot write trace"))?;
    }
    out.commit()?;
    Ok(())
}

/// Reads a trace file as a stream of records; validates every chunk.
pub struct TraceReader<R: Read> {
    input: R,
    /// Bytes consumed from `input`.
    offset: u64,
    header: TraceHeader,
    decompressor: zstd::bulk::Decompressor<'static>,
    stored: Vec<u8>,
    /// The current chunk's payload (`end` bytes) followed by [`PAD`] zeros.
    raw: Vec<u8>,
    end: usize,
    /// Next head byte and its end; next data byte (ends at `end`).
    head: usize,
    head_end: usize,
    data: usize,
    chunk_offset: u64,
    chunk_records: u32,
    chunk_samples: u32,
    expected_records: u32,
    expected_samples: u32,
    loads: LoadStates,
    /// Records decoded ahead (all of `sample` and `thread`), `batch_at`
    /// the next to hand out.
    batch: Vec<(u32, u64)>,
    batch_at: usize,
    sample: Option<u64>,
    thread: u32,
    /// The records decoded now are spatial (after a `k = 11` event).
    spatial: bool,
    /// The file's format version (2 has no spatial events).
    version: u32,
    /// Records decoded, spatial ones included, and the spatial ones.
    records: u64,
    spatial_records: u64,
    samples: u64,
    totals: Option<TraceTotals>,
}

impl<R: Read> TraceReader<R> {
    /// Checks magic and version and reads the header chunk.
    pub fn new(mut input: R) -> Result<Self, TraceError> {
        let mut start = [0u8; 12];
        let got = read_full(&mut input, &mut start).map_err(TraceError::io("cannot read trace"))?;
        if got == 0 {
            return Err(TraceError::NotATrace { empty: true });
        }
        if got < 8 || start[..8] != MAGIC {
            return Err(TraceError::NotATrace { empty: false });
        }
        if got < 12 {
            return Err(TraceError::Truncated {
                offset: got as u64,
                what: format!("ends at byte offset {got}, inside the format version"),
            });
        }
        let version = u32::from_le_bytes(start[8..12].try_into().unwrap());
        if version == 0 {
            return Err(TraceError::Corrupt {
                offset: 8,
                what: "format version 0 at byte offset 8".into(),
            });
        }
        if !(OLDEST_READABLE..=VERSION).contains(&version) {
            return Err(TraceError::UnsupportedVersion { version });
        }
        let mut reader = TraceReader {
            input,
            offset: 12,
            header: placeholder_header(),
            decompressor: zstd::bulk::Decompressor::new()
                .map_err(TraceError::io("cannot create a zstd decompressor"))?,
            stored: Vec::new(),
            raw: Vec::new(),
            end: 0,
            head: 0,
            head_end: 0,
            data: 0,
            chunk_offset: 12,
            chunk_records: 0,
            chunk_samples: 0,
            expected_records: 0,
            expected_samples: 0,
            loads: LoadStates::new(0),
            batch: Vec::with_capacity(BATCH),
            batch_at: 0,
            sample: None,
            thread: 0,
            spatial: false,
            version,
            records: 0,
            spatial_records: 0,
            samples: 0,
            totals: None,
        };
        let offset = reader.offset;
        match reader.read_chunk()? {
            Some(KIND_HEADER) => {}
            Some(kind) => {
                return Err(TraceError::Corrupt {
                    offset,
                    what: format!(
                        "expected the header chunk at byte offset {offset}, found kind {}",
                        kind_name(kind)
                    ),
                });
            }
            None => {
                return Err(TraceError::Truncated {
                    offset,
                    what: format!("ends at byte offset {offset}, before its header"),
                });
            }
        }
        let header: TraceHeader =
            serde_json::from_slice(reader.payload()).map_err(|e| TraceError::Corrupt {
                offset,
                what: format!(
                    "header chunk at byte offset {offset} is not a valid trace header ({e})"
                ),
            })?;
        validate_header(&header).map_err(|what| TraceError::Corrupt {
            offset,
            what: format!("header chunk at byte offset {offset}: {what}"),
        })?;
        reader.loads = LoadStates::new(header.loads.len());
        reader.header = header;
        reader.end = 0;
        Ok(reader)
    }

    /// The trace header.
    pub fn header(&self) -> &TraceHeader {
        &self.header
    }

    /// The totals, once the end of the trace has been reached.
    pub fn totals(&self) -> Option<&TraceTotals> {
        self.totals.as_ref()
    }

    /// Bytes of the file consumed so far (for progress displays).
    pub fn bytes_read(&self) -> u64 {
        self.offset
    }

    /// The file's format version.
    pub fn version(&self) -> u32 {
        self.version
    }

    /// Records read so far (spatial records included).
    pub(crate) fn records_read(&self) -> u64 {
        self.records - (self.batch.len() - self.batch_at) as u64
    }

    /// Samples begun so far.
    pub fn samples_read(&self) -> u64 {
        self.samples
    }

    /// The next record with its load site resolved (`ip`, `class`,
    /// `implied` from the header), or `None` after the totals were read.
    pub fn next_record(&mut self) -> Result<Option<Record>, TraceError> {
        Ok(self.next_raw()?.map(|raw| {
            let load = &self.header.loads[raw.load as usize];
            Record {
                ip: load.ip,
                addr: raw.addr,
                class: load.class,
                implied: load.implied,
                sample: raw.sample,
                thread: raw.thread,
                spatial: raw.spatial,
            }
        }))
    }

    /// The next record as stored (load site index), skipping sample and
    /// thread events; `None` after the totals were read.
    #[inline]
    pub fn next_raw(&mut self) -> Result<Option<RawRecord>, TraceError> {
        if let Some(record) = self.batched() {
            return Ok(Some(record));
        }
        self.next_raw_slow()
    }

    #[inline]
    fn batched(&mut self) -> Option<RawRecord> {
        let &(load, addr) = self.batch.get(self.batch_at)?;
        self.batch_at += 1;
        Some(RawRecord {
            load,
            addr,
            // A batch is only filled inside a sample or spatial records.
            sample: self.sample.unwrap_or(0),
            thread: self.thread,
            spatial: self.spatial,
        })
    }

    fn next_raw_slow(&mut self) -> Result<Option<RawRecord>, TraceError> {
        loop {
            match self.next_event()? {
                Some(TraceEvent::Record(r)) => return Ok(Some(r)),
                Some(_) => continue,
                None => return Ok(None),
            }
        }
    }

    /// Calls `visit` with every remaining record, in order — what a loop
    /// over [`TraceReader::next_raw`] sees, faster: records go from the
    /// chunk decoder straight to `visit`. Returns once the totals were read
    /// (or at the first error, after the records before it).
    pub fn for_each_raw(&mut self, mut visit: impl FnMut(RawRecord)) -> Result<(), TraceError> {
        loop {
            while let Some(record) = self.batched() {
                visit(record);
            }
            if (self.sample.is_some() || self.spatial) && self.head < self.head_end {
                let (sample, thread, spatial) =
                    (self.sample.unwrap_or(0), self.thread, self.spatial);
                let n = self.decode_records(usize::MAX, |load, addr| {
                    visit(RawRecord {
                        load,
                        addr,
                        sample,
                        thread,
                        spatial,
                    })
                })?;
                if n > 0 {
                    continue;
                }
            }
            match self.next_event()? {
                Some(TraceEvent::Record(r)) => visit(r),
                Some(_) => {}
                None => return Ok(()),
            }
        }
    }

    /// The next event (sample start, thread switch or record); `None` after
    /// the totals were read and the end of the file checked.
    pub fn next_event(&mut self) -> Result<Option<TraceEvent>, TraceError> {
        if let Some(record) = self.batched() {
            return Ok(Some(TraceEvent::Record(record)));
        }
        loop {
            if self.head < self.head_end {
                return self.decode_event().map(Some);
            }
            if self.totals.is_some() {
                return Ok(None);
            }
            self.finish_records_chunk()?;
            let offset = self.offset;
            match self.read_chunk()? {
                Some(KIND_RECORDS) => self.start_records_chunk()?,
                Some(KIND_TOTALS) => {
                    self.read_totals(offset)?;
                    return Ok(None);
                }
                Some(KIND_HEADER) => {
                    return Err(TraceError::Corrupt {
                        offset,
                        what: format!("a second header chunk at byte offset {offset}"),
                    });
                }
                Some(kind) => {
                    return Err(TraceError::Corrupt {
                        offset,
                        what: format!(
                            "unknown chunk kind {} at byte offset {offset}",
                            kind_name(kind)
                        ),
                    });
                }
                None => {
                    return Err(TraceError::Truncated {
                        offset,
                        what: format!(
                            "ends at byte offset {offset} without its totals footer (was the recording interrupted?)"
                        ),
                    });
                }
            }
        }
    }

    /// Decodes the event at the next head byte: a run of records into the
    /// batch, returning the first, or one sample or thread event.
    fn decode_event(&mut self) -> Result<TraceEvent, TraceError> {
        let byte = self.raw[self.head];
        let kind = byte & 15;
        if kind <= 8 {
            if self.sample.is_none() && !self.spatial {
                return Err(self.corrupt(format_args!("record before the first sample")));
            }
            self.batch.clear();
            self.batch_at = 0;
            let mut batch = std::mem::take(&mut self.batch);
            let result = self.decode_records(BATCH, |load, addr| batch.push((load, addr)));
            self.batch = batch;
            result?;
            let record = self
                .batched()
                .expect("a record head byte decodes to a record");
            return Ok(TraceEvent::Record(record));
        }
        let bytes = usize::from(byte >> 4);
        let last_kind = if self.version >= 3 {
            EVENT_SPATIAL
        } else {
            EVENT_THREAD
        };
        if kind > last_kind || bytes > 4 {
            return Err(self.corrupt(format_args!(
                "invalid event byte 0x{byte:02x} at payload byte {}",
                self.head
            )));
        }
        if self.data + bytes > self.end {
            return Err(self.data_overrun());
        }
        let thread = u64::from_le_bytes(self.raw[self.data..self.data + 8].try_into().unwrap())
            & LOW_BYTES[bytes];
        self.data += bytes;
        self.head += 1;
        self.thread = thread as u32;
        self.spatial = kind == EVENT_SPATIAL;
        if kind == EVENT_SPATIAL {
            Ok(TraceEvent::Spatial {
                thread: self.thread,
            })
        } else if kind == EVENT_SAMPLE {
            let sample = self.samples;
            self.sample = Some(sample);
            self.samples += 1;
            self.chunk_samples += 1;
            Ok(TraceEvent::Sample {
                sample,
                thread: self.thread,
            })
        } else {
            if self.sample.is_none() {
                return Err(self.corrupt(format_args!("thread switch before the first sample")));
            }
            Ok(TraceEvent::Thread {
                thread: self.thread,
            })
        }
    }

    /// Decodes up to `limit` records into `emit`, stopping early at a
    /// sample or thread event or the end of the chunk; returns how many.
    #[inline]
    fn decode_records(
        &mut self,
        limit: usize,
        emit: impl FnMut(u32, u64),
    ) -> Result<usize, TraceError> {
        let mut cursor = Cursor {
            head: self.head,
            data: self.data,
        };
        let result = decode_records(
            &self.raw,
            self.head_end,
            self.end,
            &mut cursor,
            &mut self.loads,
            limit,
            emit,
        );
        self.head = cursor.head;
        self.data = cursor.data;
        match result {
            Ok(n) => {
                self.chunk_records = self.chunk_records.wrapping_add(n as u32);
                self.records += n as u64;
                if self.spatial {
                    self.spatial_records += n as u64;
                }
                Ok(n)
            }
            Err(Corrupt::Overrun) => Err(self.data_overrun()),
            Err(Corrupt::Load(load)) => Err(self.corrupt(format_args!(
                "record at payload byte {} refers to load site {load} but the header lists {}",
                cursor.head,
                self.header.loads.len()
            ))),
        }
    }

    fn data_overrun(&self) -> TraceError {
        self.corrupt(format_args!(
            "the event at payload byte {} runs past the end of the payload",
            self.head
        ))
    }

    fn corrupt(&self, what: std::fmt::Arguments<'_>) -> TraceError {
        TraceError::Corrupt {
            offset: self.chunk_offset,
            what: format!("records chunk at byte offset {}: {what}", self.chunk_offset),
        }
    }

    /// The current chunk's payload.
    fn payload(&self) -> &[u8] {
        &self.raw[..self.end]
    }

    fn start_records_chunk(&mut self) -> Result<(), TraceError> {
        let word = |at: usize| u32::from_le_bytes(self.raw[at..at + 4].try_into().unwrap());
        let events = if self.end >= 12 { word(8) as usize } else { 0 };
        if self.end < 12 || events > self.end - 12 {
            return Err(TraceError::Corrupt {
                offset: self.chunk_offset,
                what: format!(
                    "records chunk at byte offset {} is too short ({} bytes)",
                    self.chunk_offset, self.end
                ),
            });
        }
        self.expected_records = word(0);
        self.expected_samples = word(4);
        self.chunk_records = 0;
        self.chunk_samples = 0;
        self.head = 12;
        self.head_end = 12 + events;
        self.data = self.head_end;
        self.loads.reset();
        Ok(())
    }

    fn finish_records_chunk(&mut self) -> Result<(), TraceError> {
        if self.chunk_records != self.expected_records
            || self.chunk_samples != self.expected_samples
        {
            return Err(self.corrupt(format_args!(
                "holds {} records and {} sample starts but says {} and {}",
                self.chunk_records,
                self.chunk_samples,
                self.expected_records,
                self.expected_samples
            )));
        }
        if self.data != self.end {
            return Err(self.corrupt(format_args!(
                "{} bytes after its last event's data",
                self.end - self.data
            )));
        }
        self.expected_records = 0;
        self.expected_samples = 0;
        self.chunk_records = 0;
        self.chunk_samples = 0;
        Ok(())
    }

    fn read_totals(&mut self, offset: u64) -> Result<(), TraceError> {
        let totals: TraceTotals =
            serde_json::from_slice(self.payload()).map_err(|e| TraceError::Corrupt {
                offset,
                what: format!("totals chunk at byte offset {offset} is not valid ({e})"),
            })?;
        let sampled = self.records - self.spatial_records;
        if totals.records != sampled
            || totals.samples != self.samples
            || totals.spatial_records != self.spatial_records
        {
            return Err(TraceError::Corrupt {
                offset,
                what: format!(
                    "totals at byte offset {offset} count {} records in {} samples and {} spatial records but the file holds {} records in {} samples and {} spatial records",
                    totals.records,
                    totals.samples,
                    totals.spatial_records,
                    sampled,
                    self.samples,
                    self.spatial_records
                ),
            });
        }
        let mut probe = [0u8; 1];
        if read_full(&mut self.input, &mut probe).map_err(TraceError::io("cannot read trace"))? != 0
        {
            return Err(TraceError::Corrupt {
                offset: self.offset,
                what: format!(
                    "unexpected data after the totals footer at byte offset {}",
                    self.offset
                ),
            });
        }
        self.totals = Some(totals);
        Ok(())
    }

    /// Reads one chunk into `self.raw`; `None` at a clean end of file.
    /// Leaves no events to decode until a records chunk is started.
    fn read_chunk(&mut self) -> Result<Option<u8>, TraceError> {
        let offset = self.offset;
        self.chunk_offset = offset;
        self.head = 0;
        self.head_end = 0;
        self.data = 0;
        self.end = 0;
        let mut header = [0u8; CHUNK_HEADER_LEN];
        let got =
            read_full(&mut self.input, &mut header).map_err(TraceError::io("cannot read trace"))?;
        if got == 0 {
            return Ok(None);
        }
        if got < CHUNK_HEADER_LEN {
            let end = offset + got as u64;
            return Err(TraceError::Truncated {
                offset: end,
                what: format!(
                    "ends at byte offset {end} inside the chunk header at byte offset {offset}"
                ),
            });
        }
        self.offset += CHUNK_HEADER_LEN as u64;
        let kind = header[0];
        let stored_len = u32::from_le_bytes(header[4..8].try_into().unwrap());
        let raw_len = u32::from_le_bytes(header[8..12].try_into().unwrap());
        let crc = u32::from_le_bytes(header[12..16].try_into().unwrap());
        self.stored.clear();
        let got = (&mut self.input)
            .take(u64::from(stored_len))
            .read_to_end(&mut self.stored)
            .map_err(TraceError::io("cannot read trace"))?;
        self.offset += got as u64;
        if got < stored_len as usize {
            return Err(TraceError::Truncated {
                offset: self.offset,
                what: format!(
                    "chunk at byte offset {offset} needs {stored_len} bytes but the file ends after {got}"
                ),
            });
        }
        let mut hasher = crc32fast::Hasher::new();
        hasher.update(&header[..12]);
        hasher.update(&self.stored);
        if hasher.finalize() != crc || header[1..4] != [0, 0, 0] {
            return Err(TraceError::Corrupt {
                offset,
                what: format!("chunk at byte offset {offset} fails its checksum"),
            });
        }
        let limit = if kind == KIND_RECORDS {
            MAX_RAW_RECORDS
        } else {
            MAX_RAW_META
        };
        if raw_len > limit {
            return Err(TraceError::Corrupt {
                offset,
                what: format!("chunk at byte offset {offset} claims {raw_len} raw bytes"),
            });
        }
        self.raw.clear();
        self.raw.reserve(raw_len as usize + PAD);
        let n = self
            .decompressor
            .decompress_to_buffer(&self.stored[..], &mut self.raw)
            .map_err(|e| TraceError::Corrupt {
                offset,
                what: format!("chunk at byte offset {offset}: zstd: {e}"),
            })?;
        if n != raw_len as usize {
            return Err(TraceError::Corrupt {
                offset,
                what: format!(
                    "chunk at byte offset {offset} decompresses to {n} bytes, not {raw_len}"
                ),
            });
        }
        self.raw.resize(n + PAD, 0);
        self.end = n;
        Ok(Some(kind))
    }
}

impl TraceReader<BufReader<File>> {
    /// Opens a trace file and reads its header. Errors do not name the path
    /// (the caller adds it: see [`TraceError`]).
    pub fn open(path: &Path) -> Result<Self, TraceError> {
        let file = File::open(path).map_err(|source| TraceError::Open {
            path: path.to_path_buf(),
            source,
        })?;
        TraceReader::new(BufReader::with_capacity(1 << 16, file))
    }
}

/// Where [`decode_records`] is in a payload.
struct Cursor {
    /// The next head byte.
    head: usize,
    /// The next data byte.
    data: usize,
}

/// What [`decode_records`] found wrong.
enum Corrupt {
    /// An event's data runs past the payload.
    Overrun,
    /// A record names a load site the header does not list.
    Load(u64),
}

/// The records decoder: up to `limit` records from head bytes
/// `cursor.head..head_end` and their data from `cursor.data..end` into
/// `emit`, stopping before a sample or thread event; `raw` extends [`PAD`]
/// bytes past `end`. On an error, `cursor` is at the record at fault.
#[inline(always)]
fn decode_records(
    raw: &[u8],
    head_end: usize,
    end: usize,
    cursor: &mut Cursor,
    loads: &mut LoadStates,
    limit: usize,
    mut emit: impl FnMut(u32, u64),
) -> Result<usize, Corrupt> {
    debug_assert!(head_end <= end && raw.len() >= end + PAD);
    let generation = loads.generation;
    let (mut head, mut data) = (cursor.head, cursor.data);
    let mut n = 0;
    let result = loop {
        if n == limit || head >= head_end {
            break Ok(n);
        }
        let byte = raw[head];
        let delta_bytes = usize::from(byte & 15);
        if delta_bytes > 8 {
            break Ok(n);
        }
        let nibble = u64::from(byte >> 4);
        // Site bytes: 0 for an inline load site, else 1..=4.
        let site_bytes = nibble.saturating_sub(INLINE_LOADS - 1) as usize;
        let Some(word) = raw.get(data..data + 8) else {
            break Err(Corrupt::Overrun);
        };
        let site = u64::from_le_bytes(word.try_into().unwrap()) & LOW_BYTES[site_bytes];
        let load = nibble.min(INLINE_LOADS) + site;
        let Some(word) = raw.get(data + site_bytes..data + site_bytes + 8) else {
            break Err(Corrupt::Overrun);
        };
        let coded = u64::from_le_bytes(word.try_into().unwrap()) & LOW_BYTES[delta_bytes];
        let next = data + site_bytes + delta_bytes;
        if next > end {
            break Err(Corrupt::Overrun);
        }
        let Some(state) = loads.entries.get_mut(load as usize) else {
            break Err(Corrupt::Load(load));
        };
        let (base, stride) = state.get(generation);
        let delta = if delta_bytes == 0 {
            stride
        } else {
            unzigzag(coded) as u64
        };
        let addr = base.wrapping_add(delta);
        *state = LoadState {
            generation,
            addr,
            stride: delta,
        };
        emit(load as u32, addr);
        head += 1;
        data = next;
        n += 1;
    };
    cursor.head = head;
    cursor.data = data;
    result
}

/// Checks the cross references inside a header; the error says which one
/// fails (the writer and the reader report it as different variants).
pub(crate) fn validate_header(header: &TraceHeader) -> Result<(), String> {
    let functions = header.functions.len();
    for (i, load) in header.loads.iter().enumerate() {
        if let Some(f) = load.function
            && f as usize >= functions
        {
            return Err(format!(
                "load site {i} refers to function {f} but the header lists {functions}"
            ));
        }
        if let Some(p) = load.proxy {
            if p as usize >= header.loads.len() {
                return Err(format!(
                    "load site {i} names load site {p} as its proxy but the header lists {}",
                    header.loads.len()
                ));
            }
            if load.class != LoadClass::Constant {
                return Err(format!(
                    "load site {i} has a proxy but is not a Constant load"
                ));
            }
        }
    }
    if header.sampling.window == 0 || header.sampling.period < header.sampling.window {
        return Err(format!(
            "invalid sampling parameters: window {} and period {}",
            header.sampling.window, header.sampling.period
        ));
    }
    Ok(())
}

pub(crate) fn placeholder_header() -> TraceHeader {
    TraceHeader {
        backend: super::model::Backend::Soft,
        sampling: super::model::Sampling::full(),
        binary: None,
        command: Vec::new(),
        functions: Vec::new(),
        loads: Vec::new(),
        labels: Vec::new(),
        spatial: None,
    }
}

fn chunk_header(kind: u8, stored_len: u32, raw_len: u32, stored: &[u8]) -> [u8; CHUNK_HEADER_LEN] {
    let mut header = [0u8; CHUNK_HEADER_LEN];
    header[0] = kind;
    header[4..8].copy_from_slice(&stored_len.to_le_bytes());
    header[8..12].copy_from_slice(&raw_len.to_le_bytes());
    let mut hasher = crc32fast::Hasher::new();
    hasher.update(&header[..12]);
    hasher.update(stored);
    header[12..16].copy_from_slice(&hasher.finalize().to_le_bytes());
    header
}

fn kind_name(kind: u8) -> String {
    if kind.is_ascii_graphic() {
        format!("'{}'", kind as char)
    } else {
        format!("0x{kind:02x}")
    }
}

/// Reads until `buf` is full or the input ends; returns the bytes read.
fn read_full(input: &mut impl Read, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut filled = 0;
    while filled < buf.len() {
        match input.read(&mut buf[filled..]) {
            Ok(0) => break,
            Ok(n) => filled += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(filled)
}

/// Encodes one record: its head byte into `head[0]`, its data at
/// `data[data_len..]` (both numbers stored 8 bytes wide, `data` has the
/// room), and updates the load site's state. Returns the new data length.
#[inline(always)]
fn encode_record(
    head: &mut [u8],
    data: &mut [u8],
    data_len: usize,
    state: &mut LoadState,
    generation: u32,
    load: u32,
    addr: u64,
) -> usize {
    let (base, stride) = state.get(generation);
    let delta = addr.wrapping_sub(base);
    *state = LoadState {
        generation,
        addr,
        stride: delta,
    };
    // One bounds check for both stores: the site number takes at most 4
    // bytes (`byte_len` says at most 8), so both fit in 16 of these 24.
    let room: &mut [u8; 24] = (&mut data[data_len..data_len + 24])
        .try_into()
        .expect("24 bytes");
    let site = u64::from(load).saturating_sub(INLINE_LOADS);
    let site_bytes = if load < INLINE_LOADS as u32 {
        0
    } else {
        byte_len(site).max(1)
    };
    room[..8].copy_from_slice(&site.to_le_bytes());
    let coded = zigzag(delta as i64);
    let delta_bytes = if delta == stride {
        0
    } else {
        byte_len(coded).max(1)
    };
    room[site_bytes & 15..(site_bytes & 15) + 8].copy_from_slice(&coded.to_le_bytes());
    let at = data_len + site_bytes;
    let site_nibble = if site_bytes == 0 {
        load as u8
    } else {
        INLINE_LOADS as u8 - 1 + site_bytes as u8
    };
    head[0] = delta_bytes as u8 | site_nibble << 4;
    at + delta_bytes
}

/// Bytes needed to store `value` (0 for 0).
#[inline(always)]
fn byte_len(value: u64) -> usize {
    (71 - value.leading_zeros() as usize) / 8
}

#[inline]
fn zigzag(v: i64) -> u64 {
    ((v << 1) ^ (v >> 63)) as u64
}

#[inline]
fn unzigzag(v: u64) -> i64 {
    ((v >> 1) as i64) ^ -((v & 1) as i64)
}

/// A load site's previous address and delta in the current chunk.
#[derive(Clone, Copy, Debug, Default)]
struct LoadState {
    /// The [`LoadStates::generation`] the other fields belong to; older
    /// ones read as 0.
    generation: u32,
    addr: u64,
    stride: u64,
}

impl LoadState {
    /// (previous address, previous delta) in chunk `generation`.
    #[inline(always)]
    fn get(&self, generation: u32) -> (u64, u64) {
        let keep = u64::from(self.generation == generation).wrapping_neg();
        (self.addr & keep, self.stride & keep)
    }
}

/// Per-load-site state, reset per chunk in O(1) by a generation stamp (so
/// chunks decode independently at no per-chunk cost).
struct LoadStates {
    entries: Vec<LoadState>,
    generation: u32,
}

impl LoadStates {
    fn new(loads: usize) -> Self {
        LoadStates {
            entries: vec![LoadState::default(); loads],
            generation: 1,
        }
    }

    fn reset(&mut self) {
        self.generation = self.generation.wrapping_add(1);
        if self.generation == 0 {
            self.entries.fill(LoadState::default());
            self.generation = 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Backend, Dropped, FunctionEntry, LoadEntry, ProgramExit, Sampling};

    fn header() -> TraceHeader {
        TraceHeader {
            backend: Backend::Soft,
            sampling: Sampling {
                window: 4,
                period: 100,
                seed: Some(7),
            },
            binary: None,
            command: vec!["prog".into(), "arg".into()],
            functions: vec![FunctionEntry {
                name: "main".into(),
                start: 0x1000,
                end: 0x1100,
            }],
            loads: vec![
                LoadEntry {
                    ip: 0x1004,
                    class: LoadClass::Strided,
                    implied: 2,
                    function: Some(0),
                    line: Some("main.c:3".into()),
                    proxy: None,
                },
                LoadEntry {
                    ip: 0x1010,
                    class: LoadClass::Irregular,
                    implied: 0,
                    function: Some(0),
                    line: None,
                    proxy: None,
                },
                LoadEntry {
                    ip: 0x1020,
                    class: LoadClass::Constant,
                    implied: 0,
                    function: None,
                    line: None,
                    proxy: Some(0),
                },
            ],
            labels: vec![("bench".into(), "x".into())],
            spatial: None,
        }
    }

    fn totals(records: u64, samples: u64) -> TraceTotals {
        TraceTotals {
            executions: 1000,
            records,
            spatial_records: 0,
            samples,
            dropped: Dropped::default(),
            exit: Some(ProgramExit::Code(0)),
            complete: true,
            interrupted: None,
            escapes: Vec::new(),
            escape_counts_missing: 0,
            execs_untraced: 0,
            execs_untraced_micros: 0,
        }
    }

    /// The header JSON a file holds (its decompressed header chunk).
    fn header_json(bytes: &[u8]) -> Vec<u8> {
        let stored_len = u32::from_le_bytes(bytes[16..20].try_into().unwrap()) as usize;
        zstd::stream::decode_all(&bytes[28..28 + stored_len]).unwrap()
    }

    #[test]
    fn a_header_written_with_encoded_sites_reads_as_the_full_header() {
        let full = header();
        let sites = EncodedSites::encode(42, &full.functions, &full.loads).unwrap();
        let sites = EncodedSites::from_bytes(&sites.to_bytes()).expect("cache bytes read back");
        assert_eq!((sites.key, sites.functions(), sites.loads()), (42, 1, 3));
        let mut rest = full.clone();
        rest.functions.clear();
        rest.loads.clear();
        for spatial in [None, crate::model::SpatialSampling::with_rate(0.01)] {
            let mut full = full.clone();
            full.spatial = spatial;
            rest.spatial = spatial;
            let plain = TraceWriter::new(Vec::new(), &full).unwrap();
            let mut cached = TraceWriter::with_sites(Vec::new(), &rest, &sites).unwrap();
            cached.begin_sample(0).unwrap();
            cached.push(2, 0x5000).unwrap();
            let plain = plain.finish(&totals(0, 0)).unwrap();
            let cached = cached.finish(&totals(1, 1)).unwrap();
            // Byte for byte the JSON `new` writes, in several zstd frames.
            assert_eq!(header_json(&cached), header_json(&plain));
            let mut reader = TraceReader::new(cached.as_slice()).unwrap();
            assert_eq!(reader.header(), &full);
            assert_eq!(reader.next_raw().unwrap().map(|r| r.load), Some(2));
        }
        // Functions or loads in both places would be listed twice.
        assert!(TraceWriter::with_sites(Vec::new(), &full, &sites).is_err());
    }

    #[test]
    fn damaged_or_foreign_site_caches_are_not_used() {
        let full = header();
        let bytes = EncodedSites::encode(1, &full.functions, &full.loads)
            .unwrap()
            .to_bytes();
        for cut in [0, 8, 47, bytes.len() - 1] {
            assert_eq!(
                EncodedSites::from_bytes(&bytes[..cut]),
                None,
                "cut at {cut}"
            );
        }
        let mut flipped = bytes.clone();
        *flipped.last_mut().unwrap() ^= 1;
        assert_eq!(EncodedSites::from_bytes(&flipped), None);
        let mut foreign = bytes;
        foreign[0] = b'X';
        assert_eq!(EncodedSites::from_bytes(&foreign), None);
        // A load naming a function the list does not have is refused.
        let mut bad = full.loads.clone();
        bad[0].function = Some(9);
        assert!(EncodedSites::encode(1, &full.functions, &bad).is_err());
    }

    /// A program that joined the recording: its loads are named before the
    /// header lists them, and the header replaced at the end keeps every
    /// chunk readable (the records read back exactly, the totals too).
    #[test]
    fn a_replaced_header_lists_loads_the_records_named_beyond_the_old_one() {
        let dir = std::env::temp_dir().join(format!("memgaze-replace-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("t.trace");
        let mut w = TraceWriter::create(&path, &header()).unwrap();
        w.begin_sample(0).unwrap();
        assert!(w.push(4, 0x50).is_err(), "load 4 is not known yet");
        w.extend_loads(5);
        let records: Vec<(u32, u64)> = (0..300_000u64).map(|i| ((i % 5) as u32, 8 * i)).collect();
        w.push_records(&records).unwrap();
        w.finish(&totals(records.len() as u64, 1))
            .unwrap()
            .commit()
            .unwrap();
        assert!(
            TraceReader::open(&path).is_ok(),
            "readable before, as written"
        );
        let mut joined = header();
        let extra = joined.loads[1].clone();
        joined.loads.extend([extra.clone(), extra]);
        joined
            .labels
            .push((crate::OBJECT_LABEL.into(), "1 3 other".into()));
        replace_header(&path, &joined).unwrap();
        let mut r = TraceReader::open(&path).unwrap();
        assert_eq!(r.header(), &joined);
        let mut read = Vec::new();
        while let Some(record) = r.next_raw().unwrap() {
            read.push((record.load, record.addr));
        }
        assert_eq!(read, records);
        assert_eq!(r.totals().unwrap().records, records.len() as u64);
        // A file that is not a trace is refused, untouched.
        let junk = dir.join("junk");
        std::fs::write(&junk, b"not a trace").unwrap();
        assert!(replace_header(&junk, &joined).is_err());
        assert_eq!(std::fs::read(&junk).unwrap(), b"not a trace");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// Writes samples of (thread, [(load, addr)]) and returns the bytes.
    fn write(samples: &[(u32, Vec<(u32, u64)>)]) -> Vec<u8> {
        let mut w = TraceWriter::new(Vec::new(), &header()).unwrap();
        let mut n = 0;
        for (thread, records) in samples {
            w.begin_sample(*thread).unwrap();
            for &(load, addr) in records {
                w.push(load, addr).unwrap();
                n += 1;
            }
        }
        w.finish(&totals(n, samples.len() as u64)).unwrap()
    }

    fn read_all(bytes: &[u8]) -> Result<(TraceHeader, Vec<Record>, TraceTotals), TraceError> {
        let mut r = TraceReader::new(bytes)?;
        let mut out = Vec::new();
        while let Some(rec) = r.next_record()? {
            out.push(rec);
        }
        Ok((r.header().clone(), out, r.totals().unwrap().clone()))
    }

    #[test]
    fn round_trip_resolves_load_sites() {
        let bytes = write(&[
            (3, vec![(0, 0x7fff_0000), (1, 0x10), (0, 0x7fff_0008)]),
            (3, vec![]),
            (5, vec![(2, u64::MAX)]),
        ]);
        let (h, records, t) = read_all(&bytes).unwrap();
        assert_eq!(h, header());
        assert_eq!(t, totals(4, 3));
        let got: Vec<_> = records
            .iter()
            .map(|r| (r.ip, r.addr, r.class, r.implied, r.sample, r.thread))
            .collect();
        assert_eq!(
            got,
            vec![
                (0x1004, 0x7fff_0000, LoadClass::Strided, 2, 0, 3),
                (0x1010, 0x10, LoadClass::Irregular, 0, 0, 3),
                (0x1004, 0x7fff_0008, LoadClass::Strided, 2, 0, 3),
                (0x1020, u64::MAX, LoadClass::Constant, 0, 2, 5),
            ]
        );
    }

    #[test]
    fn many_chunks_and_thread_switches() {
        let mut w = TraceWriter::new(Vec::new(), &header()).unwrap();
        w.begin_sample(1).unwrap();
        for i in 0..700_000u64 {
            if i == 350_000 {
                w.switch_thread(2).unwrap();
            }
            w.push((i % 2) as u32, i.wrapping_mul(0x9e37_79b9_7f4a_7c15))
                .unwrap();
        }
        let bytes = w.finish(&totals(700_000, 1)).unwrap();
        let mut r = TraceReader::new(&bytes[..]).unwrap();
        let mut i = 0u64;
        let mut events = 0;
        while let Some(e) = r.next_event().unwrap() {
            events += 1;
            if let TraceEvent::Record(rec) = e {
                assert_eq!(rec.addr, i.wrapping_mul(0x9e37_79b9_7f4a_7c15));
                assert_eq!(rec.load, (i % 2) as u32);
                assert_eq!(rec.thread, if i < 350_000 { 1 } else { 2 });
                i += 1;
            }
        }
        assert_eq!(i, 700_000);
        assert_eq!(events, 700_002);
    }

    #[test]
    fn strided_records_are_compact() {
        let mut w = TraceWriter::new(Vec::new(), &header()).unwrap();
        w.begin_sample(0).unwrap();
        for i in 0..1_000_000u64 {
            w.push(0, 0x5555_0000_0000 + 8 * i).unwrap();
        }
        let bytes = w.finish(&totals(1_000_000, 1)).unwrap();
        assert!(bytes.len() < 20_000, "{} bytes", bytes.len());
    }

    fn error_of(bytes: &[u8]) -> TraceError {
        read_all(bytes).unwrap_err()
    }

    /// The line a person reads (after `error: <file>: `).
    fn message_of(bytes: &[u8]) -> String {
        memgaze_error::one_line_of(&error_of(bytes))
    }

    #[test]
    fn empty_wrong_magic_and_future_version() {
        assert!(matches!(
            error_of(b""),
            TraceError::NotATrace { empty: true }
        ));
        assert!(matches!(
            error_of(b"hello world, not a trace"),
            TraceError::NotATrace { empty: false }
        ));
        let mut bytes = write(&[(0, vec![(0, 1)])]);
        bytes[8] = 9;
        assert!(matches!(
            error_of(&bytes),
            TraceError::UnsupportedVersion { version: 9 }
        ));
        assert!(message_of(&bytes).contains("version 9 is newer"));
        bytes[8] = 1;
        assert!(matches!(
            error_of(&bytes),
            TraceError::UnsupportedVersion { version: 1 }
        ));
        bytes[8] = 0;
        assert!(matches!(
            error_of(&bytes),
            TraceError::Corrupt { offset: 8, .. }
        ));
        // What people read (docs/CLI.md shows these lines).
        assert_eq!(message_of(b""), "empty file: not a memgaze trace");
        bytes[8] = 1;
        assert_eq!(
            message_of(&bytes),
            "trace format version 1 is older than this cargo memgaze reads (versions 2 to 3); record the trace again"
        );
    }

    #[test]
    fn truncation_names_the_offset() {
        let bytes = write(&[(0, vec![(0, 1), (1, 2)])]);
        for cut in 1..bytes.len() {
            match error_of(&bytes[..cut]) {
                TraceError::Truncated { offset, .. } => {
                    assert_eq!(offset, cut as u64, "cut at {cut}")
                }
                TraceError::NotATrace { empty: false } => assert!(cut < 8, "cut at {cut}"),
                e => panic!("cut at {cut}: {e}"),
            }
        }
        // Cut exactly after the last records chunk: the footer is missing.
        let message = message_of(&bytes[..bytes.len() - totals_chunk_len(&bytes)]);
        assert!(message.contains("without its totals footer"), "{message}");
    }

    fn totals_chunk_len(bytes: &[u8]) -> usize {
        // Walk the chunks to find the last one.
        let mut at = 12;
        let mut last = 0;
        while at < bytes.len() {
            let stored = u32::from_le_bytes(bytes[at + 4..at + 8].try_into().unwrap()) as usize;
            last = CHUNK_HEADER_LEN + stored;
            at += last;
        }
        last
    }

    #[test]
    fn flipped_bytes_fail_the_checksum() {
        let bytes = write(&[(0, vec![(0, 1), (1, 2)])]);
        for at in 12..bytes.len() {
            let mut damaged = bytes.clone();
            damaged[at] ^= 0x40;
            let error = error_of(&damaged);
            assert!(
                matches!(
                    error,
                    TraceError::Corrupt { .. } | TraceError::Truncated { .. }
                ),
                "flip at {at}: {error}"
            );
            // Every message says where (the module documentation promises it).
            let message = message_of(&damaged);
            assert!(message.contains("byte offset"), "flip at {at}: {message}");
        }
    }

    #[test]
    fn trailing_garbage_is_refused() {
        let mut bytes = write(&[(0, vec![(0, 1)])]);
        bytes.push(0);
        let end = bytes.len() as u64 - 1;
        assert!(matches!(error_of(&bytes), TraceError::Corrupt { offset, .. } if offset == end));
    }

    #[test]
    fn push_records_writes_what_push_writes() {
        // Load sites named by the head byte and by 1, 2 and 3 data bytes,
        // stride runs and random deltas, batches of every size across
        // chunk boundaries, thread switches between batches.
        let mut header = header();
        let extra = header.loads[1].clone();
        header.loads.resize(70_000, extra);
        let mut rng = 0x2545_f491_4f6c_dd1du64;
        let mut next = move || {
            rng ^= rng >> 12;
            rng ^= rng << 25;
            rng ^= rng >> 27;
            rng.wrapping_mul(0x2545_f491_4f6c_dd1d)
        };
        let mut batches = Vec::new();
        let mut addr = 0x7000_0000u64;
        for _ in 0..6_000 {
            let len = (next() % 600) as usize;
            let batch: Vec<(u32, u64)> = (0..len)
                .map(|_| {
                    let r = next();
                    let load = match r % 4 {
                        0 | 1 => (r >> 8) % 12,
                        2 => 12 + (r >> 8) % 300,
                        _ => 60_000 + (r >> 8) % 10_000,
                    } as u32;
                    addr = if r % 5 == 0 { next() } else { addr + 8 };
                    (load, addr)
                })
                .collect();
            batches.push(batch);
        }
        let mut one = TraceWriter::new(Vec::new(), &header).unwrap();
        let mut many = TraceWriter::new(Vec::new(), &header).unwrap();
        one.begin_sample(0).unwrap();
        many.begin_sample(0).unwrap();
        for (i, batch) in batches.iter().enumerate() {
            if i % 7 == 3 {
                one.switch_thread(i as u32).unwrap();
                many.switch_thread(i as u32).unwrap();
            }
            if i % 11 == 5 {
                one.begin_spatial(i as u32).unwrap();
                many.begin_spatial(i as u32).unwrap();
            }
            for &(load, addr) in batch {
                one.push(load, addr).unwrap();
            }
            many.push_records(batch).unwrap();
        }
        let records = one.records();
        let spatial = one.spatial_records();
        // A head byte per record: more than one chunk's worth.
        assert!(records + spatial > 3 * CHUNK_TARGET_RAW as u64 / 2 && spatial > 0 && records > 0);
        assert_eq!((many.records(), many.spatial_records()), (records, spatial));
        let totals = TraceTotals {
            spatial_records: spatial,
            ..totals(records, 1)
        };
        let one = one.finish(&totals).unwrap();
        let many = many.finish(&totals).unwrap();
        assert!(one == many, "push_records wrote other bytes than push");
        // An unknown load site stops the batch where `push` would.
        let mut w = TraceWriter::new(Vec::new(), &header).unwrap();
        assert!(matches!(
            w.push_records(&[(0, 1)]),
            Err(TraceError::Misuse { .. })
        ));
        w.begin_sample(0).unwrap();
        let error = w
            .push_records(&[(0, 1), (1, 2), (70_000, 3), (0, 4)])
            .unwrap_err();
        assert!(
            matches!(error, TraceError::UnknownLoad { load: 70_000, .. }),
            "{error}"
        );
        assert_eq!(w.records(), 2);
    }

    #[test]
    fn writer_refuses_misuse() {
        let mut w = TraceWriter::new(Vec::new(), &header()).unwrap();
        assert!(matches!(w.push(0, 1), Err(TraceError::Misuse { .. })));
        w.begin_sample(0).unwrap();
        assert!(matches!(
            w.push(3, 1),
            Err(TraceError::UnknownLoad { load: 3, loads: 3 })
        ));
        w.push(0, 1).unwrap();
        assert!(matches!(
            w.finish(&totals(2, 1)),
            Err(TraceError::Misuse { .. })
        ));
        // Spatial records count apart, and the totals must say so.
        let mut w = TraceWriter::new(Vec::new(), &header()).unwrap();
        w.begin_spatial(3).unwrap();
        w.push(0, 1).unwrap();
        assert_eq!((w.records(), w.spatial_records()), (0, 1));
        assert!(matches!(
            w.finish(&totals(1, 0)),
            Err(TraceError::Misuse { .. })
        ));
    }

    #[test]
    fn spatial_records_are_marked_and_switch_back_to_the_sample() {
        let mut w = TraceWriter::new(Vec::new(), &header()).unwrap();
        w.begin_spatial(5).unwrap();
        w.push(0, 0x40).unwrap();
        w.begin_sample(1).unwrap();
        w.push(1, 0x80).unwrap();
        w.begin_spatial(2).unwrap();
        w.push(0, 0x48).unwrap();
        w.switch_thread(3).unwrap();
        w.push(1, 0x88).unwrap();
        let totals = TraceTotals {
            spatial_records: 2,
            ..totals(2, 1)
        };
        let bytes = w.finish(&totals).unwrap();
        let (_, records, read) = read_all(&bytes).unwrap();
        let got: Vec<_> = records
            .iter()
            .map(|r| (r.addr, r.sample, r.thread, r.spatial))
            .collect();
        assert_eq!(
            got,
            [
                (0x40, 0, 5, true),
                (0x80, 0, 1, false),
                (0x48, 0, 2, true),
                (0x88, 0, 3, false)
            ]
        );
        assert_eq!(read, totals);
        // The totals must count them apart.
        let mut damaged = TraceWriter::new(Vec::new(), &header()).unwrap();
        damaged.begin_spatial(0).unwrap();
        damaged.push(0, 1).unwrap();
        assert!(damaged.finish(&totals).is_err());
    }

    #[test]
    fn zigzag_round_trips() {
        for v in [0i64, 1, -1, i64::MAX, i64::MIN, 12345, -987654] {
            assert_eq!(unzigzag(zigzag(v)), v);
        }
    }
}
