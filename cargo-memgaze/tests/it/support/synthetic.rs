//! Synthetic traces shaped like the bundled microbenchmarks (`str1`,
//! `str8`, `irr`, `irr-rand`, `irr-half`, `str/irr`, `irr|str|irr`,
//! `chase`): the address stream of each kernel is a function of the
//! execution index, so a sampled trace costs only its sampled records.
//!
//! Shared by the report tests and `benches/report.rs` (`#[path]` include).

#![allow(dead_code)]

use memgaze_trace::{
    Backend, FunctionEntry, LoadClass, LoadEntry, Sampling, TraceHeader, TraceTotals, TraceWriter,
};
use std::path::Path;

/// The microbenchmark kernels.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kernel {
    Str1,
    Str8,
    Irr,
    IrrRand,
    IrrHalf,
    StrIrr,
    IrrStrIrr,
    Chase,
}

impl Kernel {
    pub const ALL: [Kernel; 8] = [
        Kernel::Str1,
        Kernel::Str8,
        Kernel::Irr,
        Kernel::IrrRand,
        Kernel::IrrHalf,
        Kernel::StrIrr,
        Kernel::IrrStrIrr,
        Kernel::Chase,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Kernel::Str1 => "str1",
            Kernel::Str8 => "str8",
            Kernel::Irr => "irr",
            Kernel::IrrRand => "irr-rand",
            Kernel::IrrHalf => "irr-half",
            Kernel::StrIrr => "str/irr",
            Kernel::IrrStrIrr => "irr|str|irr",
            Kernel::Chase => "chase",
        }
    }
}

/// Where the kernels' data live: an mmap'd array, a brk-heap index array
/// and a stack slot, terabytes apart as in a real process.
const DATA: u64 = 0x7f3a_1c00_0000;
const INDEX: u64 = 0x5563_2a40_0000;
const STACK: u64 = 0x7ffd_5e3c_1f08;

/// Load sites: 0 data Strided, 1 index Strided, 2 data Irregular, 3 stack
/// Constant (implies 2 more), 4 node link Irregular.
const LOADS: [(LoadClass, u32, u32); 5] = [
    (LoadClass::Strided, 0, 0),
    (LoadClass::Strided, 0, 0),
    (LoadClass::Irregular, 0, 0),
    (LoadClass::Constant, 2, 1),
    (LoadClass::Irregular, 0, 2),
];

/// Parameters of one synthetic run.
#[derive(Clone, Copy, Debug)]
pub struct Synthetic {
    pub kernel: Kernel,
    /// Array elements `N`.
    pub elements: u64,
    /// Sweeps `R`.
    pub reps: u64,
    /// `w` and `w + z`; `None` for a full trace.
    pub sampling: Option<(u64, u64)>,
    pub seed: u64,
}

fn mix(mut x: u64) -> u64 {
    x ^= x >> 33;
    x = x.wrapping_mul(0xff51_afd7_ed55_8ccd);
    x ^= x >> 33;
    x = x.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    x ^ (x >> 33)
}

/// A kernel's address stream, addressable by execution index.
pub struct Stream {
    kernel: Kernel,
    n: u64,
    reps: u64,
    perm: Vec<u32>,
}

impl Stream {
    pub fn new(kernel: Kernel, n: u64, reps: u64, seed: u64) -> Stream {
        let mut perm: Vec<u32> = (0..n as u32).collect();
        let mut state = seed ^ 0x9e37_79b9_7f4a_7c15;
        for i in (1..perm.len()).rev() {
            state = mix(state.wrapping_add(i as u64));
            perm.swap(i, (state % (i as u64 + 1)) as usize);
        }
        Stream {
            kernel,
            n,
            reps,
            perm,
        }
    }

    /// Loads per element and sweep (the Constant stack reload every 8th
    /// iteration is extra).
    fn per_element(&self) -> u64 {
        match self.kernel {
            Kernel::Str1 | Kernel::Str8 | Kernel::Chase => 1,
            _ => 2,
        }
    }

    fn elements_per_sweep(&self) -> u64 {
        match self.kernel {
            Kernel::Str8 => self.n / 8,
            Kernel::IrrHalf => self.n / 2,
            _ => self.n,
        }
    }

    /// Executions of instrumented loads over the whole run.
    pub fn executions(&self) -> u64 {
        let iterations = self.elements_per_sweep() * self.reps;
        iterations * self.per_element() + iterations / 8
    }

    /// The load site and address of execution `e`.
    pub fn access(&self, e: u64) -> (u32, u64) {
        let per = self.per_element() * 8 + 1;
        let (block, within) = (e / per, e % per);
        if within == per - 1 {
            return (3, STACK);
        }
        let iteration = block * 8 + within / self.per_element();
        let second = within % self.per_element() == 1;
        let sweep_len = self.elements_per_sweep();
        let (rep, i) = (iteration / sweep_len, iteration % sweep_len);
        let a = |j: u64| DATA + 8 * j;
        let idx = |j: u64| INDEX + 4 * j;
        let perm = |j: u64| self.perm[(j % self.n) as usize] as u64;
        match self.kernel {
            Kernel::Str1 => (0, a(i)),
            Kernel::Str8 => (0, a(8 * i)),
            Kernel::Chase => (4, DATA + 64 * perm(i)),
            Kernel::Irr => {
                if second {
                    (2, a(perm(i)))
                } else {
                    (1, idx(i))
                }
            }
            Kernel::IrrHalf => {
                if second {
                    (2, a(perm(i) % (self.n / 2)))
                } else {
                    (1, idx(i))
                }
            }
            Kernel::IrrRand => {
                if second {
                    (2, a(mix(i ^ (rep << 40)) % self.n))
                } else {
                    (1, idx(i))
                }
            }
            Kernel::StrIrr => {
                if !second {
                    (1, idx(i))
                } else if mix(i) & 1 == 0 {
                    (0, a(i))
                } else {
                    (2, a(perm(i)))
                }
            }
            Kernel::IrrStrIrr => {
                // Three phases per sweep: irregular, strided, irregular.
                let phase = i * 3 / sweep_len;
                if !second {
                    (1, idx(i))
                } else if phase == 1 {
                    (0, a(i))
                } else {
                    (2, a(perm(i)))
                }
            }
        }
    }
}

/// The header of a synthetic trace of `kernel`.
pub fn header(kernel: Kernel, sampling: Sampling) -> TraceHeader {
    let function = format!(
        "microbenches::kernels::{}_kernel",
        kernel.name().replace(['/', '|', '-'], "_")
    );
    TraceHeader {
        backend: Backend::Soft,
        sampling,
        binary: None,
        command: vec!["micro".into(), kernel.name().into()],
        functions: vec![
            FunctionEntry {
                name: function,
                start: 0x1000,
                end: 0x1100,
            },
            FunctionEntry {
                name: "microbenches::kernels::sweep_counter".into(),
                start: 0x1100,
                end: 0x1180,
            },
            FunctionEntry {
                name: "microbenches::kernels::Chase::walk".into(),
                start: 0x1180,
                end: 0x1200,
            },
        ],
        loads: LOADS
            .iter()
            .enumerate()
            .map(|(i, (class, implied, function))| LoadEntry {
                ip: [0x1010, 0x1020, 0x1030, 0x1110, 0x11a0][i],
                class: *class,
                implied: *implied,
                function: Some(*function),
                line: Some(format!("microbenches/src/kernels.rs:{}", 80 + 10 * i)),
                proxy: None,
            })
            .collect(),
        labels: vec![("bench".into(), kernel.name().into())],
        spatial: None,
    }
}

/// Writes the trace of `run` to `path`; returns (records, samples).
pub fn write_trace(path: &Path, run: &Synthetic) -> (u64, u64) {
    write_trace_placed(path, run, 0)
}

/// [`write_trace`] with the kernel's data (not its stack slot) moved by
/// `shift` bytes: the same program whose allocations landed elsewhere.
pub fn write_trace_placed(path: &Path, run: &Synthetic, shift: u64) -> (u64, u64) {
    let stream = Stream::new(run.kernel, run.elements, run.reps, run.seed);
    let total = stream.executions();
    let sampling = match run.sampling {
        Some((window, period)) => Sampling {
            window,
            period,
            seed: Some(run.seed),
        },
        None => Sampling::full(),
    };
    let mut w = TraceWriter::create(path, &header(run.kernel, sampling)).unwrap();
    match run.sampling {
        None => {
            w.begin_sample(0).unwrap();
            for e in 0..total {
                let (load, addr) = stream.access(e);
                w.push(load, placed(load, addr, shift)).unwrap();
            }
        }
        Some((window, period)) => {
            let jitter_span = period - window;
            for s in 0..total / period {
                let start = s * period + mix(run.seed ^ s) % jitter_span.max(1);
                w.begin_sample(0).unwrap();
                for e in start..(start + window).min(total) {
                    let (load, addr) = stream.access(e);
                    w.push(load, placed(load, addr, shift)).unwrap();
                }
            }
        }
    }
    let (records, samples) = (w.records(), w.samples());
    w.finish(&TraceTotals::clean(total, records, samples))
        .unwrap()
        .commit()
        .unwrap();
    (records, samples)
}

/// `addr` of load site `load` with the data moved by `shift` bytes (the
/// stack slot of site 3 stays).
fn placed(load: u32, addr: u64, shift: u64) -> u64 {
    if load == 3 { addr } else { addr + shift }
}
