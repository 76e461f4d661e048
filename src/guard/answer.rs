//! What a guardrail answered, read from its answer: flagged or not, a score, a category
//! (`guardrail.answer`, docs/guardrails.md).
//!
//! A mapping names JSONPaths (RFC 9535, `serde_json_path`) into the answer:
//! - `flagged`: one or more paths; the text is flagged when any node they find is `true`.
//!   Every node found must be a boolean, and at least one must be found;
//! - `invert`: the paths name a "the text is fine" flag (LLM Guard's `is_valid`);
//! - `score`: a path to a number; `score_range` (default `[0, 1]`) is where it must lie,
//!   and it is rescaled to 0..1 (higher: more likely an injection);
//! - `threshold`: without `flagged`, flagged = score ≥ threshold;
//! - `category`: a path to a string (the first found), or `category_max_of`: a path to
//!   an object of scores whose highest key is the category (LLM Guard's `scanners`);
//! - `flagged_regex` with `text`: flagged when the regex matches the text at that path
//!   (a server that answers with a refusal message rather than a verdict).
//!
//! **A hostile answer is an error on that text, never "not flagged"**: a body that is not
//! JSON, a path that finds nothing, a flag that is not a boolean (`"true"` is a string), a
//! score that is not a finite number in its range. JSON has no NaN: a `NaN` token is not
//! JSON, and is refused as such.
//!
//! Presets give the documented answer shapes of four guardrails: `lakera` (Lakera Guard
//! v2, `POST /v2/guard`), `azure_prompt_shields` (Azure AI Content Safety
//! `text:shieldPrompt`), `llm_guard_api` (LLM Guard API, `POST /analyze/prompt`) and
//! `nemo_guardrails` (a NeMo Guardrails server's `/v1/chat/completions` with the
//! activated rails logged). A preset's fields can be overridden one by one.

use serde::{Deserialize, Serialize};
use serde_json::Value;
use serde_json_path::JsonPath;

/// `guardrail.answer` as written.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct AnswerSection {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preset: Option<Preset>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub flagged: Option<OneOrMany>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub invert: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub score: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub score_range: Option<[f64; 2]>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub threshold: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub category: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub category_max_of: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub flagged_regex: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
}

#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(untagged)]
pub enum OneOrMany {
    One(String),
    Many(Vec<String>),
}

impl OneOrMany {
    fn paths(&self) -> Vec<String> {
        match self {
            OneOrMany::One(s) => vec![s.clone()],
            OneOrMany::Many(v) => v.clone(),
        }
    }
}

#[derive(Clone, Copy, Debug, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Preset {
    Lakera,
    AzurePromptShields,
    LlmGuardApi,
    NemoGuardrails,
}

impl Preset {
    pub const ALL: [Preset; 4] = [
        Preset::Lakera,
        Preset::AzurePromptShields,
        Preset::LlmGuardApi,
        Preset::NemoGuardrails,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Preset::Lakera => "lakera",
            Preset::AzurePromptShields => "azure_prompt_shields",
            Preset::LlmGuardApi => "llm_guard_api",
            Preset::NemoGuardrails => "nemo_guardrails",
        }
    }

    /// The preset's mapping (docs/guardrails.md shows each answer shape).
    pub fn section(self) -> AnswerSection {
        let s = |v: &str| Some(v.to_owned());
        match self {
            // {"flagged": true, "breakdown": [{"detector_type": "prompt_attack", "detected": true}, …]}
            Preset::Lakera => AnswerSection {
                flagged: Some(OneOrMany::One("$.flagged".into())),
                category: s("$.breakdown[?@.detected == true].detector_type"),
                ..Default::default()
            },
            // {"userPromptAnalysis": {"attackDetected": false},
            //  "documentsAnalysis": [{"attackDetected": true}]}
            Preset::AzurePromptShields => AnswerSection {
                flagged: Some(OneOrMany::Many(vec![
                    "$.userPromptAnalysis.attackDetected".into(),
                    "$.documentsAnalysis[*].attackDetected".into(),
                ])),
                ..Default::default()
            },
            // {"is_valid": false, "scanners": {"PromptInjection": 1.0}, "sanitized_prompt": …}
            // (recent versions give risk scores from -1 to 1)
            Preset::LlmGuardApi => AnswerSection {
                flagged: Some(OneOrMany::One("$.is_valid".into())),
                invert: Some(true),
                score: s("$.scanners.PromptInjection"),
                score_range: Some([-1.0, 1.0]),
                category_max_of: s("$.scanners"),
                ..Default::default()
            },
            // {"messages": [{"role": "assistant", "content": …}],
            //  "log": {"activated_rails": [{"type": "input", "name": "self check input", "stop": true}, …]}}
            Preset::NemoGuardrails => AnswerSection {
                flagged: Some(OneOrMany::One("$.log.activated_rails[*].stop".into())),
                category: s("$.log.activated_rails[?@.stop == true].name"),
                ..Default::default()
            },
        }
    }
}

/// A checked mapping.
#[derive(Clone, Debug)]
pub struct AnswerMap {
    flagged: Vec<(JsonPath, String)>,
    invert: bool,
    score: Option<(JsonPath, String)>,
    range: [f64; 2],
    threshold: Option<f64>,
    category: Option<(JsonPath, String)>,
    category_max_of: Option<(JsonPath, String)>,
    flagged_regex: Option<(regex::Regex, JsonPath, String)>,
}

/// What a guardrail said of one text.
#[derive(Clone, Debug, PartialEq)]
pub struct Verdict {
    pub flagged: bool,
    /// 0..1, higher: more likely an injection; absent when the guardrail gives none.
    pub score: Option<f64>,
    pub category: Option<String>,
}

impl AnswerMap {
    /// Check a section (a preset's fields first, the section's own over them). `Err` is
    /// (key, message).
    pub fn compile(section: &AnswerSection) -> Result<AnswerMap, (String, String)> {
        let merged = match section.preset {
            None => section.clone(),
            Some(p) => {
                let base = p.section();
                AnswerSection {
                    preset: Some(p),
                    flagged: section.flagged.clone().or(base.flagged),
                    invert: section.invert.or(base.invert),
                    score: section.score.clone().or(base.score),
                    score_range: section.score_range.or(base.score_range),
                    threshold: section.threshold.or(base.threshold),
                    category: section.category.clone().or(base.category),
                    category_max_of: section.category_max_of.clone().or(base.category_max_of),
                    flagged_regex: section.flagged_regex.clone().or(base.flagged_regex),
                    text: section.text.clone().or(base.text),
                }
            }
        };
        let path = |key: &str, p: &str| -> Result<(JsonPath, String), (String, String)> {
            JsonPath::parse(p)
                .map(|j| (j, p.to_owned()))
                .map_err(|e| (key.to_owned(), format!("{p:?} is not a JSONPath: {e}")))
        };
        let flagged = match &merged.flagged {
            None => Vec::new(),
            Some(f) => {
                let paths = f.paths();
                if paths.is_empty() {
                    return Err(("flagged".into(), "names no path".into()));
                }
                paths
                    .iter()
                    .map(|p| path("flagged", p))
                    .collect::<Result<_, _>>()?
            }
        };
        let range = merged.score_range.unwrap_or([0.0, 1.0]);
        if !(range[0].is_finite() && range[1].is_finite() && range[0] < range[1]) {
            return Err((
                "score_range".into(),
                format!(
                    "[{}, {}] is not a range (low < high, finite)",
                    range[0], range[1]
                ),
            ));
        }
        let score = merged
            .score
            .as_deref()
            .map(|p| path("score", p))
            .transpose()?;
        if let Some(t) = merged.threshold {
            if !(t.is_finite() && (0.0..=1.0).contains(&t)) {
                return Err((
                    "threshold".into(),
                    format!("{t} is not in 0..1 (thresholds apply to the rescaled score)"),
                ));
            }
            if score.is_none() {
                return Err(("threshold".into(), "a threshold needs a score path".into()));
            }
        }
        let flagged_regex = match (&merged.flagged_regex, &merged.text) {
            (None, None) => None,
            (Some(r), Some(t)) => {
                let re = regex::RegexBuilder::new(r)
                    .size_limit(1 << 20)
                    .build()
                    .map_err(|e| ("flagged_regex".to_owned(), e.to_string()))?;
                let (p, s) = path("text", t)?;
                Some((re, p, s))
            }
            (Some(_), None) => {
                return Err((
                    "text".into(),
                    "flagged_regex needs text: the path of the text it reads".into(),
                ));
            }
            (None, Some(_)) => {
                return Err((
                    "flagged_regex".into(),
                    "text is read by flagged_regex only".into(),
                ));
            }
        };
        if flagged.is_empty() && flagged_regex.is_none() && merged.threshold.is_none() {
            return Err((
                "flagged".into(),
                "say how a flagged text is told: flagged (JSONPaths to booleans), flagged_regex with text, or score with threshold; or a preset (lakera, azure_prompt_shields, llm_guard_api, nemo_guardrails)".into(),
            ));
        }
        Ok(AnswerMap {
            flagged,
            invert: merged.invert.unwrap_or(false),
            score,
            range,
            threshold: merged.threshold,
            category: merged
                .category
                .as_deref()
                .map(|p| path("category", p))
                .transpose()?,
            category_max_of: merged
                .category_max_of
                .as_deref()
                .map(|p| path("category_max_of", p))
                .transpose()?,
            flagged_regex,
        })
    }

    /// Read an answer's text; `Err` says why it is not a verdict.
    pub fn read(&self, body: &str) -> Result<Verdict, String> {
        let v: Value = serde_json::from_str(body.trim_start_matches('\u{feff}')).map_err(|e| {
            format!(
                "the guardrail's answer is not JSON ({e}): {}",
                crate::text::excerpt(body, 120)
            )
        })?;
        self.read_value(&v)
    }

    pub fn read_value(&self, v: &Value) -> Result<Verdict, String> {
        let score = match &self.score {
            None => None,
            Some((p, s)) => {
                let node = p
                    .query(v)
                    .first()
                    .ok_or_else(|| format!("score: {s} finds nothing in the answer"))?;
                let x = node
                    .as_f64()
                    .filter(|x| x.is_finite())
                    .ok_or_else(|| format!("score: {s} is {node}, not a finite number"))?;
                let [lo, hi] = self.range;
                if !(lo..=hi).contains(&x) {
                    return Err(format!(
                        "score: {x} is outside the score range [{lo}, {hi}]"
                    ));
                }
                Some((x - lo) / (hi - lo))
            }
        };
        let mut flagged: Option<bool> = None;
        for (p, s) in &self.flagged {
            for node in p.query(v).all() {
                let b = node
                    .as_bool()
                    .ok_or_else(|| format!("flagged: {s} found {node}, not a boolean"))?;
                let b = b != self.invert;
                flagged = Some(flagged.unwrap_or(false) || b);
            }
        }
        if !self.flagged.is_empty() && flagged.is_none() {
            let paths: Vec<&str> = self.flagged.iter().map(|(_, s)| s.as_str()).collect();
            return Err(format!(
                "flagged: {} finds nothing in the answer",
                paths.join(" or ")
            ));
        }
        if let Some((re, p, s)) = &self.flagged_regex {
            let node = p
                .query(v)
                .first()
                .ok_or_else(|| format!("text: {s} finds nothing in the answer"))?;
            let t = node
                .as_str()
                .ok_or_else(|| format!("text: {s} is {node}, not a string"))?;
            flagged = Some(flagged.unwrap_or(false) || re.is_match(t));
        }
        if let (None, Some(t), Some(x)) = (flagged, self.threshold, score) {
            flagged = Some(x >= t);
        }
        let flagged = flagged.ok_or("no verdict in the answer")?;
        let category = if let Some((p, s)) = &self.category {
            match p.query(v).first() {
                None => None,
                Some(Value::String(c)) => Some(c.clone()),
                Some(Value::Null) => None,
                Some(other) => return Err(format!("category: {s} is {other}, not a string")),
            }
        } else if let Some((p, s)) = &self.category_max_of {
            match p.query(v).first() {
                None | Some(Value::Null) => None,
                Some(Value::Object(m)) => m
                    .iter()
                    .filter_map(|(k, x)| x.as_f64().filter(|x| x.is_finite()).map(|x| (k, x)))
                    .max_by(|a, b| a.1.total_cmp(&b.1).then_with(|| b.0.cmp(a.0)))
                    .map(|(k, _)| k.clone()),
                Some(other) => {
                    return Err(format!("category_max_of: {s} is {other}, not an object"));
                }
            }
        } else {
            None
        };
        Ok(Verdict {
            flagged,
            score,
            category,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn preset(p: Preset) -> AnswerMap {
        AnswerMap::compile(&AnswerSection {
            preset: Some(p),
            ..Default::default()
        })
        .unwrap()
    }

    #[test]
    fn presets_read_their_documented_answers() {
        let lakera = preset(Preset::Lakera);
        let v = lakera
            .read(r#"{"flagged":true,"breakdown":[{"detector_type":"moderated_content/hate","detected":false},{"detector_type":"prompt_attack","detected":true}]}"#)
            .unwrap();
        assert_eq!(
            v,
            Verdict {
                flagged: true,
                score: None,
                category: Some("prompt_attack".into())
            }
        );
        assert!(!lakera.read(r#"{"flagged":false}"#).unwrap().flagged);

        let azure = preset(Preset::AzurePromptShields);
        assert!(
            azure
                .read(r#"{"userPromptAnalysis":{"attackDetected":false},"documentsAnalysis":[{"attackDetected":true}]}"#)
                .unwrap()
                .flagged
        );
        assert!(
            !azure
                .read(r#"{"userPromptAnalysis":{"attackDetected":false},"documentsAnalysis":[]}"#)
                .unwrap()
                .flagged
        );

        let llm = preset(Preset::LlmGuardApi);
        let v = llm
            .read(r#"{"is_valid":false,"scanners":{"PromptInjection":1.0,"Toxicity":-0.5}}"#)
            .unwrap();
        assert_eq!(
            v,
            Verdict {
                flagged: true,
                score: Some(1.0),
                category: Some("PromptInjection".into())
            }
        );
        let v = llm
            .read(r#"{"is_valid":true,"scanners":{"PromptInjection":-1.0}}"#)
            .unwrap();
        assert!(!v.flagged);
        assert_eq!(v.score, Some(0.0));

        let nemo = preset(Preset::NemoGuardrails);
        let v = nemo
            .read(r#"{"messages":[{"role":"assistant","content":"I'm sorry, I can't respond to that."}],"log":{"activated_rails":[{"type":"input","name":"self check input","stop":true}]}}"#)
            .unwrap();
        assert_eq!(v.category.as_deref(), Some("self check input"));
        assert!(v.flagged);
        let v = nemo
            .read(r#"{"messages":[],"log":{"activated_rails":[{"type":"input","name":"self check input","stop":false},{"type":"generation","name":"generate user intent","stop":false}]}}"#)
            .unwrap();
        assert!(!v.flagged);
    }

    #[test]
    fn hostile_answers_are_errors_not_clear() {
        let llm = preset(Preset::LlmGuardApi);
        for (body, says) in [
            ("<html>502 Bad Gateway</html>", "not JSON"),
            (
                r#"{"is_valid":false,"scanners":{"PromptInjection":NaN}}"#,
                "not JSON",
            ),
            (
                r#"{"is_valid":"false","scanners":{"PromptInjection":1}}"#,
                "not a boolean",
            ),
            (r#"{"scanners":{"PromptInjection":1}}"#, "finds nothing"),
            (
                r#"{"is_valid":false,"scanners":{"PromptInjection":"1"}}"#,
                "not a finite number",
            ),
            (
                r#"{"is_valid":false,"scanners":{"PromptInjection":7}}"#,
                "outside",
            ),
            (
                r#"{"is_valid":false,"scanners":{"PromptInjection":1e999}}"#,
                "out of range",
            ),
            ("", "not JSON"),
        ] {
            let e = llm.read(body).unwrap_err();
            assert!(e.contains(says), "{body}: {e}");
        }
        // a score with a threshold and no flag
        let m = AnswerMap::compile(&AnswerSection {
            score: Some("$.score".into()),
            threshold: Some(0.5),
            ..Default::default()
        })
        .unwrap();
        assert!(m.read(r#"{"score":0.5}"#).unwrap().flagged);
        assert!(!m.read(r#"{"score":0.49}"#).unwrap().flagged);
        assert!(m.read(r#"{"score":null}"#).is_err());
        // a text answer read by a regex
        let m = AnswerMap::compile(&AnswerSection {
            flagged_regex: Some("(?i)can't respond".into()),
            text: Some("$.messages[0].content".into()),
            ..Default::default()
        })
        .unwrap();
        assert!(
            m.read(r#"{"messages":[{"content":"I can't respond to that."}]}"#)
                .unwrap()
                .flagged
        );
        assert!(
            !m.read(r#"{"messages":[{"content":"Paris."}]}"#)
                .unwrap()
                .flagged
        );
        assert!(m.read(r#"{"messages":[]}"#).is_err());
    }

    #[test]
    fn a_mapping_must_say_how_flagged_is_told() {
        for (section, key) in [
            (AnswerSection::default(), "flagged"),
            (
                AnswerSection {
                    threshold: Some(0.5),
                    ..Default::default()
                },
                "threshold",
            ),
            (
                AnswerSection {
                    flagged: Some(OneOrMany::One("$[".into())),
                    ..Default::default()
                },
                "flagged",
            ),
            (
                AnswerSection {
                    flagged: Some(OneOrMany::One("$.f".into())),
                    score: Some("$.s".into()),
                    score_range: Some([1.0, 1.0]),
                    ..Default::default()
                },
                "score_range",
            ),
        ] {
            assert_eq!(AnswerMap::compile(&section).unwrap_err().0, key);
        }
    }
}
