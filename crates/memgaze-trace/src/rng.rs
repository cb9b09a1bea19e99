//! The workspace's one pseudo-random generator, SplitMix64.
//!
//! It lives here, in the lowest crate, because both the command layer (the
//! golden bootstrap draws its replicates from `--seed`) and the recorder's
//! tests (reproducible packet streams) need it, and a seed must name the same
//! stream everywhere. The runtime's sampling generator is seeded with the
//! same function, but emitted as machine code (`rewrite::runtime`), so it
//! cannot call this one.
//!
//! Only `microbenches` keeps its own copy: it is the workload that gets
//! instrumented, it depends on nothing of memgaze so that its executable
//! stays the same whatever memgaze's crates become, and a test in
//! `cargo-memgaze` checks that both give the same stream.

/// SplitMix64 (Steele, Lea and Flood, "Fast splittable pseudorandom number
/// generators", OOPSLA 2014): one 64-bit state, a Weyl sequence mixed by
/// two multiply-xorshift rounds. Tiny, fast, and every seed (zero included)
/// gives a full-period stream, which is all seeded sampling and test data
/// need; it is not for cryptography.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SplitMix64 {
    state: u64,
}

impl SplitMix64 {
    /// The Weyl increment: 2^64 divided by the golden ratio, odd.
    pub(crate) const GAMMA: u64 = 0x9e37_79b9_7f4a_7c15;

    /// A generator whose stream is determined by `seed` alone.
    pub fn new(seed: u64) -> Self {
        SplitMix64 { state: seed }
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(Self::GAMMA);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A value in `0..bound` by multiply-shift (Lemire): no division, and
    /// the bias, below `bound / 2^64`, is negligible for every bound a trace
    /// or a test uses. `bound` must not be zero.
    pub fn below(&mut self, bound: u64) -> u64 {
        debug_assert!(bound > 0, "below(0)");
        ((u128::from(self.next_u64()) * u128::from(bound)) >> 64) as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_the_reference_implementation() {
        // splitmix64.c (Vigna, prng.di.unimi.it) seeded with 1234567.
        let mut rng = SplitMix64::new(1234567);
        let first: Vec<u64> = (0..5).map(|_| rng.next_u64()).collect();
        assert_eq!(
            first,
            [
                6457827717110365317,
                3203168211198807973,
                9817491932198370423,
                4593380528125082431,
                16408922859458223821,
            ]
        );
    }

    #[test]
    fn a_seed_names_one_stream_and_zero_is_a_seed() {
        let stream = |seed| {
            let mut rng = SplitMix64::new(seed);
            (0..4).map(|_| rng.next_u64()).collect::<Vec<_>>()
        };
        assert_eq!(stream(7), stream(7));
        assert_ne!(stream(7), stream(8));
        assert!(stream(0).iter().all(|&x| x != 0));
    }

    #[test]
    fn below_stays_in_range_and_covers_it() {
        let mut rng = SplitMix64::new(42);
        let mut seen = [0u32; 10];
        for _ in 0..10_000 {
            let x = rng.below(10);
            assert!(x < 10);
            seen[x as usize] += 1;
        }
        // Each bucket expects 1,000; 800 is more than 6 sigma away.
        assert!(seen.iter().all(|&n| n > 800), "{seen:?}");
        assert_eq!(SplitMix64::new(1).below(1), 0);
    }
}
