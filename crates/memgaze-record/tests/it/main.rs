//! Integration tests of `memgaze-record`, one test binary with a module per area.

mod libipt;
mod linger;
mod pt_decode_robust;
mod pt_libipt;
mod pt_reconstruct;
mod spatial;
