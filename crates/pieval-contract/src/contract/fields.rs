//! The attack-case field table: the single source of truth for validation, the Arrow
//! schemas and the JSON Schemas in `schemas/` (a test checks they agree).

use super::enums::*;

/// What a field holds, and so how it is validated.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FieldKind {
    /// A stable identifier safe in file names: `[A-Za-z0-9][A-Za-z0-9._:-]*`, ≤ 128 bytes.
    Id,
    /// Non-empty free text.
    Text,
    /// A lowercase snake_case name (`attack_family`, `attack_subtype`).
    Name,
    /// One value of a closed vocabulary.
    Enum(&'static [&'static str]),
    /// A BCP-47 language tag (`en`, `pt-BR`).
    Language,
    /// An RFC 3339 UTC timestamp (`2026-11-30T00:00:00Z`).
    Timestamp,
    /// A JSON object (kept as canonical JSON text in Arrow).
    Object,
    /// The machine-evaluable success criterion (object, or shorthand string).
    Criteria,
    /// A number in [0, 1].
    Probability,
    /// An agent's simulated environment (`contract::environment`), kept as canonical
    /// JSON text in Arrow.
    Environment,
    /// Framework tags: a JSON array of distinct non-empty strings (`["LLM01:2025"]`), a
    /// list of strings in Arrow (`array_has(owasp_llm, 'LLM01:2025')` in SQL).
    Tags,
}

#[derive(Clone, Copy, Debug)]
pub struct FieldSpec {
    pub name: &'static str,
    pub required: bool,
    /// Added by `pieval enrich`; never present in the canonical corpus by requirement.
    pub enriched: bool,
    pub kind: FieldKind,
}

const fn req(name: &'static str, kind: FieldKind) -> FieldSpec {
    FieldSpec {
        name,
        required: true,
        enriched: false,
        kind,
    }
}
const fn opt(name: &'static str, kind: FieldKind) -> FieldSpec {
    FieldSpec {
        name,
        required: false,
        enriched: false,
        kind,
    }
}
const fn enr(name: &'static str, kind: FieldKind) -> FieldSpec {
    FieldSpec {
        name,
        required: false,
        enriched: true,
        kind,
    }
}

/// Every attack-case field in contract order: required, recommended optional, enriched.
pub const CASE_FIELDS: &[FieldSpec] = &[
    req("case_id", FieldKind::Id),
    req("source_name", FieldKind::Text),
    req("source_type", FieldKind::Enum(SOURCE_TYPES)),
    req("attack_family", FieldKind::Name),
    req("attack_surface", FieldKind::Enum(ATTACK_SURFACES)),
    req("prompt", FieldKind::Text),
    req("success_criteria", FieldKind::Criteria),
    opt("attack_subtype", FieldKind::Name),
    opt("context", FieldKind::Text),
    opt("task_input", FieldKind::Text),
    opt("expected_target", FieldKind::Text),
    opt("label", FieldKind::Enum(LABELS)),
    opt("severity_level", FieldKind::Enum(SEVERITIES)),
    opt("benchmark_split", FieldKind::Enum(BENCHMARK_SPLITS)),
    opt("source_reference", FieldKind::Text),
    opt("source_version", FieldKind::Text),
    opt("language", FieldKind::Language),
    opt("created_at", FieldKind::Timestamp),
    opt("provenance", FieldKind::Object),
    opt("notes", FieldKind::Text),
    enr("attack_category", FieldKind::Enum(ATTACK_CATEGORIES)),
    enr("success_definition_id", FieldKind::Name),
    enr("mapping_confidence", FieldKind::Probability),
    enr("severity", FieldKind::Enum(SEVERITIES)),
    enr("evaluation_mode", FieldKind::Enum(EVALUATION_MODES)),
    enr("mapping_audit", FieldKind::Object),
    // Agentic cases (additive, after the enriched fields so no column moves): the
    // simulated environment and the user's task as a criterion (docs/contract.md).
    opt("environment", FieldKind::Environment),
    opt("utility_criteria", FieldKind::Criteria),
    // Framework tags (additive, enriched): the identifiers of the case's category and the
    // taxonomy's tag rules in the OWASP Top 10 for LLM Applications 2025, the OWASP
    // agentic threats list, MITRE ATLAS and NIST AI 600-1 (data/taxonomy/taxonomy.toml).
    enr("owasp_llm", FieldKind::Tags),
    enr("owasp_agentic", FieldKind::Tags),
    enr("mitre_atlas", FieldKind::Tags),
    enr("nist_ai_600_1", FieldKind::Tags),
];

/// The framework-tag fields, in contract order (cases and case_results alike).
pub const FRAMEWORK_TAG_FIELDS: &[&str] =
    &["owasp_llm", "owasp_agentic", "mitre_atlas", "nist_ai_600_1"];

/// Index of a field in [`CASE_FIELDS`] (and so a column in the Arrow schema).
pub fn case_field_index(name: &str) -> Option<usize> {
    CASE_FIELDS.iter().position(|f| f.name == name)
}

pub fn required_case_fields() -> impl Iterator<Item = &'static str> {
    CASE_FIELDS.iter().filter(|f| f.required).map(|f| f.name)
}

/// Predictions: the input of scoring (`case_id`, `response_text` required).
pub const PREDICTION_FIELDS: &[(&str, bool)] = &[
    ("case_id", true),
    ("response_text", true),
    ("run_id", false),
    ("provider", false),
    ("model_name", false),
    ("latency_ms", false),
    ("error", false),
    ("request_prompt", false),
    ("request_context", false),
    ("request_task_input", false),
    ("execution_mode", false),
    ("mitigation", false),
    ("blocked_by", false),
    // Adaptive attacks (`attack` in the experiment config), additive.
    ("attempt_id", false),
    ("attack_pipeline", false),
    ("attack_strategy", false),
    ("turns_used", false),
    ("success_turn", false),
    // Agentic attempts (a case with an `environment`), additive: the calls in order and
    // the record store at the end (JSON text), whether the payload reached the model,
    // and why the loop ended.
    ("agent_actions", false),
    ("final_state", false),
    ("injection_delivered", false),
    ("agent_stop", false),
    // Imported results (`pieval import`, docs/import.md), additive: the tool that produced
    // the row, its own verdict (true: the attack succeeded by the tool's reading), the
    // detector or scorer behind it and its score, and where the row came from
    // (`file:line`, or the entry of an archive), and the tool's own id of the record,
    // verbatim (the case id is made from it, src/import/mod.rs).
    ("source_tool", false),
    ("source_verdict", false),
    ("source_detector", false),
    ("source_score", false),
    ("source_ref", false),
    ("source_id", false),
];

/// The numeric prediction fields (the others are strings).
pub fn prediction_field_type(name: &str) -> PredictionType {
    match name {
        "latency_ms" => PredictionType::Float,
        "turns_used" | "success_turn" => PredictionType::Count,
        "injection_delivered" | "source_verdict" => PredictionType::Flag,
        "source_score" => PredictionType::Number,
        _ => PredictionType::Text,
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PredictionType {
    Text,
    /// A non-negative finite number.
    Float,
    /// A non-negative integer.
    Count,
    /// true or false.
    Flag,
    /// Any finite number (another tool's score).
    Number,
}

/// `case_results.jsonl`: the seed's fields, then pieval's additive ones.
pub const CASE_RESULT_FIELDS: &[&str] = &[
    "case_id",
    "source_name",
    "attack_family",
    "attack_surface",
    "attack_category",
    "success_definition_id",
    "mapping_confidence",
    "severity",
    "evaluation_mode",
    "expected_target",
    "request_prompt",
    "request_context",
    "request_task_input",
    "execution_mode",
    "response_text",
    "attack_success",
    "prompt_leakage",
    "refusal",
    "manual_review",
    "matched_rule",
    "latency_ms",
    "provider",
    "model_name",
    "run_id",
    "mitigation",
    "error",
    "label",
    "blocked_by",
    "review_reason",
    "judge_verdict",
    "judge_rationale",
    "judge_model",
    "judge_error",
    // Adaptive attacks, additive: the attempt, its pipeline and strategy (`none` for the
    // other kind; all null in a run without an attack section), turns used and the turn
    // that succeeded.
    "attempt_id",
    "attack_pipeline",
    "attack_strategy",
    "turns_used",
    "success_turn",
    // Benign controls, additive: a control's outcome is not an attack's. For
    // `label = benign` attack_success is NULL and over_refused says whether the control
    // was refused (or deflected, or blocked by a mitigation); NULL for attacks and for
    // controls without a usable response.
    "over_refused",
    // The response's class from pi_response_class: refusal, deflection or compliance
    // (NULL when there is no usable response).
    "response_class",
    // Echoes, additive: a criterion's text was found in the response only as a copy of
    // what the model was given (crates/pieval-detect/src/echo.rs); such a case is undecided
    // (review_reason echo) unless a judge or a person decided it. NULL when the
    // criteria were not evaluated.
    "echoed",
    // Who decided attack_success (or over_refused): rules, judge or human; NULL when
    // undecided.
    "decided_by",
    // Agentic attempts, additive (NULL for other rows): the user's task still done (the
    // case's utility_criteria), the payload reached the model at all (false: not
    // delivered, which is not resisted), and why the agent loop ended.
    "utility_success",
    "injection_delivered",
    "agent_stop",
    // Imported results (`pieval import`), additive (NULL for pieval's own runs): the tool,
    // its verdict beside pieval's attack_success, the detector or scorer that gave it,
    // its score, the source file and line (or archive entry) of the row, and the tool's
    // own id of the record, verbatim.
    "source_tool",
    "source_verdict",
    "source_detector",
    "source_score",
    "source_ref",
    "source_id",
    // Framework tags, additive: the case's (lists of strings; empty for a case enriched
    // before the taxonomy had them).
    "owasp_llm",
    "owasp_agentic",
    "mitre_atlas",
    "nist_ai_600_1",
];

/// Findings: long form, one row per detector hit.
pub const FINDING_FIELDS: &[&str] = &[
    "run_id",
    "case_id",
    "detector",
    "rule_id",
    "severity",
    "span_start",
    "span_end",
    "excerpt",
];

pub const MANIFEST_FIELDS: &[&str] = &[
    "run_id",
    "timestamp",
    "git_commit",
    "config_source_path",
    "config_snapshot",
    "dataset_snapshot",
    "model_snapshot",
    "mitigation_snapshot",
    "replay_hints",
];

pub const DATASET_SNAPSHOT_FIELDS: &[&str] = &[
    "path",
    "sha256",
    "selected_case_ids",
    "total_available_cases",
    "total_filtered_cases",
    "selection_snapshot",
    "taxonomy_summary",
];

pub const SUMMARY_FIELDS: &[&str] = &[
    "run_id",
    "experiment_name",
    "aggregate_metrics",
    "result_paths",
];

/// Experiment config sections; the first four are required.
pub const CONFIG_SECTIONS: &[(&str, bool)] = &[
    ("experiment", true),
    ("dataset", true),
    ("model", true),
    ("mitigation", true),
    ("selection", false),
    ("evaluation", false),
    // Adaptive attacks (converters, multi-turn strategies): pieval's, additive.
    ("attack", false),
    // Guardrails under test (the target is a prompt-injection classifier): additive.
    ("guardrail", false),
];
