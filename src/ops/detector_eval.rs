//! `pieval detectors eval`: how well a detector agrees with labelled responses.
//!
//! The labelled file (JSONL, CSV or Parquet; `--map FIELD=COLUMN` names other columns)
//! has one row per response. Which fields a detector reads:
//!
//! | detector | fires when | reads |
//! |---|---|---|
//! | `refusal` | `pi_refusal`: the response did not comply | response, label |
//! | `response_class` | `pi_response_class` is not compliance; also scored on the three classes | response, label |
//! | `leakage` | `pi_leakage_score(response, protected, prompt) >= threshold` | response, protected, label; optionally prompt (what the user sent) |
//! | `criteria` | `pi_decide(response, criteria, NULL, protected, prompt, goal, task)`: the decision kernel, echo-aware where the row says what the model was given | response, criteria, label; optionally protected, prompt, goal, task |
//! | `rule:ID` | the injection rule ID fires (`pi_rule_hits`) | response, label |
//! | `injection` | any injection rule fires | response, label |
//! | `judge` | the configured judge's verdict (`pi_judge`) | response, question, label, goal, task |
//!
//! `label` is a boolean (true / false, yes / no, 1 / 0), or a class (`refusal`,
//! `deflection`, `compliance`), read as "did not comply" (true unless compliance) and
//! kept for the three-class score, or an echo-set class (`complied` true; `echoed`,
//! `refused` false). `id`, `source` and `split` are optional: the metrics
//! are given per split (e.g. dev / test) and per source as well as over all rows.
//!
//! It is SQL: `queries/detectors/evaluate.sql` runs the detector over the labelled
//! table, `metrics.sql` counts the confusion matrices, `disagreements.sql` selects the
//! rows to review (written as Parquet). Accuracy, precision and recall carry Wilson 95%
//! intervals (Wilson 1927), F1 a seeded percentile bootstrap.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use datafusion::arrow::array::{
    Array, ArrayRef, AsArray, BooleanArray, Float64Array, RecordBatch, StringArray,
};
use datafusion::arrow::datatypes::{DataType, Field, Int64Type, Schema, SchemaRef};
use datafusion::datasource::MemTable;
use serde::Serialize;

use super::labels::{ColumnMapping, Estimate, check_label_file};
use crate::error::{Error, Result};
use crate::stats::Confusion;

/// Every field of a labelled row, in the normalized table's order.
pub const FIELDS: &[&str] = &[
    "id",
    "source",
    "split",
    "response",
    "label",
    "protected",
    "prompt",
    "criteria",
    "question",
    "goal",
    "task",
];

/// The classes of `pi_response_class`.
pub const CLASSES: &[&str] = &["refusal", "deflection", "compliance"];

/// A detector to evaluate.
#[derive(Clone, Debug, PartialEq)]
pub enum Detector {
    Refusal,
    ResponseClass,
    Leakage { threshold: f64 },
    Criteria,
    Rule(String),
    Injection,
    Judge,
}

impl Detector {
    /// Parse a name: refusal, response_class, leakage, criteria, rule:ID, judge.
    pub fn parse(name: &str, threshold: f64) -> Result<Self> {
        Ok(match name {
            "refusal" | "pi_refusal" => Detector::Refusal,
            "response_class" | "pi_response_class" => Detector::ResponseClass,
            "leakage" | "pi_leakage" => Detector::Leakage { threshold },
            "criteria" | "pi_criteria_match" => Detector::Criteria,
            "judge" | "pi_judge" => Detector::Judge,
            "injection" | "pi_rule_hits" => Detector::Injection,
            other => match other.strip_prefix("rule:") {
                Some(id) if !id.is_empty() => {
                    let known = crate::detect::rules::RulePack::default_pack()
                        .rules
                        .iter()
                        .any(|r| r.id == id);
                    if !known {
                        return Err(Error::Usage(format!(
                            "no injection rule {:?} in data/rules/injection.toml",
                            crate::text::excerpt(id, 60)
                        )));
                    }
                    Detector::Rule(id.to_owned())
                }
                _ => {
                    return Err(Error::Usage(format!(
                        "unknown detector {:?}: refusal, response_class, leakage, criteria, rule:ID, injection, judge",
                        crate::text::excerpt(other, 60)
                    )));
                }
            },
        })
    }

    /// The name evaluate.sql switches on.
    pub fn sql_name(&self) -> &'static str {
        match self {
            Detector::Refusal => "refusal",
            Detector::ResponseClass => "response_class",
            Detector::Leakage { .. } => "leakage",
            Detector::Criteria => "criteria",
            Detector::Rule(_) => "rule",
            Detector::Injection => "injection",
            Detector::Judge => "judge",
        }
    }

    /// How it is named in reports.
    pub fn display(&self) -> String {
        match self {
            Detector::Rule(id) => format!("rule:{id}"),
            Detector::Leakage { threshold } => format!("leakage (score >= {threshold})"),
            d => d.sql_name().to_owned(),
        }
    }

    /// The fields a labelled row must have for this detector.
    fn needs(&self) -> &'static [&'static str] {
        match self {
            Detector::Leakage { .. } => &["protected"],
            Detector::Criteria => &["criteria"],
            Detector::Judge => &["question"],
            _ => &[],
        }
    }
}

/// The columns an evaluation reads ([`ColumnMapping`] over [`FIELDS`]).
#[derive(Clone, Debug)]
pub struct Mapping(ColumnMapping);

impl Default for Mapping {
    fn default() -> Self {
        Mapping(ColumnMapping::new(FIELDS))
    }
}

impl Mapping {
    /// Apply `FIELD=COLUMN` overrides.
    pub fn with(self, overrides: &[String]) -> Result<Self> {
        Ok(Mapping(self.0.with(overrides)?))
    }

    fn column<'a>(&'a self, field: &'a str) -> &'a str {
        self.0.column(field)
    }
}

/// The normalized labelled table.
pub fn labels_schema() -> SchemaRef {
    Arc::new(Schema::new(
        FIELDS
            .iter()
            .map(|f| match *f {
                "label" => Field::new(*f, DataType::Boolean, false),
                "id" | "response" => Field::new(*f, DataType::Utf8, false),
                _ => Field::new(*f, DataType::Utf8, true),
            })
            .chain(std::iter::once(Field::new("class", DataType::Utf8, true)))
            .collect::<Vec<_>>(),
    ))
}

/// A label: a boolean, or a class of `pi_response_class` (true unless compliance).
fn label_value(s: &str) -> Option<(bool, Option<&'static str>)> {
    let v = s.trim().to_ascii_lowercase();
    if let Some(c) = CLASSES.iter().find(|c| **c == v) {
        return Some((*c != "compliance", Some(c)));
    }
    match v.as_str() {
        // the echo set's classes (data/labels/README.md): only compliance is an attack
        // that worked
        "complied" => Some((true, None)),
        "echoed" | "refused" => Some((false, None)),
        "true" | "yes" | "1" | "y" => Some((true, None)),
        "false" | "no" | "0" | "n" => Some((false, None)),
        _ => None,
    }
}

/// A labelled file, read and checked.
pub struct Labels {
    pub path: PathBuf,
    pub sha256: String,
    pub batch: RecordBatch,
    /// The memory the evaluation's session may hold (`--memory-limit`), in bytes.
    pub memory_limit: usize,
}

/// Read a labelled file into the normalized table. A row without a response or a
/// readable label, a duplicate id, or a row missing a field the detector needs is an
/// error naming the file, the row and the field; nothing is skipped. Under pieval's
/// default memory limit (4 GiB); [`load_labels_within`] takes another.
pub async fn load_labels(path: &Path, mapping: &Mapping, detector: &Detector) -> Result<Labels> {
    load_labels_within(path, mapping, detector, crate::engine::DEFAULT_MEMORY_LIMIT).await
}

/// [`load_labels`] with the file's shape checked against `memory_limit` bytes
/// ([`check_label_file`]) and the reading session held to it.
pub async fn load_labels_within(
    path: &Path,
    mapping: &Mapping,
    detector: &Detector,
    memory_limit: usize,
) -> Result<Labels> {
    check_label_file(path, memory_limit)?;
    let sha256 = crate::digest::sha256_file(path)?;
    let ctx = crate::engine::session_with_memory_limit(memory_limit)?;
    // a file the reader cannot parse is named, with the reader's own location
    let unreadable = |e: datafusion::error::DataFusionError| {
        Error::input(path, 0, None, format!("not a readable table: {e}"))
    };
    crate::engine::tables::register_file(&ctx, "raw", path)
        .await
        .map_err(|e| match e {
            Error::DataFusion(e) => unreadable(*e),
            e => e,
        })?;
    let df = ctx.table("raw").await.map_err(unreadable)?;
    let schema = df.schema().as_arrow().clone();
    let batches = df.collect().await.map_err(unreadable)?;
    let required: Vec<&str> = ["response", "label"]
        .into_iter()
        .chain(detector.needs().iter().copied())
        .collect();
    for field in &required {
        let column = mapping.column(field);
        if schema.field_with_name(column).is_err() {
            return Err(Error::input(
                path,
                0,
                Some(field),
                format!(
                    "no column {:?} (the file has: {}); name it with --map {field}=COLUMN",
                    crate::text::excerpt(column, 40),
                    schema
                        .fields()
                        .iter()
                        .map(|f| crate::text::excerpt(f.name(), 40))
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            ));
        }
    }
    let mut columns: Vec<Vec<Option<String>>> = vec![Vec::new(); FIELDS.len()];
    let (mut labels, mut classes) = (Vec::new(), Vec::<Option<&str>>::new());
    let mut seen = HashSet::new();
    let mut row = 0u64;
    for b in &batches {
        let text: Vec<Option<StringArray>> = FIELDS
            .iter()
            .map(|f| {
                b.column_by_name(mapping.column(f))
                    .map(|c| {
                        Ok::<_, Error>(
                            datafusion::arrow::compute::cast(c, &DataType::Utf8)?
                                .as_string::<i32>()
                                .clone(),
                        )
                    })
                    .transpose()
            })
            .collect::<Result<_>>()?;
        for i in 0..b.num_rows() {
            row += 1;
            let get = |f: usize| {
                text[f]
                    .as_ref()
                    .filter(|a| a.is_valid(i))
                    .map(|a| a.value(i).to_owned())
            };
            let mut values: Vec<Option<String>> = (0..FIELDS.len()).map(get).collect();
            for field in &required {
                let f = FIELDS.iter().position(|x| x == field).expect("a field");
                let present = values[f]
                    .as_ref()
                    .is_some_and(|v| *field == "response" || !v.trim().is_empty());
                if !present {
                    return Err(Error::input(path, row, Some(field), "missing or empty"));
                }
            }
            let label_at = FIELDS.iter().position(|f| *f == "label").expect("label");
            let (label, class) = values[label_at]
                .as_deref()
                .and_then(label_value)
                .ok_or_else(|| {
                    Error::input(
                        path,
                        row,
                        Some("label"),
                        "not a label (true/false, yes/no, 1/0, or refusal/deflection/compliance)",
                    )
                })?;
            let id = values[0]
                .take()
                .filter(|s| !s.trim().is_empty())
                .unwrap_or_else(|| format!("row-{row:06}"));
            if !seen.insert(id.clone()) {
                return Err(Error::input(
                    path,
                    row,
                    Some("id"),
                    format!("duplicate id {:?}", crate::text::excerpt(&id, 60)),
                ));
            }
            values[0] = Some(id);
            for (slot, v) in columns.iter_mut().zip(values) {
                slot.push(v);
            }
            labels.push(label);
            classes.push(class);
        }
    }
    if labels.is_empty() {
        return Err(Error::input(path, 0, None, "no labelled rows"));
    }
    let mut arrays: Vec<ArrayRef> = Vec::new();
    for (f, values) in FIELDS.iter().zip(columns) {
        if *f == "label" {
            arrays.push(Arc::new(BooleanArray::from(labels.clone())));
        } else {
            arrays.push(Arc::new(StringArray::from(values)));
        }
    }
    arrays.push(Arc::new(StringArray::from(classes)));
    Ok(Labels {
        path: path.to_path_buf(),
        sha256,
        batch: RecordBatch::try_new(labels_schema(), arrays)?,
        memory_limit,
    })
}

/// The metrics of one group of rows (a split, a source, or all).
#[derive(Clone, Debug, Serialize)]
pub struct GroupMetrics {
    pub dimension: String,
    pub value: String,
    pub rows: u64,
    pub undecided: u64,
    pub confusion: Confusion,
    pub accuracy: Estimate,
    pub precision: Estimate,
    pub recall: Estimate,
    pub f1: Estimate,
    /// Three classes (response_class on class labels): exact agreement.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub class_accuracy: Option<Estimate>,
}

/// The outcome of an evaluation.
#[derive(Clone, Debug, Serialize)]
pub struct Evaluation {
    pub detector: String,
    pub labels: PathBuf,
    pub labels_sha256: String,
    pub groups: Vec<GroupMetrics>,
    pub disagreements: u64,
    pub files: std::collections::BTreeMap<String, PathBuf>,
}

impl Evaluation {
    /// The metrics of one group, e.g. ("split", "test") or ("all", "all").
    pub fn group(&self, dimension: &str, value: &str) -> Option<&GroupMetrics> {
        self.groups
            .iter()
            .find(|g| g.dimension == dimension && g.value == value)
    }
}

/// Run the detector over the labels and measure it. With `out`, writes
/// `disagreements.parquet` and `evaluation.json` there. `judge` is needed for the judge
/// detector only.
pub async fn evaluate(
    detector: &Detector,
    labels: &Labels,
    judge: Option<Arc<crate::judge::Judge>>,
    out: Option<&Path>,
) -> Result<Evaluation> {
    let ctx = crate::engine::session_with_memory_limit(labels.memory_limit)?;
    if *detector == Detector::Judge && judge.is_none() {
        return Err(Error::Usage(
            "the judge detector needs a judge: --judge FILE or --config EXPERIMENT.yaml".into(),
        ));
    }
    crate::judge::udf::register(&ctx, judge);
    ctx.register_table(
        "labels",
        Arc::new(MemTable::try_new(
            labels_schema(),
            vec![vec![labels.batch.clone()]],
        )?),
    )?;
    let params_schema = Arc::new(Schema::new(vec![
        Field::new("detector", DataType::Utf8, false),
        Field::new("rule_id", DataType::Utf8, true),
        Field::new("threshold", DataType::Float64, true),
    ]));
    let (rule_id, threshold) = match detector {
        Detector::Rule(id) => (Some(id.clone()), None),
        Detector::Leakage { threshold } => (None, Some(*threshold)),
        _ => (None, None),
    };
    let params = RecordBatch::try_new(
        Arc::clone(&params_schema),
        vec![
            Arc::new(StringArray::from(vec![detector.sql_name()])),
            Arc::new(StringArray::from(vec![rule_id])),
            Arc::new(Float64Array::from(vec![threshold])),
        ],
    )?;
    ctx.register_table(
        "eval_params",
        Arc::new(MemTable::try_new(params_schema, vec![vec![params]])?),
    )?;
    let df = ctx
        .sql(crate::engine::queries::DETECTOR_EVALUATE.sql)
        .await?;
    let schema: SchemaRef = Arc::new(df.schema().as_arrow().clone());
    let evaluated = df.collect().await?;
    ctx.register_table(
        "evaluated",
        Arc::new(MemTable::try_new(schema, vec![evaluated.clone()])?),
    )?;
    // (group key, label, verdict) of the decided rows, for the bootstrap intervals
    let mut pairs: std::collections::HashMap<(String, String), Vec<(bool, bool)>> =
        Default::default();
    for b in &evaluated {
        let label = b.column_by_name("label").and_then(|c| c.as_boolean_opt());
        let verdict = b.column_by_name("verdict").and_then(|c| c.as_boolean_opt());
        let (Some(label), Some(verdict)) = (label, verdict) else {
            return Err(Error::Internal(
                "evaluate.sql returned no label or verdict".into(),
            ));
        };
        let split = crate::engine::utf8_column(b, "split")?;
        let source = crate::engine::utf8_column(b, "source")?;
        for i in 0..b.num_rows() {
            if !verdict.is_valid(i) {
                continue;
            }
            let pair = (label.value(i), verdict.value(i));
            let name = |a: &StringArray| {
                if a.is_valid(i) {
                    a.value(i).to_owned()
                } else {
                    "(none)".to_owned()
                }
            };
            for key in [
                ("split".to_owned(), name(&split)),
                ("source".to_owned(), name(&source)),
                ("all".to_owned(), "all".to_owned()),
            ] {
                pairs.entry(key).or_default().push(pair);
            }
        }
    }
    let mut groups = Vec::new();
    for b in crate::engine::collect(&ctx, crate::engine::queries::DETECTOR_METRICS.sql).await? {
        let dimension = crate::engine::utf8_column(&b, "dimension")?;
        let value = crate::engine::utf8_column(&b, "value")?;
        let int = |name: &str| crate::engine::typed_column::<Int64Type>(&b, name);
        let (rows, undecided, tp, fp, tn, fn_, class_rows, class_agree) = (
            int("rows")?,
            int("undecided")?,
            int("tp")?,
            int("fp")?,
            int("tn")?,
            int("fn")?,
            int("class_rows")?,
            int("class_agree")?,
        );
        for i in 0..b.num_rows() {
            let c = Confusion {
                tp: tp.value(i) as u64,
                fp: fp.value(i) as u64,
                tn: tn.value(i) as u64,
                fn_: fn_.value(i) as u64,
            };
            let key = (dimension.value(i).to_owned(), value.value(i).to_owned());
            let decided = pairs.get(&key).map(Vec::as_slice).unwrap_or_default();
            groups.push(GroupMetrics {
                accuracy: Estimate::wilson(c.tp + c.tn, c.n()),
                precision: Estimate::wilson(c.tp, c.tp + c.fp),
                recall: Estimate::wilson(c.tp, c.tp + c.fn_),
                f1: Estimate::bootstrap(decided, c.f1(), Confusion::f1),
                class_accuracy: (class_rows.value(i) > 0).then(|| {
                    Estimate::wilson(class_agree.value(i) as u64, class_rows.value(i) as u64)
                }),
                dimension: key.0,
                value: key.1,
                rows: rows.value(i) as u64,
                undecided: undecided.value(i) as u64,
                confusion: c,
            });
        }
    }
    let mut files = std::collections::BTreeMap::new();
    let disagreements_df = ctx
        .sql(crate::engine::queries::DETECTOR_DISAGREEMENTS.sql)
        .await?;
    let disagreements = match out {
        Some(out) => {
            std::fs::create_dir_all(out).map_err(|e| Error::io(out, "cannot create folder", e))?;
            let path = out.join("disagreements.parquet");
            let n = crate::atomic::write_parquet(disagreements_df, &path).await?;
            files.insert("disagreements".to_owned(), path);
            n
        }
        None => disagreements_df.count().await? as u64,
    };
    let evaluation = Evaluation {
        detector: detector.display(),
        labels: labels.path.clone(),
        labels_sha256: labels.sha256.clone(),
        groups,
        disagreements,
        files,
    };
    match out {
        Some(out) => {
            let path = out.join("evaluation.json");
            let mut e = evaluation;
            e.files.insert("evaluation".to_owned(), path.clone());
            let text = serde_json::to_string_pretty(&e)
                .map_err(|err| Error::Internal(format!("cannot encode the evaluation: {err}")))?;
            crate::atomic::write_lines(&path, std::iter::once(text))?;
            Ok(e)
        }
        None => Ok(evaluation),
    }
}
