//! Baselines and regression limits.
