//! Reading the judge's judgements where the detectors use them: the third argument of
//! `pi_criteria_match` / `pi_matched_rule` (and the first of `pi_judge_outcome`) — one
//! judgement (a struct with at least `question` and `verdict`) or a list of them, as
//! `pi_judge` returns them.

use std::sync::Arc;

use datafusion::arrow::array::{Array, AsArray, ListArray, StructArray};
use datafusion::arrow::datatypes::{DataType, Field, Fields};
use datafusion::common::{Result, exec_err, plan_err};
use datafusion::logical_expr::ColumnarValue;

/// The type a null judgements argument is read as: a list of judgements.
fn null_judgements() -> DataType {
    DataType::List(Arc::new(Field::new_list_field(
        DataType::Struct(Fields::from(vec![
            Field::new("question", DataType::Utf8, true),
            Field::new("verdict", DataType::Boolean, true),
        ])),
        true,
    )))
}

/// Judgements accepted by the functions that read them: one, or a list.
pub fn coerce_judgements(func: &str, t: &DataType) -> Result<DataType> {
    let has_verdicts = |f: &Fields| {
        f.iter().any(|x| x.name() == "question") && f.iter().any(|x| x.name() == "verdict")
    };
    match t {
        DataType::Null => Ok(null_judgements()),
        DataType::Struct(f) if has_verdicts(f) => Ok(t.clone()),
        DataType::List(item) | DataType::LargeList(item) | DataType::ListView(item) if matches!(item.data_type(), DataType::Struct(f) if has_verdicts(f)) => {
            Ok(DataType::List(Arc::clone(item)))
        }
        other => plan_err!("{func}: expected judgements (pi_judge's result), got {other}"),
    }
}

/// Judgements read row by row: `(question, verdict)` pairs. A scalar (a constant, a
/// typed null) holds the same judgements for every row.
pub enum Judgements {
    Scalar(Vec<(String, Option<bool>)>),
    One(StructArray),
    Many(ListArray),
}

fn question_verdict(s: &StructArray, i: usize) -> (Option<&str>, Option<bool>) {
    let q = s
        .column_by_name("question")
        .and_then(|c| c.as_string_opt::<i32>())
        .filter(|q| !q.is_null(i))
        .map(|q| q.value(i));
    let v = s
        .column_by_name("verdict")
        .and_then(|c| c.as_boolean_opt())
        .filter(|v| !v.is_null(i))
        .map(|v| v.value(i));
    (q, v)
}

impl Judgements {
    pub fn new(func: &str, v: &ColumnarValue) -> Result<Self> {
        Ok(match v {
            ColumnarValue::Scalar(s) => {
                if s.is_null() && matches!(s.data_type(), DataType::Null) {
                    return Ok(Judgements::Scalar(Vec::new()));
                }
                let one = Self::new(func, &ColumnarValue::Array(s.to_array_of_size(1)?))?;
                Judgements::Scalar(
                    one.verdicts(0)
                        .into_iter()
                        .map(|(q, v)| (q.to_owned(), v))
                        .collect(),
                )
            }
            ColumnarValue::Array(a) => match a.data_type() {
                DataType::Struct(_) => Judgements::One(a.as_struct().clone()),
                DataType::List(_) => Judgements::Many(a.as_list::<i32>().clone()),
                DataType::Null => Judgements::Scalar(Vec::new()),
                other => return exec_err!("{func}: expected judgements, got {other}"),
            },
        })
    }

    pub fn is_scalar(&self) -> bool {
        matches!(self, Judgements::Scalar(_))
    }

    /// The verdicts given on row `i`, by question.
    pub fn verdicts(&self, i: usize) -> Vec<(&str, Option<bool>)> {
        match self {
            Judgements::Scalar(v) => v.iter().map(|(q, v)| (q.as_str(), *v)).collect(),
            Judgements::One(s) => {
                if s.is_null(i) {
                    return Vec::new();
                }
                match question_verdict(s, i) {
                    (Some(q), v) => vec![(q, v)],
                    _ => Vec::new(),
                }
            }
            Judgements::Many(l) => {
                if l.is_null(i) {
                    return Vec::new();
                }
                let offsets = l.value_offsets();
                let items = l.values().as_struct();
                (offsets[i] as usize..offsets[i + 1] as usize)
                    .filter(|&j| items.is_valid(j))
                    .filter_map(|j| match question_verdict(items, j) {
                        (Some(q), v) => Some((q, v)),
                        _ => None,
                    })
                    .collect()
            }
        }
    }
}
