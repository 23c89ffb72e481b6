//! The stateful-operator contract, in the spirit of Arroyo's `ArrowOperator`: one trait
//! with the lifecycle a micro-batch drives. The streaming plan (`engine::plan`) runs one per
//! stateful node and the trigger loop commits and maintains them, knowing them only
//! through it. The window aggregate (`engine::aggregate`), deduplication
//! (`engine::dedup`) and the stream-stream join (`engine::join`, two inputs) implement it.
//!
//! Per batch `N`: `process_batch` (late rows judged by `WM(N-1)`, emission and eviction by
//! `WM(N)`), `commit(N + 1)` before the sink, `maintain` after the commit log. At a start,
//! `load(N)` reads the state version batch `N` starts from.

use async_trait::async_trait;
use datafusion::arrow::record_batch::RecordBatch;

use super::aggregate::{AggregateBatch, AggregateOperator, WindowKind};
use super::dedup::DedupOperator;
use super::join::JoinOperator;
use crate::error::Result;
use crate::state::StateMetrics;

/// What one batch did in an operator: its output rows and the counters progress reports.
pub type OperatorBatch = AggregateBatch;

#[async_trait]
pub trait StatefulOperator: Send {
    /// Spark's name for the operator in progress reports (`stateStoreSave`, ...).
    fn name(&self) -> &'static str;

    /// Whether a moved watermark alone makes a (no-data) batch due (spec §1.3).
    fn wants_no_data_batches(&self) -> bool;

    /// Loads state version `version` (batch `N` starts from version `N`:
    /// `BatchId::state_version`).
    fn load(&mut self, version: u64) -> Result<()>;

    /// Processes one batch's rows, one list per input (a join has two); times in
    /// microseconds.
    async fn process_batch(
        &mut self,
        inputs: Vec<Vec<RecordBatch>>,
        late_watermark_us: i64,
        watermark_us: i64,
    ) -> Result<OperatorBatch>;

    /// Commits the state as `version` (batch N commits N + 1:
    /// `BatchId::committed_state_version`); the state's metrics.
    fn commit(&mut self, version: u64) -> Result<StateMetrics>;

    /// Snapshots and removal of old versions, after the commit log.
    fn maintain(&mut self) -> Result<()>;
}

/// The rows of a one-input operator.
fn first_input(inputs: Vec<Vec<RecordBatch>>) -> Vec<RecordBatch> {
    inputs.into_iter().next().unwrap_or_default()
}

#[async_trait]
impl StatefulOperator for AggregateOperator {
    fn name(&self) -> &'static str {
        match self.info().window.as_ref().map(|w| w.kind) {
            Some(WindowKind::Session { .. }) => "sessionWindowStateStoreSaveExec",
            _ => "stateStoreSave",
        }
    }

    fn wants_no_data_batches(&self) -> bool {
        AggregateOperator::wants_no_data_batches(self)
    }

    fn load(&mut self, version: u64) -> Result<()> {
        self.state_mut().load(version)
    }

    async fn process_batch(
        &mut self,
        inputs: Vec<Vec<RecordBatch>>,
        late_watermark_us: i64,
        watermark_us: i64,
    ) -> Result<OperatorBatch> {
        self.process(first_input(inputs), late_watermark_us, watermark_us)
            .await
    }

    fn commit(&mut self, version: u64) -> Result<StateMetrics> {
        AggregateOperator::commit(self, version)
    }

    fn maintain(&mut self) -> Result<()> {
        AggregateOperator::maintain(self)
    }
}

#[async_trait]
impl StatefulOperator for DedupOperator {
    fn name(&self) -> &'static str {
        if self.info().within_watermark_us.is_some() {
            "dedupeWithinWatermark"
        } else {
            "dedupe"
        }
    }

    /// Spark runs a no-data batch for a deduplication whenever the watermark moves, whether
    /// or not it evicts anything (spec §7.1).
    fn wants_no_data_batches(&self) -> bool {
        true
    }

    fn load(&mut self, version: u64) -> Result<()> {
        self.state_mut().load(version)
    }

    async fn process_batch(
        &mut self,
        inputs: Vec<Vec<RecordBatch>>,
        late_watermark_us: i64,
        watermark_us: i64,
    ) -> Result<OperatorBatch> {
        self.process(first_input(inputs), late_watermark_us, watermark_us)
    }

    fn commit(&mut self, version: u64) -> Result<StateMetrics> {
        DedupOperator::commit(self, version)
    }

    fn maintain(&mut self) -> Result<()> {
        DedupOperator::maintain(self)
    }
}

#[async_trait]
impl StatefulOperator for JoinOperator {
    fn name(&self) -> &'static str {
        "symmetricHashJoin"
    }

    /// Spark's `shouldRunAnotherBatch`: when the watermark removes state and has moved.
    fn wants_no_data_batches(&self) -> bool {
        self.info().evicts()
    }

    fn load(&mut self, version: u64) -> Result<()> {
        JoinOperator::load(self, version)
    }

    async fn process_batch(
        &mut self,
        inputs: Vec<Vec<RecordBatch>>,
        late_watermark_us: i64,
        watermark_us: i64,
    ) -> Result<OperatorBatch> {
        self.process(inputs, late_watermark_us, watermark_us)
    }

    fn commit(&mut self, version: u64) -> Result<StateMetrics> {
        JoinOperator::commit(self, version)
    }

    fn maintain(&mut self) -> Result<()> {
        JoinOperator::maintain(self)
    }
}
