//! `pi_injection_score(text[, role])`: pieval's injection model's score of a text (0..1;
//! higher: more likely an injection), in the role it is read in (`user_prompt`, the
//! default, `retrieved_document`, `tool_output`): crates/pieval-detect/src/model.rs.

use std::sync::Arc;

use datafusion::arrow::array::Float64Builder;
use datafusion::arrow::datatypes::DataType;
use datafusion::common::{Result, exec_err};
use datafusion::logical_expr::{ColumnarValue, ScalarFunctionArgs};

use super::{Kernel, coerce_strings_last_optional, finish, string_args_last_optional};
use crate::model::role_index;
use crate::rules::RulePack;

pub(crate) struct InjectionScore;

impl Kernel for InjectionScore {
    fn name(&self) -> &'static str {
        "pi_injection_score"
    }
    fn coerce(&self, arg_types: &[DataType]) -> Result<Vec<DataType>> {
        coerce_strings_last_optional(self.name(), arg_types, 2)
    }
    fn arity(&self) -> usize {
        2
    }
    fn return_type(&self) -> DataType {
        DataType::Float64
    }
    fn invoke(&self, args: &ScalarFunctionArgs) -> Result<ColumnarValue> {
        let (inputs, n) = string_args_last_optional::<2>(self.name(), args)?;
        let Some(model) = crate::packs::injection_model() else {
            return exec_err!("pi_injection_score: this build ships no injection model");
        };
        let pack = RulePack::default_pack();
        let (mut folded, mut hits) = (String::new(), Vec::new());
        let mut out = Float64Builder::with_capacity(n);
        for i in 0..n {
            match inputs[0].get(i) {
                Some(text) => {
                    crate::fold::fold_into(text, &mut folded);
                    pack.hits(text, &folded, &mut hits);
                    let role = role_index(inputs[1].get(i));
                    out.append_value(model.score_folded(&folded, role, &hits));
                }
                None => out.append_null(),
            }
        }
        let scalar = inputs.iter().all(|a| a.is_scalar());
        finish(Arc::new(out.finish()), scalar)
    }
    fn doc(&self) -> (&'static str, String, Vec<(&'static str, &'static str)>) {
        (
            "pieval's injection model's score of a text, 0 to 1 (higher: more likely an injection), in the role it is read in: a logistic regression over hashed n-grams, words, words in the role and the injection rules that fire (data/rules/injection-model.bin).",
            format!("{}(text[, role])", self.name()),
            vec![
                ("text", "A prompt, a document, a tool output."),
                (
                    "role",
                    "user_prompt (default), retrieved_document or tool_output.",
                ),
            ],
        )
    }
}
