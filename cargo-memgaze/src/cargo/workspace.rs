//! [`Workspace`]: what `cargo metadata` says about the user's workspace, and
//! which packages a command line selects (cargo's rules), so bad selections
//! fail before anything is compiled.

use super::args::CargoArgs;
use super::layout::ResultsLayout;
use anyhow::{Context, bail};
use cargo_metadata::{Metadata, MetadataCommand, Package, TargetKind};
use std::path::{Path, PathBuf};

/// A workspace member as far as benches are concerned.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Member {
    /// Package name.
    pub name: String,
    /// Package version.
    pub version: String,
    /// Cargo's package id (as in `compiler-artifact` messages).
    pub id: String,
    /// Its `Cargo.toml`.
    pub manifest_path: PathBuf,
    /// Names of its bench targets (`[[bench]]` and `benches/*.rs`).
    pub bench_targets: Vec<String>,
    /// Whether any bench target has `required-features`.
    pub benches_need_features: bool,
    /// Bench targets cargo memgaze cannot run, known before building, with
    /// the reason (see `super::frameworks::unsupported_benches`).
    pub unsupported_benches: Vec<(String, String)>,
    /// Its `[package.metadata]` table (`null` when absent): where
    /// `[package.metadata.memgaze]` settings such as gate limits live.
    pub metadata: serde_json::Value,
}

/// The user's workspace: root, target directory, members, and the members
/// the command line selects.
#[derive(Clone, Debug)]
pub struct Workspace {
    /// The workspace root directory.
    pub root: PathBuf,
    /// The target directory: `--target-dir`, else what cargo uses
    /// (`CARGO_TARGET_DIR`, `build.target-dir`, `<root>/target`).
    pub target_dir: PathBuf,
    /// Every member, in `cargo metadata` order.
    pub members: Vec<Member>,
    /// Indices into `members` that the command line selects; `None` where
    /// that cannot be told without cargo (package ids given as URLs).
    pub selected: Option<Vec<usize>>,
}

impl Workspace {
    /// Runs `cargo metadata --no-deps` for the workspace `args` point at and
    /// resolves the package selection. Errors name an unknown package
    /// (`-p nope`) and the workspace; a manifest cargo cannot read gives
    /// cargo's own message.
    pub fn load(args: &CargoArgs) -> anyhow::Result<Workspace> {
        let mut command = MetadataCommand::new();
        command.no_deps();
        if let Some(path) = &args.manifest_path {
            command.manifest_path(path);
        }
        let lock: Vec<String> = args
            .lock_args()
            .into_iter()
            .filter_map(|a| a.into_string().ok())
            .collect();
        command.other_options(lock);
        let metadata = command.exec().map_err(|e| metadata_error(e, args))?;
        let current = current_manifest(args)?;
        Self::from_metadata(&metadata, args, current.as_deref())
    }

    /// Builds the workspace view from parsed metadata (`current`: the
    /// manifest cargo would act on, to apply its default selection).
    pub fn from_metadata(
        metadata: &Metadata,
        args: &CargoArgs,
        current: Option<&Path>,
    ) -> anyhow::Result<Workspace> {
        let packages = metadata.workspace_packages();
        let members: Vec<Member> = packages.iter().map(|p| member(p)).collect();
        let root = PathBuf::from(metadata.workspace_root.as_std_path());
        let target_dir = match &args.target_dir {
            Some(dir) => absolute(dir)?,
            None => PathBuf::from(metadata.target_directory.as_std_path()),
        };
        let selected = select(metadata, &members, args, current, &root)?;
        let workspace = Workspace {
            root,
            target_dir,
            members,
            selected,
        };
        for member in workspace.selected_members() {
            super::settings::check_settings(&member.metadata, &member.manifest_path)?;
        }
        Ok(workspace)
    }

    /// The selected members (every member when the selection is unknown).
    pub fn selected_members(&self) -> Vec<&Member> {
        match &self.selected {
            Some(indices) => indices.iter().map(|&i| &self.members[i]).collect(),
            None => self.members.iter().collect(),
        }
    }

    /// Whether `--bench '*'` builds every bench target of the selection:
    /// none has `required-features` (see [`CargoArgs::build_args`]).
    pub fn bench_glob_selects_all(&self) -> bool {
        self.selected.is_some()
            && self
                .selected_members()
                .iter()
                .all(|m| !m.benches_need_features)
    }

    /// The member with this package id.
    pub fn member_by_id(&self, id: &str) -> Option<&Member> {
        self.members.iter().find(|m| m.id == id)
    }

    /// Fails with a clear line when the selected packages have no bench
    /// target at all (cargo itself would only say that `--bench '*'`
    /// matched nothing).
    pub fn ensure_bench_targets(&self) -> anyhow::Result<()> {
        let Some(indices) = &self.selected else {
            return Ok(());
        };
        if indices
            .iter()
            .any(|&i| !self.members[i].bench_targets.is_empty())
        {
            return Ok(());
        }
        bail!(
            "no bench targets in {}: add a `[[bench]]` target with \
             `harness = false` (or a file in `benches/`) that uses memgaze-harness",
            packages_phrase(&self.selected_members())
        )
    }

    /// Fails with one line when a `--bench` name (or glob) matches no bench
    /// target of the selected packages, before cargo runs: cargo's own
    /// message for this is several lines and would be followed by ours for
    /// the failed build. Unknown selections (package ids as URLs) are left
    /// to cargo.
    pub fn ensure_bench_names(&self, names: &[String]) -> anyhow::Result<()> {
        if self.selected.is_none() {
            return Ok(());
        }
        let selected = self.selected_members();
        for name in names {
            let matches = target_name_matcher(name);
            if selected
                .iter()
                .any(|m| m.bench_targets.iter().any(|t| matches(t)))
            {
                continue;
            }
            let what = if is_glob(name) {
                format!("no bench target matches `{name}`")
            } else {
                format!("no bench target named `{name}`")
            };
            let place = packages_phrase(&selected);
            let qualified = selected.len() > 1;
            let mut benches: Vec<String> = selected
                .iter()
                .flat_map(|m| {
                    m.bench_targets.iter().map(move |t| match qualified {
                        true => format!("{}/{t}", m.name),
                        false => t.clone(),
                    })
                })
                .collect();
            benches.sort();
            bail!("{what} in {place} (benches: {})", benches.join(", "));
        }
        Ok(())
    }

    /// Where results go: `<target-dir>/memgaze/`.
    pub fn results_layout(&self) -> ResultsLayout {
        ResultsLayout::new(&self.target_dir)
    }
}

fn member(package: &Package) -> Member {
    Member {
        name: package.name.to_string(),
        version: package.version.to_string(),
        id: package.id.repr.clone(),
        manifest_path: PathBuf::from(package.manifest_path.as_std_path()),
        bench_targets: package
            .targets
            .iter()
            .filter(|t| t.kind.contains(&TargetKind::Bench))
            .map(|t| t.name.clone())
            .collect(),
        benches_need_features: package
            .targets
            .iter()
            .any(|t| t.kind.contains(&TargetKind::Bench) && !t.required_features.is_empty()),
        metadata: package.metadata.clone(),
        unsupported_benches: super::frameworks::unsupported_benches(package),
    }
}

/// "package `a`", "packages `a`, `b`" or "packages (none selected)", for
/// error lines about the selection.
fn packages_phrase(members: &[&Member]) -> String {
    let names: Vec<String> = members.iter().map(|m| format!("`{}`", m.name)).collect();
    match names.len() {
        0 => "packages (none selected)".to_string(),
        1 => format!("package {}", names[0]),
        _ => format!("packages {}", names.join(", ")),
    }
}

fn is_glob(name: &str) -> bool {
    name.contains(['*', '?', '['])
}

/// Whether a target name matches a `--bench` argument: equal, or as a glob
/// (cargo accepts `--bench 'micro*'`). A glob that does not parse is
/// compared literally; cargo then reports it.
fn target_name_matcher(name: &str) -> impl Fn(&str) -> bool + '_ {
    let glob = is_glob(name)
        .then(|| globset::Glob::new(name).ok())
        .flatten()
        .map(|g| g.compile_matcher());
    move |target: &str| match &glob {
        Some(glob) => glob.is_match(target),
        None => target == name,
    }
}

fn absolute(path: &Path) -> anyhow::Result<PathBuf> {
    std::path::absolute(path).with_context(|| format!("{}", path.display()))
}

/// The one line of a failed `cargo metadata`: cargo's last `error:` line.
fn metadata_error(error: cargo_metadata::Error, args: &CargoArgs) -> anyhow::Error {
    let place = match &args.manifest_path {
        Some(path) => path.display().to_string(),
        None => "the current directory".to_string(),
    };
    match error {
        cargo_metadata::Error::CargoMetadata { stderr } => {
            let line = stderr
                .lines()
                .rev()
                .find(|l| l.starts_with("error"))
                .or_else(|| stderr.lines().rev().find(|l| !l.trim().is_empty()))
                .unwrap_or("cargo metadata failed")
                .trim_start_matches("error: ")
                .to_string();
            anyhow::anyhow!("cannot read the cargo workspace of {place}: {line}")
        }
        other => {
            anyhow::Error::new(other).context(format!("cannot read the cargo workspace of {place}"))
        }
    }
}

/// The manifest cargo acts on: `--manifest-path`, else the nearest
/// `Cargo.toml` from the current directory up.
fn current_manifest(args: &CargoArgs) -> anyhow::Result<Option<PathBuf>> {
    if let Some(path) = &args.manifest_path {
        return Ok(Some(absolute(path)?));
    }
    let cwd = std::env::current_dir().context("current directory")?;
    Ok(cwd
        .ancestors()
        .map(|dir| dir.join("Cargo.toml"))
        .find(|candidate| candidate.is_file()))
}

fn same_file(a: &Path, b: &Path) -> bool {
    match (a.canonicalize(), b.canonicalize()) {
        (Ok(a), Ok(b)) => a == b,
        _ => a == b,
    }
}

/// Cargo's package selection: `-p` specs, `--workspace` minus `--exclude`,
/// else the package of the current manifest, or the workspace's default
/// members at its root.
fn select(
    metadata: &Metadata,
    members: &[Member],
    args: &CargoArgs,
    current: Option<&Path>,
    root: &Path,
) -> anyhow::Result<Option<Vec<usize>>> {
    let all: Vec<usize> = (0..members.len()).collect();
    if args.workspace {
        let mut kept = Vec::new();
        for i in all {
            let mut excluded = false;
            for spec in &args.exclude {
                match spec_matches(spec, &members[i]) {
                    Some(hit) => excluded |= hit,
                    None => return Ok(None),
                }
            }
            if !excluded {
                kept.push(i);
            }
        }
        return Ok(Some(kept));
    }
    if !args.packages.is_empty() {
        let mut chosen = Vec::new();
        for spec in &args.packages {
            let mut found = false;
            for (i, m) in members.iter().enumerate() {
                match spec_matches(spec, m) {
                    Some(true) => {
                        found = true;
                        if !chosen.contains(&i) {
                            chosen.push(i);
                        }
                    }
                    Some(false) => {}
                    None => return Ok(None),
                }
            }
            if !found {
                let names: Vec<&str> = members.iter().map(|m| m.name.as_str()).collect();
                bail!(
                    "package `{spec}` is not a member of the workspace at {} (members: {})",
                    root.display(),
                    names.join(", ")
                );
            }
        }
        return Ok(Some(chosen));
    }
    let Some(current) = current else {
        return Ok(None);
    };
    let root_manifest = root.join("Cargo.toml");
    if same_file(current, &root_manifest) && metadata.workspace_default_members.is_available() {
        let defaults = &*metadata.workspace_default_members;
        return Ok(Some(
            members
                .iter()
                .enumerate()
                .filter(|(_, m)| defaults.iter().any(|d| d.repr == m.id))
                .map(|(i, _)| i)
                .collect(),
        ));
    }
    Ok(members
        .iter()
        .position(|m| same_file(&m.manifest_path, current))
        .map(|i| vec![i]))
}

/// Whether a package spec names this member: `Some(bool)`, or `None` for
/// spec forms left to cargo (URLs, package ids).
fn spec_matches(spec: &str, member: &Member) -> Option<bool> {
    if spec.contains("://") || spec.contains('#') || spec.contains('+') {
        return None;
    }
    let (name, version) = match spec.split_once(['@', ':']) {
        Some((name, version)) => (name, Some(version)),
        None => (spec, None),
    };
    let name_matches = if name.contains(['*', '?', '[']) {
        globset::Glob::new(name)
            .ok()?
            .compile_matcher()
            .is_match(&member.name)
    } else {
        name == member.name
    };
    let version_matches =
        version.is_none_or(|v| member.version == v || member.version.starts_with(&format!("{v}.")));
    Some(name_matches && version_matches)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(name: &str, version: &str, benches: &[&str]) -> Member {
        Member {
            name: name.into(),
            version: version.into(),
            id: format!("path+file:///w/{name}#{version}"),
            manifest_path: PathBuf::from(format!("/w/{name}/Cargo.toml")),
            bench_targets: benches.iter().map(|s| s.to_string()).collect(),
            benches_need_features: false,
            metadata: serde_json::Value::Null,
            unsupported_benches: Vec::new(),
        }
    }

    #[test]
    fn package_specs_match_like_cargo() {
        let micro = m("microbenches", "0.1.0", &["micro"]);
        assert_eq!(spec_matches("microbenches", &micro), Some(true));
        assert_eq!(spec_matches("micro", &micro), Some(false));
        assert_eq!(spec_matches("micro*", &micro), Some(true));
        assert_eq!(spec_matches("microbenches@0.1", &micro), Some(true));
        assert_eq!(spec_matches("microbenches@0.1.0", &micro), Some(true));
        assert_eq!(spec_matches("microbenches@0.2", &micro), Some(false));
        assert_eq!(spec_matches("microbenches:0.1.0", &micro), Some(true));
        assert_eq!(
            spec_matches("path+file:///w/microbenches#0.1.0", &micro),
            None
        );
    }

    fn workspace(members: Vec<Member>, selected: Option<Vec<usize>>) -> Workspace {
        Workspace {
            root: "/w".into(),
            target_dir: "/w/target".into(),
            members,
            selected,
        }
    }

    #[test]
    fn no_bench_targets_is_an_error_naming_the_packages() {
        let ws = workspace(vec![m("a", "1.0.0", &[]), m("b", "1.0.0", &["x"])], None);
        assert!(ws.ensure_bench_targets().is_ok());
        let ws = workspace(ws.members, Some(vec![0]));
        let e = ws.ensure_bench_targets().unwrap_err().to_string();
        assert!(e.starts_with("no bench targets in package `a`:"), "{e}");
        let ws = workspace(ws.members, Some(vec![1]));
        assert!(ws.ensure_bench_targets().is_ok());
    }

    #[test]
    fn unknown_bench_names_are_one_line_naming_the_targets() {
        let ws = workspace(
            vec![
                m("a", "1.0.0", &["micro", "macro"]),
                m("b", "1.0.0", &["x"]),
            ],
            Some(vec![0]),
        );
        assert!(ws.ensure_bench_names(&[]).is_ok());
        assert!(ws.ensure_bench_names(&["micro".into()]).is_ok());
        assert!(ws.ensure_bench_names(&["mi*".into()]).is_ok());
        let e = ws
            .ensure_bench_names(&["x".into()])
            .unwrap_err()
            .to_string();
        assert_eq!(
            e,
            "no bench target named `x` in package `a` (benches: macro, micro)"
        );
        let e = ws
            .ensure_bench_names(&["z*".into()])
            .unwrap_err()
            .to_string();
        assert_eq!(
            e,
            "no bench target matches `z*` in package `a` (benches: macro, micro)"
        );
        let ws = workspace(ws.members, Some(vec![0, 1]));
        assert!(ws.ensure_bench_names(&["x".into(), "micro".into()]).is_ok());
        let e = ws
            .ensure_bench_names(&["nope".into()])
            .unwrap_err()
            .to_string();
        assert_eq!(
            e,
            "no bench target named `nope` in packages `a`, `b` (benches: a/macro, a/micro, b/x)"
        );
        // A selection only cargo can resolve is left to cargo.
        let ws = workspace(ws.members, None);
        assert!(ws.ensure_bench_names(&["nope".into()]).is_ok());
    }

    #[test]
    fn results_go_under_the_target_dir() {
        let ws = workspace(vec![], None);
        assert_eq!(ws.results_layout().root(), Path::new("/w/target/memgaze"));
    }
}
