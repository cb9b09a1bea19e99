//! `cargo bench -p cargo-memgaze --bench classify`: time of the whole binary
//! analysis of a ~2 MB Rust executable against `objdump -d` of the same
//! file, measured alternately in the same run.
//!
//! The executable is generated and built here (release, no debug info —
//! cargo's default for benches): 16 modules, each with 200 small
//! `#[inline(never)]` kernels of six shapes (strided loops, `match` jump
//! tables, gathers, index chasing, zips, binary searches) plus std
//! collections, sorting and formatting code: about 2 MB and 4,300 functions.
//! It is cached under the bench's `CARGO_TARGET_TMPDIR`; set
//! `MEMGAZE_BENCH_BINARY=<path>` to measure another executable instead, and
//! `MEMGAZE_BENCH_RUNS=<n>` for the number of timed pairs (default 15).
//!
//! "Classify" is everything `cargo memgaze instrument` needs before
//! rewriting: open and check the ELF, discover functions, decode, build
//! control flow and loops, classify every load, proxy compression, and the
//! annotation as JSON (with `file:line` when the binary has DWARF).

use memgaze_instrument::binary::Binary;
use memgaze_instrument::classify;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const MODULES: usize = 16;
const KERNELS_PER_MODULE: usize = 200;

/// Kernel `k` of module `m`; its constants depend on both, so that no two
/// kernels are identical (LLVM would merge them).
fn kernel(m: usize, k: usize) -> String {
    let f = k;
    let k = k + 1000 * m;
    let body = match f % 6 {
        0 => format!(
            "let mut s = 0u64; let mut i = 0; while i < a.len() {{ s = s.wrapping_add(a[i] ^ {k}); i += {}; }} s",
            k % 3 + 1
        ),
        1 => format!(
            "match n % 7 {{ 0 => a.len() as u64 + {k}, 1 => b.len() as u64 * {}, 2 => a.first().copied().unwrap_or({k}), \
             3 => n as u64 ^ {k}, 4 => b.last().copied().unwrap_or(0) + {k}, 5 => (n as u64).rotate_left({}), _ => {k} }}",
            k + 1,
            k % 60
        ),
        2 => format!(
            "let mut s = 0u64; for &x in b.iter() {{ if let Some(v) = a.get(x as usize % (a.len() + 1)) {{ s = s.wrapping_add(*v + {k}); }} }} s"
        ),
        3 => format!(
            "let mut at = n % (a.len() + 1); let mut s = {k}u64; for _ in 0..a.len() {{ match a.get(at) {{ \
             Some(&v) => {{ s = s.wrapping_add(v); at = v as usize % a.len(); }} None => break }} }} s"
        ),
        4 => format!(
            "let _ = n; for (x, y) in b.iter_mut().zip(a) {{ *x = y.wrapping_mul({}) >> 1; }} b.len() as u64",
            k + 3
        ),
        _ => format!(
            "let key = n as u64 ^ {k}; match a.binary_search(&key) {{ Ok(p) => p as u64, Err(p) => p as u64 + {k} }}"
        ),
    };
    format!(
        "    #[inline(never)] pub fn kernel_{f}(a: &[u64], b: &mut [u64], n: usize) -> u64 {{ {body} }}\n"
    )
}

fn fixture_source() -> String {
    let mut s = String::from(
        "#![allow(unused_variables)]\nuse std::collections::{BTreeMap, HashMap};\nuse std::fmt::Write as _;\nuse std::hint::black_box;\n\
         type Kernel = fn(&[u64], &mut [u64], usize) -> u64;\n",
    );
    for m in 0..MODULES {
        s.push_str(&format!(
            "mod m{m} {{\n    use super::*;\n    #[derive(Debug, Clone, PartialEq, PartialOrd, Default)]\n    \
             pub struct Item {{ pub id: u64, pub name: String, pub score: i64 }}\n"
        ));
        for k in 0..KERNELS_PER_MODULE {
            s.push_str(&kernel(m, k));
        }
        let table: Vec<String> = (0..KERNELS_PER_MODULE)
            .map(|k| format!("kernel_{k}"))
            .collect();
        s.push_str(&format!(
            "    pub const KERNELS: [Kernel; {KERNELS_PER_MODULE}] = [{}];\n    pub fn run(seed: u64) -> u64 {{\n        \
             let mut v: Vec<Item> = (0..seed % 97 + {m}).map(|k| Item {{ id: k ^ seed, name: format!(\"item{m}-{{k}}\"), score: k as i64 * {} }}).collect();\n        \
             v.sort_by(|x, y| x.partial_cmp(y).unwrap());\n        \
             let by_name: HashMap<String, u64> = v.iter().map(|x| (x.name.clone(), x.id)).collect();\n        \
             let by_id: BTreeMap<u64, i64> = v.iter().map(|x| (x.id, x.score)).collect();\n        \
             let mut s = String::new();\n        let _ = write!(s, \"{{:?}}\", v.first());\n        \
             let a: Vec<u64> = (0..64).map(|k| k * seed).collect();\n        let mut b = vec![seed; 64];\n        \
             let mut acc = by_name.len() as u64 ^ by_id.len() as u64 ^ s.len() as u64;\n        \
             for k in black_box(&KERNELS) {{ acc ^= k(&a, &mut b, seed as usize); }}\n        acc\n    }}\n}}\n",
            table.join(", "),
            m + 3
        ));
    }
    s.push_str("fn main() {\n    let seed = black_box(std::env::args().count() as u64);\n    let mut acc = 0u64;\n");
    for m in 0..MODULES {
        s.push_str(&format!("    acc ^= m{m}::run(seed);\n"));
    }
    s.push_str("    println!(\"{acc}\");\n}\n");
    s
}

/// Builds (or reuses) the generated executable.
fn fixture() -> PathBuf {
    if let Ok(path) = std::env::var("MEMGAZE_BENCH_BINARY") {
        return PathBuf::from(path);
    }
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("classify-bench-fixture");
    std::fs::create_dir_all(dir.join("src")).unwrap();
    let manifest = "[package]\nname = \"memgaze-bench-fixture\"\nversion = \"0.1.0\"\nedition = \"2021\"\n\n\
                    [workspace]\n\n[profile.release]\ndebug = false\n";
    let source = fixture_source();
    let write_if_changed = |path: PathBuf, text: &str| {
        if std::fs::read_to_string(&path).ok().as_deref() != Some(text) {
            std::fs::write(path, text).unwrap();
        }
    };
    write_if_changed(dir.join("Cargo.toml"), manifest);
    write_if_changed(dir.join("src/main.rs"), &source);
    eprintln!(
        "building the fixture executable in {} (cached) …",
        dir.display()
    );
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let status = Command::new(cargo)
        .args(["build", "--release", "--quiet", "--offline"])
        .current_dir(&dir)
        .env("CARGO_TARGET_DIR", dir.join("target"))
        .env_remove("RUSTFLAGS")
        .status()
        .expect("cannot run cargo");
    assert!(status.success(), "building the fixture failed");
    dir.join("target/release/memgaze-bench-fixture")
}

/// One full analysis; returns the annotation size to keep the work alive.
fn classify_once(path: &Path) -> usize {
    let binary = Binary::open(path).expect("fixture opens");
    let loads = classify::classify_binary(&binary, |_| true);
    let annotation = loads.to_annotation(&binary);
    std::hint::black_box(annotation.to_json().len())
}

fn objdump_once(path: &Path) {
    let status = Command::new("objdump")
        .arg("-d")
        .arg(path)
        .stdout(Stdio::null())
        .status()
        .expect("cannot run objdump (binutils)");
    assert!(status.success());
}

fn stats(mut v: Vec<f64>) -> (f64, f64, f64) {
    v.sort_by(f64::total_cmp);
    let median = if v.len() % 2 == 1 {
        v[v.len() / 2]
    } else {
        (v[v.len() / 2 - 1] + v[v.len() / 2]) / 2.0
    };
    (median, v[0], v[v.len() - 1])
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn main() {
    // libtest-style filters and `--bench` are accepted and ignored.
    let path = fixture();
    let binary = Binary::open(&path).expect("fixture opens");
    let loads = classify::classify_binary(&binary, |_| true);
    let totals = loads.totals();
    let instructions: usize = binary
        .functions()
        .iter()
        .map(|f| binary.decode(f).len())
        .sum();
    println!(
        "binary: {} ({:.2} MB, {} functions, {} instructions, {} loads, kappa {:.2}, DWARF lines: {})",
        path.display(),
        binary.data().len() as f64 / 1e6,
        binary.functions().len(),
        instructions,
        totals.loads,
        totals.compression_ratio(),
        if binary.has_lines() { "yes" } else { "no" }
    );
    drop((binary, loads));

    let runs: usize = std::env::var("MEMGAZE_BENCH_RUNS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(15);
    classify_once(&path);
    objdump_once(&path);
    let (mut ours, mut theirs, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..runs {
        let t = Instant::now();
        classify_once(&path);
        let a = ms(t.elapsed());
        let t = Instant::now();
        objdump_once(&path);
        let b = ms(t.elapsed());
        ours.push(a);
        theirs.push(b);
        ratios.push(b / a);
    }
    let (a, a_min, a_max) = stats(ours);
    let (b, b_min, b_max) = stats(theirs);
    let (r, r_min, r_max) = stats(ratios);
    println!("{runs} alternating runs:");
    println!(
        "  classify (open, discover, decode, CFG, loops, classify, compress, annotation JSON): median {a:.1} ms [min {a_min:.1}, max {a_max:.1}]"
    );
    println!(
        "  objdump -d > /dev/null:                                                    median {b:.1} ms [min {b_min:.1}, max {b_max:.1}]"
    );
    println!(
        "  objdump / classify: {r:.2}x (per-pair median; range {r_min:.2}x – {r_max:.2}x){}",
        if r > 1.0 {
            "  -> classify is faster"
        } else {
            "  -> classify is SLOWER than objdump"
        }
    );
}
