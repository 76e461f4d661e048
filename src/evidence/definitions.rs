//! The control catalogue: `queries/controls/*.sql`. Each file is a header of
//! `-- key: value` lines (a value continues on following `--` lines indented by two
//! or more spaces; a blank line ends the header), then two read-only queries:
//!
//! 1. the **evidence** query: the case rows behind the result (written to
//!    `evidence/<id>.parquet`);
//! 2. the **result** query over the table `evidence` (that very file): columns `n` and
//!    `k` (BIGINT), optionally `undecided` and `group_key` (one row per group).
//!
//! The header declares how `k` of `n` is judged: `statistic` (`wilson_upper`,
//! `wilson_lower`, `rate`, `count`), `comparator` and `threshold`, and `min_n`, below
//! which the control says `insufficient_data`. Optionally `group_by`: the evidence
//! column whose value is the result's `group_key`, so that each group carries the
//! framework tags of its own evidence rows (without it, every group carries those of all
//! the evidence rows). Optionally `runs`: the kind of run the control applies to —
//! `model` (default: a model, an application or an agent attacked), `guardrail` (a
//! guardrail run, src/guard: the tables `guard_results`, `guard_roc` and `guard_at_fpr`),
//! or `all`; a control is not assessed on a run of another kind.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Serialize;
use sha2::{Digest, Sha256};

use crate::error::{Error, Result};

/// What is compared with the threshold.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Statistic {
    /// The upper bound of the Wilson 95% interval of k / n (a rate that must be low).
    WilsonUpper,
    /// The lower bound of the Wilson 95% interval of k / n (a rate that must be high).
    WilsonLower,
    /// The point estimate k / n.
    Rate,
    /// k itself.
    Count,
}

impl Statistic {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::WilsonUpper => "wilson_upper",
            Self::WilsonLower => "wilson_lower",
            Self::Rate => "rate",
            Self::Count => "count",
        }
    }

    fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "wilson_upper" => Self::WilsonUpper,
            "wilson_lower" => Self::WilsonLower,
            "rate" => Self::Rate,
            "count" => Self::Count,
            _ => return None,
        })
    }
}

/// How the measured value is compared with the threshold: it passes when
/// `measured <comparator> threshold` holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Comparator {
    #[serde(rename = "<=")]
    Le,
    #[serde(rename = "<")]
    Lt,
    #[serde(rename = ">=")]
    Ge,
    #[serde(rename = ">")]
    Gt,
    #[serde(rename = "==")]
    Eq,
}

impl Comparator {
    fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "<=" => Self::Le,
            "<" => Self::Lt,
            ">=" => Self::Ge,
            ">" => Self::Gt,
            "==" | "=" => Self::Eq,
            _ => return None,
        })
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Le => "<=",
            Self::Lt => "<",
            Self::Ge => ">=",
            Self::Gt => ">",
            Self::Eq => "==",
        }
    }

    pub fn holds(self, measured: f64, threshold: f64) -> bool {
        match self {
            Self::Le => measured <= threshold,
            Self::Lt => measured < threshold,
            Self::Ge => measured >= threshold,
            Self::Gt => measured > threshold,
            Self::Eq => measured == threshold,
        }
    }

    /// How far `measured` is on the failing side (larger is worse), to pick the
    /// deciding group.
    pub fn badness(self, measured: f64) -> f64 {
        match self {
            Self::Le | Self::Lt => measured,
            Self::Ge | Self::Gt => -measured,
            Self::Eq => 0.0,
        }
    }
}

/// One control of the catalogue.
#[derive(Debug, Clone, Serialize)]
pub struct Control {
    pub id: String,
    pub title: String,
    pub description: String,
    pub statistic: Statistic,
    pub comparator: Comparator,
    pub threshold: f64,
    pub min_n: u64,
    pub references: Vec<String>,
    /// The rate whose detector figures correct this control's (`scoring::corrected`):
    /// the result carries the corrected estimate beside the raw one.
    pub corrected_with: Option<String>,
    /// What decides: the raw rate (default) or the corrected one (`basis: corrected`).
    pub basis: Basis,
    /// The evidence column a grouped result's `group_key` is (for its framework tags).
    pub group_by: Option<String>,
    /// The kind of run it applies to.
    pub runs: Runs,
    /// The catalogue file.
    pub file: PathBuf,
    /// sha256 of the file's bytes (header and both queries).
    pub query_sha256: String,
    #[serde(skip)]
    pub sql: String,
}

const KEYS: &[&str] = &[
    "id",
    "title",
    "description",
    "statistic",
    "comparator",
    "threshold",
    "min_n",
    "references",
    "corrected_with",
    "basis",
    "group_by",
    "runs",
];

/// The kind of run a control applies to (`-- runs:`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum Runs {
    /// A model, an application or an agent under attack (every run but a guardrail run).
    #[default]
    Model,
    /// A guardrail run (a `guardrail` section: src/guard).
    Guardrail,
    All,
}

impl Runs {
    /// Whether a control for these runs is assessed on a run of this kind.
    pub fn applies(self, guardrail_run: bool) -> bool {
        match self {
            Runs::Model => !guardrail_run,
            Runs::Guardrail => guardrail_run,
            Runs::All => true,
        }
    }
}

/// Which figure a control decides on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum Basis {
    /// The rate the detectors decided.
    #[default]
    Raw,
    /// The rate corrected for the detector's measured error (Rogan–Gladen).
    Corrected,
}

impl Basis {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Raw => "raw",
            Self::Corrected => "corrected",
        }
    }
}

/// A control id is used as a file name: letters, digits, '.', '_', '-'.
fn valid_id(id: &str) -> bool {
    (1..=64).contains(&id.len())
        && id.as_bytes()[0].is_ascii_alphanumeric()
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

/// Parse one control file's text (`path` names it in errors).
pub fn parse_control(path: &Path, text: &str) -> Result<Control> {
    let mut header: BTreeMap<&str, (usize, String)> = BTreeMap::new();
    let mut last: Option<&str> = None;
    for (i, line) in text.lines().enumerate() {
        let line_no = i + 1;
        let trimmed = line.trim();
        if trimmed.is_empty() {
            if header.is_empty() {
                continue;
            }
            break; // a blank line ends the header
        }
        let Some(comment) = trimmed.strip_prefix("--") else {
            break; // the queries begin
        };
        let err = |msg: String| Error::input(path, line_no as u64, None, msg);
        if let Some(key) = last
            && comment.starts_with("  ")
            && !comment.trim().is_empty()
        {
            let entry = header.get_mut(key).expect("continued key exists");
            entry.1.push(' ');
            entry.1.push_str(comment.trim());
            continue;
        }
        let comment = comment.trim();
        match comment.split_once(':') {
            Some((key, value))
                if !key.is_empty() && key.bytes().all(|b| b.is_ascii_lowercase() || b == b'_') =>
            {
                let Some(&known) = KEYS.iter().find(|k| **k == key) else {
                    return Err(err(format!(
                        "unknown header key {key:?} (expected one of: {})",
                        KEYS.join(", ")
                    )));
                };
                if header
                    .insert(known, (line_no, value.trim().to_owned()))
                    .is_some()
                {
                    return Err(err(format!("header key {key:?} given twice")));
                }
                last = Some(known);
            }
            _ => last = None, // a free comment
        }
    }
    let get = |key: &str| -> Result<(usize, &str)> {
        header
            .get(key)
            .map(|(l, v)| (*l, v.as_str()))
            .filter(|(_, v)| !v.is_empty())
            .ok_or_else(|| Error::config(path, format!("the header has no `-- {key}: …` line")))
    };
    let bad = |key: &str, line: usize, msg: String| Error::input(path, line as u64, Some(key), msg);
    let (line, id) = get("id")?;
    if !valid_id(id) {
        return Err(bad(
            "id",
            line,
            format!("{id:?}: use letters, digits, '.', '_' and '-' (at most 64)"),
        ));
    }
    let (line, statistic) = get("statistic")?;
    let statistic = Statistic::parse(statistic).ok_or_else(|| {
        bad(
            "statistic",
            line,
            format!("{statistic:?}: expected wilson_upper, wilson_lower, rate or count"),
        )
    })?;
    let (line, comparator) = get("comparator")?;
    let comparator = Comparator::parse(comparator).ok_or_else(|| {
        bad(
            "comparator",
            line,
            format!("{comparator:?}: expected <=, <, >=, > or =="),
        )
    })?;
    let (line, threshold) = get("threshold")?;
    let threshold: f64 = threshold
        .parse()
        .ok()
        .filter(|t: &f64| t.is_finite())
        .ok_or_else(|| bad("threshold", line, format!("{threshold:?}: not a number")))?;
    if statistic != Statistic::Count && !(0.0..=1.0).contains(&threshold) {
        return Err(bad(
            "threshold",
            line,
            format!("{threshold}: a rate threshold is between 0 and 1"),
        ));
    }
    let (line, min_n) = get("min_n")?;
    let min_n: u64 = min_n
        .parse()
        .map_err(|_| bad("min_n", line, format!("{min_n:?}: not a whole number")))?;
    let references: Vec<String> = get("references")?
        .1
        .split(';')
        .map(|r| r.trim().to_owned())
        .filter(|r| !r.is_empty())
        .collect();
    let optional = |key: &str| header.get(key).filter(|(_, v)| !v.is_empty());
    let corrected_with = match optional("corrected_with") {
        None => None,
        Some((line, rate)) => {
            let known: Vec<&str> = crate::scoring::corrected::CORRECTIONS
                .iter()
                .map(|c| c.0)
                .collect();
            if !known.contains(&rate.as_str()) {
                return Err(bad(
                    "corrected_with",
                    *line,
                    format!("{rate:?}: expected one of {}", known.join(", ")),
                ));
            }
            Some(rate.clone())
        }
    };
    let basis = match optional("basis") {
        None => Basis::Raw,
        Some((_, v)) if v == "raw" => Basis::Raw,
        Some((line, v)) if v == "corrected" => {
            if corrected_with.is_none() || statistic == Statistic::Count {
                return Err(bad(
                    "basis",
                    *line,
                    "`basis: corrected` needs a rate statistic and `-- corrected_with: RATE` (the rate whose detector figures correct it)".into(),
                ));
            }
            let _ = v;
            Basis::Corrected
        }
        Some((line, v)) => {
            return Err(bad(
                "basis",
                *line,
                format!("{v:?}: expected raw or corrected"),
            ));
        }
    };
    let group_by = match optional("group_by") {
        None => None,
        Some((line, v)) => {
            let ok = v.as_bytes()[0].is_ascii_lowercase()
                && v.bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_');
            if !ok {
                return Err(bad(
                    "group_by",
                    *line,
                    format!("{v:?}: expected a column name of the evidence query"),
                ));
            }
            Some(v.clone())
        }
    };
    let runs = match optional("runs") {
        None => Runs::Model,
        Some((_, v)) if v == "model" => Runs::Model,
        Some((_, v)) if v == "guardrail" => Runs::Guardrail,
        Some((_, v)) if v == "all" => Runs::All,
        Some((line, v)) => {
            return Err(bad(
                "runs",
                *line,
                format!("{v:?}: expected model, guardrail or all"),
            ));
        }
    };
    Ok(Control {
        corrected_with,
        basis,
        group_by,
        runs,
        id: id.to_owned(),
        title: get("title")?.1.to_owned(),
        description: get("description")?.1.to_owned(),
        statistic,
        comparator,
        threshold,
        min_n,
        references,
        file: path.to_path_buf(),
        query_sha256: hex::encode(Sha256::digest(text.as_bytes())),
        sql: text.to_owned(),
    })
}

/// Every `*.sql` file of a catalogue folder, sorted by file name; control ids unique.
pub fn load_catalog(dir: &Path) -> Result<Vec<Control>> {
    let entries = std::fs::read_dir(dir)
        .map_err(|e| Error::io(dir, "cannot read the control catalogue", e))?;
    let mut files: Vec<PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "sql") && p.is_file())
        .collect();
    files.sort();
    if files.is_empty() {
        return Err(Error::config(dir, "the control catalogue has no .sql file"));
    }
    let mut controls: Vec<Control> = Vec::with_capacity(files.len());
    for file in files {
        let bytes = std::fs::read(&file).map_err(|e| Error::io(&file, "cannot read", e))?;
        let text = String::from_utf8(bytes)
            .map_err(|e| Error::config(&file, format!("not UTF-8: {e}")))?;
        let control = parse_control(&file, &text)?;
        if let Some(first) = controls.iter().find(|c| c.id == control.id) {
            return Err(Error::config(
                &file,
                format!(
                    "control id {:?} is also the id of {}",
                    control.id,
                    first.file.display()
                ),
            ));
        }
        controls.push(control);
    }
    Ok(controls)
}

/// The shipped catalogue, compiled in so that `pieval controls` works from any folder.
pub fn builtin() -> impl Iterator<Item = (&'static str, &'static str)> {
    crate::engine::queries::CONTROLS.iter().map(|q| {
        let name = q.path.rsplit('/').next().unwrap_or(q.path);
        (name, q.sql)
    })
}

/// The shipped catalogue (`queries/controls/` as compiled into this binary).
pub fn builtin_catalog() -> Result<Vec<Control>> {
    let dir = Path::new("queries/controls");
    let mut controls: Vec<Control> = Vec::new();
    for (name, text) in builtin() {
        controls.push(parse_control(&dir.join(name), text)?);
    }
    Ok(controls)
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = "-- id: PI-X\n-- title: A title\n-- description: first line\n--   second line\n-- statistic: wilson_upper\n-- comparator: <=\n-- threshold: 0.1\n-- min_n: 20\n-- references: OWASP LLM01:2025; MITRE ATLAS AML.T0051.000\n\nSELECT 1;\nSELECT 1 AS n, 0 AS k;\n";

    #[test]
    fn parses_the_header() {
        let c = parse_control(Path::new("x.sql"), GOOD).unwrap();
        assert_eq!(c.id, "PI-X");
        assert_eq!(c.description, "first line second line");
        assert_eq!(c.statistic, Statistic::WilsonUpper);
        assert_eq!(c.comparator, Comparator::Le);
        assert_eq!(c.threshold, 0.1);
        assert_eq!(c.min_n, 20);
        assert_eq!(
            c.references,
            vec!["OWASP LLM01:2025", "MITRE ATLAS AML.T0051.000"]
        );
        assert_eq!(c.query_sha256.len(), 64);
    }

    #[test]
    fn header_errors_name_file_line_and_key() {
        let cases = [
            (GOOD.replace("-- min_n: 20\n", ""), "no `-- min_n"),
            (GOOD.replace("wilson_upper", "median"), "x.sql:5: statistic"),
            (GOOD.replace("<=", "=<"), "x.sql:6: comparator"),
            (GOOD.replace("0.1\n", "lots\n"), "x.sql:7: threshold"),
            (GOOD.replace("0.1\n", "1.5\n"), "between 0 and 1"),
            (GOOD.replace("PI-X", "../etc"), "x.sql:1: id"),
            (
                GOOD.replace("-- title", "-- titel"),
                "unknown header key \"titel\"",
            ),
            (format!("-- id: B\n{GOOD}"), "given twice"),
        ];
        for (text, want) in cases {
            let e = parse_control(Path::new("x.sql"), &text)
                .unwrap_err()
                .to_string();
            assert!(e.contains(want), "{want:?} not in {e:?}");
        }
    }

    #[test]
    fn comparators() {
        assert!(Comparator::Le.holds(0.1, 0.1));
        assert!(!Comparator::Lt.holds(0.1, 0.1));
        assert!(Comparator::Ge.holds(0.9, 0.5));
        assert!(Comparator::Eq.holds(0.0, 0.0));
        assert!(Comparator::Le.badness(0.5) > Comparator::Le.badness(0.1));
        assert!(Comparator::Ge.badness(0.1) > Comparator::Ge.badness(0.5));
    }

    #[test]
    fn the_shipped_catalogue_parses() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("queries/controls");
        let controls = load_catalog(&dir).unwrap();
        assert!(controls.len() >= 8, "{} controls", controls.len());
        // The compiled-in copy is the folder, file for file.
        let builtin = builtin_catalog().unwrap();
        assert_eq!(builtin.len(), controls.len());
        for (a, b) in builtin.iter().zip(&controls) {
            assert_eq!(a.query_sha256, b.query_sha256, "{}", a.id);
        }
        for c in &controls {
            assert!(!c.references.is_empty(), "{}", c.id);
        }
    }
}
