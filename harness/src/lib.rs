//! The benchmark harness of cargo memgaze.
//!
//! Placeholder of the skeleton: the owning work item replaces it.
