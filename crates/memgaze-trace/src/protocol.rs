//! The raw stream between the recorder runtime (machine code the rewriter
//! injects into a program) and the collector.
//!
//! The collector creates an `AF_UNIX` `SOCK_SEQPACKET` socket pair, keeps one
//! end and leaves the other open in the program. The program learns about it
//! from one environment variable ([`RECORDER_ENV`]) read by the injected entry
//! hook. Each `sendto` of the runtime is one **message**, delivered whole and
//! never interleaved with another sender's, so threads and forked children
//! of the program can share the socket without a lock.
//!
//! A message is a fixed [`MessageHeader`] followed by a payload whose meaning
//! depends on [`MessageKind`]. All integers are little endian.
//!
//! | kind | payload |
//! |---|---|
//! | `Records`, `Final` | `count` × [`RECORD_BYTES`]-byte records: `u32` load id, `u64` address |
//! | `RegionBegin`, `RegionEnd` | `count` bytes: the region name (UTF-8, truncated to [`REGION_NAME_MAX`]) |
//! | `ProcessExit` | nothing; `executions`/`dropped` hold process-level counts |
//! | `Exec` | nothing; `dropped` holds what a successful `exec` discards |
//!
//! A large payload may instead lie in a chunk of memory shared with the
//! collector ([`SHARED_ENV`]): the kind then has [`SHARED_FLAG`] set and the
//! message carries only the chunk's index and the payload's length.
//!
//! A record whose load id is [`WINDOW_MARKER`] is not a load: it opens a new
//! sample window of that thread (its address field is the window's sequence
//! number within the thread). A record whose load id is
//! [`UNWRITTEN_MARKER`] was claimed by an execution whose writer never
//! finished it (a signal handler interrupted it and the program exited or
//! jumped away): the execution is counted, the record is dropped.
//!
//! A record whose load id has [`SPATIAL_FLAG`] set (and is not one of the
//! markers above) is a *spatial* record of load `id & !SPATIAL_FLAG`: an
//! execution outside every sample window whose 64-byte block the spatial
//! hash tracks (docs/METRICS.md, "Whole-run locality"). It takes no part in
//! the window it may follow: it is not one of the window's `w` records.

/// Environment variable carrying the connection and sampling parameters:
/// `<fd>:<inode>:<device>:<window>:<period>:<seed>`, all decimal,
/// optionally followed by `:<threshold>:<multiplier>` for spatial sampling
/// (see [`RecorderConfig::spatial_threshold`]). `window == period` asks
/// for a full trace (which takes no spatial samples). The recorder writes
/// every field as [`ENV_FIELD_DIGITS`] digits and all eight fields, so the
/// value's length is the same in every run (see [`RecorderConfig::to_env`]).
pub const RECORDER_ENV: &str = "MEMGAZE_RECORDER";

/// Environment variable naming the shared record buffers the collector
/// offers ([`SharedConfig`]): `<fd>:<inode>:<device>:<chunks>`, all decimal.
/// Optional: without it (or if the runtime cannot map it) every message
/// travels through the socket.
pub const SHARED_ENV: &str = "MEMGAZE_RECORDER_SHM";

/// Set to `0` by the user to keep exec'd (and spawned) instrumented
/// programs out of the trace: the recorder then offers no [`LISTEN_ENV`]
/// address. Any other value, or none, follows them.
pub const FOLLOW_EXEC_ENV: &str = "MEMGAZE_FOLLOW_EXEC";

/// Environment variable naming the abstract `AF_UNIX` `SOCK_SEQPACKET`
/// address (without its leading NUL) where the collector accepts further
/// connections: the entry hook of an instrumented program that does not
/// hold the socket [`RECORDER_ENV`] names (the socket is close-on-exec, so
/// an exec'd program never does) connects there and sends its `Start`. The
/// name is random; the collector accepts only processes of the traced
/// program's process group or descent.
pub const LISTEN_ENV: &str = "MEMGAZE_RECORDER_LISTEN";

/// Digits of every field of [`RECORDER_ENV`] and [`SHARED_ENV`] as the
/// recorder writes them (zero-padded; a `u64` has at most 20).
pub const ENV_FIELD_DIGITS: usize = 20;

/// Longest name [`LISTEN_ENV`] may give (`sun_path` less the leading NUL).
pub const LISTEN_NAME_MAX: usize = 107;

/// Bytes at the start of the shared mapping holding one `u64` state word per
/// chunk: 0 free, 1 claimed by a sender (until the collector has copied it
/// out and stores 0 again).
pub const SHARED_STATE_BYTES: usize = 4096;

/// Bytes of one shared chunk: at least a whole thread buffer's payload.
pub const SHARED_CHUNK_BYTES: usize = 64 * 1024;

/// The state page at the start of the shared mapping, from which the
/// offsets of its control words are derived.
#[repr(C)]
pub(crate) struct SharedStatePage {
    /// One state word per chunk: 0 free, 1 claimed by a sender.
    pub(crate) chunk_states: [u64; SHARED_CHUNKS_MAX],
    /// The release generation ([`SHARED_GENERATION`]).
    pub generation: u32,
    /// Unused, keeps `waiting` aligned.
    pub reserved: u32,
    /// The waiting flag ([`SHARED_WAITING`]).
    pub waiting: u64,
}

/// Offset in the state page of the `u32` release generation: the collector
/// increments it after freeing a chunk; a sender that found no free chunk
/// waits on it (`futex`).
pub const SHARED_GENERATION: usize = core::mem::offset_of!(SharedStatePage, generation);

/// Offset in the state page of the `u64` waiting flag: a sender sets it
/// before waiting; the collector clears it and wakes the waiters.
pub const SHARED_WAITING: usize = core::mem::offset_of!(SharedStatePage, waiting);

/// Most chunks a shared mapping may have (the state page less the two
/// control words).
pub const SHARED_CHUNKS_MAX: usize = (SHARED_STATE_BYTES - 16) / 8;

const _: () = assert!(size_of::<SharedStatePage>() == SHARED_STATE_BYTES);

/// How many times a sender waits (at most 1 ms each) for a free chunk
/// before it copies the message through the socket instead.
pub const SHARED_WAIT_ROUNDS: u32 = 50;

/// Set in a message's kind when its payload is in a shared chunk: the
/// message then carries only the header and a [`SHARED_PAYLOAD_BYTES`]
/// reference (`u32` chunk index, `u32` payload length).
pub const SHARED_FLAG: u32 = 0x100;

/// Size of a shared message's payload (the chunk reference).
pub const SHARED_PAYLOAD_BYTES: usize = 8;

/// Smallest payload the runtime puts in a shared chunk (smaller ones are
/// cheaper to copy through the socket than to claim a chunk for).
pub const SHARED_MIN_PAYLOAD: usize = 4096;

/// Environment variable the harness reads to run one bench at a time on one
/// thread (ARCHITECTURE.md, "Contracts between stages").
pub const RECORDING_ENV: &str = "MEMGAZE_RECORDING";

/// First four bytes of every message: `MGZ1`.
pub const MESSAGE_MAGIC: u32 = u32::from_le_bytes(*b"MGZ1");

/// Size of [`MessageHeader`] on the wire.
pub const HEADER_BYTES: usize = 40;

/// Size of one record on the wire.
pub const RECORD_BYTES: usize = 12;

/// Load id that marks the start of a sample window instead of a load.
pub const WINDOW_MARKER: u32 = u32::MAX;

/// Load id of a record claimed but never written (a dropped record).
pub const UNWRITTEN_MARKER: u32 = u32::MAX - 1;

/// Set in the load id of a spatial record (load ids stay below it).
pub const SPATIAL_FLAG: u32 = 1 << 31;

/// A record's load id without [`SPATIAL_FLAG`], and whether it was set;
/// the markers ([`WINDOW_MARKER`], [`UNWRITTEN_MARKER`]) are returned as
/// they are, unflagged.
#[inline]
pub fn split_spatial(load: u32) -> (u32, bool) {
    if load >= UNWRITTEN_MARKER {
        (load, false)
    } else {
        (load & !SPATIAL_FLAG, load & SPATIAL_FLAG != 0)
    }
}

/// Symbol of memgaze-harness's region-begin marker (`extern "C"`, `rdi`/`rsi`
/// = the region name's bytes and length), whose entry the runtime hooks to
/// send [`MessageKind::RegionBegin`].
pub const REGION_BEGIN_SYMBOL: &str = "memgaze_region_begin";
/// Symbol of memgaze-harness's region-end marker ([`MessageKind::RegionEnd`]).
pub const REGION_END_SYMBOL: &str = "memgaze_region_end";

/// Longest region name carried by a region message.
pub const REGION_NAME_MAX: usize = 256;

/// What a message carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum MessageKind {
    /// A flush of a thread's buffer.
    Records = 1,
    /// The last flush of a thread's buffer, written by the exit hook.
    Final = 2,
    /// `memgaze_region_begin` was called on this thread.
    RegionBegin = 3,
    /// `memgaze_region_end` was called on this thread.
    RegionEnd = 4,
    /// The process ran its exit hook; no more messages from this process.
    ProcessExit = 5,
    /// The process is about to `exec`, its thread's buffer sent: unless a
    /// later message from it follows (the `exec` failed), it ends here and
    /// `dropped` counts what the `exec` discards (process-level drops, other
    /// threads' buffers).
    Exec = 6,
    /// The process's escape counters since its last such message: records
    /// whose load id is an [`EscapeSite`](memgaze_metadata::annotation::EscapeSite)
    /// index and whose address is the count; sent before `ProcessExit` and
    /// `Exec`.
    Escapes = 7,
    /// The entry hook of a process image started recording, or a forked
    /// child is about to send its first records; the payload (`count`
    /// bytes, none when it could not be read) is the path of the
    /// executable it runs. From a process that sent messages before, it is
    /// a program that process `exec`ed, joining the trace: its messages
    /// belong to a new image (slots and threads of their own).
    Start = 8,
    /// The sender started a process with `posix_spawn` (header only; `pid`
    /// and `tid` are the new process's): it runs another program, which
    /// joins the trace if instrumented (its `Start`) and else runs untraced.
    Spawn = 9,
    /// Part of the process's `/proc/self/maps` (`count` bytes, the parts
    /// in order, sent before `ProcessExit`): the objects it had loaded,
    /// `dlopen`ed ones included.
    Objects = 10,
}

impl MessageKind {
    /// Decodes the wire value.
    pub(crate) fn from_u32(value: u32) -> Option<MessageKind> {
        Some(match value {
            1 => MessageKind::Records,
            2 => MessageKind::Final,
            3 => MessageKind::RegionBegin,
            4 => MessageKind::RegionEnd,
            5 => MessageKind::ProcessExit,
            6 => MessageKind::Exec,
            7 => MessageKind::Escapes,
            8 => MessageKind::Start,
            9 => MessageKind::Spawn,
            10 => MessageKind::Objects,
            _ => return None,
        })
    }
}

/// The fixed part of every message.
///
/// `executions` and `dropped` are cumulative per thread slot (per process
/// for `ProcessExit`), so the last message seen from a slot carries its
/// totals even when the program is killed before its exit hook runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct MessageHeader {
    /// What follows.
    pub kind: MessageKind,
    /// Process id of the sender.
    pub pid: u32,
    /// Kernel thread id of the sender (the slot's current owner).
    pub tid: u32,
    /// Instrumented-load executions counted by this slot so far.
    pub executions: u64,
    /// Records this slot knows it lost so far (signal-handler re-entry,
    /// failed writes).
    pub dropped: u64,
    /// Creation index of the thread slot within its process.
    pub slot: u32,
    /// Number of records (or name bytes) in the payload.
    pub count: u32,
}

/// Byte offsets of the header fields, shared with the code generator.
pub mod offsets {
    use core::mem::offset_of;

    /// The header as it lies on the wire (and in a thread slot's buffer):
    /// the offsets below are derived from it, so no two fields overlap.
    #[repr(C)]
    pub(crate) struct WireHeader {
        /// [`MESSAGE_MAGIC`](super::MESSAGE_MAGIC).
        pub magic: u32,
        /// [`MessageKind`](super::MessageKind), possibly with
        /// [`SHARED_FLAG`](super::SHARED_FLAG).
        pub kind: u32,
        /// Process id.
        pub pid: u32,
        /// Kernel thread id.
        pub tid: u32,
        /// Executions so far.
        pub executions: u64,
        /// Records dropped so far.
        pub dropped: u64,
        /// Slot serial.
        pub slot: u32,
        /// Records (or name bytes) in the payload.
        pub count: u32,
    }

    /// `u32` magic.
    pub const MAGIC: i32 = offset_of!(WireHeader, magic) as i32;
    /// `u32` kind.
    pub const KIND: i32 = offset_of!(WireHeader, kind) as i32;
    /// `u32` pid.
    pub const PID: i32 = offset_of!(WireHeader, pid) as i32;
    /// `u32` tid.
    pub const TID: i32 = offset_of!(WireHeader, tid) as i32;
    /// `u64` executions.
    pub const EXECUTIONS: i32 = offset_of!(WireHeader, executions) as i32;
    /// `u64` dropped.
    pub const DROPPED: i32 = offset_of!(WireHeader, dropped) as i32;
    /// `u32` slot serial.
    pub const SLOT: i32 = offset_of!(WireHeader, slot) as i32;
    /// `u32` count.
    pub const COUNT: i32 = offset_of!(WireHeader, count) as i32;

    const _: () = assert!(size_of::<WireHeader>() == super::HEADER_BYTES);
}

/// Why a message could not be decoded.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ProtocolError {
    /// Shorter than a header.
    #[error("message of {0} bytes is shorter than its header")]
    Short(usize),
    /// Wrong magic: not from a memgaze recorder.
    #[error("message does not start with the recorder magic")]
    Magic,
    /// Unknown kind.
    #[error("unknown message kind {0}")]
    Kind(u32),
    /// Payload length disagrees with the header's count.
    #[error("message payload of {actual} bytes, header says {expected}")]
    Length {
        /// Bytes the header announces.
        expected: usize,
        /// Bytes present.
        actual: usize,
    },
}

fn u32_at(bytes: &[u8], at: i32) -> u32 {
    let at = at as usize;
    u32::from_le_bytes(bytes[at..at + 4].try_into().expect("4 bytes"))
}

fn u64_at(bytes: &[u8], at: i32) -> u64 {
    let at = at as usize;
    u64::from_le_bytes(bytes[at..at + 8].try_into().expect("8 bytes"))
}

impl MessageHeader {
    /// Decodes a whole message into its header and payload, checking that
    /// the payload length matches the header.
    pub fn decode(message: &[u8]) -> Result<(MessageHeader, &[u8]), ProtocolError> {
        if message.len() < HEADER_BYTES {
            return Err(ProtocolError::Short(message.len()));
        }
        if u32_at(message, offsets::MAGIC) != MESSAGE_MAGIC {
            return Err(ProtocolError::Magic);
        }
        let raw_kind = u32_at(message, offsets::KIND);
        let kind = MessageKind::from_u32(raw_kind).ok_or(ProtocolError::Kind(raw_kind))?;
        let header = MessageHeader {
            kind,
            pid: u32_at(message, offsets::PID),
            tid: u32_at(message, offsets::TID),
            executions: u64_at(message, offsets::EXECUTIONS),
            dropped: u64_at(message, offsets::DROPPED),
            slot: u32_at(message, offsets::SLOT),
            count: u32_at(message, offsets::COUNT),
        };
        let payload = &message[HEADER_BYTES..];
        let expected = match kind {
            MessageKind::Records | MessageKind::Final | MessageKind::Escapes => {
                header.count as usize * RECORD_BYTES
            }
            MessageKind::RegionBegin
            | MessageKind::RegionEnd
            | MessageKind::Start
            | MessageKind::Objects => header.count as usize,
            MessageKind::ProcessExit | MessageKind::Exec | MessageKind::Spawn => 0,
        };
        if payload.len() != expected {
            return Err(ProtocolError::Length {
                expected,
                actual: payload.len(),
            });
        }
        Ok((header, payload))
    }

    /// Encodes the header (the runtime does this in machine code; the
    /// collector's tests use it to build messages).
    pub fn encode(&self) -> [u8; HEADER_BYTES] {
        let mut out = [0u8; HEADER_BYTES];
        let mut put = |at: i32, bytes: &[u8]| {
            out[at as usize..at as usize + bytes.len()].copy_from_slice(bytes)
        };
        put(offsets::MAGIC, &MESSAGE_MAGIC.to_le_bytes());
        put(offsets::KIND, &(self.kind as u32).to_le_bytes());
        put(offsets::PID, &self.pid.to_le_bytes());
        put(offsets::TID, &self.tid.to_le_bytes());
        put(offsets::EXECUTIONS, &self.executions.to_le_bytes());
        put(offsets::DROPPED, &self.dropped.to_le_bytes());
        put(offsets::SLOT, &self.slot.to_le_bytes());
        put(offsets::COUNT, &self.count.to_le_bytes());
        out
    }
}

/// Iterates over the `(load id, address)` records of a records payload.
pub fn records(payload: &[u8]) -> impl Iterator<Item = (u32, u64)> + '_ {
    payload.chunks_exact(RECORD_BYTES).map(|r| {
        (
            u32::from_le_bytes(r[0..4].try_into().expect("4 bytes")),
            u64::from_le_bytes(r[4..12].try_into().expect("8 bytes")),
        )
    })
}

/// The value of [`SHARED_ENV`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SharedConfig {
    /// Descriptor of the memfd in the program (closed by its entry hook
    /// once mapped).
    pub fd: i32,
    /// Inode of the memfd (checked by the entry hook).
    pub inode: u64,
    /// Device of the memfd.
    pub device: u64,
    /// Number of [`SHARED_CHUNK_BYTES`] chunks after the state page.
    pub chunks: u64,
}

impl SharedConfig {
    /// The environment value, of the same length whatever the numbers
    /// (fields of [`ENV_FIELD_DIGITS`] digits; see [`RecorderConfig::to_env`]).
    pub fn to_env(&self) -> String {
        fixed_width(&[
            u64::from(self.fd.cast_unsigned()),
            self.inode,
            self.device,
            self.chunks,
        ])
    }

    /// Bytes of the whole mapping.
    pub fn bytes(chunks: u64) -> usize {
        SHARED_STATE_BYTES + chunks as usize * SHARED_CHUNK_BYTES
    }
}

/// The value of [`RECORDER_ENV`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RecorderConfig {
    /// Descriptor number of the program's end of the socket.
    pub fd: i32,
    /// Inode of that socket (the runtime checks it before every write, so a
    /// reused descriptor number never receives trace data).
    pub inode: u64,
    /// Device of that socket.
    pub device: u64,
    /// `w`: records per sample window.
    pub window: u64,
    /// `w + z`: executions per period; equal to `window` for a full trace.
    pub period: u64,
    /// Seed of the period jitter.
    pub seed: u64,
    /// Spatial sampling: a load's block `b = addr >> 6` is tracked iff
    /// `b · spatial_multiplier mod 2^64 < spatial_threshold`; 0 switches
    /// spatial sampling off (the value then holds `0:0`).
    /// Both words must be multiples of `2^32` (an instrumented program's
    /// checks take their high halves as immediates; it refuses others).
    pub spatial_threshold: u64,
    /// The multiplier of the block hash.
    pub spatial_multiplier: u64,
}

impl RecorderConfig {
    /// The environment value: all eight fields (`0:0` for spatial sampling
    /// off), each of [`ENV_FIELD_DIGITS`] digits. glibc's start-up reads
    /// every environment string, so a value whose length followed the
    /// settings (full or sampled, a seed or none, the socket's inode) would
    /// change an instrumented libc's load executions between runs.
    pub fn to_env(&self) -> String {
        fixed_width(&[
            u64::from(self.fd.cast_unsigned()),
            self.inode,
            self.device,
            self.window,
            self.period,
            self.seed,
            self.spatial_threshold,
            self.spatial_multiplier,
        ])
    }

    /// Parses an environment value (the runtime's parser, in Rust, for tests).
    pub fn from_env(value: &str) -> Option<RecorderConfig> {
        let fields: Vec<u64> = value
            .split(':')
            .map(|f| f.parse().ok())
            .collect::<Option<_>>()?;
        match fields[..] {
            [fd, inode, device, window, period, seed] => Some(RecorderConfig {
                fd: i32::try_from(fd).ok()?,
                inode,
                device,
                window,
                period,
                seed,
                spatial_threshold: 0,
                spatial_multiplier: 0,
            }),
            [
                fd,
                inode,
                device,
                window,
                period,
                seed,
                spatial_threshold,
                spatial_multiplier,
            ] => Some(RecorderConfig {
                fd: i32::try_from(fd).ok()?,
                inode,
                device,
                window,
                period,
                seed,
                spatial_threshold,
                spatial_multiplier,
            }),
            _ => None,
        }
    }
}

/// `fields` as zero-padded decimals of [`ENV_FIELD_DIGITS`] digits,
/// separated by `:`.
fn fixed_width(fields: &[u64]) -> String {
    let width = ENV_FIELD_DIGITS;
    let mut value = String::with_capacity(fields.len() * (width + 1));
    for (i, field) in fields.iter().enumerate() {
        if i > 0 {
            value.push(':');
        }
        value += &format!("{field:0width$}");
    }
    value
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_round_trips_and_checks_payload_length() {
        let header = MessageHeader {
            kind: MessageKind::Records,
            pid: 7,
            tid: 8,
            executions: 1 << 40,
            dropped: 3,
            slot: 2,
            count: 2,
        };
        let mut message = header.encode().to_vec();
        message.extend_from_slice(&5u32.to_le_bytes());
        message.extend_from_slice(&0x1000u64.to_le_bytes());
        message.extend_from_slice(&WINDOW_MARKER.to_le_bytes());
        message.extend_from_slice(&1u64.to_le_bytes());
        let (decoded, payload) = MessageHeader::decode(&message).unwrap();
        assert_eq!(decoded, header);
        assert_eq!(
            records(payload).collect::<Vec<_>>(),
            vec![(5, 0x1000), (WINDOW_MARKER, 1)]
        );
        assert_eq!(
            MessageHeader::decode(&message[..message.len() - 1]),
            Err(ProtocolError::Length {
                expected: 24,
                actual: 23
            })
        );
        assert_eq!(
            MessageHeader::decode(&message[..10]),
            Err(ProtocolError::Short(10))
        );
        message[0] = b'X';
        assert_eq!(MessageHeader::decode(&message), Err(ProtocolError::Magic));
    }

    #[test]
    fn config_round_trips_through_the_environment_value() {
        let config = RecorderConfig {
            fd: 1000,
            inode: 123456,
            device: 8,
            window: 1000,
            period: 100_000,
            seed: u64::MAX,
            spatial_threshold: 0,
            spatial_multiplier: 0,
        };
        assert_eq!(RecorderConfig::from_env(&config.to_env()), Some(config));
        let spatial = RecorderConfig {
            spatial_threshold: 1 << 57,
            spatial_multiplier: 0x9E37_79B9_7F4A_7C15,
            ..config
        };
        assert_eq!(RecorderConfig::from_env(&spatial.to_env()), Some(spatial));
        // The six-field form (no spatial sampling) still parses.
        assert_eq!(
            RecorderConfig::from_env("1000:123456:8:1000:100000:18446744073709551615"),
            Some(config)
        );
        assert_eq!(split_spatial(7 | SPATIAL_FLAG), (7, true));
        assert_eq!(split_spatial(7), (7, false));
        assert_eq!(split_spatial(WINDOW_MARKER), (WINDOW_MARKER, false));
        assert_eq!(split_spatial(UNWRITTEN_MARKER), (UNWRITTEN_MARKER, false));
        assert_eq!(RecorderConfig::from_env("1:2:3"), None);
        assert_eq!(RecorderConfig::from_env("a:2:3:4:5:6"), None);
    }

    /// The values' lengths do not depend on the settings or the socket:
    /// glibc's start-up reads every environment string.
    #[test]
    fn environment_values_have_one_length_whatever_the_settings() {
        let full = RecorderConfig {
            fd: 3,
            inode: 77,
            device: 8,
            window: 1,
            period: 1,
            seed: 0,
            spatial_threshold: 0,
            spatial_multiplier: 0,
        };
        let sampled = RecorderConfig {
            fd: 1_000_000,
            inode: 123_456_789_012,
            device: 0xfd00,
            window: 1000,
            period: 100_000,
            seed: u64::MAX,
            spatial_threshold: 1 << 57,
            spatial_multiplier: 0x9E37_79B9_7F4A_7C15,
        };
        assert_eq!(full.to_env().len(), sampled.to_env().len());
        assert_eq!(full.to_env().len(), 8 * ENV_FIELD_DIGITS + 7);
        for config in [full, sampled] {
            assert_eq!(RecorderConfig::from_env(&config.to_env()), Some(config));
        }
        let shared = |fd, inode, chunks| {
            SharedConfig {
                fd,
                inode,
                device: 5,
                chunks,
            }
            .to_env()
            .len()
        };
        assert_eq!(shared(4, 9, 1), shared(123_456, u64::MAX, 64));
    }
}
