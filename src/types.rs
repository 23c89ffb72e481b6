//! Identifiers shared by every layer: a leaf module that imports nothing of Tidemark's.

/// A micro-batch id: 0, 1, 2, … never skipping (Spark's batch id). Batch `N` reads state
/// version `N` and commits version `N + 1`.
pub type BatchId = u64;
