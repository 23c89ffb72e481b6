//! Stream-stream joins (spec §8.2–8.4): Spark's `StreamingSymmetricHashJoinExec`, behind the
//! stateful-operator contract.
//!
//! A join of two streams becomes a `StatefulJoin` node (`engine::plan`) over its two inputs.
//! Each side keeps the rows it has seen in a state store, keyed by the equi-join key, with
//! a `matched` flag. Per batch:
//!
//! 1. **left input**: rows whose event time is at or before `WM_late` are dropped as late.
//!    A row failing the left-only part of the condition is emitted null-padded at once by a
//!    left or full outer join and never stored. The others are joined with the right side's
//!    stored rows (the rest of the condition decides), and stored with `matched` set when
//!    they matched. A left semi join emits a matching left row once and does not store it;
//! 2. **right input**: the same against the left side's stored rows, which now include this
//!    batch's left rows, so a pair arriving in one batch is produced exactly once. A right
//!    row that the state watermark would evict at once is not stored, unless a right or full
//!    outer join still owes its null-padded row. For a left semi join, a stored left row is
//!    emitted the first time it matches and removed from the state, as Spark 4 does (its
//!    state and counts are those of a left row never stored when it arrives in the same
//!    batch as its first match, a removed row otherwise);
//! 3. **eviction**: each side drops its rows below its *state watermark* (below). An outer
//!    join's preserved side emits its evicted rows that never matched, null-padded: outer
//!    rows come out only when the watermark has passed them.
//!
//! The state watermark of a side (§8.3) comes from the join's condition and `WM(N)`:
//! - an equi-join key that carries the watermark (an event time, or a window over one):
//!   rows whose key time (a window's end) is at or before `WM(N)`;
//! - otherwise a range condition between the two sides' event times, such as
//!   `c.t >= i.t AND c.t <= i.t + INTERVAL '1 hour'`, solved for this side's time with the
//!   other side's time set to `WM(N)`: Spark's `getStateValueWatermark`, milliseconds,
//!   one millisecond less for a non-strict inequality, the minimum over the conjuncts;
//! - else never: the side's state grows without bound (an inner join without watermarks).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use datafusion::arrow::array::{
    Array, ArrayRef, AsArray, BooleanArray, Int64Array, RecordBatch, TimestampMicrosecondArray,
    UInt32Array, new_null_array,
};
use datafusion::arrow::compute::{cast, concat_batches, filter_record_batch, take};
use datafusion::arrow::datatypes::{DataType, Field, Int64Type, Schema, SchemaRef, TimeUnit};
use datafusion::arrow::row::{RowConverter, SortField};
use datafusion::common::{Column, DFSchema, DFSchemaRef, ScalarValue};
use datafusion::logical_expr::{BinaryExpr, Expr, JoinType, Operator};
use datafusion::physical_plan::PhysicalExpr;
use datafusion::prelude::SessionContext;

use super::aggregate::time_micros;
use super::operator::OperatorBatch;
use crate::error::{Error, Result};
use crate::state::{StateLayout, StateMetrics, StateStore};

/// The join types Spark runs between two streams.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd)]
pub enum JoinKind {
    Inner,
    LeftOuter,
    RightOuter,
    FullOuter,
    LeftSemi,
}

impl JoinKind {
    /// The kind of a DataFusion join, or `None` for the types Spark refuses between streams
    /// (right semi, the anti joins).
    pub fn of(t: JoinType) -> Option<JoinKind> {
        match t {
            JoinType::Inner => Some(JoinKind::Inner),
            JoinType::Left => Some(JoinKind::LeftOuter),
            JoinType::Right => Some(JoinKind::RightOuter),
            JoinType::Full => Some(JoinKind::FullOuter),
            JoinType::LeftSemi => Some(JoinKind::LeftSemi),
            _ => None,
        }
    }

    /// Spark's name, as its errors and plans print it.
    pub fn spark_name(self) -> &'static str {
        match self {
            JoinKind::Inner => "Inner",
            JoinKind::LeftOuter => "LeftOuter",
            JoinKind::RightOuter => "RightOuter",
            JoinKind::FullOuter => "FullOuter",
            JoinKind::LeftSemi => "LeftSemi",
        }
    }

    /// Whether the join keeps side `side`'s (0 left, 1 right) unmatched rows, null-padded.
    pub fn preserves(self, side: usize) -> bool {
        matches!(
            (self, side),
            (JoinKind::LeftOuter, 0) | (JoinKind::RightOuter, 1) | (JoinKind::FullOuter, _)
        )
    }
}

/// One conjunct's bound on a side's event time: `time > WM(N) + offset` (or `>=`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TimeBound {
    pub offset_us: i64,
    /// `>=` / `<=`: Spark then evicts one millisecond less.
    pub inclusive: bool,
}

/// Which of a side's stored rows the watermark removes (spec §8.3).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Cleanup {
    Never,
    /// Equi-join key `ordinal` carries the watermark: rows whose key time (a window's end)
    /// is at or before `WM(N)`.
    Key {
        ordinal: usize,
    },
    /// Rows whose event time is at or before the minimum of the bounds.
    Value {
        bounds: Vec<TimeBound>,
    },
}

impl Cleanup {
    /// The state watermark (µs) under eviction watermark `wm_us`: rows at or before it go.
    pub fn state_watermark(&self, wm_us: i64) -> Option<i64> {
        match self {
            Cleanup::Never => None,
            Cleanup::Key { .. } => Some(wm_us),
            Cleanup::Value { bounds } => bounds
                .iter()
                .map(|b| {
                    // Spark solves in microseconds and keeps whole milliseconds (toLong
                    // truncates towards zero, as Rust's division does).
                    let ms = (wm_us + b.offset_us) / 1000 - i64::from(b.inclusive);
                    ms * 1000
                })
                .min(),
        }
    }

    fn describe(&self, side: &JoinSide) -> String {
        match self {
            Cleanup::Never => "kept forever".into(),
            Cleanup::Key { ordinal } => format!(
                "key {} <= WM(N)",
                side.keys
                    .get(*ordinal)
                    .map(|k| k.human_display().to_string())
                    .unwrap_or_default()
            ),
            Cleanup::Value { bounds } => {
                let t = side.time.clone().unwrap_or_default();
                let parts: Vec<String> = bounds
                    .iter()
                    .map(|b| {
                        let sign = if b.offset_us < 0 { "-" } else { "+" };
                        let d = crate::sql::options::format_duration(
                            std::time::Duration::from_micros(b.offset_us.unsigned_abs()),
                        );
                        let offset = if b.offset_us == 0 {
                            String::new()
                        } else {
                            format!(" {sign} {d}")
                        };
                        let less = if b.inclusive { " - 1ms" } else { "" };
                        format!("WM(N){offset}{less}")
                    })
                    .collect();
                format!("{t} <= min({})", parts.join(", "))
            }
        }
    }
}

/// One side of a stream-stream join as the plan found it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct JoinSide {
    /// The side's input columns.
    pub schema: DFSchemaRef,
    /// Its equi-join key expressions, pairwise equal to the other side's.
    pub keys: Vec<Expr>,
    /// The conjuncts of the condition over this side alone that stay in the join (an outer
    /// join's preserved side: a row failing them is emitted null-padded and not stored).
    pub filter: Option<Expr>,
    /// Its event-time column (the first that carries the watermark mark), if any.
    pub time: Option<String>,
    pub cleanup: Cleanup,
}

/// What a stream-stream join is, as the plan found it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct JoinInfo {
    pub kind: JoinKind,
    pub left: JoinSide,
    pub right: JoinSide,
    /// The conjuncts over both sides that are not equi-join keys.
    pub residual: Option<Expr>,
}

impl JoinInfo {
    fn side(&self, i: usize) -> &JoinSide {
        if i == 0 { &self.left } else { &self.right }
    }

    /// Whether the watermark ever removes state (then a moved watermark makes a no-data
    /// batch due, as Spark's `shouldRunAnotherBatch`).
    pub fn evicts(&self) -> bool {
        self.left.cleanup != Cleanup::Never || self.right.cleanup != Cleanup::Never
    }

    /// What EXPLAIN shows after `StatefulJoin: id=N`.
    pub fn describe(&self) -> String {
        let keys: Vec<String> = self
            .left
            .keys
            .iter()
            .zip(&self.right.keys)
            .map(|(l, r)| format!("{} = {}", l.human_display(), r.human_display()))
            .collect();
        let mut s = format!("type={} keys=[{}]", self.kind.spark_name(), keys.join(", "));
        if let Some(r) = &self.residual {
            s.push_str(&format!(" condition={}", r.human_display()));
        }
        for (name, side) in [("left", &self.left), ("right", &self.right)] {
            if let Some(f) = &side.filter {
                s.push_str(&format!(" {name}_filter={}", f.human_display()));
            }
            s.push_str(&format!(
                " {name}: late {}; evict {}",
                side.time
                    .as_ref()
                    .map(|t| format!("{t} <= WM(N-1)"))
                    .unwrap_or_else(|| "never".into()),
                side.cleanup.describe(side)
            ));
        }
        s
    }

    /// The watermark the join passes on to operators above it: the least of the two state
    /// watermarks and its input watermark (spec §2.6, `produceOutputWatermark`).
    pub fn output_watermark(&self, wm_us: i64) -> i64 {
        [&self.left, &self.right]
            .iter()
            .filter_map(|s| s.cleanup.state_watermark(wm_us))
            .fold(wm_us, i64::min)
            .max(0)
    }
}

// ------------------------------------------------------------------ the condition

/// A term of a range condition in Spark's canonical form `a + b + ... < 0`.
#[derive(Debug, Clone, PartialEq)]
enum Term {
    Column { column: Column, negated: bool },
    Constant(i64),
}

/// Spark's `collectTerms`: `expr` as a sum of columns and constants (µs), or `None`.
fn collect_terms(expr: &Expr, negate: bool, out: &mut Vec<Term>) -> Option<()> {
    let sign = |v: i64| if negate { -v } else { v };
    match expr {
        Expr::BinaryExpr(BinaryExpr { left, op, right }) => match op {
            Operator::Plus => {
                collect_terms(left, negate, out)?;
                collect_terms(right, negate, out)
            }
            Operator::Minus => {
                collect_terms(left, negate, out)?;
                collect_terms(right, !negate, out)
            }
            _ => None,
        },
        Expr::Negative(e) => collect_terms(e, !negate, out),
        Expr::Alias(a) => collect_terms(&a.expr, negate, out),
        Expr::Cast(c) if time_or_number(c.field.data_type()) => collect_terms(&c.expr, negate, out),
        Expr::TryCast(c) if time_or_number(c.field.data_type()) => {
            collect_terms(&c.expr, negate, out)
        }
        Expr::Column(c) => {
            out.push(Term::Column {
                column: c.clone(),
                negated: negate,
            });
            Some(())
        }
        Expr::Literal(v, _) => {
            let us = literal_micros(v)?;
            out.push(Term::Constant(sign(us)));
            Some(())
        }
        _ => None,
    }
}

fn time_or_number(t: &DataType) -> bool {
    t.is_numeric() || matches!(t, DataType::Timestamp(..))
}

/// A literal of a range condition in microseconds: intervals (no months: their length
/// varies, as Spark refuses), timestamps, and numbers as seconds.
fn literal_micros(v: &ScalarValue) -> Option<i64> {
    const DAY_US: i64 = 86_400_000_000;
    match v {
        ScalarValue::IntervalMonthDayNano(Some(i)) if i.months == 0 => {
            Some(i64::from(i.days) * DAY_US + i.nanoseconds / 1000)
        }
        ScalarValue::IntervalDayTime(Some(i)) => {
            Some(i64::from(i.days) * DAY_US + i64::from(i.milliseconds) * 1000)
        }
        ScalarValue::DurationSecond(Some(s)) => Some(s * 1_000_000),
        ScalarValue::DurationMillisecond(Some(s)) => Some(s * 1000),
        ScalarValue::DurationMicrosecond(Some(s)) => Some(*s),
        ScalarValue::DurationNanosecond(Some(s)) => Some(s / 1000),
        ScalarValue::TimestampSecond(Some(s), _) => Some(s * 1_000_000),
        ScalarValue::TimestampMillisecond(Some(s), _) => Some(s * 1000),
        ScalarValue::TimestampMicrosecond(Some(s), _) => Some(*s),
        ScalarValue::TimestampNanosecond(Some(s), _) => Some(s / 1000),
        ScalarValue::Float64(Some(f)) => Some((f * 1e6) as i64),
        ScalarValue::Float32(Some(f)) => Some((f64::from(*f) * 1e6) as i64),
        v if v.data_type().is_integer() => match v.cast_to(&DataType::Int64).ok()? {
            ScalarValue::Int64(Some(i)) => i.checked_mul(1_000_000),
            _ => None,
        },
        _ => None,
    }
}

/// Splits `expr` at its top-level ANDs.
pub fn conjuncts(expr: &Expr) -> Vec<Expr> {
    datafusion::logical_expr::utils::split_conjunction(expr)
        .into_iter()
        .cloned()
        .collect()
}

/// Whether every column `e` reads belongs to `schema` (true for an expression that reads
/// none, as Spark counts it on the left).
pub fn reads_only(e: &Expr, schema: &DFSchema) -> bool {
    e.column_refs().iter().all(|c| schema.has_column(c))
}

/// Spark's `getStateValueWatermark` for one side: the bounds on `this` side's time that
/// the range conjuncts of `condition` give when `other`'s watermarked column `other_time`
/// is replaced by the watermark. Empty when none can be derived.
pub fn value_bounds(
    condition: &[Expr],
    this: &DFSchema,
    other: &DFSchema,
    other_time: Option<&str>,
) -> Vec<TimeBound> {
    let Some(other_time) = other_time else {
        return vec![];
    };
    condition
        .iter()
        .filter_map(|c| {
            let Expr::BinaryExpr(BinaryExpr { left, op, right }) = c else {
                return None;
            };
            // `l < r` as `l - r < 0`; `l > r` as `r - l < 0`.
            let (small, large, inclusive) = match op {
                Operator::Lt => (left, right, false),
                Operator::LtEq => (left, right, true),
                Operator::Gt => (right, left, false),
                Operator::GtEq => (right, left, true),
                _ => return None,
            };
            let mut terms = Vec::new();
            collect_terms(small, false, &mut terms)?;
            collect_terms(large, true, &mut terms)?;
            solve(&terms, this, other, other_time).map(|offset_us| TimeBound {
                offset_us,
                inclusive,
            })
        })
        .collect()
}

/// `terms < 0` solved for the one column of `this` side (which must appear negated:
/// `-t + W + c < 0` gives `t > W + c`), with `other`'s one column, its watermarked one,
/// set to the watermark: the offset `c`.
fn solve(terms: &[Term], this: &DFSchema, other: &DFSchema, other_time: &str) -> Option<i64> {
    let mut this_columns = Vec::new();
    let mut other_columns = Vec::new();
    let mut offset = 0i64;
    for t in terms {
        match t {
            Term::Constant(c) => offset = offset.checked_add(*c)?,
            Term::Column { column, negated } => {
                if this.has_column(column) && !other.has_column(column) {
                    this_columns.push((column, *negated));
                } else if other.has_column(column) && !this.has_column(column) {
                    other_columns.push((column, *negated));
                } else {
                    return None;
                }
            }
        }
    }
    // One column of each side (Spark: more than one attribute of a side cannot be solved).
    let [(_, this_negated)] = this_columns.as_slice() else {
        return None;
    };
    let [(other_column, other_negated)] = other_columns.as_slice() else {
        return None;
    };
    if !*this_negated || *other_negated || other_column.name != other_time {
        return None;
    }
    Some(offset)
}

// ------------------------------------------------------------------ the operator

const LEFT: usize = 0;
const RIGHT: usize = 1;
/// State columns before the key: the batch id and the row's number in it.
const ID_COLUMNS: usize = 2;

/// A side at run time.
struct Side {
    schema: SchemaRef,
    keys: Vec<Arc<dyn PhysicalExpr>>,
    filter: Option<Arc<dyn PhysicalExpr>>,
    /// Index of the event-time column in the input.
    time: Option<usize>,
    cleanup: Cleanup,
    store: Box<dyn StateStore>,
}

/// Spark's `StreamingSymmetricHashJoinExec` for one query.
pub struct JoinOperator {
    info: JoinInfo,
    sides: [Side; 2],
    key_types: Vec<DataType>,
    key_rows: RowConverter,
    residual: Option<Arc<dyn PhysicalExpr>>,
    /// Left columns then right columns: what the residual condition reads.
    joined: SchemaRef,
    /// The batch being processed (= the state version loaded).
    version: u64,
}

fn evaluate(expr: &Arc<dyn PhysicalExpr>, batch: &RecordBatch) -> Result<ArrayRef> {
    Ok(expr.evaluate(batch)?.into_array(batch.num_rows())?)
}

/// A predicate's value per row, NULL as false.
fn truth(expr: &Arc<dyn PhysicalExpr>, batch: &RecordBatch) -> Result<Vec<bool>> {
    let v = evaluate(expr, batch)?;
    let b = v
        .as_boolean_opt()
        .ok_or_else(|| Error::Internal("a join condition is not boolean".into()))?;
    Ok((0..b.len()).map(|i| b.is_valid(i) && b.value(i)).collect())
}

fn indices(v: &[usize]) -> UInt32Array {
    UInt32Array::from_iter_values(v.iter().map(|&i| i as u32))
}

fn take_columns(columns: &[ArrayRef], rows: &[usize]) -> Result<Vec<ArrayRef>> {
    let idx = indices(rows);
    columns
        .iter()
        .map(|c| Ok(take(c.as_ref(), &idx, None)?))
        .collect()
}

fn nulls_like(schema: &Schema, n: usize) -> Vec<ArrayRef> {
    schema
        .fields()
        .iter()
        .map(|f| new_null_array(f.data_type(), n))
        .collect()
}

/// The stored rows of one side, decoded for one batch.
/// What joining one side's input did to the state.
#[derive(Debug, Default)]
struct SideCounts {
    /// Rows of this side stored.
    stored: u64,
    /// Left semi join, right side: left rows of this batch removed at their first match
    /// (Spark counts them as never stored).
    unstored: u64,
    /// Left semi join, right side: left rows of earlier batches removed at their first
    /// match.
    removed: u64,
}

struct Stored {
    rows: RecordBatch,
    /// Their input columns, as the side's schema.
    values: Vec<ArrayRef>,
    matched: Vec<bool>,
    /// Rows whose `matched` flag this batch set.
    newly_matched: Vec<usize>,
}

impl JoinOperator {
    /// Builds the operator; `open_store(side, layout)` opens the state of side `"left"` or
    /// `"right"`.
    pub fn try_new(
        info: JoinInfo,
        partitions: usize,
        mut open_store: impl FnMut(&str, StateLayout) -> Result<Box<dyn StateStore>>,
    ) -> Result<JoinOperator> {
        let state = SessionContext::new().state();
        let physical = |e: &Expr, schema: &DFSchema| -> Result<Arc<dyn PhysicalExpr>> {
            Ok(state.create_physical_expr(e.clone(), schema)?)
        };
        let left_keys: Vec<_> = info
            .left
            .keys
            .iter()
            .map(|k| physical(k, &info.left.schema))
            .collect::<Result<_>>()?;
        let right_keys: Vec<_> = info
            .right
            .keys
            .iter()
            .map(|k| physical(k, &info.right.schema))
            .collect::<Result<_>>()?;
        let left_arrow = Arc::new(info.left.schema.as_arrow().clone());
        let right_arrow = Arc::new(info.right.schema.as_arrow().clone());
        let key_types = left_keys
            .iter()
            .map(|k| Ok(k.data_type(&left_arrow)?))
            .collect::<Result<Vec<_>>>()?;
        let key_rows = RowConverter::new(
            key_types
                .iter()
                .map(|t| SortField::new(t.clone()))
                .collect(),
        )?;
        let joined_df = info.left.schema.join(&info.right.schema)?;
        let joined = Arc::new(joined_df.as_arrow().clone());
        let residual = info
            .residual
            .as_ref()
            .map(|r| physical(r, &joined_df))
            .transpose()?;
        let mut sides = Vec::with_capacity(2);
        for (i, (keys, arrow)) in [(left_keys, left_arrow), (right_keys, right_arrow)]
            .into_iter()
            .enumerate()
        {
            let side = info.side(i);
            let time = match &side.time {
                Some(t) => Some(
                    arrow
                        .fields()
                        .iter()
                        .position(|f| f.name() == t)
                        .ok_or_else(|| {
                            Error::Internal(format!("join input has no column \"{t}\""))
                        })?,
                ),
                None => None,
            };
            let mut fields = vec![
                Field::new("__batch", DataType::Int64, false),
                Field::new("__seq", DataType::Int64, false),
            ];
            fields.extend(
                key_types
                    .iter()
                    .enumerate()
                    .map(|(k, t)| Field::new(format!("__key{k}"), t.clone(), true)),
            );
            fields.extend(
                arrow
                    .fields()
                    .iter()
                    .enumerate()
                    .map(|(c, f)| Field::new(format!("v{c}"), f.data_type().clone(), true)),
            );
            fields.push(Field::new("__matched", DataType::Boolean, true));
            fields.push(Field::new(
                "__time",
                DataType::Timestamp(TimeUnit::Microsecond, None),
                true,
            ));
            let n = fields.len();
            let store = open_store(
                if i == LEFT { "left" } else { "right" },
                StateLayout {
                    schema: Arc::new(Schema::new(fields)),
                    key_columns: ID_COLUMNS + key_types.len(),
                    window_columns: ID_COLUMNS,
                    time_column: (side.cleanup != Cleanup::Never).then_some(n - 1),
                    partitions,
                    group_lookups: true,
                },
            )?;
            let filter = side
                .filter
                .as_ref()
                .map(|f| physical(f, &side.schema))
                .transpose()?;
            sides.push(Side {
                schema: arrow,
                keys,
                filter,
                time,
                cleanup: side.cleanup.clone(),
                store,
            });
        }
        let [left, right]: [Side; 2] = sides
            .try_into()
            .map_err(|_| Error::Internal("a join has two sides".into()))?;
        Ok(JoinOperator {
            info,
            sides: [left, right],
            key_types,
            key_rows,
            residual,
            joined,
            version: 0,
        })
    }

    pub fn info(&self) -> &JoinInfo {
        &self.info
    }

    pub fn load(&mut self, version: u64) -> Result<()> {
        for s in &mut self.sides {
            s.store.load(version)?;
        }
        self.version = version;
        Ok(())
    }

    /// The key columns of `input` on `side`, in the common key types.
    fn keys_of(&self, side: usize, input: &RecordBatch) -> Result<Vec<ArrayRef>> {
        self.sides[side]
            .keys
            .iter()
            .zip(&self.key_types)
            .map(|(k, t)| {
                let v = evaluate(k, input)?;
                Ok(if v.data_type() == t { v } else { cast(&v, t)? })
            })
            .collect()
    }

    /// State rows for `input`'s rows on `side`: ids `(batch, first_seq + i)`.
    fn state_rows(
        &self,
        side: usize,
        input: &RecordBatch,
        keys: &[ArrayRef],
        matched: &[bool],
        first_seq: i64,
    ) -> Result<RecordBatch> {
        let s = &self.sides[side];
        let n = input.num_rows();
        let schema = s.store.schema();
        let mut cols: Vec<ArrayRef> = vec![
            Arc::new(Int64Array::from(vec![self.version as i64; n])),
            Arc::new(Int64Array::from_iter_values(
                (0..n as i64).map(|i| first_seq + i),
            )),
        ];
        cols.extend(keys.iter().cloned());
        cols.extend(input.columns().iter().cloned());
        cols.push(Arc::new(BooleanArray::from(matched.to_vec())));
        let time: ArrayRef = match (&s.cleanup, s.time) {
            (Cleanup::Never, _) | (Cleanup::Value { .. }, None) => {
                new_null_array(&DataType::Timestamp(TimeUnit::Microsecond, None), n)
            }
            (Cleanup::Key { ordinal }, _) => {
                let v = time_micros(&keys[*ordinal])?;
                Arc::new(TimestampMicrosecondArray::new(
                    v.values().clone(),
                    v.nulls().cloned(),
                ))
            }
            (Cleanup::Value { .. }, Some(t)) => {
                let v = time_micros(input.column(t))?;
                Arc::new(TimestampMicrosecondArray::new(
                    v.values().clone(),
                    v.nulls().cloned(),
                ))
            }
        };
        cols.push(time);
        let cols = cols
            .into_iter()
            .zip(schema.fields())
            .map(|(c, f)| {
                Ok(if c.data_type() == f.data_type() {
                    c
                } else {
                    cast(&c, f.data_type())?
                })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(RecordBatch::try_new(schema, cols)?)
    }

    /// Decodes stored rows of `side`.
    fn stored(&self, side: usize, rows: RecordBatch) -> Result<Stored> {
        let s = &self.sides[side];
        let k = self.key_types.len();
        let n_values = s.schema.fields().len();
        let values = rows.columns()[ID_COLUMNS + k..ID_COLUMNS + k + n_values]
            .iter()
            .zip(s.schema.fields())
            .map(|(c, f)| {
                Ok(if c.data_type() == f.data_type() {
                    c.clone()
                } else {
                    cast(c, f.data_type())?
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let m = rows.column(ID_COLUMNS + k + n_values).as_boolean();
        let matched = (0..m.len()).map(|i| m.is_valid(i) && m.value(i)).collect();
        Ok(Stored {
            rows,
            values,
            matched,
            newly_matched: vec![],
        })
    }

    /// The stored rows with their `matched` flag set, to upsert.
    fn with_matched(&self, stored: &Stored) -> Result<RecordBatch> {
        let rows = take_columns(stored.rows.columns(), &stored.newly_matched)?;
        let mut rows = rows;
        let m = rows.len() - 2;
        rows[m] = Arc::new(BooleanArray::from(vec![true; stored.newly_matched.len()]));
        Ok(RecordBatch::try_new(stored.rows.schema(), rows)?)
    }

    /// Joined rows: `this` side's `probe` rows with the `other` side's `stored` rows,
    /// pairwise; left columns first.
    fn pairs(
        &self,
        this: usize,
        probe: &RecordBatch,
        probe_rows: &[usize],
        stored: &[ArrayRef],
        stored_rows: &[usize],
    ) -> Result<Vec<ArrayRef>> {
        let p = take_columns(probe.columns(), probe_rows)?;
        let s = take_columns(stored, stored_rows)?;
        Ok(if this == LEFT {
            p.into_iter().chain(s).collect()
        } else {
            s.into_iter().chain(p).collect()
        })
    }

    /// `rows` of `side` with the other side's columns NULL.
    fn null_padded(&self, side: usize, rows: Vec<ArrayRef>, n: usize) -> Vec<ArrayRef> {
        let nulls = nulls_like(&self.sides[1 - side].schema, n);
        if side == LEFT {
            rows.into_iter().chain(nulls).collect()
        } else {
            nulls.into_iter().chain(rows).collect()
        }
    }

    /// Steps 1 and 2 for side `this`: its new rows joined with the other side's state.
    fn join_side(
        &mut self,
        this: usize,
        rows: Vec<RecordBatch>,
        wm_late_us: i64,
        wm_evict_us: i64,
        out: &mut OperatorBatch,
    ) -> Result<SideCounts> {
        let kind = self.info.kind;
        let semi = kind == JoinKind::LeftSemi;
        let schema = self.sides[this].schema.clone();
        let mut input = Vec::with_capacity(rows.len());
        for b in rows {
            let b = RecordBatch::try_new(schema.clone(), b.columns().to_vec())?;
            let b = out.keep_on_time(b, self.sides[this].time, wm_late_us)?;
            if b.num_rows() > 0 {
                input.push(b);
            }
        }
        let input = concat_batches(&schema, &input)?;
        if input.num_rows() == 0 {
            return Ok(SideCounts::default());
        }
        // Rows failing this side's own conditions never match: an outer join emits them
        // null-padded now; they are not stored.
        let input = match &self.sides[this].filter {
            Some(f) => {
                let pass = truth(f, &input)?;
                if kind.preserves(this) {
                    let failing: Vec<usize> = (0..pass.len()).filter(|&i| !pass[i]).collect();
                    if !failing.is_empty() {
                        let cols = take_columns(input.columns(), &failing)?;
                        out.emitted
                            .push(self.null_padded(this, cols, failing.len()));
                    }
                }
                filter_record_batch(&input, &BooleanArray::from(pass))?
            }
            None => input,
        };
        let n = input.num_rows();
        if n == 0 {
            return Ok(SideCounts::default());
        }
        let keys = self.keys_of(this, &input)?;
        let probe_state = self.state_rows(this, &input, &keys, &vec![false; n], 0)?;
        let other = 1 - this;
        let stored = self.sides[other].store.get_groups(&probe_state)?;
        let mut stored = self.stored(other, stored)?;
        let k = self.key_types.len();
        // Candidate pairs: equal keys (NULL keys match nothing, as in SQL).
        let stored_keys = self.key_rows.convert_columns(
            &stored.rows.columns()[ID_COLUMNS..ID_COLUMNS + k]
                .iter()
                .zip(&self.key_types)
                .map(|(c, t)| {
                    Ok(if c.data_type() == t {
                        c.clone()
                    } else {
                        cast(c, t)?
                    })
                })
                .collect::<Result<Vec<_>>>()?,
        )?;
        let probe_keys = self.key_rows.convert_columns(&keys)?;
        let has_null = |cols: &[ArrayRef], i: usize| cols.iter().any(|c| c.is_null(i));
        let stored_key_cols = &stored.rows.columns()[ID_COLUMNS..ID_COLUMNS + k];
        let mut by_key: HashMap<&[u8], Vec<usize>> = HashMap::new();
        for j in 0..stored.rows.num_rows() {
            if !has_null(stored_key_cols, j) {
                by_key.entry(stored_keys.row(j).data()).or_default().push(j);
            }
        }
        let (mut pi, mut sj) = (Vec::new(), Vec::new());
        for i in 0..n {
            if has_null(&keys, i) {
                continue;
            }
            if let Some(js) = by_key.get(probe_keys.row(i).data()) {
                for &j in js {
                    pi.push(i);
                    sj.push(j);
                }
            }
        }
        let joined = self.pairs(this, &input, &pi, &stored.values, &sj)?;
        let pass = match &self.residual {
            Some(r) if !pi.is_empty() => {
                let batch = RecordBatch::try_new(self.joined.clone(), joined.clone())?;
                truth(r, &batch)?
            }
            _ => vec![true; pi.len()],
        };
        let mut probe_matched = vec![false; n];
        let mut keep = Vec::with_capacity(pi.len());
        let mut semi_left = Vec::new();
        for (p, (&i, &j)) in pi.iter().zip(&sj).enumerate() {
            // A left semi join's right rows skip left rows that already matched.
            if semi && this == RIGHT && stored.matched[j] {
                continue;
            }
            if !pass[p] {
                continue;
            }
            probe_matched[i] = true;
            if !stored.matched[j] {
                stored.matched[j] = true;
                stored.newly_matched.push(j);
                if semi && this == RIGHT {
                    semi_left.push(j);
                }
            }
            keep.push(p);
        }
        if semi {
            if this == LEFT {
                let matched: Vec<usize> = (0..n).filter(|&i| probe_matched[i]).collect();
                if !matched.is_empty() {
                    out.emitted.push(take_columns(input.columns(), &matched)?);
                }
            } else if !semi_left.is_empty() {
                out.emitted.push(take_columns(&stored.values, &semi_left)?);
            }
        } else if !keep.is_empty() {
            out.emitted.push(take_columns(&joined, &keep)?);
        }
        let mut counts = SideCounts::default();
        if semi && this == RIGHT && !semi_left.is_empty() {
            // Matched left rows are done with: removed (or, stored this batch, never stored).
            let gone = RecordBatch::try_new(
                stored.rows.schema(),
                take_columns(stored.rows.columns(), &semi_left)?,
            )?;
            let stored_in = gone.column(0).as_primitive::<Int64Type>();
            let now = (0..gone.num_rows())
                .filter(|&i| stored_in.value(i) == self.version as i64)
                .count() as u64;
            counts.unstored = now;
            counts.removed = gone.num_rows() as u64 - now;
            let empty = RecordBatch::new_empty(gone.schema());
            self.sides[other].store.apply(&empty, &gone)?;
        } else if !stored.newly_matched.is_empty() {
            let updated = self.with_matched(&stored)?;
            let empty = RecordBatch::new_empty(updated.schema());
            self.sides[other].store.apply(&updated, &empty)?;
        }
        // Store this side's rows, with whether they matched (spec §8.2).
        let state_wm = self.sides[this].cleanup.state_watermark(wm_evict_us);
        let times = time_micros(probe_state.column(probe_state.num_columns() - 1))?;
        let store: Vec<usize> = (0..n)
            .filter(|&i| {
                if semi && this == LEFT && probe_matched[i] {
                    return false;
                }
                if this == LEFT {
                    return true;
                }
                let evicted_now =
                    state_wm.is_some_and(|wm| times.is_valid(i) && times.value(i) <= wm);
                !evicted_now || (kind.preserves(RIGHT) && !probe_matched[i])
            })
            .collect();
        if store.is_empty() {
            return Ok(counts);
        }
        let kept = RecordBatch::try_new(schema.clone(), take_columns(input.columns(), &store)?)?;
        let kept_keys = take_columns(&keys, &store)?;
        let matched: Vec<bool> = store.iter().map(|&i| probe_matched[i]).collect();
        let rows = self.state_rows(this, &kept, &kept_keys, &matched, 0)?;
        // Row numbers are unique in the batch: the left and right stores are apart, and
        // each side stores once per batch.
        let empty = RecordBatch::new_empty(rows.schema());
        self.sides[this].store.apply(&rows, &empty)?;
        counts.stored = store.len() as u64;
        Ok(counts)
    }

    /// Step 3 for `side`: evicts its rows below its state watermark; an outer join's
    /// preserved side emits those that never matched. Returns how many went.
    fn evict(&mut self, side: usize, wm_evict_us: i64, out: &mut OperatorBatch) -> Result<u64> {
        let Some(wm) = self.sides[side].cleanup.state_watermark(wm_evict_us) else {
            return Ok(0);
        };
        let removed = self.sides[side].store.evict_expired(wm)?;
        let n = removed.num_rows() as u64;
        if self.info.kind.preserves(side) && n > 0 {
            let stored = self.stored(side, removed)?;
            let unmatched: Vec<usize> = (0..stored.matched.len())
                .filter(|&i| !stored.matched[i])
                .collect();
            if !unmatched.is_empty() {
                let cols = take_columns(&stored.values, &unmatched)?;
                out.emitted
                    .push(self.null_padded(side, cols, unmatched.len()));
            }
        }
        Ok(n)
    }

    /// Runs one batch: `inputs` are the left rows and the right rows; `WM_late` judges late
    /// rows, `WM_evict` evicts (µs).
    pub fn process(
        &mut self,
        inputs: Vec<Vec<RecordBatch>>,
        wm_late_us: i64,
        wm_evict_us: i64,
    ) -> Result<OperatorBatch> {
        let mut out = OperatorBatch::default();
        let started = Instant::now();
        let mut inputs = inputs.into_iter();
        let left = inputs.next().unwrap_or_default();
        let right = inputs.next().unwrap_or_default();
        let left = self.join_side(LEFT, left, wm_late_us, wm_evict_us, &mut out)?;
        let right = self.join_side(RIGHT, right, wm_late_us, wm_evict_us, &mut out)?;
        out.rows_updated = (left.stored + right.stored).saturating_sub(right.unstored);
        out.all_updates_ms = started.elapsed().as_millis() as u64;
        let started = Instant::now();
        let mut removed = right.removed;
        for side in [LEFT, RIGHT] {
            removed += self.evict(side, wm_evict_us, &mut out)?;
        }
        out.rows_removed = removed;
        out.all_removals_ms = started.elapsed().as_millis() as u64;
        Ok(out)
    }

    pub fn commit(&mut self, version: u64) -> Result<StateMetrics> {
        let mut total = StateMetrics::default();
        for s in &mut self.sides {
            let m = s.store.commit(version)?;
            total.rows_total += m.rows_total;
            total.rows_updated += m.rows_updated;
            total.rows_removed += m.rows_removed;
            total.memory_bytes += m.memory_bytes;
            total.commit_ms += m.commit_ms;
        }
        self.version = version;
        Ok(total)
    }

    pub fn maintain(&mut self) -> Result<()> {
        for s in &mut self.sides {
            s.store.maintain()?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::StoreKind;
    use datafusion::arrow::array::StringArray;
    use datafusion::logical_expr::{col, lit};
    use datafusion::scalar::ScalarValue;

    const MIN: i64 = 60_000_000;
    const HOUR: i64 = 60 * MIN;

    fn ts() -> DataType {
        DataType::Timestamp(TimeUnit::Microsecond, None)
    }

    fn side_schema(q: &str, time: &str) -> DFSchemaRef {
        let s = Schema::new(vec![
            Field::new("ad_id", DataType::Utf8, true),
            Field::new(time, ts(), true),
        ]);
        Arc::new(DFSchema::try_from_qualified_schema(q, &s).unwrap())
    }

    fn hour() -> Expr {
        lit(ScalarValue::new_interval_mdn(0, 0, 3_600_000_000_000))
    }

    /// Spark's documented example: `c.t >= i.t AND c.t <= i.t + 1 hour`.
    fn ad_condition() -> Vec<Expr> {
        vec![
            col("c.click_time").gt_eq(col("i.impression_time")),
            col("c.click_time").lt_eq(col("i.impression_time") + hour()),
        ]
    }

    #[test]
    fn range_conditions_give_sparks_state_watermarks() {
        let (i, c) = (
            side_schema("i", "impression_time"),
            side_schema("c", "click_time"),
        );
        let left = value_bounds(&ad_condition(), &i, &c, Some("click_time"));
        assert_eq!(
            left,
            vec![TimeBound {
                offset_us: -HOUR,
                inclusive: true
            }]
        );
        let right = value_bounds(&ad_condition(), &c, &i, Some("impression_time"));
        assert_eq!(
            right,
            vec![TimeBound {
                offset_us: 0,
                inclusive: true
            }]
        );
        // WM = 12:00: impressions at or before 10:59:59.999 go, clicks at or before
        // 11:59:59.999 (spec §8.3's worked example).
        let wm = 12 * HOUR;
        let cleanup = Cleanup::Value { bounds: left };
        assert_eq!(cleanup.state_watermark(wm), Some(11 * HOUR - 1000));
        // A strict bound keeps its millisecond; several bounds take the least.
        let two = Cleanup::Value {
            bounds: vec![
                TimeBound {
                    offset_us: -HOUR,
                    inclusive: false,
                },
                TimeBound {
                    offset_us: -2 * HOUR,
                    inclusive: false,
                },
            ],
        };
        assert_eq!(two.state_watermark(wm), Some(10 * HOUR));
        assert_eq!(Cleanup::Never.state_watermark(wm), None);
    }

    #[test]
    fn conditions_spark_cannot_solve_give_no_bound() {
        let (i, c) = (
            side_schema("i", "impression_time"),
            side_schema("c", "click_time"),
        );
        let solve = |e: Expr| value_bounds(&[e], &i, &c, Some("click_time"));
        // The other side's column is not its watermarked one.
        assert!(solve(col("c.ad_id").lt_eq(col("i.impression_time"))).is_empty());
        // This side's time bounded from above only: no lower bound.
        assert!(solve(col("i.impression_time").lt_eq(col("c.click_time"))).is_empty());
        // Bounded from below by the other side's time.
        assert_eq!(
            solve(col("i.impression_time").gt_eq(col("c.click_time"))),
            vec![TimeBound {
                offset_us: 0,
                inclusive: true
            }]
        );
        // Months have no fixed length.
        let month = lit(ScalarValue::new_interval_mdn(1, 0, 0));
        assert!(solve(col("c.click_time").lt_eq(col("i.impression_time") + month)).is_empty());
        // Not a range.
        assert!(solve(col("c.click_time").eq(col("i.impression_time"))).is_empty());
        // No watermark on the other side.
        assert!(value_bounds(&ad_condition(), &i, &c, None).is_empty());
    }

    fn rows(schema: &DFSchemaRef, v: &[(&str, i64)]) -> RecordBatch {
        RecordBatch::try_new(
            Arc::new(schema.as_arrow().clone()),
            vec![
                Arc::new(StringArray::from_iter_values(v.iter().map(|r| r.0))),
                Arc::new(TimestampMicrosecondArray::from_iter_values(
                    v.iter().map(|r| r.1),
                )),
            ],
        )
        .unwrap()
    }

    fn outer_join(dir: &std::path::Path) -> JoinOperator {
        let (i, c) = (
            side_schema("i", "impression_time"),
            side_schema("c", "click_time"),
        );
        let left_bounds = value_bounds(&ad_condition(), &i, &c, Some("click_time"));
        let right_bounds = value_bounds(&ad_condition(), &c, &i, Some("impression_time"));
        let info = JoinInfo {
            kind: JoinKind::LeftOuter,
            left: JoinSide {
                schema: i,
                keys: vec![col("i.ad_id")],
                filter: None,
                time: Some("impression_time".into()),
                cleanup: Cleanup::Value {
                    bounds: left_bounds,
                },
            },
            right: JoinSide {
                schema: c,
                keys: vec![col("c.ad_id")],
                filter: None,
                time: Some("click_time".into()),
                cleanup: Cleanup::Value {
                    bounds: right_bounds,
                },
            },
            residual: datafusion::logical_expr::utils::conjunction(ad_condition()),
        };
        JoinOperator::try_new(info, 2, |side, layout| {
            crate::state::open(StoreKind::Memory, &dir.join(side), layout)
        })
        .unwrap()
    }

    fn emitted(b: &OperatorBatch) -> Vec<String> {
        let mut out: Vec<String> = b
            .emitted
            .iter()
            .flat_map(|cols| {
                (0..cols[0].len()).map(move |r| {
                    cols.iter()
                        .map(|c| {
                            if c.is_null(r) {
                                "-".to_string()
                            } else if let Some(s) = c.as_string_opt::<i32>() {
                                s.value(r).to_string()
                            } else {
                                (time_micros(c).unwrap().value(r) / MIN).to_string()
                            }
                        })
                        .collect::<Vec<_>>()
                        .join(" ")
                })
            })
            .collect();
        out.sort();
        out
    }

    #[test]
    fn outer_rows_wait_for_the_state_watermark_and_pairs_come_once() {
        let tmp = tempfile::tempdir().unwrap();
        let mut j = outer_join(tmp.path());
        let (i, c) = (
            side_schema("i", "impression_time"),
            side_schema("c", "click_time"),
        );
        j.load(0).unwrap();
        // Batch 0: a pair arriving together comes out once; b waits for a click.
        let b = j
            .process(
                vec![
                    vec![rows(&i, &[("a", 600 * MIN), ("b", 610 * MIN)])],
                    vec![rows(&c, &[("a", 620 * MIN)])],
                ],
                0,
                0,
            )
            .unwrap();
        assert_eq!(emitted(&b), vec!["a 600 a 620"]);
        assert_eq!((b.rows_updated, b.rows_removed), (3, 0));
        j.commit(1).unwrap();
        // Batch 1, WM 11:10: b (10:10) is not yet passed by an hour and a millisecond; a
        // (10:00, matched) goes silently, and the click (10:20 <= 11:09:59.999).
        let b = j.process(vec![vec![], vec![]], 0, 670 * MIN).unwrap();
        assert!(emitted(&b).is_empty());
        assert_eq!(b.rows_removed, 2);
        j.commit(2).unwrap();
        // Batch 2, WM 11:11: b comes out null-padded.
        let b = j
            .process(vec![vec![], vec![]], 670 * MIN, 671 * MIN)
            .unwrap();
        assert_eq!(emitted(&b), vec!["b 610 - -"]);
        assert_eq!(b.rows_removed, 1);
        let m = j.commit(3).unwrap();
        assert_eq!(m.rows_total, 0);
        // Replaying batch 2 from version 2 gives the same rows.
        j.load(2).unwrap();
        let b = j
            .process(vec![vec![], vec![]], 670 * MIN, 671 * MIN)
            .unwrap();
        assert_eq!(emitted(&b), vec!["b 610 - -"]);
        // A click at or before WM(N-1) is late on its side.
        j.load(3).unwrap();
        let b = j
            .process(
                vec![vec![], vec![rows(&c, &[("a", 660 * MIN)])]],
                671 * MIN,
                671 * MIN,
            )
            .unwrap();
        assert_eq!(b.dropped_late, 1);
    }
}
