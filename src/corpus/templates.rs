//! The template files of `data/templates/` that the generator reads. Every string
//! that varies by language is a `{lang: text}` table; [`Templates::load`] checks that
//! each one covers every configured language, naming the file and entry when not.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::contract::AttackSurface;
use crate::error::{Error, Result};

pub type ByLang = BTreeMap<String, String>;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Manifest {
    pub version: String,
    pub created_at: String,
    pub default_seed: u64,
    pub source_name: String,
    pub license: String,
    pub languages: Vec<LanguageSpec>,
    pub dev_share: f64,
    pub handwritten: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LanguageSpec {
    pub code: String,
    /// How many variants (task/document choices) each attack combination gets.
    pub variants: usize,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Goal {
    pub id: String,
    pub criterion: GoalCriterion,
    #[serde(default)]
    pub token_prefix: Option<String>,
    #[serde(default)]
    pub needs_secret: bool,
    #[serde(default)]
    pub exfil_url: Option<String>,
    pub instruction: ByLang,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum GoalCriterion {
    ContainsTarget,
    Canary,
    MarkdownExfil,
    RefusalBypass,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Transform {
    None,
    Base64,
    Leetspeak,
    Homoglyph,
    ZeroWidth,
    Split,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Strategy {
    pub family: String,
    pub transform: Transform,
    pub text: ByLang,
    /// For `base64` / `split`: the text that is encoded or split into `{payload}`.
    #[serde(default)]
    pub inner: Option<ByLang>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Extraction {
    pub id: String,
    pub text: ByLang,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Task {
    pub id: String,
    pub carriers: Vec<AttackSurface>,
    pub system: ByLang,
    pub request: ByLang,
    pub sample: ByLang,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Carrier {
    pub surface: AttackSurface,
    pub benign: ByLang,
    pub docs: BTreeMap<String, Vec<String>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct GoalsFile {
    goal: Vec<Goal>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct StrategiesFile {
    strategy: Vec<Strategy>,
    extraction: Vec<Extraction>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct TasksFile {
    secret_line: ByLang,
    policy_line: ByLang,
    task: Vec<Task>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct CarriersFile {
    carrier: Vec<Carrier>,
}

/// All templates, checked for completeness.
#[derive(Debug)]
pub struct Templates {
    pub dir: PathBuf,
    pub manifest: Manifest,
    pub goals: Vec<Goal>,
    pub strategies: Vec<Strategy>,
    pub extractions: Vec<Extraction>,
    pub tasks: Vec<Task>,
    pub secret_line: ByLang,
    pub policy_line: ByLang,
    pub carriers: Vec<Carrier>,
}

fn read_toml<T: serde::de::DeserializeOwned>(path: &Path) -> Result<T> {
    let text =
        std::fs::read_to_string(path).map_err(|e| Error::io(path, "cannot read template", e))?;
    toml::from_str(&text)
        .map_err(|e| Error::config(path, e.to_string().trim_end().replace('\n', "\n  ")))
}

impl Templates {
    pub fn load(dir: impl AsRef<Path>) -> Result<Self> {
        let dir = dir.as_ref();
        let manifest: Manifest = read_toml(&dir.join("manifest.toml"))?;
        let goals: GoalsFile = read_toml(&dir.join("goals.toml"))?;
        let strategies: StrategiesFile = read_toml(&dir.join("strategies.toml"))?;
        let tasks: TasksFile = read_toml(&dir.join("tasks.toml"))?;
        let carriers: CarriersFile = read_toml(&dir.join("carriers.toml"))?;
        let t = Templates {
            dir: dir.to_path_buf(),
            manifest,
            goals: goals.goal,
            strategies: strategies.strategy,
            extractions: strategies.extraction,
            tasks: tasks.task,
            secret_line: tasks.secret_line,
            policy_line: tasks.policy_line,
            carriers: carriers.carrier,
        };
        t.check()?;
        Ok(t)
    }

    /// Every language-keyed text covers every configured language; names are unique.
    fn check(&self) -> Result<()> {
        let langs: Vec<&str> = self
            .manifest
            .languages
            .iter()
            .map(|l| l.code.as_str())
            .collect();
        let need = |file: &str, what: String, texts: &ByLang| -> Result<()> {
            for lang in &langs {
                if texts.get(*lang).is_none_or(|t| t.trim().is_empty()) {
                    return Err(Error::config(
                        self.dir.join(file),
                        format!("{what}: no text for language {lang:?}"),
                    ));
                }
            }
            Ok(())
        };
        for g in &self.goals {
            need(
                "goals.toml",
                format!("goal {}: instruction", g.id),
                &g.instruction,
            )?;
            let needs_token = matches!(
                g.criterion,
                GoalCriterion::ContainsTarget | GoalCriterion::RefusalBypass
            );
            if needs_token && g.token_prefix.is_none() {
                return Err(Error::config(
                    self.dir.join("goals.toml"),
                    format!("goal {}: token_prefix is required", g.id),
                ));
            }
            if g.criterion == GoalCriterion::MarkdownExfil && g.exfil_url.is_none() {
                return Err(Error::config(
                    self.dir.join("goals.toml"),
                    format!("goal {}: exfil_url is required", g.id),
                ));
            }
        }
        for s in &self.strategies {
            need(
                "strategies.toml",
                format!("strategy {}: text", s.family),
                &s.text,
            )?;
            match (&s.inner, s.transform) {
                (Some(inner), Transform::Base64 | Transform::Split) => need(
                    "strategies.toml",
                    format!("strategy {}: inner", s.family),
                    inner,
                )?,
                (None, Transform::Base64 | Transform::Split) => {
                    return Err(Error::config(
                        self.dir.join("strategies.toml"),
                        format!(
                            "strategy {}: transform {:?} needs `inner`",
                            s.family, s.transform
                        ),
                    ));
                }
                _ => {}
            }
        }
        for x in &self.extractions {
            need(
                "strategies.toml",
                format!("extraction {}: text", x.id),
                &x.text,
            )?;
        }
        need("tasks.toml", "secret_line".into(), &self.secret_line)?;
        need("tasks.toml", "policy_line".into(), &self.policy_line)?;
        for t in &self.tasks {
            need("tasks.toml", format!("task {}: system", t.id), &t.system)?;
            need("tasks.toml", format!("task {}: request", t.id), &t.request)?;
            need("tasks.toml", format!("task {}: sample", t.id), &t.sample)?;
            if let Some(bad) = t.carriers.iter().find(|c| !c.is_indirect()) {
                return Err(Error::config(
                    self.dir.join("tasks.toml"),
                    format!("task {}: {bad} is not a carrier surface", t.id),
                ));
            }
        }
        for c in &self.carriers {
            need(
                "carriers.toml",
                format!("carrier {}: benign", c.surface),
                &c.benign,
            )?;
            for lang in &langs {
                let docs = c.docs.get(*lang).map(Vec::as_slice).unwrap_or_default();
                if docs.is_empty() || docs.iter().any(|d| !d.contains("{injection}")) {
                    return Err(Error::config(
                        self.dir.join("carriers.toml"),
                        format!(
                            "carrier {}: language {lang:?} needs documents, each with an {{injection}} marker",
                            c.surface
                        ),
                    ));
                }
            }
        }
        Ok(())
    }
}
