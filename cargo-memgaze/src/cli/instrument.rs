//! `cargo memgaze instrument`: the rewriter.
//!
//! Placeholder of the skeleton: the owning work item replaces it.

use super::Global;
use crate::error::Exit;

/// Arguments of `cargo memgaze instrument`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Arguments (not yet defined).
    #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
    pub rest: Vec<String>,
}

/// Runs the command.
pub fn run(_args: Args, _global: &Global) -> anyhow::Result<Exit> {
    anyhow::bail!("`instrument` is not implemented yet")
}
