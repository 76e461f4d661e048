//! `pi_wilson_low(k, n)` and `pi_wilson_high(k, n)`: the bounds of the Wilson 95% score
//! interval of k successes in n (Wilson 1927, "Probable inference, the law of succession,
//! and statistical inference"), computed by [`crate::stats::wilson`] — the one
//! implementation, used by `queries/summary.sql`, the controls and calibration alike.
//! NULL when n is 0 or either argument is NULL. Also `pi_sha256(text)` ([`register_sha256`]).

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
/// the digest `reviews.parquet` records of a response); NULL for NULL. Scoring computes it
/// only for the rows a reviewer's verdict names.
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
}
