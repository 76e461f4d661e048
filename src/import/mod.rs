//! `pieval import TOOL PATH… --output RUN_DIR`: the results another red-team tool wrote
//! (garak, Inspect, promptfoo, PyRIT, AgentDojo, spikee, CyberSecEval) turned into a
//! pieval run folder that every command reads as its own (docs/import.md).
//!
//! An importer (one file per tool, listed once in [`IMPORTERS`]) reads its tool's files
//! and hands each record to the [`Sink`]: the case it answers (an [`AttackCase`] built from
//! what the tool recorded, enriched by the taxonomy), the prediction (the model's answer,
//! its tool calls as an agent's turns, the tool's own verdict in the `source_*` fields,
//! the fields pieval has no column for in `source_extra`) and every score the tool gave
//! (`source_scores.parquet`, long form). The sink writes them into a folder under a
//! temporary name; pieval's scoring then runs on it exactly as on a native run
//! (`runner::score_run`), and the folder is swapped in whole only when everything
//! succeeded: a truncated log, an unknown entry or a bad field is an error naming the file
//! and line (or archive entry) and leaves no run folder behind.
//!
//! The manifest's `import` block names the tool, its version (as the files record it),
//! every source file with its size and sha256, and the command; `pieval verify` and the
//! control envelopes carry those digests, so every number traces to a line of the
//! original file.

pub mod agentdojo;
pub mod cyberseceval;
pub mod garak;
pub mod inspect;
pub mod otel;
pub mod promptfoo;
pub mod pyrit;
pub mod spikee;
pub mod sqlite;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use serde::Serialize;
use serde_json::{Map, Value, json};
use sha2::Digest;

use crate::contract::case::AttackCase;
use crate::contract::criteria::SuccessCriteria;
use crate::contract::enums::{AttackSurface, SourceType};
use crate::error::{Error, Result};
use crate::rundir::checkpoint::{PredictionRecord, TableWriter};
use crate::rundir::{Manifest, RunStatus};

/// One importer: a tool's result files into the sink.
pub struct Importer {
    /// The name on the command line (`pieval import garak …`).
    pub name: &'static str,
    /// What PATH may be (the docs' table and `--help`).
    pub reads: &'static str,
    /// What the tool's verdict means here (the docs' table).
    pub verdict: &'static str,
    /// Read one PATH (a file, or a folder the importer knows) into the sink.
    pub import: fn(&Path, &mut Sink) -> Result<()>,
}

/// Every importer, in the order the docs list them.
pub const IMPORTERS: &[&Importer] = &[
    &garak::IMPORTER,
    &inspect::IMPORTER,
    &promptfoo::IMPORTER,
    &pyrit::IMPORTER,
    &agentdojo::IMPORTER,
    &spikee::IMPORTER,
    &cyberseceval::IMPORTER,
    &otel::IMPORTER,
];

/// The importers' table of docs/import.md, written from [`IMPORTERS`].
pub fn docs_table() -> String {
    let mut out = String::from(
        "| tool | reads | the tool's verdict (`source_verdict = true`) |\n|---|---|---|\n",
    );
    for i in IMPORTERS {
        out.push_str(&format!("| `{}` | {} | {} |\n", i.name, i.reads, i.verdict));
    }
    out
}

/// The importer called `name`, or an error listing them.
pub fn importer(name: &str) -> Result<&'static Importer> {
    IMPORTERS
        .iter()
        .copied()
        .find(|i| i.name == name)
        .ok_or_else(|| {
            let names: Vec<&str> = IMPORTERS.iter().map(|i| i.name).collect();
            Error::Usage(format!(
                "unknown tool {name:?}: pieval imports {}",
                names.join(", ")
            ))
        })
}

/// What `pieval import` was asked.
#[derive(Clone, Debug)]
pub struct ImportOptions {
    pub tool: String,
    pub paths: Vec<PathBuf>,
    /// The run folder to write (must not exist, unless `replace`).
    pub output: PathBuf,
    pub replace: bool,
    /// The scorer or detector whose verdict is `source_verdict` (default: the tool's).
    pub source_scorer: Option<String>,
    /// Inspect: a "correct" score means the attack succeeded (`attack`, the default) or
    /// that the model held (`defence`).
    pub correct_means_attack: bool,
    /// A judge config (the keys of evaluation.judge): `judge` criteria are decided by it.
    pub judge: Option<PathBuf>,
    /// The command as typed, for the manifest.
    pub command: String,
    /// Longest accepted JSONL line of a source.
    pub max_line_bytes: usize,
    /// The taxonomy the cases are enriched with (None: the one compiled into pieval).
    pub taxonomy: Option<PathBuf>,
    /// Corpora whose cases the results answer, by case id (AgentDojo: pieval's
    /// translation of its suites): a result whose case is there is scored against it.
    pub cases: Vec<PathBuf>,
    /// Traces (`otel`): the pieval run whose attempts sent the W3C `traceparent` the
    /// spans carry (their trace ids are found from it: `otel::trace_id`).
    pub trace_run: Option<String>,
}

/// One source file, as the manifest records it.
#[derive(Clone, Debug, Serialize, serde::Deserialize, PartialEq)]
pub struct SourceFile {
    pub path: String,
    /// What was read: the file's size and SHA-256, or, for a SQLite database, the
    /// snapshot's (the database as SQLite saw it, its WAL included: `sqlite`).
    pub bytes: u64,
    pub sha256: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sqlite: Option<sqlite::Snapshot>,
}

/// What an import did.
#[derive(Debug, Serialize)]
pub struct ImportReport {
    pub tool: String,
    pub tool_version: Option<String>,
    pub run_id: String,
    pub output: PathBuf,
    pub sources: Vec<SourceFile>,
    pub cases: u64,
    pub predictions: u64,
    pub tool_calls: u64,
    pub source_scores: u64,
    /// Rows where the tool gave a verdict, and of those, where pieval decided too and
    /// agreed, and disagreed.
    pub source_verdicts: u64,
    pub agreed: u64,
    pub disagreed: u64,
    pub attack_success: u64,
    pub manual_review: u64,
}

/// Where an importer is in its source: a file and line, or an archive and entry.
#[derive(Clone, Debug)]
pub struct At {
    pub file: PathBuf,
    pub line: u64,
    /// The archive entry (Inspect's `samples/…json`), when the file is an archive.
    pub entry: Option<String>,
}

impl At {
    pub fn line(file: &Path, line: u64) -> Self {
        At {
            file: file.to_path_buf(),
            line,
            entry: None,
        }
    }

    pub fn entry(file: &Path, entry: &str) -> Self {
        At {
            file: file.to_path_buf(),
            line: 0,
            entry: Some(entry.to_owned()),
        }
    }

    /// `source_ref`: `file:line`, or `file:entry` (the file's name only: a run folder
    /// travels, the manifest has the full path and digest).
    pub fn reference(&self) -> String {
        let name = self
            .file
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        match &self.entry {
            Some(e) if self.line > 0 => format!("{name}:{e}:{}", self.line),
            Some(e) => format!("{name}:{e}"),
            None => format!("{name}:{}", self.line),
        }
    }

    /// An error at this place, naming the field (in an archive or a log's list, the
    /// entry comes first: `log.eval:0: samples/x.json: messages: …`).
    pub fn error(&self, field: Option<&str>, message: impl Into<String>) -> Error {
        let field = match (&self.entry, field) {
            (Some(e), Some(f)) => Some(format!("{e}: {f}")),
            (Some(e), None) => Some(e.clone()),
            (None, f) => f.map(str::to_owned),
        };
        Error::input(&self.file, self.line, field.as_deref(), message.into())
    }
}

/// A score the source tool gave a row.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SourceScore {
    /// The detector, scorer, assertion or judge.
    pub scorer: String,
    /// The score as the tool wrote it (JSON text of a non-string value).
    pub value: Option<String>,
    /// The score as a number, when it is one (C → 1, I → 0 for Inspect).
    pub score: Option<f64>,
    /// Read as "the attack succeeded".
    pub verdict: Option<bool>,
    pub explanation: Option<String>,
}

/// A row of the import: the prediction, with every score the tool gave it.
pub struct Row {
    pub prediction: PredictionRecord,
    pub scores: Vec<SourceScore>,
}

/// One tool call of an imported transcript, with what the tool returned (the type the
/// trace mapping makes too).
pub use crate::agent::otel::Call;

/// One model answer of an imported transcript: its text and the calls it made.
#[derive(Clone, Debug, Default)]
pub struct Answer {
    pub text: Option<String>,
    pub calls: Vec<Call>,
}

/// Make `p` an agent's attempt from an imported transcript: one turn per model answer,
/// its tool calls (into `tool_calls.parquet` when the run is scored), and the calls as
/// the actions the criteria read (`agent_actions`, as the agent loop writes them:
/// `failed` on a call that returned a tool error). `stop` is why it ended (`answer`,
/// `error`, `budget`).
pub fn agent_attempt(p: &mut PredictionRecord, prompt: &str, answers: Vec<Answer>, stop: &str) {
    use crate::rundir::checkpoint::{ToolCallRecord, TurnRecord};
    let mut actions = Vec::new();
    for (i, a) in answers.into_iter().enumerate() {
        let n = i as u32 + 1;
        let mut turn = TurnRecord {
            turn: n,
            depth: 0,
            node_id: n.to_string(),
            attack_prompt: if i == 0 {
                prompt.to_owned()
            } else {
                String::new()
            },
            target_response: a.text,
            ..TurnRecord::default()
        };
        for (j, c) in a.calls.into_iter().enumerate() {
            let arguments = match &c.arguments {
                Value::String(s) => s.clone(),
                v => v.to_string(),
            };
            let mut action = json!({"name": c.name, "arguments": c.arguments});
            if c.error {
                action["failed"] = Value::Bool(true);
            }
            actions.push(action);
            turn.tool_calls.push(ToolCallRecord {
                id: if c.id.is_empty() {
                    format!("call_{n}_{}", j + 1)
                } else {
                    c.id
                },
                name: c.name,
                arguments,
                executed: c.output.is_some(),
                output: c.output.unwrap_or_default(),
                error: c.error,
                action: true,
                ..ToolCallRecord::default()
            });
        }
        p.turns.push(turn);
    }
    p.turns_used = Some(p.turns.len() as u32);
    p.agent_actions = Some(Value::Array(actions).to_string());
    p.agent_stop = Some(stop.to_owned());
}

/// Success when the response contains any of `values` (one: `contains`).
pub fn contains_any(values: &[String]) -> SuccessCriteria {
    let mut of: Vec<SuccessCriteria> = values
        .iter()
        .map(|v| SuccessCriteria::Contains { value: v.clone() })
        .collect();
    if of.len() == 1 {
        of.pop().expect("one")
    } else {
        SuccessCriteria::Any { of }
    }
}

/// Add the importer's own fields to a case's provenance (made by [`Sink::new_case`]).
pub fn add_provenance(case: &mut AttackCase, fields: Value) {
    let Value::Object(fields) = fields else {
        return;
    };
    match &mut case.provenance {
        Some(Value::Object(p)) => p.extend(fields),
        other => *other = Some(Value::Object(fields)),
    }
}

/// How a part of an id that could not be kept verbatim ends: `-h` and 16 hex digits of
/// a SHA-256 (64 bits: among a million ids, a clash is about one chance in 10^7, and the
/// sink refuses one rather than merge two records).
const HASH_MARK: &str = "-h";
const HASH_HEX: usize = 16;
/// The most characters of a hashed part kept readable before its hash.
const READABLE_CHARS: usize = 40;
/// The contract's longest id (`schemas/attack_case.schema.json`).
const MAX_ID_BYTES: usize = 128;

/// Whether `part` ends like a hashed part (`…-h` and 16 lowercase hex digits).
fn ends_like_hashed(part: &str) -> bool {
    let b = part.as_bytes();
    b.len() >= HASH_MARK.len() + HASH_HEX
        && &b[b.len() - HASH_HEX - HASH_MARK.len()..b.len() - HASH_HEX] == HASH_MARK.as_bytes()
        && b[b.len() - HASH_HEX..]
            .iter()
            .all(|c| c.is_ascii_digit() || (b'a'..=b'f').contains(c))
}

/// 16 hex digits of the SHA-256 of `fields` under `domain`, each field length-prefixed
/// (so no two lists of fields hash the same input).
fn short_hash(domain: &str, fields: &[&str]) -> String {
    let mut h = sha2::Sha256::new();
    h.update(domain.as_bytes());
    for f in fields {
        h.update((f.len() as u64).to_le_bytes());
        h.update(f.as_bytes());
    }
    let digest = h.finalize();
    digest[..HASH_HEX / 2]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// A case id from a tool's own ids (`parts`: Inspect's task and sample id, garak's
/// attempt uuid, …), under the tool's name: `tool:part:part`. Whatever the tool's ids
/// are (slashes, spaces, unicode, 10 KB long, empty), the id is
///
/// - **contract-valid**: `[A-Za-z0-9][A-Za-z0-9._:-]{0,127}` (`schemas/attack_case.schema.json`);
/// - **stable**: the same ids give the same case id on every import;
/// - **collision-free**: distinct ids give distinct case ids (up to a 64-bit hash).
///
/// A part is kept verbatim when it is non-empty, made of `[A-Za-z0-9._-]` (the last part
/// may also hold `:`) and does not end like a hashed part; any other part becomes its
/// first 40 characters with every other character as `_`, then `-h` and 16 hex digits
/// of its SHA-256. Since only the last part may hold `:`, the parts can be read back from
/// the id, and a verbatim part never looks hashed: two lists of parts give one id only
/// through a hash collision. An id that would pass 128 bytes keeps its first bytes and
/// ends with `-h` and the hash of all its parts. The caller gives the same number of parts
/// for every record of a tool; the ids themselves are kept verbatim in the case's
/// `provenance.source_ids` and the row's `source_id`.
pub fn case_id(tool: &str, parts: &[&str]) -> String {
    debug_assert!(
        tool.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_'),
        "a tool's name is pieval's own"
    );
    let last = parts.len().saturating_sub(1);
    let mut id = String::from(tool);
    for (i, part) in parts.iter().enumerate() {
        let allowed = |c: char| {
            c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') || (c == ':' && i == last)
        };
        id.push(':');
        if !part.is_empty() && part.chars().all(allowed) && !ends_like_hashed(part) {
            id.push_str(part);
        } else {
            id.extend(
                part.chars()
                    .take(READABLE_CHARS)
                    .map(|c| if allowed(c) { c } else { '_' }),
            );
            id.push_str(HASH_MARK);
            id.push_str(&short_hash("part", &[part]));
        }
    }
    if id.len() <= MAX_ID_BYTES {
        return id;
    }
    let mut whole = vec![tool];
    whole.extend_from_slice(parts);
    hashed_id(&id, &short_hash("id", &whole))
}

/// `id` (contract characters only) cut so that `-h` and `hash` fit in the contract's
/// 128 bytes, then those.
fn hashed_id(id: &str, hash: &str) -> String {
    debug_assert!(id.is_ascii());
    let keep = MAX_ID_BYTES - HASH_MARK.len() - hash.len();
    format!("{}{HASH_MARK}{hash}", &id[..id.len().min(keep)])
}

/// Whether `id` is an id the contract accepts (`schemas/attack_case.schema.json`).
pub fn is_contract_id(id: &str) -> bool {
    crate::contract::record::check_id(id).is_ok()
}

/// The most bytes of a row's `source_extra` (the tool's fields pieval has no column for):
/// past it, its largest fields are left in the source file (bound by its digest) and
/// named in `cut_fields` (`source_extra.<field>`), so the row's line stays one every
/// reader accepts.
const MAX_EXTRA_BYTES: usize = 2 << 20;
/// The most bytes of a row's `source_id` kept.
const MAX_SOURCE_ID_BYTES: usize = 64 << 10;

/// Keep a row within what a run holds: its extra fields within [`MAX_EXTRA_BYTES`] (the
/// largest left out, and named); its calls within what an agent attempt records
/// (`agent::run::MAX_RECORDED_BYTES`: past it they are not recorded and the row says so
/// in its error, as an agent attempt of pieval's does); its transcript within what a
/// reader buffers of an attempt (`MAX_ATTEMPT_BYTES`: past it the record is refused,
/// with its size). The line's own text fields are cut by `write_attempt` when they must.
fn bound_row(p: &mut PredictionRecord, at: &At) -> Result<()> {
    use crate::rundir::checkpoint::MAX_ATTEMPT_BYTES;
    // The tool's own id, verbatim up to 64 KiB (no tool's id is near it).
    if let Some(id) = &mut p.source_id
        && id.len() > MAX_SOURCE_ID_BYTES
    {
        let mut end = MAX_SOURCE_ID_BYTES;
        while !id.is_char_boundary(end) {
            end -= 1;
        }
        id.truncate(end);
        p.cut_fields.push("source_id".into());
    }
    if let Some(Value::Object(extra)) = &mut p.source_extra {
        let len = |v: &Value| serde_json::to_vec(v).map_or(0, |b| b.len());
        let mut total: usize = extra.iter().map(|(k, v)| k.len() + len(v) + 4).sum();
        if total > MAX_EXTRA_BYTES {
            let mut sizes: Vec<(usize, String)> =
                extra.iter().map(|(k, v)| (len(v), k.clone())).collect();
            sizes.sort_by(|a, b| b.0.cmp(&a.0).then_with(|| a.1.cmp(&b.1)));
            for (size, key) in sizes {
                if total <= MAX_EXTRA_BYTES {
                    break;
                }
                extra.remove(&key);
                total -= size + key.len() + 4;
                p.cut_fields.push(format!("source_extra.{key}"));
            }
        }
    }
    let recorded = crate::agent::run::MAX_RECORDED_BYTES;
    if let Some(actions) = &p.agent_actions
        && actions.len() > recorded
    {
        p.error = Some(format!(
            "the agent's calls are {} bytes of JSON, more than the {} MiB an attempt records: not recorded (they are in the source file)",
            actions.len(),
            recorded >> 20
        ));
        p.agent_actions = Some("[]".into());
        p.agent_stop = Some("error".into());
    }
    let held: u64 = p.turns.iter().map(|t| t.text_bytes() + 256).sum();
    if held > MAX_ATTEMPT_BYTES {
        return Err(at.error(
            None,
            format!(
                "the transcript holds {held} bytes of text, more than the {} MiB an attempt pieval records may hold",
                MAX_ATTEMPT_BYTES >> 20
            ),
        ));
    }
    Ok(())
}

/// What the importers write into: the run folder under construction.
pub struct Sink {
    tool: &'static str,
    run_id: String,
    dir: PathBuf,
    cases: BufWriter<std::fs::File>,
    predictions: BufWriter<std::fs::File>,
    scores: TableWriter,
    /// turns.parquet and tool_calls.parquet, written as the rows arrive (the checkpoint
    /// is not read again for them).
    tables: crate::rundir::checkpoint::AttemptTables,
    /// Case id → the digest of its line: the same case twice is one case, a different
    /// case under the same id an error.
    case_ids: HashMap<String, [u8; 32]>,
    /// The case ids in the order written (the manifest's selected_case_ids).
    order: Vec<String>,
    /// Lines written to predictions.jsonl, and each case's last prediction line: the
    /// cases are written in the order of their first rows, so scoring's join can read
    /// them as the rows come and let each go after its last
    /// (`src/engine/case_window.rs`).
    lines: u64,
    lives: crate::engine::case_window::CaseLives,
    /// Counts of the cases per taxonomy field and value (the manifest's).
    taxonomy_summary: BTreeMap<String, BTreeMap<String, u64>>,
    criteria: crate::contract::record::CriteriaCache,
    taxonomy: crate::taxonomy::Taxonomy,
    /// The versions of the tool the files record, and its models.
    versions: BTreeSet<String>,
    models: BTreeSet<String>,
    /// The tool's run ids, start and end, as the files record them.
    pub source_runs: BTreeSet<String>,
    started: Option<String>,
    pub options: ImportOptions,
    counts: Counts,
    /// The source's own settings worth keeping (garak's run setup, Inspect's eval spec).
    setup: Map<String, Value>,
    /// The cases of `--cases`, by id (loaded at the first lookup).
    /// The cases of the `--cases` corpora, by id (loaded and checked before anything is
    /// read).
    known: HashMap<String, std::sync::Arc<AttackCase>>,
    /// Where SQLite sources are copied to be read (beside the run being written; made
    /// at the first database, removed with the sink).
    scratch: Option<crate::atomic::TempDir>,
    /// The SQLite sources read, with what was read of each.
    databases: BTreeMap<PathBuf, sqlite::Snapshot>,
}

#[derive(Default)]
struct Counts {
    cases: u64,
    predictions: u64,
    scores: u64,
    tool_calls: u64,
}

impl Sink {
    fn create(
        tool: &'static str,
        run_id: &str,
        dir: &Path,
        options: ImportOptions,
        taxonomy: crate::taxonomy::Taxonomy,
        known: HashMap<String, std::sync::Arc<AttackCase>>,
    ) -> Result<Self> {
        let open = |name: &str| -> Result<BufWriter<std::fs::File>> {
            let path = dir.join(name);
            std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(&path)
                .map(|f| BufWriter::with_capacity(1 << 20, f))
                .map_err(|e| Error::io(&path, "cannot create", e))
        };
        Ok(Sink {
            tool,
            run_id: run_id.to_owned(),
            dir: dir.to_path_buf(),
            cases: open(crate::rundir::CASES_FILE)?,
            predictions: open(crate::rundir::PREDICTIONS_FILE)?,
            scores: TableWriter::new(
                dir.join(crate::rundir::SOURCE_SCORES_FILE),
                crate::contract::arrow::source_scores_schema(),
            ),
            tables: crate::rundir::checkpoint::AttemptTables::new(dir),
            case_ids: HashMap::new(),
            order: Vec::new(),
            lines: 0,
            lives: Default::default(),
            taxonomy_summary: BTreeMap::new(),
            criteria: Default::default(),
            taxonomy,
            versions: BTreeSet::new(),
            models: BTreeSet::new(),
            source_runs: BTreeSet::new(),
            started: None,
            options,
            counts: Counts::default(),
            setup: Map::new(),
            known,
            scratch: None,
            databases: BTreeMap::new(),
        })
    }

    /// Open a SQLite source for reading (a snapshot in the scratch folder, under the
    /// bounds of [`sqlite::Database`]); the manifest records what was read of it.
    pub fn database(&mut self, path: &Path) -> Result<sqlite::Database> {
        if self.scratch.is_none() {
            let name = format!("{}.sources", self.run_id);
            self.scratch = Some(crate::atomic::TempDir::create(
                &self.options.output.with_file_name(name),
            )?);
        }
        let scratch = self.scratch.as_ref().expect("made above").path();
        let db = sqlite::Database::open(path, scratch, self.options.max_line_bytes)?;
        self.databases
            .insert(path.to_path_buf(), db.snapshot.clone());
        Ok(db)
    }

    /// The tool's name (`source_tool`, `source_name`).
    pub fn tool(&self) -> &'static str {
        self.tool
    }

    /// The tool's version, as a file records it.
    pub fn version(&mut self, v: &str) {
        self.versions.insert(v.to_owned());
    }

    /// A model the results are of.
    pub fn model(&mut self, m: &str) {
        self.models.insert(m.to_owned());
    }

    /// When the source run started (RFC 3339): the earliest is the run's timestamp.
    pub fn started(&mut self, t: &str) {
        if self.started.as_deref().is_none_or(|s| t < s) {
            self.started = Some(t.to_owned());
        }
    }

    /// A setting of the source run, kept in the manifest's import block.
    pub fn setup(&mut self, key: &str, value: Value) {
        self.setup.insert(key.to_owned(), value);
    }

    /// The run whose attempts' trace ids the spans carry (`--trace-run`).
    pub fn trace_run(&self) -> Option<String> {
        self.options.trace_run.clone()
    }

    /// Every case id of the `--cases` corpora.
    pub fn known_case_ids(&self) -> Vec<String> {
        let mut ids: Vec<String> = self.known.keys().cloned().collect();
        ids.sort();
        ids
    }

    /// The case `id` of the `--cases` corpora, when they hold it.
    pub fn known_case(&self, id: &str) -> Option<std::sync::Arc<AttackCase>> {
        self.known.get(id).cloned()
    }

    /// A new case: `source_name` the tool, `source_type` red_team, the reference the
    /// source line, and in `provenance` the tool's name and its own ids verbatim
    /// (`source_ids`: each id the case id was made from, by name). Criteria and the rest
    /// are the importer's (its own provenance fields go in with [`add_provenance`]).
    #[allow(clippy::too_many_arguments)]
    pub fn new_case(
        &self,
        case_id: String,
        source_ids: &[(&str, &str)],
        family: &str,
        surface: AttackSurface,
        prompt: String,
        criteria: SuccessCriteria,
        at: &At,
    ) -> AttackCase {
        let mut case = AttackCase::new(
            case_id,
            self.tool.to_owned(),
            SourceType::RedTeam,
            family.to_owned(),
            surface,
            prompt,
            criteria,
        );
        case.source_reference = Some(at.reference());
        let ids: Map<String, Value> = source_ids
            .iter()
            .map(|(k, v)| ((*k).to_owned(), Value::String((*v).to_owned())))
            .collect();
        case.provenance = Some(json!({"tool": self.tool, "source_ids": ids}));
        case
    }

    /// Write a case (enriched, checked against the contract); the case id it was written
    /// under. The same case again is one case. Another case under an id already written
    /// (a tool's id given to two different records: a task run twice with another
    /// dataset, two logs merged) is kept under an id of its own: the id cut to leave room,
    /// then `-h` and a hash of the id and the case's content — stable, distinct from
    /// every id made by [`case_id`], and the tool's id stays verbatim in its provenance.
    pub fn case(&mut self, at: &At, case: &AttackCase) -> Result<String> {
        // a case of the `--cases` corpora (the very one [`Self::known_case`] gave) was
        // checked against the contract when its corpus loaded
        let corpus_own = self
            .known
            .get(&case.case_id)
            .is_some_and(|k| std::ptr::eq(k.as_ref(), case));
        let mut case = self.taxonomy.enrich(case);
        if !corpus_own
            && let Some((field, problem)) =
                crate::ingest::contract_error(&case.to_json_line(), &mut self.criteria)
        {
            return Err(at.error(
                field.as_deref(),
                format!("the case pieval made of this record breaks the contract: {problem}"),
            ));
        }
        // The same case is the same content wherever it was read (an epoch, another log
        // of the same task): the digest leaves out the place it was read at.
        let content = |case: &mut AttackCase| -> [u8; 32] {
            let reference = case.source_reference.take();
            let digest = sha2::Sha256::digest(case.to_json_line().as_bytes()).into();
            case.source_reference = reference;
            digest
        };
        let mut digest = content(&mut case);
        match self.case_ids.get(&case.case_id) {
            Some(d) if *d == digest => return Ok(case.case_id),
            Some(_) => {
                let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
                case.case_id = hashed_id(
                    &case.case_id,
                    &short_hash("same-id", &[&case.case_id, &hex]),
                );
                digest = content(&mut case);
                match self.case_ids.get(&case.case_id) {
                    Some(d) if *d == digest => return Ok(case.case_id),
                    Some(_) => {
                        return Err(at.error(
                            None,
                            format!(
                                "case id {} was made from another record before, with other content (a hash collision: please report it)",
                                case.case_id
                            ),
                        ));
                    }
                    None => {}
                }
            }
            None => {}
        }
        self.case_ids.insert(case.case_id.clone(), digest);
        self.order.push(case.case_id.clone());
        for (field, value) in [
            ("attack_family", Some(case.attack_family.as_str())),
            ("attack_surface", Some(case.attack_surface.as_str())),
            ("attack_category", case.attack_category.map(|c| c.as_str())),
            ("label", case.label.map(|l| l.as_str())),
        ] {
            *self
                .taxonomy_summary
                .entry(field.to_owned())
                .or_default()
                .entry(value.unwrap_or("unknown").to_owned())
                .or_default() += 1;
        }
        let line = case.to_json_line();
        let io = |e| Error::io(self.dir.join(crate::rundir::CASES_FILE), "cannot write", e);
        self.cases.write_all(line.as_bytes()).map_err(io)?;
        self.cases.write_all(b"\n").map_err(io)?;
        self.counts.cases += 1;
        Ok(case.case_id)
    }

    /// Write a row: its prediction (tagged with the run, the tool and `at`) and scores.
    pub fn row(&mut self, at: &At, mut row: Row) -> Result<()> {
        let p = &mut row.prediction;
        if !self.case_ids.contains_key(&p.case_id) {
            return Err(Error::Internal(format!(
                "{}: a prediction for case {} before its case",
                at.reference(),
                p.case_id
            )));
        }
        p.run_id = self.run_id.clone();
        p.source_tool = Some(self.tool.to_owned());
        p.source_ref = Some(at.reference());
        if p.mitigation.is_empty() {
            p.mitigation = "none".into();
        }
        if p.execution_mode.is_empty() {
            p.execution_mode = "replay".into();
        }
        if p.provider.is_empty() {
            p.provider = self.tool.to_owned();
        }
        // A generation, epoch or provider of the same case is a sample of the case as it
        // is (no converter, no strategy of pieval's): the controls count it as such
        // (`pi_is_baseline`).
        if p.attempt_id.is_some() {
            p.attack_pipeline.get_or_insert_with(|| "none".into());
            p.attack_strategy.get_or_insert_with(|| "none".into());
        }
        // The verdict: the chosen scorer's, else the tool's own overall one.
        if let Some(name) = &self.options.source_scorer {
            let s = row.scores.iter().find(|s| &s.scorer == name);
            p.source_detector = s.map(|s| s.scorer.clone());
            p.source_verdict = s.and_then(|s| s.verdict);
            p.source_score = s.and_then(|s| s.score);
        }
        bound_row(p, at)?;
        crate::interrupt::check()?;
        self.counts.tool_calls += p
            .turns
            .iter()
            .map(|t| t.tool_calls.len() as u64)
            .sum::<u64>();
        let attempt = p.attempt_id.clone();
        let (case_id, reference) = (p.case_id.clone(), at.reference());
        let path = self.dir.join(crate::rundir::PREDICTIONS_FILE);
        self.lines += crate::rundir::checkpoint::write_attempt(
            &mut self.predictions,
            &path,
            &mut row.prediction,
        )
        .map_err(|e| match e {
            Error::State(m) => at.error(None, format!("the row pieval made of this record: {m}")),
            e => e,
        })?;
        self.lives.saw(&case_id, self.lines as i64);
        self.tables.add(&row.prediction)?;
        self.counts.predictions += 1;
        for s in &row.scores {
            self.scores
                .text(Some(&self.run_id))
                .text(Some(&case_id))
                .text(attempt.as_deref())
                .text(Some(self.tool))
                .text(Some(&s.scorer))
                .text(s.value.as_deref())
                .float(s.score)
                .flag(s.verdict)
                .text(s.explanation.as_deref())
                .text(Some(&reference));
            self.scores.end_row()?;
            self.counts.scores += 1;
        }
        Ok(())
    }

    fn finish(mut self) -> Result<Finished> {
        for (w, name) in [
            (&mut self.cases, crate::rundir::CASES_FILE),
            (&mut self.predictions, crate::rundir::PREDICTIONS_FILE),
        ] {
            w.flush()
                .map_err(|e| Error::io(self.dir.join(name), "cannot write", e))?;
        }
        self.scores.finish()?;
        self.tables.finish()?;
        Ok(Finished {
            databases: self.databases,
            case_ids: self.order,
            lives: self.lives,
            taxonomy_summary: self.taxonomy_summary,
            versions: self.versions,
            models: self.models,
            source_runs: self.source_runs,
            started: self.started,
            counts: self.counts,
            setup: self.setup,
        })
    }
}

struct Finished {
    databases: BTreeMap<PathBuf, sqlite::Snapshot>,
    case_ids: Vec<String>,
    lives: crate::engine::case_window::CaseLives,
    taxonomy_summary: BTreeMap<String, BTreeMap<String, u64>>,
    versions: BTreeSet<String>,
    models: BTreeSet<String>,
    source_runs: BTreeSet<String>,
    started: Option<String>,
    counts: Counts,
    setup: Map<String, Value>,
}

/// The source files of PATH: the file, or a folder's files the importer reads (for the
/// manifest's digests: every file read is listed).
fn hash_source(path: &Path) -> Result<SourceFile> {
    let meta = std::fs::symlink_metadata(path).map_err(|e| Error::io(path, "cannot read", e))?;
    if meta.file_type().is_symlink() {
        return Err(Error::Usage(format!(
            "{}: a symbolic link is not followed (give the file itself)",
            path.display()
        )));
    }
    Ok(SourceFile {
        path: path.display().to_string(),
        bytes: meta.len(),
        sha256: crate::digest::sha256_file_in(path, crate::files::Links::Refuse)?,
        sqlite: None,
    })
}

/// Whether `f` is a `-wal`, `-shm` or `-journal` file beside a database.
fn is_beside_a_database(f: &Path) -> bool {
    sqlite::is_database_or_beside_one(f)
        && ["-wal", "-shm", "-journal"]
            .iter()
            .any(|s| f.to_string_lossy().ends_with(s))
}

/// A file's size and modification time: what tells that it changed while it was read.
fn stamp(path: &Path) -> Result<(u64, Option<std::time::SystemTime>)> {
    let m = std::fs::symlink_metadata(path).map_err(|e| Error::io(path, "cannot read", e))?;
    Ok((m.len(), m.modified().ok()))
}

/// Every regular file under `path` (itself when it is a file), sorted; links refused.
pub fn files_under(path: &Path) -> Result<Vec<PathBuf>> {
    let meta = std::fs::symlink_metadata(path).map_err(|e| Error::io(path, "cannot read", e))?;
    if meta.file_type().is_symlink() {
        return Err(Error::Usage(format!(
            "{}: a symbolic link is not followed (give the file or folder itself)",
            path.display()
        )));
    }
    if meta.is_file() {
        return Ok(vec![path.to_path_buf()]);
    }
    let mut out = Vec::new();
    let mut stack = vec![path.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let entries = std::fs::read_dir(&dir).map_err(|e| Error::io(&dir, "cannot read", e))?;
        for e in entries {
            let e = e.map_err(|e| Error::io(&dir, "cannot read", e))?;
            let ty = e
                .file_type()
                .map_err(|x| Error::io(e.path(), "cannot read", x))?;
            if ty.is_dir() {
                stack.push(e.path());
            } else if ty.is_file() {
                out.push(e.path());
            }
        }
    }
    out.sort();
    Ok(out)
}

/// Import: read every PATH with the tool's importer into a folder under a temporary
/// name, score it, write its manifest, and swap it in.
pub fn import(opts: &ImportOptions) -> Result<ImportReport> {
    let imp = importer(&opts.tool)?;
    if opts.paths.is_empty() {
        return Err(Error::Usage("give at least one PATH to import".into()));
    }
    if opts.output.exists() && !opts.replace {
        return Err(Error::Usage(format!(
            "{}: already exists (give another --output, or --replace to write over it)",
            opts.output.display()
        )));
    }
    let run_id = opts
        .output
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .ok_or_else(|| Error::Usage(format!("{}: not a folder path", opts.output.display())))?;
    crate::rundir::check_run_id(&run_id)?;
    if let Some(parent) = opts.output.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent)
            .map_err(|e| Error::io(parent, "cannot create folder", e))?;
    }
    let taxonomy = match &opts.taxonomy {
        Some(t) => crate::taxonomy::Taxonomy::load(t)?,
        None => crate::taxonomy::Taxonomy::shipped()?,
    };
    // The source files: their digests are taken on a thread of their own while the
    // importer reads them; a file whose size or modification time differs after the
    // import changed while it was read.
    // A SQLite database (and its -wal, -shm, -journal) is read through a snapshot
    // whose digest the manifest records: a tool may still be writing it, which is not
    // a change to refuse.
    let mut all = Vec::new();
    for p in &opts.paths {
        all.extend(files_under(p)?);
    }
    let (databases, files): (Vec<PathBuf>, Vec<PathBuf>) = all
        .iter()
        .cloned()
        .partition(|f| sqlite::is_database_or_beside_one(f));
    let stamps = files.iter().map(|f| stamp(f)).collect::<Result<Vec<_>>>()?;
    // The corpora of --cases load (and validate) before anything is read.
    let mut corpora = Vec::new();
    let mut known = HashMap::new();
    for c in &opts.cases {
        for f in files_under(c)?.into_iter().filter(|f| {
            f.extension()
                .is_some_and(|e| e == "jsonl" || e == "parquet")
        }) {
            for case in crate::runner::setup::load_cases(&f)?.cases {
                known.insert(case.case_id.clone(), std::sync::Arc::new(case));
            }
            corpora.push(f);
        }
    }
    let mut opts = opts.clone();
    opts.cases = corpora;
    let opts = &opts;
    let tmp = crate::atomic::TempDir::create(&opts.output)?;
    let mut sink = Sink::create(imp.name, &run_id, tmp.path(), opts.clone(), taxonomy, known)?;
    let (read, sources) = std::thread::scope(|scope| {
        let hashing = scope.spawn(|| {
            files
                .iter()
                .map(|f| hash_source(f))
                .collect::<Result<Vec<_>>>()
        });
        let read = opts
            .paths
            .iter()
            .try_for_each(|p| (imp.import)(p, &mut sink));
        let sources = hashing
            .join()
            .unwrap_or_else(|_| Err(Error::Internal("the source hashing panicked".into())));
        (read, sources)
    });
    read?;
    let hashed = sources?;
    let mut done = sink.finish()?;
    let lives = std::sync::Arc::new(std::mem::take(&mut done.lives));
    // The sources in the order found: a file's digest, a database's snapshot (one the
    // importer did not read is hashed as a file; the files beside one are in its
    // snapshot's record).
    let databases: std::collections::HashSet<PathBuf> = databases.into_iter().collect();
    let mut sources = Vec::new();
    let mut hashed = hashed.into_iter();
    for f in &all {
        if !databases.contains(f) {
            sources.extend(hashed.next());
        } else if let Some(s) = done.databases.get(f) {
            sources.push(SourceFile {
                path: f.display().to_string(),
                bytes: s.bytes,
                sha256: s.sha256.clone(),
                sqlite: Some(s.clone()),
            });
        } else if !is_beside_a_database(f) {
            sources.push(hash_source(f)?);
        }
    }
    if done.counts.predictions == 0 {
        return Err(Error::Usage(format!(
            "{}: no results found to import (is this a {} result file?)",
            opts.paths
                .iter()
                .map(|p| p.display().to_string())
                .collect::<Vec<_>>()
                .join(", "),
            imp.name
        )));
    }
    for (f, before) in files.iter().zip(&stamps) {
        if stamp(f)? != *before {
            return Err(Error::State(format!(
                "{}: changed while it was imported; import it again",
                f.display()
            )));
        }
    }
    let config = config_for(
        imp.name,
        &run_id,
        &opts.output,
        &done,
        opts.judge.as_deref(),
    )?;
    let mut manifest = manifest_for(
        imp.name,
        &run_id,
        &opts.output,
        tmp.path(),
        &config,
        &done,
        &sources,
        opts,
    )?;
    manifest.write(tmp.path())?;
    let report = crate::runner::score_run(
        tmp.path(),
        &run_id,
        &config,
        None,
        None,
        crate::judge::RunVerdicts::Own,
        Vec::new(),
        true,
        Some(lives),
    )
    .map_err(|e| relocate(e, tmp.path(), &all))?;
    crate::runner::finish_manifest(&mut manifest, &report);
    manifest.write(tmp.path())?;
    let (source_verdicts, agreed, disagreed) =
        agreement(tmp.path()).map_err(|e| relocate(e, tmp.path(), &all))?;
    let output = tmp.commit()?;
    Ok(ImportReport {
        tool: imp.name.to_owned(),
        tool_version: done.versions.iter().next_back().cloned(),
        run_id,
        output,
        sources,
        cases: done.counts.cases,
        predictions: done.counts.predictions,
        tool_calls: done.counts.tool_calls,
        source_scores: done.counts.scores,
        source_verdicts,
        agreed,
        disagreed,
        attack_success: report.attack_success,
        manual_review: report.manual_review,
    })
}

/// An error met while the import was scored names a file of the run being written,
/// under its temporary name (`.run.tmp-…/predictions.jsonl:7`): what the user can find is
/// the record it was made from. The error is put at the source file and its line or entry
/// (the row's `source_ref`, the case's `source_reference`), pieval's file named after it.
/// An error of another shape has the temporary folder's name taken out of its text.
fn relocate(e: Error, tmp: &Path, sources: &[PathBuf]) -> Error {
    match e {
        Error::Input {
            path,
            line,
            field,
            message,
        } if path.starts_with(tmp) => {
            let name = path
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            let what = match name.as_str() {
                crate::rundir::PREDICTIONS_FILE => "row",
                crate::rundir::CASES_FILE => "case",
                _ => "file",
            };
            match record_source(&path, line, sources) {
                Some((source, reference)) => Error::Input {
                    path: source,
                    line: reference.1,
                    field: Some(match (&reference.0, field) {
                        (Some(entry), Some(f)) => format!("{entry}: {f}"),
                        (Some(entry), None) => entry.clone(),
                        (None, f) => f.unwrap_or_else(|| "record".into()),
                    }),
                    message: format!(
                        "{message} (in the {what} pieval made of this record: {name} line {line})"
                    ),
                },
                None => Error::State(format!(
                    "{name} line {line} of the run being imported: {}: {message}",
                    field.as_deref().unwrap_or("record")
                )),
            }
        }
        Error::Io {
            path,
            action,
            source,
        } if path.starts_with(tmp) => Error::State(format!(
            "{} of the run being imported: {action}: {source}",
            path.strip_prefix(tmp).unwrap_or(&path).display()
        )),
        Error::Config { path, message } if path.starts_with(tmp) => Error::State(format!(
            "{} of the run being imported: {}",
            path.strip_prefix(tmp).unwrap_or(&path).display(),
            untemporary(&message, tmp)
        )),
        Error::Query(m) => Error::Query(untemporary(&m, tmp)),
        Error::State(m) => Error::State(untemporary(&m, tmp)),
        Error::Internal(m) => Error::Internal(untemporary(&m, tmp)),
        Error::Usage(m) => Error::Usage(untemporary(&m, tmp)),
        e => e,
    }
}

/// `text` with the temporary folder's path said as what it is.
fn untemporary(text: &str, tmp: &Path) -> String {
    text.replace(&tmp.display().to_string(), "(the run being imported)")
}

/// The source of the record at `line` of a file of the run being written
/// (`predictions.jsonl`: the row of that line, or of the turn lines it belongs to;
/// `cases.jsonl`: the case): its source file (the one of `sources` its reference names,
/// else its name as written), and its entry and line there.
fn record_source(
    path: &Path,
    line: u64,
    sources: &[PathBuf],
) -> Option<(PathBuf, (Option<String>, u64))> {
    use crate::corpus::lines::{Line, LineReader};
    let file = crate::files::open_regular(path, crate::files::Links::Refuse).ok()?;
    let mut reader = LineReader::new(
        std::io::BufReader::new(file),
        crate::rundir::checkpoint::MAX_LINE_BYTES,
    );
    let mut n = 0u64;
    let reference = loop {
        let next = reader.next_line().ok()??;
        n += 1;
        if n < line {
            continue;
        }
        let Line::Bytes(bytes) = next else {
            return None;
        };
        let v: Value = serde_json::from_slice(bytes).ok()?;
        // A turn line: its row is the prediction line after its attempt's turns.
        if v.get(crate::rundir::checkpoint::RECORD_KEY).is_some() {
            continue;
        }
        break v
            .get("source_ref")
            .or_else(|| v.get("source_reference"))?
            .as_str()?
            .to_owned();
    };
    // `name:line`, `name:entry` or `name:entry:line` (At::reference).
    let matching: Vec<&PathBuf> = sources
        .iter()
        .filter(|s| {
            s.file_name()
                .is_some_and(|n| reference.starts_with(&format!("{}:", n.to_string_lossy())))
        })
        .collect();
    let (source, rest) = match matching.as_slice() {
        [one] => {
            let n = one.file_name()?.to_string_lossy().len();
            ((*one).clone(), reference[n + 1..].to_owned())
        }
        _ => {
            let (name, rest) = reference.split_once(':')?;
            (PathBuf::from(name), rest.to_owned())
        }
    };
    let place = match rest.parse::<u64>() {
        Ok(l) => (None, l),
        Err(_) => match rest.rsplit_once(':') {
            Some((entry, l)) if l.parse::<u64>().is_ok() => {
                (Some(entry.to_owned()), l.parse().unwrap_or(0))
            }
            _ => (Some(rest), 0),
        },
    };
    Some((source, place))
}

/// Read `path` with `tool`'s importer into a sink in `dir` (a folder of the caller's; no
/// run folder is made and nothing is scored): the rows read. Every record parser of every
/// importer is reached through here by the fuzz tests (`tests/it/fuzz.rs`).
pub fn read_records(tool: &str, path: &Path, dir: &Path) -> Result<u64> {
    let imp = importer(tool)?;
    let opts = ImportOptions {
        tool: tool.to_owned(),
        paths: vec![path.to_path_buf()],
        output: dir.join("run"),
        replace: false,
        source_scorer: None,
        correct_means_attack: true,
        judge: None,
        command: String::new(),
        max_line_bytes: crate::corpus::lines::DEFAULT_MAX_LINE_BYTES * 64,
        taxonomy: None,
        cases: Vec::new(),
        trace_run: None,
    };
    let mut sink = Sink::create(
        imp.name,
        "run",
        dir,
        opts,
        crate::taxonomy::Taxonomy::shipped()?,
        HashMap::new(),
    )?;
    (imp.import)(path, &mut sink)?;
    Ok(sink.finish()?.counts.predictions)
}

/// Rows with a source verdict; of those decided by pieval too, agreeing and not.
fn agreement(dir: &Path) -> Result<(u64, u64, u64)> {
    let path = dir.join(crate::rundir::CASE_RESULTS_PARQUET);
    let file = std::fs::File::open(&path).map_err(|e| Error::io(&path, "cannot open", e))?;
    let reader =
        datafusion::parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(file)?
            .build()?;
    let (mut n, mut agree, mut disagree) = (0, 0, 0);
    for batch in reader {
        use datafusion::arrow::array::{Array, AsArray};
        let batch = batch?;
        let (Some(ours), Some(theirs)) = (
            batch.column_by_name("attack_success"),
            batch.column_by_name("source_verdict"),
        ) else {
            continue;
        };
        let (ours, theirs) = (ours.as_boolean(), theirs.as_boolean());
        for i in 0..batch.num_rows() {
            if theirs.is_null(i) {
                continue;
            }
            n += 1;
            if ours.is_valid(i) {
                if ours.value(i) == theirs.value(i) {
                    agree += 1;
                } else {
                    disagree += 1;
                }
            }
        }
    }
    Ok((n, agree, disagree))
}

/// The experiment config an imported run records: what `replay --rescore` reads back.
/// The model is the tool's (replayed: the answers are in the run), the corpus the run's
/// own cases.
fn config_for(
    tool: &str,
    run_id: &str,
    output: &Path,
    done: &Finished,
    judge: Option<&Path>,
) -> Result<crate::experiment::config::Config> {
    let model = match done.models.len() {
        0 => format!("{tool}-results"),
        1..=4 => done.models.iter().cloned().collect::<Vec<_>>().join(", "),
        n => format!("{n} models"),
    };
    let parent = output
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let snapshot = json!({
        "experiment": {"name": format!("import-{tool}"), "seed": 0, "output_dir": parent.display().to_string()},
        "dataset": {"path": output.join(crate::rundir::CASES_FILE).display().to_string()},
        "model": {"provider": "replay", "name": model, "replay_from": run_id, "execution_mode": "replay"},
        "mitigation": {"name": "none"},
    });
    let origin = output.join(crate::rundir::MANIFEST_FILE);
    let mut config = crate::experiment::config::Config::from_snapshot(&snapshot, &origin)?;
    if let Some(j) = judge {
        config.evaluation.judge = Some(crate::judge::config::JudgeSection::load(j)?);
    }
    Ok(config)
}

fn manifest_for(
    tool: &str,
    run_id: &str,
    output: &Path,
    tmp: &Path,
    config: &crate::experiment::config::Config,
    done: &Finished,
    sources: &[SourceFile],
    opts: &ImportOptions,
) -> Result<Manifest> {
    use crate::rundir::manifest::{DatasetSnapshot, SelectionSnapshot};
    let now = crate::text::utc_rfc3339(crate::text::unix_now());
    let cases_sha256 = crate::digest::sha256_file_in(
        &tmp.join(crate::rundir::CASES_FILE),
        crate::files::Links::Refuse,
    )?;
    let n = done.case_ids.len() as u64;
    let mut m = Manifest {
        run_id: run_id.to_owned(),
        timestamp: done.started.clone().unwrap_or_else(|| now.clone()),
        git_commit: (!crate::GIT_COMMIT.is_empty()).then(|| crate::GIT_COMMIT.to_owned()),
        config_source_path: None,
        config_snapshot: config.snapshot(),
        dataset_snapshot: DatasetSnapshot {
            path: output.join(crate::rundir::CASES_FILE).display().to_string(),
            sha256: cases_sha256.clone(),
            selected_case_ids: done.case_ids.clone(),
            total_available_cases: n,
            total_filtered_cases: n,
            selection_snapshot: SelectionSnapshot {
                algorithm: format!(
                    "import: every result {tool} recorded, in its order (src/import/mod.rs)"
                ),
                ..SelectionSnapshot::default()
            },
            taxonomy_summary: done.taxonomy_summary.clone(),
            ..DatasetSnapshot::default()
        },
        status: Some(RunStatus::Running),
        started_at: Some(now),
        pieval_version: Some(env!("CARGO_PKG_VERSION").to_owned()),
        ..Manifest::default()
    };
    m.model_snapshot.provider = "replay".into();
    m.model_snapshot.name = config.model.name.clone();
    m.model_snapshot.execution_mode = "replay".into();
    m.model_snapshot.replay_from = Some(run_id.to_owned());
    m.mitigation_snapshot.name = "none".into();
    m.replay_hints.command = format!("pieval replay {} --rescore", output.display());
    m.replay_hints.corpus_sha256 = cases_sha256;
    m.replay_hints.selected = n;
    m.replay_hints.pieval_version = env!("CARGO_PKG_VERSION").to_owned();
    let mut block = Map::new();
    block.insert("tool".into(), json!(tool));
    block.insert(
        "tool_version".into(),
        match done.versions.len() {
            0 => Value::Null,
            1 => json!(done.versions.iter().next()),
            _ => json!(done.versions.iter().collect::<Vec<_>>()),
        },
    );
    block.insert(
        "sources".into(),
        serde_json::to_value(sources).unwrap_or_default(),
    );
    block.insert("command".into(), json!(opts.command));
    block.insert(
        "source_runs".into(),
        json!(done.source_runs.iter().collect::<Vec<_>>()),
    );
    block.insert(
        "models".into(),
        json!(done.models.iter().collect::<Vec<_>>()),
    );
    if let Some(s) = &opts.source_scorer {
        block.insert("source_scorer".into(), json!(s));
    }
    if tool == "inspect" {
        block.insert(
            "correct_means".into(),
            json!(if opts.correct_means_attack {
                "attack"
            } else {
                "defence"
            }),
        );
    }
    if !done.setup.is_empty() {
        block.insert("setup".into(), Value::Object(done.setup.clone()));
    }
    m.extra.insert("import".into(), Value::Object(block));
    Ok(m)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// docs/import.md's table is the registry's.
    #[test]
    fn the_docs_list_every_importer() {
        let docs = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/import.md"))
            .unwrap();
        let begin = docs.find("<!-- importers:begin").unwrap();
        let body = &docs[begin..];
        let body = &body[body.find('\n').unwrap() + 1..body.find("<!-- importers:end").unwrap()];
        assert_eq!(
            body,
            docs_table(),
            "docs/import.md's importer table differs from IMPORTERS"
        );
    }

    /// Ids as tools write them, and ids made to trip a scheme: every case id is the
    /// contract's, the same ids give the same case id, and distinct ids distinct ones.
    #[test]
    fn case_ids_from_any_tools_ids_are_valid_stable_and_distinct() {
        let long = "x".repeat(10 * 1024);
        let hashed_look = format!("a{HASH_MARK}{}", "0123456789abcdef");
        let singles: Vec<String> = vec![
            "abc-1".into(),
            "".into(),
            " ".into(),
            "sample 1".into(),
            "sample 1/ä".into(),
            "sample 1/ö".into(),
            "sample_1__".into(),
            "sample.1".into(),
            "..".into(),
            "../../etc/passwd".into(),
            "a:b".into(),
            "a_b".into(),
            "a/b".into(),
            "日本語".into(),
            "\u{202e}evil".into(),
            "\0".into(),
            "-leading".into(),
            "~tilde".into(),
            long.clone(),
            format!("{long}y"),
            hashed_look.clone(),
            format!("{}{HASH_MARK}{}", "a", short_hash("part", &["a/"])),
            "a/".into(),
        ];
        let pairs: Vec<(String, String)> = vec![
            ("inspect_evals/agentdojo".into(), "1".into()),
            ("inspect_evals_agentdojo".into(), "1".into()),
            ("a:b".into(), "c".into()),
            ("a".into(), "b:c".into()),
            ("a".into(), "b".into()),
            ("".into(), "".into()),
            ("t".into(), long.clone()),
            (long.clone(), "t".into()),
            ("t".into(), hashed_look.clone()),
            ("task".into(), "x".repeat(100)),
            ("task".into(), format!("{}y", "x".repeat(100))),
        ];
        let mut seen = std::collections::HashMap::new();
        // (An importer gives the same number of parts for every record.)
        let mut check = |parts: Vec<String>| {
            let refs: Vec<&str> = parts.iter().map(String::as_str).collect();
            let tool = format!("tool{}", parts.len());
            let id = case_id(&tool, &refs);
            assert!(is_contract_id(&id), "{id:?} from {parts:?}");
            assert_eq!(id, case_id(&tool, &refs), "stable");
            if let Some(other) = seen.insert(id.clone(), parts.clone()) {
                assert_eq!(other, parts, "{id} made from two different id lists");
            }
        };
        for s in &singles {
            check(vec![s.clone()]);
        }
        for (a, b) in &pairs {
            check(vec![a.clone(), b.clone()]);
        }
        for s in &singles {
            check(vec!["task".into(), s.clone()]);
            check(vec![s.clone(), "1".into()]);
        }
        // Plain ids are kept as they are; the others say where they came from.
        assert_eq!(case_id("garak", &["abc-1"]), "garak:abc-1");
        assert_eq!(
            case_id("promptfoo", &["eval-j1h-2026-12-03T18:50:20:t0:p1"]),
            "promptfoo:eval-j1h-2026-12-03T18:50:20:t0:p1"
        );
        let inspect = case_id("inspect", &["inspect_evals/agentdojo", "user_task_0"]);
        assert!(
            inspect.starts_with("inspect:inspect_evals_agentdojo-h")
                && inspect.ends_with(":user_task_0"),
            "{inspect}"
        );
        assert!(case_id("x", &[&long]).len() <= MAX_ID_BYTES);
    }

    /// An error met while the import was scored is put at the record it was made from:
    /// never at pieval's own file under its temporary name.
    #[test]
    fn errors_of_the_run_being_written_name_the_source_record() {
        let tmp = tempfile::tempdir().unwrap();
        let run = tmp.path().join(".r.tmp-1-0000000000000000");
        std::fs::create_dir(&run).unwrap();
        std::fs::write(
            run.join(crate::rundir::PREDICTIONS_FILE),
            concat!(
                r#"{"pieval_record":"turn","case_id":"c","attempt_id":"c","index":1}"#,
                "\n",
                r#"{"case_id":"c","source_ref":"log.eval:samples/x_epoch_1.json"}"#,
                "\n",
                r#"{"case_id":"d","source_ref":"report.jsonl:12"}"#,
                "\n",
            ),
        )
        .unwrap();
        std::fs::write(
            run.join(crate::rundir::CASES_FILE),
            r#"{"case_id":"c","source_reference":"report.jsonl:12"}"#,
        )
        .unwrap();
        let sources = vec![
            PathBuf::from("/data/log.eval"),
            PathBuf::from("/data/report.jsonl"),
        ];
        let at = |file: &str, line: u64| Error::Input {
            path: run.join(file),
            line,
            field: Some("response_text".into()),
            message: "too long".into(),
        };
        let e = relocate(at(crate::rundir::PREDICTIONS_FILE, 1), &run, &sources).to_string();
        assert!(
            e.starts_with("/data/log.eval:0: samples/x_epoch_1.json: response_text: too long"),
            "{e}"
        );
        assert!(!e.contains(".tmp-"), "{e}");
        let e = relocate(at(crate::rundir::PREDICTIONS_FILE, 3), &run, &sources).to_string();
        assert!(
            e.starts_with("/data/report.jsonl:12: response_text: too long"),
            "{e}"
        );
        let e = relocate(at(crate::rundir::CASES_FILE, 1), &run, &sources).to_string();
        assert!(e.starts_with("/data/report.jsonl:12: response_text"), "{e}");
        assert!(e.contains("in the case pieval made of this record"), "{e}");
        // A line that is not there: said without the temporary name.
        let e = relocate(at(crate::rundir::CASES_FILE, 9), &run, &sources).to_string();
        assert!(!e.contains(".tmp-"), "{e}");
        let e = relocate(
            Error::Query(format!(
                "External: {}/predictions.jsonl: bad",
                run.display()
            )),
            &run,
            &sources,
        )
        .to_string();
        assert!(!e.contains(".tmp-"), "{e}");
    }
}
