//! [`CargoArgs`]: cargo's package, target, feature and build flags, as the
//! commands that build benches (`bench`, `golden`, `validate`) accept them.

use std::ffi::OsString;
use std::path::PathBuf;

/// The profile benches are built with unless `--profile` says otherwise.
pub const DEFAULT_PROFILE: &str = "bench";

/// Cargo's flags that choose what to build and how, forwarded to
/// `cargo build` (flatten into a command's `Args`).
#[derive(clap::Args, Debug, Clone, PartialEq, Eq)]
pub struct CargoArgs {
    /// Package to benchmark (repeatable; `name`, `name@version` or a glob).
    #[arg(
        short = 'p',
        long = "package",
        value_name = "SPEC",
        help_heading = "Package Selection"
    )]
    pub packages: Vec<String>,
    /// Benchmark every package of the workspace.
    #[arg(long, alias = "all", help_heading = "Package Selection")]
    pub workspace: bool,
    /// Leave a package out of `--workspace` (repeatable).
    #[arg(
        long,
        value_name = "SPEC",
        requires = "workspace",
        help_heading = "Package Selection"
    )]
    pub exclude: Vec<String>,
    /// Only this bench target (repeatable; a glob such as `'micro*'` works).
    /// Default: every `[[bench]]` target of the selected packages.
    #[arg(long = "bench", value_name = "NAME", help_heading = "Target Selection")]
    pub bench_targets: Vec<String>,
    /// Every target with `bench = true`, as `cargo bench` builds them (the
    /// default is only `[[bench]]` targets; libraries and binaries built as
    /// libtest benches are never memgaze benches and are skipped).
    #[arg(long = "benches", help_heading = "Target Selection")]
    pub all_bench_targets: bool,
    /// Features to enable (space- or comma-separated, repeatable).
    #[arg(
        short = 'F',
        long,
        value_name = "FEATURES",
        help_heading = "Feature Selection"
    )]
    pub features: Vec<String>,
    /// Enable every feature of the selected packages.
    #[arg(long, help_heading = "Feature Selection")]
    pub all_features: bool,
    /// Do not enable the `default` feature.
    #[arg(long, help_heading = "Feature Selection")]
    pub no_default_features: bool,
    /// Path to the `Cargo.toml` to work on.
    #[arg(long, value_name = "PATH", help_heading = "Manifest Options")]
    pub manifest_path: Option<PathBuf>,
    /// Assert that `Cargo.lock` stays unchanged.
    #[arg(long, help_heading = "Manifest Options")]
    pub locked: bool,
    /// Run without accessing the network.
    #[arg(long, help_heading = "Manifest Options")]
    pub offline: bool,
    /// `--locked` and `--offline` together.
    #[arg(long, help_heading = "Manifest Options")]
    pub frozen: bool,
    /// Directory for all generated artifacts (also where `memgaze/` results go).
    #[arg(long, value_name = "DIRECTORY", help_heading = "Compilation Options")]
    pub target_dir: Option<PathBuf>,
    /// Build with this profile; benches get line-table debug info and keep
    /// their symbols whatever the profile says.
    #[arg(
        long,
        value_name = "PROFILE-NAME",
        default_value = DEFAULT_PROFILE,
        help_heading = "Compilation Options"
    )]
    pub profile: String,
    /// Number of parallel build jobs.
    #[arg(
        short = 'j',
        long,
        value_name = "N",
        allow_hyphen_values = true,
        help_heading = "Compilation Options"
    )]
    pub jobs: Option<String>,
}

impl Default for CargoArgs {
    fn default() -> Self {
        CargoArgs {
            packages: Vec::new(),
            workspace: false,
            exclude: Vec::new(),
            bench_targets: Vec::new(),
            all_bench_targets: false,
            features: Vec::new(),
            all_features: false,
            no_default_features: false,
            manifest_path: None,
            locked: false,
            offline: false,
            frozen: false,
            target_dir: None,
            profile: DEFAULT_PROFILE.to_string(),
            jobs: None,
        }
    }
}

impl CargoArgs {
    /// The arguments after `cargo build` (without `--message-format`).
    ///
    /// Without `--bench`/`--benches`: when `glob_selects_all` (no selected
    /// bench target has `required-features`), `--bench '*'` builds every
    /// `[[bench]]` target and nothing else; otherwise `--benches`, which
    /// skips targets whose required features are off (a named or glob
    /// selection fails on them) but also builds libraries and binaries with
    /// `bench = true` as libtest executables, which are then ignored.
    pub fn build_args(&self, glob_selects_all: bool) -> Vec<OsString> {
        let mut args: Vec<OsString> = Vec::new();
        let mut flag = |name: &str, value: Option<&OsString>| {
            args.push(name.into());
            if let Some(value) = value {
                args.push(value.clone());
            }
        };
        for package in &self.packages {
            flag("--package", Some(&package.into()));
        }
        if self.workspace {
            flag("--workspace", None);
        }
        for package in &self.exclude {
            flag("--exclude", Some(&package.into()));
        }
        let default_selection = self.bench_targets.is_empty() && !self.all_bench_targets;
        if default_selection && glob_selects_all {
            flag("--bench", Some(&"*".into()));
        }
        for bench in &self.bench_targets {
            flag("--bench", Some(&bench.into()));
        }
        if self.all_bench_targets || (default_selection && !glob_selects_all) {
            flag("--benches", None);
        }
        if !self.features.is_empty() {
            flag("--features", Some(&self.features.join(",").into()));
        }
        if self.all_features {
            flag("--all-features", None);
        }
        if self.no_default_features {
            flag("--no-default-features", None);
        }
        if let Some(path) = &self.manifest_path {
            flag("--manifest-path", Some(&path.into()));
        }
        if let Some(dir) = &self.target_dir {
            flag("--target-dir", Some(&dir.into()));
        }
        flag("--profile", Some(&(&self.profile).into()));
        if let Some(jobs) = &self.jobs {
            flag("--jobs", Some(&jobs.into()));
        }
        args.extend(self.lock_args());
        args
    }

    /// `--locked`/`--offline`/`--frozen`, for every cargo command we run.
    pub fn lock_args(&self) -> Vec<OsString> {
        [
            (self.locked, "--locked"),
            (self.offline, "--offline"),
            (self.frozen, "--frozen"),
        ]
        .into_iter()
        .filter(|(on, _)| *on)
        .map(|(_, flag)| flag.into())
        .collect()
    }

    /// The `--config` arguments that give the bench executables what the
    /// later stages need without touching the user's `Cargo.toml`: line
    /// tables (`debug = "line-tables-only"`, for source lines) and a symbol
    /// table (`strip = "none"`, for functions and the region markers), as
    /// profile overrides of `packages` only (the workspace's members).
    ///
    /// Dependencies keep the profile the user's `cargo bench` builds them
    /// with, so their artifacts are shared and the first `cargo memgaze
    /// bench` after a `cargo bench` rebuilds only the members (whose
    /// artifacts then exist side by side: cargo hashes the profile into
    /// their names, so neither command rebuilds what the other built). A
    /// setting the user gives through `CARGO_PROFILE_<P>_DEBUG`/`_STRIP` is
    /// left alone.
    pub fn profile_config(&self, packages: &[String]) -> Vec<String> {
        let upper = self.profile.to_ascii_uppercase().replace('-', "_");
        let mut args = Vec::new();
        for (key, value) in [("debug", "line-tables-only"), ("strip", "none")] {
            let user = format!("CARGO_PROFILE_{upper}_{}", key.to_ascii_uppercase());
            if std::env::var_os(&user).is_some() {
                continue;
            }
            for package in packages {
                args.push("--config".to_string());
                args.push(format!(
                    "profile.{}.package.{package}.{key}=\"{value}\"",
                    self.profile
                ));
            }
        }
        args
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser, Debug)]
    struct Cli {
        #[command(flatten)]
        cargo: CargoArgs,
    }

    fn parse(args: &[&str]) -> CargoArgs {
        Cli::try_parse_from(std::iter::once("x").chain(args.iter().copied()))
            .unwrap()
            .cargo
    }

    fn strings(args: Vec<OsString>) -> Vec<String> {
        args.into_iter().map(|a| a.into_string().unwrap()).collect()
    }

    #[test]
    fn default_builds_every_bench_target_with_the_bench_profile() {
        assert_eq!(parse(&[]), CargoArgs::default());
        assert_eq!(
            strings(parse(&[]).build_args(true)),
            ["--bench", "*", "--profile", "bench"]
        );
        assert_eq!(
            strings(parse(&[]).build_args(false)),
            ["--benches", "--profile", "bench"]
        );
    }

    #[test]
    fn flags_are_forwarded_in_cargo_spelling() {
        let args = parse(&[
            "-p",
            "a",
            "--package",
            "b@1.0",
            "--bench",
            "micro",
            "--bench",
            "x*",
            "-F",
            "worse",
            "--features",
            "f g",
            "--no-default-features",
            "--manifest-path",
            "w/Cargo.toml",
            "--target-dir",
            "t",
            "--profile",
            "release",
            "-j",
            "2",
            "--locked",
            "--offline",
        ]);
        assert_eq!(
            strings(args.build_args(false)),
            [
                "--package",
                "a",
                "--package",
                "b@1.0",
                "--bench",
                "micro",
                "--bench",
                "x*",
                "--features",
                "worse,f g",
                "--no-default-features",
                "--manifest-path",
                "w/Cargo.toml",
                "--target-dir",
                "t",
                "--profile",
                "release",
                "--jobs",
                "2",
                "--locked",
                "--offline",
            ]
        );
        let all = parse(&[
            "--workspace",
            "--exclude",
            "c",
            "--benches",
            "--all-features",
            "--frozen",
        ]);
        assert_eq!(
            strings(all.build_args(true)),
            [
                "--workspace",
                "--exclude",
                "c",
                "--benches",
                "--all-features",
                "--profile",
                "bench",
                "--frozen"
            ]
        );
    }

    #[test]
    fn exclude_needs_workspace() {
        let err = Cli::try_parse_from(["x", "--exclude", "c"]).unwrap_err();
        assert_eq!(err.kind(), clap::error::ErrorKind::MissingRequiredArgument);
    }

    #[test]
    fn profile_config_overrides_the_members_of_the_chosen_profile() {
        let args = CargoArgs {
            profile: "my-prof".into(),
            ..CargoArgs::default()
        };
        let config = args.profile_config(&["a-b".into(), "c".into()]);
        assert_eq!(
            config,
            [
                "--config",
                "profile.my-prof.package.a-b.debug=\"line-tables-only\"",
                "--config",
                "profile.my-prof.package.c.debug=\"line-tables-only\"",
                "--config",
                "profile.my-prof.package.a-b.strip=\"none\"",
                "--config",
                "profile.my-prof.package.c.strip=\"none\"",
            ]
        );
    }
}
