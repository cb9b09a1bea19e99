//! Terminal rendering of an [`Analysis`] (`analyze --format table`): a
//! summary, then one table per view, hottest rows first, in the spirit of
//! `perf report` and criterion. Undefined values print as `–`.

use super::result::{Analysis, WindowRow};
use std::fmt::Write;

/// How to render.
#[derive(Clone, Copy, Debug)]
pub struct TableOptions {
    /// Bold section titles (ANSI) — for terminals.
    pub color: bool,
    /// Rows per table for the long ones (functions, loads, regions).
    pub top: usize,
}

impl Default for TableOptions {
    fn default() -> Self {
        TableOptions {
            color: false,
            top: 20,
        }
    }
}

/// The whole report as text.
pub fn render(a: &Analysis, options: &TableOptions) -> String {
    let mut out = String::new();
    render_header(&mut out, a);
    render_summary(&mut out, a, options);
    render_windows(&mut out, a, options);
    render_functions(&mut out, a, options);
    render_locality(&mut out, a, options);
    render_loads(&mut out, a, options);
    render_regions(&mut out, a, options);
    render_reuse(&mut out, a, options);
    render_notes(&mut out, a, options);
    out
}

/// A section title (bold for a terminal), after a blank line.
fn title(out: &mut String, options: &TableOptions, text: &str) {
    if options.color {
        let _ = writeln!(out, "\n\x1b[1m{text}\x1b[0m");
    } else {
        let _ = writeln!(out, "\n{text}");
    }
}

/// The first lines: backend, sampling, ρ, the binary, command and filter.
fn render_header(out: &mut String, a: &Analysis) {
    let s = &a.summary;
    let run = &a.run;
    let sampling = if run.full {
        "full trace".to_string()
    } else {
        format!(
            "sampled, w = {} of every {}",
            count(run.window.unwrap_or(0)),
            count(run.period.unwrap_or(0))
        )
    };
    let _ = writeln!(
        out,
        "memgaze analysis: {} backend, {sampling}, {}, ρ = {}",
        run.backend,
        samples_phrase(s.samples, a.coverage.trace_samples),
        num(s.rho)
    );
    if let Some(binary) = &run.binary {
        let _ = writeln!(out, "binary:  {binary}");
    }
    if !run.command.is_empty() {
        let _ = writeln!(out, "command: {}", run.command.join(" "));
    }
    if let Some(filter) = &run.functions_filter {
        let _ = writeln!(out, "functions matching: {filter}");
    }
}

/// The summary: the trace's counts and metrics, one per line.
fn render_summary(out: &mut String, a: &Analysis, options: &TableOptions) {
    let s = &a.summary;
    title(out, options, "Summary");
    let _ = writeln!(
        out,
        "  A        {:>10}   observed accesses (Strided + Irregular)",
        count(s.a)
    );
    let _ = writeln!(
        out,
        "  A_const  {:>10}   Constant loads: {} of all, κ = {}",
        count(s.a_const),
        pct(s.a_const_frac),
        num(s.kappa)
    );
    let _ = writeln!(
        out,
        "  Â        {:>10}   estimated executed loads, ρ·(A + A_const)",
        s.a_hat.map_or("–".to_string(), |x| count(x.round() as u64))
    );
    let _ = writeln!(
        out,
        "  F        {:>10}   distinct addresses ({} lines of 64 B), F̂ = ρ·F = {}",
        count(s.f),
        count(s.f_lines),
        s.f_hat.map_or("–".to_string(), |x| count(x.round() as u64))
    );
    let _ = writeln!(
        out,
        "  F_str    {:>10}   {} strided, F_irr {} ({} irregular)",
        num(Some(s.f_str)),
        pct(Some(s.f_str_frac)),
        num(Some(s.f_irr)),
        pct(Some(s.f_irr_frac))
    );
    let _ = writeln!(
        out,
        "  ΔF       {:>10}   new data per load, F / (A + A_const)",
        num(s.d_f)
    );
    let _ = writeln!(
        out,
        "  D        {:>10}   mean reuse distance in {}-byte blocks, max {}",
        num(s.d_mean),
        a.reuse.block,
        s.d_max.map_or("–".to_string(), count)
    );
    if !s.coverage_by_object.is_empty() {
        let _ = writeln!(
            out,
            "  traced   {}: share of each object's executed loads",
            crate::coverage_by_object_line(&s.coverage_by_object)
        );
    }
    if let (Some(sizes), Some(rate)) = (&a.run.cache_sizes, s.spatial_rate) {
        let _ = writeln!(
            out,
            "  MR       L1 {} ({}), L2 {} ({}), LLC {} ({}): whole-run miss ratios, {}",
            pct(s.whole_run.mr_l1),
            bytes(sizes.l1),
            pct(s.whole_run.mr_l2),
            bytes(sizes.l2),
            pct(s.whole_run.mr_llc),
            bytes(sizes.llc),
            if rate >= 1.0 {
                "exact (every access)".to_string()
            } else {
                format!(
                    "estimated from {} accesses on 1/{} of the blocks",
                    count(s.tracked_accesses.unwrap_or(0)),
                    (1.0 / rate).round()
                )
            }
        );
    }
}

/// Whole-run miss ratios per function and the source lines with the most
/// estimated misses (when the analysis has a whole-run curve).
fn render_locality(out: &mut String, a: &Analysis, options: &TableOptions) {
    let with_curve: Vec<_> = a
        .functions
        .iter()
        .filter(|f| f.whole_run.mr_l1.is_some())
        .collect();
    if !with_curve.is_empty() {
        title(
            out,
            options,
            "Whole-run miss ratios by function (fully associative LRU at the L1/L2/LLC sizes)",
        );
        let _ = writeln!(
            out,
            "  {:>10} {:>7} {:>7} {:>7}  function",
            "A", "MR_L1", "MR_L2", "MR_LLC"
        );
        for f in with_curve.iter().take(options.top) {
            let _ = writeln!(
                out,
                "  {:>10} {:>7} {:>7} {:>7}  {}",
                count(f.a),
                pct(f.whole_run.mr_l1),
                pct(f.whole_run.mr_l2),
                pct(f.whole_run.mr_llc),
                f.name
            );
        }
    }
    if !a.lines.is_empty() {
        title(
            out,
            options,
            "Source lines (estimated accesses and misses at the L1/L2/LLC sizes)",
        );
        let _ = writeln!(
            out,
            "  {:>12} {:>12} {:>12} {:>12}  line",
            "Â", "misses L1", "misses L2", "misses LLC"
        );
        let round = |x: f64| count(x.max(0.0).round() as u64);
        for l in a.lines.iter().take(options.top) {
            let _ = writeln!(
                out,
                "  {:>12} {:>12} {:>12} {:>12}  {}",
                round(l.a_hat),
                round(l.misses_l1),
                round(l.misses_l2),
                round(l.misses_llc),
                l.line
            );
        }
    }
}

/// The trace windows, then the execution intervals (when a trace has more
/// than one sample).
fn render_windows(out: &mut String, a: &Analysis, options: &TableOptions) {
    title(
        out,
        options,
        "Trace windows (metrics per window of 2^k accesses, averaged)",
    );
    if a.trace_windows.is_empty() {
        let _ = writeln!(out, "  (no sample holds a window of 8 accesses)");
    } else {
        window_table(out, &a.trace_windows, true);
    }
    let inter: Vec<_> = a.intervals.levels.iter().filter(|l| l.h >= 1).collect();
    if !inter.is_empty() {
        title(
            out,
            options,
            "Execution intervals (2^h consecutive samples; F̂ = ρ·F estimates the executed interval)",
        );
        let _ = writeln!(
            out,
            "  {:>3} {:>9} {:>8} {:>10} {:>10} {:>10} {:>8}",
            "h", "samples", "nodes", "A", "F", "F̂", "ΔF"
        );
        for l in inter {
            let _ = writeln!(
                out,
                "  {:>3} {:>9} {:>8} {:>10} {:>10} {:>10} {:>8}",
                l.h,
                count(1u64 << l.h.min(63)),
                count(l.nodes),
                count(l.a.round() as u64),
                num(Some(l.f)),
                l.f_hat.map_or("–".to_string(), |x| count(x.round() as u64)),
                num(l.d_f)
            );
        }
    }
}

/// The functions, most accesses first (at most `options.top`).
fn render_functions(out: &mut String, a: &Analysis, options: &TableOptions) {
    let s = &a.summary;
    let run = &a.run;
    title(
        out,
        options,
        &format!(
            "Functions (code windows of W_c = {} accesses; {} shown of {})",
            count(1u64 << run.code_window_k.min(63)),
            a.functions.len().min(options.top),
            a.functions.len()
        ),
    );
    if a.functions.is_empty() {
        let _ = writeln!(out, "  (no records in known functions)");
    } else {
        let _ = writeln!(
            out,
            "  {:>10} {:>7} {:>8} {:>8} {:>7} {:>7} {:>8} {:>8}  function",
            "A", "share", "A_const%", "ΔF@W_c", "F_str%", "F_irr%", "D mean", "windows"
        );
        for f in a.functions.iter().take(options.top) {
            let share = (s.a > 0).then(|| f.a as f64 / s.a as f64);
            let _ = writeln!(
                out,
                "  {:>10} {:>7} {:>8} {:>8} {:>7} {:>7} {:>8} {:>8}  {}",
                count(f.a),
                pct(share),
                pct(f.a_const_frac),
                num(f.d_f),
                pct(f.f_str_frac),
                pct(f.f_irr_frac),
                num(f.d_mean),
                count(f.code_windows),
                f.name
            );
            if let Some(line) = f.hot_loads.iter().find_map(|l| l.line.as_deref()) {
                let _ = writeln!(
                    out,
                    "  {:>10} {:>7} {:>8} {:>8} {:>7} {:>7} {:>8} {:>8}    at {line}",
                    "", "", "", "", "", "", "", ""
                );
            }
        }
    }
}

/// The loads, most executed first (at most `options.top`).
fn render_loads(out: &mut String, a: &Analysis, options: &TableOptions) {
    let mut loads: Vec<_> = a.loads.iter().collect();
    loads.sort_by(|x, y| y.count.cmp(&x.count).then(x.ip.cmp(&y.ip)));
    let recorded: u64 = a.loads.iter().filter(|l| !l.implied).map(|l| l.count).sum();
    title(
        out,
        options,
        &format!(
            "Loads ({} shown of {}, most executed first)",
            loads.len().min(options.top),
            loads.len()
        ),
    );
    if loads.is_empty() {
        let _ = writeln!(out, "  (none)");
    } else {
        let _ = writeln!(
            out,
            "  {:>14} {:<9} {:>10} {:>7} {:>8}  function / line",
            "ip", "class", "count", "share", "D mean"
        );
        for l in loads.iter().take(options.top) {
            let share = (recorded > 0).then(|| l.count as f64 / recorded as f64);
            let class = if l.implied {
                format!("{}*", l.class.as_str())
            } else {
                l.class.as_str().to_string()
            };
            let _ = writeln!(
                out,
                "  {:>14} {:<9} {:>10} {:>7} {:>8}  {}{}",
                format!("{:#x}", l.ip),
                class,
                count(l.count),
                pct(share),
                num(l.d_mean),
                l.function.as_deref().unwrap_or("?"),
                l.line
                    .as_deref()
                    .map(|x| format!("  {x}"))
                    .unwrap_or_default()
            );
        }
        if a.loads.iter().any(|l| l.implied) {
            let _ = writeln!(
                out,
                "  * uninstrumented Constant load; count implied by its basic block's proxy"
            );
        }
    }
}

/// The hot regions, most accesses first (at most `options.top`).
fn render_regions(out: &mut String, a: &Analysis, options: &TableOptions) {
    let run = &a.run;
    title(
        out,
        options,
        &format!(
            "Hot regions (zoom threshold {}% of the parent region, pages down to {} B)",
            run.region_threshold_percent, run.region_min_page
        ),
    );
    if a.regions.is_empty() {
        let _ = writeln!(out, "  (no accesses)");
    } else {
        let mut regions: Vec<_> = a.regions.iter().collect();
        regions.sort_by(|x, y| y.a.cmp(&x.a).then(x.start.cmp(&y.start)));
        let _ = writeln!(
            out,
            "  {:>33} {:>9} {:>10} {:>7} {:>8} {:>8} {:>8}  functions",
            "range", "size", "A", "share", "blocks", "A/block", "D mean"
        );
        for r in regions.iter().take(options.top) {
            let functions: Vec<String> = r
                .functions
                .iter()
                .take(3)
                .map(|f| {
                    let share = if r.a > 0 {
                        f.a as f64 / r.a as f64
                    } else {
                        0.0
                    };
                    format!("{} {}", f.name, pct(Some(share)))
                })
                .collect();
            let _ = writeln!(
                out,
                "  {:>33} {:>9} {:>10} {:>7} {:>8} {:>8} {:>8}  {}",
                format!("{:#x}..{:#x}", r.start, r.end),
                bytes(r.end - r.start),
                count(r.a),
                pct(Some(r.a_frac)),
                count(r.blocks),
                num(Some(r.a_per_block)),
                num(r.d_mean),
                functions.join(", ")
            );
        }
        let covered: f64 = a.regions.iter().map(|r| r.a_frac).sum();
        let _ = writeln!(
            out,
            "  regions cover {} of all accesses",
            pct(Some(covered))
        );
    }
}

/// The reuse-distance histogram.
fn render_reuse(out: &mut String, a: &Analysis, options: &TableOptions) {
    title(
        out,
        options,
        &format!(
            "Reuse distance D ({}-byte blocks, within samples; {} cold accesses, {} captures, {} survivals)",
            a.reuse.block,
            count(a.reuse.cold),
            count(a.reuse.captures),
            count(a.reuse.survivals)
        ),
    );
    let total: u64 = a.reuse.bins.iter().map(|b| b.count).sum();
    if total == 0 {
        let _ = writeln!(out, "  (no reuse within a sample)");
    } else {
        let widest = a
            .reuse
            .bins
            .iter()
            .map(|b| b.count)
            .max()
            .unwrap_or(1)
            .max(1);
        for b in &a.reuse.bins {
            let label = if b.lo == b.hi {
                count(b.lo)
            } else {
                format!("{}–{}", count(b.lo), count(b.hi))
            };
            let bar = "█".repeat(((b.count as f64 / widest as f64) * 40.0).round() as usize);
            let _ = writeln!(
                out,
                "  {:>15} {:>10} {:>7}  {bar}",
                label,
                count(b.count),
                pct(Some(b.count as f64 / total as f64))
            );
        }
    }
}

/// The notes of the coverage, if any.
fn render_notes(out: &mut String, a: &Analysis, options: &TableOptions) {
    let c = &a.coverage;
    let mut notes = c.notes.clone();
    if let Some(outside) = c.outside_binary {
        notes.insert(
            0,
            format!(
                "{} loads executed outside the binary (ld.so, libc, …): counted, not analysed",
                count(outside)
            ),
        );
    }
    if c.empty_samples > 0 {
        notes.push(format!(
            "{} samples hold no records",
            count(c.empty_samples)
        ));
    }
    if !notes.is_empty() {
        title(out, options, "Notes");
        for n in notes {
            let _ = writeln!(out, "  • {n}");
        }
    }
}

fn window_table(out: &mut String, rows: &[WindowRow], lines: bool) {
    let _ = writeln!(
        out,
        "  {:>3} {:>9} {:>9} {:>10} {:>10} {:>8} {:>7} {:>7} {:>9}",
        "k",
        "window",
        "windows",
        "F",
        if lines { "F_lines" } else { "" },
        "ΔF",
        "F_str%",
        "F_irr%",
        "A_const"
    );
    for r in rows {
        let _ = writeln!(
            out,
            "  {:>3} {:>9} {:>9} {:>10} {:>10} {:>8} {:>7} {:>7} {:>9}",
            r.k,
            count(1u64 << r.k.min(63)),
            count(r.windows),
            num(Some(r.f)),
            r.f_lines.map_or(String::new(), |x| num(Some(x))),
            num(Some(r.d_f)),
            pct(Some(r.f_str_frac)),
            pct(Some(r.f_irr_frac)),
            num(Some(r.a_const))
        );
    }
}

/// A count, exact below 100 000, else 3 significant digits with an SI
/// suffix (`123 K`, `50.0 M`, `1.20 G`).
pub(crate) fn count(n: u64) -> String {
    if n < 100_000 {
        return n.to_string();
    }
    let (value, suffix) = if n < 1_000_000 {
        (n as f64 / 1e3, "K")
    } else if n < 1_000_000_000 {
        (n as f64 / 1e6, "M")
    } else if n < 1_000_000_000_000 {
        (n as f64 / 1e9, "G")
    } else {
        (n as f64 / 1e12, "T")
    };
    if value >= 100.0 {
        format!("{value:.0} {suffix}")
    } else if value >= 10.0 {
        format!("{value:.1} {suffix}")
    } else {
        format!("{value:.2} {suffix}")
    }
}

/// A real number with 3 significant digits (more for large values), `–`
/// when undefined.
pub(crate) fn num(x: Option<f64>) -> String {
    match x {
        None => "–".to_string(),
        Some(x) if !x.is_finite() => "–".to_string(),
        Some(0.0) => "0".to_string(),
        Some(x) if x.abs() >= 100_000.0 => count(x.round() as u64),
        Some(x) if x.abs() >= 100.0 => format!("{x:.0}"),
        Some(x) if x.abs() >= 10.0 => format!("{x:.1}"),
        Some(x) if x.abs() >= 1.0 => format!("{x:.2}"),
        Some(x) if x.abs() >= 0.001 => format!("{x:.3}"),
        Some(x) => format!("{x:.1e}"),
    }
}

/// A fraction as a percentage with one decimal, `–` when undefined.
pub(crate) fn pct(x: Option<f64>) -> String {
    match x {
        Some(x) if x.is_finite() => format!("{:.1}%", 100.0 * x),
        _ => "–".to_string(),
    }
}

fn bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut value = n as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit < UNITS.len() - 1 {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{n} B")
    } else {
        format!("{value:.1} {}", UNITS[unit])
    }
}

/// `N samples`, saying how many the trace held when the analysis split
/// samples per thread (docs/METRICS.md): a full trace of a 5-thread
/// program is "5 samples (1 in the trace, split per thread)", which the
/// recorder reports as one sample from 5 threads.
fn samples_phrase(samples: u64, trace_samples: u64) -> String {
    let plural = |n: u64| if n == 1 { "" } else { "s" };
    let mut phrase = format!("{} sample{}", count(samples), plural(samples));
    if trace_samples != samples {
        phrase += &format!(" ({} in the trace, split per thread)", count(trace_samples));
    }
    phrase
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn samples_split_per_thread_say_how_many_the_trace_held() {
        assert_eq!(samples_phrase(1, 1), "1 sample");
        assert_eq!(samples_phrase(20, 20), "20 samples");
        assert_eq!(
            samples_phrase(5, 1),
            "5 samples (1 in the trace, split per thread)"
        );
    }

    #[test]
    fn numbers_read_well() {
        assert_eq!(count(99_999), "99999");
        assert_eq!(count(123_456), "123 K");
        assert_eq!(count(50_000_000), "50.0 M");
        assert_eq!(count(1_500_000), "1.50 M");
        assert_eq!(count(150_000_000), "150 M");
        assert_eq!(num(None), "–");
        assert_eq!(num(Some(f64::NAN)), "–");
        assert_eq!(num(Some(0.0421)), "0.042");
        assert_eq!(num(Some(12.345)), "12.3");
        assert_eq!(pct(Some(0.5)), "50.0%");
        assert_eq!(pct(None), "–");
        assert_eq!(bytes(4096), "4.0 KiB");
    }
}
