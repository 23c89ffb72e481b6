//! The scan of a sink table's rows in the read cache, bound to one table version.
//!
//! A plan over a sink table reads the version that was latest when the plan was made. A
//! kept plan (`server::plans`) runs again on a later version by binding each of its scans
//! anew ([`CachedScanExec::bound`]): the rest of the plan stays as planned, since
//! nothing in it depends on the rows (the scan reports no statistics, so no optimizer rule
//! folds a row count into the plan).

use std::fmt;
use std::sync::Arc;

use datafusion::arrow::datatypes::SchemaRef;
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::error::{DataFusionError, Result as DfResult};
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::physical_expr::{EquivalenceProperties, PhysicalExpr};
use datafusion::physical_plan::execution_plan::{
    Boundedness, EmissionType, ReplaceChildrenOptions,
};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, Partitioning, PlanProperties,
};

use super::{TableRows, Versions};
use crate::error::Result;

/// Partition `p` of one version's rows: every `partitions`-th non-empty batch from the
/// `p`-th, projected, at most `limit` rows.
pub struct CachedScanExec {
    versions: Arc<Versions>,
    /// The version's rows; `None` in a kept plan, which is bound before it runs.
    rows: Option<Arc<TableRows>>,
    projection: Option<Vec<usize>>,
    limit: Option<usize>,
    schema: SchemaRef,
    properties: Arc<PlanProperties>,
}

impl CachedScanExec {
    pub(super) fn try_new(
        versions: Arc<Versions>,
        rows: Arc<TableRows>,
        projection: Option<Vec<usize>>,
        limit: Option<usize>,
        partitions: usize,
    ) -> DfResult<CachedScanExec> {
        let schema = match &projection {
            Some(p) => Arc::new(versions.schema.project(p)?),
            None => versions.schema.clone(),
        };
        let properties = Arc::new(PlanProperties::new(
            EquivalenceProperties::new(schema.clone()),
            Partitioning::UnknownPartitioning(partitions.max(1)),
            EmissionType::Incremental,
            Boundedness::Bounded,
        ));
        Ok(CachedScanExec {
            versions,
            rows: Some(rows),
            projection,
            limit,
            schema,
            properties,
        })
    }

    /// The table this scan reads, as an identity: scans of one table in one query are
    /// bound to the same version.
    pub fn table_id(&self) -> usize {
        Arc::as_ptr(&self.versions) as usize
    }

    /// The table's latest version's rows, or `None` when that version is not in the read
    /// cache (the table outgrew it, or cannot be read from memory): a plan over it must be
    /// made again, to read the files.
    pub async fn latest_rows(&self) -> Result<Option<Arc<TableRows>>> {
        Ok(self.versions.latest().await?.1)
    }

    /// This scan over `rows`.
    pub fn bound(&self, rows: Arc<TableRows>) -> Arc<dyn ExecutionPlan> {
        Arc::new(CachedScanExec {
            versions: self.versions.clone(),
            rows: Some(rows),
            projection: self.projection.clone(),
            limit: self.limit,
            schema: self.schema.clone(),
            properties: self.properties.clone(),
        })
    }

    /// This scan with no rows, to keep in a plan without holding a version's rows.
    pub fn unbound(&self) -> Arc<dyn ExecutionPlan> {
        Arc::new(CachedScanExec {
            rows: None,
            versions: self.versions.clone(),
            projection: self.projection.clone(),
            limit: self.limit,
            schema: self.schema.clone(),
            properties: self.properties.clone(),
        })
    }

    /// Partition `partition`'s batches, projected and limited.
    fn partition(&self, rows: &TableRows, partition: usize) -> DfResult<Vec<RecordBatch>> {
        let n = self.properties.partitioning.partition_count();
        let mut out = Vec::new();
        let mut left = self.limit.unwrap_or(usize::MAX);
        let batches = rows
            .files
            .iter()
            .flat_map(|(_, f)| f.batches.iter())
            .filter(|b| b.num_rows() > 0)
            .skip(partition)
            .step_by(n);
        for b in batches {
            if left == 0 {
                break;
            }
            let b = match &self.projection {
                Some(p) => b.project(p)?,
                None => b.clone(),
            };
            let b = if b.num_rows() > left {
                b.slice(0, left)
            } else {
                b
            };
            left -= b.num_rows();
            out.push(b);
        }
        Ok(out)
    }
}

impl fmt::Debug for CachedScanExec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CachedScanExec")
            .field("path", &self.versions.path)
            .field("bound", &self.rows.is_some())
            .field("projection", &self.projection)
            .field("limit", &self.limit)
            .finish()
    }
}

impl DisplayAs for CachedScanExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        write!(
            f,
            "CachedScanExec: path={}, projection={:?}, limit={:?}",
            self.versions.path.display(),
            self.projection,
            self.limit
        )
    }
}

impl ExecutionPlan for CachedScanExec {
    fn name(&self) -> &str {
        "CachedScanExec"
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        &self.properties
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![]
    }

    fn apply_expressions(
        &self,
        _f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> DfResult<TreeNodeRecursion>,
    ) -> DfResult<TreeNodeRecursion> {
        Ok(TreeNodeRecursion::Continue)
    }

    fn replace_children(
        self: Arc<Self>,
        _children: Vec<Arc<dyn ExecutionPlan>>,
        _options: ReplaceChildrenOptions,
    ) -> DfResult<Arc<dyn ExecutionPlan>> {
        Ok(self)
    }

    fn with_new_children(
        self: Arc<Self>,
        _children: Vec<Arc<dyn ExecutionPlan>>,
    ) -> DfResult<Arc<dyn ExecutionPlan>> {
        Ok(self)
    }

    fn execute(
        &self,
        partition: usize,
        _context: Arc<TaskContext>,
    ) -> DfResult<SendableRecordBatchStream> {
        let rows = self.rows.as_ref().ok_or_else(|| {
            DataFusionError::Internal("CachedScanExec ran before it was bound".into())
        })?;
        let batches = self.partition(rows, partition)?;
        Ok(Box::pin(RecordBatchStreamAdapter::new(
            self.schema.clone(),
            futures::stream::iter(batches.into_iter().map(Ok)),
        )))
    }
}
