//! Memory layouts the instrumentation runtime shares with the recorder.
//!
//! The runtime generator (memgaze-instrument) emits code that addresses these
//! offsets; the recorder (memgaze-record) sizes its buffers from them. They
//! live here, below both, so neither depends on the other's internals.

/// Layout of a thread slot (anonymous mapping, wiped on fork): the
/// [`slot::Slot`] block, whose field offsets are the constants the code
/// generator addresses.
pub mod slot {
    use crate::protocol::{HEADER_BYTES, RECORD_BYTES};
    use core::mem::offset_of;

    /// The fixed part of a thread slot, in the order the runtime lays it
    /// out; every counter is a `u64` the runtime accesses as a qword. The
    /// records follow it up to [`BYTES`]. Only the generated machine code
    /// reads and writes it; this struct exists to derive the offsets, so no
    /// two fields can overlap.
    #[repr(C)]
    pub struct Slot {
        /// [`MAGIC_VALUE`] once initialised.
        pub magic: u64,
        /// xorshift64* state.
        pub rng: u64,
        /// Next slot in the process list.
        pub next: u64,
        /// Thread control block of the owner.
        pub tcb: u64,
        /// Kernel thread id of the owner.
        pub tid: u64,
        /// Creation index within the process.
        pub serial: u64,
        /// Executions counted so far.
        pub executions: u64,
        /// The countdown value last given to the thread and not yet folded in.
        pub budget: u64,
        /// Records left in the open window (0: no window open).
        pub(crate) remaining: u64,
        /// Records lost so far.
        pub dropped: u64,
        /// Set while the owning thread is inside the runtime (a signal handler
        /// re-entering it sees it); only the owner writes it.
        pub busy: u64,
        /// Records in the buffer.
        pub count: u64,
        /// Address of the next record of the current *grant* — appends the
        /// cold path allows the hot paths (the inline stubs and the runtime's
        /// `record` entry) to make on their own: inside an open window, neither
        /// its last record nor the one that fills the buffer. An append claims
        /// its record with one `xadd` of [`RECORD_BYTES`] (a signal
        /// handler cannot split it) and owns it if the old value was below
        /// [`LIMIT`]; it writes the address, then the load id. At least
        /// the runtime's `CLAIM_REVOKED` value once the cold path has taken the grant
        /// back; 0 in a fresh or fork-wiped slot (`LIMIT` is 0 there too, so
        /// nothing can be claimed).
        pub claim: u64,
        /// Address of the next record of the current *spatial grant*: the
        /// appends the cold path allows the inline stubs of spatial checks
        /// outside every window, claimed as [`CLAIM`] claims them (up to
        /// the same [`LIMIT`]). At most one of `CLAIM` and `SPATIAL_CLAIM`
        /// is below the runtime's `CLAIM_REVOKED` value at a time; 0 in a
        /// fresh or fork-wiped slot.
        pub spatial_claim: u64,
        /// One past the last record of the current grant (see [`CLAIM`]).
        /// Records in `[COUNT, LIMIT)` are filled with
        /// [`crate::protocol::UNWRITTEN_MARKER`] when granted, so a
        /// claimed record that was never written (its writer was interrupted
        /// for good) is recognised.
        pub limit: u64,
        /// Set once the first random skip was issued since the last (re)start.
        pub started: u64,
        /// Seqlock generation, bumped (before `BUSY` is cleared) each time the
        /// owner leaves a cold path; `BUSY` says it is inside one. The exit hook
        /// snapshots another thread's buffer between two reads of `SEQ` and
        /// `BUSY` (x86 keeps stores, and loads, in order).
        pub seq: u64,
        /// Windows opened so far.
        pub windows: u64,
        /// Executions that found the slot busy (signal handler re-entry), or
        /// found a record claimed by the code they interrupted still unwritten.
        pub nested: u64,
        /// End of the claimed records of a grant taken back but not yet
        /// committed into `COUNT` (a claim was still being written); 0 when
        /// none.
        pub claimed: u64,
        /// 1 while the last grant given (open, or taken back and its claims
        /// not yet committed into `COUNT`) was a spatial grant: its records
        /// count no execution and are no part of a window.
        pub spatial_grant: u64,
        /// Loads the owner will run before it notices that a region began:
        /// its re-check countdown, as the thread that began the region read
        /// it (0: none pending). The owner's cold path counts them as
        /// dropped when it notices; the region's end counts the part it ran
        /// meanwhile (see the runtime's `unaware_at_begin`).
        pub(crate) unaware: u64,
        /// While the owner is inside a hooked `fork` called during a skip:
        /// the countdown it had left, restored once `fork` returns (its
        /// loads meanwhile reach the cold path one by one, so the child,
        /// whose slot `fork` wipes, counts from its first load); 0 otherwise
        /// (see the runtime's `before_fork`).
        pub(crate) forking: u64,
        /// Address of the owning runtime's cold path (`rax`, `rcx`, `rbx`
        /// pushed, the flags in `ax`): where an instrumented shared
        /// library's `record` forwards what its hot path cannot do, so
        /// every object shares one runtime, one slot and one countdown.
        pub runtime: u64,
        /// The message header, sent together with the records after it.
        pub message: [u8; HEADER_BYTES],
        /// The records: as many as fit in [`BYTES`] ([`CAPACITY`]).
        pub records: [[u8; RECORD_BYTES]; 0],
    }

    /// Offset of [`Slot::magic`].
    pub const MAGIC: i32 = offset_of!(Slot, magic) as i32;
    /// Offset of [`Slot::busy`].
    pub const BUSY: i32 = offset_of!(Slot, busy) as i32;
    /// Offset of [`Slot::next`].
    pub const NEXT: i32 = offset_of!(Slot, next) as i32;
    /// Offset of [`Slot::tcb`].
    pub const TCB: i32 = offset_of!(Slot, tcb) as i32;
    /// Offset of [`Slot::tid`].
    pub const TID: i32 = offset_of!(Slot, tid) as i32;
    /// Offset of [`Slot::serial`].
    pub const SERIAL: i32 = offset_of!(Slot, serial) as i32;
    /// Offset of [`Slot::executions`].
    pub const EXECUTIONS: i32 = offset_of!(Slot, executions) as i32;
    /// Offset of [`Slot::budget`].
    pub const BUDGET: i32 = offset_of!(Slot, budget) as i32;
    /// Offset of `Slot::remaining`.
    pub const REMAINING: i32 = offset_of!(Slot, remaining) as i32;
    /// Offset of [`Slot::dropped`].
    pub const DROPPED: i32 = offset_of!(Slot, dropped) as i32;
    /// Offset of [`Slot::rng`].
    pub const RNG: i32 = offset_of!(Slot, rng) as i32;
    /// Offset of [`Slot::count`].
    pub const COUNT: i32 = offset_of!(Slot, count) as i32;
    /// Offset of [`Slot::windows`].
    pub const WINDOWS: i32 = offset_of!(Slot, windows) as i32;
    /// Offset of [`Slot::nested`].
    pub const NESTED: i32 = offset_of!(Slot, nested) as i32;
    /// Offset of [`Slot::started`].
    pub const STARTED: i32 = offset_of!(Slot, started) as i32;
    /// Offset of [`Slot::seq`].
    pub const SEQ: i32 = offset_of!(Slot, seq) as i32;
    /// Offset of [`Slot::claim`].
    pub const CLAIM: i32 = offset_of!(Slot, claim) as i32;
    /// Offset of [`Slot::spatial_claim`].
    pub const SPATIAL_CLAIM: i32 = offset_of!(Slot, spatial_claim) as i32;
    /// Offset of [`Slot::spatial_grant`].
    pub const SPATIAL_GRANT: i32 = offset_of!(Slot, spatial_grant) as i32;
    /// Offset of [`Slot::limit`].
    pub const LIMIT: i32 = offset_of!(Slot, limit) as i32;
    /// Offset of [`Slot::claimed`].
    pub const CLAIMED: i32 = offset_of!(Slot, claimed) as i32;
    /// Offset of `Slot::unaware`.
    pub const UNAWARE: i32 = offset_of!(Slot, unaware) as i32;
    /// Offset of `Slot::forking`.
    pub const FORKING: i32 = offset_of!(Slot, forking) as i32;
    /// Offset of [`Slot::runtime`].
    pub const RUNTIME: i32 = offset_of!(Slot, runtime) as i32;
    /// Offset of [`Slot::message`]: header, then records.
    pub const MESSAGE: i32 = offset_of!(Slot, message) as i32;
    /// Offset of [`Slot::records`], the first record.
    pub const RECORDS: i32 = offset_of!(Slot, records) as i32;
    /// Bytes mapped per slot.
    pub const BYTES: i32 = 64 * 1024;
    /// Records a buffer holds.
    pub const CAPACITY: i32 = (BYTES - RECORDS) / RECORD_BYTES as i32;
    /// Value of `MAGIC` in an initialised slot (fits an `imm32`).
    pub const MAGIC_VALUE: i32 = 0x4d47_5a53;

    // The records follow the header directly (the message is sent as one
    // buffer), and the header and records fit the mapping.
    const _: () = assert!(RECORDS == MESSAGE + HEADER_BYTES as i32);
    const _: () = assert!(RECORDS + CAPACITY * RECORD_BYTES as i32 <= BYTES);
}
