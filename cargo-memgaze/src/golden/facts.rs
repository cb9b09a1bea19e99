//! [`BuildFacts`]: what a golden snapshot's metrics depend on besides the
//! code — the compiler, the target, the profile, features and the benches'
//! size variables — recorded in the snapshot's metadata.
//!
//! A snapshot recorded under other facts is not a regression of the code but
//! of the environment: `golden` and `validate` then say so once, naming the
//! difference and suggesting `--update`, instead of a diff per bench.

use crate::cargo::CargoArgs;
use anyhow::{Context, bail};
use std::process::Command;

/// Environment variables of cargo memgaze itself, never bench inputs.
const OWN_VARIABLES: &[&str] = &["MEMGAZE_RECORDING", "MEMGAZE_RECORDER"];

/// The sampling-independent facts a full-trace measurement depends on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BuildFacts {
    /// First line of `rustc -vV` (`rustc 1.95.0 (hash date)`).
    pub rustc: String,
    /// Target triple (the host: benches are built for it).
    pub host: String,
    /// Cargo profile the benches were built with.
    pub profile: String,
    /// Feature flags given (`--features a,b --no-default-features`), empty
    /// when none.
    pub features: String,
    /// `MEMGAZE_*` variables in the environment (bench inputs such as
    /// `MEMGAZE_MICRO_ELEMENTS`), sorted, `NAME=value` separated by spaces.
    pub env: String,
}

impl BuildFacts {
    /// The facts of this run: asks `rustc -vV` (the `rustc` cargo would use:
    /// `$RUSTC`, else `rustc`) and reads the environment.
    pub fn current(cargo: &CargoArgs) -> anyhow::Result<BuildFacts> {
        let rustc = std::env::var_os("RUSTC").unwrap_or_else(|| "rustc".into());
        let output = Command::new(&rustc)
            .arg("-vV")
            .output()
            .with_context(|| format!("cannot run `{} -vV`", rustc.to_string_lossy()))?;
        if !output.status.success() {
            bail!(
                "`{} -vV` failed: {}",
                rustc.to_string_lossy(),
                String::from_utf8_lossy(&output.stderr).trim()
            );
        }
        let text = String::from_utf8_lossy(&output.stdout);
        let (version, host) = parse_rustc_vv(&text)?;
        let env: Vec<(String, String)> = std::env::vars()
            // Where instrumented libraries are cached changes no metric.
            .filter(|(name, _)| name.starts_with("MEMGAZE_") && name != "MEMGAZE_LIBS_CACHE")
            .collect();
        Ok(BuildFacts {
            rustc: version,
            host,
            profile: cargo.profile.clone(),
            features: feature_flags(cargo),
            env: env_line(env),
        })
    }

    /// `(key, value)` pairs in file order.
    pub fn fields(&self) -> Vec<(&'static str, String)> {
        vec![
            ("rustc", self.rustc.clone()),
            ("host", self.host.clone()),
            ("profile", self.profile.clone()),
            ("features", self.features.clone()),
            ("env", self.env.clone()),
        ]
    }

    /// Inverse of [`BuildFacts::fields`]; every field must be present.
    pub fn from_fields(fields: &[(String, String)]) -> anyhow::Result<BuildFacts> {
        let get = |key: &str| {
            fields
                .iter()
                .find(|(k, _)| k == key)
                .map(|(_, v)| v.clone())
                .with_context(|| format!("missing `{key}`"))
        };
        Ok(BuildFacts {
            rustc: get("rustc")?,
            host: get("host")?,
            profile: get("profile")?,
            features: get("features")?,
            env: get("env")?,
        })
    }

    /// The differences from `other` as `name: ours ≠ theirs` phrases.
    pub fn differences(&self, other: &BuildFacts) -> Vec<String> {
        self.fields()
            .into_iter()
            .zip(other.fields())
            .filter(|((_, a), (_, b))| a != b)
            .map(|((key, a), (_, b))| format!("{key} {} vs {}", shown(&a), shown(&b)))
            .collect()
    }
}

fn shown(value: &str) -> String {
    if value.is_empty() {
        "(none)".to_string()
    } else {
        format!("`{value}`")
    }
}

/// `NAME=value` pairs of bench-input variables, sorted, space-separated.
fn env_line(mut vars: Vec<(String, String)>) -> String {
    vars.retain(|(name, _)| !OWN_VARIABLES.contains(&name.as_str()));
    vars.sort();
    vars.iter()
        .map(|(name, value)| format!("{name}={value}"))
        .collect::<Vec<_>>()
        .join(" ")
}

fn feature_flags(cargo: &CargoArgs) -> String {
    let mut features: Vec<&str> = cargo
        .features
        .iter()
        .flat_map(|f| f.split([' ', ',']))
        .filter(|f| !f.is_empty())
        .collect();
    features.sort_unstable();
    features.dedup();
    let mut parts = Vec::new();
    if !features.is_empty() {
        parts.push(format!("--features {}", features.join(",")));
    }
    if cargo.all_features {
        parts.push("--all-features".to_string());
    }
    if cargo.no_default_features {
        parts.push("--no-default-features".to_string());
    }
    parts.join(" ")
}

/// `(first line, host)` of `rustc -vV` output.
fn parse_rustc_vv(text: &str) -> anyhow::Result<(String, String)> {
    let version = text
        .lines()
        .next()
        .filter(|l| l.starts_with("rustc "))
        .context("`rustc -vV` printed no version line")?;
    let host = text
        .lines()
        .find_map(|l| l.strip_prefix("host: "))
        .context("`rustc -vV` printed no `host:` line")?;
    Ok((version.trim().to_string(), host.trim().to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rustc_vv_gives_version_and_host() {
        let text = "rustc 1.95.0 (59807616e 2026-04-14)\nbinary: rustc\ncommit-hash: 5980\nhost: x86_64-unknown-linux-gnu\nrelease: 1.95.0\nLLVM version: 20.1.8\n";
        let (version, host) = parse_rustc_vv(text).unwrap();
        assert_eq!(version, "rustc 1.95.0 (59807616e 2026-04-14)");
        assert_eq!(host, "x86_64-unknown-linux-gnu");
        assert!(parse_rustc_vv("nonsense").is_err());
    }

    #[test]
    fn features_and_env_are_canonical() {
        let cargo = CargoArgs {
            features: vec!["b a".into(), "a,c".into()],
            no_default_features: true,
            ..CargoArgs::default()
        };
        assert_eq!(
            feature_flags(&cargo),
            "--features a,b,c --no-default-features"
        );
        assert_eq!(feature_flags(&CargoArgs::default()), "");
        let env = env_line(vec![
            ("MEMGAZE_MICRO_REPS".into(), "2".into()),
            ("MEMGAZE_RECORDING".into(), "1".into()),
            ("MEMGAZE_MICRO_ELEMENTS".into(), "64".into()),
        ]);
        assert_eq!(env, "MEMGAZE_MICRO_ELEMENTS=64 MEMGAZE_MICRO_REPS=2");
    }

    #[test]
    fn the_current_toolchain_is_found() {
        let facts = BuildFacts::current(&CargoArgs::default()).unwrap();
        assert!(facts.rustc.starts_with("rustc "), "{facts:?}");
        assert_eq!(facts.profile, "bench");
        let fields: Vec<(String, String)> = facts
            .fields()
            .into_iter()
            .map(|(k, v)| (k.to_string(), v))
            .collect();
        assert_eq!(BuildFacts::from_fields(&fields).unwrap(), facts);
    }

    #[test]
    fn differences_name_each_fact() {
        let a = BuildFacts::current(&CargoArgs::default()).unwrap();
        let mut b = a.clone();
        b.rustc = "rustc 1.94.0".into();
        b.env = String::new();
        let d = b.differences(&a);
        assert_eq!(d[0], format!("rustc `rustc 1.94.0` vs `{}`", a.rustc));
        assert!(a.differences(&a).is_empty());
    }
}
