//! WithSecure spikee seed folders (`datasets/seeds-*/`): `jailbreaks.jsonl` (templates
//! with `<INSTRUCTION>`), `instructions.jsonl` (payloads with their judge:
//! `canary` → the judge argument must appear, `regex` → it must match,
//! `llm_judge_output_criteria` → a judge question), `base_documents.jsonl` (the carrier
//! documents, with an optional placeholder where the payload goes),
//! `standalone_attacks.jsonl` (direct attacks with a canary) and `system_messages.toml`.
//!
//! Cases are spikee's assembly: every document × jailbreak × instruction, the filled
//! jailbreak put at the document's placeholder (or appended at its end), the document
//! as `task_input` (`retrieved_document`), "Summarize the following document." as the
//! user request, and the seed folder's first system message as `context`; plus every
//! standalone attack as a direct (`user_prompt`) case. The jailbreak type →
//! `attack_family`, the instruction type → `attack_subtype`. PATH is a seed folder or a
//! folder of seed folders. License: Apache-2.0.

use std::path::{Path, PathBuf};

use serde_json::{Value, json};

use super::{Emit, Item, Options, SourceInfo, for_each_jsonl, slug};
use crate::contract::criteria::SuccessCriteria;
use crate::contract::enums::{AttackSurface, EvaluationMode};
use crate::error::{Error, Result};

fn seed_dirs(path: &Path) -> Vec<PathBuf> {
    if path.join("jailbreaks.jsonl").is_file() || path.join("standalone_attacks.jsonl").is_file() {
        return vec![path.to_path_buf()];
    }
    let mut out: Vec<PathBuf> = std::fs::read_dir(path)
        .map(|entries| {
            entries
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| {
                    p.join("jailbreaks.jsonl").is_file()
                        || p.join("standalone_attacks.jsonl").is_file()
                })
                .collect()
        })
        .unwrap_or_default();
    out.sort();
    out
}

/// An id part: letters, digits, '.', '_', '-' kept, anything else '-'.
fn id_part(s: &str) -> String {
    s.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') {
                c
            } else {
                '-'
            }
        })
        .collect()
}

/// Ids unique within a seed file: upstream files sometimes repeat one
/// (`seeds-sysmsg-extraction-2025-04/instructions.jsonl` has two `sysmsg-extract-03`);
/// a repeat gets its line number appended, so ids stay stable across runs.
fn unique_id(seen: &mut std::collections::HashSet<String>, id: String, line: u64) -> String {
    if seen.insert(id.clone()) {
        id
    } else {
        let id = format!("{id}-line{line}");
        seen.insert(id.clone());
        id
    }
}

/// The JSON objects of a seed file with their line numbers (none when it is absent).
fn records(file: &Path, opts: &Options, emit: &mut Emit<'_>) -> Result<Vec<(u64, Value)>> {
    let mut out = Vec::new();
    if !file.is_file() {
        return Ok(out);
    }
    let mut bad: Vec<(u64, String)> = Vec::new();
    for_each_jsonl(file, opts.max_line_bytes, &mut |line, v| {
        match v {
            Ok(v) => out.push((line, v)),
            Err(reason) => bad.push((line, reason)),
        }
        Ok(())
    })?;
    for (line, reason) in bad {
        emit(Item::Invalid {
            file: file.to_path_buf(),
            record: line,
            field: None,
            reason,
        })?;
    }
    Ok(out)
}

fn criteria(judge: &str, args: &str) -> Option<(SuccessCriteria, EvaluationMode)> {
    Some(match judge {
        "canary" if !args.is_empty() => (
            SuccessCriteria::Contains {
                value: args.to_owned(),
            },
            EvaluationMode::Automatic,
        ),
        "regex" if !args.is_empty() => (
            SuccessCriteria::Regex {
                value: args.to_owned(),
            },
            EvaluationMode::Automatic,
        ),
        "llm_judge_output_criteria" if !args.is_empty() => (
            SuccessCriteria::Judge {
                question: format!("Does the response meet this criterion: {args}"),
            },
            EvaluationMode::Judge,
        ),
        _ => return None,
    })
}

pub fn ingest(path: &Path, opts: &Options, emit: &mut Emit<'_>) -> Result<()> {
    let dirs = seed_dirs(path);
    if dirs.is_empty() {
        return Err(Error::config(
            path,
            "no spikee seed folder (with jailbreaks.jsonl or standalone_attacks.jsonl)",
        ));
    }
    for dir in dirs {
        seed_folder(&dir, opts, emit)?;
    }
    Ok(())
}

fn seed_folder(dir: &Path, opts: &Options, emit: &mut Emit<'_>) -> Result<()> {
    let seed = dir
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let system = std::fs::read_to_string(dir.join("system_messages.toml"))
        .ok()
        .and_then(|t| t.parse::<toml::Table>().ok())
        .and_then(|t| {
            t.get("configurations")?
                .as_array()?
                .first()?
                .get("system_message")?
                .as_str()
                .map(|s| s.trim().to_owned())
        });
    let jb_file = dir.join("jailbreaks.jsonl");
    let in_file = dir.join("instructions.jsonl");
    let doc_file = dir.join("base_documents.jsonl");
    let info = SourceInfo::new(
        opts,
        "spikee",
        &jb_file,
        "Apache-2.0",
        "pieval ingest spikee",
    );
    let jailbreaks = records(&jb_file, opts, emit)?;
    let instructions = records(&in_file, opts, emit)?;
    let documents = records(&doc_file, opts, emit)?;
    let text = |v: &Value, k: &str| v.get(k).and_then(Value::as_str).map(str::to_owned);
    // Check each seed record once, then combine the good ones.
    let mut good_jb = Vec::new();
    let mut seen = std::collections::HashSet::new();
    for (line, j) in &jailbreaks {
        match (
            text(j, "id").map(|id| unique_id(&mut seen, id, *line)),
            text(j, "text"),
        ) {
            (Some(id), Some(t)) if t.contains("<INSTRUCTION>") => good_jb.push((
                id,
                text(j, "jailbreak_type").unwrap_or_else(|| "unspecified".into()),
                t,
            )),
            (Some(_), Some(_)) => emit(Item::Invalid {
                file: jb_file.clone(),
                record: *line,
                field: Some("text".into()),
                reason: "no <INSTRUCTION> slot".into(),
            })?,
            (None, _) => emit(Item::Invalid {
                file: jb_file.clone(),
                record: *line,
                field: Some("id".into()),
                reason: "missing or not a string".into(),
            })?,
            (_, None) => emit(Item::Invalid {
                file: jb_file.clone(),
                record: *line,
                field: Some("text".into()),
                reason: "missing or not a string".into(),
            })?,
        }
    }
    let mut good_in = Vec::new();
    let mut seen = std::collections::HashSet::new();
    for (line, i) in &instructions {
        let judge = text(i, "judge_name").unwrap_or_default();
        let args = text(i, "judge_args").unwrap_or_default();
        match (
            text(i, "id").map(|id| unique_id(&mut seen, id, *line)),
            text(i, "instruction"),
            criteria(&judge, &args),
        ) {
            (Some(id), Some(ins), Some((c, mode))) => good_in.push((
                id,
                text(i, "instruction_type").unwrap_or_else(|| "unspecified".into()),
                ins,
                c,
                mode,
                args,
            )),
            (None, _, _) => emit(Item::Invalid {
                file: in_file.clone(),
                record: *line,
                field: Some("id".into()),
                reason: "missing or not a string".into(),
            })?,
            (_, None, _) => emit(Item::Invalid {
                file: in_file.clone(),
                record: *line,
                field: Some("instruction".into()),
                reason: "missing or not a string".into(),
            })?,
            (_, _, None) => emit(Item::Invalid {
                file: in_file.clone(),
                record: *line,
                field: Some("judge_name".into()),
                reason: format!(
                    "judge {judge:?} with arguments {args:?} is not one pieval can map (canary, regex, llm_judge_output_criteria)"
                ),
            })?,
        }
    }
    let mut seen = std::collections::HashSet::new();
    for (dline, d) in &documents {
        let (Some(doc_id), Some(document)) = (
            text(d, "id").map(|id| unique_id(&mut seen, id, *dline)),
            text(d, "document"),
        ) else {
            emit(Item::Invalid {
                file: doc_file.clone(),
                record: *dline,
                field: Some("document".into()),
                reason: "missing id or document".into(),
            })?;
            continue;
        };
        let placeholder =
            text(d, "placeholder").filter(|p| !p.is_empty() && document.contains(p.as_str()));
        for (jb_id, jb_type, jb_text) in &good_jb {
            for (in_id, in_type, ins, crit, mode, args) in &good_in {
                let payload = jb_text.replace("<INSTRUCTION>", ins);
                let carrier = match &placeholder {
                    Some(p) => document.replace(p.as_str(), &payload),
                    None => format!("{document}\n{payload}"),
                };
                let mut case = info.case(
                    format!("spikee-{}-{}-{}-{}", id_part(seed.trim_start_matches("seeds-")), id_part(&doc_id), id_part(jb_id), id_part(in_id)),
                    &format!("document={doc_id} jailbreak={jb_id} instruction={in_id}"),
                    &slug(jb_type),
                    AttackSurface::RetrievedDocument,
                    "Summarize the following document.".into(),
                    crit.clone(),
                    json!({"seed_folder": seed, "document": doc_id, "jailbreak": jb_id, "instruction": in_id, "judge": args}),
                );
                case.context = system.clone();
                case.task_input = Some(carrier);
                case.attack_subtype = Some(slug(in_type));
                if *mode == EvaluationMode::Automatic {
                    case.expected_target = Some(args.clone());
                }
                case.evaluation_mode = Some(*mode);
                emit(Item::Case(Box::new(case)))?;
            }
        }
    }
    let sa_file = dir.join("standalone_attacks.jsonl");
    let sa_info = SourceInfo::new(
        opts,
        "spikee",
        &sa_file,
        "Apache-2.0",
        "pieval ingest spikee",
    );
    let mut seen = std::collections::HashSet::new();
    for (line, a) in records(&sa_file, opts, emit)? {
        let judge = text(&a, "judge_name").unwrap_or_else(|| "canary".into());
        let args = text(&a, "judge_args")
            .or_else(|| text(&a, "canary"))
            .unwrap_or_default();
        let (Some(id), Some(t), Some((crit, mode))) = (
            text(&a, "id").map(|id| unique_id(&mut seen, id, line)),
            text(&a, "text"),
            criteria(&judge, &args),
        ) else {
            emit(sa_info.invalid(
                line,
                Some("text"),
                "a standalone attack needs id, text and a canary or judge",
            ))?;
            continue;
        };
        let mut case = sa_info.case(
            format!(
                "spikee-{}-standalone-{}",
                id_part(seed.trim_start_matches("seeds-")),
                id_part(&id)
            ),
            &format!("line={line}"),
            "standalone",
            AttackSurface::UserPrompt,
            t,
            crit,
            json!({"seed_folder": seed, "attack": id}),
        );
        case.context = system.clone();
        if mode == EvaluationMode::Automatic {
            case.expected_target = Some(args);
        }
        case.evaluation_mode = Some(mode);
        emit(Item::Case(Box::new(case)))?;
    }
    Ok(())
}
