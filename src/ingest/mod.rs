//! `pieval ingest SOURCE PATH...`: public corpora → normalized attack cases.
//!
//! Each adapter (one file per source) turns its files into [`Item`]s: a case, or a
//! source record it cannot use (with the file, the record and the reason). This module
//! applies `--set` constants, validates every case against the contract, gives
//! duplicate ids and duplicate content their due, and writes JSONL — to stdout, or to
//! `--output` (appended to an existing corpus), atomically.
//!
//! Ids are derived from the source (a record's own id, or a hash of what it holds), so
//! ingesting the same files again gives the same ids. Content duplicates (same prompt,
//! context and task input) across sources are reported, not dropped; the same id with
//! the same content twice is one case.

pub mod agentdojo;
pub mod bipia;
pub mod cyberseceval;
pub mod garak;
pub mod injecagent;
pub mod mapped;
pub mod spikee;
pub mod tensor_trust;

use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};

use serde::Serialize;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use crate::contract::case::AttackCase;
use crate::contract::criteria::SuccessCriteria;
use crate::contract::enums::{AttackSurface, Label, SourceType};
use crate::contract::record::{CriteriaCache, Level, RawRecord, check_record};
use crate::corpus::{CorpusReader, ReadOptions};
use crate::error::{Error, Result};

/// The sources `pieval ingest` knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum SourceKind {
    Cyberseceval,
    Bipia,
    Garak,
    Spikee,
    Agentdojo,
    Injecagent,
    TensorTrust,
    Jsonl,
    Csv,
    Parquet,
}

impl SourceKind {
    pub const ALL: [SourceKind; 10] = [
        SourceKind::Cyberseceval,
        SourceKind::Bipia,
        SourceKind::Garak,
        SourceKind::Spikee,
        SourceKind::Agentdojo,
        SourceKind::Injecagent,
        SourceKind::TensorTrust,
        SourceKind::Jsonl,
        SourceKind::Csv,
        SourceKind::Parquet,
    ];

    /// The name the command line and the report use.
    pub fn as_str(self) -> &'static str {
        match self {
            SourceKind::Cyberseceval => "cyberseceval",
            SourceKind::Bipia => "bipia",
            SourceKind::Garak => "garak",
            SourceKind::Spikee => "spikee",
            SourceKind::Agentdojo => "agentdojo",
            SourceKind::Injecagent => "injecagent",
            SourceKind::TensorTrust => "tensor-trust",
            SourceKind::Jsonl => "jsonl",
            SourceKind::Csv => "csv",
            SourceKind::Parquet => "parquet",
        }
    }
}

/// What an adapter yields.
pub enum Item {
    Case(Box<AttackCase>),
    /// A case as a JSON object whose values may still be outside the contract's
    /// vocabularies (a mapped row): `--set` may replace them before the contract check.
    Record(Box<serde_json::Map<String, Value>>),
    /// A source record that cannot become a case.
    Invalid {
        file: PathBuf,
        record: u64,
        field: Option<String>,
        reason: String,
    },
}

/// Where the adapter's callback sends items.
pub type Emit<'a> = dyn FnMut(Item) -> Result<()> + 'a;

/// Settings every adapter sees.
#[derive(Debug, Clone, Default)]
pub struct Options {
    /// `--map FIELD=COLUMN` (mapped sources).
    pub maps: Vec<(String, String)>,
    /// `--set FIELD=VALUE`: constants, applied to every case last.
    pub sets: Vec<(String, String)>,
    pub source_name: Option<String>,
    pub skip_invalid: bool,
    /// Longest accepted line of a JSONL / CSV source.
    pub max_line_bytes: usize,
    /// A source's stricter success rule, where it has one (injecagent: the data-stealing
    /// e-mail must go to the attacker's address).
    pub strict: bool,
}

/// A lowercase snake_case name from free text (`Task Automation` → `task_automation`).
pub fn slug(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars().flat_map(char::to_lowercase) {
        if c.is_ascii_alphanumeric() {
            out.push(c);
        } else if !out.ends_with('_') && !out.is_empty() {
            out.push('_');
        }
    }
    let out = out.trim_end_matches('_').to_owned();
    match out.chars().next() {
        None => "unspecified".into(),
        Some(c) if c.is_ascii_digit() => format!("n{out}"),
        Some(_) => out,
    }
}

/// The first 16 hex digits of the sha256 of `parts` joined by NUL.
pub fn short_hash(parts: &[&str]) -> String {
    let mut h = Sha256::new();
    for (i, p) in parts.iter().enumerate() {
        if i > 0 {
            h.update([0u8]);
        }
        h.update(p.as_bytes());
    }
    hex::encode(&h.finalize()[..8])
}

/// The upstream version of a dataset copy: the commit or version named in a `SOURCE.md`
/// next to the file or in a parent folder (`github:owner/repo @ <sha>`, `pkg==1.2`).
pub fn upstream_version(path: &Path) -> Option<String> {
    let mut dir = path.parent();
    for _ in 0..4 {
        let d = dir?;
        if let Ok(text) = std::fs::read_to_string(d.join("SOURCE.md")) {
            for line in text.lines().filter(|l| l.starts_with("Source:")) {
                if let Some((_, rest)) = line.split_once(" @ ") {
                    let sha: String = rest.chars().take_while(|c| c.is_ascii_hexdigit()).collect();
                    if sha.len() >= 7 {
                        return Some(sha);
                    }
                }
                if let Some(i) = line.find("==") {
                    let v: String = line[i + 2..]
                        .chars()
                        .take_while(|c| c.is_ascii_alphanumeric() || *c == '.')
                        .collect();
                    if !v.is_empty() {
                        return Some(v);
                    }
                }
            }
        }
        dir = d.parent();
    }
    None
}

/// Common fields of one source file, for building its cases.
pub struct SourceInfo {
    pub source_name: String,
    pub file: PathBuf,
    pub version: String,
    pub license: String,
    pub adapter: &'static str,
}

impl SourceInfo {
    pub fn new(
        opts: &Options,
        default_name: &str,
        file: &Path,
        license: &str,
        adapter: &'static str,
    ) -> Self {
        Self {
            source_name: opts
                .source_name
                .clone()
                .unwrap_or_else(|| default_name.to_owned()),
            file: file.to_path_buf(),
            version: upstream_version(file).unwrap_or_else(|| "unknown".into()),
            license: license.to_owned(),
            adapter,
        }
    }

    /// A file name for references: the path from the dataset folder when recognisable.
    pub fn file_ref(&self) -> String {
        let parts: Vec<String> = self
            .file
            .components()
            .map(|c| c.as_os_str().to_string_lossy().into_owned())
            .collect();
        let start = parts.len().saturating_sub(3);
        parts[start..].join("/")
    }

    /// A case with the required fields, the source fields and provenance filled in.
    /// (The contract's required fields, plus the record and the provenance extras.)
    #[allow(clippy::too_many_arguments)]
    pub fn case(
        &self,
        case_id: String,
        record: &str,
        attack_family: &str,
        attack_surface: AttackSurface,
        prompt: String,
        success_criteria: SuccessCriteria,
        extra: Value,
    ) -> AttackCase {
        let reference = format!("{}#{record}", self.file_ref());
        let mut provenance = json!({
            "source_name": self.source_name,
            "source_type": "public_benchmark",
            "source_reference": reference,
            "source_version": self.version,
            "license": self.license,
            "adapter": self.adapter,
        });
        if let (Value::Object(p), Value::Object(e)) = (&mut provenance, extra) {
            p.extend(e);
        }
        let mut case = AttackCase::new(
            case_id,
            self.source_name.clone(),
            SourceType::PublicBenchmark,
            attack_family.to_owned(),
            attack_surface,
            prompt,
            success_criteria,
        );
        case.label = Some(Label::Attack);
        case.source_reference = Some(reference);
        case.source_version = Some(self.version.clone());
        case.provenance = Some(provenance);
        case
    }

    pub fn invalid(&self, record: u64, field: Option<&str>, reason: impl Into<String>) -> Item {
        Item::Invalid {
            file: self.file.clone(),
            record,
            field: field.map(str::to_owned),
            reason: reason.into(),
        }
    }
}

/// Read a whole JSON file (the small structured sources), with a located error.
pub fn read_json(path: &Path) -> Result<Value> {
    let bytes = std::fs::read(path).map_err(|e| Error::io(path, "cannot read", e))?;
    serde_json::from_slice(&bytes)
        .map_err(|e| Error::input(path, e.line() as u64, None, format!("not valid JSON: {e}")))
}

/// The JSON objects of a JSONL file, one per line, streamed: `f` gets each line's
/// number and its object, or why the line is not one (too long, not UTF-8, not JSON,
/// not an object). Blank lines are skipped.
pub fn for_each_jsonl(
    path: &Path,
    max_line: usize,
    f: &mut dyn FnMut(u64, std::result::Result<Value, String>) -> Result<()>,
) -> Result<()> {
    for_each_jsonl_skipping(path, max_line, &[], f)
}

/// [`for_each_jsonl`], each object's top-level fields named in `skip` read past (their
/// JSON checked, no value built).
pub fn for_each_jsonl_skipping(
    path: &Path,
    max_line: usize,
    skip: &[&str],
    f: &mut dyn FnMut(u64, std::result::Result<Value, String>) -> Result<()>,
) -> Result<()> {
    use crate::corpus::lines::{Line, LineReader};
    let file = std::fs::File::open(path).map_err(|e| Error::io(path, "cannot open", e))?;
    let mut reader = LineReader::new(file, max_line);
    loop {
        let no = reader.line_no() + 1;
        let line = reader
            .next_line()
            .map_err(|e| Error::io(path, "cannot read", e))?;
        let Some(line) = line else { break };
        let parsed = match line {
            Line::TooLong { len } => Err(format!(
                "line of {len} bytes is over the limit of {max_line}"
            )),
            Line::Bytes(b) if b.iter().all(u8::is_ascii_whitespace) => continue,
            Line::Bytes(b) => match std::str::from_utf8(b) {
                Err(e) => Err(format!("not UTF-8: {e}")),
                Ok(text) => match parse_skipping(text, skip) {
                    Ok(v @ Value::Object(_)) => Ok(v),
                    Ok(other) => Err(format!(
                        "expected a JSON object, found {}",
                        crate::contract::criteria::json_kind(&other)
                    )),
                    Err(e) => Err(format!("not valid JSON: {e}")),
                },
            },
        };
        f(no, parsed)?;
    }
    Ok(())
}

/// A JSON document as a value, the top-level object's fields named in `skip` read past.
fn parse_skipping(text: &str, skip: &[&str]) -> serde_json::Result<Value> {
    use serde::de::{DeserializeSeed, Deserializer, IgnoredAny, MapAccess, Visitor};
    if skip.is_empty() {
        return serde_json::from_str(text);
    }
    struct Top<'a>(&'a [&'a str]);
    impl<'de> Visitor<'de> for Top<'_> {
        type Value = Value;
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("a JSON value")
        }
        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> std::result::Result<Value, A::Error> {
            let mut out = serde_json::Map::new();
            while let Some(key) = map.next_key::<String>()? {
                if self.0.contains(&key.as_str()) {
                    map.next_value::<IgnoredAny>()?;
                } else {
                    let v: Value = map.next_value()?;
                    out.insert(key, v);
                }
            }
            Ok(Value::Object(out))
        }
        // Anything else is not an object: its kind is all the caller says of it.
        fn visit_bool<E>(self, v: bool) -> std::result::Result<Value, E> {
            Ok(Value::Bool(v))
        }
        fn visit_i64<E>(self, v: i64) -> std::result::Result<Value, E> {
            Ok(Value::from(v))
        }
        fn visit_u64<E>(self, v: u64) -> std::result::Result<Value, E> {
            Ok(Value::from(v))
        }
        fn visit_f64<E>(self, v: f64) -> std::result::Result<Value, E> {
            Ok(Value::from(v))
        }
        fn visit_str<E>(self, v: &str) -> std::result::Result<Value, E> {
            Ok(Value::from(v))
        }
        fn visit_unit<E>(self) -> std::result::Result<Value, E> {
            Ok(Value::Null)
        }
        fn visit_seq<A: serde::de::SeqAccess<'de>>(
            self,
            mut seq: A,
        ) -> std::result::Result<Value, A::Error> {
            while seq.next_element::<IgnoredAny>()?.is_some() {}
            Ok(Value::Array(Vec::new()))
        }
    }
    impl<'de> DeserializeSeed<'de> for Top<'_> {
        type Value = Value;
        fn deserialize<D: Deserializer<'de>>(self, d: D) -> std::result::Result<Value, D::Error> {
            d.deserialize_any(self)
        }
    }
    let mut de = serde_json::Deserializer::from_str(text);
    let v = Top(skip).deserialize(&mut de)?;
    de.end()?;
    Ok(v)
}

/// What one ingest did.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Report {
    pub source: String,
    pub files: Vec<PathBuf>,
    /// Cases written.
    pub written: u64,
    /// Cases already in the output corpus before (when appending).
    pub existing: u64,
    /// Source records skipped with --skip-invalid, and the first few reasons.
    pub skipped_invalid: u64,
    pub first_invalid: Vec<String>,
    /// The same case (same id, same content) met again: written once.
    pub repeated_records: u64,
    /// Cases whose content (prompt, context, task input) is already in the corpus under
    /// another id, and the first few pairs.
    pub content_duplicates: u64,
    pub first_content_duplicates: Vec<(String, String)>,
    pub output: Option<PathBuf>,
}

const FIRST: usize = 5;

/// The fingerprint of a case's content.
fn content_hash(c: &AttackCase) -> u128 {
    let mut h = Sha256::new();
    for part in [Some(&c.prompt), c.context.as_ref(), c.task_input.as_ref()] {
        h.update(part.map_or("", |s| s.trim()).as_bytes());
        h.update([0u8]);
    }
    u128::from_le_bytes(h.finalize()[..16].try_into().expect("16 bytes"))
}

/// Maps keyed by fingerprints (already uniform hashes): the low 64 bits are the hash.
#[derive(Default, Clone, Copy)]
struct FingerprintHasher(u64);

impl std::hash::Hasher for FingerprintHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        // Only u128 keys are hashed: `write_u128` below; this is a fallback.
        for b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(*b);
        }
    }
    fn write_u128(&mut self, i: u128) {
        self.0 = i as u64;
    }
}

type FingerprintMap<V> = HashMap<u128, V, std::hash::BuildHasherDefault<FingerprintHasher>>;

/// The fingerprint of an id.
fn fingerprint(id: &str) -> u128 {
    u128::from_le_bytes(
        Sha256::digest(id.as_bytes())[..16]
            .try_into()
            .expect("16 bytes"),
    )
}

/// Name the first case of each reported content duplicate: only fingerprints were kept,
/// so the written corpus is read back (once, and only when there are duplicates). On
/// stdout nothing can be read back: the first case is "an earlier case".
fn name_pairs(sink: &mut Sink, pairs: Vec<(String, u128)>) -> Result<Vec<(String, String)>> {
    if pairs.is_empty() {
        return Ok(Vec::new());
    }
    let mut names: HashMap<u128, String> = HashMap::new();
    if let Sink::File(w) = sink {
        let tmp = w.tmp_path().to_path_buf();
        w.flush().map_err(|e| Error::io(&tmp, "cannot write", e))?;
        let wanted: std::collections::HashSet<u128> = pairs.iter().map(|p| p.1).collect();
        let file = std::fs::File::open(&tmp).map_err(|e| Error::io(&tmp, "cannot read", e))?;
        let mut reader = crate::corpus::lines::LineReader::new(file, 1 << 30);
        while let Some(line) = reader
            .next_line()
            .map_err(|e| Error::io(&tmp, "cannot read", e))?
        {
            if let crate::corpus::lines::Line::Bytes(b) = line
                && let Ok(text) = std::str::from_utf8(b)
                && let Ok(rec) = RawRecord::parse(text)
                && let Some(id) = rec.str("case_id")
            {
                let fp = fingerprint(id);
                if wanted.contains(&fp) && !names.contains_key(&fp) {
                    names.insert(fp, id.to_owned());
                    if names.len() == wanted.len() {
                        break;
                    }
                }
            }
        }
    }
    Ok(pairs
        .into_iter()
        .map(|(dup, first)| {
            let name = names
                .get(&first)
                .cloned()
                .unwrap_or_else(|| "an earlier case".into());
            (dup, name)
        })
        .collect())
}

/// A `--set FIELD=VALUE`, parsed once.
enum SetOp {
    Text(String, String),
    Criteria(SuccessCriteria),
    Json(String, Value),
    Confidence(f64),
    License(String),
}

/// Parse the `--set` pairs: unknown fields and bad values are usage errors up front.
fn compile_sets(sets: &[(String, String)]) -> Result<Vec<SetOp>> {
    sets.iter()
        .map(|(field, value)| {
            let bad = |m: String| Error::Usage(format!("--set {field}=…: {m}"));
            Ok(match field.as_str() {
                "success_criteria" => SetOp::Criteria(
                    match serde_json::from_str::<Value>(value) {
                        Ok(j @ Value::Object(_)) => SuccessCriteria::from_json(&j),
                        _ => SuccessCriteria::from_shorthand(value),
                    }
                    .map_err(|e| bad(e.to_string()))?,
                ),
                "license" => SetOp::License(value.clone()),
                "provenance" | "mapping_audit" => SetOp::Json(
                    field.clone(),
                    serde_json::from_str(value).map_err(|e| bad(format!("not JSON: {e}")))?,
                ),
                "mapping_confidence" => SetOp::Confidence(
                    value
                        .parse()
                        .map_err(|_| bad(format!("{value:?} is not a number")))?,
                ),
                f if crate::contract::fields::CASE_FIELDS
                    .iter()
                    .any(|s| s.name == f) =>
                {
                    SetOp::Text(f.to_owned(), value.clone())
                }
                other => {
                    let names: Vec<&str> = crate::contract::fields::CASE_FIELDS
                        .iter()
                        .map(|s| s.name)
                        .collect();
                    let hint = crate::text::did_you_mean(other, &names)
                        .map(|s| format!(" (did you mean {s:?}?)"))
                        .unwrap_or_default();
                    return Err(bad(format!("{other:?} is not a contract field{hint}")));
                }
            })
        })
        .collect()
}

/// Apply the parsed `--set`s to a case as JSON (source fields mirrored into provenance),
/// before the contract check.
fn apply_sets(case: &mut serde_json::Map<String, Value>, ops: &[SetOp]) {
    for op in ops {
        match op {
            SetOp::Criteria(c) => {
                case.insert(
                    "success_criteria".into(),
                    serde_json::to_value(c).expect("criteria serialise"),
                );
            }
            SetOp::Confidence(x) => {
                case.insert("mapping_confidence".into(), json!(x));
            }
            SetOp::License(l) => match case.get_mut("provenance") {
                Some(Value::Object(p)) => {
                    p.insert("license".into(), json!(l));
                }
                _ => {
                    case.insert("provenance".into(), json!({"license": l}));
                }
            },
            SetOp::Json(f, v) if f == "provenance" => {
                case.insert("provenance".into(), v.clone());
            }
            SetOp::Json(_, v) => {
                case.insert("mapping_audit".into(), v.clone());
            }
            SetOp::Text(f, value) => {
                if matches!(
                    f.as_str(),
                    "source_name" | "source_type" | "source_version" | "source_reference"
                ) && let Some(Value::Object(p)) = case.get_mut("provenance")
                {
                    p.insert(f.clone(), json!(value));
                }
                case.insert(f.clone(), json!(value));
            }
        }
    }
}

/// The contract's verdict on one case: the first error, if any.
pub fn contract_error(
    line: &str,
    criteria: &mut CriteriaCache,
) -> Option<(Option<String>, String)> {
    let rec = match RawRecord::parse(line) {
        Ok(r) => r,
        Err(e) => return Some((None, e.to_string())),
    };
    let mut out = Vec::new();
    check_record(&rec, 0, criteria, &mut out);
    out.into_iter()
        .find(|v| v.level == Level::Error)
        .map(|v| (v.field.clone(), v.problem.clone()))
}

/// Where `pieval ingest` writes the cases: a corpus file (appended to when it exists,
/// written atomically), or a stream the caller gives (the CLI's stdout).
pub enum Output<'a> {
    File(&'a Path),
    Stream(&'a mut dyn Write),
}

/// Where the cases go.
enum Sink<'a> {
    Stream(&'a mut dyn Write),
    File(crate::atomic::TempFile),
}

impl Sink<'_> {
    fn write(&mut self, line: &str) -> Result<()> {
        let (w, at): (&mut dyn Write, PathBuf) = match self {
            Sink::Stream(w) => (w, PathBuf::from("<stdout>")),
            Sink::File(w) => {
                let at = w.tmp_path().to_path_buf();
                (w, at)
            }
        };
        w.write_all(line.as_bytes())
            .and_then(|_| w.write_all(b"\n"))
            .map_err(|e| Error::io(at, "cannot write", e))
    }

    fn commit(self) -> Result<()> {
        match self {
            Sink::Stream(w) => w
                .flush()
                .map_err(|e| Error::io("<stdout>", "cannot write", e)),
            Sink::File(w) => w.commit(),
        }
    }
}

/// Ingest `paths` from `kind` into `output`.
pub fn ingest(
    kind: SourceKind,
    paths: &[PathBuf],
    output: Output<'_>,
    opts: &Options,
) -> Result<Report> {
    if paths.is_empty() {
        return Err(Error::Usage("give at least one PATH to ingest".into()));
    }
    let sets = compile_sets(&opts.sets)?;
    let mut report = Report {
        source: serde_json::to_value(kind)
            .ok()
            .and_then(|v| v.as_str().map(str::to_owned))
            .unwrap_or_default(),
        files: paths.to_vec(),
        output: match &output {
            Output::File(p) => Some(p.to_path_buf()),
            Output::Stream(_) => None,
        },
        ..Default::default()
    };
    // 128-bit fingerprints of the ids and contents seen (those of the corpus appended to
    // included): id → content, content → the first id with it. Memory grows by about 80
    // bytes a case, not with the size of the cases.
    let mut ids: FingerprintMap<u128> = FingerprintMap::default();
    let mut contents: FingerprintMap<u128> = FingerprintMap::default();
    // Content duplicates to report: (the duplicate's id, the first id's fingerprint).
    let mut pairs: Vec<(String, u128)> = Vec::new();
    let mut sink = match output {
        Output::Stream(w) => Sink::Stream(w),
        Output::File(path) => {
            crate::atomic::create_parent(path)?;
            let mut w = crate::atomic::TempFile::create(path)?;
            let tmp = w.tmp_path().to_path_buf();
            if path.exists() {
                let mut reader = CorpusReader::open(path, ReadOptions::default())?;
                for batch in reader.by_ref() {
                    for case in AttackCase::from_batch(&batch?)? {
                        let (h, id) = (content_hash(&case), fingerprint(&case.case_id));
                        contents.entry(h).or_insert(id);
                        ids.insert(id, h);
                        report.existing += 1;
                    }
                }
                reader.finish()?.into_result()?;
                let mut src =
                    std::fs::File::open(path).map_err(|e| Error::io(path, "cannot open", e))?;
                std::io::copy(&mut src, &mut w).map_err(|e| Error::io(&tmp, "cannot write", e))?;
                // A corpus without a final newline still gets whole lines appended.
                let len = std::fs::metadata(path).map(|m| m.len()).unwrap_or(0);
                if len > 0 {
                    use std::io::{Read, Seek, SeekFrom};
                    let mut last = [0u8; 1];
                    src.seek(SeekFrom::End(-1))
                        .and_then(|_| src.read_exact(&mut last))
                        .map_err(|e| Error::io(path, "cannot read", e))?;
                    if last[0] != b'\n' {
                        w.write_all(b"\n")
                            .map_err(|e| Error::io(&tmp, "cannot write", e))?;
                    }
                }
            }
            Sink::File(w)
        }
    };
    let mut criteria = CriteriaCache::default();
    let skip = opts.skip_invalid;
    let mut handle = |item: Item| -> Result<()> {
        let (file, record, field, reason) = match item {
            Item::Invalid {
                file,
                record,
                field,
                reason,
            } => (file, record, field, reason),
            Item::Case(_) | Item::Record(_) => {
                let mut record = match item {
                    Item::Case(case) => match serde_json::to_value(*case) {
                        Ok(Value::Object(m)) => m,
                        _ => return Err(Error::Internal("a case serialises to an object".into())),
                    },
                    Item::Record(record) => *record,
                    Item::Invalid { .. } => unreachable!("matched above"),
                };
                apply_sets(&mut record, &sets);
                let reference = record
                    .get("source_reference")
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_owned();
                let at = || split_reference(&reference);
                let checked =
                    serde_json::to_string(&record).map_err(|e| Error::Internal(e.to_string()))?;
                // The contract first (its message names the field); a record that meets it
                // is a case.
                let case = match contract_error(&checked, &mut criteria) {
                    Some(problem) => Err(problem),
                    None => serde_json::from_value::<AttackCase>(Value::Object(record))
                        .map_err(|e| (None, e.to_string())),
                };
                match case {
                    Err((field, problem)) => {
                        let (file, record) = at();
                        (
                            file,
                            record,
                            field,
                            format!("the case would not satisfy the contract: {problem}"),
                        )
                    }
                    Ok(case) => {
                        let line = case.to_json_line();
                        let (h, id) = (content_hash(&case), fingerprint(&case.case_id));
                        match ids.get(&id) {
                            Some(seen) if *seen == h => {
                                report.repeated_records += 1;
                                return Ok(());
                            }
                            Some(_) => {
                                let (file, record) = at();
                                (
                                    file,
                                    record,
                                    Some("case_id".into()),
                                    format!(
                                        "case_id {:?} is already used by a case with other content",
                                        case.case_id
                                    ),
                                )
                            }
                            None => {
                                match contents.get(&h) {
                                    Some(first) => {
                                        report.content_duplicates += 1;
                                        if pairs.len() < FIRST {
                                            pairs.push((case.case_id.clone(), *first));
                                        }
                                    }
                                    None => {
                                        contents.insert(h, id);
                                    }
                                }
                                ids.insert(id, h);
                                sink.write(&line)?;
                                report.written += 1;
                                return Ok(());
                            }
                        }
                    }
                }
            }
        };
        let located = Error::input(&file, record, field.as_deref(), reason);
        if skip {
            report.skipped_invalid += 1;
            if report.first_invalid.len() < FIRST {
                report.first_invalid.push(located.to_string());
            }
            Ok(())
        } else {
            Err(located)
        }
    };
    for path in paths {
        if !path.exists() {
            return Err(Error::io(
                path,
                "cannot open",
                std::io::Error::from(std::io::ErrorKind::NotFound),
            ));
        }
        match kind {
            SourceKind::Cyberseceval => cyberseceval::ingest(path, opts, &mut handle)?,
            SourceKind::Bipia => bipia::ingest(path, opts, &mut handle)?,
            SourceKind::Garak => garak::ingest(path, opts, &mut handle)?,
            SourceKind::Spikee => spikee::ingest(path, opts, &mut handle)?,
            SourceKind::Agentdojo => agentdojo::ingest(path, opts, &mut handle)?,
            SourceKind::Injecagent => injecagent::ingest(path, opts, &mut handle)?,
            SourceKind::TensorTrust => tensor_trust::ingest(path, opts, &mut handle)?,
            SourceKind::Jsonl | SourceKind::Csv | SourceKind::Parquet => {
                mapped::ingest(kind, path, opts, &mut handle)?
            }
        }
    }
    report.first_content_duplicates = name_pairs(&mut sink, pairs)?;
    sink.commit()?;
    Ok(report)
}

/// `file#record` (a source reference) → the file and the record number (0 when the
/// record is not a number).
fn split_reference(at: &str) -> (PathBuf, u64) {
    let (file, record) = at.rsplit_once('#').unwrap_or((at, ""));
    // `line=3 sample_id=123`: the line, not the record's own id.
    let digits = match record.split_once("line=") {
        Some((_, rest)) => rest.split(|c: char| !c.is_ascii_digit()).next(),
        None => record.rsplit(|c: char| !c.is_ascii_digit()).next(),
    };
    let n = digits.and_then(|d| d.parse().ok()).unwrap_or(0);
    (PathBuf::from(file), n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reference_locates_by_line_not_by_the_record_id() {
        assert_eq!(
            split_reference("d/tt.jsonl#line=3 sample_id=123"),
            (PathBuf::from("d/tt.jsonl"), 3)
        );
        assert_eq!(
            split_reference("d/x.csv#row=7"),
            (PathBuf::from("d/x.csv"), 7)
        );
        assert_eq!(split_reference("d/x.json"), (PathBuf::from("d/x.json"), 0));
    }

    #[test]
    fn slugs_and_hashes() {
        assert_eq!(slug("Task Automation"), "task_automation");
        assert_eq!(
            slug("Encrypting Documents (Ransomware)"),
            "encrypting_documents_ransomware"
        );
        assert_eq!(slug("3rd-party"), "n3rd_party");
        assert_eq!(slug("!!"), "unspecified");
        assert_eq!(short_hash(&["a", "b"]), short_hash(&["a", "b"]));
        assert_ne!(short_hash(&["a", "b"]), short_hash(&["ab"]));
    }
}
