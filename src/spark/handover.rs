//! Moving a stopped local sink to Spark (`ALTER SINK s SET (engine = 'spark')`): the Spark
//! query starts where the local checkpoint stopped.
//!
//! Tidemark's checkpoint is in Spark's layout (spec §9.1), so the move hands Spark a
//! checkpoint of its own, `<checkpoint>-spark`, seeded from the local one:
//! - `metadata` (the query id, so a Delta sink's idempotent writes stay keyed the same),
//!   `offsets/` and `commits/`: Spark starts at the batch after the last committed one (or
//!   replays an uncommitted last batch with the same offsets, as the local engine would);
//! - `sources/<i>/`: a file source's log of the files taken, laid out as Spark's
//!   `FileStreamSourceLog` reads it (a `<k>.compact` every ten entries holding every entry
//!   so far), so those files are not read again; other sources' logs as they are. Delta and
//!   rate offsets are Spark's own JSON already;
//! - the sink's `_spark_metadata` (file sinks) is shared: Spark's batch ids continue the
//!   local ones, so its sink log goes on from there.
//!
//! Operator state does not transfer. A stateful query moves only at a clean point, when
//! the local state the next batch would load is empty (an `available_now` run that closed
//! every window): Spark then starts from an empty state at that version, written as empty
//! snapshots of its HDFS-backed store (`state/<op>/<partition>/<v>.snapshot`, LZF), which
//! the seeded `offsets/` name as the query's store and codec. Otherwise the move is
//! refused, or made with `from = 'beginning'`: Spark starts from scratch over every input
//! and the sink's earlier output is removed (by the first Spark run, before the query
//! starts, so that a crash between the move and the start cannot lose it half-way).
//!
//! [`decide`] is the pure rule; [`seed`] writes the checkpoint.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::catalog::SinkDef;
use crate::checkpoint::{BatchId, Checkpoint};
use crate::error::{Error, Result};
use crate::format::manifest;
use crate::fsutil::{create_dir_all, numbered, read_optional, write_atomic};
use crate::sink::SinkConnector;

/// Where the local checkpoint stands.
#[derive(Debug, Clone, PartialEq)]
pub struct LocalPoint {
    /// The batch the local engine would run next (its state version), if any batch was
    /// planned.
    pub next_batch: Option<u64>,
    /// Stateful operators in the local checkpoint, and the rows their state holds at
    /// `next_batch`'s version.
    pub state_operators: usize,
    pub state_rows: u64,
}

/// How the Spark query starts.
#[derive(Debug, Clone, PartialEq)]
pub enum Start {
    /// A new checkpoint: nothing was taken yet, or `from = 'beginning'` (then the sink's
    /// earlier output goes).
    Fresh { clear_output: bool },
    /// The local checkpoint continued from batch `next_batch`, with an empty state at that
    /// version for `state_operators` operators.
    Continue {
        next_batch: u64,
        state_operators: usize,
    },
}

/// Spark's rule for the move (spec §9.4: state does not transfer between engines).
pub fn decide(sink: &str, point: &LocalPoint, from_beginning: bool) -> Result<Start> {
    let Some(next_batch) = point.next_batch else {
        return Ok(Start::Fresh {
            clear_output: false,
        });
    };
    if from_beginning {
        return Ok(Start::Fresh { clear_output: true });
    }
    if point.state_rows > 0 {
        return Err(Error::WrongState(format!(
            "sink \"{sink}\" cannot move to Spark where it stopped: its {} stateful \
             operator(s) hold {} row(s) of state (open windows or groups) at batch \
             {next_batch}, and operator state does not transfer to Spark. Run it locally to \
             a clean point (trigger = 'available_now' with every window closed by the \
             watermark), or move it with from = 'beginning' to recompute the sink on Spark \
             from the first input",
            point.state_operators, point.state_rows
        )));
    }
    Ok(Start::Continue {
        next_batch,
        state_operators: point.state_operators,
    })
}

/// Spark's file-source log compaction interval
/// (`spark.sql.streaming.fileSource.log.compactInterval`'s default).
const SOURCE_COMPACT_INTERVAL: u64 = 10;

/// The four stores of a stream-stream join operator's partition (state format 2).
const JOIN_STORES: [&str; 4] = [
    "left-keyToNumValues",
    "left-keyWithIndexToValue",
    "right-keyToNumValues",
    "right-keyWithIndexToValue",
];

/// An empty HDFS-backed state store file: an LZF stream (one uncompressed chunk: `ZV`,
/// type 0, length 4) holding only the end mark, the int -1.
const EMPTY_LZF_STATE: &[u8] = b"ZV\x00\x00\x04\xff\xff\xff\xff";

/// The confs `offsets/N` fixes for the query (spec §9.3), as Spark 4.3 writes them for a
/// new query; the state store is the HDFS-backed one with LZF when a state is handed over
/// (its empty snapshots are written here), else Spark's RocksDB store as for any Spark
/// sink. Tidemark's own keys (shuffle partitions, watermark policy) are kept.
fn spark_conf(local: &BTreeMap<String, String>, with_state: bool) -> BTreeMap<String, String> {
    let (provider, codec) = if with_state {
        ("HDFSBackedStateStoreProvider", "lzf")
    } else {
        ("RocksDBStateStoreProvider", "lz4")
    };
    let mut conf: BTreeMap<String, String> = [
        (
            "spark.sql.streaming.stateStore.providerClass",
            format!("org.apache.spark.sql.execution.streaming.state.{provider}"),
        ),
        (
            "spark.sql.streaming.stateStore.compression.codec",
            codec.to_string(),
        ),
        (
            "spark.sql.streaming.aggregation.stateFormatVersion",
            "2".into(),
        ),
        ("spark.sql.streaming.join.stateFormatVersion", "2".into()),
        (
            "spark.sql.streaming.flatMapGroupsWithState.stateFormatVersion",
            "2".into(),
        ),
        (
            "spark.sql.streaming.statefulOperator.useStrictDistribution",
            "true".into(),
        ),
        (
            "spark.sql.streaming.stateStore.encodingFormat",
            "unsaferow".into(),
        ),
        (
            "spark.sql.optimizer.pruneFiltersCanPruneStreamingSubplan",
            "false".into(),
        ),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    conf.extend(local.iter().map(|(k, v)| (k.clone(), v.clone())));
    conf
}

/// Writes Spark's checkpoint `spark` for `start`, from the local checkpoint `local`.
/// `file_sources[i]` says whether source `i` is a file source; `partitions` is the state
/// partition count. A checkpoint left at `spark` by an earlier attempt is replaced; the new
/// one is written beside it and renamed into place.
pub fn seed(
    local: &Path,
    spark: &Path,
    start: &Start,
    file_sources: &[bool],
    partitions: usize,
) -> Result<()> {
    remove_dir(spark)?;
    let (next_batch, state_operators) = match *start {
        Start::Fresh {
            clear_output: false,
        } => return Ok(()),
        // The output is cleared by the first Spark run, before it starts the query
        // ([`clear_pending_output`]), so a crash after the move cannot leave Spark
        // starting over an old output.
        Start::Fresh { clear_output: true } => {
            return write_atomic(&spark.join(CLEAR_OUTPUT), b"from = 'beginning'\n");
        }
        Start::Continue {
            next_batch,
            state_operators,
        } => (next_batch, state_operators),
    };
    let tmp = PathBuf::from(format!("{}.seeding", spark.display()));
    remove_dir(&tmp)?;
    let meta = read_optional(&local.join("metadata"))?
        .ok_or_else(|| Error::Internal(format!("{} has no metadata", local.display())))?;
    write_atomic(&tmp.join("metadata"), meta.as_bytes())?;
    let from = Checkpoint::open(local)?;
    let to = Checkpoint::open(&tmp)?;
    let with_state = state_operators > 0;
    for n in numbered(&local.join("offsets"), "")? {
        let Some(mut seq) = from.offsets(BatchId(n))? else {
            continue;
        };
        seq.metadata.conf = spark_conf(&seq.metadata.conf, with_state);
        to.write_offsets(BatchId(n), &seq)?;
    }
    for n in numbered(&local.join("commits"), "")? {
        copy(&local.join("commits"), &tmp.join("commits"), &n.to_string())?;
    }
    for (i, &file) in file_sources.iter().enumerate() {
        let (src, dst) = (from.source_dir(i), tmp.join("sources").join(i.to_string()));
        if file {
            seed_file_source_log(&src, &dst)?;
        } else {
            for k in numbered(&src, "")? {
                copy(&src, &dst, &k.to_string())?;
            }
        }
    }
    for op in 0..state_operators {
        for p in 0..partitions {
            let dir = tmp.join("state").join(op.to_string()).join(p.to_string());
            let file = format!("{next_batch}.snapshot");
            write_atomic(&dir.join(&file), EMPTY_LZF_STATE)?;
            for store in JOIN_STORES {
                write_atomic(&dir.join(store).join(&file), EMPTY_LZF_STATE)?;
            }
        }
    }
    std::fs::rename(&tmp, spark)
        .map_err(|e| Error::io(format!("renaming {} into place", tmp.display()), e))?;
    if let Some(parent) = spark.parent() {
        crate::fsutil::sync_dir(parent)?;
    }
    Ok(())
}

/// The mark, in Spark's checkpoint, of a move with `from = 'beginning'` whose sink output
/// is yet to be cleared.
const CLEAR_OUTPUT: &str = "tidemark-clear-output";

/// `from = 'beginning'` recomputes the sink on Spark, so its earlier output must go first,
/// or Spark's sink would take the old batches for done (a file sink's manifest) or add to
/// them: a file sink's output can be cleared; other sinks are refused.
pub fn check_output_clearable(def: &SinkDef) -> Result<()> {
    match def.connector()? {
        SinkConnector::File(_) => Ok(()),
        c => Err(Error::Unsupported {
            message: format!(
                "from = 'beginning' on a {} sink is not supported yet",
                c.name()
            ),
            hint: Some(
                "Create a sink on Spark with a new path and checkpoint_location instead.".into(),
            ),
        }),
    }
}

/// Before a sink's first run on Spark after a move with `from = 'beginning'`: removes the
/// files its manifest commits and the manifest, then the mark. Clearing twice (a crash
/// before the mark went) is harmless: the query has not started.
pub fn clear_pending_output(def: &SinkDef, spark: &Path) -> Result<()> {
    let mark = spark.join(CLEAR_OUTPUT);
    if !mark.exists() {
        return Ok(());
    }
    check_output_clearable(def)?;
    for f in manifest::committed_files(&def.path)? {
        remove_file(&f)?;
    }
    remove_dir(&manifest::manifest_dir(&def.path))?;
    remove_file(&mark)?;
    crate::fsutil::sync_dir(spark)
}

fn remove_file(f: &Path) -> Result<()> {
    match std::fs::remove_file(f) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(Error::io(format!("removing {}", f.display()), e)),
    }
}

/// Tidemark's file-source log (`<k>` per entry) as Spark's reads it: entry `k` with
/// `(k + 1) % 10 == 0` becomes `<k>.compact`, every entry up to `k`.
fn seed_file_source_log(src: &Path, dst: &Path) -> Result<()> {
    create_dir_all(dst)?;
    let mut all = Vec::new();
    for k in numbered(src, "")? {
        let text = read_optional(&src.join(k.to_string()))?.unwrap_or_default();
        let lines: Vec<&str> = text
            .lines()
            .skip(1)
            .filter(|l| !l.trim().is_empty())
            .collect();
        all.extend(lines.iter().map(|l| l.to_string()));
        let (name, body) = if (k + 1) % SOURCE_COMPACT_INTERVAL == 0 {
            (format!("{k}.compact"), &all[..])
        } else {
            (k.to_string(), &all[all.len() - lines.len()..])
        };
        let mut out = String::from("v1");
        for l in body {
            out.push('\n');
            out.push_str(l);
        }
        write_atomic(&dst.join(name), out.as_bytes())?;
    }
    Ok(())
}

/// Where the local checkpoint at `root` stands: the next batch and the rows of state it
/// would load.
pub fn local_point(root: &Path) -> Result<LocalPoint> {
    let ckpt = Checkpoint::open(root)?;
    let next_batch = match ckpt.latest_offsets()? {
        None => None,
        Some((last, _)) => Some(match ckpt.latest_commit()? {
            Some((c, _)) if c == last => last.next().get(),
            _ => last.get(),
        }),
    };
    let mut point = LocalPoint {
        next_batch,
        state_operators: 0,
        state_rows: 0,
    };
    let state = root.join("state");
    for op in numbered(&state, "")? {
        point.state_operators += 1;
        let dir = state.join(op.to_string());
        // A join keeps each side's rows in a store of its own.
        let stores: Vec<PathBuf> = ["left", "right"]
            .iter()
            .map(|s| dir.join(s))
            .filter(|d| d.is_dir())
            .collect();
        let stores = if stores.is_empty() { vec![dir] } else { stores };
        for store in stores {
            if let Some(v) = next_batch
                && store.join("_metadata").exists()
            {
                point.state_rows += crate::state::dump(&store, v)?.len() as u64;
            }
        }
    }
    Ok(point)
}

fn copy(src: &Path, dst: &Path, name: &str) -> Result<()> {
    let text = std::fs::read(src.join(name))
        .map_err(|e| Error::io(format!("reading {}", src.join(name).display()), e))?;
    write_atomic(&dst.join(name), &text)
}

fn remove_dir(dir: &Path) -> Result<()> {
    match std::fs::remove_dir_all(dir) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(Error::io(format!("removing {}", dir.display()), e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn point(next: Option<u64>, ops: usize, rows: u64) -> LocalPoint {
        LocalPoint {
            next_batch: next,
            state_operators: ops,
            state_rows: rows,
        }
    }

    #[test]
    fn a_sink_that_never_ran_starts_fresh_without_touching_its_output() {
        for from_beginning in [false, true] {
            assert_eq!(
                decide("s", &point(None, 0, 0), from_beginning).unwrap(),
                Start::Fresh {
                    clear_output: false
                }
            );
        }
    }

    #[test]
    fn a_stateless_sink_continues_where_it_stopped() {
        assert_eq!(
            decide("s", &point(Some(4), 0, 0), false).unwrap(),
            Start::Continue {
                next_batch: 4,
                state_operators: 0
            }
        );
    }

    #[test]
    fn a_stateful_sink_moves_only_with_an_empty_state_or_from_the_beginning() {
        assert_eq!(
            decide("s", &point(Some(7), 1, 0), false).unwrap(),
            Start::Continue {
                next_batch: 7,
                state_operators: 1
            }
        );
        let e = decide("s", &point(Some(7), 1, 3), false).unwrap_err();
        assert_eq!(e.sqlstate().code(), "55000");
        let msg = e.to_string();
        assert!(
            msg.contains("hold 3 row(s) of state") && msg.contains("from = 'beginning'"),
            "{msg}"
        );
        assert_eq!(
            decide("s", &point(Some(7), 1, 3), true).unwrap(),
            Start::Fresh { clear_output: true }
        );
    }

    #[test]
    fn the_file_source_log_gets_spark_compactions() {
        let dir = tempfile::tempdir().unwrap();
        let (src, dst) = (dir.path().join("src"), dir.path().join("dst"));
        create_dir_all(&src).unwrap();
        for k in 0..12u64 {
            let line = format!(r#"{{"path":"file:///in/{k}.json","timestamp":1,"batchId":{k}}}"#);
            std::fs::write(src.join(k.to_string()), format!("v1\n{line}")).unwrap();
        }
        seed_file_source_log(&src, &dst).unwrap();
        let mut names: Vec<String> = std::fs::read_dir(&dst)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        assert!(names.contains(&"9.compact".to_string()), "{names:?}");
        assert!(!names.contains(&"9".to_string()), "{names:?}");
        let compact = std::fs::read_to_string(dst.join("9.compact")).unwrap();
        assert_eq!(compact.lines().count(), 11, "v1 and entries 0..=9");
        assert_eq!(
            std::fs::read_to_string(dst.join("10")).unwrap(),
            std::fs::read_to_string(src.join("10")).unwrap()
        );
    }

    #[test]
    fn a_seeded_checkpoint_continues_the_local_one_with_an_empty_state() {
        use crate::checkpoint::{CommitEntry, OffsetMetadata, OffsetSeq};
        let dir = tempfile::tempdir().unwrap();
        let (local, spark) = (dir.path().join("ck"), dir.path().join("ck-spark"));
        let ckpt = Checkpoint::open(&local).unwrap();
        for n in 0..2u64 {
            let seq = OffsetSeq {
                metadata: OffsetMetadata {
                    batch_watermark_ms: 0,
                    batch_timestamp_ms: 1,
                    conf: BTreeMap::from([(
                        "spark.sql.shuffle.partitions".to_string(),
                        "2".to_string(),
                    )]),
                },
                offsets: vec![Some(serde_json::json!({ "logOffset": n }))],
            };
            ckpt.write_offsets(BatchId(n), &seq).unwrap();
            ckpt.write_commit(
                BatchId(n),
                &CommitEntry {
                    next_batch_watermark_ms: 5,
                },
            )
            .unwrap();
            let line = format!(r#"{{"path":"file:///in/{n}.json","timestamp":1,"batchId":{n}}}"#);
            create_dir_all(&ckpt.source_dir(0)).unwrap();
            std::fs::write(
                ckpt.source_dir(0).join(n.to_string()),
                format!("v1\n{line}"),
            )
            .unwrap();
        }
        // Left by an earlier attempt: replaced.
        create_dir_all(&spark.join("offsets")).unwrap();
        std::fs::write(spark.join("offsets/9"), "stale").unwrap();
        let start = Start::Continue {
            next_batch: 2,
            state_operators: 1,
        };
        seed(&local, &spark, &start, &[true], 2).unwrap();
        let seeded = Checkpoint::open(&spark).unwrap();
        assert_eq!(seeded.id, ckpt.id, "the query id carries over");
        let (last, seq) = seeded.latest_offsets().unwrap().unwrap();
        assert_eq!(last, BatchId(1));
        assert_eq!(
            seq.offsets,
            vec![Some(serde_json::json!({ "logOffset": 1 }))]
        );
        assert_eq!(seq.metadata.conf["spark.sql.shuffle.partitions"], "2");
        assert_eq!(
            seq.metadata.conf["spark.sql.streaming.stateStore.compression.codec"],
            "lzf"
        );
        assert_eq!(seeded.latest_commit().unwrap().unwrap().0, BatchId(1));
        assert!(!spark.join("offsets/9").exists());
        assert!(spark.join("sources/0/1").exists());
        for p in ["0", "1"] {
            let snap = spark.join("state/0").join(p).join("2.snapshot");
            assert_eq!(std::fs::read(snap).unwrap(), EMPTY_LZF_STATE);
            let join = spark
                .join("state/0")
                .join(p)
                .join("left-keyToNumValues/2.snapshot");
            assert!(join.exists());
        }
        // from = 'beginning': an empty checkpoint with the mark, nothing of the local one.
        seed(
            &local,
            &spark,
            &Start::Fresh { clear_output: true },
            &[true],
            2,
        )
        .unwrap();
        let names: Vec<_> = std::fs::read_dir(&spark)
            .unwrap()
            .flatten()
            .map(|e| e.file_name())
            .collect();
        assert_eq!(names, vec![std::ffi::OsString::from(CLEAR_OUTPUT)]);
    }

    #[test]
    fn the_seeded_checkpoint_names_the_store_its_empty_snapshots_are_in() {
        let local = BTreeMap::from([("spark.sql.shuffle.partitions".to_string(), "3".into())]);
        let with = spark_conf(&local, true);
        assert!(
            with["spark.sql.streaming.stateStore.providerClass"]
                .ends_with("HDFSBackedStateStoreProvider")
        );
        assert_eq!(
            with["spark.sql.streaming.stateStore.compression.codec"],
            "lzf"
        );
        assert_eq!(with["spark.sql.shuffle.partitions"], "3");
        let without = spark_conf(&local, false);
        assert!(
            without["spark.sql.streaming.stateStore.providerClass"]
                .ends_with("RocksDBStateStoreProvider")
        );
    }
}
