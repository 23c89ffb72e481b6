//! `EXPLAIN query` as Postgres prints it: one column `QUERY PLAN`, a line per plan node,
//! each with `(cost=startup..total rows=n width=w)`. Tools parse that line: Superset reads
//! the first line's `cost=` for its cost estimate, pgAdmin and DBeaver draw the tree from
//! the `->` indentation.
//!
//! The nodes are DataFusion's physical plan (`displayable(..).one_line()`). The figures
//! are estimates in Postgres's units from DataFusion's statistics: a scan reads its bytes
//! as pages (`seq_page_cost` 1 per 8 KiB), every node spends `cpu_tuple_cost` (0.01) per
//! row it emits, and a node that must read all its input before its first row (a sort, an
//! aggregate, a join's build side) starts after its children end. Rows without statistics
//! are estimated at 1000, as Postgres guesses for a table it has never analysed.
//! `EXPLAIN ANALYZE` and `EXPLAIN VERBOSE` stay DataFusion's.

use std::sync::Arc;

use datafusion::arrow::datatypes::{DataType, Schema};
use datafusion::common::stats::Precision;
use datafusion::error::Result;
use datafusion::physical_plan::execution_plan::EmissionType;
use datafusion::physical_plan::{ExecutionPlan, StatisticsArgs, StatisticsContext, displayable};

const SEQ_PAGE_COST: f64 = 1.0;
const CPU_TUPLE_COST: f64 = 0.01;
const PAGE_BYTES: f64 = 8192.0;
/// Postgres's guess for rows it knows nothing of.
const UNKNOWN_ROWS: usize = 1000;

/// One node's estimate.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Estimate {
    pub startup: f64,
    pub total: f64,
    pub rows: usize,
    pub width: usize,
}

impl Estimate {
    /// `(cost=0.00..25.88 rows=423 width=88)`.
    pub fn annotation(&self) -> String {
        format!(
            "(cost={:.2}..{:.2} rows={} width={})",
            self.startup, self.total, self.rows, self.width
        )
    }
}

/// A node's estimate from its own statistics and its children's estimates. `blocking`:
/// it reads all its input before it emits a row.
pub fn estimate(
    rows: Option<usize>,
    bytes: Option<usize>,
    width: usize,
    blocking: bool,
    children: &[Estimate],
) -> Estimate {
    let rows = rows.unwrap_or(UNKNOWN_ROWS);
    let below: f64 = children.iter().map(|c| c.total).sum();
    let read = if children.is_empty() {
        // A leaf reads its table: its bytes as pages, or its rows at this width.
        let bytes = bytes.unwrap_or(rows * width) as f64;
        (bytes / PAGE_BYTES).ceil() * SEQ_PAGE_COST
    } else {
        0.0
    };
    let startup = if blocking {
        below
    } else {
        children.iter().map(|c| c.startup).fold(0.0, f64::max)
    };
    Estimate {
        startup,
        total: below + read + rows as f64 * CPU_TUPLE_COST,
        rows,
        width,
    }
}

/// Postgres's width estimate of a row of `schema`: the bytes of its fixed-size columns,
/// 32 for each text, binary or other variable-size one.
pub fn row_width(schema: &Schema) -> usize {
    schema
        .fields()
        .iter()
        .map(|f| match f.data_type() {
            DataType::Boolean | DataType::Int8 | DataType::UInt8 => 1,
            DataType::Int16 | DataType::UInt16 => 2,
            DataType::Int32 | DataType::UInt32 | DataType::Float32 | DataType::Date32 => 4,
            DataType::Int64
            | DataType::UInt64
            | DataType::Float64
            | DataType::Date64
            | DataType::Timestamp(_, _)
            | DataType::Time64(_)
            | DataType::Duration(_) => 8,
            DataType::Interval(_) | DataType::Decimal128(_, _) => 16,
            _ => 32,
        })
        .sum()
}

/// The plan's lines, as Postgres indents them: the root, then each child under `->`.
pub fn lines(plan: &Arc<dyn ExecutionPlan>) -> Result<Vec<String>> {
    let mut out = Vec::new();
    walk(plan, 0, &StatisticsContext::new(), &mut out)?;
    Ok(out)
}

fn walk(
    plan: &Arc<dyn ExecutionPlan>,
    depth: usize,
    statistics: &StatisticsContext,
    out: &mut Vec<String>,
) -> Result<Estimate> {
    let at = out.len();
    out.push(String::new());
    let children = plan
        .children()
        .into_iter()
        .map(|c| walk(c, depth + 1, statistics, out))
        .collect::<Result<Vec<_>>>()?;
    let stats = statistics.compute(plan.as_ref(), &StatisticsArgs::new())?;
    let value = |p: &Precision<usize>| p.get_value().copied();
    let blocking = plan.properties().emission_type == EmissionType::Final;
    let own = estimate(
        value(&stats.num_rows),
        value(&stats.total_byte_size),
        row_width(&plan.schema()),
        blocking,
        &children,
    );
    let node = displayable(plan.as_ref()).one_line().to_string();
    let node = node.trim_end();
    let prefix = match depth {
        0 => String::new(),
        d => format!("{}->  ", " ".repeat(6 * (d - 1) + 2)),
    };
    out[at] = format!("{prefix}{node}  {}", own.annotation());
    Ok(own)
}

/// The query of `EXPLAIN query` when that is the whole statement and it asks for no
/// option (`ANALYZE`, `VERBOSE`, `(FORMAT ...)`): the statement this module answers.
pub fn plain_explain(sql: &str) -> Option<&str> {
    let t = sql.trim_start();
    let head = t.get(..7)?;
    if !head.eq_ignore_ascii_case("explain") {
        return None;
    }
    let rest = t[7..].trim_start();
    if rest.len() == t.len() - 7 {
        // `EXPLAINx`: no blank after the keyword.
        return None;
    }
    let word: String = rest
        .chars()
        .take_while(|c| c.is_ascii_alphabetic())
        .collect::<String>()
        .to_ascii_lowercase();
    matches!(word.as_str(), "select" | "with" | "values" | "table")
        .then_some(rest.trim_end().trim_end_matches(';'))
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::datatypes::Field;

    #[test]
    fn annotations_read_as_postgres_prints_them() {
        let e = Estimate {
            startup: 0.0,
            total: 25.875,
            rows: 423,
            width: 88,
        };
        assert_eq!(e.annotation(), "(cost=0.00..25.88 rows=423 width=88)");
        let re = regex_lite_cost(&e.annotation());
        assert_eq!(re, Some((0.0, 25.88)));
    }

    /// Superset's pattern, `cost=([\d\.]+)\.\.([\d\.]+)`, by hand.
    fn regex_lite_cost(line: &str) -> Option<(f64, f64)> {
        let rest = &line[line.find("cost=")? + 5..];
        let (a, rest) = rest.split_once("..")?;
        let b: String = rest
            .chars()
            .take_while(|c| c.is_ascii_digit() || *c == '.')
            .collect();
        Some((a.parse().ok()?, b.parse().ok()?))
    }

    #[test]
    fn a_scan_costs_its_pages_and_rows_and_a_blocking_node_starts_after_its_input() {
        // 100 rows in 3 pages' worth of bytes.
        let scan = estimate(Some(100), Some(20_000), 40, false, &[]);
        assert_eq!(scan.startup, 0.0);
        assert!((scan.total - (3.0 + 1.0)).abs() < 1e-9);
        let sort = estimate(Some(100), None, 40, true, &[scan]);
        assert_eq!(sort.startup, scan.total);
        assert!((sort.total - (scan.total + 1.0)).abs() < 1e-9);
        let filter = estimate(None, None, 40, false, &[sort]);
        assert_eq!(filter.rows, UNKNOWN_ROWS);
        assert_eq!(filter.startup, sort.startup);
    }

    #[test]
    fn widths_follow_postgres_type_sizes() {
        let schema = Schema::new(vec![
            Field::new("id", DataType::Int64, false),
            Field::new("name", DataType::Utf8, true),
            Field::new("ok", DataType::Boolean, true),
            Field::new("n", DataType::Int32, true),
        ]);
        assert_eq!(row_width(&schema), 8 + 32 + 1 + 4);
    }

    #[test]
    fn only_a_plain_explain_of_a_query_is_answered_here() {
        assert_eq!(plain_explain("EXPLAIN SELECT 1;"), Some("SELECT 1"));
        assert_eq!(
            plain_explain("  explain\n with a AS (SELECT 1) SELECT * FROM a"),
            Some("with a AS (SELECT 1) SELECT * FROM a")
        );
        assert_eq!(plain_explain("EXPLAIN ANALYZE SELECT 1"), None);
        assert_eq!(plain_explain("EXPLAIN VERBOSE SELECT 1"), None);
        assert_eq!(plain_explain("EXPLAIN (FORMAT JSON) SELECT 1"), None);
        assert_eq!(plain_explain("EXPLAIN CREATE SINK s AS SELECT 1"), None);
        assert_eq!(plain_explain("EXPLAINSELECT 1"), None);
        assert_eq!(plain_explain("SELECT 1"), None);
    }
}
