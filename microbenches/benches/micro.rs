//! The MemGaze microbenchmarks: `str1`, `str8`, `irr`, `irr-rand`,
//! `irr-half`, `str/irr`, `irr|str|irr`, `chase`.
//!
//! `cargo bench -p microbenches` (or `cargo memgaze bench -p microbenches`)
//! runs them at full size (500 K elements, 100 sweeps); `cargo test` runs
//! each once at smoke size. `MEMGAZE_MICRO_ELEMENTS` and `MEMGAZE_MICRO_REPS`
//! override the sizes in either mode.

use memgaze_harness::{Benches, black_box};
use microbenches::{
    Chase, FULL, Irr, IrrHalf, IrrRand, IrrStrIrr, Kernel, Params, SMOKE, Str1, Str8, StrIrr,
};

/// Registers kernel `K`: inputs are prepared before the measured region and
/// dropped after it.
fn add<K: Kernel + 'static>(benches: &mut Benches) {
    benches.bench(K::NAME, |b| {
        let default = if b.is_smoke_test() { SMOKE } else { FULL };
        let params = Params::from_env(default).unwrap_or_else(|e| panic!("{e}"));
        let kernel = K::prepare(params);
        let kernel = black_box(&kernel);
        b.iter(|| kernel.run());
    });
}

fn microbenchmarks(benches: &mut Benches) {
    add::<Str1>(benches);
    add::<Str8>(benches);
    add::<Irr>(benches);
    add::<IrrRand>(benches);
    add::<IrrHalf>(benches);
    add::<StrIrr>(benches);
    add::<IrrStrIrr>(benches);
    add::<Chase>(benches);
}

memgaze_harness::main!(microbenchmarks);
