//! Identifiers shared by every layer: a leaf module that imports nothing of Tidemark's.

use std::fmt;

use serde::{Deserialize, Serialize};

/// A micro-batch id: 0, 1, 2, … never skipping (Spark's batch id). Batch `N` reads state
/// version `N` and commits version `N + 1`; its files are `offsets/N` and `commits/N`; a
/// Delta sink tags its commit with transaction version `N`.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
#[serde(transparent)]
pub struct BatchId(pub u64);

impl BatchId {
    /// The batch after this one.
    pub fn next(self) -> BatchId {
        BatchId(self.0 + 1)
    }

    /// The batch before this one; `None` for batch 0.
    pub fn prev(self) -> Option<BatchId> {
        self.0.checked_sub(1).map(BatchId)
    }

    /// The state version this batch starts from (`N`).
    pub fn state_version(self) -> u64 {
        self.0
    }

    /// The state version this batch commits (`N + 1`).
    pub fn committed_state_version(self) -> u64 {
        self.0 + 1
    }

    pub fn get(self) -> u64 {
        self.0
    }
}

impl fmt::Display for BatchId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batch_n_reads_version_n_and_commits_n_plus_one() {
        let b = BatchId(7);
        assert_eq!((b.state_version(), b.committed_state_version()), (7, 8));
        assert_eq!(b.next(), BatchId(8));
        assert_eq!(b.prev(), Some(BatchId(6)));
        assert_eq!(BatchId(0).prev(), None);
        assert_eq!(b.to_string(), "7");
        assert_eq!(serde_json::to_string(&b).unwrap(), "7");
    }
}
