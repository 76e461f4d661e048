//! `pieval detectors train-injection`: pieval's injection model
//! (crates/pieval-detect/src/model.rs) trained on the labelled texts of one split
//! (`data/labels/guardrail.jsonl`, dev), reproducibly: the same labels give the same
//! bytes. Its threshold is chosen without the test split: five-fold cross-validation over
//! the training split (each text scored by a model trained on the four folds it is not
//! in; a text's fold is fixed by its id's hash), the lowest score at which at most
//! `max_fpr` of those held-out benign texts are flagged. (Holding out whole sources
//! instead leaves no benign document to train on when the one source of them is held
//! out: every held-out benign document then scores as an injection.)
//!
//! The split is augmented with paired tool outputs made of its own texts
//! ([`paired_tool_outputs`]). Writes `injection-model.bin` (the weights; compiled into
//! pieval, in the rule packs' digest) and `injection-model.toml` (how it was made, and the
//! held-out figures).

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use serde::Serialize;
use sha2::Digest as _;

use crate::detect::model::{Example, Model, TrainOptions, example, role_index, train};
use crate::error::{Error, Result};
use crate::guard::items::{Item, SplitChoice, from_labels};

pub const MODEL_FILE: &str = "injection-model.bin";
pub const CARD_FILE: &str = "injection-model.toml";

/// What a training made, as `injection-model.toml` records it.
#[derive(Debug, Serialize)]
pub struct Card {
    pub labels: String,
    pub labels_sha256: String,
    pub split: String,
    pub rows: usize,
    /// Paired tool outputs made from the split's texts (each pair: clean and injected).
    pub augmented_pairs: usize,
    pub positives: usize,
    pub negatives: usize,
    pub bits: u32,
    pub epochs: u32,
    pub learning_rate: f64,
    pub l2: f64,
    pub seed: u64,
    pub max_fpr: f64,
    pub threshold: f32,
    pub threshold_rule: String,
    /// Held-out (cross-validated) recall and FPR at the threshold, per source too.
    pub held_out_recall: f64,
    pub held_out_fpr: f64,
    pub held_out_by_source: BTreeMap<String, String>,
    pub model_sha256: String,
}

/// Train on `labels`' rows of `split`; the model (threshold set) and its card.
pub fn fit(
    labels: &Path,
    split: SplitChoice,
    max_fpr: f64,
    opt: &TrainOptions,
) -> Result<(Model, Card)> {
    if !(0.0..1.0).contains(&max_fpr) {
        return Err(Error::Usage(format!(
            "--max-fpr {max_fpr}: between 0 and 1"
        )));
    }
    let mut seen = HashMap::new();
    let items: Vec<Item> = from_labels(labels, split, &mut seen)?;
    if items.iter().all(|i| i.label) || items.iter().all(|i| !i.label) {
        return Err(Error::Usage(format!(
            "{}: the {split:?} rows need both labels to train on",
            labels.display()
        )));
    }
    // paired carriers, from the split's own texts (see [`paired_tool_outputs`])
    let mut items = items;
    let pairs = paired_tool_outputs(&items);
    let augmented_pairs = pairs.len() / 2;
    items.extend(pairs);
    let pack = crate::detect::rules::RulePack::default_pack();
    let examples: Vec<Example> = items
        .iter()
        .map(|i| {
            example(
                &i.text,
                role_index(Some(i.role.as_str())),
                i.label,
                pack,
                opt.bits,
            )
        })
        .collect();
    // five folds, by the hash of each text's id
    const FOLDS: u64 = 5;
    let fold_of: Vec<u64> = items
        .iter()
        .map(|i| {
            let d = sha2::Sha256::digest(i.item_id.as_bytes());
            u64::from_le_bytes(d[..8].try_into().expect("8 bytes")) % FOLDS
        })
        .collect();
    let mut held_out = vec![0.0f64; items.len()];
    for fold in 0..FOLDS {
        let train_on: Vec<Example> = examples
            .iter()
            .zip(&fold_of)
            .filter(|(_, f)| **f != fold)
            .map(|(e, _)| e.clone())
            .collect();
        let m = train(&train_on, opt);
        for (k, e) in examples.iter().enumerate() {
            if fold_of[k] == fold {
                held_out[k] = m.score_example(e);
            }
        }
    }
    let mut sources: Vec<&str> = items.iter().map(|i| i.source.as_str()).collect();
    sources.sort_unstable();
    sources.dedup();
    // the lowest threshold at which at most max_fpr of the held-out benign texts are flagged
    let mut neg: Vec<f64> = items
        .iter()
        .zip(&held_out)
        .filter(|(i, _)| !i.label)
        .map(|(_, s)| *s)
        .collect();
    neg.sort_by(|a, b| b.total_cmp(a));
    let allowed = (max_fpr * neg.len() as f64 + 1e-9).floor() as usize;
    let threshold = match neg.get(allowed) {
        // just above the first benign text that must not be flagged
        Some(s) => next_up(*s as f32),
        None => 0.0,
    };
    let flagged = |s: f64| s as f32 >= threshold;
    let count = |f: &dyn Fn(&Item, f64) -> bool| {
        items
            .iter()
            .zip(&held_out)
            .filter(|(i, s)| f(i, **s))
            .count()
    };
    let positives = items.iter().filter(|i| i.label).count();
    let negatives = items.len() - positives;
    let tp = count(&|i, s| i.label && flagged(s));
    let fp = count(&|i, s| !i.label && flagged(s));
    let mut by_source = BTreeMap::new();
    for s in &sources {
        let here: Vec<(bool, f64)> = items
            .iter()
            .zip(&held_out)
            .filter(|(i, _)| i.source == *s)
            .map(|(i, x)| (i.label, *x))
            .collect();
        let p = here.iter().filter(|x| x.0).count();
        let caught = here.iter().filter(|x| x.0 && flagged(x.1)).count();
        let n = here.len() - p;
        let alarms = here.iter().filter(|x| !x.0 && flagged(x.1)).count();
        by_source.insert(
            (*s).to_owned(),
            format!("injections flagged {caught}/{p}, benign flagged {alarms}/{n}"),
        );
    }
    let mut model = train(&examples, opt);
    model.threshold = threshold;
    let bytes = model.to_bytes();
    let card = Card {
        labels: labels.display().to_string(),
        labels_sha256: crate::digest::sha256_file(labels)?,
        split: format!("{split:?}").to_lowercase(),
        rows: items.len(),
        augmented_pairs,
        positives,
        negatives,
        bits: opt.bits,
        epochs: opt.epochs,
        learning_rate: opt.learning_rate,
        l2: opt.l2,
        seed: opt.seed,
        max_fpr,
        threshold,
        threshold_rule: format!(
            "five-fold cross-validated scores on the {} rows (folds by the hash of each id): the lowest score at which at most {:.0}% of the benign texts are flagged",
            format!("{split:?}").to_lowercase(),
            max_fpr * 100.0
        ),
        held_out_recall: tp as f64 / positives as f64,
        held_out_fpr: fp as f64 / negatives as f64,
        held_out_by_source: by_source,
        model_sha256: crate::digest::sha256_hex(&bytes),
    };
    Ok((model, card))
}

/// The smallest f32 above `x`.
fn next_up(x: f32) -> f32 {
    if x.is_nan() || x == f32::INFINITY {
        return x;
    }
    let bits = x.to_bits();
    if x == 0.0 {
        return f32::from_bits(1);
    }
    f32::from_bits(if x > 0.0 { bits + 1 } else { bits - 1 })
}

/// Write the model and its card into `dir`; their paths.
pub fn write(dir: &Path, model: &Model, card: &Card) -> Result<(PathBuf, PathBuf)> {
    std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, "cannot create folder", e))?;
    let bin = dir.join(MODEL_FILE);
    let mut f = crate::atomic::TempFile::create(&bin)?;
    use std::io::Write as _;
    f.write_all(&model.to_bytes())
        .map_err(|e| Error::io(&bin, "cannot write", e))?;
    f.commit()?;
    let toml_path = dir.join(CARD_FILE);
    let text =
        toml::to_string(card).map_err(|e| Error::Internal(format!("the model card: {e}")))?;
    crate::atomic::write_lines(
        &toml_path,
        [format!(
            "# pieval's injection model (crates/pieval-detect/src/model.rs), made by\n# `pieval detectors train-injection`: do not edit; train again.\n{text}"
        )],
    )?;
    Ok((bin, toml_path))
}

/// Paired carriers made from the training split's own texts: each benign document (a
/// text in a data role) twice, as a tool output — once as it is, once with a request
/// inserted after its first sentence (an AgentDojo user task or a BIPIA attack instruction
/// of the same split, picked by the hash of the document's id) — half of them wrapped in a
/// JSON result object. The carrier is then no clue to the label: the inserted request is.
/// This is what the test split's tool-output injections look like (InjecAgent's and
/// AgentDojo's: a user-task-like request inside a tool's answer), which the dev split
/// otherwise lacks, and what InjecGuard's over-defence mitigation argues for (benign and
/// injected texts that share their trigger-free context; Li et al. 2024).
fn paired_tool_outputs(items: &[Item]) -> Vec<Item> {
    use crate::guard::items::Role;
    let carriers: Vec<&Item> = items
        .iter()
        .filter(|i| !i.label && i.role != Role::UserPrompt)
        .collect();
    let requests: Vec<&Item> = items
        .iter()
        .filter(|i| i.source == "agentdojo-user-task" || i.source == "bipia-attack")
        .collect();
    let mut out = Vec::new();
    if requests.is_empty() {
        return out;
    }
    for (k, c) in carriers.iter().enumerate() {
        let d = sha2::Sha256::digest(c.item_id.as_bytes());
        let pick = u64::from_le_bytes(d[..8].try_into().expect("8 bytes")) % requests.len() as u64;
        let r = requests[pick as usize];
        let cut = c.text.find(". ").map_or(c.text.len(), |i| i + 2);
        let injected = format!("{}{} {}", &c.text[..cut], r.text.trim(), &c.text[cut..]);
        let wrap = |t: &str| {
            if k % 2 == 0 {
                serde_json::json!({"result": {"content": t, "status": "ok"}}).to_string()
            } else {
                t.to_owned()
            }
        };
        for (text, label) in [(wrap(&injected), true), (wrap(&c.text), false)] {
            out.push(Item {
                item_id: format!("aug:{}:{label}", c.item_id),
                text,
                role: Role::ToolOutput,
                label,
                hard_benign: false,
                form: "augmented".into(),
                converter: None,
                family: None,
                surface: None,
                language: None,
                source: "augmented-tool-output".into(),
                split: None,
                case_id: None,
            });
        }
    }
    out
}
