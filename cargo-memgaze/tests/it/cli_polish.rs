//! What users expect of any command-line tool, through the built binary:
//! `--version` names the commit it was built from, `completions` writes a
//! script bash can use, and `--color` decides whether the `error:` prefix
//! is coloured.

use std::path::Path;
use std::process::{Command, Output};

fn memgaze(args: &[&str]) -> Output {
    crate::support::memgaze_command()
        .args(args)
        .env_remove("NO_COLOR")
        .output()
        .unwrap()
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[test]
fn version_names_the_commit_when_built_from_a_checkout() {
    let out = memgaze(&["--version"]);
    assert_eq!(out.status.code(), Some(0));
    let version = text(&out.stdout);
    let manifest_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let commit = Command::new("git")
        .args(["log", "-1", "--abbrev=9", "--date=short", "--format=%h %cd"])
        .current_dir(manifest_dir)
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| text(&o.stdout).trim().to_string());
    let expected = match commit {
        Some(commit) => format!("cargo-memgaze {} ({commit})\n", env!("CARGO_PKG_VERSION")),
        // Built outside a git checkout (a crates.io package): the version alone.
        None => format!("cargo-memgaze {}\n", env!("CARGO_PKG_VERSION")),
    };
    assert_eq!(version, expected);
    // Every subcommand reports the same version (under its own name).
    let bench = text(&memgaze(&["bench", "--version"]).stdout);
    assert_eq!(
        bench.split_once(' ').map(|(_, v)| v),
        expected.split_once(' ').map(|(_, v)| v),
        "{bench}"
    );
}

#[test]
fn bash_completes_subcommands_and_flags_from_the_generated_script() {
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("cargo-memgaze.bash");
    let out = memgaze(&["completions", "bash"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    std::fs::write(&script, &out.stdout).unwrap();
    let complete = |words: &str| {
        let line = format!(
            "source '{}'; COMP_WORDS=({words}); COMP_CWORD=$((${{#COMP_WORDS[@]}} - 1)); \
             _cargo_memgaze cargo-memgaze \"${{COMP_WORDS[-1]}}\" \"${{COMP_WORDS[-2]}}\"; \
             printf '%s\\n' \"${{COMPREPLY[@]}}\"",
            script.display()
        );
        let out = Command::new("bash").args(["-c", &line]).output().unwrap();
        assert!(out.status.success(), "{}", text(&out.stderr));
        text(&out.stdout)
    };
    assert_eq!(complete("cargo-memgaze be"), "bench\n");
    assert!(
        complete("cargo-memgaze bench --save-b").contains("--save-baseline"),
        "{}",
        complete("cargo-memgaze bench --save-b")
    );
    let out = memgaze(&["completions", "nosh"]);
    assert_eq!(out.status.code(), Some(2));
}

#[test]
fn color_always_colours_the_error_prefix_and_never_does_not() {
    let missing = "/nonexistent/analysis.json";
    let out = memgaze(&["report", missing, "--color", "always"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).starts_with("\x1b[1;31merror:\x1b[0m /nonexistent/analysis.json: "),
        "{:?}",
        text(&out.stderr)
    );
    for args in [
        vec!["report", missing, "--color", "never"],
        vec!["report", missing],
    ] {
        let out = memgaze(&args);
        assert!(
            text(&out.stderr).starts_with("error: /nonexistent/analysis.json: "),
            "{args:?}: {:?}",
            text(&out.stderr)
        );
    }
}
