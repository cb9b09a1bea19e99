//! `--spatial-rate`: the spatial sampling of every command that records
//! sampled (`record`, `run`, `bench`, `validate`).

use memgaze_trace::SpatialSampling;

/// The default rate, `R = 1/128`.
pub const DEFAULT_SPATIAL_RATE: &str = "1/128";

/// The spatial sampling flag.
#[derive(clap::Args, Debug, Clone)]
pub struct SpatialArgs {
    /// Share R of 64-byte blocks whose every access by a Strided or
    /// Irregular load is recorded for the whole run, besides the time
    /// samples (whole-run locality, docs/METRICS.md): `1/N` or a decimal
    /// in [0, 1]; `0` turns it off. A full trace holds every record and
    /// ignores it.
    #[arg(
        long,
        value_name = "R",
        default_value = DEFAULT_SPATIAL_RATE,
        value_parser = parse_spatial_rate,
        allow_hyphen_values = true,
        help_heading = "Recording"
    )]
    pub spatial_rate: f64,
}

impl SpatialArgs {
    /// The spatial sampling asked for (`None` for a rate of 0).
    pub fn spatial(&self) -> Option<SpatialSampling> {
        SpatialSampling::with_rate(self.spatial_rate)
    }
}

/// Parses `1/N` or a decimal in `[0, 1]`.
pub fn parse_spatial_rate(text: &str) -> Result<f64, String> {
    let bad = || format!("{text:?} is not a rate between 0 and 1 (such as 1/128 or 0.01)");
    let trimmed = text.trim();
    let rate = match trimmed.split_once('/') {
        Some((one, n)) => {
            let one: f64 = one.trim().parse().map_err(|_| bad())?;
            let n: f64 = n.trim().parse().map_err(|_| bad())?;
            if n <= 0.0 {
                return Err(bad());
            }
            one / n
        }
        None => trimmed.parse().map_err(|_| bad())?,
    };
    if !(0.0..=1.0).contains(&rate) {
        return Err(bad());
    }
    Ok(rate)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_parse_as_fractions_and_decimals_within_zero_and_one() {
        assert_eq!(parse_spatial_rate("1/128"), Ok(1.0 / 128.0));
        assert_eq!(parse_spatial_rate("0.25"), Ok(0.25));
        assert_eq!(parse_spatial_rate("0"), Ok(0.0));
        assert_eq!(parse_spatial_rate("1"), Ok(1.0));
        for bad in ["2", "-1", "banana", "1/0", "1/-4", "", "NaN", "3/2", "inf"] {
            let error = parse_spatial_rate(bad).unwrap_err();
            assert!(error.contains("is not a rate"), "{bad}: {error}");
        }
        let default = SpatialArgs {
            spatial_rate: parse_spatial_rate(DEFAULT_SPATIAL_RATE).unwrap(),
        };
        let s = default.spatial().unwrap();
        assert_eq!(s.threshold, 1 << 57);
        assert!(SpatialArgs { spatial_rate: 0.0 }.spatial().is_none());
    }
}
