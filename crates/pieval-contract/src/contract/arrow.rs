//! Arrow schemas of the contract's tables. Attack-case columns follow [`CASE_FIELDS`]
//! order; JSON-valued fields (`success_criteria`, `provenance`, `mapping_audit`) are
//! stored as canonical JSON text so SQL can read them with the detector UDFs.

use std::sync::Arc;

use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};

use super::fields::{
    CASE_FIELDS, CASE_RESULT_FIELDS, FINDING_FIELDS, FieldKind, PREDICTION_FIELDS,
};

fn case_field_type(kind: FieldKind) -> DataType {
    match kind {
        FieldKind::Probability => DataType::Float64,
        FieldKind::Tags => tags_type(),
        _ => DataType::Utf8,
    }
}

/// A framework-tag column: a list of strings (items nullable, as Arrow's list builders
/// and DataFusion's array functions make them).
pub fn tags_type() -> DataType {
    DataType::List(Arc::new(Field::new_list_field(DataType::Utf8, true)))
}

/// The canonical corpus (`attack_cases.jsonl`) as a table.
pub fn attack_case_schema() -> SchemaRef {
    Arc::new(Schema::new(
        CASE_FIELDS
            .iter()
            .filter(|f| !f.enriched)
            .map(|f| Field::new(f.name, case_field_type(f.kind), !f.required))
            .collect::<Vec<_>>(),
    ))
}

/// The enriched corpus: every canonical column, then the enriched ones.
pub fn enriched_case_schema() -> SchemaRef {
    Arc::new(Schema::new(
        CASE_FIELDS
            .iter()
            .map(|f| Field::new(f.name, case_field_type(f.kind), !f.required))
            .collect::<Vec<_>>(),
    ))
}

pub fn predictions_schema() -> SchemaRef {
    Arc::new(Schema::new(
        PREDICTION_FIELDS
            .iter()
            .map(|(name, required)| {
                let ty = match crate::contract::fields::prediction_field_type(name) {
                    crate::contract::fields::PredictionType::Float
                    | crate::contract::fields::PredictionType::Number => DataType::Float64,
                    crate::contract::fields::PredictionType::Count => DataType::Int64,
                    crate::contract::fields::PredictionType::Text => DataType::Utf8,
                    crate::contract::fields::PredictionType::Flag => DataType::Boolean,
                };
                // response_text may be null when the call failed (then `error` is set).
                Field::new(*name, ty, !*required || *name == "response_text")
            })
            .collect::<Vec<_>>(),
    ))
}

pub fn case_results_schema() -> SchemaRef {
    Arc::new(Schema::new(
        CASE_RESULT_FIELDS
            .iter()
            .map(|name| {
                let ty = match *name {
                    "attack_success"
                    | "prompt_leakage"
                    | "refusal"
                    | "manual_review"
                    | "judge_verdict"
                    | "over_refused"
                    | "echoed"
                    | "utility_success"
                    | "injection_delivered"
                    | "source_verdict" => DataType::Boolean,
                    "mapping_confidence" | "latency_ms" | "source_score" => DataType::Float64,
                    "turns_used" | "success_turn" => DataType::Int64,
                    name if super::fields::FRAMEWORK_TAG_FIELDS.contains(&name) => tags_type(),
                    _ => DataType::Utf8,
                };
                Field::new(*name, ty, *name != "case_id")
            })
            .collect::<Vec<_>>(),
    ))
}

pub fn findings_schema() -> SchemaRef {
    Arc::new(Schema::new(
        FINDING_FIELDS
            .iter()
            .map(|name| {
                let ty = match *name {
                    "span_start" | "span_end" => DataType::Int64,
                    _ => DataType::Utf8,
                };
                Field::new(
                    *name,
                    ty,
                    !matches!(*name, "case_id" | "detector" | "rule_id"),
                )
            })
            .collect::<Vec<_>>(),
    ))
}

/// `tool_calls.parquet`: one row per tool call of an agent's attempt, in call order
/// (`seq` from 1 over the attempt; `turn` the model answer that asked for it, 0 for the
/// environment's prefill calls; `action`: one of the model's actions, what the criteria
/// read — `array_agg(…) FILTER (WHERE action)` gives what scoring decides on); joins
/// `case_results` on `(run_id, attempt_id)` (`attempt_id` is the case id for an attempt
/// without one). `arguments` is the JSON text the model sent; `output` what the model
/// received back (after the mitigation); `executed`: the environment carried it out
/// (`false`: rejected — a tool not offered, malformed or invalid arguments; a call of an
/// offered tool is an action the criteria read either way); `injected`: the environment's output held the
/// payload; `blocked_by`: the prompt-injection detector withheld it.
pub fn tool_calls_schema() -> SchemaRef {
    let text = |name: &str, nullable: bool| Field::new(name, DataType::Utf8, nullable);
    let int = |name: &str| Field::new(name, DataType::Int64, false);
    let flag = |name: &str| Field::new(name, DataType::Boolean, false);
    Arc::new(Schema::new(vec![
        text("run_id", false),
        text("case_id", false),
        text("attempt_id", false),
        int("turn"),
        int("seq"),
        text("call_id", false),
        text("name", false),
        text("arguments", false),
        text("output", false),
        flag("error"),
        flag("executed"),
        flag("action"),
        flag("injected"),
        text("blocked_by", true),
    ]))
}

/// `source_scores.parquet` of an imported run (`pieval import`): every score the source
/// tool gave, one row per row and scorer (detector, assertion, judge), with the value as
/// written, as a number when it is one, and read as "the attack succeeded"; joins
/// `case_results` on `(run_id, case_id, attempt_id)`.
pub fn source_scores_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("run_id", DataType::Utf8, false),
        Field::new("case_id", DataType::Utf8, false),
        Field::new("attempt_id", DataType::Utf8, true),
        Field::new("source_tool", DataType::Utf8, false),
        Field::new("scorer", DataType::Utf8, false),
        Field::new("value", DataType::Utf8, true),
        Field::new("score", DataType::Float64, true),
        Field::new("verdict", DataType::Boolean, true),
        Field::new("explanation", DataType::Utf8, true),
        Field::new("source_ref", DataType::Utf8, false),
    ]))
}

/// `turns.parquet`: one row per turn of a multi-turn strategy
/// (the run folder's `TurnRecord`, tagged with its run, case, attempt and strategy); joins
/// `case_results` on `(run_id, attempt_id)`.
pub fn turns_schema() -> SchemaRef {
    let text = |name: &str, nullable: bool| Field::new(name, DataType::Utf8, nullable);
    let int = |name: &str, nullable: bool| Field::new(name, DataType::Int64, nullable);
    let flag = |name: &str, nullable: bool| Field::new(name, DataType::Boolean, nullable);
    Arc::new(Schema::new(vec![
        text("run_id", false),
        text("case_id", false),
        text("attempt_id", false),
        text("attack_strategy", true),
        int("turn", false),
        int("depth", false),
        text("node_id", false),
        text("parent_id", true),
        text("attacker_response", true),
        text("attack_prompt", false),
        flag("on_topic", true),
        flag("pruned", false),
        text("target_response", true),
        text("error", true),
        flag("refused", true),
        flag("success", true),
        int("score", true),
        flag("judge_verdict", true),
        Field::new("judge_score", DataType::Float64, true),
        flag("backtracked", false),
        text("blocked_by", true),
        Field::new("latency_ms", DataType::Float64, true),
    ]))
}

/// `controls.parquet`: one row per control of a run (`pieval controls`).
pub fn controls_schema() -> SchemaRef {
    let text = |name: &str, nullable: bool| Field::new(name, DataType::Utf8, nullable);
    let int = |name: &str| Field::new(name, DataType::Int64, false);
    let float = |name: &str, nullable: bool| Field::new(name, DataType::Float64, nullable);
    Arc::new(Schema::new(vec![
        text("run_id", false),
        text("control_id", false),
        text("title", false),
        text("status", false),
        text("statistic", false),
        text("comparator", false),
        float("threshold", false),
        float("measured", true),
        int("n"),
        int("k"),
        int("undecided"),
        float("ci_low", true),
        float("ci_high", true),
        int("min_n"),
        text("group_key", true),
        text("groups", false),
        int("evidence_rows"),
        text("evidence_sha256", false),
        text("query_sha256", false),
        text("envelope_sha256", false),
        text("references", false),
        Field::new("signed", DataType::Boolean, false),
        text("key_id", true),
        text("evaluated_at", false),
        // additive: what decided (raw or corrected) and the rate corrected for detector
        // error with its interval (null when the control names no figures)
        text("basis", true),
        float("corrected", true),
        float("corrected_low", true),
        float("corrected_high", true),
        // additive: the deciding group's framework tags (of its evidence rows)
        Field::new("owasp_llm", tags_type(), true),
        Field::new("owasp_agentic", tags_type(), true),
        Field::new("mitre_atlas", tags_type(), true),
        Field::new("nist_ai_600_1", tags_type(), true),
    ]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schemas_follow_the_field_lists() {
        // 20 canonical and 6 enriched columns, then the agentic ones (environment,
        // utility_criteria), then the enriched framework tags, added last so that no
        // column moved
        assert_eq!(attack_case_schema().fields().len(), 22);
        assert_eq!(enriched_case_schema().fields().len(), 32);
        assert_eq!(enriched_case_schema().field(20).name(), "attack_category");
        assert_eq!(enriched_case_schema().field(26).name(), "environment");
        assert_eq!(enriched_case_schema().field(28).name(), "owasp_llm");
        let e = enriched_case_schema();
        assert_eq!(
            e.field_with_name("mitre_atlas").unwrap().data_type(),
            &tags_type()
        );
        assert_eq!(
            case_results_schema()
                .field_with_name("nist_ai_600_1")
                .unwrap()
                .data_type(),
            &tags_type()
        );
        assert_eq!(
            e.field_with_name("mapping_confidence").unwrap().data_type(),
            &DataType::Float64
        );
        assert!(!e.field_with_name("case_id").unwrap().is_nullable());
        assert!(e.field_with_name("notes").unwrap().is_nullable());
        assert_eq!(
            case_results_schema()
                .field_with_name("attack_success")
                .unwrap()
                .data_type(),
            &DataType::Boolean
        );
        assert_eq!(
            findings_schema()
                .field_with_name("span_end")
                .unwrap()
                .data_type(),
            &DataType::Int64
        );
        assert_eq!(predictions_schema().field(0).name(), "case_id");
    }
}
