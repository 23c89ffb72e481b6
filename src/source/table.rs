//! The table source: a stream fed over the wire by `INSERT` and `COPY`
//! (`connector = 'table'`, the default for a stream declared without one).
//!
//! Its rows live in an append-only log, `<data dir>/streams/<name>/`, of segment files
//! named by the offset of their first row (`00000000000000000000.seg`). Each statement is
//! one frame, `[payload length u64][crc32 u32][row count u64][Arrow IPC stream]`, so a
//! statement is wholly in the log or not at all: a frame torn by a crash fails its checksum
//! and is cut off when the log is opened again. One writer thread per stream does the
//! writing: it takes every statement waiting, writes them together and syncs once (group
//! commit), then acknowledges each. A statement's command completes only after that sync,
//! so what a client saw acknowledged survives a SIGKILL.
//!
//! The offset is the number of rows appended so far; a batch reads rows `[start, end)`:
//! the frames this process appended lately from memory (the rows as appended, up to
//! [`TAIL_CACHE_BYTES`]), the others from their segments.
//! Every query reads the log by offset, from the first retained row. A closed segment is
//! removed once every query reading the stream has committed past it, or once it is older
//! than the stream's `retention`.

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, mpsc};
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::arrow::ipc::reader::StreamReader;
use datafusion::arrow::ipc::writer::StreamWriter;
use datafusion::arrow::record_batch::RecordBatch;
use futures::StreamExt;
use tokio::sync::{oneshot, watch};

use super::{BatchStream, Offset, ReadLimit, Source};
use crate::error::{Error, Result};
use crate::fsutil::{create_dir_all, sync_dir};

/// Frame header: payload length (u64), crc32 of the payload (u32).
const HEADER: usize = 12;
/// A segment is closed once it holds this many bytes (the `segment_bytes` option).
pub const DEFAULT_SEGMENT_BYTES: u64 = 64 << 20;
/// At most this many waiting statements are written by one sync.
const MAX_GROUP: usize = 4096;

/// Appends of at most this many rows are encoded on the calling task.
const SMALL_APPEND_ROWS: usize = 1024;

/// The rows of the newest statements are kept in memory, up to this many bytes, so that a
/// query reading the live tail of the log neither reads the file nor decodes it.
const TAIL_CACHE_BYTES: usize = 16 << 20;

/// The options of a table stream (fed by INSERT and COPY).
pub const OPTIONS: crate::sql::options::OptionTable = {
    use crate::sql::options::{OptionSpec, OptionTable, OptionType};
    OptionTable {
        object: "stream",
        connector: "table",
        options: &[
            OptionSpec::new(
                "connector",
                OptionType::OneOf(&["table"]),
                Some("table"),
                "The connector; 'table' when no path or format is given",
            ),
            OptionSpec::new(
                "max_rows_per_trigger",
                OptionType::PositiveInt,
                None,
                "At most this many rows per micro-batch (unlimited when unset)",
            ),
            OptionSpec::new(
                "retention",
                OptionType::Duration,
                None,
                "The longest a closed segment is kept, even if a sink has not read it (unbounded when unset)",
            ),
            OptionSpec::new(
                "segment_bytes",
                OptionType::PositiveInt,
                Some("67108864"),
                "A segment of the log is closed past this size",
            ),
        ],
    }
};

/// How a table stream is configured.
#[derive(Debug, Clone)]
pub struct TableConfig {
    /// The declared schema, with the declared nullability.
    pub schema: SchemaRef,
    /// At most this many rows per micro-batch.
    pub max_rows_per_trigger: Option<u64>,
    /// Closed segments older than this are removed even if a query has not read them.
    pub retention: Option<Duration>,
    pub segment_bytes: u64,
}

/// One statement's rows in the log.
#[derive(Debug, Clone)]
struct Frame {
    /// Offset of its first row.
    start: u64,
    rows: u64,
    segment: u64,
    /// Position of the payload in the segment file.
    pos: u64,
    len: u64,
    /// When it was acknowledged (ms since the epoch); unknown for frames written before
    /// this process opened the log.
    acked_ms: Option<i64>,
}

#[derive(Debug)]
struct Segment {
    base: u64,
    path: PathBuf,
    bytes: u64,
}

#[derive(Debug, Default)]
struct LogState {
    frames: std::collections::VecDeque<Frame>,
    segments: Vec<Segment>,
    /// Offset of the first retained row.
    first: u64,
    /// Offset after the last row.
    end: u64,
    /// The committed offset of each query reading the stream.
    readers: BTreeMap<String, u64>,
    /// The offset each reader's file holds (`readers/<query>`), at most its committed one.
    readers_written: BTreeMap<String, u64>,
    /// The newest statements' rows as appended, by their frame's start: what a read of
    /// their frames would decode.
    tail: std::collections::VecDeque<(u64, Arc<Vec<RecordBatch>>)>,
    tail_bytes: usize,
    /// [`TAIL_CACHE_BYTES`], or less in tests.
    tail_limit: usize,
}

impl LogState {
    /// Keeps `rows`, the rows of the frame starting at `start`, in the tail; the oldest
    /// leave it past its limit.
    fn keep_in_tail(&mut self, start: u64, rows: Vec<RecordBatch>) {
        let bytes = batches_bytes(&rows);
        if bytes > self.tail_limit / 4 {
            return;
        }
        self.tail.push_back((start, Arc::new(rows)));
        self.tail_bytes += bytes;
        while self.tail_bytes > self.tail_limit {
            let Some((_, old)) = self.tail.pop_front() else {
                break;
            };
            self.tail_bytes -= batches_bytes(&old);
        }
    }

    /// The rows of the frame starting at `start`, if the tail holds them.
    fn tail_rows(&self, start: u64) -> Option<Arc<Vec<RecordBatch>>> {
        let i = self.tail.partition_point(|(s, _)| *s < start);
        self.tail
            .get(i)
            .filter(|(s, _)| *s == start)
            .map(|(_, rows)| rows.clone())
    }
}

fn batches_bytes(rows: &[RecordBatch]) -> usize {
    rows.iter().map(|b| b.get_array_memory_size()).sum()
}

struct Append {
    rows: u64,
    payload: Vec<u8>,
    /// The rows encoded in `payload`, for the tail ([`LogState::keep_in_tail`]), unless
    /// they are too large for it (then dropped once encoded, as a large COPY's must be).
    batches: Option<Vec<RecordBatch>>,
    done: oneshot::Sender<Result<u64>>,
}

/// A stream's log, shared by its writers (INSERT, COPY) and its readers (queries, SELECT).
pub struct TableLog {
    name: String,
    dir: PathBuf,
    config: TableConfig,
    state: Arc<Mutex<LogState>>,
    writer: Mutex<Option<mpsc::Sender<Append>>>,
    end: watch::Sender<u64>,
}

impl std::fmt::Debug for TableLog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TableLog").field("dir", &self.dir).finish()
    }
}

fn io(what: String) -> impl FnOnce(std::io::Error) -> Error {
    move |e| Error::io(what, e)
}

fn segment_path(dir: &Path, base: u64) -> PathBuf {
    dir.join(format!("{base:020}.seg"))
}

fn readers_dir(dir: &Path) -> PathBuf {
    dir.join("readers")
}

/// Reads a segment's frames; cuts off a torn tail when `last` (the active segment).
fn scan_segment(seg: &Segment, start: u64, last: bool) -> Result<(Vec<Frame>, u64)> {
    let mut f = File::open(&seg.path).map_err(io(format!("opening {}", seg.path.display())))?;
    let mut bytes = Vec::new();
    f.read_to_end(&mut bytes)
        .map_err(io(format!("reading {}", seg.path.display())))?;
    let mut frames = Vec::new();
    let mut pos = 0usize;
    let mut next = start;
    while pos < bytes.len() {
        let valid = (|| {
            let header = bytes.get(pos..pos + HEADER)?;
            let len = u64::from_le_bytes(header[..8].try_into().ok()?) as usize;
            let crc = u32::from_le_bytes(header[8..12].try_into().ok()?);
            let payload = bytes.get(pos + HEADER..(pos + HEADER).checked_add(len)?)?;
            if len < 8 || crc32fast::hash(payload) != crc {
                return None;
            }
            Some((len, u64::from_le_bytes(payload[..8].try_into().ok()?)))
        })();
        let Some((len, rows)) = valid else {
            if !last {
                return Err(Error::Internal(format!(
                    "corrupt frame at byte {pos} of {}",
                    seg.path.display()
                )));
            }
            tracing::warn!(
                segment = %seg.path.display(),
                at = pos,
                "cutting off a torn frame (a statement that was never acknowledged)"
            );
            let f = OpenOptions::new()
                .write(true)
                .open(&seg.path)
                .map_err(io(format!("opening {}", seg.path.display())))?;
            f.set_len(pos as u64)
                .and_then(|_| f.sync_all())
                .map_err(io(format!("truncating {}", seg.path.display())))?;
            return Ok((frames, pos as u64));
        };
        frames.push(Frame {
            start: next,
            rows,
            segment: seg.base,
            pos: (pos + HEADER) as u64,
            len: len as u64,
            acked_ms: None,
        });
        next += rows;
        pos += HEADER + len;
    }
    Ok((frames, pos as u64))
}

/// Encodes a statement's rows as one frame payload.
fn encode(schema: &SchemaRef, batches: &[RecordBatch]) -> Result<(u64, Vec<u8>)> {
    let rows: u64 = batches.iter().map(|b| b.num_rows() as u64).sum();
    let mut payload = rows.to_le_bytes().to_vec();
    {
        let mut w = StreamWriter::try_new(&mut payload, schema)?;
        for b in batches {
            w.write(b)?;
        }
        w.finish()?;
    }
    Ok((rows, payload))
}

fn decode(bytes: &[u8]) -> Result<Vec<RecordBatch>> {
    let reader = StreamReader::try_new(std::io::Cursor::new(&bytes[8..]), None)?;
    Ok(reader.collect::<std::result::Result<Vec<_>, _>>()?)
}

impl TableLog {
    /// Opens (creating) the log of stream `name` in `dir` and starts its writer.
    pub fn open(name: &str, dir: &Path, config: TableConfig) -> Result<Arc<TableLog>> {
        create_dir_all(dir)?;
        create_dir_all(&readers_dir(dir))?;
        let mut bases: Vec<u64> = std::fs::read_dir(dir)
            .map_err(io(format!("listing {}", dir.display())))?
            .flatten()
            .filter_map(|e| e.file_name().to_str()?.strip_suffix(".seg")?.parse().ok())
            .collect();
        bases.sort_unstable();
        let mut state = LogState {
            tail_limit: TAIL_CACHE_BYTES,
            ..LogState::default()
        };
        let count = bases.len();
        for (i, base) in bases.into_iter().enumerate() {
            if i == 0 {
                state.first = base;
                state.end = base;
            } else if base != state.end {
                return Err(Error::Internal(format!(
                    "stream \"{name}\": segment {base} does not follow offset {}",
                    state.end
                )));
            }
            let mut seg = Segment {
                base,
                path: segment_path(dir, base),
                bytes: 0,
            };
            let (frames, bytes) = scan_segment(&seg, base, i + 1 == count)?;
            seg.bytes = bytes;
            state.end = frames.last().map_or(base, |f| f.start + f.rows);
            state.frames.extend(frames);
            state.segments.push(seg);
        }
        for e in std::fs::read_dir(readers_dir(dir))
            .map_err(io(format!("listing {}", dir.display())))?
            .flatten()
        {
            let Some(reader) = e.file_name().to_str().map(str::to_string) else {
                continue;
            };
            if reader.starts_with('.') {
                continue;
            }
            if let Ok(text) = std::fs::read_to_string(e.path())
                && let Ok(offset) = text.trim().parse::<u64>()
            {
                state.readers.insert(reader.clone(), offset);
                state.readers_written.insert(reader, offset);
            }
        }
        let (end, _) = watch::channel(state.end);
        let log = Arc::new(TableLog {
            name: name.to_string(),
            dir: dir.to_path_buf(),
            config,
            state: Arc::new(Mutex::new(state)),
            writer: Mutex::new(None),
            end,
        });
        let (tx, rx) = mpsc::channel();
        let writer = Writer::new(&log)?;
        let log2 = log.clone();
        std::thread::Builder::new()
            .name(format!("tidemark-log-{name}"))
            .spawn(move || writer.run(rx, &log2))
            .map_err(io("starting a log writer".into()))?;
        *log.writer.lock().unwrap_or_else(|e| e.into_inner()) = Some(tx);
        Ok(log)
    }

    pub fn schema(&self) -> SchemaRef {
        self.config.schema.clone()
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn config(&self) -> &TableConfig {
        &self.config
    }

    /// `(first retained row, end)`.
    pub fn bounds(&self) -> (u64, u64) {
        let s = self.lock();
        (s.first, s.end)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, LogState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Appends one statement's rows durably; returns once they are synced to disk, with
    /// the number of rows. All or nothing.
    pub async fn append(&self, batches: Vec<RecordBatch>) -> Result<u64> {
        let schema = self.config.schema.clone();
        // A few rows (an INSERT) are encoded in place; a large COPY off the async threads.
        let small = batches.iter().map(|b| b.num_rows()).sum::<usize>() <= SMALL_APPEND_ROWS;
        let (rows, payload, batches) = if small {
            let (rows, payload) = encode(&schema, &batches)?;
            (rows, payload, batches)
        } else {
            tokio::task::spawn_blocking(move || {
                encode(&schema, &batches).map(|(rows, payload)| (rows, payload, batches))
            })
            .await
            .map_err(|e| Error::Internal(format!("encoding rows: {e}")))??
        };
        if rows == 0 {
            return Ok(0);
        }
        let batches = (batches_bytes(&batches) <= TAIL_CACHE_BYTES / 4).then_some(batches);
        let (done, wait) = oneshot::channel();
        {
            let writer = self.writer.lock().unwrap_or_else(|e| e.into_inner());
            let tx = writer.as_ref().ok_or_else(|| {
                Error::WrongState(format!("stream \"{}\" is being dropped", self.name))
            })?;
            tx.send(Append {
                rows,
                payload,
                batches,
                done,
            })
            .map_err(|_| Error::Internal(format!("the log writer of \"{}\" stopped", self.name)))?;
        }
        wait.await
            .map_err(|_| Error::Internal(format!("the log writer of \"{}\" stopped", self.name)))?
    }

    /// Changes whenever rows are appended: the end offset.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.end.subscribe()
    }

    /// The rows of `[start, end)`, read lazily, a frame at a time. A start before the first
    /// retained row is an error (the rows were removed by `retention`).
    pub fn read(self: &Arc<Self>, start: Option<u64>, end: u64) -> Result<BatchStream> {
        let frames: Vec<(Frame, Option<Arc<Vec<RecordBatch>>>)> = {
            let s = self.lock();
            let start = start.unwrap_or(s.first);
            if start < s.first {
                return Err(Error::WrongState(format!(
                    "rows {start} to {} of stream \"{}\" are no longer retained (retention)",
                    s.first, self.name
                )));
            }
            s.frames
                .iter()
                .filter(|f| f.start + f.rows > start && f.start < end)
                .map(|f| (f.clone(), s.tail_rows(f.start)))
                .collect()
        };
        let start = start.unwrap_or_else(|| self.bounds().0);
        let dir = self.dir.clone();
        let schema = self.config.schema.clone();
        let reads = futures::stream::iter(frames).then(move |(f, cached)| {
            let dir = dir.clone();
            let schema = schema.clone();
            async move {
                match cached {
                    Some(rows) => rows_in(rows.iter().cloned(), f.start, start, end, &schema),
                    None => tokio::task::spawn_blocking(move || {
                        rows_in(read_frame(&dir, &f)?, f.start, start, end, &schema)
                    })
                    .await
                    .map_err(|e| Error::Internal(format!("log reader panicked: {e}")))?,
                }
            }
        });
        Ok(super::flatten_reads(reads))
    }

    /// When the rows of `[start, end)` were acknowledged, frame by frame (those this process
    /// acknowledged).
    pub fn arrivals(&self, start: u64, end: u64) -> Vec<super::Arrival> {
        self.lock()
            .frames
            .iter()
            .filter(|f| f.start + f.rows > start && f.start < end)
            .filter_map(|f| {
                let rows = (f.start + f.rows).min(end) - f.start.max(start);
                Some(super::Arrival {
                    at_ms: f.acked_ms?,
                    rows,
                })
            })
            .collect()
    }

    /// Every retained row, for `SELECT * FROM stream`.
    pub async fn read_all(self: &Arc<Self>) -> Result<Vec<RecordBatch>> {
        let (_, end) = self.bounds();
        let mut out = Vec::new();
        let mut s = self.read(None, end)?;
        while let Some(b) = s.next().await {
            out.push(b?);
        }
        Ok(out)
    }

    /// Query `reader` has committed everything before `offset`; removes what no query
    /// needs any more.
    ///
    /// The reader's file, which keeps segments for it across a restart, is rewritten only
    /// when `offset` passes the start of a segment (it could then let that segment go),
    /// not at every batch. It is not synced either: a file behind the reader's committed
    /// offset only keeps more, and the query's checkpoint, not this file, says where it
    /// reads from.
    pub fn commit(&self, reader: &str, offset: u64) -> Result<()> {
        let write = {
            let s = self.lock();
            match s.readers_written.get(reader) {
                None => true,
                Some(&written) => s
                    .segments
                    .iter()
                    .any(|seg| seg.base > written && seg.base <= offset),
            }
        };
        if write {
            let file = readers_dir(&self.dir).join(reader);
            let tmp = readers_dir(&self.dir).join(format!(".{reader}.tmp"));
            std::fs::write(&tmp, offset.to_string())
                .and_then(|_| std::fs::rename(&tmp, &file))
                .map_err(io(format!("writing {}", file.display())))?;
        }
        let mut s = self.lock();
        s.readers.insert(reader.to_string(), offset);
        if write {
            s.readers_written.insert(reader.to_string(), offset);
        }
        drop(s);
        self.remove_old_segments()
    }

    /// Registers query `reader` (its start: the first retained row), so nothing it has not
    /// read is removed before it runs.
    pub fn add_reader(&self, reader: &str) -> Result<()> {
        let first = {
            let s = self.lock();
            if s.readers.contains_key(reader) {
                return Ok(());
            }
            s.first
        };
        self.commit(reader, first)
    }

    /// Query `reader` is gone (its sink was dropped).
    pub fn remove_reader(&self, reader: &str) -> Result<()> {
        let _ = std::fs::remove_file(readers_dir(&self.dir).join(reader));
        let mut s = self.lock();
        s.readers.remove(reader);
        s.readers_written.remove(reader);
        drop(s);
        self.remove_old_segments()
    }

    /// Removes closed segments every reader has passed, and those past `retention`.
    pub fn remove_old_segments(&self) -> Result<()> {
        let mut s = self.lock();
        let min_read = s.readers.values().copied().min();
        let now = SystemTime::now();
        let mut removed = 0;
        // The last segment is the active one: never removed.
        while s.segments.len() > 1 {
            let next_base = s.segments[1].base;
            let seg = &s.segments[0];
            let read_by_all = min_read.is_some_and(|m| m >= next_base);
            let expired = self.config.retention.is_some_and(|r| {
                std::fs::metadata(&seg.path)
                    .and_then(|m| m.modified())
                    .is_ok_and(|t| now.duration_since(t).unwrap_or_default() >= r)
            });
            if !(read_by_all || expired) {
                break;
            }
            if let Err(e) = std::fs::remove_file(&seg.path)
                && e.kind() != std::io::ErrorKind::NotFound
            {
                return Err(Error::io(format!("removing {}", seg.path.display()), e));
            }
            s.segments.remove(0);
            s.first = next_base;
            while s.frames.front().is_some_and(|f| f.start < next_base) {
                s.frames.pop_front();
            }
            removed += 1;
        }
        if removed > 0 {
            tracing::debug!(stream = %self.name, removed, first = s.first, "segments removed");
        }
        Ok(())
    }

    /// Stops the writer (DROP STREAM, shutdown). Waiting appends still complete.
    pub fn close(&self) {
        self.writer.lock().unwrap_or_else(|e| e.into_inner()).take();
    }
}

/// A frame's rows, read from its segment.
fn read_frame(dir: &Path, f: &Frame) -> Result<Vec<RecordBatch>> {
    let path = segment_path(dir, f.segment);
    let mut file = File::open(&path).map_err(io(format!("opening {}", path.display())))?;
    file.seek(SeekFrom::Start(f.pos))
        .map_err(io(format!("reading {}", path.display())))?;
    let mut bytes = vec![0u8; f.len as usize];
    file.read_exact(&mut bytes)
        .map_err(io(format!("reading {}", path.display())))?;
    decode(&bytes)
}

/// The rows of `[start, end)` among a frame's `rows`, the first of which is at offset
/// `at`, in the stream's schema.
fn rows_in(
    rows: impl IntoIterator<Item = RecordBatch>,
    mut at: u64,
    start: u64,
    end: u64,
    schema: &SchemaRef,
) -> Result<Vec<RecordBatch>> {
    let mut out = Vec::new();
    for b in rows {
        let n = b.num_rows() as u64;
        let lo = start.max(at);
        let hi = end.min(at + n);
        if lo < hi {
            let b = if lo == at && hi == at + n {
                b
            } else {
                b.slice((lo - at) as usize, (hi - lo) as usize)
            };
            out.push(RecordBatch::try_new(schema.clone(), b.columns().to_vec())?);
        }
        at += n;
    }
    Ok(out)
}

/// The writer thread's state: the active segment.
struct Writer {
    dir: PathBuf,
    file: File,
    base: u64,
    bytes: u64,
    end: u64,
    segment_bytes: u64,
}

impl Writer {
    fn new(log: &TableLog) -> Result<Writer> {
        let (base, bytes, end) = {
            let s = log.lock();
            match s.segments.last() {
                Some(seg) => (seg.base, seg.bytes, s.end),
                None => (s.end, 0, s.end),
            }
        };
        let path = segment_path(&log.dir, base);
        let is_new = !path.exists();
        let file = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .map_err(io(format!("opening {}", path.display())))?;
        if is_new {
            sync_dir(&log.dir)?;
            log.lock().segments.push(Segment {
                base,
                path,
                bytes: 0,
            });
        }
        Ok(Writer {
            dir: log.dir.clone(),
            file,
            base,
            bytes,
            end,
            segment_bytes: log.config.segment_bytes,
        })
    }

    fn run(mut self, rx: mpsc::Receiver<Append>, log: &TableLog) {
        while let Ok(first) = rx.recv() {
            let mut group = vec![first];
            while group.len() < MAX_GROUP {
                match rx.try_recv() {
                    Ok(a) => group.push(a),
                    Err(_) => break,
                }
            }
            let result = self.write_group(&group, log);
            for (a, r) in group.into_iter().zip(result) {
                let _ = a.done.send(r);
            }
        }
    }

    /// Writes a group of statements with one sync; each gets its own result.
    fn write_group(&mut self, group: &[Append], log: &TableLog) -> Vec<Result<u64>> {
        let fail = |e: &Error| {
            (0..group.len())
                .map(|_| {
                    Err(Error::io(
                        format!("writing the log of \"{}\"", log.name),
                        std::io::Error::other(e.to_string()),
                    ))
                })
                .collect()
        };
        if self.bytes >= self.segment_bytes
            && let Err(e) = self.roll(log)
        {
            return fail(&e);
        }
        let mut buf = Vec::with_capacity(group.iter().map(|a| a.payload.len() + HEADER).sum());
        let mut frames = Vec::with_capacity(group.len());
        let mut at = self.end;
        let mut pos = self.bytes;
        for a in group.iter() {
            buf.extend_from_slice(&(a.payload.len() as u64).to_le_bytes());
            buf.extend_from_slice(&crc32fast::hash(&a.payload).to_le_bytes());
            buf.extend_from_slice(&a.payload);
            frames.push(Frame {
                start: at,
                rows: a.rows,
                segment: self.base,
                pos: pos + HEADER as u64,
                len: a.payload.len() as u64,
                acked_ms: None,
            });
            at += a.rows;
            pos += (HEADER + a.payload.len()) as u64;
        }
        crate::testing::crash_point("table_log_before_write");
        let written = self
            .file
            .write_all(&buf)
            .and_then(|_| self.file.sync_data());
        if let Err(e) = written {
            // Cut off whatever part of the group reached the file: none of it is acknowledged.
            let _ = self.file.set_len(self.bytes);
            return fail(&Error::io("syncing", e));
        }
        crate::testing::crash_point("table_log_after_sync");
        self.bytes = pos;
        self.end = at;
        let acked_ms = Some(chrono::Utc::now().timestamp_millis());
        {
            let mut s = log.lock();
            for (f, a) in frames.iter().zip(group) {
                if let Some(rows) = &a.batches {
                    s.keep_in_tail(f.start, rows.clone());
                }
            }
            s.frames
                .extend(frames.into_iter().map(|f| Frame { acked_ms, ..f }));
            s.end = at;
            if let Some(seg) = s.segments.last_mut() {
                seg.bytes = pos;
            }
        }
        log.end.send_replace(at);
        if log.config.retention.is_some()
            && let Err(e) = log.remove_old_segments()
        {
            tracing::warn!(stream = %log.name, error = %e, "removing expired segments");
        }
        group.iter().map(|a| Ok(a.rows)).collect()
    }

    /// Closes the active segment and starts the next, named by the current end offset.
    fn roll(&mut self, log: &TableLog) -> Result<()> {
        let path = segment_path(&self.dir, self.end);
        let file = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .map_err(io(format!("creating {}", path.display())))?;
        sync_dir(&self.dir)?;
        self.file = file;
        self.base = self.end;
        self.bytes = 0;
        log.lock().segments.push(Segment {
            base: self.base,
            path,
            bytes: 0,
        });
        Ok(())
    }
}

fn row_offset(o: &Offset) -> Result<u64> {
    o.as_u64()
        .ok_or_else(|| Error::Internal(format!("unexpected table source offset {o}")))
}

/// A query's view of a table stream.
pub struct TableSource {
    log: Arc<TableLog>,
    /// The query's name: its reader entry in the log.
    reader: String,
    /// `available_now`: the end fixed when the run started.
    fixed_end: Option<u64>,
    /// A sink's `max_rows_per_trigger` overrides the stream's.
    max_rows_per_trigger: Option<u64>,
    /// When the rows of the last read arrived.
    arrived: Mutex<Vec<super::Arrival>>,
    /// Whether the last `latest_offset` left rows for a later batch.
    held_back: bool,
}

impl TableSource {
    pub fn new(
        log: Arc<TableLog>,
        reader: &str,
        max_rows_per_trigger: Option<u64>,
    ) -> Result<Self> {
        log.add_reader(reader)?;
        Ok(TableSource {
            max_rows_per_trigger: max_rows_per_trigger.or(log.config.max_rows_per_trigger),
            log,
            reader: reader.to_string(),
            fixed_end: None,
            arrived: Mutex::default(),
            held_back: false,
        })
    }
}

#[async_trait]
impl Source for TableSource {
    fn schema(&self) -> SchemaRef {
        self.log.schema()
    }

    fn describe(&self) -> String {
        format!("TableStreamSource[{}]", self.log.name)
    }

    async fn prepare_available_now(&mut self) -> Result<()> {
        self.fixed_end = Some(self.log.bounds().1);
        Ok(())
    }

    async fn latest_offset(
        &mut self,
        start: Option<&Offset>,
        limit: ReadLimit,
    ) -> Result<Option<Offset>> {
        let (first, mut end) = self.log.bounds();
        if let Some(f) = self.fixed_end {
            end = end.min(f);
        }
        let start = match start {
            Some(o) => row_offset(o)?,
            None => first,
        };
        let available = end;
        if let (ReadLimit::Default, Some(n)) = (limit, self.max_rows_per_trigger) {
            end = end.min(start.saturating_add(n));
        }
        self.held_back = end < available;
        if end == 0 {
            return Ok(None);
        }
        Ok(Some(serde_json::json!(end.max(start))))
    }

    async fn read(&self, start: Option<&Offset>, end: &Offset) -> Result<BatchStream> {
        let start = start.map(row_offset).transpose()?;
        let end = row_offset(end)?;
        *self.arrived.lock().unwrap_or_else(|e| e.into_inner()) = self
            .log
            .arrivals(start.unwrap_or_else(|| self.log.bounds().0), end);
        self.log.read(start, end)
    }

    fn take_arrivals(&self) -> Vec<super::Arrival> {
        std::mem::take(&mut self.arrived.lock().unwrap_or_else(|e| e.into_inner()))
    }

    fn held_back(&self) -> bool {
        self.held_back
    }

    fn backlog(&self, end: Option<&Offset>) -> super::Backlog {
        let read = end.and_then(|o| o.as_u64()).unwrap_or(self.log.bounds().0);
        super::Backlog {
            rows: Some(self.log.bounds().1.saturating_sub(read)),
            ..Default::default()
        }
    }

    fn reported_latest(&self) -> Option<Offset> {
        Some(serde_json::json!(self.log.bounds().1))
    }

    async fn commit(&mut self, end: &Offset) -> Result<()> {
        self.log.commit(&self.reader, row_offset(end)?)
    }

    fn arrivals(&self) -> Option<watch::Receiver<u64>> {
        Some(self.log.subscribe())
    }
}

#[cfg(test)]
mod tests {
    use datafusion::arrow::array::{AsArray, Int64Array};
    use datafusion::arrow::datatypes::{DataType, Field, Int64Type, Schema};

    use super::*;

    fn config(segment_bytes: u64, retention: Option<Duration>) -> TableConfig {
        TableConfig {
            schema: Arc::new(Schema::new(vec![Field::new("n", DataType::Int64, false)])),
            max_rows_per_trigger: None,
            retention,
            segment_bytes,
        }
    }

    fn rows(log: &TableLog, values: std::ops::Range<i64>) -> Vec<RecordBatch> {
        vec![
            RecordBatch::try_new(
                log.schema(),
                vec![Arc::new(Int64Array::from_iter_values(values))],
            )
            .unwrap(),
        ]
    }

    async fn values(log: &Arc<TableLog>, start: Option<u64>, end: u64) -> Vec<i64> {
        let mut s = log.read(start, end).unwrap();
        let mut out = Vec::new();
        while let Some(b) = s.next().await {
            out.extend(
                b.unwrap()
                    .column(0)
                    .as_primitive::<Int64Type>()
                    .values()
                    .iter(),
            );
        }
        out
    }

    #[tokio::test]
    async fn reads_any_range_and_survives_reopening() {
        let dir = tempfile::tempdir().unwrap();
        let log = TableLog::open("s", dir.path(), config(DEFAULT_SEGMENT_BYTES, None)).unwrap();
        assert_eq!(log.append(rows(&log, 0..5)).await.unwrap(), 5);
        assert_eq!(log.append(vec![]).await.unwrap(), 0);
        assert_eq!(log.append(rows(&log, 5..8)).await.unwrap(), 3);
        assert_eq!(log.bounds(), (0, 8));
        // Ranges that cut statements in the middle.
        assert_eq!(values(&log, Some(3), 6).await, vec![3, 4, 5]);
        assert_eq!(values(&log, None, 8).await, (0..8).collect::<Vec<_>>());
        assert_eq!(values(&log, Some(8), 8).await, Vec::<i64>::new());
        log.close();
        drop(log);
        let log = TableLog::open("s", dir.path(), config(DEFAULT_SEGMENT_BYTES, None)).unwrap();
        assert_eq!(log.bounds(), (0, 8));
        assert_eq!(values(&log, Some(6), 8).await, vec![6, 7]);
    }

    #[tokio::test]
    async fn the_tail_kept_in_memory_reads_as_the_file_does() {
        let dir = tempfile::tempdir().unwrap();
        let log = TableLog::open("s", dir.path(), config(DEFAULT_SEGMENT_BYTES, None)).unwrap();
        // Room for the newest few statements only: reads cross from the file to memory.
        let lens = [1, 7, 3, 2, 5, 1, 4, 2, 3, 1];
        let largest = (1..=7).map(|len| batches_bytes(&rows(&log, 0..len))).max();
        log.lock().tail_limit = largest.unwrap() * 4;
        let mut n = 0;
        for len in lens {
            log.append(rows(&log, n as i64..(n + len) as i64))
                .await
                .unwrap();
            n += len;
        }
        let (kept, frames) = {
            let s = log.lock();
            (s.tail.len(), s.frames.len())
        };
        assert!(
            kept > 1 && kept < frames,
            "{kept} of {frames} statements kept"
        );
        let every_range = async |log: &Arc<TableLog>| {
            for a in 0..=n {
                for b in a..=n {
                    let want: Vec<i64> = (a as i64..b as i64).collect();
                    assert_eq!(values(log, Some(a), b).await, want, "[{a}, {b})");
                }
            }
        };
        every_range(&log).await;
        log.close();
        drop(log);
        // Reopened, every read comes from the file.
        let log = TableLog::open("s", dir.path(), config(DEFAULT_SEGMENT_BYTES, None)).unwrap();
        assert_eq!(log.lock().tail.len(), 0);
        every_range(&log).await;
    }

    #[tokio::test]
    async fn a_torn_statement_is_cut_off_and_the_log_goes_on() {
        let dir = tempfile::tempdir().unwrap();
        let log = TableLog::open("s", dir.path(), config(DEFAULT_SEGMENT_BYTES, None)).unwrap();
        log.append(rows(&log, 0..3)).await.unwrap();
        log.append(rows(&log, 3..4)).await.unwrap();
        log.close();
        drop(log);
        let seg = segment_path(dir.path(), 0);
        let len = std::fs::metadata(&seg).unwrap().len();
        // A crash in the middle of the next statement's write: half a frame.
        let mut f = OpenOptions::new().append(true).open(&seg).unwrap();
        f.write_all(&100u64.to_le_bytes()).unwrap();
        f.write_all(&[1, 2, 3, 4, 5]).unwrap();
        drop(f);
        let log = TableLog::open("s", dir.path(), config(DEFAULT_SEGMENT_BYTES, None)).unwrap();
        assert_eq!(log.bounds(), (0, 4));
        assert_eq!(
            std::fs::metadata(&seg).unwrap().len(),
            len,
            "the torn tail is cut"
        );
        log.append(rows(&log, 4..6)).await.unwrap();
        assert_eq!(values(&log, None, 6).await, (0..6).collect::<Vec<_>>());
        // A bad frame in a closed segment is corruption, not a torn tail.
        let mut bytes = std::fs::read(&seg).unwrap();
        bytes[20] ^= 0xff;
        log.close();
        drop(log);
        std::fs::write(&seg, &bytes).unwrap();
        std::fs::write(segment_path(dir.path(), 6), b"").unwrap();
        let err = TableLog::open("s", dir.path(), config(DEFAULT_SEGMENT_BYTES, None)).unwrap_err();
        assert!(err.to_string().contains("corrupt frame"), "{err}");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn concurrent_statements_share_syncs_and_each_is_whole() {
        let dir = tempfile::tempdir().unwrap();
        let log = TableLog::open("s", dir.path(), config(4096, None)).unwrap();
        let tasks: Vec<_> = (0..64)
            .map(|i| {
                let log = log.clone();
                tokio::spawn(async move {
                    let b = rows(&log, i * 10..i * 10 + 10);
                    log.append(b).await.unwrap()
                })
            })
            .collect();
        for t in tasks {
            assert_eq!(t.await.unwrap(), 10);
        }
        let mut got = values(&log, None, 640).await;
        // Every statement's rows are contiguous (a statement is one frame).
        for chunk in got.chunks(10) {
            assert_eq!(chunk[9] - chunk[0], 9, "{chunk:?}");
            assert_eq!(chunk[0] % 10, 0);
        }
        got.sort();
        assert_eq!(got, (0..640).collect::<Vec<_>>());
    }

    #[tokio::test]
    async fn segments_go_when_every_reader_passed_them_or_retention_expired() {
        let dir = tempfile::tempdir().unwrap();
        let log = TableLog::open("s", dir.path(), config(1, None)).unwrap();
        for i in 0..3 {
            log.append(rows(&log, i * 2..i * 2 + 2)).await.unwrap();
        }
        assert_eq!(log.lock().segments.len(), 3);
        log.add_reader("a").unwrap();
        log.add_reader("b").unwrap();
        log.commit("a", 6).unwrap();
        assert_eq!(log.bounds(), (0, 6), "b has read nothing yet");
        log.commit("b", 3).unwrap();
        assert_eq!(log.bounds(), (2, 6), "both passed the first segment");
        assert_eq!(values(&log, None, 6).await, vec![2, 3, 4, 5]);
        assert!(
            log.read(Some(1), 6).is_err(),
            "rows before the first are gone"
        );
        log.remove_reader("b").unwrap();
        assert_eq!(log.bounds(), (4, 6), "the active segment stays");
        // Reader offsets survive reopening.
        log.close();
        drop(log);
        let log = TableLog::open("s", dir.path(), config(1, None)).unwrap();
        assert_eq!(log.lock().readers.get("a"), Some(&6));
        assert!(!log.lock().readers.contains_key("b"));

        let dir = tempfile::tempdir().unwrap();
        let log = TableLog::open("s", dir.path(), config(1, Some(Duration::ZERO))).unwrap();
        for i in 0..3 {
            log.append(rows(&log, i..i + 1)).await.unwrap();
        }
        assert_eq!(log.bounds(), (2, 3), "no reader, but retention expired");

        // Within one segment a commit leaves the reader's file as it was: after a restart
        // the reader looks behind, which only keeps more.
        let dir = tempfile::tempdir().unwrap();
        let log = TableLog::open("s", dir.path(), config(1 << 20, None)).unwrap();
        log.append(rows(&log, 0..6)).await.unwrap();
        log.add_reader("a").unwrap();
        log.commit("a", 2).unwrap();
        log.commit("a", 6).unwrap();
        assert_eq!(log.lock().readers.get("a"), Some(&6));
        log.close();
        drop(log);
        let log = TableLog::open("s", dir.path(), config(1 << 20, None)).unwrap();
        assert_eq!(log.lock().readers.get("a"), Some(&0));
        assert_eq!(values(&log, None, 6).await, (0..6).collect::<Vec<_>>());
    }

    #[tokio::test]
    async fn the_source_honours_the_read_limit_and_available_now() {
        let dir = tempfile::tempdir().unwrap();
        let log = TableLog::open("s", dir.path(), config(DEFAULT_SEGMENT_BYTES, None)).unwrap();
        let mut src = TableSource::new(log.clone(), "q", Some(4)).unwrap();
        assert_eq!(
            src.latest_offset(None, ReadLimit::Default).await.unwrap(),
            None
        );
        log.append(rows(&log, 0..10)).await.unwrap();
        let o = |n: u64| serde_json::json!(n);
        assert_eq!(
            src.latest_offset(None, ReadLimit::Default).await.unwrap(),
            Some(o(4))
        );
        assert_eq!(
            src.latest_offset(Some(&o(8)), ReadLimit::Default)
                .await
                .unwrap(),
            Some(o(10))
        );
        assert_eq!(
            src.latest_offset(None, ReadLimit::AllAvailable)
                .await
                .unwrap(),
            Some(o(10))
        );
        src.prepare_available_now().await.unwrap();
        log.append(rows(&log, 10..12)).await.unwrap();
        assert_eq!(
            src.latest_offset(Some(&o(10)), ReadLimit::Default)
                .await
                .unwrap(),
            Some(o(10)),
            "available_now ends where the run started"
        );
        let mut arrivals = src.arrivals().unwrap();
        arrivals.borrow_and_update();
        log.append(rows(&log, 12..13)).await.unwrap();
        assert!(arrivals.has_changed().unwrap(), "an append wakes the query");
    }
}
