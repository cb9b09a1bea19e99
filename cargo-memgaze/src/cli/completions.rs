//! `cargo memgaze completions SHELL`: a completion script for the
//! `cargo-memgaze` command, written to stdout.
//!
//! The script completes `cargo-memgaze <subcommand> …` (the binary accepts
//! being run directly, see [`super::normalize_args`]). It is generated for
//! that name rather than for `cargo`: a script for `cargo` would replace
//! the completion of cargo itself, which does not hand over to its
//! subcommands.

use super::{Global, MemgazeCli};
use clap_complete::Shell;
use memgaze_error::Exit;

/// `completions` arguments.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// The shell to write a completion script for.
    #[arg(value_enum)]
    pub shell: Shell,
}

/// The binary name the scripts complete.
pub const BIN_NAME: &str = "cargo-memgaze";

/// Writes the completion script of `shell` to `out`.
pub fn write_script(shell: Shell, out: &mut dyn std::io::Write) -> std::io::Result<()> {
    // Built from the memgaze arguments alone: taken out of the `cargo`
    // command, its subcommands would keep `cargo memgaze …` names.
    let command = <MemgazeCli as clap::Args>::augment_args(clap::Command::new(BIN_NAME));
    if shell != Shell::Bash {
        clap_complete::generate(shell, &mut command.bin_name(BIN_NAME), BIN_NAME, out);
        return Ok(());
    }
    // clap_complete's bash script names its states after the binary and
    // spells a `-` in it one way when entering a subcommand and another
    // when completing it, so nothing after `cargo-memgaze bench` would
    // complete: generate it for a name without `-`, then register it
    // for the real one.
    const PLAIN: &str = "cargo_memgaze";
    let mut script = Vec::new();
    clap_complete::generate(shell, &mut command.bin_name(PLAIN), PLAIN, &mut script);
    let script = String::from_utf8_lossy(&script);
    for line in script.lines() {
        match line.strip_suffix(&format!(" {PLAIN}")) {
            Some(start) if line.trim_start().starts_with("complete ") => {
                writeln!(out, "{start} {BIN_NAME}")?;
            }
            _ => writeln!(out, "{line}")?,
        }
    }
    Ok(())
}

/// Runs `completions`.
pub fn run(args: Args, _global: &Global) -> anyhow::Result<Exit> {
    let mut stdout = std::io::stdout().lock();
    write_script(args.shell, &mut stdout)?;
    Ok(Exit::Ok)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bash_script_completes_subcommands_and_their_flags() {
        let mut script = Vec::new();
        write_script(Shell::Bash, &mut script).unwrap();
        let script = String::from_utf8(script).unwrap();
        assert!(
            script.contains(
                "complete -F _cargo_memgaze -o nosort -o bashdefault -o default cargo-memgaze"
            ),
            "{script}"
        );
        for word in [
            "bench",
            "report",
            "completions",
            "--save-baseline",
            "--limits",
        ] {
            assert!(script.contains(word), "no {word} in the script");
        }
    }
}
