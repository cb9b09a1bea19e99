//! Terminal tables of an [`Analysis`](super::Analysis).
