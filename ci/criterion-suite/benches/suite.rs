//! Ten criterion benches over std collections: three `bench_function`s,
//! a `benchmark_group` of `iter_batched` sorts with `BenchmarkId`
//! parameters, a group of binary searches by size, and two more forms
//! (`iter_batched_ref`, `iter_with_large_drop`).
use criterion::{black_box, criterion_group, criterion_main, BatchSize, BenchmarkId, Criterion};
use std::collections::{BTreeMap, HashMap};

/// `n` pseudo-random numbers (xorshift, fixed seed).
fn random(n: usize) -> Vec<u64> {
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        })
        .collect()
}

fn singles(c: &mut Criterion) {
    let v = random(100_000);
    c.bench_function("vec_sum", |b| {
        b.iter(|| black_box(&v).iter().fold(0u64, |s, x| s.wrapping_add(*x)))
    });
    let keys = random(10_000);
    let map: HashMap<u64, u64> = keys.iter().map(|&k| (k, k >> 3)).collect();
    c.bench_function("hashmap_get", |b| {
        b.iter(|| {
            keys.iter()
                .map(|k| map[black_box(k)])
                .fold(0u64, u64::wrapping_add)
        })
    });
    let tree: BTreeMap<u64, u64> = keys.iter().map(|&k| (k, k >> 3)).collect();
    c.bench_function("btree_range", |b| {
        b.iter(|| {
            tree.range(black_box(u64::MAX / 4)..u64::MAX / 2)
                .map(|(_, v)| *v)
                .fold(0u64, u64::wrapping_add)
        })
    });
}

fn sorts(c: &mut Criterion) {
    let mut group = c.benchmark_group("sort");
    for n in [1_000usize, 10_000, 100_000] {
        group.bench_with_input(BenchmarkId::new("unstable", n), &n, |b, &n| {
            b.iter_batched(
                || random(n),
                |mut v| {
                    v.sort_unstable();
                    v
                },
                BatchSize::LargeInput,
            )
        });
    }
    group.finish();
}

fn searches(c: &mut Criterion) {
    let mut group = c.benchmark_group("binary_search");
    for n in [1_000usize, 1_000_000] {
        let mut sorted = random(n);
        sorted.sort_unstable();
        let probes = random(1_000);
        group.bench_with_input(BenchmarkId::from_parameter(n), &sorted, |b, sorted| {
            b.iter(|| {
                probes
                    .iter()
                    .filter(|p| sorted.binary_search(black_box(p)).is_ok())
                    .count()
            })
        });
    }
    group.finish();
}

fn others(c: &mut Criterion) {
    c.bench_function("dedup_ref", |b| {
        b.iter_batched_ref(
            || {
                let mut v: Vec<u64> = random(20_000).iter().map(|x| x % 512).collect();
                v.sort_unstable();
                v
            },
            |v| v.dedup(),
            BatchSize::LargeInput,
        )
    });
    let words: Vec<String> = random(5_000).iter().map(|x| format!("{x:x}")).collect();
    c.bench_function("string_lengths", |b| {
        b.iter_with_large_drop(|| {
            words
                .iter()
                .map(|w| w.bytes().filter(|&c| c > b'9').count())
                .collect::<Vec<usize>>()
        })
    });
}

criterion_group!(benches, singles, sorts, searches, others);
criterion_main!(benches);
