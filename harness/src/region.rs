//! The measured-region markers.
//!
//! `cargo memgaze` finds these two functions in a bench executable by symbol
//! name and turns recording on when `memgaze_region_begin` is called and off
//! when `memgaze_region_end` is called, so only the loads of a bench body —
//! not its setup, not the harness — reach the trace (ARCHITECTURE.md,
//! "Contracts between stages").
//!
//! What keeps them intact through the optimiser:
//! - `#[unsafe(no_mangle)]` + `extern "C"`: a stable, unmangled symbol with
//!   the arguments in `rdi` (name pointer) and `rsi` (name length);
//! - `#[inline(never)]`: every call stays a real `call` to that symbol;
//! - the body is an `asm!` block — opaque, with side effects — so no pass can
//!   delete the calls or the function (the linker keeps the symbol because it
//!   is called), and each block names its function in a comment, so LLVM's
//!   function merging cannot fold `end` into `begin` (identical bodies would
//!   otherwise be merged onto one address).
//! - The block is five one-byte `nop`s, so on x86-64 each marker is
//!   `nop ×5; ret` (6 bytes): room for the rewriter's 5-byte `jmp rel32`
//!   entry patch, and no memory operand that could be mistaken for a load.
//! - [`Region`] puts compiler fences between the marker calls and the body,
//!   so no load of the body is moved out of the region (or setup into it).

use std::sync::atomic::{Ordering, compiler_fence};

/// The marker body: see the module documentation.
macro_rules! marker_body {
    ($name:literal, $ptr:expr, $len:expr) => {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: the block only executes `nop`s: it reads and writes no
        // memory or register and leaves the stack and flags alone.
        unsafe {
            std::arch::asm!(
                concat!("/* ", $name, " */"),
                "nop", "nop", "nop", "nop", "nop",
                in("rdi") $ptr,
                in("rsi") $len,
                options(nostack, preserves_flags),
            )
        }
        #[cfg(not(target_arch = "x86_64"))]
        std::hint::black_box(($name, $ptr, $len));
    };
}

/// Marks the start of a bench's measured region; `name_ptr`/`name_len` are the
/// UTF-8 bytes of the bench name (not NUL-terminated).
///
/// Called by the harness right before a bench body; benches do not call it.
/// The rewriter of `cargo memgaze` recognises this symbol and switches
/// recording on here.
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn memgaze_region_begin(name_ptr: *const u8, name_len: usize) {
    marker_body!("memgaze_region_begin", name_ptr, name_len);
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
    marker_body!("memgaze_region_end", name_ptr, name_len);
    #[cfg(test)]
    crate::tests_support::marker_event(false, name_ptr, name_len);
}

/// The time samples a `cargo memgaze` recorder has taken so far in this
/// process, or `unknown` (returned unchanged) where no recorder runs: the
/// rewriter hooks this symbol's entry to set the argument's register.
///
/// [`Bencher::iter`](crate::Bencher::iter) calls it between runs of the
/// routine to stop at the sample target; it reads no memory, so the
/// region's trace gains no load. The body is the markers' five `nop`s
/// (room for the entry patch) and keeps `rdi` as both argument and result;
/// it is opaque to the optimiser, so no call is merged or hoisted.
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn memgaze_region_samples(unknown: u64) -> u64 {
    #[cfg(test)]
    return crate::tests_support::samples(unknown);
    #[cfg(all(not(test), target_arch = "x86_64"))]
    {
        let samples: u64;
        // SAFETY: the block only executes `nop`s: it reads and writes no
        // memory and leaves the stack and flags alone (`rdi` stays as is).
        unsafe {
            std::arch::asm!(
                "/* memgaze_region_samples */",
                "nop", "nop", "nop", "nop", "nop",
                inout("rdi") unknown => samples,
                options(nostack, preserves_flags),
            );
        }
        samples
    }
    #[cfg(all(not(test), not(target_arch = "x86_64")))]
    unknown
}

/// An open measured region: begun on creation, ended on drop (so a panicking
/// body still closes its region before the harness reports the failure).
pub(crate) struct Region<'a> {
    name: &'a str,
}

impl<'a> Region<'a> {
    /// Calls [`memgaze_region_begin`] for `name`. Inlined (with `drop`) into
    /// [`Bencher::iter`](crate::Bencher::iter) so the name stays in
    /// registers: no harness load runs inside the region.
    #[inline(always)]
    pub(crate) fn begin(name: &'a str) -> Self {
        memgaze_region_begin(name.as_ptr(), name.len());
        compiler_fence(Ordering::SeqCst);
        Region { name }
    }
}

impl Drop for Region<'_> {
    #[inline(always)]
    fn drop(&mut self) {
        compiler_fence(Ordering::SeqCst);
        memgaze_region_end(self.name.as_ptr(), self.name.len());
    }
}
