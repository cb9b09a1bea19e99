//! The eight kernels.
//!
//! Notation: `N` = [`Params::elements`], `R` = [`Params::reps`]; full size is
//! `N` = 500 000, `R` = 100. `F` counts distinct byte addresses, `F_lines`
//! distinct 64-byte lines (docs/METRICS.md); "window" means a trace window
//! of `2^k` consecutive loads inside one sweep. Data values are `u64`
//! (8 bytes), indices `u32` (4 bytes); all arrays start on a 64-byte line.
//!
//! Why the index-driven kernels land at `F_irr% ≈ 0.5`: each iteration makes
//! one Strided load of an index and one Irregular load of the element it
//! names. Footprint counts distinct *addresses*, not bytes or lines, and
//! every index load within a sweep is a fresh address, as is every data load
//! (a permutation names each element once). So per window, and over the
//! whole run, the data loads contribute half the distinct addresses,
//! whatever the element sizes. (In lines the picture differs: sixteen `u32`
//! indices share a line, while each data load lands on a fresh line — which
//! is what `F_lines` shows.)

use crate::{Aligned, Kernel, Machine, Memory, Params, Plain, SEED, SplitMix64};

/// The bench names, in registration order.
pub const KERNEL_NAMES: [&str; 8] = [
    Str1::NAME,
    Str8::NAME,
    Irr::NAME,
    IrrRand::NAME,
    IrrHalf::NAME,
    StrIrr::NAME,
    IrrStrIrr::NAME,
    Chase::NAME,
];

/// A fresh generator per kernel (seeded by name), so adding or reordering
/// kernels never changes another kernel's data.
fn rng_for(name: &str) -> SplitMix64 {
    let salt = name.bytes().fold(0u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    });
    SplitMix64::new(SEED ^ salt)
}

fn random_values(n: usize, rng: &mut SplitMix64) -> Aligned<u64> {
    Aligned::from_fn(n, |_| rng.next_u64())
}

fn aligned_permutation(n: usize, rng: &mut SplitMix64) -> Aligned<u32> {
    let permutation = rng.permutation(n);
    Aligned::from_fn(n, |i| permutation[i])
}

/// `str1`: a unit-stride sweep.
///
/// - Access: `a[0], a[1], …, a[N-1]`, `R` times; one Strided load.
/// - Footprint: `F = N` addresses, `F_lines = N/8` (62 500 at full size);
///   `A = R·N` loads (50 M).
/// - Growth: `ΔF = 1` in every window of up to `N` loads (each load a new
///   address; a new line every 8 loads), `1/R` over the whole run.
/// - Compiled (x86-64, `bench` profile, rustc 1.95): unrolled ×8 —
///   `add rax, [r11]; add rax, [r11+8]; … add rax, [r11+0x38]; add r11, 0x40`
///   — after a one-load remainder loop `add rax, [r11]; add r11, 8`; scalar
///   loads only.
pub struct Str1 {
    a: Aligned<u64>,
    reps: usize,
}

impl Kernel for Str1 {
    const NAME: &'static str = "str1";

    fn prepare(params: Params) -> Self {
        let mut rng = rng_for(Self::NAME);
        Str1 {
            a: random_values(params.elements, &mut rng),
            reps: params.reps,
        }
    }

    #[inline(always)]
    fn run_with<M: Memory>(&self, m: &mut M) -> u64 {
        let mut sum = 0u64;
        for _ in 0..self.reps {
            for x in self.a.iter() {
                sum = sum.wrapping_add(m.strided(x));
            }
        }
        sum
    }

    fn run(&self) -> u64 {
        str1(self)
    }
}

/// Runs [`Str1`] with real loads (its own symbol in the binary).
#[inline(never)]
pub fn str1(kernel: &Str1) -> u64 {
    kernel.run_with(&mut Machine)
}

/// `str8`: a sweep with a stride of 8 elements (64 bytes, one line).
///
/// The array holds `8·N` elements so the sweep still makes `N` loads:
/// `str1` and `str8` do the same work and differ only in stride.
/// - Access: `a[0], a[8], …, a[8(N-1)]`, `R` times; one Strided load.
/// - Footprint: `F = N` addresses, `F_lines = N` (500 000 lines, 32 MB);
///   `A = R·N`.
/// - Growth: `ΔF = 1` per window; every load touches a new line, so a
///   window of `2^k` loads touches `2^k` lines — 8× `str1`'s `2^k/8`, at
///   every `k` (also at the largest, where a window spans several sweeps).
/// - Compiled: `add rax, [r11]; add r11, 0x40; cmp; ja` (the first element
///   of each sweep peeled off as `add rax, [rcx]`), sweeps unrolled ×2.
pub struct Str8 {
    a: Aligned<u64>,
    reps: usize,
}

impl Kernel for Str8 {
    const NAME: &'static str = "str8";

    fn prepare(params: Params) -> Self {
        let mut rng = rng_for(Self::NAME);
        Str8 {
            a: random_values(8 * params.elements, &mut rng),
            reps: params.reps,
        }
    }

    #[inline(always)]
    fn run_with<M: Memory>(&self, m: &mut M) -> u64 {
        let mut sum = 0u64;
        for _ in 0..self.reps {
            for x in self.a.iter().step_by(8) {
                sum = sum.wrapping_add(m.strided(x));
            }
        }
        sum
    }

    fn run(&self) -> u64 {
        str8(self)
    }
}

/// Runs [`Str8`] with real loads.
#[inline(never)]
pub fn str8(kernel: &Str8) -> u64 {
    kernel.run_with(&mut Machine)
}

/// `irr`: `a[idx[i]]` through a shuffled permutation `idx` of `0..N`.
///
/// - Access: per iteration `idx[i]` (Strided, `u32`) then `a[idx[i]]`
///   (Irregular, `u64`); the same permutation every sweep.
/// - Footprint: `F = 2N` (one million addresses), `F_irr% = 0.5` (see the
///   module doc); `F_lines = N/16 + N/8` (93 750); `A = 2·R·N` (100 M).
/// - Growth: `ΔF = 1` per window up to `2N` loads, `1/R` over the run.
/// - Compiled: `mov edi, [r9 + r11]` (index, `r11 += 4`), bounds check
///   `cmp rsi, rdi; jbe`, `add rax, [r8 + 8*rdi]` (data).
pub struct Irr {
    a: Aligned<u64>,
    idx: Aligned<u32>,
    reps: usize,
}

impl Kernel for Irr {
    const NAME: &'static str = "irr";

    fn prepare(params: Params) -> Self {
        let mut rng = rng_for(Self::NAME);
        Irr {
            a: random_values(params.elements, &mut rng),
            idx: aligned_permutation(params.elements, &mut rng),
            reps: params.reps,
        }
    }

    #[inline(always)]
    fn run_with<M: Memory>(&self, m: &mut M) -> u64 {
        gather(m, &self.a, &self.idx, self.reps)
    }

    fn run(&self) -> u64 {
        irr(self)
    }
}

/// `sum a[idx[i]]` over all `i`, `reps` times.
#[inline(always)]
fn gather<M: Memory>(m: &mut M, a: &[u64], idx: &[u32], reps: usize) -> u64 {
    let mut sum = 0u64;
    for _ in 0..reps {
        for slot in idx {
            let j = m.strided(slot) as usize;
            sum = sum.wrapping_add(m.irregular(&a[j]));
        }
    }
    sum
}

/// Runs [`Irr`] with real loads.
#[inline(never)]
pub fn irr(kernel: &Irr) -> u64 {
    kernel.run_with(&mut Machine)
}

/// `irr-rand`: `a[j]` at uniformly random positions, drawn with
/// replacement, fresh in every sweep.
///
/// `idx` holds `N` random 32-bit values; sweep `r` maps `idx[i] + s_r`
/// (`s_r = r · 0x9E3779B9`, wrapping) onto `0..N` by multiply-shift. Within a
/// sweep some elements are hit twice and ~37% not at all; because the
/// offset changes per sweep, every element is hit over the run.
/// - Access: `idx[i]` (Strided), `a[j]` (Irregular).
/// - Footprint: `F ≈ 2N` over the run (`N` index addresses, ~`N` data
///   addresses), `F_irr% ≈ 0.5`; in a window of `2^k` loads the data loads
///   repeat an address with probability ~`2^(k-1)/N`, so at full size
///   `F_irr%` is ≥ 0.48 up to `k = 17`, ~0.47 at 18, ~0.44 at 19 and ~0.39
///   at 20 (a window of `2^20` loads is about one sweep, which sees
///   `(1 - 1/e)·N` distinct data addresses); `F_lines ≈ N/16 + N/8`;
///   `A = 2·R·N`.
/// - Compiled: `mov edi, [r9 + rbx]; add edi, r11d (salt); imul rdi, rsi;
///   shr rdi, 32`, bounds check, `add rax, [r8 + 8*rdi]`.
pub struct IrrRand {
    a: Aligned<u64>,
    idx: Aligned<u32>,
    reps: usize,
}

impl Kernel for IrrRand {
    const NAME: &'static str = "irr-rand";

    fn prepare(params: Params) -> Self {
        let mut rng = rng_for(Self::NAME);
        IrrRand {
            a: random_values(params.elements, &mut rng),
            idx: Aligned::from_fn(params.elements, |_| rng.next_u64() as u32),
            reps: params.reps,
        }
    }

    #[inline(always)]
    fn run_with<M: Memory>(&self, m: &mut M) -> u64 {
        let (a, n) = (&self.a[..], self.a.len() as u64);
        let mut sum = 0u64;
        for r in 0..self.reps {
            let salt = (r as u32).wrapping_mul(0x9e37_79b9);
            for slot in self.idx.iter() {
                let x = m.strided(slot).wrapping_add(salt);
                let j = ((u64::from(x) * n) >> 32) as usize;
                sum = sum.wrapping_add(m.irregular(&a[j]));
            }
        }
        sum
    }

    fn run(&self) -> u64 {
        irr_rand(self)
    }
}

/// Runs [`IrrRand`] with real loads.
#[inline(never)]
pub fn irr_rand(kernel: &IrrRand) -> u64 {
    kernel.run_with(&mut Machine)
}

/// `irr-half`: irregular over half the range — `a` has `N` elements, and a
/// shuffled permutation of `0..N/2` visits each element of its first half
/// once per sweep.
///
/// - Access: `idx[i]` (Strided, `N/2` of them), `a[idx[i]]` (Irregular,
///   confined to `a[0..N/2]`).
/// - Footprint: `F = N` (`N/2` index + `N/2` data addresses), `F_irr% = 0.5`;
///   `F_lines = N/32 + N/16` (46 875); `A = R·N`. Against `irr`: the same
///   per-window metrics, half the footprint per sweep, so each data line
///   is reused after half as many other lines (reuse distance `D` halves).
/// - Compiled: as `irr` with the bound halved (`shr rsi`) — which also
///   keeps LLVM from merging `irr_half` and `irr` into one function.
pub struct IrrHalf {
    a: Aligned<u64>,
    idx: Aligned<u32>,
    reps: usize,
}

impl Kernel for IrrHalf {
    const NAME: &'static str = "irr-half";

    fn prepare(params: Params) -> Self {
        let mut rng = rng_for(Self::NAME);
        IrrHalf {
            a: random_values(params.elements, &mut rng),
            idx: aligned_permutation(params.elements / 2, &mut rng),
            reps: params.reps,
        }
    }

    #[inline(always)]
    fn run_with<M: Memory>(&self, m: &mut M) -> u64 {
        // Slicing to the half also gives the loop its own bounds check, so
        // the compiler cannot merge `irr_half` with the identical `irr`.
        gather(m, &self.a[..self.a.len() / 2], &self.idx, self.reps)
    }

    fn run(&self) -> u64 {
        irr_half(self)
    }
}

/// Runs [`IrrHalf`] with real loads.
#[inline(never)]
pub fn irr_half(kernel: &IrrHalf) -> u64 {
    kernel.run_with(&mut Machine)
}

/// `str/irr`: one loop whose branch alternates between a strided and an
/// irregular access (MemGaze's conditional composition).
///
/// For `i` in `0..N`: even `i` reads `a[i]` (Strided); odd `i` reads
/// `idx[i]` (Strided) and `b[idx[i]]` (Irregular), `idx` a shuffled
/// permutation of `0..N`.
/// - Footprint per sweep: `N/2` addresses of `a`, `N/2` of `idx`, `N/2` of
///   `b`: `F = 1.5·N`, `F_str% = 2/3`, `F_irr% = 1/3` (per window too);
///   `F_lines ≈ N/8 + N/16 + N/8`; `A = 1.5·R·N`.
/// - Growth: `ΔF = 1` per window.
/// - Compiled: `test bl, 1; je` then either `add rax, [r8 + 8*rbx]`
///   (strided branch) or `mov edi, [r10 + 4*rbx]`, bounds check,
///   `xor rax, [r9 + 8*rdi]` (irregular branch): three distinct load
///   instructions.
pub struct StrIrr {
    a: Aligned<u64>,
    b: Aligned<u64>,
    idx: Aligned<u32>,
    reps: usize,
}

impl Kernel for StrIrr {
    const NAME: &'static str = "str/irr";

    fn prepare(params: Params) -> Self {
        let mut rng = rng_for(Self::NAME);
        StrIrr {
            a: random_values(params.elements, &mut rng),
            b: random_values(params.elements, &mut rng),
            idx: aligned_permutation(params.elements, &mut rng),
            reps: params.reps,
        }
    }

    #[inline(always)]
    fn run_with<M: Memory>(&self, m: &mut M) -> u64 {
        let (a, b, idx) = (&self.a[..], &self.b[..], &self.idx[..]);
        let mut sum = 0u64;
        for _ in 0..self.reps {
            for (i, (x, slot)) in a.iter().zip(idx).enumerate() {
                // The branches combine their value differently on purpose:
                // with the same `sum += value` the compiler sinks both loads
                // into one instruction whose address is a phi of `&a[i]` and
                // `&b[j]`, and that one load could only be Irregular.
                if i & 1 == 0 {
                    sum = sum.wrapping_add(m.strided(x));
                } else {
                    let j = m.strided(slot) as usize;
                    sum ^= m.irregular(&b[j]);
                }
            }
        }
        sum
    }

    fn run(&self) -> u64 {
        str_irr(self)
    }
}

/// Runs [`StrIrr`] with real loads.
#[inline(never)]
pub fn str_irr(kernel: &StrIrr) -> u64 {
    kernel.run_with(&mut Machine)
}

/// `irr|str|irr`: three phases in series per sweep — an irregular gather,
/// a strided sweep, another irregular gather.
///
/// Phase 1 reads `idx[i]` (Strided) and `b[idx[i]]` (Irregular); phase 2
/// reads `a[i]` (Strided); phase 3 reads `idx[i]` and `c[idx[i]]`. All arrays
/// have `N` elements, `idx` is a shuffled permutation.
/// - Footprint: `F = 4N` (`idx`, `a`, `b`, `c`), `F_str% = F_irr% = 0.5` over
///   the run; windows inside phase 1 or 3 show 0.5 irregular, inside phase 2
///   none — the phases are visible in time; `F_lines = N/16 + 3N/8`;
///   `A = 5·R·N`.
/// - Growth: `ΔF = 1` per window inside a phase; phase 3 re-reads `idx`, so
///   windows spanning phases 1 and 3 grow slower.
/// - Compiled: three loops in one function — `mov edi, [r15 + r12]`,
///   `add rax, [rbx + 8*rdi]`; the ×8-unrolled `str1` loop over `a`;
///   `mov edi, [r15 + r12]`, `add rax, [r14 + 8*rdi]`.
pub struct IrrStrIrr {
    a: Aligned<u64>,
    b: Aligned<u64>,
    c: Aligned<u64>,
    idx: Aligned<u32>,
    reps: usize,
}

impl Kernel for IrrStrIrr {
    const NAME: &'static str = "irr|str|irr";

    fn prepare(params: Params) -> Self {
        let mut rng = rng_for(Self::NAME);
        IrrStrIrr {
            a: random_values(params.elements, &mut rng),
            b: random_values(params.elements, &mut rng),
            c: random_values(params.elements, &mut rng),
            idx: aligned_permutation(params.elements, &mut rng),
            reps: params.reps,
        }
    }

    #[inline(always)]
    fn run_with<M: Memory>(&self, m: &mut M) -> u64 {
        let (a, b, c, idx) = (&self.a[..], &self.b[..], &self.c[..], &self.idx[..]);
        let mut sum = 0u64;
        for _ in 0..self.reps {
            for slot in idx {
                let j = m.strided(slot) as usize;
                sum = sum.wrapping_add(m.irregular(&b[j]));
            }
            for x in a {
                sum = sum.wrapping_add(m.strided(x));
            }
            for slot in idx {
                let j = m.strided(slot) as usize;
                sum = sum.wrapping_add(m.irregular(&c[j]));
            }
        }
        sum
    }

    fn run(&self) -> u64 {
        irr_str_irr(self)
    }
}

/// Runs [`IrrStrIrr`] with real loads.
#[inline(never)]
pub fn irr_str_irr(kernel: &IrrStrIrr) -> u64 {
    kernel.run_with(&mut Machine)
}

/// A list node of [`Chase`]: 8 bytes, eight to a line.
#[derive(Clone, Copy, Debug, Default)]
#[repr(C)]
pub struct Node {
    /// Index of the next node.
    pub next: u32,
    /// Payload summed along the walk.
    pub value: u32,
}

// SAFETY: two `u32`s, `repr(C)`, no padding; 8 divides 64.
unsafe impl Plain for Node {}

/// `chase`: pointer chasing around a linked ring of `N` nodes laid out in a
/// shuffled order.
///
/// - Access: per step `node.value` then `node.next` (both Irregular: their
///   address comes from the previous step's load); `N` steps per sweep.
///   Nodes are 8 bytes (`u32` index + `u32` payload), eight to a line.
/// - Footprint: `F = 2N` addresses, `F_irr% = 1`; `F_lines = N/8`
///   (62 500); `A = 2·R·N`.
/// - Growth: `ΔF = 1` per window; each step lands on a new line (the two
///   loads of a node share it), so a window of `2^k` loads touches about
///   `2^(k-1)` lines while `2^(k-1)` is well below `N/8`.
/// - Compiled: bounds check, `mov r10d, [rdx + 8*rdi + 4]` (value),
///   `mov edi, [rdx + 8*rdi]` (next): a serial dependency chain, which makes
///   `chase` the slowest kernel natively (latency-bound).
pub struct Chase {
    nodes: Aligned<Node>,
    start: usize,
    reps: usize,
}

impl Kernel for Chase {
    const NAME: &'static str = "chase";

    fn prepare(params: Params) -> Self {
        let mut rng = rng_for(Self::NAME);
        let n = params.elements;
        let order = rng.permutation(n);
        let mut nodes = Aligned::from_fn(n, |_| Node::default());
        let slots = nodes.as_mut_slice();
        for (k, &at) in order.iter().enumerate() {
            slots[at as usize] = Node {
                next: order[(k + 1) % n],
                value: rng.next_u64() as u32,
            };
        }
        Chase {
            nodes,
            start: order[0] as usize,
            reps: params.reps,
        }
    }

    #[inline(always)]
    fn run_with<M: Memory>(&self, m: &mut M) -> u64 {
        let nodes = &self.nodes[..];
        let mut at = self.start;
        let mut sum = 0u64;
        for _ in 0..self.reps {
            for _ in 0..nodes.len() {
                let node = &nodes[at];
                sum = sum.wrapping_add(u64::from(m.irregular(&node.value)));
                at = m.irregular(&node.next) as usize;
            }
        }
        sum
    }

    fn run(&self) -> u64 {
        chase(self)
    }
}

/// Runs [`Chase`] with real loads.
#[inline(never)]
pub fn chase(kernel: &Chase) -> u64 {
    kernel.run_with(&mut Machine)
}
