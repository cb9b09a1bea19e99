//! Sets `MEMGAZE_LONG_VERSION`, what `--version` prints: the package
//! version and, when built from a git checkout of this repository, the
//! commit and its date (`0.1.0 (cc086bc4a 2026-11-26)`, as cargo prints
//! its own). Outside a checkout (a crates.io build), or where git is
//! missing, it is the package version alone.

use std::path::Path;
use std::process::Command;

fn git(dir: &Path, args: &[&str]) -> Option<String> {
    let out = Command::new("git")
        .args(args)
        .current_dir(dir)
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
        .filter(|s| !s.is_empty())
}

fn main() {
    let dir = std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR");
    let dir = Path::new(&dir);
    let version = std::env::var("CARGO_PKG_VERSION").expect("cargo sets CARGO_PKG_VERSION");
    // A crate unpacked inside some other repository (a home directory kept
    // in git) is not a checkout of this one: its manifest must be tracked.
    let tracked = git(dir, &["ls-files", "--error-unmatch", "Cargo.toml"]).is_some();
    let commit = tracked
        .then(|| {
            git(
                dir,
                &["log", "-1", "--abbrev=9", "--date=short", "--format=%h %cd"],
            )
        })
        .flatten();
    let long = match &commit {
        Some(commit) => format!("{version} ({commit})"),
        None => version,
    };
    println!("cargo:rustc-env=MEMGAZE_LONG_VERSION={long}");
    println!("cargo:rerun-if-changed=build.rs");
    // A new commit moves HEAD or the branch it points to (loose or packed).
    // Only files that exist are watched: cargo reruns a build script
    // every time for a path that does not.
    if commit.is_some() {
        let mut watched = vec!["HEAD".to_string(), "packed-refs".to_string()];
        watched.extend(git(dir, &["symbolic-ref", "-q", "HEAD"]));
        for path in watched {
            if let Some(file) = git(dir, &["rev-parse", "--git-path", &path]) {
                let file = dir.join(file);
                if file.exists() {
                    println!("cargo:rerun-if-changed={}", file.display());
                }
            }
        }
    }
}
