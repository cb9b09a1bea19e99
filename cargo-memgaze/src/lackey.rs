//! Importing Valgrind Lackey `--trace-mem=yes` logs as full traces.
