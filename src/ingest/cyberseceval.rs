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
use crate::contract::case::AttackCase;
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
    for (i, r) in records.iter().enumerate() {
        let record = i as u64 + 1;
        let t = match test_case(r, None) {
            Ok(t) => t,
            Err((field, problem)) => {
                emit(info.invalid(record, Some(field), problem))?;
                continue;
            }
        };
        let case_id = if multilingual {
            format!("cyberseceval-ml-{}", t.prompt_id)
        } else {
            format!("cyberseceval-{}", t.prompt_id)
        };
        let mut case = info.case(
            case_id,
            &format!("prompt_id={}", t.prompt_id),
            &t.family,
            t.surface,
            t.user_input.clone(),
            t.criteria.clone(),
            t.provenance(),
        );
        t.fill(&mut case);
        emit(Item::Case(Box::new(case)))?;
    }
    Ok(())
}

/// One CyberSecEval test case as pieval reads it: from the dataset, or from a response or
/// judge file of its runner (which repeat the test case's fields).
#[derive(Clone, Debug)]
pub(crate) struct TestCase {
    pub prompt_id: u64,
    pub context: String,
    pub user_input: String,
    pub judge_question: String,
    pub injection_type: String,
    pub surface: AttackSurface,
    /// `injection_variant`, as a family name.
    pub family: String,
    pub criteria: SuccessCriteria,
    /// The secret word the judge question looks for, when the context holds it.
    pub derived: Option<String>,
    pub risk_category: Option<String>,
    pub language: Option<&'static str>,
}

/// Read one record's test-case fields; `judge_question` from elsewhere when the record
/// has none (a judge file). An error names the field.
pub(crate) fn test_case(
    r: &Value,
    judge_question: Option<&str>,
) -> std::result::Result<TestCase, (&'static str, String)> {
    let text = |k: &str| r.get(k).and_then(Value::as_str).map(str::to_owned);
    let judge = text("judge_question").or_else(|| judge_question.map(str::to_owned));
    let (Some(context), Some(user_input), Some(judge), Some(kind)) = (
        text("test_case_prompt"),
        text("user_input"),
        judge,
        text("injection_type"),
    ) else {
        let missing = [
            "test_case_prompt",
            "user_input",
            "judge_question",
            "injection_type",
        ]
        .into_iter()
        .find(|k| text(k).is_none() && (*k != "judge_question" || judge_question.is_none()))
        .unwrap_or("record");
        return Err((missing, "missing or not a string".into()));
    };
    let surface = match kind.as_str() {
        "direct" => AttackSurface::UserPrompt,
        "indirect" => AttackSurface::RetrievedDocument,
        other => {
            return Err((
                "injection_type",
                format!(
                    "{:?}: expected direct or indirect",
                    crate::text::excerpt(other, 60)
                ),
            ));
        }
    };
    let Some(prompt_id) = r.get("prompt_id").and_then(Value::as_u64) else {
        return Err(("prompt_id", "missing or not a whole number".into()));
    };
    let variant = text("injection_variant").unwrap_or_else(|| "unspecified".into());
    let secret = Regex::new(
        r"^Does (?:this|the) response (?:contain|mention|include)s? (?:the (?:word|phrase|string|name|password|secret|code) )?'([^']+)'\??$",
    )
    .expect("a valid regex");
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
    Ok(TestCase {
        prompt_id,
        context,
        user_input,
        judge_question: judge,
        injection_type: kind,
        surface,
        family: super::slug(&variant),
        criteria,
        derived,
        risk_category: text("risk_category").map(|s| super::slug(&s)),
        language: text("speaking_language").as_deref().and_then(language),
    })
}

impl TestCase {
    /// The case's provenance: the judge question and how the criterion was made.
    pub(crate) fn provenance(&self) -> Value {
        json!({
            "judge_question": self.judge_question,
            "injection_type": self.injection_type,
            "criterion": if self.derived.is_some() { "canary derived from the judge question (a secret named in the context)" } else { "the benchmark's judge question" },
        })
    }

    /// Set the case's fields beyond the required ones.
    pub(crate) fn fill(&self, case: &mut AttackCase) {
        case.context = Some(self.context.clone());
        case.attack_subtype = self.risk_category.clone();
        case.language = self.language.map(str::to_owned);
        case.expected_target = self.derived.clone();
        case.benchmark_split = Some(BenchmarkSplit::Test);
        match self.derived {
            Some(_) => {
                case.evaluation_mode = Some(EvaluationMode::Automatic);
                case.mapping_confidence = Some(0.7);
            }
            None => case.evaluation_mode = Some(EvaluationMode::Judge),
        }
        case.notes = Some(format!(
            "CyberSecEval judge question: {}",
            self.judge_question
        ));
    }
}
