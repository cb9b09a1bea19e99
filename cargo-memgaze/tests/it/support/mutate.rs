//! Deterministic input mutation for the fuzz-style tests: a seeded
//! xorshift generator, byte-level mutations (bit flips, interesting bytes,
//! truncations, splices, deleted and repeated ranges) and JSON-aware ones
//! (a number, string or array element of the document replaced by an
//! extreme or odd value), and a runner that calls the code under test in a
//! thread of its own with a time limit and catches its panics.

#![allow(dead_code)]

use std::time::Duration;

/// xorshift64* (deterministic, good enough to pick mutations).
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    /// A generator from a seed (any value; 0 is remapped).
    pub fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    /// The next 64 random bits.
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// Uniform in `0..n` (`n` > 0).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }

    /// True with probability 1/`n`.
    pub fn one_in(&mut self, n: usize) -> bool {
        self.below(n) == 0
    }
}

/// Bytes mutated in one to three ways.
pub fn mutate_bytes(input: &[u8], rng: &mut Rng) -> Vec<u8> {
    let mut out = input.to_vec();
    for _ in 0..1 + rng.below(3) {
        if out.is_empty() {
            out.push(rng.next() as u8);
            continue;
        }
        let len = out.len();
        match rng.below(7) {
            0 => {
                for _ in 0..1 + rng.below(8) {
                    let at = rng.below(len);
                    out[at] ^= 1 << rng.below(8);
                }
            }
            1 => {
                let at = rng.below(len);
                out[at] = [0, 0xff, 0x7f, 0x80, b'9', b'-', b'"', b'\n'][rng.below(8)];
            }
            2 => out.truncate(rng.below(len)),
            3 => {
                // Splice: a range copied over another place.
                let from = rng.below(len);
                let n = rng.below(len - from).min(4096) + 1;
                let chunk = out[from..from + n.min(len - from)].to_vec();
                let to = rng.below(len);
                let end = (to + chunk.len()).min(len);
                out[to..end].copy_from_slice(&chunk[..end - to]);
            }
            4 => {
                let from = rng.below(len);
                let n = rng.below(len - from) + 1;
                out.drain(from..(from + n).min(len));
            }
            5 => {
                // A range repeated in place.
                let from = rng.below(len);
                let n = (rng.below(len - from) + 1).min(4096);
                let chunk = out[from..(from + n).min(len)].to_vec();
                let at = rng.below(len);
                out.splice(at..at, chunk);
            }
            _ => {
                // Four bytes set to a little-endian extreme.
                let at = rng.below(len);
                let value: u32 = [0, u32::MAX, 0x7fff_ffff, 0x8000_0000, 1][rng.below(5)];
                for (i, b) in value.to_le_bytes().iter().enumerate() {
                    if at + i < len {
                        out[at + i] = *b;
                    }
                }
            }
        }
    }
    out
}

/// A value worth trying where a number was.
fn odd_number(rng: &mut Rng) -> serde_json::Value {
    use serde_json::json;
    match rng.below(16) {
        0 => json!(0),
        1 => json!(-1),
        2 => json!(1e308),
        3 => json!(-1e308),
        4 => json!(1e-300),
        5 => json!(u64::MAX),
        6 => json!(i64::MIN),
        7 => json!(9_007_199_254_740_993u64),
        8 => json!(0.5),
        9 => json!(-0.0),
        10 => json!(4_294_967_296u64),
        11 => json!(1e20),
        12 => json!(null),
        13 => json!("NaN"),
        14 => json!(rng.next() >> rng.below(64)),
        _ => json!(-(rng.next() as f64) / 7.0),
    }
}

/// Another value of the same kind (an integer stays an integer), within
/// or near what such a field holds: what gets past validation to the
/// renderers.
fn plausible_number(n: &serde_json::Number, rng: &mut Rng) -> serde_json::Value {
    use serde_json::json;
    let factor = [0.0, 1e-3, 0.5, 2.0, 10.0, 1e3, 1e6][rng.below(7)];
    match n.as_u64() {
        Some(x) => match rng.below(3) {
            0 => json!(((x as f64) * factor) as u64),
            1 => json!(rng.below(70)),
            _ => json!(x.wrapping_add(1)),
        },
        None => {
            let x = n.as_f64().unwrap_or(0.0);
            match rng.below(3) {
                0 => json!(x * factor),
                1 => json!((rng.next() % 1_000_001) as f64 / 1e6),
                _ => json!(0.0),
            }
        }
    }
}

/// The JSON document with one to four leaves or elements changed.
pub fn mutate_json(value: &serde_json::Value, rng: &mut Rng) -> serde_json::Value {
    let mut out = value.clone();
    for _ in 0..1 + rng.below(4) {
        let count = count_nodes(&out);
        let target = rng.below(count);
        let mut seen = 0;
        mutate_node(&mut out, target, &mut seen, rng);
    }
    out
}

fn count_nodes(v: &serde_json::Value) -> usize {
    1 + match v {
        serde_json::Value::Array(a) => a.iter().map(count_nodes).sum(),
        serde_json::Value::Object(o) => o.values().map(count_nodes).sum(),
        _ => 0,
    }
}

fn mutate_node(v: &mut serde_json::Value, target: usize, seen: &mut usize, rng: &mut Rng) -> bool {
    use serde_json::Value;
    if *seen == target {
        *v = match v {
            Value::Number(n) if rng.one_in(2) => plausible_number(n, rng),
            Value::Number(_) | Value::Null | Value::Bool(_) => odd_number(rng),
            Value::String(s) => match rng.below(5) {
                0 => Value::String(String::new()),
                1 => Value::String(s.repeat(200)),
                2 => Value::String("0xffffffffffffffff".into()),
                3 => Value::String("\u{202e}<script>\"'&".into()),
                _ => odd_number(rng),
            },
            Value::Array(a) => {
                let mut a = a.clone();
                match rng.below(4) {
                    0 => a.clear(),
                    1 if !a.is_empty() => {
                        let i = rng.below(a.len());
                        a.remove(i);
                    }
                    2 if !a.is_empty() => {
                        // Many copies of one element: sizes far past normal.
                        let e = a[rng.below(a.len())].clone();
                        a.extend(std::iter::repeat_n(e, 1 + rng.below(2000)));
                    }
                    _ => a.reverse(),
                }
                Value::Array(a)
            }
            Value::Object(o) => {
                let mut o = o.clone();
                if !o.is_empty() {
                    let key = o.keys().nth(rng.below(o.len())).cloned().unwrap();
                    o.remove(&key);
                }
                Value::Object(o)
            }
        };
        return true;
    }
    *seen += 1;
    match v {
        Value::Array(a) => a.iter_mut().any(|e| mutate_node(e, target, seen, rng)),
        Value::Object(o) => o.values_mut().any(|e| mutate_node(e, target, seen, rng)),
        _ => false,
    }
}

/// A JSON text mutated either as a document (usually) or as bytes.
pub fn mutate_json_text(value: &serde_json::Value, rng: &mut Rng) -> Vec<u8> {
    if rng.one_in(4) {
        mutate_bytes(serde_json::to_string(value).unwrap().as_bytes(), rng)
    } else {
        serde_json::to_vec(&mutate_json(value, rng)).unwrap()
    }
}

/// Runs `f` in its own thread: a panic or a run past `limit` fails the
/// test, naming `what` (the case to replay).
pub fn survive<F: FnOnce() + Send + 'static>(what: &str, limit: Duration, f: F) {
    let (tx, rx) = std::sync::mpsc::channel();
    let handle = std::thread::spawn(move || {
        let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f));
        let _ = tx.send(outcome.is_ok());
    });
    match rx.recv_timeout(limit) {
        Ok(true) => {
            let _ = handle.join();
        }
        Ok(false) => panic!("{what}: panicked"),
        Err(_) => panic!("{what}: still running after {limit:?} (a hang)"),
    }
}

/// How many cases a fuzz test runs: `default`, or `MEMGAZE_FUZZ_CASES`
/// (for a longer local run).
pub fn cases(default: u64) -> u64 {
    std::env::var("MEMGAZE_FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}
