//! Integration tests of `memgaze-trace`, one test binary with a module per area.

mod trace_format;
