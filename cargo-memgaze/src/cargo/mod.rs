//! Cargo integration: building bench targets and finding their executables.
