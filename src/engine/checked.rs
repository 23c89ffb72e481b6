//! Numbers are right or the statement fails: PostgreSQL's arithmetic, which Spark 4's ANSI
//! mode shares, over DataFusion's plans.
//!
//! DataFusion's integer `+`, `-`, `*` and unary minus wrap on overflow, its `sum` of
//! integers wraps, and its float division by zero gives `inf` or `NaN`. The analyzer rule
//! [`CheckedArithmetic`], added to every context Tidemark plans in (the clients' session and
//! each streaming plan's), rewrites them into checked forms after type coercion:
//!
//! - integer `+ - * / %` and unary `-` become `checked_*` functions: 22003 `bigint out of
//!   range` (or `integer`, `smallint`) on overflow, 22012 `division by zero`;
//! - float `/` and `%` become `checked_divide`/`checked_modulo`: 22012 when a non-null value
//!   is divided by zero (`0.0 / 0` included), as PostgreSQL does;
//! - `sum` of integers becomes [`CheckedSum`] (named `sum`, result `bigint` as in Spark):
//!   22003 on overflow, never a wrapped total.
//!
//! The rewritten expressions keep the names DataFusion gives the originals (`a + b`,
//! `sum(x)`), so result columns and a sink's columns are named as before. `abs` of the
//! smallest integer and casts to a narrower integer already fail in DataFusion; `wording`
//! gives them Postgres's words.

use std::any::Any;
use std::sync::Arc;

use datafusion::arrow::array::{Array, ArrayRef, AsArray, BooleanArray, Int64Array};
use datafusion::arrow::compute::kernels::numeric;
use datafusion::arrow::datatypes::{
    DataType, Field, FieldRef, Float32Type, Float64Type, Int64Type,
};
use datafusion::arrow::error::ArrowError;
use datafusion::common::config::ConfigOptions;
use datafusion::common::tree_node::{Transformed, TreeNode};
use datafusion::common::{DFSchema, Result, ScalarValue};
use datafusion::error::DataFusionError;
use datafusion::logical_expr::expr::{AggregateFunction, ScalarFunction};
use datafusion::logical_expr::expr_rewriter::NamePreserver;
use datafusion::logical_expr::function::{AccumulatorArgs, StateFieldsArgs};
use datafusion::logical_expr::utils::merge_schema;
use datafusion::logical_expr::{
    Accumulator, AggregateUDF, AggregateUDFImpl, BinaryExpr, ColumnarValue, EmitTo, Expr,
    ExprSchemable, GroupsAccumulator, LogicalPlan, Operator, ScalarFunctionArgs, ScalarUDF,
    ScalarUDFImpl, Signature, Volatility,
};
use datafusion::optimizer::AnalyzerRule;

use crate::error::{Error, SqlState};

/// The analyzer rule: see the module's documentation.
#[derive(Debug, Default)]
pub struct CheckedArithmetic;

impl AnalyzerRule for CheckedArithmetic {
    fn name(&self) -> &str {
        "tidemark_checked_arithmetic"
    }

    fn analyze(&self, plan: LogicalPlan, _config: &ConfigOptions) -> Result<LogicalPlan> {
        plan.transform_up_with_subqueries(|node| {
            let schema = match node.inputs().as_slice() {
                [] => node.schema().as_ref().clone(),
                inputs => merge_schema(inputs),
            };
            let names = NamePreserver::new(&node);
            node.map_expressions(|e| {
                let saved = names.save(&e);
                let out = e.transform_up(|e| rewrite(e, &schema))?;
                Ok(if out.transformed {
                    out.update_data(|e| saved.restore(e))
                } else {
                    out
                })
            })
        })
        .map(|t| t.data)
    }
}

/// `e` with its arithmetic checked, under its original name (a streaming aggregation's
/// grouping expressions, which its operator evaluates itself).
pub fn check_expr(e: Expr, schema: &DFSchema) -> Result<Expr> {
    let saved = NamePreserver::new_for_projection().save(&e);
    Ok(saved.restore(e.transform_up(|e| rewrite(e, schema))?.data))
}

/// An aggregate expression as the analyzer would leave it: its arguments coerced to the
/// types its function takes (`avg` of a `bigint` reads it as a double) and its arithmetic
/// and integer sums checked, under its original name. For a streaming aggregation, whose
/// operator takes its aggregates from the plan before the analyzer runs.
pub fn analyze_aggregate_expr(e: Expr, schema: &DFSchema) -> Result<Expr> {
    use datafusion::optimizer::analyzer::type_coercion::TypeCoercionRewriter;
    let saved = NamePreserver::new_for_projection().save(&e);
    let mut coercion = TypeCoercionRewriter::new(schema);
    let coerced = e.rewrite(&mut coercion)?.data;
    let checked = coerced.transform_up(|e| rewrite(e, schema))?.data;
    Ok(saved.restore(checked))
}

fn is_integer(t: &DataType) -> bool {
    t.is_integer()
}

/// Integer types whose sum is a `bigint` (Spark's `sum` of `tinyint` … `bigint`).
fn sums_to_bigint(t: &DataType) -> bool {
    matches!(
        t,
        DataType::Int8
            | DataType::Int16
            | DataType::Int32
            | DataType::Int64
            | DataType::UInt8
            | DataType::UInt16
            | DataType::UInt32
    )
}

fn is_float(t: &DataType) -> bool {
    matches!(t, DataType::Float32 | DataType::Float64)
}

/// One expression, its children already rewritten.
fn rewrite(e: Expr, schema: &DFSchema) -> Result<Transformed<Expr>> {
    match &e {
        Expr::BinaryExpr(BinaryExpr { left, op, right }) => {
            let (Ok(lt), Ok(rt)) = (left.get_type(schema), right.get_type(schema)) else {
                return Ok(Transformed::no(e));
            };
            if lt != rt {
                return Ok(Transformed::no(e));
            }
            let checked = match op {
                Operator::Plus | Operator::Minus | Operator::Multiply if is_integer(&lt) => true,
                Operator::Divide | Operator::Modulo if is_integer(&lt) || is_float(&lt) => true,
                _ => false,
            };
            if !checked {
                return Ok(Transformed::no(e));
            }
            let Expr::BinaryExpr(BinaryExpr { left, op, right }) = e else {
                unreachable!("matched above")
            };
            Ok(Transformed::yes(Expr::ScalarFunction(
                ScalarFunction::new_udf(
                    Arc::new(ScalarUDF::from(CheckedOp::new(op))),
                    vec![*left, *right],
                ),
            )))
        }
        Expr::Negative(inner) => match inner.get_type(schema) {
            Ok(t) if is_integer(&t) => {
                let Expr::Negative(inner) = e else {
                    unreachable!("matched above")
                };
                Ok(Transformed::yes(Expr::ScalarFunction(
                    ScalarFunction::new_udf(
                        Arc::new(ScalarUDF::from(CheckedNegate::default())),
                        vec![*inner],
                    ),
                )))
            }
            _ => Ok(Transformed::no(e)),
        },
        Expr::AggregateFunction(f)
            if f.func.name() == "sum"
                && (f.func.inner().as_ref() as &dyn Any)
                    .downcast_ref::<CheckedSum>()
                    .is_none()
                && !f.params.distinct
                && f.params.args.len() == 1
                && f.params.args[0]
                    .get_type(schema)
                    .is_ok_and(|t| sums_to_bigint(&t)) =>
        {
            let Expr::AggregateFunction(f) = e else {
                unreachable!("matched above")
            };
            Ok(Transformed::yes(Expr::AggregateFunction(
                AggregateFunction {
                    func: Arc::new(AggregateUDF::from(CheckedSum::new())),
                    params: f.params,
                },
            )))
        }
        _ => Ok(Transformed::no(e)),
    }
}

/// Postgres's name for an integer type, as its overflow errors say it.
fn type_words(t: &DataType) -> &'static str {
    match t {
        DataType::Int8 | DataType::Int16 | DataType::UInt8 => "smallint",
        DataType::Int32 | DataType::UInt16 => "integer",
        DataType::Int64 | DataType::UInt32 => "bigint",
        _ => "numeric",
    }
}

/// A computed value out of its type's range (22003).
fn out_of_range(t: &DataType) -> DataFusionError {
    DataFusionError::External(Box::new(Error::DataException {
        state: SqlState::NumericValueOutOfRange,
        message: format!("{} out of range", type_words(t)),
    }))
}

fn division_by_zero() -> DataFusionError {
    DataFusionError::External(Box::new(Error::DataException {
        state: SqlState::DivisionByZero,
        message: "division by zero".into(),
    }))
}

/// Arrow's checked kernels' errors in Postgres's words.
fn arrow_error(e: ArrowError, t: &DataType) -> DataFusionError {
    match e {
        ArrowError::ArithmeticOverflow(_) => out_of_range(t),
        ArrowError::DivideByZero => division_by_zero(),
        other => DataFusionError::ArrowError(Box::new(other), None),
    }
}

/// The rows where a non-null dividend meets a zero divisor, for floats (whose kernels
/// answer `inf` or `NaN` instead of failing).
fn any_float_zero_division(l: &ArrayRef, r: &ArrayRef) -> bool {
    let zero_at = |i: usize| match r.data_type() {
        DataType::Float64 => r.as_primitive::<Float64Type>().value(i) == 0.0,
        DataType::Float32 => r.as_primitive::<Float32Type>().value(i) == 0.0,
        _ => false,
    };
    (0..r.len()).any(|i| r.is_valid(i) && l.is_valid(i) && zero_at(i))
}

/// Both arguments as arrays of one length, and whether both were scalars.
fn arrays(args: &[ColumnarValue], rows: usize) -> Result<(Vec<ArrayRef>, bool)> {
    let scalar = args.iter().all(|a| matches!(a, ColumnarValue::Scalar(_)));
    let n = if scalar { 1 } else { rows };
    let arrays = args
        .iter()
        .map(|a| a.to_array(n))
        .collect::<Result<Vec<_>>>()?;
    Ok((arrays, scalar))
}

fn result(array: ArrayRef, scalar: bool) -> Result<ColumnarValue> {
    if scalar {
        Ok(ColumnarValue::Scalar(ScalarValue::try_from_array(
            &array, 0,
        )?))
    } else {
        Ok(ColumnarValue::Array(array))
    }
}

/// `a + b`, `a - b`, `a * b`, `a / b`, `a % b` that fail instead of wrapping.
#[derive(Debug, PartialEq, Eq, Hash)]
pub struct CheckedOp {
    op: Operator,
    signature: Signature,
}

impl CheckedOp {
    fn new(op: Operator) -> CheckedOp {
        CheckedOp {
            op,
            signature: Signature::any(2, Volatility::Immutable),
        }
    }
}

impl ScalarUDFImpl for CheckedOp {
    fn name(&self) -> &str {
        match self.op {
            Operator::Plus => "checked_add",
            Operator::Minus => "checked_subtract",
            Operator::Multiply => "checked_multiply",
            Operator::Divide => "checked_divide",
            _ => "checked_modulo",
        }
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, args: &[DataType]) -> Result<DataType> {
        Ok(args[0].clone())
    }

    /// Named as the operator it replaces: `a + b`.
    fn schema_name(&self, args: &[Expr]) -> Result<String> {
        Ok(format!(
            "{} {} {}",
            args[0].schema_name(),
            self.op,
            args[1].schema_name()
        ))
    }

    fn display_name(&self, args: &[Expr]) -> Result<String> {
        self.schema_name(args)
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        let (a, scalar) = arrays(&args.args, args.number_rows)?;
        let t = a[0].data_type().clone();
        if matches!(self.op, Operator::Divide | Operator::Modulo)
            && is_float(&t)
            && any_float_zero_division(&a[0], &a[1])
        {
            return Err(division_by_zero());
        }
        let kernel = match self.op {
            Operator::Plus => numeric::add,
            Operator::Minus => numeric::sub,
            Operator::Multiply => numeric::mul,
            Operator::Divide => numeric::div,
            _ => numeric::rem,
        };
        let out = kernel(&a[0], &a[1]).map_err(|e| arrow_error(e, &t))?;
        result(out, scalar)
    }
}

/// Unary `-` that fails on the smallest integer.
#[derive(Debug, PartialEq, Eq, Hash)]
pub struct CheckedNegate {
    signature: Signature,
}

impl Default for CheckedNegate {
    fn default() -> Self {
        CheckedNegate {
            signature: Signature::any(1, Volatility::Immutable),
        }
    }
}

impl ScalarUDFImpl for CheckedNegate {
    fn name(&self) -> &str {
        "checked_negate"
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, args: &[DataType]) -> Result<DataType> {
        Ok(args[0].clone())
    }

    /// Named as the operator it replaces: `(- a)`.
    fn schema_name(&self, args: &[Expr]) -> Result<String> {
        Ok(format!("(- {})", args[0].schema_name()))
    }

    fn display_name(&self, args: &[Expr]) -> Result<String> {
        self.schema_name(args)
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        let (a, scalar) = arrays(&args.args, args.number_rows)?;
        let t = a[0].data_type().clone();
        let out = numeric::neg(&a[0]).map_err(|e| arrow_error(e, &t))?;
        result(out, scalar)
    }
}

/// `sum` of `bigint` that fails with 22003 instead of wrapping (Spark's ANSI `sum`; its
/// result stays `bigint`, where PostgreSQL would widen to `numeric`). Every other `sum`
/// is DataFusion's.
#[derive(Debug, PartialEq, Eq, Hash)]
pub struct CheckedSum {
    signature: Signature,
}

impl CheckedSum {
    pub fn new() -> CheckedSum {
        CheckedSum {
            signature: Signature::user_defined(Volatility::Immutable),
        }
    }
}

impl Default for CheckedSum {
    fn default() -> Self {
        Self::new()
    }
}

impl AggregateUDFImpl for CheckedSum {
    /// `sum`, so that plans and result columns are named as with DataFusion's.
    fn name(&self) -> &str {
        "sum"
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, _args: &[DataType]) -> Result<DataType> {
        Ok(DataType::Int64)
    }

    /// Every integer type up to `bigint` is summed as `bigint`.
    fn coerce_types(&self, args: &[DataType]) -> Result<Vec<DataType>> {
        match args {
            [t] if sums_to_bigint(t) || t.is_null() => Ok(vec![DataType::Int64]),
            _ => datafusion::common::plan_err!("checked sum takes one integer argument"),
        }
    }

    fn accumulator(&self, _args: AccumulatorArgs) -> Result<Box<dyn Accumulator>> {
        Ok(Box::new(SumAccumulator::default()))
    }

    fn state_fields(&self, args: StateFieldsArgs) -> Result<Vec<FieldRef>> {
        Ok(vec![Arc::new(Field::new(
            datafusion::logical_expr::utils::format_state_name(args.name, "sum"),
            DataType::Int64,
            true,
        ))])
    }

    fn groups_accumulator_supported(&self, _args: AccumulatorArgs) -> bool {
        true
    }

    fn create_groups_accumulator(
        &self,
        _args: AccumulatorArgs,
    ) -> Result<Box<dyn GroupsAccumulator>> {
        Ok(Box::new(SumGroups::default()))
    }
}

/// One group's sum.
#[derive(Debug, Default)]
struct SumAccumulator {
    sum: Option<i64>,
}

impl SumAccumulator {
    fn add(&mut self, values: &Int64Array) -> Result<()> {
        for v in values.iter().flatten() {
            self.sum = Some(
                self.sum
                    .unwrap_or(0)
                    .checked_add(v)
                    .ok_or_else(|| out_of_range(&DataType::Int64))?,
            );
        }
        Ok(())
    }
}

impl Accumulator for SumAccumulator {
    fn update_batch(&mut self, values: &[ArrayRef]) -> Result<()> {
        self.add(values[0].as_primitive::<Int64Type>())
    }

    fn merge_batch(&mut self, states: &[ArrayRef]) -> Result<()> {
        self.add(states[0].as_primitive::<Int64Type>())
    }

    fn state(&mut self) -> Result<Vec<ScalarValue>> {
        Ok(vec![ScalarValue::Int64(self.sum)])
    }

    fn evaluate(&mut self) -> Result<ScalarValue> {
        Ok(ScalarValue::Int64(self.sum))
    }

    fn size(&self) -> usize {
        std::mem::size_of_val(self)
    }
}

/// Many groups' sums: a total and whether the group has seen a non-null value.
#[derive(Debug, Default)]
struct SumGroups {
    sums: Vec<i64>,
    seen: Vec<bool>,
}

impl SumGroups {
    fn add(
        &mut self,
        values: &Int64Array,
        groups: &[usize],
        filter: Option<&BooleanArray>,
        total: usize,
    ) -> Result<()> {
        self.sums.resize(total, 0);
        self.seen.resize(total, false);
        for (i, &g) in groups.iter().enumerate() {
            if values.is_null(i) || filter.is_some_and(|f| !f.is_valid(i) || !f.value(i)) {
                continue;
            }
            self.sums[g] = self.sums[g]
                .checked_add(values.value(i))
                .ok_or_else(|| out_of_range(&DataType::Int64))?;
            self.seen[g] = true;
        }
        Ok(())
    }

    fn take(&mut self, emit_to: EmitTo) -> ArrayRef {
        let sums = emit_to.take_needed(&mut self.sums);
        let seen = emit_to.take_needed(&mut self.seen);
        Arc::new(
            sums.into_iter()
                .zip(seen)
                .map(|(s, seen)| seen.then_some(s))
                .collect::<Int64Array>(),
        )
    }
}

impl GroupsAccumulator for SumGroups {
    fn update_batch(
        &mut self,
        values: &[ArrayRef],
        group_indices: &[usize],
        opt_filter: Option<&BooleanArray>,
        total_num_groups: usize,
    ) -> Result<()> {
        self.add(
            values[0].as_primitive::<Int64Type>(),
            group_indices,
            opt_filter,
            total_num_groups,
        )
    }

    fn evaluate(&mut self, emit_to: EmitTo) -> Result<ArrayRef> {
        Ok(self.take(emit_to))
    }

    fn state(&mut self, emit_to: EmitTo) -> Result<Vec<ArrayRef>> {
        Ok(vec![self.take(emit_to)])
    }

    fn merge_batch(
        &mut self,
        values: &[ArrayRef],
        group_indices: &[usize],
        total_num_groups: usize,
    ) -> Result<()> {
        self.add(
            values[0].as_primitive::<Int64Type>(),
            group_indices,
            None,
            total_num_groups,
        )
    }

    /// Each row its own group: the values themselves (a filtered-out row is NULL).
    fn convert_to_state(
        &self,
        values: &[ArrayRef],
        opt_filter: Option<&BooleanArray>,
    ) -> Result<Vec<ArrayRef>> {
        let v = values[0].as_primitive::<Int64Type>();
        Ok(vec![match opt_filter {
            None => Arc::new(v.clone()),
            Some(f) => Arc::new(
                (0..v.len())
                    .map(|i| (f.is_valid(i) && f.value(i) && v.is_valid(i)).then(|| v.value(i)))
                    .collect::<Int64Array>(),
            ),
        }])
    }

    fn size(&self) -> usize {
        self.sums.capacity() * 8 + self.seen.capacity()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::prelude::SessionContext;

    async fn run(sql: &str) -> std::result::Result<Vec<String>, crate::error::Worded> {
        let ctx = SessionContext::new();
        ctx.add_analyzer_rule(Arc::new(CheckedArithmetic));
        let out = async {
            let df = ctx.sql(sql).await?;
            df.collect().await
        }
        .await
        .map_err(|e| crate::error::postgres_error(&e))?;
        let text = datafusion::arrow::util::pretty::pretty_format_batches(&out)
            .unwrap()
            .to_string();
        Ok(text.lines().map(str::to_string).collect())
    }

    fn code(r: std::result::Result<Vec<String>, crate::error::Worded>) -> String {
        match r {
            Ok(rows) => panic!("expected an error, got {rows:?}"),
            Err(w) => format!("{} {}", w.state.code(), w.message),
        }
    }

    #[tokio::test]
    async fn integer_overflow_fails_with_22003() {
        for sql in [
            "SELECT 9223372036854775807 + 1",
            "SELECT -9223372036854775807 - 2",
            "SELECT 4611686018427387904 * 2",
            "SELECT -x FROM (VALUES (-9223372036854775807 - 1)) AS t(x)",
            "SELECT x / -1 FROM (VALUES (-9223372036854775807 - 1)) AS t(x)",
        ] {
            assert_eq!(code(run(sql).await), "22003 bigint out of range", "{sql}");
        }
        assert_eq!(
            code(run("SELECT CAST(2147483647 AS INT) + CAST(1 AS INT)").await),
            "22003 integer out of range"
        );
    }

    #[tokio::test]
    async fn division_by_zero_fails_with_22012() {
        for sql in [
            "SELECT 1 / 0",
            "SELECT 1 % 0",
            "SELECT 1.0 / 0",
            "SELECT 0.0 / 0",
            "SELECT CAST(1 AS DOUBLE) / x FROM (VALUES (0.0), (2.0)) AS t(x)",
        ] {
            assert_eq!(code(run(sql).await), "22012 division by zero", "{sql}");
        }
        // A NULL on either side is NULL, as in Postgres.
        let ok = run("SELECT CAST(NULL AS DOUBLE) / 0.0, 1.0 / CAST(NULL AS DOUBLE)")
            .await
            .unwrap();
        assert!(ok.iter().any(|l| l.contains("|  ")), "{ok:?}");
    }

    #[tokio::test]
    async fn sums_of_bigints_fail_instead_of_wrapping() {
        let sql = "SELECT sum(x) FROM (VALUES (9223372036854775807), (1)) AS t(x)";
        assert_eq!(code(run(sql).await), "22003 bigint out of range");
        let grouped = "SELECT g, sum(x) FROM (VALUES (1, 9223372036854775807), (1, 1), (2, 5)) \
                       AS t(g, x) GROUP BY g";
        assert_eq!(code(run(grouped).await), "22003 bigint out of range");
        // In range, the same answers and names as DataFusion's own.
        let rows =
            run("SELECT sum(x), x + 1 FROM (VALUES (1), (2)) AS t(x) GROUP BY x + 1 ORDER BY 2")
                .await
                .unwrap();
        assert!(
            rows[1].contains("sum(t.x)") && rows[1].contains("t.x + Int64(1)"),
            "{rows:?}"
        );
        assert!(
            rows[3].contains("| 1 ") && rows[3].contains("| 2 "),
            "{rows:?}"
        );
    }
}
