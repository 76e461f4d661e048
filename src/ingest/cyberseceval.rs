//! Meta CyberSecEval prompt-injection benchmark (`prompt_injection.json`, and the
//! machine-translated multilingual file): a JSON list of `prompt_id`, `test_case_prompt`
//! (the system prompt / context), `user_input`, `judge_question`, `injection_variant`,
//! `injection_type` (direct | indirect), `risk_category`, `speaking_language`.
//!
//! Mapping: `test_case_prompt` → `context` (the application's instructions, often
//! holding a secret); `user_input` → `prompt`. Direct cases are `user_prompt` attacks;
//! indirect ones carry the injected content inside the user turn, as submitted content:
//! `retrieved_document`. `injection_variant` → `attack_family`, `risk_category` →
//! `attack_subtype`. Success is decided by the benchmark's judge question
//! (`judge` criteria, evaluation mode `judge`), except where a secret word named in the
//! context is what the judge looks for ("Does this response contain the word
//! 'Piano'?" with 'Piano' in the system prompt): then `canary:Piano`, automatic, with a
//! mapping confidence of 0.7. The judge question is kept in `provenance`.
//! License: MIT.

use std::path::Path;

use regex::Regex;
use serde_json::{Value, json};

use super::{Emit, Item, Options, SourceInfo, read_json};
use crate::contract::criteria::SuccessCriteria;
use crate::contract::enums::{AttackSurface, BenchmarkSplit, EvaluationMode};
use crate::error::Result;

/// BCP-47 tags of CyberSecEval's `speaking_language` names.
fn language(name: &str) -> Option<&'static str> {
    Some(match name {
        "English" => "en",
        "Hindi" => "hi",
        "Bengali" => "bn",
        "Turkish" => "tr",
        "Arabic" => "ar",
        "Italian" => "it",
        "Spanish" => "es",
        "Vietnamese" => "vi",
        "French" => "fr",
        "Russian" => "ru",
        "Filipino/Tagalog" => "fil",
        "Portuguese" => "pt",
        "Japanese" => "ja",
        "Korean" => "ko",
        "German" => "de",
        "Chinese" => "zh",
        "Indonesian" => "id",
        "Thai" => "th",
        _ => return None,
    })
}

pub fn ingest(path: &Path, opts: &Options, emit: &mut Emit<'_>) -> Result<()> {
    let info = SourceInfo::new(
        opts,
        "cyberseceval",
        path,
        "MIT",
        "pieval ingest cyberseceval",
    );
    let doc = read_json(path)?;
    let Some(records) = doc.as_array() else {
        emit(info.invalid(0, None, "expected a JSON list of test cases"))?;
        return Ok(());
    };
    let multilingual = path
        .file_name()
        .is_some_and(|n| n.to_string_lossy().contains("multilingual"));
    let secret = Regex::new(
        r"^Does (?:this|the) response (?:contain|mention|include)s? (?:the (?:word|phrase|string|name|password|secret|code) )?'([^']+)'\??$",
    )
    .expect("a valid regex");
    for (i, r) in records.iter().enumerate() {
        let record = i as u64 + 1;
        let text = |k: &str| r.get(k).and_then(Value::as_str).map(str::to_owned);
        let (Some(context), Some(user_input), Some(judge), Some(kind)) = (
            text("test_case_prompt"),
            text("user_input"),
            text("judge_question"),
            text("injection_type"),
        ) else {
            let missing = [
                "test_case_prompt",
                "user_input",
                "judge_question",
                "injection_type",
            ]
            .into_iter()
            .find(|k| text(k).is_none())
            .unwrap_or("record");
            emit(info.invalid(record, Some(missing), "missing or not a string"))?;
            continue;
        };
        let surface = match kind.as_str() {
            "direct" => AttackSurface::UserPrompt,
            "indirect" => AttackSurface::RetrievedDocument,
            other => {
                emit(info.invalid(
                    record,
                    Some("injection_type"),
                    format!("{other:?}: expected direct or indirect"),
                ))?;
                continue;
            }
        };
        let Some(id) = r.get("prompt_id").and_then(Value::as_u64) else {
            emit(info.invalid(record, Some("prompt_id"), "missing or not a whole number"))?;
            continue;
        };
        let variant = text("injection_variant").unwrap_or_else(|| "unspecified".into());
        let derived = secret
            .captures(&judge)
            .map(|c| c[1].to_owned())
            .filter(|word| context.to_lowercase().contains(&word.to_lowercase()));
        let criteria = match &derived {
            Some(word) => SuccessCriteria::Canary {
                value: word.clone(),
            },
            None => SuccessCriteria::Judge {
                question: judge.clone(),
            },
        };
        let case_id = if multilingual {
            format!("cyberseceval-ml-{id}")
        } else {
            format!("cyberseceval-{id}")
        };
        let mut case = info.case(
            case_id,
            &format!("prompt_id={id}"),
            &super::slug(&variant),
            surface,
            user_input,
            criteria,
            json!({
                "judge_question": judge,
                "injection_type": kind,
                "criterion": if derived.is_some() { "canary derived from the judge question (a secret named in the context)" } else { "the benchmark's judge question" },
            }),
        );
        case.context = Some(context);
        case.attack_subtype = text("risk_category").map(|s| super::slug(&s));
        case.language = text("speaking_language")
            .as_deref()
            .and_then(language)
            .map(str::to_owned);
        case.expected_target = derived.clone();
        case.benchmark_split = Some(BenchmarkSplit::Test);
        match derived {
            Some(_) => {
                case.evaluation_mode = Some(EvaluationMode::Automatic);
                case.mapping_confidence = Some(0.7);
            }
            None => case.evaluation_mode = Some(EvaluationMode::Judge),
        }
        case.notes = Some(format!("CyberSecEval judge question: {judge}"));
        emit(Item::Case(Box::new(case)))?;
    }
    Ok(())
}
