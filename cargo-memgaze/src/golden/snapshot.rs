//! A golden snapshot: the full-trace metrics of one bench, as an
//! insta-compatible `.snap` file.
//!
//! The file is what `cargo insta review` reads (insta's `Snapshot::from_file`):
//! a YAML header between `---` lines (`source`, `expression`, and `info`
//! holding the [`BuildFacts`]), then the contents — here the
//! [`GoldenMetrics`] as pretty JSON, one field per line so pull-request diffs
//! show exactly which metric moved. Floats are rounded to
//! [`SIGNIFICANT_DIGITS`] significant digits so that reruns are
//! byte-identical even where a sum's last bits would differ.

use super::facts::BuildFacts;
use anyhow::{Context, bail};
use memgaze_analysis::locality::standard_points;
use memgaze_analysis::{Analysis, MrcPoint, Summary, WholeRunLocality, WindowRow};
use serde::{Deserialize, Serialize};

/// Schema tag of [`GoldenMetrics`].
pub const GOLDEN_SCHEMA: &str = "memgaze.golden.v1";

/// Significant digits kept of every float in a snapshot.
pub const SIGNIFICANT_DIGITS: usize = 6;

/// The full-trace metrics of one bench that validation compares against.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct GoldenMetrics {
    /// Always [`GOLDEN_SCHEMA`].
    pub schema: String,
    /// Package of the bench.
    pub package: String,
    /// Bench target.
    pub target: String,
    /// Bench name.
    pub bench: String,
    /// Whole-run metrics (`samples` is 1, `rho` is 1). Its miss-ratio curve
    /// is the exact one at `2^6 … 2^24` blocks only: the machine's cache
    /// sizes and the `MR_*` and `misses_*` read at them are left out, so a
    /// snapshot does not depend on the machine that wrote it (validation
    /// reads the `MR_*` of any size off the curve).
    pub summary: Summary,
    /// Trace-window histogram, `k = 3..=20`.
    pub trace_windows: Vec<WindowRow>,
    /// Every function with records in the measured region, most accesses
    /// first.
    pub functions: Vec<GoldenFunction>,
}

/// A function's full-trace metrics.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct GoldenFunction {
    /// Demangled name.
    pub name: String,
    /// Observed accesses.
    #[serde(rename = "A")]
    pub a: u64,
    /// Constant loads.
    #[serde(rename = "A_const")]
    pub a_const: u64,
    /// `A_const / (A + A_const)`.
    #[serde(rename = "A_const_frac")]
    pub a_const_frac: Option<f64>,
    /// Mean reuse distance of its accesses.
    #[serde(rename = "D_mean")]
    pub d_mean: Option<f64>,
    /// Its own trace-window histogram: the code-window metrics of every
    /// window size (a sampled run compares the row of its `k_c`).
    pub trace_windows: Vec<WindowRow>,
    /// Its exact whole-run miss-ratio curve at `2^6 … 2^24` blocks (no
    /// `MR_*`, as in [`GoldenMetrics::summary`]).
    #[serde(flatten)]
    pub whole_run: WholeRunLocality,
}

/// The part of a whole-run locality a snapshot keeps: the curve at the
/// standard sizes, without the machine's cache sizes and the `MR_*` read at
/// them.
fn machine_free(whole_run: &WholeRunLocality) -> WholeRunLocality {
    WholeRunLocality {
        mrc: standard_points(&whole_run.mrc),
        ..WholeRunLocality::default()
    }
}

impl GoldenMetrics {
    /// The snapshot contents of a full-trace analysis, rounded.
    pub fn from_analysis(package: &str, target: &str, bench: &str, analysis: &Analysis) -> Self {
        let functions = analysis
            .functions
            .iter()
            .filter(|f| f.a + f.a_const > 0)
            .map(|f| GoldenFunction {
                name: f.name.clone(),
                a: f.a,
                a_const: f.a_const,
                a_const_frac: f.a_const_frac,
                d_mean: f.d_mean,
                trace_windows: f.trace_windows.clone(),
                whole_run: machine_free(&f.whole_run),
            })
            .collect();
        let mut summary = analysis.summary.clone();
        summary.whole_run = machine_free(&summary.whole_run);
        summary.mrc_groups.clear();
        [summary.misses_l1, summary.misses_l2, summary.misses_llc] = [None; 3];
        // An estimate with its own warning, not a locality metric.
        summary.coverage_dynamic = None;
        summary.escape_counts_missing = None;
        summary.untraced_load_executions = None;
        summary.coverage_by_object.clear();
        let mut metrics = GoldenMetrics {
            schema: GOLDEN_SCHEMA.to_string(),
            package: package.to_string(),
            target: target.to_string(),
            bench: bench.to_string(),
            summary,
            trace_windows: analysis.trace_windows.clone(),
            functions,
        };
        metrics.round();
        metrics
    }

    /// Rounds every float to [`SIGNIFICANT_DIGITS`].
    fn round(&mut self) {
        let s = &mut self.summary;
        for x in [
            &mut s.f_str,
            &mut s.f_irr,
            &mut s.f_str_frac,
            &mut s.f_irr_frac,
        ] {
            *x = round(*x);
        }
        for x in [
            &mut s.a_const_frac,
            &mut s.kappa,
            &mut s.rho,
            &mut s.a_hat,
            &mut s.f_hat,
            &mut s.d_f,
            &mut s.d_mean,
        ] {
            *x = x.map(round);
        }
        self.trace_windows.iter_mut().for_each(round_row);
        round_curve(&mut s.whole_run.mrc);
        for f in &mut self.functions {
            round_curve(&mut f.whole_run.mrc);
            f.a_const_frac = f.a_const_frac.map(round);
            f.d_mean = f.d_mean.map(round);
            f.trace_windows.iter_mut().for_each(round_row);
        }
    }

    /// The function's row at window exponent `k`, if it has one.
    pub fn function_row(&self, function: &str, k: u32) -> Option<&WindowRow> {
        self.functions
            .iter()
            .find(|f| f.name == function)
            .and_then(|f| f.trace_windows.iter().find(|r| r.k == k))
    }
}

fn round_curve(curve: &mut [MrcPoint]) {
    for p in curve {
        p.miss_ratio = round(p.miss_ratio);
    }
}

fn round_row(row: &mut WindowRow) {
    for x in [
        &mut row.f,
        &mut row.d_f,
        &mut row.f_str,
        &mut row.f_irr,
        &mut row.f_str_frac,
        &mut row.f_irr_frac,
        &mut row.a_const,
    ] {
        *x = round(*x);
    }
    row.f_lines = row.f_lines.map(round);
}

/// `x` rounded to [`SIGNIFICANT_DIGITS`] significant digits (`-0` becomes
/// `0`, so the text never depends on a sign of zero).
pub fn round(x: f64) -> f64 {
    if x == 0.0 || !x.is_finite() {
        return if x == 0.0 { 0.0 } else { x };
    }
    let text = format!("{:.*e}", SIGNIFICANT_DIGITS - 1, x);
    text.parse().expect("a formatted float parses")
}

/// The metadata of a snapshot file (insta's header fields).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SnapshotMeta {
    /// The bench's source file, relative to the workspace root.
    pub source: String,
    /// What produced the snapshot (shown by `cargo insta review`).
    pub expression: String,
    /// The build the metrics were recorded from.
    pub facts: BuildFacts,
}

/// A parsed or to-be-written snapshot file.
#[derive(Clone, Debug, PartialEq)]
pub struct SnapshotFile {
    /// Header.
    pub meta: SnapshotMeta,
    /// Contents.
    pub metrics: GoldenMetrics,
}

impl SnapshotFile {
    /// The contents as they appear below the header (no trailing newline).
    pub fn contents(&self) -> String {
        serde_json::to_string_pretty(&self.metrics).expect("metrics serialise")
    }

    /// The whole file, as insta writes it: `---`, YAML metadata, `---`,
    /// contents, newline.
    pub fn to_text(&self) -> String {
        let mut text = String::from("---\n");
        text.push_str(&format!("source: {}\n", yaml_string(&self.meta.source)));
        text.push_str(&format!(
            "expression: {}\n",
            yaml_string(&self.meta.expression)
        ));
        text.push_str("info:\n");
        for (key, value) in self.meta.facts.fields() {
            text.push_str(&format!("  {key}: {}\n", yaml_string(&value)));
        }
        text.push_str("---\n");
        text.push_str(&self.contents());
        text.push('\n');
        text
    }

    /// Parses a file written by [`SnapshotFile::to_text`] (hand edits that
    /// keep its shape are fine: insta-style header, JSON contents).
    pub fn parse(text: &str) -> anyhow::Result<SnapshotFile> {
        let (header, contents) = split_header(text)?;
        let mut source = None;
        let mut expression = None;
        let mut info: Vec<(String, String)> = Vec::new();
        let mut in_info = false;
        for line in header.lines() {
            if line.trim().is_empty() {
                continue;
            }
            if let Some(nested) = line.strip_prefix("  ") {
                if !in_info {
                    bail!("unexpected indented header line {line:?}");
                }
                let (key, value) = key_value(nested)?;
                info.push((key.to_string(), value));
                continue;
            }
            in_info = false;
            let (key, value) = match line.split_once(':') {
                Some((key, rest)) if rest.trim().is_empty() => (key.trim(), None),
                _ => {
                    let (key, value) = key_value(line)?;
                    (key, Some(value))
                }
            };
            match (key, value) {
                ("source", Some(v)) => source = Some(v),
                ("expression", Some(v)) => expression = Some(v),
                ("info", None) => in_info = true,
                // insta's other fields (assertion_line, description…) are
                // allowed and ignored.
                _ => {}
            }
        }
        let facts = BuildFacts::from_fields(&info).context("snapshot metadata `info`")?;
        let metrics: GoldenMetrics =
            serde_json::from_str(contents).context("snapshot contents are not golden metrics")?;
        if metrics.schema != GOLDEN_SCHEMA {
            bail!(
                "snapshot schema {:?} is not {GOLDEN_SCHEMA:?}: re-record it with `cargo memgaze golden --update`",
                metrics.schema
            );
        }
        Ok(SnapshotFile {
            meta: SnapshotMeta {
                source: source.unwrap_or_default(),
                expression: expression.unwrap_or_default(),
                facts,
            },
            metrics,
        })
    }
}

/// Splits `---\n<header>---\n<contents>`.
fn split_header(text: &str) -> anyhow::Result<(&str, &str)> {
    let rest = text
        .strip_prefix("---\n")
        .context("not a snapshot file: it does not start with `---`")?;
    let end = rest
        .find("\n---\n")
        .map(|i| (i + 1, i + 5))
        .or_else(|| rest.starts_with("---\n").then_some((0, 4)))
        .context("not a snapshot file: its header has no closing `---`")?;
    Ok((&rest[..end.0], &rest[end.1..]))
}

fn key_value(line: &str) -> anyhow::Result<(&str, String)> {
    let (key, value) = line
        .split_once(':')
        .with_context(|| format!("header line {line:?} is not `key: value`"))?;
    let value = value.trim();
    let value = if value.starts_with('"') {
        serde_json::from_str::<String>(value)
            .with_context(|| format!("header value {value:?} is not a quoted string"))?
    } else {
        value.to_string()
    };
    Ok((key.trim(), value))
}

/// A YAML double-quoted scalar (JSON string escapes are valid YAML ones).
fn yaml_string(value: &str) -> String {
    serde_json::to_string(value).expect("strings serialise")
}

/// Metrics rows whose values differ between two snapshots, for a short
/// human summary of a difference (`trace_windows[k=9].F: 511.2 → 498.0`),
/// in the order the snapshot file lists them (`summary` first).
pub fn describe_differences(old: &GoldenMetrics, new: &GoldenMetrics, limit: usize) -> Vec<String> {
    let old = Ordered::of(old);
    let new = Ordered::of(new);
    let mut out = Vec::new();
    diff_values("", &old, &new, &mut out);
    if out.len() > limit {
        let more = out.len() - limit;
        out.truncate(limit);
        out.push(format!("… and {more} more"));
    }
    out
}

/// A JSON value whose objects keep their fields in serialisation order
/// (`serde_json::Value` sorts them by name): the snapshot file's order.
#[derive(Debug, PartialEq)]
enum Ordered {
    Object(Vec<(String, Ordered)>),
    Array(Vec<Ordered>),
    Scalar(serde_json::Value),
}

impl Ordered {
    /// `metrics` as the snapshot file writes them.
    fn of(metrics: &GoldenMetrics) -> Ordered {
        let text = serde_json::to_string(metrics).expect("metrics serialise");
        serde_json::from_str(&text).expect("serialised metrics parse")
    }

    /// The field `key` of an object.
    fn get(&self, key: &str) -> Option<&Ordered> {
        match self {
            Ordered::Object(fields) => fields.iter().find(|(k, _)| k == key).map(|(_, v)| v),
            _ => None,
        }
    }
}

impl std::fmt::Display for Ordered {
    /// Scalars as JSON (only they are printed in a difference).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Ordered::Scalar(v) => write!(f, "{v}"),
            Ordered::Array(_) => f.write_str("[…]"),
            Ordered::Object(_) => f.write_str("{…}"),
        }
    }
}

impl<'de> Deserialize<'de> for Ordered {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl<'de> serde::de::Visitor<'de> for Visitor {
            type Value = Ordered;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a JSON value")
            }
            fn visit_bool<E>(self, v: bool) -> Result<Ordered, E> {
                Ok(Ordered::Scalar(v.into()))
            }
            fn visit_i64<E>(self, v: i64) -> Result<Ordered, E> {
                Ok(Ordered::Scalar(v.into()))
            }
            fn visit_u64<E>(self, v: u64) -> Result<Ordered, E> {
                Ok(Ordered::Scalar(v.into()))
            }
            fn visit_f64<E>(self, v: f64) -> Result<Ordered, E> {
                Ok(Ordered::Scalar(v.into()))
            }
            fn visit_str<E>(self, v: &str) -> Result<Ordered, E> {
                Ok(Ordered::Scalar(v.into()))
            }
            fn visit_unit<E>(self) -> Result<Ordered, E> {
                Ok(Ordered::Scalar(serde_json::Value::Null))
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                mut seq: A,
            ) -> Result<Ordered, A::Error> {
                let mut items = Vec::new();
                while let Some(item) = seq.next_element()? {
                    items.push(item);
                }
                Ok(Ordered::Array(items))
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<Ordered, A::Error> {
                let mut fields = Vec::new();
                while let Some(field) = map.next_entry()? {
                    fields.push(field);
                }
                Ok(Ordered::Object(fields))
            }
        }
        d.deserialize_any(Visitor)
    }
}

fn diff_values(path: &str, old: &Ordered, new: &Ordered, out: &mut Vec<String>) {
    match (old, new) {
        (Ordered::Object(a), Ordered::Object(b)) => {
            for (key, va) in a {
                let p = if path.is_empty() {
                    key.clone()
                } else {
                    format!("{path}.{key}")
                };
                match new.get(key) {
                    Some(vb) => diff_values(&p, va, vb, out),
                    None => out.push(format!("{p}: removed")),
                }
            }
            for (key, _) in b.iter().filter(|(k, _)| old.get(k).is_none()) {
                out.push(format!("{path}.{key}: added"));
            }
        }
        (Ordered::Array(a), Ordered::Array(b)) => {
            let label = |v: &Ordered, i: usize| match (v.get("k"), v.get("name")) {
                (Some(k), _) => format!("[k={k}]"),
                (_, Some(Ordered::Scalar(serde_json::Value::String(name)))) => format!("[{name}]"),
                _ => format!("[{i}]"),
            };
            for i in 0..a.len().max(b.len()) {
                match (a.get(i), b.get(i)) {
                    (Some(va), Some(vb)) => {
                        diff_values(&format!("{path}{}", label(va, i)), va, vb, out)
                    }
                    (Some(va), None) => out.push(format!("{path}{}: removed", label(va, i))),
                    (None, Some(vb)) => out.push(format!("{path}{}: added", label(vb, i))),
                    (None, None) => {}
                }
            }
        }
        (a, b) if a != b => out.push(format!("{path}: {a} → {b}")),
        _ => {}
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub(crate) fn sample_facts() -> BuildFacts {
        BuildFacts {
            rustc: "rustc 1.95.0 (abc 2026-01-01)".into(),
            host: "x86_64-unknown-linux-gnu".into(),
            profile: "bench".into(),
            features: String::new(),
            env: "MEMGAZE_MICRO_ELEMENTS=4096".into(),
        }
    }

    fn row(k: u32, f: f64) -> WindowRow {
        WindowRow {
            k,
            windows: 3,
            f,
            f_lines: Some(f / 8.0),
            d_f: 1.0 / 3.0,
            f_str: f * 2.0 / 3.0,
            f_irr: f / 3.0,
            f_str_frac: 2.0 / 3.0,
            f_irr_frac: 1.0 / 3.0,
            a_const: 0.0,
        }
    }

    pub(crate) fn sample_metrics() -> GoldenMetrics {
        GoldenMetrics {
            schema: GOLDEN_SCHEMA.into(),
            package: "microbenches".into(),
            target: "micro".into(),
            bench: "str/irr".into(),
            summary: Summary {
                a: 100,
                a_const: 5,
                a_const_frac: Some(5.0 / 105.0),
                kappa: Some(1.05),
                rho: Some(1.0),
                a_hat: Some(105.0),
                samples: 1,
                records: 105,
                f: 80,
                f_hat: Some(80.0),
                f_lines: 10,
                f_str: 53.333333333,
                f_irr: 26.666666667,
                f_str_frac: 2.0 / 3.0,
                f_irr_frac: 1.0 / 3.0,
                d_f: Some(80.0 / 105.0),
                d_mean: None,
                d_max: None,
                threads: 1,
                ..Summary::default()
            },
            trace_windows: vec![row(3, 8.0), row(4, 15.999999999)],
            functions: vec![GoldenFunction {
                name: "microbenches::kernels::str_irr".into(),
                a: 100,
                a_const: 5,
                a_const_frac: Some(5.0 / 105.0),
                d_mean: Some(1.0 / 7.0),
                trace_windows: vec![row(3, 8.0)],
                whole_run: WholeRunLocality::default(),
            }],
        }
    }

    fn sample_file() -> SnapshotFile {
        let mut metrics = sample_metrics();
        metrics.round();
        SnapshotFile {
            meta: SnapshotMeta {
                source: "microbenches/benches/micro.rs".into(),
                expression: "full trace of `str/irr`".into(),
                facts: sample_facts(),
            },
            metrics,
        }
    }

    #[test]
    fn rounding_keeps_six_significant_digits() {
        assert_eq!(round(1.0 / 3.0), 0.333333);
        assert_eq!(round(123456789.0), 123457000.0);
        assert_eq!(round(-0.0).to_bits(), 0.0f64.to_bits());
        assert_eq!(round(15.999999999), 16.0);
        assert_eq!(round(2.5e-9), 2.5e-9);
    }

    #[test]
    fn text_round_trips_and_is_stable() {
        let file = sample_file();
        let text = file.to_text();
        assert!(text.starts_with("---\nsource: \"microbenches/benches/micro.rs\"\n"));
        assert!(text.contains("\n  rustc: \"rustc 1.95.0 (abc 2026-01-01)\"\n"));
        assert!(text.ends_with("}\n"));
        let parsed = SnapshotFile::parse(&text).unwrap();
        assert_eq!(parsed, file);
        assert_eq!(parsed.to_text(), text);
    }

    /// `cargo insta review` reads pending snapshots with insta's own
    /// parser: ours must come out with the same metadata and contents.
    #[test]
    fn insta_reads_our_snapshots() {
        let file = sample_file();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("microbenches__micro__str%2Firr.snap.new");
        std::fs::write(&path, file.to_text()).unwrap();
        let snapshot = insta::Snapshot::from_file(&path).unwrap();
        assert_eq!(
            snapshot.metadata().source(),
            Some("microbenches/benches/micro.rs")
        );
        assert_eq!(
            snapshot.metadata().expression(),
            Some("full trace of `str/irr`")
        );
        let contents = snapshot.as_text().unwrap().to_string();
        assert_eq!(contents, file.contents());
    }

    #[test]
    fn bad_files_are_reported_not_panicked_on() {
        assert!(SnapshotFile::parse("").is_err());
        assert!(SnapshotFile::parse("---\nsource: x\n").is_err());
        let text = sample_file().to_text().replace(GOLDEN_SCHEMA, "other.v9");
        let e = SnapshotFile::parse(&text).unwrap_err();
        assert!(format!("{e:#}").contains("--update"), "{e:#}");
        let text = sample_file()
            .to_text()
            .replace("\"A\": 100", "\"A\": \"x\"");
        assert!(SnapshotFile::parse(&text).is_err());
    }

    #[test]
    fn differences_name_the_metric_and_row() {
        let old = sample_metrics();
        let mut new = old.clone();
        new.trace_windows[1].f = 14.0;
        new.functions[0].a = 99;
        new.functions[0].a_const = 7;
        new.summary.a = 1;
        let d = describe_differences(&old, &new, 10);
        // In the snapshot file's order: the summary, the trace windows,
        // then the functions, each one's fields as the file lists them.
        let text = sample_file().contents();
        let at = |needle: &str| text.find(needle).unwrap();
        assert!(
            at("\"summary\"") < at("\"trace_windows\"")
                && at("\"trace_windows\"") < at("\"functions\"")
        );
        assert_eq!(
            d,
            [
                "summary.A: 100 → 1",
                "trace_windows[k=4].F: 15.999999999 → 14.0",
                "functions[microbenches::kernels::str_irr].A: 100 → 99",
                "functions[microbenches::kernels::str_irr].A_const: 5 → 7",
            ]
        );
        assert!(describe_differences(&old, &old, 10).is_empty());
    }
}
