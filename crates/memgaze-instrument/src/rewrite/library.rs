//! The runtime of an instrumented shared library: a hot path and a
//! forwarder, not a second recorder.
//!
//! Every object of a process shares the thread's countdown (`fs:0x38`) and
//! slot (`fs:0x40`), so a library's probes and inline stubs work unchanged:
//! they count against the same countdown and claim records from the same
//! grant as the executable's. Only the library's `record` differs. Its hot
//! path is the executable's; what that cannot do (a window starts or ends,
//! the buffer is full, the thread has no slot yet) goes to the executable
//! runtime's cold path, whose address every slot holds
//! ([`slot::RUNTIME`]). The library keeps that address in its own state
//! word once it has seen it, so a thread whose first instrumented load is
//! in the library (every thread: `start_thread` is in libc) reaches the
//! runtime that creates its slot.
//!
//! A thread without a slot whose forward finds no runtime (code that the
//! dynamic loader runs before the executable's entry, a new thread in
//! `start_thread` before any thread appended or forwarded here) is sent
//! back with a zero countdown: its library loads until its first
//! executable load are not counted, and that load reaches the runtime,
//! which creates the slot. After `SLOTLESS_ASKS` (2^20) such forwards in a
//! process (one whose executable is not instrumented, a program the
//! recorded one `exec`s with the same environment, never gets a slot) it
//! gets a re-check countdown (`COUNTDOWN_RECHECK`) instead, and runs at
//! nearly full speed, uncounted.
//!
//! Spatial checks in library code read the library's own config words,
//! which stay zero (no spatial sample): only the executable's entry hook
//! parses the recorder's environment.
//!
//! Record ids carry the object in their high bits (`object << 24 | load`,
//! [`OBJECT_SHIFT`]), so the collector can tell whose annotation a record
//! refers to.

use super::runtime::{self, Runtime, lea_rip, record_hot_path_then, slot};
use iced_x86::code_asm::*;
use iced_x86::{BlockEncoderOptions, Register};

/// A record id is `object << OBJECT_SHIFT | load` (object 0: the
/// executable).
pub const OBJECT_SHIFT: u32 = 24;
/// The largest object number: ids stay below
/// [`memgaze_trace::protocol::SPATIAL_FLAG`].
pub const MAX_OBJECT: u32 = (1 << (31 - OBJECT_SHIFT)) - 1;
/// Loads an object may have.
pub const MAX_LOADS: usize = 1 << OBJECT_SHIFT;

/// Offset in the library's state of the word caching the executable
/// runtime's cold path (past the config block, which stays zero).
const RUNTIME_WORD: u64 = runtime::STATE_BYTES - 8;
/// Offset of the word counting forwards of slotless threads that found no
/// runtime (see [`SLOTLESS_ASKS`]).
const SLOTLESS_WORD: u64 = RUNTIME_WORD - 8;
const _: () = assert!(std::mem::size_of::<runtime::Config>() as u64 <= SLOTLESS_WORD);
/// Forwards of slotless threads that find no runtime after which they get a
/// re-check countdown instead of asking at their next load: bounds the cost
/// in a process whose executable is not instrumented (about 30 cycles each).
const SLOTLESS_ASKS: u32 = 1 << 20;

/// Generates a library's runtime at `code_va`, its state at `state_va`.
/// Only `code`, `record`, `record_tracked`, `probe_append`,
/// `probe_append_tracked` and `spatial` are meaningful.
pub fn generate(code_va: u64, state_va: u64) -> Result<Runtime, IcedError> {
    let mut a = CodeAssembler::new(64)?;
    let mut record = a.create_label();
    let mut probe_append = a.create_label();
    let mut spatial = a.create_label();
    let mut forward = a.create_label();
    let mut go = a.create_label();
    let mut none = a.create_label();
    let mut recheck = a.create_label();
    let mut leave = a.create_label();
    let mut known = a.create_label();
    a.set_label(&mut record)?;
    // Learn the runtime from any thread's slot at its first append here,
    // not only at a forward: a full trace's grant may never end in this
    // library, and threads started later need the address (see above).
    record_hot_path_then(&mut a, forward, |a| {
        a.add_instruction(lea_rip(Register::RCX, state_va + RUNTIME_WORD))?;
        a.cmp(qword_ptr(rcx), 0)?;
        a.jne(known)?;
        a.mov(rcx, qword_ptr(rbx + slot::RUNTIME))?;
        a.add_instruction(lea_rip(Register::RBX, state_va + RUNTIME_WORD))?;
        a.mov(qword_ptr(rbx), rcx)?;
        a.set_label(&mut known)
    })?;
    // rax, rcx, rbx pushed, the flags in ax: rcx and rbx are free.
    a.set_label(&mut forward)?;
    a.add_instruction(lea_rip(Register::RBX, state_va + RUNTIME_WORD))?;
    a.mov(rcx, qword_ptr(rbx))?;
    a.test(rcx, rcx)?;
    a.jnz(go)?;
    a.mov(rbx, qword_ptr(0x40u64).fs())?;
    a.test(rbx, rbx)?;
    a.jz(none)?;
    a.cmp(qword_ptr(rbx + slot::MAGIC), slot::MAGIC_VALUE)?;
    a.jne(none)?;
    a.mov(rcx, qword_ptr(rbx + slot::RUNTIME))?;
    a.test(rcx, rcx)?;
    a.jz(none)?;
    a.add_instruction(lea_rip(Register::RBX, state_va + RUNTIME_WORD))?;
    a.mov(qword_ptr(rbx), rcx)?;
    a.set_label(&mut go)?;
    a.jmp(rcx)?;
    // No runtime known. A thread without a slot asks again at its next
    // load, so that its first executable load reaches the runtime that
    // creates its slot: a re-check countdown would hide that load and the
    // next thousands uncounted. A process with no runtime to find (an
    // uninstrumented executable) stops asking so often after a while.
    a.set_label(&mut none)?;
    a.mov(rbx, qword_ptr(0x40u64).fs())?;
    a.test(rbx, rbx)?;
    a.jnz(recheck)?;
    a.add_instruction(lea_rip(Register::RBX, state_va + SLOTLESS_WORD))?;
    a.cmp(qword_ptr(rbx), SLOTLESS_ASKS as i32)?;
    a.jae(recheck)?;
    a.inc(qword_ptr(rbx))?;
    a.mov(qword_ptr(0x38u64).fs(), 0)?;
    a.jmp(leave)?;
    a.set_label(&mut recheck)?;
    a.mov(qword_ptr(0x38u64).fs(), runtime::COUNTDOWN_RECHECK as i32)?;
    a.set_label(&mut leave)?;
    a.add(al, 0x7f)?;
    a.sahf()?;
    a.pop(rbx)?;
    a.pop(rcx)?;
    a.pop(rax)?;
    a.ret()?;
    // Never called: the library's spatial threshold stays zero.
    a.set_label(&mut spatial)?;
    a.ret()?;
    // One append for both kinds of load: `record_tracked` is `record`.
    runtime::emit_probe_append(&mut a, &mut probe_append, record)?;
    let result =
        a.assemble_options(code_va, BlockEncoderOptions::RETURN_NEW_INSTRUCTION_OFFSETS)?;
    let record = result.label_ip(&record)?;
    Ok(Runtime {
        record,
        record_tracked: record,
        probe_append: result.label_ip(&probe_append)?,
        probe_append_tracked: result.label_ip(&probe_append)?,
        spatial: result.label_ip(&spatial)?,
        // None: the stubs call `spatial`, which is never reached either.
        spatial_append: 0,
        entry: 0,
        fini: 0,
        exit_now: 0,
        exec_flush: 0,
        before_fork: 0,
        after_fork: 0,
        before_spawn: 0,
        after_spawn: 0,
        region_begin: 0,
        region_end: 0,
        region_begin_unnamed: 0,
        region_end_unnamed: 0,
        region_toggle: 0,
        region_samples: 0,
        code: result.inner.code_buffer,
        cpu_features: 0,
    })
}
