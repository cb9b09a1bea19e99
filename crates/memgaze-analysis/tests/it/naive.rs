//! A deliberately naive reference implementation of docs/METRICS.md: every
//! metric straight from its definition — a `HashSet` per window, a linear
//! LRU stack for reuse distance, unions of sets for interval-tree nodes.
//! Quadratic and slow; only for checking the real analysis on small traces.

#![allow(dead_code)]

use memgaze_trace::{LoadClass, TraceHeader};
use std::collections::{BTreeMap, HashMap, HashSet};

/// One record as written: thread, load-site index, address.
#[derive(Clone, Copy, Debug)]
pub struct Rec {
    pub thread: u32,
    pub load: u32,
    pub addr: u64,
}

/// Parameters mirrored from `AnalysisOptions`.
#[derive(Clone, Debug)]
pub struct Params {
    pub block: u64,
    pub code_window_k: Option<u32>,
    pub threshold_percent: f64,
    pub min_page: u64,
    pub functions: Option<String>,
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct Row {
    pub k: u32,
    pub windows: u64,
    pub f: f64,
    pub f_lines: f64,
    pub d_f: f64,
    pub f_str: f64,
    pub f_irr: f64,
    pub f_str_frac: f64,
    pub f_irr_frac: f64,
    pub a_const: f64,
}

#[derive(Clone, Debug, Default)]
pub struct Function {
    pub name: String,
    pub a: u64,
    pub a_const: u64,
    pub d_f: Option<f64>,
    pub f_str_frac: Option<f64>,
    pub f_irr_frac: Option<f64>,
    pub code_windows: u64,
    pub d_mean: Option<f64>,
    pub rows: Vec<Row>,
    /// (ip, line, records) of its three load sites with most records.
    pub hot_loads: Vec<(u64, Option<String>, u64)>,
}

#[derive(Clone, Debug, Default)]
pub struct Region {
    pub start: u64,
    pub end: u64,
    pub a: u64,
    pub blocks: u64,
    pub d_mean: Option<f64>,
    pub depth: u32,
    pub functions: Vec<(String, u64)>,
}

#[derive(Clone, Debug, Default)]
pub struct Level {
    pub h: u32,
    pub nodes: u64,
    pub a: f64,
    pub f: f64,
    pub d_f: Option<f64>,
}

#[derive(Clone, Debug, Default)]
pub struct Reference {
    pub a: u64,
    pub a_const: u64,
    pub rho: Option<f64>,
    pub kappa: Option<f64>,
    pub samples: u64,
    pub records: u64,
    pub f: u64,
    pub f_lines: u64,
    pub f_str: f64,
    pub f_irr: f64,
    pub d_f: Option<f64>,
    pub d_mean: Option<f64>,
    pub d_max: Option<u64>,
    pub d_bins: Vec<u64>,
    pub cold: u64,
    pub captures: u64,
    pub survivals: u64,
    pub rows: Vec<Row>,
    pub functions: Vec<Function>,
    /// (ip, class, count, implied, D mean)
    pub loads: Vec<(u64, LoadClass, u64, bool, Option<f64>)>,
    pub regions: Vec<Region>,
    pub levels: Vec<Level>,
    /// Root of the interval tree: (samples, A, F, F_lines).
    pub root: Option<(u64, u64, u64, u64)>,
    pub empty_samples: u64,
    pub outside_functions: u64,
    pub filtered_out: u64,
}

struct Info {
    class: LoadClass,
    implied: u64,
    function: Option<usize>,
    included: bool,
}

/// One analysed record inside a piece.
#[derive(Clone, Copy)]
struct Item {
    load: usize,
    addr: u64,
    class: LoadClass,
    implied: u64,
    function: Option<usize>,
}

fn glob_match(pattern: &str, name: &str) -> bool {
    // Only `*` wildcards: enough for the tests' patterns.
    let parts: Vec<&str> = pattern.split('*').collect();
    if parts.len() == 1 {
        return pattern == name;
    }
    let mut rest = name;
    for (i, part) in parts.iter().enumerate() {
        if i == 0 {
            if !rest.starts_with(part) {
                return false;
            }
            rest = &rest[part.len()..];
        } else if i == parts.len() - 1 {
            return rest.ends_with(part);
        } else if let Some(at) = rest.find(part) {
            rest = &rest[at + part.len()..];
        } else {
            return false;
        }
    }
    true
}

fn ratio(n: f64, d: f64) -> Option<f64> {
    (d > 0.0).then(|| n / d)
}

/// Per k: every window's (F, F_lines, F_str, A_const).
type WindowLists = BTreeMap<u32, Vec<(u64, u64, f64, u64)>>;

/// Windows of `2^k` accesses of one sequence (constants ride with the next
/// access), for every k in `lo..=hi`. Returns per k: list of (F, F_lines,
/// F_str, A_const).
fn windows(seq: &[Item], lo: u32, hi: u32) -> WindowLists {
    // Attach constants to the following access.
    let mut accesses: Vec<(u64, LoadClass, u64)> = Vec::new(); // addr, class, const
    let mut pending = 0;
    for it in seq {
        if it.class == LoadClass::Constant {
            pending += 1 + it.implied;
        } else {
            accesses.push((it.addr, it.class, pending + it.implied));
            pending = 0;
        }
    }
    let mut out = BTreeMap::new();
    for k in lo..=hi {
        let size = 1usize << k;
        let mut list = Vec::new();
        for w in accesses.chunks(size) {
            if w.len() < size {
                continue;
            }
            let mut per_addr: HashMap<u64, (u64, u64)> = HashMap::new();
            let mut lines = HashSet::new();
            let mut a_const = 0;
            for &(addr, class, c) in w {
                let e = per_addr.entry(addr).or_default();
                if class == LoadClass::Strided {
                    e.0 += 1;
                } else {
                    e.1 += 1;
                }
                lines.insert(addr >> 6);
                a_const += c;
            }
            let f_str: f64 = per_addr
                .values()
                .map(|&(s, i)| s as f64 / (s + i) as f64)
                .sum();
            list.push((per_addr.len() as u64, lines.len() as u64, f_str, a_const));
        }
        out.insert(k, list);
    }
    out
}

fn rows_of(windows: &WindowLists, from: u32) -> Vec<Row> {
    let mut rows = Vec::new();
    for (&k, list) in windows {
        if k < from || list.is_empty() {
            continue;
        }
        rows.push(row(k, list));
    }
    rows
}

fn row(k: u32, list: &[(u64, u64, f64, u64)]) -> Row {
    let n = list.len() as f64;
    let mut r = Row {
        k,
        windows: list.len() as u64,
        ..Row::default()
    };
    for &(f, lines, f_str, a_const) in list {
        let f_irr = f as f64 - f_str;
        r.f += f as f64 / n;
        r.f_lines += lines as f64 / n;
        r.f_str += f_str / n;
        r.f_irr += f_irr / n;
        r.f_str_frac += f_str / f as f64 / n;
        r.f_irr_frac += f_irr / f as f64 / n;
        r.d_f += f as f64 / ((1u64 << k) + a_const) as f64 / n;
        r.a_const += a_const as f64 / n;
    }
    r
}

/// LRU stack distance of each access (None for cold), over blocks.
fn stack_distances(blocks: &[u64]) -> Vec<Option<u64>> {
    let mut stack: Vec<u64> = Vec::new();
    blocks
        .iter()
        .map(|&b| {
            let d = stack.iter().rev().position(|&x| x == b).map(|i| i as u64);
            stack.retain(|&x| x != b);
            stack.push(b);
            d
        })
        .collect()
}

/// The reference analysis of `samples` (each a list of records; an empty
/// list is an empty sample).
pub fn analyze(
    header: &TraceHeader,
    samples: &[Vec<Rec>],
    total_samples: u64,
    executions: u64,
    params: &Params,
) -> Reference {
    let full = header.sampling.is_full();
    let w = if full {
        u64::MAX
    } else {
        header.sampling.window
    };
    let max_k = 20u32.min(63 - w.leading_zeros());
    let code_k = params
        .code_window_k
        .unwrap_or(63 - w.min(1024).leading_zeros());

    let infos = load_infos(header, params);
    let mut r = Reference::default();
    let pieces = split_pieces(samples, total_samples, &infos, &mut r);
    let sums = accumulate(&pieces.pieces, header, params, max_k, code_k, &mut r);

    let total = (r.a + r.a_const) as f64;
    r.kappa = ratio(r.a_const as f64, r.a as f64).map(|x| 1.0 + x);
    r.rho = if full {
        Some(1.0)
    } else {
        let denominator = match header.backend {
            memgaze_trace::Backend::Pt => pieces.a_all + pieces.a_const_all,
            _ => pieces.all_records,
        };
        // Fewer executions than recorded accesses: inconsistent totals,
        // no ρ (docs/METRICS.md, "Counting accesses").
        if executions < denominator {
            None
        } else {
            ratio(executions as f64, denominator as f64)
        }
    };
    r.f = sums.per_addr.len() as u64;
    r.f_lines = sums.lines_all.len() as u64;
    r.f_str = sums
        .per_addr
        .values()
        .map(|&(s, i)| s as f64 / (s + i) as f64)
        .sum();
    r.f_irr = r.f as f64 - r.f_str;
    r.d_f = if r.a == 0 {
        None
    } else {
        ratio(r.f as f64, total)
    };
    let d_values = &sums.d_values;
    r.d_mean = ratio(d_values.iter().sum::<u64>() as f64, d_values.len() as f64);
    r.d_max = d_values.iter().copied().max();
    let bins = |d: u64| {
        if d == 0 {
            0
        } else {
            64 - d.leading_zeros() as usize
        }
    };
    if let Some(max) = r.d_max {
        r.d_bins = vec![0; bins(max) + 1];
        for &d in d_values {
            r.d_bins[bins(d)] += 1;
        }
    }
    r.rows = rows_of(&sums.all_windows, 3)
        .into_iter()
        .filter(|row| row.k <= max_k)
        .collect();
    r.functions = function_rows(header, &infos, &sums, max_k, code_k);
    r.loads = load_rows(header, &infos, &sums);
    r.regions = hot_regions(header, &infos, &sums, params);
    interval_levels(&sums.piece_stats, &mut r);
    r
}

/// Each load site's class, implied count, function and whether the
/// `--functions` filter keeps it.
fn load_infos(header: &TraceHeader, params: &Params) -> Vec<Info> {
    let function_of = |ip: u64| {
        header
            .functions
            .iter()
            .enumerate()
            .filter(|(_, f)| f.start <= ip && ip < f.end)
            .max_by_key(|(_, f)| f.start)
            .map(|(i, _)| i)
    };
    header
        .loads
        .iter()
        .map(|l| {
            let function = l.function.map(|f| f as usize).or_else(|| function_of(l.ip));
            let included = match (&params.functions, function) {
                (None, _) => true,
                (Some(p), Some(f)) => glob_match(p, &header.functions[f].name),
                (Some(_), None) => false,
            };
            Info {
                class: l.class,
                implied: u64::from(l.implied),
                function,
                included,
            }
        })
        .collect()
}

/// The pieces (one per thread of a sample, in order; empty samples are
/// empty pieces) and the counts before the filter.
struct Pieces {
    pieces: Vec<Vec<Item>>,
    all_records: u64,
    a_all: u64,
    a_const_all: u64,
}

/// Splits the samples into pieces, counting empty samples, filtered-out
/// records and records outside functions into `r`.
fn split_pieces(
    samples: &[Vec<Rec>],
    total_samples: u64,
    infos: &[Info],
    r: &mut Reference,
) -> Pieces {
    let mut pieces: Vec<Vec<Item>> = Vec::new();
    let mut all_records = 0u64;
    let mut a_all = 0u64;
    let mut a_const_all = 0u64;
    for sample in samples {
        if sample.is_empty() {
            pieces.push(Vec::new());
            r.empty_samples += 1;
            continue;
        }
        let mut threads: Vec<u32> = Vec::new();
        for rec in sample {
            if !threads.contains(&rec.thread) {
                threads.push(rec.thread);
            }
        }
        for t in threads {
            let mut piece = Vec::new();
            for rec in sample.iter().filter(|x| x.thread == t) {
                all_records += 1;
                let info = &infos[rec.load as usize];
                if info.class == LoadClass::Constant {
                    a_const_all += 1 + info.implied;
                } else {
                    a_all += 1;
                    a_const_all += info.implied;
                }
                if !info.included {
                    r.filtered_out += 1;
                    continue;
                }
                if info.function.is_none() {
                    r.outside_functions += 1;
                }
                piece.push(Item {
                    load: rec.load as usize,
                    addr: rec.addr,
                    class: info.class,
                    implied: info.implied,
                    function: info.function,
                });
            }
            pieces.push(piece);
        }
    }
    for _ in samples.len() as u64..total_samples {
        pieces.push(Vec::new());
        r.empty_samples += 1;
    }
    r.samples = pieces.len() as u64;
    Pieces {
        pieces,
        all_records,
        a_all,
        a_const_all,
    }
}

/// What the pieces add up to.
struct Sums {
    /// Address → (strided, irregular) accesses.
    per_addr: HashMap<u64, (u64, u64)>,
    /// Line → (a, d_sum, d_count).
    lines_all: BTreeMap<u64, (u64, u64, u64)>,
    load_count: Vec<u64>,
    load_d: Vec<(u64, u64)>,
    /// Per function: (a, a_const, d_sum, d_count).
    function_acc: Vec<(u64, u64, u64, u64)>,
    function_windows: Vec<WindowLists>,
    all_windows: WindowLists,
    d_values: Vec<u64>,
    /// (line, load) → count.
    region_code: HashMap<(u64, usize), u64>,
    /// Per piece: (a, a_const, addresses, lines).
    piece_stats: Vec<(u64, u64, HashSet<u64>, HashSet<u64>)>,
}

/// Adds up every piece: counts, reuse distances, trace and function
/// windows; the trace's counts go into `r`.
fn accumulate(
    pieces: &[Vec<Item>],
    header: &TraceHeader,
    params: &Params,
    max_k: u32,
    code_k: u32,
    r: &mut Reference,
) -> Sums {
    let function_lo = code_k.min(3);
    let function_top = max_k.max(code_k);
    let mut per_addr: HashMap<u64, (u64, u64)> = HashMap::new();
    let mut lines_all: BTreeMap<u64, (u64, u64, u64)> = BTreeMap::new(); // a, d_sum, d_count
    let mut load_count = vec![0u64; header.loads.len()];
    let mut load_d = vec![(0u64, 0u64); header.loads.len()];
    let mut function_acc: Vec<(u64, u64, u64, u64)> = vec![(0, 0, 0, 0); header.functions.len()];
    let mut function_windows: Vec<WindowLists> = vec![BTreeMap::new(); header.functions.len()];
    let mut all_windows: WindowLists = BTreeMap::new();
    let mut d_values: Vec<u64> = Vec::new();
    let mut region_code: HashMap<(u64, usize), u64> = HashMap::new(); // (line, load) -> count
    let mut piece_stats: Vec<(u64, u64, HashSet<u64>, HashSet<u64>)> = Vec::new();
    for piece in pieces {
        let mut a = 0;
        let mut a_const = 0;
        let mut addrs = HashSet::new();
        let mut lines = HashSet::new();
        for it in piece {
            r.records += 1;
            load_count[it.load] += 1;
            if it.class == LoadClass::Constant {
                r.a_const += 1 + it.implied;
                a_const += 1 + it.implied;
                if let Some(f) = it.function {
                    function_acc[f].1 += 1 + it.implied;
                }
                continue;
            }
            r.a += 1;
            r.a_const += it.implied;
            a += 1;
            a_const += it.implied;
            if let Some(f) = it.function {
                function_acc[f].0 += 1;
                function_acc[f].1 += it.implied;
            }
            let e = per_addr.entry(it.addr).or_default();
            if it.class == LoadClass::Strided {
                e.0 += 1;
            } else {
                e.1 += 1;
            }
            lines_all.entry(it.addr >> 6).or_default().0 += 1;
            *region_code.entry((it.addr >> 6, it.load)).or_default() += 1;
            addrs.insert(it.addr);
            lines.insert(it.addr >> 6);
        }
        piece_stats.push((a, a_const, addrs, lines));

        // Reuse distance over blocks of the piece's accesses.
        let accesses: Vec<&Item> = piece
            .iter()
            .filter(|it| it.class != LoadClass::Constant)
            .collect();
        let blocks: Vec<u64> = accesses.iter().map(|it| it.addr / params.block).collect();
        let ds = stack_distances(&blocks);
        let mut reused: HashMap<u64, bool> = HashMap::new();
        for ((it, d), b) in accesses.iter().zip(&ds).zip(&blocks) {
            let e = reused.entry(*b).or_insert(false);
            match d {
                Some(d) => {
                    *e = true;
                    d_values.push(*d);
                    let l = lines_all.get_mut(&(it.addr >> 6)).unwrap();
                    l.1 += d;
                    l.2 += 1;
                    load_d[it.load].0 += d;
                    load_d[it.load].1 += 1;
                    if let Some(f) = it.function {
                        function_acc[f].2 += d;
                        function_acc[f].3 += 1;
                    }
                }
                None => r.cold += 1,
            }
        }
        r.captures += reused.values().filter(|&&x| x).count() as u64;
        r.survivals += reused.values().filter(|&&x| !x).count() as u64;

        // Trace windows and function windows.
        for (k, list) in windows(piece, 3, max_k.max(3)) {
            all_windows.entry(k).or_default().extend(list);
        }
        for (f, fw) in function_windows.iter_mut().enumerate() {
            let sub: Vec<Item> = piece
                .iter()
                .copied()
                .filter(|it| it.function == Some(f))
                .collect();
            for (k, list) in windows(&sub, function_lo, function_top) {
                fw.entry(k).or_default().extend(list);
            }
        }
    }
    Sums {
        per_addr,
        lines_all,
        load_count,
        load_d,
        function_acc,
        function_windows,
        all_windows,
        d_values,
        region_code,
        piece_stats,
    }
}

/// One row per function with loads, most accesses first.
fn function_rows(
    header: &TraceHeader,
    infos: &[Info],
    sums: &Sums,
    max_k: u32,
    code_k: u32,
) -> Vec<Function> {
    let mut functions = Vec::new();
    for (f, func) in header.functions.iter().enumerate() {
        let (a, a_const, d_sum, d_count) = sums.function_acc[f];
        if a + a_const == 0 {
            continue;
        }
        let fw = &sums.function_windows[f];
        let code = fw.get(&code_k).cloned().unwrap_or_default();
        let code_row = (!code.is_empty()).then(|| row(code_k, &code));
        functions.push(Function {
            name: func.name.clone(),
            a,
            a_const,
            d_f: code_row.as_ref().map(|x| x.d_f),
            f_str_frac: code_row.as_ref().map(|x| x.f_str_frac),
            f_irr_frac: code_row.as_ref().map(|x| x.f_irr_frac),
            code_windows: code.len() as u64,
            d_mean: ratio(d_sum as f64, d_count as f64),
            rows: rows_of(fw, 3)
                .into_iter()
                .filter(|x| x.k <= max_k)
                .collect(),
            hot_loads: hot_loads(header, infos, sums, f),
        });
    }
    functions.sort_by(|x, y| {
        (y.a, y.a_const)
            .cmp(&(x.a, x.a_const))
            .then(x.name.cmp(&y.name))
    });
    functions
}

/// Function `f`'s three load sites with most records, most first, then
/// by address.
fn hot_loads(
    header: &TraceHeader,
    infos: &[Info],
    sums: &Sums,
    f: usize,
) -> Vec<(u64, Option<String>, u64)> {
    let mut hot: Vec<(u64, Option<String>, u64)> = header
        .loads
        .iter()
        .enumerate()
        .filter(|&(i, _)| infos[i].function == Some(f) && sums.load_count[i] > 0)
        .map(|(i, l)| (l.ip, l.line.clone(), sums.load_count[i]))
        .collect();
    hot.sort_by(|x, y| y.2.cmp(&x.2).then(x.0.cmp(&y.0)));
    hot.truncate(3);
    hot
}

/// The loads (and implied rows), merged by (ip, class, implied).
fn load_rows(
    header: &TraceHeader,
    infos: &[Info],
    sums: &Sums,
) -> Vec<(u64, LoadClass, u64, bool, Option<f64>)> {
    let mut loads: BTreeMap<(u64, LoadClass, bool), (u64, u64, u64)> = BTreeMap::new();
    for (i, l) in header.loads.iter().enumerate() {
        if let Some(p) = l.proxy {
            let count = sums.load_count[p as usize];
            if count > 0 && infos[i].included {
                loads.entry((l.ip, l.class, true)).or_default().0 += count;
            }
        } else if sums.load_count[i] > 0 {
            let e = loads.entry((l.ip, l.class, false)).or_default();
            e.0 += sums.load_count[i];
            e.1 += sums.load_d[i].0;
            e.2 += sums.load_d[i].1;
        }
    }
    loads
        .into_iter()
        .map(|((ip, class, implied), (count, ds, dc))| {
            (ip, class, count, implied, ratio(ds as f64, dc as f64))
        })
        .collect()
}

/// The hot regions, by start.
fn hot_regions(header: &TraceHeader, infos: &[Info], sums: &Sums, params: &Params) -> Vec<Region> {
    let lines_all = &sums.lines_all;
    let mut regions: Vec<Region> = zoom(
        lines_all,
        params.threshold_percent,
        params.min_page.trailing_zeros(),
    )
    .into_iter()
    .map(|(set, depth)| {
        let a: u64 = set.iter().map(|l| lines_all[l].0).sum();
        let ds: u64 = set.iter().map(|l| lines_all[l].1).sum();
        let dc: u64 = set.iter().map(|l| lines_all[l].2).sum();
        let mut by_function: BTreeMap<String, u64> = BTreeMap::new();
        for (&(line, load), &count) in &sums.region_code {
            if set.contains(&line) {
                let name = infos[load]
                    .function
                    .map_or("?".to_string(), |f| header.functions[f].name.clone());
                *by_function.entry(name).or_default() += count;
            }
        }
        let mut functions: Vec<(String, u64)> = by_function.into_iter().collect();
        functions.sort_by(|x, y| y.1.cmp(&x.1).then(x.0.cmp(&y.0)));
        functions.truncate(5);
        Region {
            start: set.iter().min().unwrap() << 6,
            end: (set.iter().max().unwrap() + 1) << 6,
            a,
            blocks: set.len() as u64,
            d_mean: ratio(ds as f64, dc as f64),
            depth,
            functions,
        }
    })
    .collect();
    regions.sort_by_key(|x| x.start);
    regions
}

/// The interval tree's levels (complete nodes of 2^h pieces) and root.
fn interval_levels(piece_stats: &[(u64, u64, HashSet<u64>, HashSet<u64>)], r: &mut Reference) {
    let n = piece_stats.len();
    let mut h = 0;
    while n > 0 && (1usize << h) <= n {
        let size = 1usize << h;
        let mut level = Level {
            h,
            ..Level::default()
        };
        let mut df_sum = 0.0;
        let mut df_n = 0;
        for node in piece_stats.chunks(size).filter(|c| c.len() == size) {
            let a: u64 = node.iter().map(|p| p.0).sum();
            let c: u64 = node.iter().map(|p| p.1).sum();
            let f = node
                .iter()
                .flat_map(|p| p.2.iter())
                .collect::<HashSet<_>>()
                .len();
            level.nodes += 1;
            level.a += a as f64;
            level.f += f as f64;
            // ΔF = F / (κ·A) is undefined when A = 0 (docs/METRICS.md), even
            // with Constant loads in the node.
            if a > 0 {
                df_sum += f as f64 / (a + c) as f64;
                df_n += 1;
            }
        }
        level.a /= level.nodes as f64;
        level.f /= level.nodes as f64;
        level.d_f = (df_n > 0).then(|| df_sum / df_n as f64);
        r.levels.push(level);
        h += 1;
    }
    if n > 0 {
        let a = piece_stats.iter().map(|p| p.0).sum();
        let f = piece_stats
            .iter()
            .flat_map(|p| p.2.iter())
            .collect::<HashSet<_>>()
            .len() as u64;
        let l = piece_stats
            .iter()
            .flat_map(|p| p.3.iter())
            .collect::<HashSet<_>>()
            .len() as u64;
        r.root = Some((n as u64, a, f, l));
    }
}

/// Naive zoom: returns leaves as (set of lines, depth).
fn zoom(lines: &BTreeMap<u64, (u64, u64, u64)>, t: f64, min_shift: u32) -> Vec<(Vec<u64>, u32)> {
    let min_shift = min_shift.max(6);
    let mut shifts = vec![];
    let mut s = 30u32.max(min_shift);
    loop {
        shifts.push(s);
        if s == min_shift {
            break;
        }
        s = s.saturating_sub(3).max(min_shift);
    }
    let mut out = Vec::new();
    if lines.is_empty() {
        return out;
    }
    let all: Vec<u64> = lines.keys().copied().collect();
    let total = lines.values().map(|v| v.0).sum();
    region(lines, &all, total, 0, 0, &shifts, t, &mut out);
    out
}

#[allow(clippy::too_many_arguments)]
fn region(
    lines: &BTreeMap<u64, (u64, u64, u64)>,
    set: &[u64],
    total: u64,
    level: usize,
    depth: u32,
    shifts: &[u32],
    t: f64,
    out: &mut Vec<(Vec<u64>, u32)>,
) {
    let shift = shifts[level];
    let mut pages: BTreeMap<u64, Vec<u64>> = BTreeMap::new();
    for &l in set {
        pages.entry((l << 6) >> shift).or_default().push(l);
    }
    let mut runs: Vec<(u64, Vec<u64>)> = Vec::new(); // last page, lines
    for (page, ls) in pages {
        match runs.last_mut() {
            Some((last, run)) if page == *last + 1 => {
                *last = page;
                run.extend(ls);
            }
            _ => runs.push((page, ls)),
        }
    }
    let hot: Vec<Vec<u64>> = runs
        .into_iter()
        .map(|(_, run)| run)
        .filter(|run| {
            run.iter().map(|l| lines[l].0).sum::<u64>() as f64 >= t / 100.0 * total as f64
        })
        .collect();
    if hot.is_empty() {
        out.push((set.to_vec(), depth));
        return;
    }
    for run in hot {
        let same = run.len() == set.len();
        let child_depth = if same { depth } else { depth + 1 };
        let a = run.iter().map(|l| lines[l].0).sum();
        if level + 1 < shifts.len() {
            region(lines, &run, a, level + 1, child_depth, shifts, t, out);
        } else {
            out.push((run, child_depth));
        }
    }
}
