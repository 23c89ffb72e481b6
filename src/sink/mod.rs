//! Sinks: where a streaming query's rows go.

pub mod delta;
pub mod file;
