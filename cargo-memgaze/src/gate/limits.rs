//! Regression limits: how much a metric may get worse before a gate fails.
//!
//! A limit is relative (`+5%`: more than 5 % worse than the baseline),
//! absolute (`+0.02`: more than 0.02 worse), or both (two entries for the
//! same metric), in which case a change must exceed **both** to count: the
//! absolute part keeps a relative limit from tripping on values near zero.
//! The sign says which way is worse (`+` larger, `-` smaller, `±` either);
//! without a sign the metric's own bad direction applies
//! ([`Metric::worse`]). `off` disables a metric.
//!
//! Limits come from three places, later ones replacing earlier ones metric
//! by metric: [`Limits::defaults`], `[package.metadata.memgaze] limits`
//! ([`Limits::from_metadata`]) and `--limits` ([`Limits::parse`]).

use super::metric::{Direction, Metric};
use anyhow::Result;
use memgaze_error::usage;
use serde_json::Value;
use std::collections::BTreeMap;
use std::fmt;

/// The limit of one metric.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Limit {
    /// Which change is bad.
    pub direction: Direction,
    /// Largest tolerated relative change, as a fraction (`0.05` for 5 %).
    pub relative: Option<f64>,
    /// Largest tolerated absolute change.
    pub absolute: Option<f64>,
}

impl Limit {
    /// Whether going from `old` to `new` is worse than this limit allows.
    pub fn exceeded(&self, old: f64, new: f64) -> bool {
        let worse = match self.direction {
            Direction::Increase => new - old,
            Direction::Decrease => old - new,
            Direction::Either => (new - old).abs(),
        };
        if worse <= 0.0 {
            return false;
        }
        // A change exactly at the limit is within it, rounding included.
        let within = |change: f64, limit: f64| change <= limit * (1.0 + 1e-9) + 1e-12;
        let relative_ok = self.relative.is_some_and(|limit| {
            // From 0, any worsening is infinitely large in relative terms.
            old != 0.0 && within(worse / old.abs(), limit)
        });
        let absolute_ok = self.absolute.is_some_and(|limit| within(worse, limit));
        !relative_ok && !absolute_ok && (self.relative.is_some() || self.absolute.is_some())
    }
}

impl Limit {
    /// This limit with its relative and absolute parts multiplied by
    /// `factor` (the direction kept): how an undersampled comparison keeps
    /// the same margin over sampling noise, whose standard deviation grows
    /// as `1/√samples` ([`super::compare::noise_factor`]).
    pub fn widened(&self, factor: f64) -> Limit {
        Limit {
            direction: self.direction,
            relative: self.relative.map(|r| r * factor),
            absolute: self.absolute.map(|a| a * factor),
        }
    }
}

impl fmt::Display for Limit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let sign = self.direction.sign();
        match (self.relative, self.absolute) {
            (Some(r), Some(a)) => write!(f, "{sign}{}% and {sign}{}", trim(r * 100.0), trim(a)),
            (Some(r), None) => write!(f, "{sign}{}%", trim(r * 100.0)),
            (None, Some(a)) => write!(f, "{sign}{}", trim(a)),
            (None, None) => f.write_str("off"),
        }
    }
}

/// A number to about four significant digits, whole numbers kept whole,
/// without trailing zeros (`5`, `0.02`, `12.5`, `25343`): a limit widened
/// for sampling noise reads `25343`, not `25343.253118`.
fn trim(value: f64) -> String {
    let magnitude = if value == 0.0 || !value.is_finite() {
        0
    } else {
        value.abs().log10().floor() as i32
    };
    let decimals = (3 - magnitude).clamp(0, 6) as usize;
    let text = format!("{value:.decimals$}");
    if text.contains('.') {
        text.trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        text
    }
}

/// Limits per metric; a metric without an entry is not gated.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct Limits {
    /// `None`: explicitly off (replaces a default).
    entries: BTreeMap<Metric, Option<Limit>>,
}

impl Limits {
    /// No limits at all.
    pub fn none() -> Limits {
        Limits::default()
    }

    /// The defaults: chosen so that an unchanged program stays inside them
    /// at the default sampling whatever the sampling seed and wherever its
    /// data was placed (see ARCHITECTURE.md, "Default regression limits").
    ///
    /// | metric | limit | why |
    /// |---|---|---|
    /// | `A_hat` | `+10%` | counted exactly by the recorder; moves only when the code does |
    /// | `dF` | `+10%` and `+0.02` | a mean over ≥ 30 code windows; the absolute part ignores changes of tiny `ΔF` |
    /// | `dF_lines` | `+20%` and `+0.02` | new cache lines per load: a walk striding across lines; data placement moves it by a few % |
    /// | `F_irr_frac` | `+0.1` | a fraction: absolute change; phased programs vary most here |
    /// | `F_str_frac` | `-0.1` | the mirror image of `F_irr_frac` |
    /// | `MR_L1`, `MR_L2`, `MR_LLC` | `+0.02`, widened to 4σ of the spatial-sampling noise | whole-run miss ratios: a stride across cache lines multiplies them; placement moves the tracked blocks ([`super::noise`]) |
    /// | `misses_L1`, `misses_L2`, `misses_LLC` | `+10%`, and 4σ of the noise and 2% of the loads per run | estimated misses per run: the miss ratio times the loads; cold misses per run follow the harness's run count |
    ///
    /// Not gated by default: whole-run `F`, `F_hat`, `F_lines` (depend on
    /// where samples fell), `A` (depends on the sampling), `D_mean` (the
    /// in-window reuse of the few hottest lines, which moves by a fifth
    /// when the allocator places them across another line boundary),
    /// `D_max` (a maximum, the noisiest statistic), `kappa` and
    /// `A_const_frac`. The whole-run limits, given here or by `--limits`,
    /// are widened to [`super::noise::NOISE_SIGMAS`] standard deviations
    /// of the two runs' spatial-sampling noise: on a bench whose data spans
    /// a few hundred lines, 1/128 of the blocks is a handful of tracked
    /// blocks, and heap placement alone moved `MR_L1` of a 1,000-entry
    /// `HashMap` from 0.03 to 0.19.
    pub fn defaults() -> Limits {
        let limit = |direction, relative, absolute| {
            Some(Limit {
                direction,
                relative,
                absolute,
            })
        };
        Limits {
            entries: BTreeMap::from([
                (Metric::AHat, limit(Direction::Increase, Some(0.10), None)),
                (
                    Metric::DF,
                    limit(Direction::Increase, Some(0.10), Some(0.02)),
                ),
                (
                    Metric::DFLines,
                    limit(Direction::Increase, Some(0.20), Some(0.02)),
                ),
                (
                    Metric::FIrrFrac,
                    limit(Direction::Increase, None, Some(0.10)),
                ),
                (
                    Metric::FStrFrac,
                    limit(Direction::Decrease, None, Some(0.10)),
                ),
                (Metric::MrL1, limit(Direction::Increase, None, Some(0.02))),
                (Metric::MrL2, limit(Direction::Increase, None, Some(0.02))),
                (Metric::MrLlc, limit(Direction::Increase, None, Some(0.02))),
                (
                    Metric::MissesL1,
                    limit(Direction::Increase, Some(0.10), None),
                ),
                (
                    Metric::MissesL2,
                    limit(Direction::Increase, Some(0.10), None),
                ),
                (
                    Metric::MissesLlc,
                    limit(Direction::Increase, Some(0.10), None),
                ),
            ]),
        }
    }

    /// Parses `--limits`: comma-separated `METRIC=LIMIT` entries, LIMIT
    /// being `[+|-|±]NUMBER[%]` or `off`; a metric may appear twice, once
    /// relative and once absolute. Errors are usage errors (exit code 2).
    pub fn parse(spec: &str) -> Result<Limits> {
        let mut limits = Limits::none();
        for entry in spec.split(',').map(str::trim).filter(|e| !e.is_empty()) {
            let (name, value) = entry.split_once('=').ok_or_else(|| {
                usage::<anyhow::Error>(format!(
                    "--limits: `{entry}` is not METRIC=LIMIT (e.g. `dF=+5%` or `F_irr_frac=+0.02`)"
                ))
            })?;
            limits.add(name.trim(), value.trim(), "--limits")?;
        }
        Ok(limits)
    }

    /// Reads the `limits` of a package's `[package.metadata.memgaze]`
    /// table, given as the package's metadata (cargo_metadata's JSON, the
    /// whole `metadata` value). Accepted shapes:
    ///
    /// ```toml
    /// [package.metadata.memgaze]
    /// limits = "dF=+5%,F_irr_frac=+0.02"
    /// # or
    /// [package.metadata.memgaze.limits]
    /// dF = "+5%"
    /// F_irr_frac = 0.02          # a bare number: absolute, natural direction
    /// D_mean = ["+10%", "+0.5"]  # both must be exceeded
    /// D_max = "off"
    /// ```
    ///
    /// No `memgaze` table or no `limits` key gives no limits.
    pub fn from_metadata(metadata: &Value) -> Result<Limits> {
        const WHERE: &str = "[package.metadata.memgaze] limits";
        let Some(value) = metadata.get("memgaze").and_then(|m| m.get("limits")) else {
            return Ok(Limits::none());
        };
        match value {
            Value::String(spec) => Limits::parse(spec).map_err(|e| usage(format!("{WHERE}: {e}"))),
            Value::Object(table) => {
                let mut limits = Limits::none();
                for (name, value) in table {
                    let items = match value {
                        Value::Array(items) => items.iter().collect(),
                        other => vec![other],
                    };
                    for item in items {
                        let text = match item {
                            Value::String(s) => s.clone(),
                            Value::Number(n) => n.to_string(),
                            other => {
                                return Err(usage(format!(
                                    "{WHERE}: {name} = {other}: expected a string like \"+5%\", a number or a list of them"
                                )));
                            }
                        };
                        limits.add(name, &text, WHERE)?;
                    }
                }
                Ok(limits)
            }
            other => Err(usage(format!(
                "{WHERE}: expected a table or a string like \"dF=+5%\", found {other}"
            ))),
        }
    }

    /// These limits with `other`'s entries replacing theirs metric by
    /// metric (a metric named in `other` takes exactly `other`'s limit).
    pub fn overridden_by(mut self, other: &Limits) -> Limits {
        for (metric, limit) in &other.entries {
            self.entries.insert(*metric, *limit);
        }
        self
    }

    /// The limit of `metric`, if it is gated.
    pub fn get(&self, metric: Metric) -> Option<&Limit> {
        self.entries.get(&metric).and_then(Option::as_ref)
    }

    /// Gated metrics and their limits, in [`Metric::ALL`] order.
    pub fn iter(&self) -> impl Iterator<Item = (Metric, &Limit)> {
        Metric::ALL
            .into_iter()
            .filter_map(|m| self.get(m).map(|limit| (m, limit)))
    }

    /// Whether no metric is gated.
    pub fn is_empty(&self) -> bool {
        self.iter().next().is_none()
    }

    fn add(&mut self, name: &str, value: &str, source: &str) -> Result<()> {
        let metric = Metric::from_name(name).ok_or_else(|| {
            usage::<anyhow::Error>(format!(
                "{source}: unknown metric `{name}`; valid metrics: {}",
                Metric::valid_names()
            ))
        })?;
        if value.eq_ignore_ascii_case("off") || value.eq_ignore_ascii_case("none") {
            self.entries.insert(metric, None);
            return Ok(());
        }
        let bad = |why: &str| {
            usage(format!(
                "{source}: {name}={value}: {why} (a limit is [+|-|±]NUMBER[%], e.g. +5% or 0.02, or off)"
            ))
        };
        let (direction, rest) =
            if let Some(rest) = value.strip_prefix("+-").or_else(|| value.strip_prefix('±')) {
                (Direction::Either, rest)
            } else if let Some(rest) = value.strip_prefix('+') {
                (Direction::Increase, rest)
            } else if let Some(rest) = value.strip_prefix('-') {
                (Direction::Decrease, rest)
            } else {
                (metric.worse(), value)
            };
        let (number, relative) = match rest.strip_suffix('%') {
            Some(number) => (number.trim(), true),
            None => (rest.trim(), false),
        };
        let amount: f64 = number.parse().map_err(|_| bad("not a number"))?;
        if !amount.is_finite() || amount < 0.0 {
            return Err(bad("must be a finite number ≥ 0"));
        }
        let entry = self.entries.entry(metric).or_insert(None);
        let limit = entry.get_or_insert(Limit {
            direction,
            relative: None,
            absolute: None,
        });
        if limit.direction != direction {
            return Err(bad("its relative and absolute parts disagree on the sign"));
        }
        let slot = if relative {
            &mut limit.relative
        } else {
            &mut limit.absolute
        };
        if slot.is_some() {
            return Err(bad(if relative {
                "a relative limit is given twice"
            } else {
                "an absolute limit is given twice"
            }));
        }
        *slot = Some(if relative { amount / 100.0 } else { amount });
        Ok(())
    }
}

impl fmt::Display for Limits {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut first = true;
        for (metric, limit) in self.iter() {
            if !first {
                f.write_str(", ")?;
            }
            first = false;
            write!(f, "{metric} {limit}")?;
        }
        if first {
            f.write_str("none")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use memgaze_error::{Exit, exit_for, one_line};
    use serde_json::json;

    fn limit(limits: &Limits, metric: Metric) -> Limit {
        *limits.get(metric).unwrap()
    }

    /// Limits print to about four significant digits; whole parts stay.
    #[test]
    fn limits_print_without_noise_digits() {
        for (value, text) in [
            (5.0, "5"),
            (0.02, "0.02"),
            (12.5, "12.5"),
            (25343.253118, "25343"),
            (1.0 / 3.0, "0.3333"),
            (0.0, "0"),
            (2.5e-5, "0.000025"),
        ] {
            assert_eq!(trim(value), text, "{value}");
        }
        let widened = Limit {
            direction: Direction::Increase,
            relative: Some(0.1),
            absolute: Some(12671.626559),
        }
        .widened(2.0);
        assert_eq!(widened.to_string(), "+20% and +25343");
    }

    #[test]
    fn parses_relative_absolute_and_directions() {
        let l =
            Limits::parse("dF=+5%, F_irr_frac=+0.02,D_mean=+10%,F_str_frac=-0.1,kappa=±1%,A=+-3")
                .unwrap();
        assert_eq!(
            limit(&l, Metric::DF),
            Limit {
                direction: Direction::Increase,
                relative: Some(0.05),
                absolute: None
            }
        );
        assert_eq!(limit(&l, Metric::FIrrFrac).absolute, Some(0.02));
        assert_eq!(limit(&l, Metric::FStrFrac).direction, Direction::Decrease);
        assert_eq!(limit(&l, Metric::Kappa).direction, Direction::Either);
        assert_eq!(
            limit(&l, Metric::A),
            Limit {
                direction: Direction::Either,
                relative: None,
                absolute: Some(3.0)
            }
        );
        assert_eq!(
            l.to_string(),
            "dF +5%, F_str_frac -0.1, F_irr_frac +0.02, D_mean +10%, A ±3, kappa ±1%"
        );
    }

    #[test]
    fn unsigned_limits_take_the_metrics_bad_direction() {
        let l = Limits::parse("F_str_frac=0.05,dF=5%").unwrap();
        assert_eq!(limit(&l, Metric::FStrFrac).direction, Direction::Decrease);
        assert_eq!(limit(&l, Metric::DF).direction, Direction::Increase);
    }

    #[test]
    fn relative_and_absolute_parts_combine() {
        let l = Limits::parse("dF=+10%,dF=+0.02").unwrap();
        let d = limit(&l, Metric::DF);
        assert_eq!((d.relative, d.absolute), (Some(0.10), Some(0.02)));
        assert_eq!(d.to_string(), "+10% and +0.02");
        // 0.10 → 0.115 is +15 % but only +0.015: within the absolute part.
        assert!(!d.exceeded(0.10, 0.115));
        // 0.50 → 0.54 is +0.04 but only +8 %.
        assert!(!d.exceeded(0.50, 0.54));
        // 0.50 → 0.60: +20 % and +0.1.
        assert!(d.exceeded(0.50, 0.60));
    }

    #[test]
    fn exceeded_respects_direction_and_zero() {
        let up = Limit {
            direction: Direction::Increase,
            relative: Some(0.05),
            absolute: None,
        };
        assert!(up.exceeded(1.0, 1.06));
        assert!(!up.exceeded(1.0, 1.05));
        assert!(
            !up.exceeded(1.0, 0.5),
            "an improvement is never a regression"
        );
        assert!(
            up.exceeded(0.0, 0.001),
            "from zero any increase is infinitely relative"
        );
        assert!(!up.exceeded(0.0, 0.0));
        let down = Limit {
            direction: Direction::Decrease,
            relative: None,
            absolute: Some(0.05),
        };
        assert!(down.exceeded(0.9, 0.8));
        assert!(!down.exceeded(0.9, 1.0));
        let either = Limit {
            direction: Direction::Either,
            relative: Some(0.1),
            absolute: None,
        };
        assert!(
            either.exceeded(10.0, 8.0)
                && either.exceeded(10.0, 12.0)
                && !either.exceeded(10.0, 10.5)
        );
    }

    #[test]
    fn bad_limits_are_usage_errors_naming_the_problem() {
        for (spec, expect) in [
            ("dF", "is not METRIC=LIMIT"),
            (
                "dfF=+5%",
                "unknown metric `dfF`; valid metrics: A_hat, dF, dF_lines, F_str_frac, F_irr_frac, D_mean",
            ),
            ("dF=+five%", "not a number"),
            ("dF=+5%,dF=+6%", "relative limit is given twice"),
            ("dF=+5%,dF=-0.1", "disagree on the sign"),
            ("dF=+inf", "finite"),
            ("D_mean=--3", "finite number ≥ 0"),
        ] {
            let e = Limits::parse(spec).unwrap_err();
            assert_eq!(exit_for(&e), Exit::Usage, "{spec}");
            assert!(one_line(&e).contains(expect), "{spec}: {}", one_line(&e));
        }
    }

    #[test]
    fn off_disables_a_default() {
        let l = Limits::defaults().overridden_by(&Limits::parse("dF_lines=off,dF=+1%").unwrap());
        assert!(l.get(Metric::DFLines).is_none());
        assert_eq!(
            limit(&l, Metric::DF),
            Limit {
                direction: Direction::Increase,
                relative: Some(0.01),
                absolute: None
            }
        );
        assert!(
            l.get(Metric::AHat).is_some(),
            "metrics not named keep their default"
        );
    }

    #[test]
    fn metadata_tables_and_strings() {
        let table = json!({"memgaze": {"limits": {"dF": "+5%", "F_irr_frac": 0.02, "D_mean": ["+10%", "+0.5"], "D_max": "off"}}});
        let l = Limits::from_metadata(&table).unwrap();
        assert_eq!(limit(&l, Metric::DF).relative, Some(0.05));
        assert_eq!(
            limit(&l, Metric::FIrrFrac),
            Limit {
                direction: Direction::Increase,
                relative: None,
                absolute: Some(0.02)
            }
        );
        assert_eq!(limit(&l, Metric::DMean).absolute, Some(0.5));
        assert!(l.get(Metric::DMax).is_none());
        let string = json!({"memgaze": {"limits": "dF=+5%"}});
        assert_eq!(
            Limits::from_metadata(&string).unwrap(),
            Limits::parse("dF=+5%").unwrap()
        );
        assert_eq!(Limits::from_metadata(&json!(null)).unwrap(), Limits::none());
        assert_eq!(
            Limits::from_metadata(&json!({"other": 1})).unwrap(),
            Limits::none()
        );
        let e = Limits::from_metadata(&json!({"memgaze": {"limits": {"dF": true}}})).unwrap_err();
        assert!(one_line(&e).contains("[package.metadata.memgaze] limits: dF = true"));
        let e =
            Limits::from_metadata(&json!({"memgaze": {"limits": {"bogus": "+1%"}}})).unwrap_err();
        assert!(one_line(&e).contains("unknown metric `bogus`"));
    }
}
