//! The Intel PT backend: capability probing, perf AUX collection, packet
//! decoding and address reconstruction.
