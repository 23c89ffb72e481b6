//! Sources: where a streaming query's rows come from.

pub mod file;
