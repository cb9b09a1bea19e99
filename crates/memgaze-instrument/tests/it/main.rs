//! Integration tests of `memgaze-instrument`, one test binary with a module per area.

mod cfg;
mod classify_kernels;
mod copy_symbols;
mod discovery;
