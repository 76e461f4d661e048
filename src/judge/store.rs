//! Verdicts, kept. Every verdict a scoring uses is one row of the run's
//! `judgements.parquet` (its key, the judge model, the rubric's and the prompt's digests,
//! the verdict, score, rationale, error, the judge's raw answer); loaded back, the same
//! file is the cache that makes a rescore call nothing. A cache shared across runs is a
//! Parquet file of the same shape, merged under a lock file.
//!
//! The key is the sha256 of the judge model, the rubric and every input the judge saw
//! (see [`super::Judge::key`]). Failed judgements (an error, no verdict) are recorded in
//! the run's file but never served from a cache: the next scoring asks again.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};

use ahash::{AHashMap, AHashSet};
use datafusion::arrow::array::{
    Array, ArrayRef, AsArray, BooleanArray, Float64Array, RecordBatch, StringArray,
};
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};

use crate::error::{Error, Result};

pub type Key = [u8; 32];

/// One judgement: a row of `judgements.parquet`.
#[derive(Clone, Debug, PartialEq)]
pub struct Record {
    pub key: Key,
    pub judge_model: String,
    /// Which model answered (see [`super::Judge::identity`]).
    pub judge_identity: String,
    pub rubric_sha256: String,
    pub prompt_sha256: String,
    pub question: String,
    pub response_sha256: String,
    pub verdict: Option<bool>,
    pub score: Option<f64>,
    pub rationale: Option<String>,
    pub error: Option<String>,
    /// The judge's answer as given (bounded), for review.
    pub answer: Option<String>,
    pub latency_ms: Option<f64>,
    pub judged_at: String,
    pub calibration_sha256: Option<String>,
}

impl Record {
    /// Served from a cache only when it holds a verdict.
    pub fn is_verdict(&self) -> bool {
        self.verdict.is_some() && self.error.is_none()
    }
}

pub fn schema() -> SchemaRef {
    let text = |name: &str, nullable: bool| Field::new(name, DataType::Utf8, nullable);
    Arc::new(Schema::new(vec![
        text("key", false),
        text("judge_model", false),
        text("judge_identity", false),
        text("rubric_sha256", false),
        text("prompt_sha256", false),
        text("question", false),
        text("response_sha256", false),
        Field::new("verdict", DataType::Boolean, true),
        Field::new("score", DataType::Float64, true),
        text("rationale", true),
        text("error", true),
        text("answer", true),
        Field::new("latency_ms", DataType::Float64, true),
        text("judged_at", false),
        text("calibration_sha256", true),
    ]))
}

fn to_batch(records: &[Arc<Record>]) -> Result<RecordBatch> {
    let s = |f: &dyn Fn(&Record) -> Option<&str>| {
        Arc::new(records.iter().map(|r| f(r)).collect::<StringArray>()) as ArrayRef
    };
    let columns: Vec<ArrayRef> = vec![
        Arc::new(
            records
                .iter()
                .map(|r| Some(hex::encode(r.key)))
                .collect::<StringArray>(),
        ),
        s(&|r| Some(r.judge_model.as_str())),
        s(&|r| Some(r.judge_identity.as_str())),
        s(&|r| Some(r.rubric_sha256.as_str())),
        s(&|r| Some(r.prompt_sha256.as_str())),
        s(&|r| Some(r.question.as_str())),
        s(&|r| Some(r.response_sha256.as_str())),
        Arc::new(records.iter().map(|r| r.verdict).collect::<BooleanArray>()),
        Arc::new(records.iter().map(|r| r.score).collect::<Float64Array>()),
        s(&|r| r.rationale.as_deref()),
        s(&|r| r.error.as_deref()),
        s(&|r| r.answer.as_deref()),
        Arc::new(
            records
                .iter()
                .map(|r| r.latency_ms)
                .collect::<Float64Array>(),
        ),
        s(&|r| Some(r.judged_at.as_str())),
        s(&|r| r.calibration_sha256.as_deref()),
    ];
    Ok(RecordBatch::try_new(schema(), columns)?)
}

/// A judge question's bytes at most in a judgements file.
const MAX_QUESTION_BYTES: usize = 64 << 10;
/// The text a judgements file may hold in all: 1 GiB (a million verdicts of a kilobyte).
const MAX_JUDGEMENTS_BYTES: usize = 1 << 30;

/// Every record of a judgements file; a file that is not one is an error naming it.
///
/// A judgements file may come with a run folder: its footer and page headers are checked
/// first (`rundir::bounds`), it is read 64 rows at a time (a dictionary value repeated on
/// every row costs 64 copies, not a batch of 1,024), each field is bounded by what pieval
/// writes, and all the text kept by [`MAX_JUDGEMENTS_BYTES`].
pub fn read(path: &Path, links: crate::files::Links) -> Result<Vec<Record>> {
    let bad = |m: String| Error::config(path, format!("not a judgements file: {m}"));
    let reader = crate::rundir::bounds::own_file_reader(path, links, "judgements", 64)?;
    let mut out = Vec::new();
    let mut kept: usize = 0;
    for batch in reader {
        let batch = batch.map_err(|e| bad(e.to_string()))?;
        let col = |name: &str| -> Result<ArrayRef> {
            batch
                .column_by_name(name)
                .cloned()
                .ok_or_else(|| bad(format!("no column {name:?}")))
        };
        let text = |name: &str| -> Result<StringArray> {
            let c = datafusion::arrow::compute::cast(&col(name)?, &DataType::Utf8)?;
            Ok(c.as_string::<i32>().clone())
        };
        let opt = |a: &StringArray, i: usize| (!a.is_null(i)).then(|| a.value(i).to_owned());
        let (key, model, identity, rubric, prompt, question, response) = (
            text("key")?,
            text("judge_model")?,
            text("judge_identity")?,
            text("rubric_sha256")?,
            text("prompt_sha256")?,
            text("question")?,
            text("response_sha256")?,
        );
        let (rationale, error, answer, judged_at, calibration) = (
            text("rationale")?,
            text("error")?,
            text("answer")?,
            text("judged_at")?,
            text("calibration_sha256")?,
        );
        let verdict = col("verdict")?;
        let verdict = verdict
            .as_boolean_opt()
            .ok_or_else(|| bad("verdict is not boolean".into()))?;
        let score = datafusion::arrow::compute::cast(&col("score")?, &DataType::Float64)?;
        let score = score.as_primitive::<datafusion::arrow::datatypes::Float64Type>();
        let latency = datafusion::arrow::compute::cast(&col("latency_ms")?, &DataType::Float64)?;
        let latency = latency.as_primitive::<datafusion::arrow::datatypes::Float64Type>();
        for i in 0..batch.num_rows() {
            // Each field within what pieval writes (an answer of 2,000 characters, a
            // rationale of at most 100,000, a question from a case's criteria).
            for (name, a, max) in [
                ("judge_model", &model, 4096),
                ("judge_identity", &identity, 8192),
                ("question", &question, MAX_QUESTION_BYTES),
                ("rationale", &rationale, 400_000),
                ("error", &error, 64 << 10),
                ("answer", &answer, 64 << 10),
                ("rubric_sha256", &rubric, 128),
                ("prompt_sha256", &prompt, 128),
                ("response_sha256", &response, 128),
                ("judged_at", &judged_at, 64),
                ("calibration_sha256", &calibration, 128),
            ] {
                if !a.is_null(i) && a.value(i).len() > max {
                    return Err(bad(format!(
                        "row {}: {name} is longer than pieval ever writes ({max} bytes)",
                        out.len() + 1
                    )));
                }
                kept += if a.is_null(i) { 0 } else { a.value(i).len() };
            }
            if kept > MAX_JUDGEMENTS_BYTES {
                return Err(bad(format!(
                    "more than {} MiB of text",
                    MAX_JUDGEMENTS_BYTES >> 20
                )));
            }
            let mut k: Key = [0; 32];
            if key.is_null(i) || hex::decode_to_slice(key.value(i), &mut k).is_err() {
                return Err(bad(format!(
                    "row {}: key is not 64 hex digits",
                    out.len() + 1
                )));
            }
            out.push(Record {
                key: k,
                judge_model: opt(&model, i).unwrap_or_default(),
                judge_identity: opt(&identity, i).unwrap_or_default(),
                rubric_sha256: opt(&rubric, i).unwrap_or_default(),
                prompt_sha256: opt(&prompt, i).unwrap_or_default(),
                question: opt(&question, i).unwrap_or_default(),
                response_sha256: opt(&response, i).unwrap_or_default(),
                verdict: (!verdict.is_null(i)).then(|| verdict.value(i)),
                score: (!score.is_null(i)).then(|| score.value(i)),
                rationale: opt(&rationale, i),
                error: opt(&error, i),
                answer: opt(&answer, i),
                latency_ms: (!latency.is_null(i)).then(|| latency.value(i)),
                judged_at: opt(&judged_at, i).unwrap_or_default(),
                calibration_sha256: opt(&calibration, i),
            });
        }
    }
    Ok(out)
}

/// Write records, sorted by key, atomically.
pub fn write(path: &Path, records: &[Arc<Record>]) -> Result<()> {
    write_uncommitted(path, records)?.commit()
}

/// [`write`], the file left under its temporary name (committed by the caller).
pub fn write_uncommitted(path: &Path, records: &[Arc<Record>]) -> Result<crate::atomic::TempFile> {
    let mut sorted = records.to_vec();
    sorted.sort_by(|a, b| a.key.cmp(&b.key));
    let batch = to_batch(&sorted)?;
    let mut file = crate::atomic::ParquetFile::create(path, schema())?;
    file.write(&batch)?;
    Ok(file.finish()?.0)
}

/// Where a judgements file came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Origin {
    /// The judgements of a run folder this user made (`pieval run`, `score` into its
    /// own output folder).
    OwnRun,
    /// The judgements of a run folder that may come from someone else (`replay
    /// --rescore`): served only when the user allows it, merged into the shared cache
    /// only when the user confirms it.
    ReceivedRun,
    /// The judge's shared cache (the user's own file).
    Shared,
    /// A `provider: replay` judge's file.
    Replay,
}

/// A judgement used, and the file it came from (`None`: made now).
type Used = (Arc<Record>, Option<Origin>);

/// The verdicts known before judging (from files) and the judgements used or made now.
/// A verdict from a file is served only when the caller's check says every input it was
/// computed from matches (see [`super::Judge`]); one that does not is counted and asked
/// again.
#[derive(Default)]
pub struct Store {
    known: RwLock<AHashMap<Key, (Arc<Record>, Origin)>>,
    /// Every judgement of this process, by key, and the file it came from (`None`: made
    /// now). An input is judged at most once per process, failures included (DataFusion
    /// may evaluate `pi_judge` more than once per batch).
    used: Mutex<AHashMap<Key, Used>>,
    /// Every key of the run folder's file, errors included.
    run_file_keys: AHashSet<Key>,
    /// Recorded verdicts not served because an input they were computed from differs.
    rejected: std::sync::atomic::AtomicU64,
}

impl Store {
    /// Load every verdict of these files (missing files are skipped). A run folder's
    /// file is opened without following a link (the folder may come from someone else).
    pub fn load(files: &[(PathBuf, Origin)]) -> Result<Store> {
        let mut store = Store::default();
        {
            let mut known = store.known.write().unwrap_or_else(|p| p.into_inner());
            for (f, origin) in files {
                let links = match origin {
                    Origin::OwnRun | Origin::ReceivedRun => crate::files::Links::Refuse,
                    Origin::Shared | Origin::Replay => crate::files::Links::Follow,
                };
                if std::fs::symlink_metadata(f).is_err() {
                    continue;
                }
                for r in read(f, links)? {
                    if matches!(origin, Origin::OwnRun | Origin::ReceivedRun) {
                        store.run_file_keys.insert(r.key);
                    }
                    if r.is_verdict() {
                        known.entry(r.key).or_insert_with(|| (Arc::new(r), *origin));
                    }
                }
            }
        }
        Ok(store)
    }

    /// Whether the judgements used are exactly those of the run folder's file, all served
    /// from it: writing it again would write the same records.
    pub fn used_is_run_file(&self) -> bool {
        let used = self.used.lock().unwrap_or_else(|p| p.into_inner());
        used.len() == self.run_file_keys.len()
            && used.iter().all(|(k, (_, origin))| {
                matches!(origin, Some(Origin::OwnRun | Origin::ReceivedRun))
                    && self.run_file_keys.contains(k)
            })
    }

    /// A judgement of this input: made earlier in this process (`false`), or a verdict
    /// from the files that passes `check` (`true`, now recorded as used). A recorded
    /// verdict that fails `check` is dropped (and counted): the input is judged again.
    pub fn get(&self, key: &Key, check: impl Fn(&Record) -> bool) -> Option<(Arc<Record>, bool)> {
        let mut used = self.used.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((r, origin)) = used.get(key) {
            return Some((Arc::clone(r), origin.is_some()));
        }
        let (known, origin) = self
            .known
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(key)
            .cloned()?;
        if !check(&known) {
            self.known
                .write()
                .unwrap_or_else(|p| p.into_inner())
                .remove(key);
            self.rejected
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            return None;
        }
        used.insert(*key, (Arc::clone(&known), Some(origin)));
        Some((known, true))
    }

    pub fn known_len(&self) -> usize {
        self.known.read().unwrap_or_else(|p| p.into_inner()).len()
    }

    /// Recorded verdicts not served because an input they were computed from differs.
    pub fn rejected(&self) -> u64 {
        self.rejected.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Remember a judgement made now; the first one made for a key wins.
    pub fn record(&self, r: Arc<Record>) -> Arc<Record> {
        let mut used = self.used.lock().unwrap_or_else(|p| p.into_inner());
        Arc::clone(&used.entry(r.key).or_insert((r, None)).0)
    }

    /// Every judgement used so far, ordered by key, and the file it came from (`None`:
    /// made now).
    pub fn used_with_origin(&self) -> Vec<Used> {
        let mut v: Vec<Used> = self
            .used
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .cloned()
            .collect();
        v.sort_unstable_by_key(|u| u.0.key);
        v
    }

    /// Every judgement used so far, ordered by key, and whether it came from the files.
    pub fn used(&self) -> Vec<(Arc<Record>, bool)> {
        self.used_with_origin()
            .into_iter()
            .map(|(r, o)| (r, o.is_some()))
            .collect()
    }
}

/// Add verdicts to a shared cache file: under an exclusive lock on `<file>.lock`, read
/// what is there, add what is new, write atomically. Returns how many were added.
pub fn merge_into(shared: &Path, records: &[Arc<Record>]) -> Result<usize> {
    if let Some(dir) = shared.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, "cannot create folder", e))?;
    }
    let lock_path = shared.with_file_name(format!(
        "{}.lock",
        shared
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default()
    ));
    let lock = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&lock_path)
        .map_err(|e| Error::io(&lock_path, "cannot open lock file", e))?;
    lock.lock()
        .map_err(|e| Error::io(&lock_path, "cannot lock", e))?;
    let mut all: BTreeMap<Key, Arc<Record>> = BTreeMap::new();
    if shared.exists() {
        for r in read(shared, crate::files::Links::Follow)? {
            all.insert(r.key, Arc::new(r));
        }
    }
    let before = all.len();
    for r in records.iter().filter(|r| r.is_verdict()) {
        all.entry(r.key).or_insert_with(|| Arc::clone(r));
    }
    let added = all.len() - before;
    if added > 0 {
        write(shared, &all.into_values().collect::<Vec<_>>())?;
    }
    drop(lock);
    Ok(added)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(k: u8, verdict: Option<bool>) -> Arc<Record> {
        Arc::new(Record {
            key: [k; 32],
            judge_model: "m".into(),
            judge_identity: "openai:m@http://h/v1".into(),
            rubric_sha256: "r".into(),
            prompt_sha256: "p".into(),
            question: "q?".into(),
            response_sha256: "s".into(),
            verdict,
            score: verdict.map(|v| if v { 1.0 } else { 0.0 }),
            rationale: Some("because".into()),
            error: verdict.is_none().then(|| "timed out".into()),
            answer: None,
            latency_ms: Some(1.5),
            judged_at: "2026-11-30T00:00:00Z".into(),
            calibration_sha256: None,
        })
    }

    #[test]
    fn round_trip_and_errors_are_not_served() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("judgements.parquet");
        write(&p, &[rec(2, Some(true)), rec(1, None), rec(3, Some(false))]).unwrap();
        let back = read(&p, crate::files::Links::Refuse).unwrap();
        assert_eq!(back.len(), 3);
        assert_eq!(back[0].key, [1; 32], "sorted by key");
        assert_eq!(back[1], *rec(2, Some(true)));
        let store = Store::load(&[
            (p.clone(), Origin::OwnRun),
            (dir.path().join("missing.parquet"), Origin::Shared),
        ])
        .unwrap();
        assert_eq!(
            store.known_len(),
            2,
            "the failed judgement is not a cached verdict"
        );
        let any = |_: &Record| true;
        assert!(store.get(&[1; 32], any).is_none());
        assert_eq!(store.get(&[3; 32], any).unwrap().0.verdict, Some(false));
        assert_eq!(store.used().len(), 1, "a verdict served is a verdict used");
        // A failure made now is kept for this process, not asked twice.
        let failed = store.record(rec(1, None));
        assert_eq!(store.get(&[1; 32], any).unwrap().0, failed);
        assert!(!store.get(&[1; 32], any).unwrap().1);
        // A recorded verdict that fails the check is not served, and counted once.
        assert!(store.get(&[2; 32], |_| false).is_none());
        assert!(
            store.get(&[2; 32], any).is_none(),
            "dropped, not asked again"
        );
        assert_eq!(store.rejected(), 1);
    }

    #[test]
    fn the_shared_cache_grows_by_merging() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("cache/verdicts.parquet");
        assert_eq!(
            merge_into(&p, &[rec(1, Some(true)), rec(2, None)]).unwrap(),
            1
        );
        assert_eq!(
            merge_into(&p, &[rec(1, Some(true)), rec(4, Some(false))]).unwrap(),
            1
        );
        assert_eq!(read(&p, crate::files::Links::Follow).unwrap().len(), 2);
        // A field longer than pieval writes (a dictionary value repeated on every row of a
        // forged file would be one) is refused, naming the row and the field.
        let mut long = (*rec(9, Some(true))).clone();
        long.question = "q".repeat(100 << 10);
        let forged = dir.path().join("forged.parquet");
        write(&forged, &[Arc::new(long)]).unwrap();
        let e = read(&forged, crate::files::Links::Refuse)
            .unwrap_err()
            .to_string();
        assert!(e.contains("row 1: question is longer"), "{e}");
        std::fs::write(dir.path().join("bad.parquet"), b"not parquet").unwrap();
        let e = Store::load(&[(dir.path().join("bad.parquet"), Origin::Shared)])
            .err()
            .unwrap()
            .to_string();
        assert!(
            e.contains("bad.parquet") && e.contains("not a judgements file"),
            "{e}"
        );
    }
}
