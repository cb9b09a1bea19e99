//! Golden full-trace snapshots and accuracy validation of sampled runs.
