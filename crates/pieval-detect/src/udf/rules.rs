//! `pi_rule_hits(text)` and `pi_rule_spans(text)`: the injection-signal rules
//! (data/rules/injection.toml) that fire on a text, as ids or as located spans.

use std::sync::Arc;

use datafusion::arrow::array::{
    ArrayBuilder, Int64Builder, ListBuilder, StringBuilder, StructBuilder,
};
use datafusion::arrow::datatypes::{DataType, Field, Fields};
use datafusion::common::Result;
use datafusion::logical_expr::{ColumnarValue, ScalarFunctionArgs};

use super::{Kernel, finish, string_args};
use crate::rules::{RulePack, Span, SpanScratch};

pub(crate) struct RuleHits;
pub(crate) struct RuleSpans;

/// Fields of one `pi_rule_spans` element (the long form of findings).
pub fn span_fields() -> Fields {
    Fields::from(vec![
        Field::new("rule_id", DataType::Utf8, false),
        Field::new("severity", DataType::Utf8, false),
        Field::new("span_start", DataType::Int64, false),
        Field::new("span_end", DataType::Int64, false),
        Field::new("excerpt", DataType::Utf8, false),
    ])
}

fn ids_field() -> Field {
    Field::new_list_field(DataType::Utf8, true)
}

pub(crate) fn spans_field() -> Field {
    Field::new_list_field(DataType::Struct(span_fields()), true)
}

/// A column of `pi_rule_spans` lists, built row by row (`pi_rule_spans`, and `pi_detect`'s
/// `rule_spans` from the folding it already did).
pub(crate) struct SpanLists {
    out: ListBuilder<StructBuilder>,
    pack: &'static RulePack,
}

impl SpanLists {
    pub(crate) fn with_capacity(rows: usize) -> Self {
        let builders: Vec<Box<dyn ArrayBuilder>> = vec![
            Box::new(StringBuilder::new()),
            Box::new(StringBuilder::new()),
            Box::new(Int64Builder::new()),
            Box::new(Int64Builder::new()),
            Box::new(StringBuilder::new()),
        ];
        Self {
            out: ListBuilder::with_capacity(StructBuilder::new(span_fields(), builders), rows)
                .with_field(spans_field()),
            pack: RulePack::default_pack(),
        }
    }

    /// The spans of `text` (from [`RulePack::spans`] or [`RulePack::spans_folded`]).
    pub(crate) fn append(&mut self, text: &str, spans: &[Span]) {
        let item = self.out.values();
        for sp in spans {
            let rule = &self.pack.rules[sp.rule];
            item.field_builder::<StringBuilder>(0)
                .expect("Utf8")
                .append_value(&rule.id);
            item.field_builder::<StringBuilder>(1)
                .expect("Utf8")
                .append_value(&rule.severity);
            item.field_builder::<Int64Builder>(2)
                .expect("Int64")
                .append_value(sp.start as i64);
            item.field_builder::<Int64Builder>(3)
                .expect("Int64")
                .append_value(sp.end as i64);
            item.field_builder::<StringBuilder>(4)
                .expect("Utf8")
                .append_value(pieval_contract::text::excerpt(&text[sp.start..sp.end], 120));
            item.append(true);
        }
        self.out.append(true);
    }

    pub(crate) fn append_null(&mut self) {
        self.out.append(false);
    }

    pub(crate) fn finish(&mut self) -> datafusion::arrow::array::ListArray {
        self.out.finish()
    }
}

const ARGS: [(&str, &str); 1] = [("text", "A response, or untrusted input.")];

impl Kernel for RuleHits {
    fn name(&self) -> &'static str {
        "pi_rule_hits"
    }
    fn arity(&self) -> usize {
        1
    }
    fn return_type(&self) -> DataType {
        DataType::List(Arc::new(ids_field()))
    }
    fn invoke(&self, args: &ScalarFunctionArgs) -> Result<ColumnarValue> {
        let (inputs, n) = string_args::<1>(self.name(), args)?;
        let pack = RulePack::default_pack();
        let (mut folded, mut hits) = (String::new(), Vec::new());
        let mut out = ListBuilder::new(StringBuilder::new()).with_field(ids_field());
        for i in 0..n {
            match inputs[0].get(i) {
                Some(text) => {
                    crate::fold::fold_into(text, &mut folded);
                    pack.hits(text, &folded, &mut hits);
                    for h in &hits {
                        out.values().append_value(&pack.rules[*h].id);
                    }
                    out.append(true);
                }
                None => out.append(false),
            }
        }
        finish(Arc::new(out.finish()), inputs[0].is_scalar())
    }
    fn doc(&self) -> (&'static str, String, Vec<(&'static str, &'static str)>) {
        (
            "Ids of the injection-signal rules (data/rules/injection.toml) that fire on the text, in pack order.",
            format!("{}(text)", self.name()),
            ARGS.to_vec(),
        )
    }
}

impl Kernel for RuleSpans {
    fn name(&self) -> &'static str {
        "pi_rule_spans"
    }
    fn arity(&self) -> usize {
        1
    }
    fn return_type(&self) -> DataType {
        DataType::List(Arc::new(spans_field()))
    }
    fn invoke(&self, args: &ScalarFunctionArgs) -> Result<ColumnarValue> {
        let (inputs, n) = string_args::<1>(self.name(), args)?;
        let pack = RulePack::default_pack();
        let mut spans = Vec::<Span>::new();
        let mut scratch = SpanScratch::default();
        let mut out = SpanLists::with_capacity(n);
        for i in 0..n {
            match inputs[0].get(i) {
                Some(text) => {
                    pack.spans(text, &mut scratch, &mut spans);
                    out.append(text, &spans);
                }
                None => out.append_null(),
            }
        }
        finish(Arc::new(out.finish()), inputs[0].is_scalar())
    }
    fn doc(&self) -> (&'static str, String, Vec<(&'static str, &'static str)>) {
        (
            "Every injection-rule match as {rule_id, severity, span_start, span_end, excerpt}; spans are byte offsets of the original text.",
            format!("{}(text)", self.name()),
            ARGS.to_vec(),
        )
    }
}
