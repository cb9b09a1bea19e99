//! The MemGaze microbenchmark kernels (MemGaze paper §VI), as
//! `cargo memgaze` benches.
//!
//! Each kernel sweeps arrays of [`FULL`]`.elements` (500 K) elements
//! [`FULL`]`.reps` (100) times with one access pattern: strided (`str1`,
//! `str8`), irregular through an index array (`irr`, `irr-rand`,
//! `irr-half`), both composed conditionally (`str/irr`) or in series
//! (`irr|str|irr`), and pointer chasing (`chase`). Every kernel's doc comment
//! (in [`kernels`]) states its access sequence, footprint `F` (distinct byte
//! addresses), `F_lines` (distinct 64-byte lines), growth `ΔF` and the load
//! classes the instrumentor should find, and what its inner loop compiles
//! to.
//!
//! How the kernels keep their loads honest:
//! - every access to benchmark data goes through [`Memory`]; the production
//!   implementation, [`Machine`], is a volatile read, so each access is one
//!   scalar load that the compiler can neither vectorise, merge nor drop;
//! - all data comes from a fixed-seed generator ([`SplitMix64`]), so runs are
//!   reproducible;
//! - inputs are built by [`Kernel::prepare`], outside the measured region;
//!   only [`Kernel::run`] is measured;
//! - arrays start on a 64-byte line ([`Aligned`]), so line counts are exact.
//!
//! Sizes come from [`Params`]: [`FULL`] under `--bench`, [`SMOKE`] under
//! `cargo test`, and either can be overridden with the environment variables
//! [`ELEMENTS_ENV`] (`MEMGAZE_MICRO_ELEMENTS`) and [`REPS_ENV`]
//! (`MEMGAZE_MICRO_REPS`) — the golden/Lackey cross-check runs them small.

pub mod kernels;

use std::ptr;

pub use kernels::{
    Chase, Irr, IrrHalf, IrrRand, IrrStrIrr, KERNEL_NAMES, Node, Str1, Str8, StrIrr, chase, irr,
    irr_half, irr_rand, irr_str_irr, str_irr, str1, str8,
};

/// Environment variable overriding the number of elements per array.
pub const ELEMENTS_ENV: &str = "MEMGAZE_MICRO_ELEMENTS";
/// Environment variable overriding the number of repetitions.
pub const REPS_ENV: &str = "MEMGAZE_MICRO_REPS";

/// The sizes of MemGaze's microbenchmarks: 500 K elements, 100 repetitions.
pub const FULL: Params = Params {
    elements: 500_000,
    reps: 100,
};
/// The sizes of a smoke run (`cargo test --benches`).
pub const SMOKE: Params = Params {
    elements: 4_096,
    reps: 2,
};

/// Smallest accepted element count (`irr-half` needs a non-trivial half).
pub const MIN_ELEMENTS: usize = 16;
/// Largest accepted element count: `str8` allocates 8 × this many 8-byte
/// elements (4 GiB at the limit), and indices are `u32`.
pub const MAX_ELEMENTS: usize = 1 << 26;
/// Largest accepted repetition count.
pub const MAX_REPS: usize = 1_000_000;

/// The seed of every generator in this crate ("memgaze" in ASCII).
pub const SEED: u64 = 0x006d_656d_6761_7a65;

/// Size parameters of a kernel run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Params {
    /// Elements per array (`N`).
    pub elements: usize,
    /// Sweeps over the arrays.
    pub reps: usize,
}

impl Params {
    /// `default`, with [`ELEMENTS_ENV`] and [`REPS_ENV`] applied when set.
    pub fn from_env(default: Params) -> Result<Params, String> {
        let elements = std::env::var(ELEMENTS_ENV).ok();
        let reps = std::env::var(REPS_ENV).ok();
        Self::with_overrides(default, elements.as_deref(), reps.as_deref())
    }

    /// `default` with the given textual overrides, validated.
    pub fn with_overrides(
        default: Params,
        elements: Option<&str>,
        reps: Option<&str>,
    ) -> Result<Params, String> {
        fn parse(
            var: &str,
            text: Option<&str>,
            default: usize,
            range: std::ops::RangeInclusive<usize>,
        ) -> Result<usize, String> {
            let Some(text) = text else {
                return Ok(default);
            };
            match text.trim().replace('_', "").parse::<usize>() {
                Ok(n) if range.contains(&n) => Ok(n),
                _ => Err(format!(
                    "{var}={text:?}: expected a whole number from {} to {}",
                    range.start(),
                    range.end()
                )),
            }
        }
        Ok(Params {
            elements: parse(
                ELEMENTS_ENV,
                elements,
                default.elements,
                MIN_ELEMENTS..=MAX_ELEMENTS,
            )?,
            reps: parse(REPS_ENV, reps, default.reps, 1..=MAX_REPS)?,
        })
    }
}

/// How a kernel reads its data: one call per access, tagged with the load
/// class the kernel intends (the instrumentor decides the real class from the
/// machine code; the tests check the intended classes' metrics in a model).
pub trait Memory {
    /// A load whose address advances by a constant stride with the loop.
    fn strided<T: Copy>(&mut self, place: &T) -> T;
    /// A load whose address depends on loaded data.
    fn irregular<T: Copy>(&mut self, place: &T) -> T;
}

/// The real thing: one volatile scalar load per access.
#[derive(Clone, Copy, Debug, Default)]
pub struct Machine;

impl Memory for Machine {
    #[inline(always)]
    fn strided<T: Copy>(&mut self, place: &T) -> T {
        // SAFETY: a reference is valid, aligned and initialised for reads.
        unsafe { ptr::read_volatile(place) }
    }

    #[inline(always)]
    fn irregular<T: Copy>(&mut self, place: &T) -> T {
        // SAFETY: as above.
        unsafe { ptr::read_volatile(place) }
    }
}

/// One microbenchmark: inputs built outside the measured region, and a run
/// over them that is measured.
pub trait Kernel: Sized + Send + Sync {
    /// The bench name users filter on (e.g. `irr|str|irr`).
    const NAME: &'static str;
    /// Allocates and fills the inputs (setup: not measured).
    fn prepare(params: Params) -> Self;
    /// All repetitions through `memory`, returning a checksum of the values
    /// read.
    fn run_with<M: Memory>(&self, memory: &mut M) -> u64;
    /// All repetitions with real loads (what the bench measures). Each kernel
    /// overrides this with a call to its own never-inlined function, so its
    /// loads carry that function's name in the binary.
    fn run(&self) -> u64 {
        self.run_with(&mut Machine)
    }
}

/// SplitMix64 (Steele, Lea, Flood 2014): a tiny, fast, well-mixed generator;
/// all this crate needs is reproducible shuffles and values.
#[derive(Clone, Debug)]
pub struct SplitMix64 {
    state: u64,
}

impl SplitMix64 {
    /// A generator starting from `seed`.
    pub fn new(seed: u64) -> Self {
        SplitMix64 { state: seed }
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A value in `0..bound` (multiply-shift; the bias is below 2^-32 for the
    /// bounds used here).
    pub fn below(&mut self, bound: usize) -> usize {
        ((u128::from(self.next_u64()) * bound as u128) >> 64) as usize
    }

    /// Fisher–Yates shuffle.
    pub fn shuffle<T>(&mut self, items: &mut [T]) {
        for i in (1..items.len()).rev() {
            let j = self.below(i + 1);
            items.swap(i, j);
        }
    }

    /// A random permutation of `0..n` as `u32`s.
    pub fn permutation(&mut self, n: usize) -> Vec<u32> {
        let mut p: Vec<u32> = (0..n).map(|i| i as u32).collect();
        self.shuffle(&mut p);
        p
    }
}

/// Element types that [`Aligned`] may hold: plain data, valid for every
/// bit pattern (including all zeros), without padding, and of a size that
/// divides 64.
///
/// # Safety
/// Implement only for types that satisfy all of the above.
pub unsafe trait Plain: Copy + Send + Sync + 'static {}
// SAFETY: integers are valid for every bit pattern and have no padding.
unsafe impl Plain for u32 {}
// SAFETY: as above.
unsafe impl Plain for u64 {}

/// A 64-byte line: the allocation unit of [`Aligned`].
#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct Line([u8; 64]);

/// A fixed-length array that starts on a 64-byte boundary, so the 64-byte
/// lines a kernel touches can be counted exactly.
pub struct Aligned<T: Plain> {
    lines: Vec<Line>,
    len: usize,
    _element: std::marker::PhantomData<T>,
}

impl<T: Plain> Aligned<T> {
    /// `len` elements made by `element(i)`.
    pub fn from_fn(len: usize, mut element: impl FnMut(usize) -> T) -> Self {
        const { assert!(64 % size_of::<T>() == 0 && align_of::<T>() <= 64) };
        let bytes = len * size_of::<T>();
        let mut array = Aligned {
            lines: vec![Line([0; 64]); bytes.div_ceil(64)],
            len,
            _element: std::marker::PhantomData,
        };
        for (i, slot) in array.as_mut_slice().iter_mut().enumerate() {
            *slot = element(i);
        }
        array
    }

    /// The elements.
    pub fn as_slice(&self) -> &[T] {
        // SAFETY: the lines hold at least `len * size_of::<T>()` initialised
        // bytes, aligned to 64 >= align_of::<T>(), and `T: Plain` is valid
        // for any bytes.
        unsafe { std::slice::from_raw_parts(self.lines.as_ptr().cast::<T>(), self.len) }
    }

    /// The elements, mutably.
    pub fn as_mut_slice(&mut self) -> &mut [T] {
        // SAFETY: as in `as_slice`, with exclusive access through `&mut self`.
        unsafe { std::slice::from_raw_parts_mut(self.lines.as_mut_ptr().cast::<T>(), self.len) }
    }
}

impl<T: Plain> std::ops::Deref for Aligned<T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        self.as_slice()
    }
}

impl<T: Plain + std::fmt::Debug> std::fmt::Debug for Aligned<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Aligned")
            .field("len", &self.len)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod model_tests;
