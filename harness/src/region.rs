//! The measured-region markers.
//!
//! `cargo memgaze` finds these two functions in a bench executable by symbol
//! name and turns recording on when `memgaze_region_begin` is called and off
//! when `memgaze_region_end` is called, so only the loads of a bench body —
//! not its setup, not the harness — reach the trace (ARCHITECTURE.md,
//! "Contracts between stages").
//!
//! What keeps them intact through the optimiser:
//! - `#[unsafe(no_mangle)]` + `extern "C"`: a stable, unmangled symbol that
//!   rustc treats as exported, so (fat) LTO keeps it external and does not
//!   drop or rewrite its arguments;
//! - `#[inline(never)]`: every call stays a real `call` to that symbol;
//! - bodies that differ and have side effects (stores to globals; no loads):
//!   LLVM's function merging cannot fold `end` into `begin`, and no pass can
//!   delete the calls. Plain stores also mean the markers themselves add no
//!   loads to a trace.
//! - [`Region`] puts compiler fences between the marker calls and the body,
//!   so no load of the body is moved out of the region (or setup into it).

use std::ptr;
use std::sync::atomic::{AtomicPtr, AtomicUsize, Ordering, compiler_fence};

/// Name (pointer, length) of the region last begun, for debuggers and the
/// side effect that keeps [`memgaze_region_begin`] alive.
static BEGUN_NAME: AtomicPtr<u8> = AtomicPtr::new(ptr::null_mut());
static BEGUN_LEN: AtomicUsize = AtomicUsize::new(0);
/// Name of the region last ended; `BEGUN_NAME` is cleared at the same time.
static ENDED_NAME: AtomicPtr<u8> = AtomicPtr::new(ptr::null_mut());
static ENDED_LEN: AtomicUsize = AtomicUsize::new(0);

/// Marks the start of a bench's measured region; `name_ptr`/`name_len` are the
/// UTF-8 bytes of the bench name (not NUL-terminated).
///
/// Called by the harness right before a bench body; benches do not call it.
/// The rewriter of `cargo memgaze` recognises this symbol and switches
/// recording on here.
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn memgaze_region_begin(name_ptr: *const u8, name_len: usize) {
    BEGUN_NAME.store(name_ptr.cast_mut(), Ordering::Relaxed);
    BEGUN_LEN.store(name_len, Ordering::Relaxed);
    #[cfg(test)]
    crate::tests_support::marker_event(true, name_ptr, name_len);
}

/// Marks the end of a bench's measured region, with the same name as the
/// matching [`memgaze_region_begin`].
///
/// Called by the harness right after a bench body (also when it panics); the
/// rewriter switches recording off here.
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn memgaze_region_end(name_ptr: *const u8, name_len: usize) {
    ENDED_NAME.store(name_ptr.cast_mut(), Ordering::Relaxed);
    ENDED_LEN.store(name_len, Ordering::Relaxed);
    BEGUN_NAME.store(ptr::null_mut(), Ordering::Relaxed);
    #[cfg(test)]
    crate::tests_support::marker_event(false, name_ptr, name_len);
}

/// An open measured region: begun on creation, ended on drop (so a panicking
/// body still closes its region before the harness reports the failure).
pub(crate) struct Region<'a> {
    name: &'a str,
}

impl<'a> Region<'a> {
    /// Calls [`memgaze_region_begin`] for `name`.
    pub(crate) fn begin(name: &'a str) -> Self {
        memgaze_region_begin(name.as_ptr(), name.len());
        compiler_fence(Ordering::SeqCst);
        Region { name }
    }
}

impl Drop for Region<'_> {
    fn drop(&mut self) {
        compiler_fence(Ordering::SeqCst);
        memgaze_region_end(self.name.as_ptr(), self.name.len());
    }
}
