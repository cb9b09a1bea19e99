//! Locality metrics of a trace (spec/METRICS.md): summary, trace windows,
//! code windows, reuse distance, execution intervals and hot regions.
