//! Memory layouts the instrumentation runtime shares with the recorder.
//!
//! The runtime generator (memgaze-instrument) emits code that addresses these
//! offsets; the recorder (memgaze-record) sizes its buffers from them. They
//! live here, below both, so neither depends on the other's internals.

/// Layout of a thread slot (anonymous mapping, wiped on fork).
pub mod slot {
    /// [`MAGIC_VALUE`] once initialised.
    pub const MAGIC: i32 = 0;
    /// Set while the owning thread is inside the runtime (a signal handler
    /// re-entering it sees it); only the owner writes it.
    pub const BUSY: i32 = 80;
    /// Next slot in the process list.
    pub const NEXT: i32 = 16;
    /// Thread control block of the owner.
    pub const TCB: i32 = 24;
    /// Kernel thread id of the owner.
    pub const TID: i32 = 32;
    /// Creation index within the process.
    pub const SERIAL: i32 = 40;
    /// Executions counted so far.
    pub const EXECUTIONS: i32 = 48;
    /// The countdown value last given to the thread and not yet folded in.
    pub const BUDGET: i32 = 56;
    /// Records left in the open window (0: no window open).
    pub const REMAINING: i32 = 64;
    /// Records lost so far.
    pub const DROPPED: i32 = 72;
    /// xorshift64* state.
    pub const RNG: i32 = 8;
    /// Records in the buffer.
    pub const COUNT: i32 = 88;
    /// Windows opened so far.
    pub const WINDOWS: i32 = 128;
    /// Executions that found the slot busy (signal handler re-entry), or
    /// found a record claimed by the code they interrupted still unwritten.
    pub const NESTED: i32 = 136;
    /// Set once the first random skip was issued since the last (re)start.
    pub const STARTED: i32 = 112;
    /// Seqlock generation, bumped (before `BUSY` is cleared) each time the
    /// owner leaves a cold path; `BUSY` says it is inside one. The exit hook
    /// snapshots another thread's buffer between two reads of `SEQ` and
    /// `BUSY` (x86 keeps stores, and loads, in order).
    pub const SEQ: i32 = 120;
    /// Address of the next record of the current *grant* — appends the
    /// cold path allows the hot paths (the inline stubs and the runtime's
    /// `record` entry) to make on their own: inside an open window, neither
    /// its last record nor the one that fills the buffer. An append claims
    /// its record with one `xadd` of [`RECORD_BYTES`](crate::protocol::RECORD_BYTES) (a signal
    /// handler cannot split it) and owns it if the old value was below
    /// [`LIMIT`]; it writes the address, then the load id. At least
    /// the runtime's `CLAIM_REVOKED` value once the cold path has taken the grant
    /// back; 0 in a fresh or fork-wiped slot (`LIMIT` is 0 there too, so
    /// nothing can be claimed).
    pub const CLAIM: i32 = 96;
    /// One past the last record of the current grant (see [`CLAIM`]).
    /// Records in `[COUNT, LIMIT)` are filled with
    /// [`memgaze_trace::protocol::UNWRITTEN_MARKER`] when granted, so a
    /// claimed record that was never written (its writer was interrupted
    /// for good) is recognised.
    pub const LIMIT: i32 = 104;
    /// End of the claimed records of a grant taken back but not yet
    /// committed into `COUNT` (a claim was still being written); 0 when
    /// none.
    pub const CLAIMED: i32 = 144;
    /// The message: header, then records.
    pub const MESSAGE: i32 = 152;
    /// First record.
    pub const RECORDS: i32 = MESSAGE + crate::protocol::HEADER_BYTES as i32;
    /// Bytes mapped per slot.
    pub const BYTES: i32 = 64 * 1024;
    /// Records a buffer holds.
    pub const CAPACITY: i32 = (BYTES - RECORDS) / crate::protocol::RECORD_BYTES as i32;
    /// Value of `MAGIC` in an initialised slot (fits an `imm32`).
    pub const MAGIC_VALUE: i32 = 0x4d47_5a53;
}
