//! `pi_refusal(response)`: whether the response refuses (data/rules/refusal.toml).

use std::sync::Arc;

use datafusion::arrow::array::BooleanBuilder;
use datafusion::arrow::datatypes::DataType;
use datafusion::common::Result;
use datafusion::logical_expr::{ColumnarValue, ScalarFunctionArgs};

use super::{Kernel, finish, string_args};
use crate::detect::refusal::RefusalDetector;

pub(crate) struct Refusal;

impl Kernel for Refusal {
    fn name(&self) -> &'static str {
        "pi_refusal"
    }
    fn arity(&self) -> usize {
        1
    }
    fn return_type(&self) -> DataType {
        DataType::Boolean
    }
    fn invoke(&self, args: &ScalarFunctionArgs) -> Result<ColumnarValue> {
        let (inputs, n) = string_args::<1>(self.name(), args)?;
        let detector = RefusalDetector::default_pack();
        let mut folded = String::new();
        let mut out = BooleanBuilder::with_capacity(n);
        for i in 0..n {
            match inputs[0].get(i) {
                Some(text) => {
                    crate::detect::fold::fold_into(text, &mut folded);
                    out.append_value(detector.is_refusal_folded(&folded));
                }
                None => out.append_null(),
            }
        }
        finish(Arc::new(out.finish()), inputs[0].is_scalar())
    }
    fn doc(&self) -> (&'static str, String, Vec<(&'static str, &'static str)>) {
        (
            "Whether the response refuses (rule pack data/rules/refusal.toml, 10 languages); a refusal followed by compliance is not a refusal.",
            "pi_refusal(response)".into(),
            vec![("response", "The model's response text.")],
        )
    }
}
