//! The MemGaze microbenchmark kernels.
//!
//! Placeholder of the skeleton: the owning work item replaces it.
