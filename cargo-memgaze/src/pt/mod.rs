//! The Intel PT backend: capability probing, perf AUX collection, packet
//! decoding and address reconstruction.
//!
//! - [`sysfs`]: PMU descriptions (`type`, `format/*`, `caps/*`) from sysfs.
//! - [`packet`], [`decode`], [`encode`]: the PT packet layer and the
//!   streaming `ptwrite` event decoder.

pub mod collect;
pub mod config;
pub mod decode;
pub mod encode;
pub mod packet;
pub mod probe;
pub mod ring;
pub mod sysfs;
