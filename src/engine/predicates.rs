//! The row predicates every query shares, written once:
//!
//! - `pi_is_attack(label)`: a labelled attack — `label` is `attack`, or missing (a case
//!   without a label is an attack, docs/contract.md). Never NULL.
//! - `pi_is_baseline(attempt_id, attack_pipeline, attack_strategy)`: the case as the
//!   corpus has it — no attack section (`attempt_id` NULL), or the original attempt of
//!   one (`none` / `none`). The controls judge this attempt, so a run with converters or a
//!   strategy is gated on what it would have been gated on without them. Never NULL.
//! - `pi_review_reasons(review_reason)`: the stored reasons (comma-separated, as the
//!   contract writes them) as a list, each one of the contract's `ReviewReason`s; a query
//!   tests one with `array_has(pi_review_reasons(review_reason), 'echo')`, never by
//!   matching text. NULL for NULL; an unknown reason is an error naming it.
//!
//! Each takes Utf8 (other string types are cast) and returns Boolean.

use std::sync::Arc;

use datafusion::arrow::array::{Array, ArrayRef, AsArray, BooleanArray};
use datafusion::arrow::datatypes::DataType;
use datafusion::logical_expr::{ColumnarValue, Volatility, create_udf};
use datafusion::prelude::SessionContext;

/// Whether a row's label makes it a labelled attack.
pub fn is_attack(label: Option<&str>) -> bool {
    label.is_none_or(|l| l == "attack")
}

/// Whether a row is the baseline attempt of its case.
pub fn is_baseline(
    attempt_id: Option<&str>,
    pipeline: Option<&str>,
    strategy: Option<&str>,
) -> bool {
    attempt_id.is_none() || (pipeline == Some("none") && strategy == Some("none"))
}

/// Register `pi_is_attack`, `pi_is_baseline` and `pi_review_reasons`.
pub fn register(ctx: &SessionContext) {
    let reasons = |args: &[ColumnarValue]| -> datafusion::error::Result<ColumnarValue> {
        use datafusion::arrow::array::{ListBuilder, StringBuilder};
        let arrays = strings(args)?;
        let stored = arrays[0].as_string::<i32>();
        let mut out = ListBuilder::new(StringBuilder::new());
        for i in 0..stored.len() {
            if stored.is_null(i) {
                out.append_null();
                continue;
            }
            let listed = crate::contract::enums::ReviewReason::parse_list(stored.value(i))
                .map_err(|e| {
                    datafusion::error::DataFusionError::Execution(format!(
                        "pi_review_reasons: {}",
                        crate::text::escape_control(&e)
                    ))
                })?;
            for r in listed {
                out.values().append_value(r.as_str());
            }
            out.append(true);
        }
        columnar(args, Arc::new(out.finish()))
    };
    ctx.register_udf(create_udf(
        "pi_review_reasons",
        vec![DataType::Utf8],
        DataType::List(Arc::new(
            datafusion::arrow::datatypes::Field::new_list_field(DataType::Utf8, true),
        )),
        Volatility::Immutable,
        Arc::new(reasons),
    ));
    let attack = |args: &[ColumnarValue]| -> datafusion::error::Result<ColumnarValue> {
        let arrays = strings(args)?;
        let label = arrays[0].as_string::<i32>();
        let out: BooleanArray = (0..label.len())
            .map(|i| Some(is_attack(label.is_valid(i).then(|| label.value(i)))))
            .collect();
        columnar(args, Arc::new(out))
    };
    ctx.register_udf(create_udf(
        "pi_is_attack",
        vec![DataType::Utf8],
        DataType::Boolean,
        Volatility::Immutable,
        Arc::new(attack),
    ));
    let baseline = |args: &[ColumnarValue]| -> datafusion::error::Result<ColumnarValue> {
        let arrays = strings(args)?;
        let (a, p, s) = (
            arrays[0].as_string::<i32>(),
            arrays[1].as_string::<i32>(),
            arrays[2].as_string::<i32>(),
        );
        fn get(c: &datafusion::arrow::array::StringArray, i: usize) -> Option<&str> {
            c.is_valid(i).then(|| c.value(i))
        }
        let out: BooleanArray = (0..a.len())
            .map(|i| Some(is_baseline(get(a, i), get(p, i), get(s, i))))
            .collect();
        columnar(args, Arc::new(out))
    };
    ctx.register_udf(create_udf(
        "pi_is_baseline",
        vec![DataType::Utf8, DataType::Utf8, DataType::Utf8],
        DataType::Boolean,
        Volatility::Immutable,
        Arc::new(baseline),
    ));
}

/// The arguments as Utf8 arrays of one length.
fn strings(args: &[ColumnarValue]) -> datafusion::error::Result<Vec<ArrayRef>> {
    ColumnarValue::values_to_arrays(args)?
        .iter()
        .map(|a| datafusion::arrow::compute::cast(a, &DataType::Utf8).map_err(Into::into))
        .collect()
}

/// A scalar UDF's result: a scalar when every argument is one, else the array (pieval's
/// row functions here and in `wilson.rs`).
pub(crate) fn columnar(
    args: &[ColumnarValue],
    out: ArrayRef,
) -> datafusion::error::Result<ColumnarValue> {
    Ok(
        if args.iter().all(|a| matches!(a, ColumnarValue::Scalar(_))) {
            ColumnarValue::Scalar(datafusion::scalar::ScalarValue::try_from_array(&out, 0)?)
        } else {
            ColumnarValue::Array(out)
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_predicates_in_sql_are_the_rust_ones() {
        let ctx = SessionContext::new();
        register(&ctx);
        let rows = ctx
            .sql(
                "SELECT pi_is_attack(l) AS a, pi_is_baseline(i, p, s) AS b, \
                 array_has(pi_review_reasons(r), 'echo') AS e FROM (VALUES \
                 (NULL, NULL, NULL, NULL, 'judge,echo'), ('attack', 'c#none', 'none', 'none', NULL), \
                 ('benign', 'c#base64', 'base64', NULL, 'judge_error'), \
                 ('attack', 'c#pair', NULL, 'pair', 'echo')) AS t(l, i, p, s, r)",
            )
            .await
            .unwrap()
            .collect()
            .await
            .unwrap();
        let a = rows[0].column(0).as_boolean();
        let b = rows[0].column(1).as_boolean();
        let got: Vec<(bool, bool)> = (0..a.len()).map(|i| (a.value(i), b.value(i))).collect();
        assert_eq!(
            got,
            [(true, true), (true, true), (false, false), (true, false)]
        );
        assert!(a.null_count() == 0 && b.null_count() == 0);
        let e = rows[0].column(2).as_boolean();
        let echoes: Vec<Option<bool>> = (0..e.len())
            .map(|i| (!e.is_null(i)).then(|| e.value(i)))
            .collect();
        // judge_error is not echo: a list, not a text match
        assert_eq!(echoes, [Some(true), None, Some(false), Some(true)]);
        let bad = ctx
            .sql("SELECT pi_review_reasons('judge,bogus')")
            .await
            .unwrap()
            .collect()
            .await
            .unwrap_err()
            .to_string();
        assert!(bad.contains("\"bogus\" is not a review reason"), "{bad}");
    }
}
