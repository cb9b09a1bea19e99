//! What a reader should look at first: the benches ranked by a few
//! headline numbers (regressions first), the two plain sentences that open
//! each bench's section, and the glossary of the page.

use super::BenchPage;
use super::charts::{format_count, format_window};
use maud::{Markup, html};
use memgaze_analysis::{Analysis, WindowRow};
use memgaze_trace::LoadClass;
use std::cmp::Ordering;

/// The cache levels whose estimated misses head the ranking, most costly
/// first, as `(level, summary field)`.
pub const CACHE_LEVELS: [(&str, &str); 2] = [("LLC", "MR_LLC"), ("L2", "MR_L2")];

/// The numbers a bench is ranked by.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Headline {
    /// Regressions against the baseline.
    pub regressions: usize,
    /// Estimated misses per level of [`CACHE_LEVELS`], where the analysis
    /// has miss ratios.
    pub misses: [Option<f64>; 2],
    /// Code-window `F_irr%` as a fraction.
    pub f_irr_frac: Option<f64>,
    /// Code-window `ΔF`.
    pub d_f: Option<f64>,
}

/// The trace-window row whose means are comparable between sampled and
/// full traces: the largest window that fits in a code window.
pub fn code_window_row(a: &Analysis) -> Option<&WindowRow> {
    a.trace_windows
        .iter()
        .filter(|r| r.k <= a.run.code_window_k && r.windows > 0)
        .max_by_key(|r| r.k)
}

/// Estimated misses at a cache level: the miss ratio `MR_<level>` of the
/// analysis summary (read by name, absent from analyses without a
/// miss-ratio curve) times the estimated accesses `ρ·A`.
pub fn estimated_misses(a: &Analysis, field: &str) -> Option<f64> {
    let summary = serde_json::to_value(&a.summary).ok()?;
    let ratio = summary
        .get(field)
        .or_else(|| summary.get("mrc").and_then(|m| m.get(field)))?
        .as_f64()?;
    Some(ratio * a.summary.rho? * a.summary.a as f64)
}

/// Whether the bench recorded any access: without one, every ratio is
/// undefined and shown as `–`.
pub fn has_accesses(a: &Analysis) -> bool {
    a.summary.a > 0
}

/// The headline numbers of one bench.
pub fn headline(page: &BenchPage) -> Headline {
    let a = &page.bench.analysis;
    let row = code_window_row(a).filter(|_| has_accesses(a));
    Headline {
        regressions: page
            .verdict
            .as_ref()
            .and_then(|v| v.as_ref().ok())
            .map_or(0, |v| v.regressions.len()),
        misses: CACHE_LEVELS.map(|(_, field)| estimated_misses(a, field)),
        f_irr_frac: row.map(|r| r.f_irr_frac),
        d_f: row.map(|r| r.d_f),
    }
}

/// Larger first, a missing value last.
fn descending(a: Option<f64>, b: Option<f64>) -> Ordering {
    match (a, b) {
        (Some(a), Some(b)) => b.total_cmp(&a),
        (Some(_), None) => Ordering::Less,
        (None, Some(_)) => Ordering::Greater,
        (None, None) => Ordering::Equal,
    }
}

/// The order the page lists benches in: regressions first (most first),
/// then by estimated LLC and L2 misses, code-window `F_irr%` and `ΔF`,
/// largest first; ties by name.
pub fn rank(pages: &[BenchPage]) -> Vec<usize> {
    let heads: Vec<Headline> = pages.iter().map(headline).collect();
    let mut order: Vec<usize> = (0..pages.len()).collect();
    order.sort_by(|&i, &j| {
        let (a, b) = (&heads[i], &heads[j]);
        b.regressions
            .cmp(&a.regressions)
            .then_with(|| descending(a.misses[0], b.misses[0]))
            .then_with(|| descending(a.misses[1], b.misses[1]))
            .then_with(|| descending(a.f_irr_frac, b.f_irr_frac))
            .then_with(|| descending(a.d_f, b.d_f))
            .then_with(|| pages[i].bench.name.cmp(&pages[j].bench.name))
    });
    order
}

/// The source line of the load of `class` with the most accesses, if any
/// such load has one.
fn hottest_line(a: &Analysis, class: LoadClass) -> Option<&str> {
    a.loads
        .iter()
        .filter(|l| l.class == class && l.line.is_some())
        .max_by_key(|l| l.count)
        .and_then(|l| l.line.as_deref())
}

/// The two sentences that open a bench's section: where its data comes
/// from, and how much it loads and how fast it reaches new data.
pub fn sentences(a: &Analysis) -> Markup {
    let s = &a.summary;
    if !has_accesses(a) {
        return html! {
            p.lead {
                "No access of this bench was recorded (" (s.samples) " samples), so its \
                locality numbers are undefined and shown as –. Run it longer or lower \
                --period to record it."
            }
            "\n"
        };
    }
    let (share, class, how) = if s.f_irr_frac >= 0.5 {
        (s.f_irr_frac, LoadClass::Irregular, "irregular loads")
    } else {
        (
            s.f_str_frac,
            LoadClass::Strided,
            "strided loads (a fixed step through memory)",
        )
    };
    let row = code_window_row(a);
    let misses: Vec<String> = CACHE_LEVELS
        .iter()
        .filter_map(|(level, field)| {
            estimated_misses(a, field).map(|m| format!("{} {level} misses", format_count(m)))
        })
        .collect();
    html! {
        p.lead {
            (format!("{:.0}%", share * 100.0)) " of the data this bench touches is reached by "
            (how)
            @if let Some(line) = hottest_line(a, class) {
                ", mostly at " code { (line) }
            }
            ". "
            @match s.a_hat {
                Some(loads) => {
                    "It executes about " (format_count(loads)) " loads (Â, estimated from "
                    (s.samples) " sample" @if s.samples != 1 { "s" } ")"
                }
                None => { "It made " (format_count(s.a as f64)) " recorded accesses" }
            }
            @if let Some(r) = row {
                "; within windows of " (format_window(r.k)) " loads each load reaches "
                (super::charts::format_value(r.d_f)) " new addresses on average (ΔF@W"
                sub { "c" } ")"
            }
            @if !misses.is_empty() {
                ", with an estimated " (misses.join(" and "))
            }
            "."
        }
        "\n"
    }
}

/// The symbols of the page, as `(term, definition)`.
pub const GLOSSARY: [(&str, &str); 18] = [
    (
        "A",
        "Observed accesses: the Strided and Irregular loads recorded in the samples.",
    ),
    (
        "A_const",
        "Constant loads (the same address each time: stack slots, globals), recorded or implied by a proxy.",
    ),
    (
        "implied by a proxy",
        "A Constant load left uninstrumented because another load of its basic block (its proxy) executes exactly as often; its count is the proxy's.",
    ),
    (
        "ρ",
        "Sample ratio: instrumented-load executions over the whole run per recorded load (1 for a full trace). Scales sampled counts to the run.",
    ),
    (
        "κ",
        "1 + A_const / A: loads per observed access, how much the Constant loads add.",
    ),
    (
        "Â",
        "Estimated executed loads, ρ·(A + A_const): exact with the software recorder, which counts every execution.",
    ),
    (
        "F",
        "Footprint: distinct addresses touched by Strided and Irregular loads in the samples.",
    ),
    (
        "F_str%, F_irr%",
        "Share of the footprint reached by strided loads (a fixed step through memory) and by irregular ones (anything else: pointer chasing, hashing).",
    ),
    (
        "ΔF_run",
        "Whole-run F / (A + A_const): new addresses per load over everything recorded. For a sampled trace it depends on where the samples fell; compare ΔF@W_c instead.",
    ),
    (
        "W_c",
        "Code window: windows of 2^k_c consecutive loads (within a sample) over which the @W_c values are averaged.",
    ),
    (
        "ΔF@W_c",
        "Mean over code windows of F / (loads in the window): new data per load at a fixed window size, comparable between sampled and full traces; the gate's dF.",
    ),
    (
        "F_str%@W_c, F_irr%@W_c",
        "The strided and irregular shares of the footprint averaged over code windows (the gate's F_str_frac, F_irr_frac).",
    ),
    (
        "D",
        "In-window reuse distance: distinct 64-byte blocks touched between two accesses to the same block within one sample (D mean, D max; D_win in tables). A sample is a few thousand loads, so D sees reuse at the scale of an L1 cache only: a pointer chase can show a smaller D than a tree that misses far more. The miss-ratio curve is the whole-run view.",
    ),
    (
        "MR",
        "Miss ratio: the share of accesses that miss a cache of a given size (MR_L1, MR_L2, MR_LLC, from the miss-ratio curve); estimated misses = MR·ρ·A.",
    ),
    (
        "MRC",
        "Miss-ratio curve: MR of a fully associative LRU cache of 64-byte blocks against its size, over the whole run (from the accesses to spatially sampled blocks, or exact for a full trace); the machine's L1, L2 and LLC sizes are marked.",
    ),
    (
        "source line",
        "Where a load is, from DWARF. A load in code inlined from the standard library or another crate is named by the first call of its inline chain that lies in your workspace (e.g. your line calling BTreeMap::get); the annotation beside the instrumented binary keeps the whole chain (inline_chain).",
    ),
    (
        "regression",
        "A gated metric that moved past its limit against the baseline (the `limit` column; exit status 3).",
    ),
    (
        "–",
        "Undefined: no access recorded, no baseline value, or a ratio over nothing.",
    ),
];

/// The `title=` hover of a column head: the glossary entry of `term`.
pub fn hover(term: &str) -> Option<&'static str> {
    GLOSSARY
        .iter()
        .find(|(t, _)| *t == term || t.split(", ").any(|part| part == term))
        .map(|(_, d)| *d)
}

/// The glossary section.
pub fn glossary() -> Markup {
    html! {
        section id="glossary" {
            "\n"
            h2 { "Glossary" } "\n"
            dl {
                "\n"
                @for (term, definition) in GLOSSARY {
                    dt { (term) } dd { (definition) } "\n"
                }
            }
            "\n"
        }
        "\n"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hovers_name_every_symbol_of_the_overview() {
        for term in [
            "A",
            "Â",
            "F",
            "ΔF_run",
            "ΔF@W_c",
            "F_irr%",
            "F_str%@W_c",
            "κ",
            "ρ",
            "D",
            "MR",
        ] {
            assert!(hover(term).is_some(), "{term}");
        }
    }

    #[test]
    fn missing_values_sort_last() {
        let mut v = [None, Some(1.0), Some(3.0), None, Some(2.0)];
        v.sort_by(|a, b| descending(*a, *b));
        assert_eq!(v, [Some(3.0), Some(2.0), Some(1.0), None, None]);
    }
}
