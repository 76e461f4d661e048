//! The judge in SQL.
//!
//! | function | returns |
//! |---|---|
//! | `pi_judge(question, response [, goal [, task]])` | a judgement: Struct{question, verdict, score, rationale, judge_model, error, cached}; with a list of questions, a list of judgements |
//! | `pi_judge_questions(success_criteria)` | List<Utf8>: the distinct judge questions of the criteria |
//! | `pi_judge_outcome(judgements)` | Struct{verdict, rationale, judge_model, error}: one judgement, or several combined |
//!
//! `pi_judge` is an async UDF (DataFusion's `AsyncScalarUDFImpl`): DataFusion hands it
//! whole batches, and it sends each batch's distinct inputs to the judge at once, with
//! the judge's bounded concurrency. DataFusion evaluates an async function on every row
//! of its batch (even inside `CASE`), so rows that need no judgement pass a null
//! question: a null question or response is a null judgement and costs nothing.

use std::sync::{Arc, OnceLock};

use async_trait::async_trait;
use datafusion::arrow::array::{
    Array, ArrayRef, AsArray, BooleanBuilder, Float64Builder, ListArray, ListBuilder,
    StringBuilder, StructArray,
};
use datafusion::arrow::buffer::{NullBuffer, OffsetBuffer};
use datafusion::arrow::datatypes::{DataType, Field, Fields};
use datafusion::common::{Result, ScalarValue, exec_err, plan_err};
use datafusion::logical_expr::async_udf::{AsyncScalarUDF, AsyncScalarUDFImpl};
use datafusion::logical_expr::{
    ColumnarValue, Documentation, ScalarFunctionArgs, ScalarUDF, ScalarUDFImpl, Signature,
    Volatility,
};
use datafusion::prelude::SessionContext;

use super::store::Record;
use super::{Inputs, Judge};
use crate::detect::criteria::Compiled;
use crate::detect::judgements::coerce_judgements;
use crate::detect::udf::{StrArg, coerce_strings, eq_by_name, finish, section};

/// Register the judge functions; `judge` is the configured judge, if any. Without one,
/// `pi_judge` answers null for null questions and is an error for any other.
pub fn register(ctx: &SessionContext, judge: Option<Arc<Judge>>) {
    ctx.register_udf(AsyncScalarUDF::new(Arc::new(JudgeUdf::new(judge))).into_scalar_udf());
    ctx.register_udf(ScalarUDF::from(QuestionsUdf::new()));
    ctx.register_udf(ScalarUDF::from(OutcomeUdf::new()));
}

/// The fields of one judgement.
pub fn judgement_fields() -> Fields {
    Fields::from(vec![
        Field::new("question", DataType::Utf8, true),
        Field::new("verdict", DataType::Boolean, true),
        Field::new("score", DataType::Float64, true),
        Field::new("rationale", DataType::Utf8, true),
        Field::new("judge_model", DataType::Utf8, true),
        Field::new("error", DataType::Utf8, true),
        Field::new("cached", DataType::Boolean, true),
    ])
}

fn judgement_type() -> DataType {
    DataType::Struct(judgement_fields())
}

fn judgement_list_type() -> DataType {
    DataType::List(Arc::new(Field::new_list_field(judgement_type(), true)))
}

/// The fields of `pi_judge_outcome`.
pub fn outcome_fields() -> Fields {
    Fields::from(vec![
        Field::new("verdict", DataType::Boolean, true),
        Field::new("rationale", DataType::Utf8, true),
        Field::new("judge_model", DataType::Utf8, true),
        Field::new("error", DataType::Utf8, true),
    ])
}

/// Builds judgement structs.
struct JudgementBuilder {
    question: StringBuilder,
    verdict: BooleanBuilder,
    score: Float64Builder,
    rationale: StringBuilder,
    model: StringBuilder,
    error: StringBuilder,
    cached: BooleanBuilder,
    valid: Vec<bool>,
}

impl JudgementBuilder {
    fn new(n: usize) -> Self {
        Self {
            question: StringBuilder::with_capacity(n, n * 32),
            verdict: BooleanBuilder::with_capacity(n),
            score: Float64Builder::with_capacity(n),
            rationale: StringBuilder::with_capacity(n, n * 32),
            model: StringBuilder::with_capacity(n, n * 8),
            error: StringBuilder::new(),
            cached: BooleanBuilder::with_capacity(n),
            valid: Vec::with_capacity(n),
        }
    }

    fn push(&mut self, j: Option<(&Record, bool)>) {
        match j {
            Some((r, cached)) => {
                self.question.append_value(&r.question);
                self.verdict.append_option(r.verdict);
                self.score.append_option(r.score);
                self.rationale.append_option(r.rationale.as_deref());
                self.model.append_value(&r.judge_model);
                self.error.append_option(r.error.as_deref());
                self.cached.append_value(cached);
                self.valid.push(true);
            }
            None => {
                self.question.append_null();
                self.verdict.append_null();
                self.score.append_null();
                self.rationale.append_null();
                self.model.append_null();
                self.error.append_null();
                self.cached.append_null();
                self.valid.push(false);
            }
        }
    }

    fn finish(mut self) -> Result<StructArray> {
        let columns: Vec<ArrayRef> = vec![
            Arc::new(self.question.finish()),
            Arc::new(self.verdict.finish()),
            Arc::new(self.score.finish()),
            Arc::new(self.rationale.finish()),
            Arc::new(self.model.finish()),
            Arc::new(self.error.finish()),
            Arc::new(self.cached.finish()),
        ];
        Ok(StructArray::try_new(
            judgement_fields(),
            columns,
            Some(NullBuffer::from(self.valid)),
        )?)
    }
}

/// `pi_judge`.
#[derive(Debug)]
pub struct JudgeUdf {
    judge: Option<Arc<Judge>>,
    signature: Signature,
}

impl PartialEq for JudgeUdf {
    fn eq(&self, other: &Self) -> bool {
        match (&self.judge, &other.judge) {
            (Some(a), Some(b)) => Arc::ptr_eq(a, b),
            (None, None) => true,
            _ => false,
        }
    }
}
impl Eq for JudgeUdf {}
impl std::hash::Hash for JudgeUdf {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        "pi_judge".hash(state);
        self.judge.as_ref().map(Arc::as_ptr).hash(state);
    }
}

impl std::fmt::Debug for Judge {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Judge")
            .field("model", &self.section.name)
            .field("rubric", &self.rubric)
            .finish()
    }
}

impl JudgeUdf {
    pub fn new(judge: Option<Arc<Judge>>) -> Self {
        // DataFusion's async wrapper does not pass `coerce_types` on, so the accepted
        // shapes are listed: a question or a list of them, then two to four strings.
        use datafusion::logical_expr::TypeSignature;
        let list = DataType::List(Arc::new(Field::new_list_field(DataType::Utf8, true)));
        let mut shapes = Vec::new();
        // The list shapes first: DataFusion tries the shapes in order and would otherwise
        // cast a list of questions to one string.
        for first in [list, DataType::Utf8] {
            for extra in 1..=3 {
                let mut types = vec![first.clone()];
                types.extend(std::iter::repeat_n(DataType::Utf8, extra));
                shapes.push(TypeSignature::Exact(types));
            }
        }
        Self {
            judge,
            signature: Signature::one_of(shapes, Volatility::Volatile),
        }
    }
}

impl ScalarUDFImpl for JudgeUdf {
    fn name(&self) -> &str {
        "pi_judge"
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, arg_types: &[DataType]) -> Result<DataType> {
        Ok(match arg_types.first() {
            Some(DataType::List(_) | DataType::LargeList(_) | DataType::ListView(_)) => {
                judgement_list_type()
            }
            _ => judgement_type(),
        })
    }

    fn invoke_with_args(&self, _args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        exec_err!("pi_judge is asynchronous and runs only inside a query plan")
    }

    fn documentation(&self) -> Option<&Documentation> {
        static DOC: OnceLock<Documentation> = OnceLock::new();
        Some(DOC.get_or_init(|| {
            Documentation::builder(
                section(),
                "The judge model's judgement of a response: {question, verdict, score, rationale, judge_model, error, cached}; verdict is null (with error) when the judge failed or its answer could not be read. With a list of questions, a list of judgements.",
                "pi_judge(question, response [, goal [, task]])",
            )
            .with_argument("question", "The judge question (or a list of them); null: no judgement.")
            .with_argument("response", "The model's response text.")
            .with_argument("goal", "Optional: the attacker's text (what the injection asked for).")
            .with_argument("task", "Optional: the benign task the user asked for.")
            .build()
        }))
    }
}

#[async_trait]
impl AsyncScalarUDFImpl for JudgeUdf {
    async fn invoke_async_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        let n = args.number_rows;
        // No question in the batch (scoring's usual batch: every row decided by the
        // rules, or no judge configured): nothing to ask and nothing to copy.
        if let ColumnarValue::Array(q) = &args.args[0] {
            if matches!(q.data_type(), DataType::List(_)) && q.null_count() == q.len() {
                return Ok(ColumnarValue::Array(
                    datafusion::arrow::array::new_null_array(&judgement_list_type(), n),
                ));
            }
        }
        let strings = args.args[1..]
            .iter()
            .map(|a| StrArg::new("pi_judge", a))
            .collect::<Result<Vec<_>>>()?;
        let text = |k: usize, i: usize| strings.get(k).and_then(|a| a.get(i));
        // The questions of each row: one (Utf8), or a list.
        let (list, questions): (bool, Vec<Vec<Option<String>>>) = match &args.args[0] {
            ColumnarValue::Array(a) if matches!(a.data_type(), DataType::List(_)) => {
                let l = a.as_list::<i32>();
                let rows = (0..n)
                    .map(|i| {
                        if l.is_null(i) {
                            return Ok(vec![None]);
                        }
                        let v = l.value(i);
                        let s = datafusion::arrow::compute::cast(&v, &DataType::Utf8)?;
                        let s = s.as_string::<i32>();
                        Ok((0..s.len())
                            .map(|j| (!s.is_null(j)).then(|| s.value(j).to_owned()))
                            .collect())
                    })
                    .collect::<Result<Vec<Vec<Option<String>>>>>()?;
                (true, rows)
            }
            ColumnarValue::Scalar(ScalarValue::List(l)) => {
                let a: ArrayRef = l.clone();
                let l = a.as_list::<i32>();
                let one: Vec<Option<String>> = if l.is_null(0) {
                    vec![None]
                } else {
                    let v = datafusion::arrow::compute::cast(&l.value(0), &DataType::Utf8)?;
                    let s = v.as_string::<i32>();
                    (0..s.len())
                        .map(|j| (!s.is_null(j)).then(|| s.value(j).to_owned()))
                        .collect()
                };
                (true, vec![one; n])
            }
            other => {
                let q = StrArg::new("pi_judge", other)?;
                (
                    false,
                    (0..n).map(|i| vec![q.get(i).map(str::to_owned)]).collect(),
                )
            }
        };
        // Every (row, question) to judge, in order.
        let mut wanted: Vec<(usize, usize)> = Vec::new();
        let mut inputs: Vec<Inputs> = Vec::new();
        for (i, qs) in questions.iter().enumerate() {
            let Some(response) = text(0, i) else { continue };
            for (j, q) in qs.iter().enumerate() {
                if let Some(q) = q {
                    wanted.push((i, j));
                    inputs.push(Inputs {
                        question: q.clone(),
                        response: response.to_owned(),
                        goal: text(1, i).map(str::to_owned),
                        task: text(2, i).map(str::to_owned),
                    });
                }
            }
        }
        let judged = if inputs.is_empty() {
            Vec::new()
        } else {
            match &self.judge {
                Some(judge) => judge.judge_all(inputs).await,
                None => {
                    return exec_err!(
                        "pi_judge: no judge is configured: give --judge FILE (a judge config), or set evaluation.judge in the experiment config"
                    );
                }
            }
        };
        let mut by_slot: ahash::AHashMap<(usize, usize), &(Arc<Record>, bool)> =
            ahash::AHashMap::with_capacity(judged.len());
        for (slot, j) in wanted.iter().zip(&judged) {
            by_slot.insert(*slot, j);
        }
        let get = |i: usize, j: usize| by_slot.get(&(i, j)).map(|(r, c)| (r.as_ref(), *c));
        let array: ArrayRef = if list {
            let mut items = JudgementBuilder::new(judged.len());
            let mut offsets = vec![0i32];
            let mut valid = Vec::with_capacity(n);
            for (i, qs) in questions.iter().enumerate() {
                let row_valid = text(0, i).is_some() && !(qs.len() == 1 && qs[0].is_none());
                if row_valid {
                    for (j, q) in qs.iter().enumerate() {
                        if q.is_some() {
                            items.push(get(i, j));
                        }
                    }
                }
                valid.push(row_valid);
                offsets.push(items.valid.len() as i32);
            }
            Arc::new(ListArray::try_new(
                Arc::new(Field::new_list_field(judgement_type(), true)),
                OffsetBuffer::new(offsets.into()),
                Arc::new(items.finish()?),
                Some(NullBuffer::from(valid)),
            )?)
        } else {
            let mut out = JudgementBuilder::new(n);
            for i in 0..n {
                out.push(get(i, 0));
            }
            Arc::new(out.finish()?)
        };
        Ok(ColumnarValue::Array(array))
    }
}

/// `pi_judge_questions(success_criteria)`.
#[derive(Debug)]
pub struct QuestionsUdf {
    signature: Signature,
}

eq_by_name!(QuestionsUdf);

impl QuestionsUdf {
    fn new() -> Self {
        Self {
            signature: Signature::user_defined(Volatility::Immutable),
        }
    }
}

impl ScalarUDFImpl for QuestionsUdf {
    fn name(&self) -> &str {
        "pi_judge_questions"
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn coerce_types(&self, arg_types: &[DataType]) -> Result<Vec<DataType>> {
        coerce_strings(self.name(), arg_types, 1)
    }

    fn return_type(&self, _arg_types: &[DataType]) -> Result<DataType> {
        Ok(DataType::List(Arc::new(Field::new_list_field(
            DataType::Utf8,
            true,
        ))))
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        let criteria = StrArg::new(self.name(), &args.args[0])?;
        let n = if criteria.is_scalar() {
            1
        } else {
            args.number_rows
        };
        let mut out = ListBuilder::new(StringBuilder::new());
        let mut compiled: ahash::AHashMap<&str, std::result::Result<Compiled, String>> =
            ahash::AHashMap::new();
        for i in 0..n {
            let Some(c) = criteria.get(i) else {
                out.append(false);
                continue;
            };
            let m = compiled.entry(c).or_insert_with(|| Compiled::from_text(c));
            match m {
                Ok(m) => {
                    for q in m.judge_questions() {
                        out.values().append_value(q);
                    }
                    out.append(true);
                }
                Err(e) => {
                    return exec_err!(
                        "pi_judge_questions: row {i}: success_criteria {:?} does not compile: {e}",
                        crate::text::excerpt(c, 80)
                    );
                }
            }
        }
        finish(Arc::new(out.finish()), criteria.is_scalar())
    }

    fn documentation(&self) -> Option<&Documentation> {
        static DOC: OnceLock<Documentation> = OnceLock::new();
        Some(DOC.get_or_init(|| {
            Documentation::builder(
                section(),
                "The distinct judge questions of success criteria (empty when no part needs a judge).",
                "pi_judge_questions(success_criteria)",
            )
            .with_argument("success_criteria", "The case's success_criteria.")
            .build()
        }))
    }
}

/// `pi_judge_outcome(judgements [, success_criteria])`: the judge's outcome on a row.
/// With the criteria, the judge parts are combined the way the criteria combine them
/// (`any` / `all`, three-valued, the rule parts left out): `any(judge a, judge b)` is
/// true when either judge said yes. Without them, one judgement is taken as it is and
/// several as a conjunction. Rationales and errors are numbered in question order.
#[derive(Debug)]
pub struct OutcomeUdf {
    signature: Signature,
}

eq_by_name!(OutcomeUdf);

impl OutcomeUdf {
    fn new() -> Self {
        Self {
            signature: Signature::user_defined(Volatility::Immutable),
        }
    }
}

/// One judgement's parts: question, verdict, rationale, model, error.
struct Parts<'a> {
    question: Option<&'a str>,
    verdict: Option<bool>,
    rationale: Option<&'a str>,
    model: Option<&'a str>,
    error: Option<&'a str>,
}

fn parts(s: &StructArray, i: usize) -> Parts<'_> {
    let text = |name: &str| {
        s.column_by_name(name)
            .and_then(|c| c.as_string_opt::<i32>())
            .filter(|c| !c.is_null(i))
            .map(|c| c.value(i))
    };
    let verdict = s
        .column_by_name("verdict")
        .and_then(|c| c.as_boolean_opt())
        .filter(|c| !c.is_null(i))
        .map(|c| c.value(i));
    Parts {
        question: text("question"),
        verdict,
        rationale: text("rationale"),
        model: text("judge_model"),
        error: text("error"),
    }
}

/// The outcome of a row's judgements: verdict, rationale, model, error.
type Combined = (Option<bool>, Option<String>, Option<String>, Option<String>);

fn combine(items: &[Parts<'_>], criteria: Option<&Compiled>) -> Combined {
    let verdict = match (items, criteria) {
        ([one], None) => one.verdict,
        (_, Some(c)) if !c.judge_questions().is_empty() => {
            let verdicts: Vec<(&str, Option<bool>)> = items
                .iter()
                .filter_map(|p| p.question.map(|q| (q, p.verdict)))
                .collect();
            c.judge_outcome(&verdicts)
        }
        _ => {
            if items.iter().any(|p| p.verdict == Some(false)) {
                Some(false)
            } else if items.iter().any(|p| p.verdict.is_none()) {
                None
            } else {
                Some(true)
            }
        }
    };
    if let [one] = items {
        return (
            verdict,
            one.rationale.map(str::to_owned),
            one.model.map(str::to_owned),
            one.error.map(str::to_owned),
        );
    }
    let numbered = |f: &dyn Fn(&Parts<'_>) -> Option<String>| {
        let v: Vec<String> = items
            .iter()
            .enumerate()
            .filter_map(|(k, p)| f(p).map(|t| format!("[{}] {t}", k + 1)))
            .collect();
        (!v.is_empty()).then(|| v.join(" "))
    };
    (
        verdict,
        numbered(&|p| p.rationale.map(str::to_owned)),
        items.iter().find_map(|p| p.model.map(str::to_owned)),
        numbered(&|p| p.error.map(str::to_owned)),
    )
}

impl ScalarUDFImpl for OutcomeUdf {
    fn name(&self) -> &str {
        "pi_judge_outcome"
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn coerce_types(&self, arg_types: &[DataType]) -> Result<Vec<DataType>> {
        match arg_types {
            [j] => Ok(vec![coerce_judgements(self.name(), j)?]),
            [j, c] => {
                let mut out = vec![coerce_judgements(self.name(), j)?];
                out.extend(coerce_strings(self.name(), std::slice::from_ref(c), 1)?);
                Ok(out)
            }
            _ => plan_err!(
                "pi_judge_outcome takes (judgements [, success_criteria]), got {} argument(s)",
                arg_types.len()
            ),
        }
    }

    fn return_type(&self, _arg_types: &[DataType]) -> Result<DataType> {
        Ok(DataType::Struct(outcome_fields()))
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        let scalar = args
            .args
            .iter()
            .all(|a| matches!(a, ColumnarValue::Scalar(_)));
        let n = if scalar { 1 } else { args.number_rows };
        let input = args.args[0].to_array(n)?;
        let criteria = args
            .args
            .get(1)
            .map(|c| StrArg::new(self.name(), c))
            .transpose()?;
        let mut compiled: ahash::AHashMap<&str, Option<Compiled>> = ahash::AHashMap::new();
        let mut verdict = BooleanBuilder::with_capacity(n);
        let (mut rationale, mut model, mut error) = (
            StringBuilder::new(),
            StringBuilder::new(),
            StringBuilder::new(),
        );
        let mut valid = Vec::with_capacity(n);
        for i in 0..n {
            let items: Option<Vec<Parts<'_>>> = match input.data_type() {
                DataType::Struct(_) => {
                    let s = input.as_struct();
                    s.is_valid(i).then(|| vec![parts(s, i)])
                }
                DataType::List(_) => {
                    let l = input.as_list::<i32>();
                    let items = l.values().as_struct();
                    let offsets = l.value_offsets();
                    l.is_valid(i).then(|| {
                        (offsets[i] as usize..offsets[i + 1] as usize)
                            .filter(|&j| items.is_valid(j))
                            .map(|j| parts(items, j))
                            .collect()
                    })
                }
                DataType::Null => None,
                other => return exec_err!("pi_judge_outcome: expected judgements, got {other}"),
            };
            let (v, r, m, e) = match items.filter(|i| !i.is_empty()) {
                Some(items) => {
                    valid.push(true);
                    // Criteria are compiled only for rows that were judged.
                    let c = criteria.as_ref().and_then(|c| c.get(i)).and_then(|text| {
                        compiled
                            .entry(text)
                            .or_insert_with(|| Compiled::from_text(text).ok())
                            .as_ref()
                    });
                    combine(&items, c)
                }
                None => {
                    valid.push(false);
                    (None, None, None, None)
                }
            };
            verdict.append_option(v);
            rationale.append_option(r);
            model.append_option(m);
            error.append_option(e);
        }
        let columns: Vec<ArrayRef> = vec![
            Arc::new(verdict.finish()),
            Arc::new(rationale.finish()),
            Arc::new(model.finish()),
            Arc::new(error.finish()),
        ];
        let out = StructArray::try_new(outcome_fields(), columns, Some(NullBuffer::from(valid)))?;
        finish(Arc::new(out), scalar)
    }

    fn documentation(&self) -> Option<&Documentation> {
        static DOC: OnceLock<Documentation> = OnceLock::new();
        Some(DOC.get_or_init(|| {
            Documentation::builder(
                section(),
                "The judge's outcome on a row {verdict, rationale, judge_model, error}: with the criteria, the judge parts combined as the criteria combine them; without, one judgement as it is, several as a conjunction.",
                "pi_judge_outcome(judgements [, success_criteria])",
            )
            .with_argument("judgements", "pi_judge's result (one judgement or a list).")
            .with_argument("success_criteria", "Optional: the case's success_criteria.")
            .build()
        }))
    }
}
