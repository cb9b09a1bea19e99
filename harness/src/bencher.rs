//! [`Bencher`]: what a bench body receives, and the measured region it opens.

use crate::region::Region;
use std::time::{Duration, Instant};

/// How the bench executable was asked to run its benches.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Mode {
    /// Without `--bench` (e.g. `cargo test --benches`): run every body once,
    /// quickly, to check that it works. Bodies should pick a reduced input
    /// size here ([`Bencher::size`]).
    Smoke,
    /// With `--bench` (`cargo bench`, `cargo memgaze bench`): run the body at
    /// full size; this is the run `cargo memgaze` records.
    Measure,
}

/// Handed to every bench body: its name, the [`Mode`], and [`Bencher::iter`],
/// which runs the measured part.
///
/// Everything a body does before and after `iter` (allocating, filling,
/// shuffling, checking results) is setup and stays out of the measured region.
#[derive(Debug)]
pub struct Bencher<'a> {
    name: &'a str,
    mode: Mode,
    regions: u32,
    elapsed: Duration,
}

impl<'a> Bencher<'a> {
    pub(crate) fn new(name: &'a str, mode: Mode) -> Self {
        Bencher {
            name,
            mode,
            regions: 0,
            elapsed: Duration::ZERO,
        }
    }

    /// The bench's full name, as `--list` prints it (e.g. `lookup/1000`).
    pub fn name(&self) -> &str {
        self.name
    }

    /// Whether this is a smoke run or a measured run.
    pub fn mode(&self) -> Mode {
        self.mode
    }

    /// `true` under `cargo test --benches` (no `--bench` flag).
    pub fn is_smoke_test(&self) -> bool {
        self.mode == Mode::Smoke
    }

    /// Picks an input size: `full` when measured, `smoke` in a smoke run, so
    /// `cargo test --benches` stays fast.
    pub fn size(&self, full: usize, smoke: usize) -> usize {
        match self.mode {
            Mode::Measure => full,
            Mode::Smoke => smoke,
        }
    }

    /// Runs `body` once inside the measured region and returns its result.
    ///
    /// The region markers (`memgaze_region_begin`/`_end`) are called right
    /// before and right after `body`; the result passes through
    /// [`black_box`](crate::black_box) so the work cannot be optimised away.
    /// Call it once per bench; a body that calls it several times measures
    /// several regions under the same name, and the reported time is their
    /// sum.
    pub fn iter<R>(&mut self, body: impl FnOnce() -> R) -> R {
        let start = Instant::now();
        let result = {
            let _region = Region::begin(self.name);
            std::hint::black_box(body())
        };
        self.elapsed += start.elapsed();
        self.regions += 1;
        result
    }

    /// How many measured regions ran, and their total wall time.
    pub(crate) fn finish(self) -> (u32, Duration) {
        (self.regions, self.elapsed)
    }
}
