//! The texts a guardrail is given (*items*): expanded from the selected cases and from
//! labelled files, in a fixed order, then through the converter pipelines (evasions).
//! The list is written once, before the first call, to `guard_items.jsonl`; a resumed run
//! reads it back, so a translation made for an evasion is not made again.

use std::collections::HashMap;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::attack::convert::{Ctx, Pipeline};
use crate::attack::payload::{locate, target};
use crate::contract::case::AttackCase;
use crate::contract::enums::{AttackSurface, Label};
use crate::error::{Error, Result};

/// Which texts of a case are given.
#[derive(Clone, Copy, Debug, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Form {
    /// An attack's payload alone (`crate::attack::payload::locate`).
    Payload,
    /// The untrusted text that carries it: the document, e-mail, page or tool output of
    /// an indirect case (not given when it is the payload itself).
    Carried,
    /// A benign control's prompt, and its document when it has one.
    Benign,
}

impl Form {
    pub fn as_str(self) -> &'static str {
        match self {
            Form::Payload => "payload",
            Form::Carried => "carried",
            Form::Benign => "benign",
        }
    }
}

/// Which rows of a labelled file.
#[derive(Clone, Copy, Debug, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum SplitChoice {
    #[default]
    Test,
    Dev,
    All,
}

/// Where a text reaches the model, as a guardrail is told.
#[derive(Clone, Copy, Debug, Deserialize, Serialize, PartialEq, Eq, Hash)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    UserPrompt,
    RetrievedDocument,
    ToolOutput,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::UserPrompt => "user_prompt",
            Role::RetrievedDocument => "retrieved_document",
            Role::ToolOutput => "tool_output",
        }
    }

    /// The role of a case's untrusted text.
    fn of(surface: AttackSurface, untrusted: bool) -> Role {
        match surface {
            AttackSurface::ToolOutput if untrusted => Role::ToolOutput,
            s if untrusted && s.is_indirect() => Role::RetrievedDocument,
            _ => Role::UserPrompt,
        }
    }
}

/// One text given to the guardrail.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Item {
    pub item_id: String,
    pub text: String,
    pub role: Role,
    /// True: the text carries an injection (the guardrail should flag it).
    pub label: bool,
    /// A benign text full of injection trigger words (NotInject's over-defence set).
    pub hard_benign: bool,
    /// `payload`, `carried`, `benign` or `labelled`.
    pub form: String,
    /// The converter pipeline's label (an evasion), or none.
    pub converter: Option<String>,
    pub family: Option<String>,
    /// The case's attack surface, or a labelled text's carrier.
    pub surface: Option<String>,
    pub language: Option<String>,
    pub source: String,
    pub split: Option<String>,
    /// The corpus case it comes from.
    pub case_id: Option<String>,
}

/// Every item of the selected cases, in case order and form order.
pub fn from_cases(cases: &[AttackCase], forms: &[super::items::Form]) -> Vec<Item> {
    let mut out = Vec::new();
    let wants = |f: Form| forms.contains(&f);
    for c in cases {
        let base = |id: String, text: &str, role: Role, label: bool, form: Form| Item {
            item_id: id,
            text: text.to_owned(),
            role,
            label,
            hard_benign: false,
            form: form.as_str().to_owned(),
            converter: None,
            family: Some(c.attack_family.clone()),
            surface: Some(c.attack_surface.as_str().to_owned()),
            language: c.language.clone(),
            source: c.source_name.clone(),
            split: c.benchmark_split.map(|s| s.as_str().to_owned()),
            case_id: Some(c.case_id.clone()),
        };
        if c.label == Some(Label::Benign) {
            if !wants(Form::Benign) {
                continue;
            }
            if !c.prompt.trim().is_empty() {
                out.push(base(
                    format!("{}:benign", c.case_id),
                    &c.prompt,
                    Role::UserPrompt,
                    false,
                    Form::Benign,
                ));
            }
            if let Some(doc) = c.task_input.as_deref().filter(|t| !t.trim().is_empty()) {
                out.push(base(
                    format!("{}:benign-document", c.case_id),
                    doc,
                    Role::of(c.attack_surface, true),
                    false,
                    Form::Benign,
                ));
            }
            continue;
        }
        let located = locate(c);
        let indirect = c.attack_surface.is_indirect() && c.task_input.is_some();
        let role = Role::of(c.attack_surface, indirect);
        let payload = located.text(c);
        let carrier = if indirect {
            c.task_input.as_deref().unwrap_or_default()
        } else {
            c.prompt.as_str()
        };
        if wants(Form::Payload) && !payload.trim().is_empty() {
            out.push(base(
                format!("{}:payload", c.case_id),
                payload,
                role,
                true,
                Form::Payload,
            ));
        }
        if wants(Form::Carried) && carrier.trim() != payload.trim() {
            out.push(base(
                format!("{}:carried", c.case_id),
                carrier,
                role,
                true,
                Form::Carried,
            ));
        }
    }
    out
}

/// One row of a labelled file (`data/labels/guardrail.jsonl`).
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct LabelRow {
    id: String,
    text: String,
    label: bool,
    role: Role,
    #[serde(default)]
    carrier: Option<String>,
    #[serde(default)]
    language: Option<String>,
    #[serde(default)]
    hard_benign: bool,
    #[serde(default)]
    family: Option<String>,
    source: String,
    split: String,
    #[serde(default)]
    #[allow(dead_code)]
    license: Option<String>,
}

/// The rows of a labelled file in `split`. Every line must be a row: an error names the
/// file, the line and the field; an id twice (in this file or an earlier one, `seen`) is
/// an error.
pub fn from_labels(
    path: &Path,
    split: SplitChoice,
    seen: &mut HashMap<String, String>,
) -> Result<Vec<Item>> {
    let mut out = Vec::new();
    super::each_line(path, super::MAX_LINE_BYTES, |l| {
        let n = l.number;
        let line = std::str::from_utf8(l.bytes)
            .map_err(|_| Error::input(path, n, None, "the line is not valid UTF-8"))?;
        let de = &mut serde_json::Deserializer::from_str(line);
        let row: LabelRow = serde_path_to_error::deserialize(de).map_err(|e| {
            let field = e.path().to_string();
            let field = (field != "." && !field.is_empty()).then_some(field);
            Error::input(path, n, field.as_deref(), e.into_inner().to_string())
        })?;
        if row.id.trim().is_empty() {
            return Err(Error::input(path, n, Some("id"), "must not be empty"));
        }
        if row.text.is_empty() {
            return Err(Error::input(path, n, Some("text"), "must not be empty"));
        }
        if row.hard_benign && row.label {
            return Err(Error::input(
                path,
                n,
                Some("hard_benign"),
                "a hard-benign text is benign: its label must be false",
            ));
        }
        let here = format!("{}:{n}", path.display());
        if let Some(first) = seen.insert(row.id.clone(), here) {
            return Err(Error::input(
                path,
                n,
                Some("id"),
                format!("{:?} is given twice (first at {first})", row.id),
            ));
        }
        let keep = match split {
            SplitChoice::All => true,
            SplitChoice::Test => row.split == "test",
            SplitChoice::Dev => row.split == "dev",
        };
        if keep {
            out.push(Item {
                item_id: row.id,
                text: row.text,
                role: row.role,
                label: row.label,
                hard_benign: row.hard_benign,
                form: "labelled".into(),
                converter: None,
                family: row.family,
                surface: row.carrier.filter(|c| c != "none"),
                language: row.language,
                source: row.source,
                split: Some(row.split),
                case_id: None,
            });
        }
        Ok(true)
    })?;
    Ok(out)
}

/// The evasions of the positives: each positive through each pipeline (each variant), in
/// item order then pipeline order. A case's payload is converted where it is (inside its
/// carrier, for `carried`); a labelled text is converted whole. `translated` gives the
/// translator's output for (item id, pipeline index, variant) when a pipeline
/// translates (the runner fills it; a dry run leaves the text untranslated).
pub fn evasions(
    items: &[Item],
    cases: &[AttackCase],
    pipelines: &[Pipeline],
    seed: u64,
    translated: &HashMap<(String, usize, u64), String>,
) -> Vec<Item> {
    let by_id: HashMap<&str, &AttackCase> = cases.iter().map(|c| (c.case_id.as_str(), c)).collect();
    let mut out = Vec::new();
    for item in items.iter().filter(|i| i.label) {
        let case = item
            .case_id
            .as_deref()
            .and_then(|id| by_id.get(id).copied());
        for (pi, p) in pipelines.iter().enumerate() {
            let n = p.variants() as u64;
            for variant in 0..n {
                let ctx = Ctx {
                    seed,
                    case_id: &item.item_id,
                    variant,
                    target: case.and_then(target),
                };
                let convert = |text: &str| -> String {
                    let (before, after) = p.split_at_translate();
                    let t = before.apply(text, &ctx);
                    match (after, translated.get(&(item.item_id.clone(), pi, variant))) {
                        (Some(after), Some(tr)) => after.apply(tr.trim(), &ctx),
                        (Some(after), None) => after.apply(&t, &ctx),
                        (None, _) => t,
                    }
                };
                let text = match (item.form.as_str(), case) {
                    ("carried", Some(c)) => {
                        let located = locate(c);
                        let converted = convert(located.text(c));
                        let replaced = located.replace(c, &converted);
                        match located.field {
                            crate::attack::payload::Field::Prompt => replaced.prompt,
                            crate::attack::payload::Field::TaskInput => {
                                replaced.task_input.unwrap_or_default()
                            }
                        }
                    }
                    _ => convert(&item.text),
                };
                let label = p.label();
                let id = if n > 1 {
                    format!("{}|{label}#{variant}", item.item_id)
                } else {
                    format!("{}|{label}", item.item_id)
                };
                out.push(Item {
                    item_id: id,
                    text,
                    converter: Some(label),
                    ..item.clone()
                });
            }
        }
    }
    out
}

/// The text a translating pipeline gives the translator for an item (the steps before
/// its translate step applied), with the language; `None` for a pipeline that does not
/// translate.
pub fn translation_input(
    item: &Item,
    cases: &[AttackCase],
    p: &Pipeline,
    seed: u64,
    variant: u64,
) -> Option<(String, String, Option<String>)> {
    let language = p.translation()?.to_owned();
    let case = item
        .case_id
        .as_deref()
        .and_then(|id| cases.iter().find(|c| c.case_id == id));
    let ctx = Ctx {
        seed,
        case_id: &item.item_id,
        variant,
        target: case.and_then(target),
    };
    let text = match (item.form.as_str(), case) {
        ("carried", Some(c)) => locate(c).text(c).to_owned(),
        _ => item.text.clone(),
    };
    let (before, _) = p.split_at_translate();
    Some((
        before.apply(&text, &ctx),
        language,
        case.and_then(target).map(str::to_owned),
    ))
}
