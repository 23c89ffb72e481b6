//! Running a sink on a Spark cluster instead of in this process (issue 40): Spark's own
//! engine runs the query, so its semantics are Spark's by construction.
//!
//! [`translate`] turns a sink and the streams it reads into what Spark runs (a
//! [`translate::SparkPlan`]: a streaming read per stream, the query as Spark SQL, the
//! write), refusing at once what Spark cannot run. The plan prints as `EXPLAIN SPARK`'s
//! lines and as a PySpark program (`tidemark export-spark`) for `spark-submit`.
//! [`connect`] is the Spark Connect client that starts the plan on a server and watches it
//! (`engine::spark_query` drives it for a sink with `engine = 'spark'`). [`handover`]
//! moves a stopped local sink to Spark, seeding Spark's checkpoint from the local one.

pub mod connect;
pub mod handover;
pub mod translate;

pub use translate::{SparkPlan, translate};

use std::path::Path;

use crate::catalog::Catalog;
use crate::error::{Error, Result};

/// `tidemark export-spark NAME`: the PySpark program of sink `name` of the catalog in
/// `data_dir`, writing to `path` and checkpointing in `checkpoint` where given.
pub fn export(
    data_dir: &Path,
    name: &str,
    path: Option<&Path>,
    checkpoint: Option<&Path>,
) -> Result<String> {
    let cat = Catalog::load(data_dir)?;
    let def = cat.sink(name).ok_or_else(|| Error::UndefinedObject {
        kind: "sink",
        name: name.to_string(),
    })?;
    let streams = def
        .streams
        .iter()
        .map(|n| {
            cat.stream(n).ok_or_else(|| Error::UndefinedObject {
                kind: "stream",
                name: n.clone(),
            })
        })
        .collect::<Result<Vec<_>>>()?;
    let mut plan = translate(def, &streams)?;
    if let Some(p) = path {
        if plan.write.path.is_none() {
            return Err(Error::invalid_option(format!(
                "sink \"{name}\" writes no files: --path does not apply"
            )));
        }
        plan.write.path = Some(p.display().to_string());
    }
    if let Some(c) = checkpoint {
        plan.write.checkpoint = c.display().to_string();
    }
    Ok(plan.pyspark())
}
