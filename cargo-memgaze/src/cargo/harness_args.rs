//! [`HarnessArgs`]: the libtest arguments a user gives after `--`, parsed
//! with the harness's own parser (libtest-mimic), and turned into the
//! command lines that list benches and run one.

use libtest_mimic::Arguments;
use memgaze_error::usage;

/// Parsed harness arguments (`cargo memgaze bench … -- <these>`).
///
/// Selection (filters, `--exact`, `--skip`, `--ignored`,
/// `--include-ignored`) is applied once, when the benches are listed; each
/// selected bench then runs alone by exact name. Several filters select
/// the benches any of them selects, as libtest and divan take them (the
/// harness is asked once per filter: libtest-mimic and criterion take one). Output options (`--format`,
/// `--color`, `-q`, `--logfile`) and `--test-threads` only shape what the
/// harness prints, which cargo memgaze reads itself, so they are accepted
/// and not forwarded.
#[derive(Clone, Debug, Default)]
pub struct HarnessArgs {
    parsed: Arguments,
    /// Every filter, the first one included (`parsed.filter` holds only it).
    filters: Vec<String>,
}

/// libtest's arguments with any number of filters.
#[derive(clap::Parser, Debug)]
struct WithFilters {
    #[command(flatten)]
    arguments: Arguments,
    /// The filters after the first.
    #[arg(value_name = "FILTER")]
    more_filters: Vec<String>,
}

impl HarnessArgs {
    /// Parses the arguments after `--`. A bad one is a usage error (exit 2)
    /// quoting libtest's complaint.
    pub fn parse(args: &[String]) -> anyhow::Result<HarnessArgs> {
        let WithFilters {
            arguments: parsed,
            more_filters,
        } = <WithFilters as clap::Parser>::try_parse_from(
            std::iter::once("harness").chain(args.iter().map(String::as_str)),
        )
        .map_err(|e| {
            let text = e.to_string();
            let line = text
                .lines()
                .find(|l| !l.trim().is_empty())
                .unwrap_or("invalid arguments")
                .trim_start_matches("error: ")
                .to_string();
            usage::<anyhow::Error>(format!("harness arguments after `--`: {line}"))
        })?;
        if parsed.test {
            return Err(usage(
                "harness arguments after `--`: `--test` would skip every bench; \
                 cargo memgaze runs benches",
            ));
        }
        let filters = parsed.filter.iter().cloned().chain(more_filters).collect();
        Ok(HarnessArgs { parsed, filters })
    }

    /// Whether the user asked only for the list (`--list`).
    pub fn list_requested(&self) -> bool {
        self.parsed.list
    }

    /// Whether ignored benches are selected (`--ignored` or
    /// `--include-ignored`).
    pub fn runs_ignored(&self) -> bool {
        self.parsed.ignored || self.parsed.include_ignored
    }

    /// Whether only ignored benches are selected (`--ignored`).
    pub fn only_ignored(&self) -> bool {
        self.parsed.ignored
    }

    /// The selection arguments, for `--list`: one command line per filter
    /// (`--exact`, `--skip`s, `--ignored`, then `-- <filter>`), or one
    /// without a filter. The benches selected are those any of them lists.
    pub fn selections(&self) -> Vec<Vec<String>> {
        let common = self.common_selection_args();
        if self.filters.is_empty() {
            return vec![common];
        }
        self.filters
            .iter()
            .map(|filter| {
                let mut args = common.clone();
                // After `--`, so a filter starting with `-` stays a filter.
                args.extend(["--".to_string(), filter.clone()]);
                args
            })
            .collect()
    }

    /// `--exact`, `--skip`s and `--ignored`.
    fn common_selection_args(&self) -> Vec<String> {
        let mut args = Vec::new();
        if self.parsed.exact {
            args.push("--exact".to_string());
        }
        for skip in &self.parsed.skip {
            args.push("--skip".to_string());
            args.push(skip.clone());
        }
        if self.parsed.ignored {
            args.push("--ignored".to_string());
        }
        args
    }

    /// Arguments that make a harness executable run exactly one bench in
    /// measure mode and report in libtest's JSON events.
    pub fn run_one_args(name: &str, ignored: bool) -> Vec<String> {
        let mut args = vec![
            "--bench".to_string(),
            "--format".to_string(),
            "json".to_string(),
        ];
        if ignored {
            args.push("--include-ignored".to_string());
        }
        args.extend(["--exact".to_string(), "--".to_string(), name.to_string()]);
        args
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use memgaze_error::{Exit, exit_for};

    fn parse(args: &[&str]) -> anyhow::Result<HarnessArgs> {
        HarnessArgs::parse(&args.iter().map(|s| s.to_string()).collect::<Vec<_>>())
    }

    #[test]
    fn selection_is_reproduced_for_listing() {
        let h = parse(&["chase"]).unwrap();
        assert_eq!(h.selections(), [["--", "chase"]]);
        let h = parse(&["--exact", "irr", "--skip", "a", "--skip", "b"]).unwrap();
        assert_eq!(
            h.selections(),
            [["--exact", "--skip", "a", "--skip", "b", "--", "irr"]]
        );
        let h = parse(&["--ignored", "--format", "json", "--test-threads", "4"]).unwrap();
        assert_eq!(h.selections(), [["--ignored"]]);
        assert!(h.runs_ignored() && h.only_ignored());
        assert!(parse(&["--list"]).unwrap().list_requested());
        assert_eq!(parse(&[]).unwrap().selections(), [Vec::<String>::new()]);
    }

    #[test]
    fn several_filters_are_one_listing_each() {
        // Filters before, between and after options, and after `--`.
        let h = parse(&["str", "--exact", "irr", "--skip", "x", "--", "-odd"]).unwrap();
        assert_eq!(
            h.selections(),
            [
                ["--exact", "--skip", "x", "--", "str"],
                ["--exact", "--skip", "x", "--", "irr"],
                ["--exact", "--skip", "x", "--", "-odd"],
            ]
        );
        // An option's value is not a filter.
        let h = parse(&["--format", "json", "a", "b"]).unwrap();
        assert_eq!(h.selections(), [["--", "a"], ["--", "b"]]);
    }

    #[test]
    fn bad_harness_arguments_are_usage_errors() {
        let e = parse(&["--no-such-flag"]).unwrap_err();
        assert_eq!(exit_for(&e), Exit::Usage);
        assert!(e.to_string().contains("--no-such-flag"), "{e}");
        assert_eq!(exit_for(&parse(&["--test"]).unwrap_err()), Exit::Usage);
    }

    #[test]
    fn one_bench_runs_by_exact_name_even_when_it_looks_like_a_flag() {
        assert_eq!(
            HarnessArgs::run_one_args("irr|str|irr", false),
            [
                "--bench",
                "--format",
                "json",
                "--exact",
                "--",
                "irr|str|irr"
            ]
        );
        assert_eq!(
            HarnessArgs::run_one_args("-x", true),
            [
                "--bench",
                "--format",
                "json",
                "--include-ignored",
                "--exact",
                "--",
                "-x"
            ]
        );
    }
}
