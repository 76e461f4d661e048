//! `pi_wilson_low(k, n)` and `pi_wilson_high(k, n)`: the bounds of the Wilson 95% score
//! interval of k successes in n (Wilson 1927, "Probable inference, the law of succession,
//! and statistical inference"), computed by [`crate::stats::wilson`] — the one
//! implementation, used by `queries/summary.sql`, the controls and calibration alike.
//! NULL when n is 0 or either argument is NULL. Also `pi_sha256(text)` and
//! `pi_sha256_is(text, digest)` ([`register_sha256`]).

use std::sync::Arc;

use datafusion::arrow::array::{AsArray, Float64Array};
use datafusion::arrow::datatypes::{DataType, Int64Type};
use datafusion::logical_expr::{ColumnarValue, Volatility, create_udf};
use datafusion::prelude::SessionContext;

/// Register both bounds (arguments BIGINT; cast counts that are not).
pub fn register(ctx: &SessionContext) {
    for (name, high) in [("pi_wilson_low", false), ("pi_wilson_high", true)] {
        let f = move |args: &[ColumnarValue]| -> datafusion::error::Result<ColumnarValue> {
            let arrays = ColumnarValue::values_to_arrays(args)?;
            let (k, n) = (
                arrays[0].as_primitive::<Int64Type>(),
                arrays[1].as_primitive::<Int64Type>(),
            );
            let out: Float64Array = k
                .iter()
                .zip(n.iter())
                .map(|(k, n)| {
                    let (k, n) = (u64::try_from(k?).ok()?, u64::try_from(n?).ok()?);
                    crate::stats::wilson(k.min(n), n).map(|(lo, hi)| if high { hi } else { lo })
                })
                .collect();
            super::predicates::columnar(args, Arc::new(out))
        };
        ctx.register_udf(create_udf(
            name,
            vec![DataType::Int64, DataType::Int64],
            DataType::Float64,
            Volatility::Immutable,
            Arc::new(f),
        ));
    }
}

/// `pi_sha256(text)`: the hex sha256 of a text's UTF-8 bytes ([`crate::digest::sha256_hex`],
/// the digest `reviews.parquet` records of a response); NULL for NULL. Scoring asks
/// `pi_sha256_is` (below) instead, which hashes only the rows that carry a digest.
pub fn register_sha256(ctx: &SessionContext) {
    use datafusion::arrow::array::StringArray;
    let f = |args: &[ColumnarValue]| -> datafusion::error::Result<ColumnarValue> {
        let arrays = ColumnarValue::values_to_arrays(args)?;
        let a = datafusion::arrow::compute::cast(&arrays[0], &DataType::Utf8)?;
        let out: StringArray = a
            .as_string::<i32>()
            .iter()
            .map(|t| t.map(|t| crate::digest::sha256_hex(t.as_bytes())))
            .collect();
        super::predicates::columnar(args, Arc::new(out))
    };
    ctx.register_udf(create_udf(
        "pi_sha256",
        vec![DataType::Utf8],
        DataType::Utf8,
        Volatility::Immutable,
        Arc::new(f),
    ));
    // pi_sha256_is(text, digest): whether the text's pi_sha256 is `digest` (as pi_sha256
    // writes it: lower-case hex); NULL where either is NULL. Only the rows with a digest
    // are hashed, however the optimizer rewrites the expression around it: scoring asks
    // it of every prediction, and a review names few (`pi_sha256(text) = digest` inside
    // a CASE was flattened into ORs and hashed every response, 2.5% of scoring's CPU).
    let is = |args: &[ColumnarValue]| -> datafusion::error::Result<ColumnarValue> {
        use datafusion::arrow::array::BooleanArray;
        let arrays = ColumnarValue::values_to_arrays(args)?;
        let text = datafusion::arrow::compute::cast(&arrays[0], &DataType::Utf8)?;
        let digest = datafusion::arrow::compute::cast(&arrays[1], &DataType::Utf8)?;
        let out: BooleanArray = text
            .as_string::<i32>()
            .iter()
            .zip(digest.as_string::<i32>().iter())
            .map(|(t, d)| {
                let (t, d) = (t?, d?);
                Some(crate::digest::sha256_hex(t.as_bytes()) == d)
            })
            .collect();
        super::predicates::columnar(args, Arc::new(out))
    };
    ctx.register_udf(create_udf(
        "pi_sha256_is",
        vec![DataType::Utf8, DataType::Utf8],
        DataType::Boolean,
        Volatility::Immutable,
        Arc::new(is),
    ));
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::array::Array;

    #[tokio::test]
    async fn a_digest_matches_the_text_it_was_taken_of_and_no_digest_is_null() {
        let ctx = SessionContext::new();
        register_sha256(&ctx);
        let hello = crate::digest::sha256_hex(b"hello");
        let rows = ctx
            .sql(&format!(
                "SELECT pi_sha256_is(t, d) AS m, pi_sha256(t) = d AS eq FROM (VALUES \
                 ('hello', '{hello}'), ('hello!', '{hello}'), ('hello', NULL), \
                 (NULL, '{hello}'), ('hello', '{}')) AS v(t, d)",
                hello.to_uppercase()
            ))
            .await
            .unwrap()
            .collect()
            .await
            .unwrap();
        let (m, eq) = (
            rows[0].column(0).as_boolean(),
            rows[0].column(1).as_boolean(),
        );
        let got: Vec<Option<bool>> = (0..m.len())
            .map(|i| (!m.is_null(i)).then(|| m.value(i)))
            .collect();
        let want: Vec<Option<bool>> = (0..eq.len())
            .map(|i| (!eq.is_null(i)).then(|| eq.value(i)))
            .collect();
        // the same as comparing pi_sha256, case and NULLs alike
        assert_eq!(got, vec![Some(true), Some(false), None, None, Some(false)]);
        assert_eq!(got, want);
    }
}
