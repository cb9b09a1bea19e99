//! Plausibility checks of an [`Analysis`] read from a file (an analysis
//! JSON, a results directory's `analysis.json`/`golden.json`, a baseline):
//! what the analysis engine can produce, so that a hand-edited or
//! corrupted document is refused with one line naming the field rather
//! than drawn (a value of 1e308 on a chart axis overflowed plotters'
//! pixel arithmetic; a window exponent of 4 × 10⁹ asked it for as many
//! tick labels).

use super::Analysis;
use serde_json::Value;

/// Largest exponent (`k`, `h`, `k_c`, `max_k`): windows and interval-tree
/// nodes of at most 2^64 accesses or samples.
const MAX_EXPONENT: f64 = 64.0;
/// Largest count or mean: past `u64::MAX` nothing was counted.
const MAX_COUNT: f64 = 2e19;
/// Rows of a per-exponent table (one per `k` or `h`, twice over at most).
const MAX_ROWS: usize = 130;

/// Checks every number of `analysis` against what the engine produces:
/// non-negative; exponents at most 64; fractions, `dF` and miss ratios in
/// `[0, 1]`; percentages at most 100; counts below 2^64; per-exponent
/// tables of at most a hundred-odd rows; regions and reuse bins that end
/// where they start or after. The error names the first offending field
/// (`trace_windows[2].F_irr_frac = 3`).
pub fn check_document(analysis: &Analysis) -> Result<(), String> {
    let value = serde_json::to_value(analysis).map_err(|e| e.to_string())?;
    check_value(&value, "", "")?;
    for (i, r) in analysis.regions.iter().enumerate() {
        if r.end < r.start {
            return Err(format!(
                "regions[{i}] ends at {:#x} before it starts at {:#x}",
                r.end, r.start
            ));
        }
    }
    for (i, b) in analysis.reuse.bins.iter().enumerate() {
        if b.hi < b.lo {
            return Err(format!("reuse.bins[{i}]: hi {} below lo {}", b.hi, b.lo));
        }
    }
    Ok(())
}

fn check_value(value: &Value, path: &str, key: &str) -> Result<(), String> {
    match value {
        Value::Number(n) => {
            let x = n.as_f64().unwrap_or(f64::NAN);
            let (limit, what) = limit_of(key);
            if !(x >= 0.0 && x <= limit) {
                return Err(format!("`{path}` = {n} is out of range ({what})"));
            }
        }
        Value::Array(items) => {
            if matches!(key, "trace_windows" | "levels" | "bins") && items.len() > MAX_ROWS {
                return Err(format!(
                    "`{path}` has {} rows (at most {MAX_ROWS}: one per window size)",
                    items.len()
                ));
            }
            for (i, item) in items.iter().enumerate() {
                check_value(item, &format!("{path}[{i}]"), key)?;
            }
        }
        Value::Object(fields) => {
            for (name, item) in fields {
                let child = if path.is_empty() {
                    name.clone()
                } else {
                    format!("{path}.{name}")
                };
                check_value(item, &child, name)?;
            }
        }
        _ => {}
    }
    Ok(())
}

/// The largest value a field of this name may hold, and how to say it.
fn limit_of(key: &str) -> (f64, &'static str) {
    match key {
        "k" | "h" | "code_window_k" | "max_k" => (MAX_EXPONENT, "an exponent from 0 to 64"),
        "dF" | "miss_ratio" => (1.0 + 1e-9, "in [0, 1]"),
        k if k.ends_with("_frac") || k.starts_with("MR_") => (1.0 + 1e-9, "a fraction in [0, 1]"),
        "region_threshold_percent" => (100.0, "a percentage"),
        _ => (MAX_COUNT, "a count or mean from 0 to 2^64"),
    }
}
