//! The typed attack case, for code that builds or transforms cases (the generator,
//! enrichment, ingest). Serialises in contract field order with absent fields omitted,
//! so writing the same case always gives the same bytes.

use datafusion::arrow::array::{Array, AsArray, RecordBatch};
use datafusion::arrow::datatypes::Float64Type;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::criteria::SuccessCriteria;
use super::enums::{
    AttackCategory, AttackSurface, BenchmarkSplit, EvaluationMode, Label, Severity, SourceType,
};
use super::environment::Environment;
use crate::error::{Error, Result};

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct AttackCase {
    pub case_id: String,
    pub source_name: String,
    pub source_type: SourceType,
    pub attack_family: String,
    pub attack_surface: AttackSurface,
    /// The user turn sent to the model. Direct attacks carry the attack here; indirect
    /// ones carry the benign request and hide the attack in `task_input`.
    pub prompt: String,
    pub success_criteria: SuccessCriteria,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attack_subtype: Option<String>,
    /// The application's trusted instructions (system prompt); for leakage cases it
    /// holds the secret.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub context: Option<String>,
    /// Untrusted data the task works on (email, web page, tool output …).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub task_input: Option<String>,
    /// What the attacker wants the model to emit or reveal.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expected_target: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub label: Option<Label>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub severity_level: Option<Severity>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub benchmark_split: Option<BenchmarkSplit>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source_reference: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source_version: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub language: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub created_at: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provenance: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub notes: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attack_category: Option<AttackCategory>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub success_definition_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mapping_confidence: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub severity: Option<Severity>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub evaluation_mode: Option<EvaluationMode>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mapping_audit: Option<Value>,
    /// An agentic case's simulated environment: the case runs as an agent loop whose
    /// tool calls the criteria judge (docs/contract.md#agent-environments).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub environment: Option<Environment>,
    /// The user's task as a criterion (was it still done?): decided like
    /// `success_criteria`, reported as utility.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub utility_criteria: Option<SuccessCriteria>,
    /// Framework tags (enriched from the taxonomy's categories and tag rules):
    /// OWASP Top 10 for LLM Applications 2025 ids (`LLM01:2025`), OWASP agentic threat
    /// ids (`T6`), MITRE ATLAS technique ids (`AML.T0051.001`), NIST AI 600-1 risk
    /// names (`Information Security`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owasp_llm: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owasp_agentic: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mitre_atlas: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nist_ai_600_1: Option<Vec<String>>,
}

impl AttackCase {
    /// A case with the required fields and every optional one absent.
    pub fn new(
        case_id: String,
        source_name: String,
        source_type: SourceType,
        attack_family: String,
        attack_surface: AttackSurface,
        prompt: String,
        success_criteria: SuccessCriteria,
    ) -> Self {
        Self {
            case_id,
            source_name,
            source_type,
            attack_family,
            attack_surface,
            prompt,
            success_criteria,
            attack_subtype: None,
            context: None,
            task_input: None,
            expected_target: None,
            label: None,
            severity_level: None,
            benchmark_split: None,
            source_reference: None,
            source_version: None,
            language: None,
            created_at: None,
            provenance: None,
            notes: None,
            attack_category: None,
            success_definition_id: None,
            mapping_confidence: None,
            severity: None,
            evaluation_mode: None,
            mapping_audit: None,
            environment: None,
            utility_criteria: None,
            owasp_llm: None,
            owasp_agentic: None,
            mitre_atlas: None,
            nist_ai_600_1: None,
        }
    }

    /// `label` with the contract's default: a case without a label is an attack.
    pub fn is_benign(&self) -> bool {
        self.label == Some(Label::Benign)
    }

    /// One JSONL line (no trailing newline).
    pub fn to_json_line(&self) -> String {
        serde_json::to_string(self).expect("attack case serialises")
    }

    /// Rebuild typed cases from a batch produced by the corpus reader (either schema).
    pub fn from_batch(batch: &RecordBatch) -> Result<Vec<AttackCase>> {
        let schema = batch.schema();
        let col = |name: &str| {
            schema
                .index_of(name)
                .ok()
                .map(|i| batch.column(i).as_string::<i32>())
        };
        let get = |name: &str, row: usize| -> Option<String> {
            col(name).and_then(|a| (!a.is_null(row)).then(|| a.value(row).to_owned()))
        };
        let json = |name: &str, row: usize| -> Result<Option<Value>> {
            get(name, row)
                .map(|t| {
                    serde_json::from_str(&t).map_err(|e| Error::Internal(format!("{name}: {e}")))
                })
                .transpose()
        };
        // A vocabulary field: its value parsed, or an error naming the case and field
        // (the readers validate before this, so it is not expected).
        fn vocab<T>(
            value: Option<String>,
            field: &str,
            case_id: &str,
            parse: fn(&str) -> Option<T>,
        ) -> Result<Option<T>> {
            value
                .map(|v| {
                    parse(&v).ok_or_else(|| {
                        Error::Internal(format!(
                            "case {case_id:?}: {field} {:?} is not in the contract's vocabulary",
                            crate::text::excerpt(&v, 60)
                        ))
                    })
                })
                .transpose()
        }
        // A framework-tag list column (absent in a corpus enriched before it existed).
        let tags = |name: &str, row: usize| -> Option<Vec<String>> {
            let a = batch
                .column(schema.index_of(name).ok()?)
                .as_list_opt::<i32>()?;
            (!a.is_null(row)).then(|| {
                let items = a.value(row);
                items
                    .as_string::<i32>()
                    .iter()
                    .flatten()
                    .map(str::to_owned)
                    .collect()
            })
        };
        let confidence = schema
            .index_of("mapping_confidence")
            .ok()
            .map(|i| batch.column(i).as_primitive::<Float64Type>().clone());
        let mut out = Vec::with_capacity(batch.num_rows());
        for row in 0..batch.num_rows() {
            let criteria: Value = json("success_criteria", row)?.unwrap_or(Value::Null);
            let success_criteria = SuccessCriteria::from_json(&criteria)
                .map_err(|e| Error::Internal(format!("success_criteria: {e}")))?;
            let case_id = get("case_id", row).unwrap_or_default();
            let id = case_id.as_str();
            let required = |field: &str| {
                get(field, row).ok_or_else(|| Error::Internal(format!("case {id:?}: no {field}")))
            };
            out.push(AttackCase {
                source_type: vocab(
                    Some(required("source_type")?),
                    "source_type",
                    id,
                    SourceType::parse,
                )?
                .expect("given"),
                attack_surface: vocab(
                    Some(required("attack_surface")?),
                    "attack_surface",
                    id,
                    AttackSurface::parse,
                )?
                .expect("given"),
                label: vocab(get("label", row), "label", id, Label::parse)?,
                severity_level: vocab(
                    get("severity_level", row),
                    "severity_level",
                    id,
                    Severity::parse,
                )?,
                benchmark_split: vocab(
                    get("benchmark_split", row),
                    "benchmark_split",
                    id,
                    BenchmarkSplit::parse,
                )?,
                attack_category: vocab(
                    get("attack_category", row),
                    "attack_category",
                    id,
                    AttackCategory::parse,
                )?,
                severity: vocab(get("severity", row), "severity", id, Severity::parse)?,
                evaluation_mode: vocab(
                    get("evaluation_mode", row),
                    "evaluation_mode",
                    id,
                    EvaluationMode::parse,
                )?,
                case_id: case_id.clone(),
                source_name: get("source_name", row).unwrap_or_default(),
                attack_family: get("attack_family", row).unwrap_or_default(),
                prompt: get("prompt", row).unwrap_or_default(),
                success_criteria,
                attack_subtype: get("attack_subtype", row),
                context: get("context", row),
                task_input: get("task_input", row),
                expected_target: get("expected_target", row),
                source_reference: get("source_reference", row),
                source_version: get("source_version", row),
                language: get("language", row),
                created_at: get("created_at", row),
                provenance: json("provenance", row)?,
                notes: get("notes", row),
                success_definition_id: get("success_definition_id", row),
                mapping_confidence: confidence
                    .as_ref()
                    .and_then(|a| (!a.is_null(row)).then(|| a.value(row))),
                mapping_audit: json("mapping_audit", row)?,
                environment: json("environment", row)?
                    .map(|v| {
                        Environment::from_json(&v)
                            .map_err(|e| Error::Internal(format!("case {id:?}: environment: {e}")))
                    })
                    .transpose()?,
                utility_criteria: json("utility_criteria", row)?
                    .map(|v| {
                        SuccessCriteria::from_json(&v).map_err(|e| {
                            Error::Internal(format!("case {id:?}: utility_criteria: {e}"))
                        })
                    })
                    .transpose()?,
                owasp_llm: tags("owasp_llm", row),
                owasp_agentic: tags("owasp_agentic", row),
                mitre_atlas: tags("mitre_atlas", row),
                nist_ai_600_1: tags("nist_ai_600_1", row),
            });
        }
        Ok(out)
    }
}
