//! A run folder's `reviews.parquet`: the verdicts people gave with `pieval review`
//! (`src/review/`). Each row keeps who (the reviewer), when, the verdict, a note, why the
//! case was in the queue, and two digests: of everything the page showed
//! (`shown_sha256`) and of the response (`response_sha256`; a rescore applies a verdict
//! only to the response it was given on). Writes take an exclusive lock on the run's
//! `.reviews.lock` and replace the file atomically (`atomic`), so concurrent reviewers,
//! in one server or several, lose nothing, and a crash leaves the old file or the new one.
//! Every verdict is kept; the latest for a case counts ([`latest`]).

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use datafusion::arrow::array::{Array, ArrayRef, AsArray, BooleanArray, RecordBatch, StringArray};
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use serde::Serialize;

use crate::error::{Error, Result};

/// The run folder's reviews file.
pub const REVIEWS_FILE: &str = "reviews.parquet";
/// The lock writers of [`REVIEWS_FILE`] take.
pub const LOCK_FILE: &str = ".reviews.lock";
/// A reviewer's note at most (bytes).
pub const MAX_NOTE_BYTES: usize = 4096;
/// A reviewer's name at most (bytes).
pub const MAX_REVIEWER_BYTES: usize = 128;
/// A reviews file at most: 64 MiB (some hundred thousand verdicts).
pub const MAX_REVIEWS_FILE_BYTES: u64 = 64 << 20;

/// One verdict: a row of `reviews.parquet`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Review {
    pub run_id: String,
    pub case_id: String,
    pub attempt_id: Option<String>,
    /// The case's success criteria hold: the attack worked (an attack), or the model
    /// answered (a benign control).
    pub verdict: bool,
    pub note: Option<String>,
    pub reviewer: String,
    /// RFC 3339, UTC.
    pub reviewed_at: String,
    /// Why the case was in the queue (its review reason, `disagreement`, `audit`).
    pub reason: String,
    /// sha256 of everything the page showed ([`Item::shown_sha256`]).
    pub shown_sha256: String,
    /// sha256 of the response the verdict is about.
    pub response_sha256: String,
}

pub fn reviews_schema() -> SchemaRef {
    let text = |n: &str, nullable: bool| Field::new(n, DataType::Utf8, nullable);
    Arc::new(Schema::new(vec![
        text("run_id", false),
        text("case_id", false),
        text("attempt_id", true),
        Field::new("verdict", DataType::Boolean, false),
        text("note", true),
        text("reviewer", false),
        text("reviewed_at", false),
        text("reason", false),
        text("shown_sha256", false),
        text("response_sha256", false),
    ]))
}

fn batch(reviews: &[Review]) -> Result<RecordBatch> {
    let s = |f: &dyn Fn(&Review) -> Option<&str>| -> ArrayRef {
        Arc::new(reviews.iter().map(f).collect::<StringArray>())
    };
    let columns: Vec<ArrayRef> = vec![
        s(&|r| Some(&r.run_id)),
        s(&|r| Some(&r.case_id)),
        s(&|r| r.attempt_id.as_deref()),
        Arc::new(
            reviews
                .iter()
                .map(|r| Some(r.verdict))
                .collect::<BooleanArray>(),
        ),
        s(&|r| r.note.as_deref()),
        s(&|r| Some(&r.reviewer)),
        s(&|r| Some(&r.reviewed_at)),
        s(&|r| Some(&r.reason)),
        s(&|r| Some(&r.shown_sha256)),
        s(&|r| Some(&r.response_sha256)),
    ];
    Ok(RecordBatch::try_new(reviews_schema(), columns)?)
}

/// Every verdict of a reviews file (none when it does not exist). The file may come with
/// a run folder: a regular file, never through a link, at most
/// [`MAX_REVIEWS_FILE_BYTES`], its footer and pages checked first, each field bounded by
/// what pieval writes; anything else is an error naming the file and row.
pub fn read(path: &Path) -> Result<Vec<Review>> {
    let links = crate::files::Links::Refuse;
    match std::fs::symlink_metadata(path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(Error::io(path, "cannot read", e)),
        Ok(m) if m.len() > MAX_REVIEWS_FILE_BYTES => {
            return Err(Error::config(
                path,
                format!(
                    "not a reviews file: larger than {} MiB",
                    MAX_REVIEWS_FILE_BYTES >> 20
                ),
            ));
        }
        Ok(_) => {}
    }
    let bad = |m: String| Error::config(path, format!("not a reviews file: {m}"));
    let reader = crate::rundir::bounds::own_file_reader(path, links, "reviews", 256)?;
    let mut out = Vec::new();
    for b in reader {
        let b = b.map_err(|e| bad(e.to_string()))?;
        let text = |name: &str| -> Result<StringArray> {
            let c = b
                .column_by_name(name)
                .ok_or_else(|| bad(format!("no column {name:?}")))?;
            let c = datafusion::arrow::compute::cast(c, &DataType::Utf8)?;
            Ok(c.as_string::<i32>().clone())
        };
        let cols = [
            ("run_id", 256),
            ("case_id", 1024),
            ("attempt_id", 1024),
            ("note", MAX_NOTE_BYTES),
            ("reviewer", MAX_REVIEWER_BYTES),
            ("reviewed_at", 64),
            ("reason", 256),
            ("shown_sha256", 64),
            ("response_sha256", 64),
        ]
        .map(|(n, max)| text(n).map(|a| (n, a, max)));
        let cols = cols.into_iter().collect::<Result<Vec<_>>>()?;
        let verdict = b
            .column_by_name("verdict")
            .and_then(|c| c.as_boolean_opt().cloned())
            .ok_or_else(|| bad("no boolean column \"verdict\"".into()))?;
        for i in 0..b.num_rows() {
            let row = out.len() + 1;
            let get = |k: usize, required: bool| -> Result<Option<String>> {
                let (name, a, max) = &cols[k];
                if a.is_null(i) {
                    return if required {
                        Err(bad(format!("row {row}: {name} is missing")))
                    } else {
                        Ok(None)
                    };
                }
                let v = a.value(i);
                if v.len() > *max {
                    return Err(bad(format!(
                        "row {row}: {name} is longer than pieval ever writes ({max} bytes)"
                    )));
                }
                Ok(Some(v.to_owned()))
            };
            let r = Review {
                run_id: get(0, true)?.unwrap_or_default(),
                case_id: get(1, true)?.unwrap_or_default(),
                attempt_id: get(2, false)?,
                note: get(3, false)?,
                reviewer: get(4, true)?.unwrap_or_default(),
                reviewed_at: get(5, true)?.unwrap_or_default(),
                reason: get(6, true)?.unwrap_or_default(),
                shown_sha256: get(7, true)?.unwrap_or_default(),
                response_sha256: get(8, true)?.unwrap_or_default(),
                verdict: if verdict.is_null(i) {
                    return Err(bad(format!("row {row}: verdict is missing")));
                } else {
                    verdict.value(i)
                },
            };
            let hex = |v: &str| v.len() == 64 && v.bytes().all(|b| b.is_ascii_hexdigit());
            if !hex(&r.shown_sha256) || !hex(&r.response_sha256) {
                return Err(bad(format!(
                    "row {row}: shown_sha256 and response_sha256 are 64 hex digits"
                )));
            }
            if !rfc3339_utc(&r.reviewed_at) {
                return Err(bad(format!(
                    "row {row}: reviewed_at {:?} is not a UTC time (YYYY-MM-DDTHH:MM:SS[.ffffff]Z)",
                    crate::text::excerpt(&r.reviewed_at, 40)
                )));
            }
            if let Err(Error::Usage(m)) = check(&r) {
                return Err(bad(format!("row {row}: {m}")));
            }
            out.push(r);
        }
    }
    Ok(out)
}

/// `YYYY-MM-DDTHH:MM:SS` with optional fractional seconds and `Z`.
fn rfc3339_utc(v: &str) -> bool {
    let b = v.as_bytes();
    let digits =
        |r: std::ops::Range<usize>| b.get(r).is_some_and(|s| s.iter().all(u8::is_ascii_digit));
    b.len() >= 20
        && digits(0..4)
        && b[4] == b'-'
        && digits(5..7)
        && b[7] == b'-'
        && digits(8..10)
        && b[10] == b'T'
        && digits(11..13)
        && b[13] == b':'
        && digits(14..16)
        && b[16] == b':'
        && digits(17..19)
        && b[b.len() - 1] == b'Z'
        && (b.len() == 20 || (b[19] == b'.' && digits(20..b.len() - 1) && b.len() > 21))
}

/// An exclusive lock on a run folder's [`LOCK_FILE`] (flock), released when dropped.
struct ReviewsLock(std::fs::File);

impl ReviewsLock {
    fn take(dir: &Path) -> Result<Self> {
        use std::os::unix::fs::OpenOptionsExt;
        use std::os::unix::io::AsRawFd;
        let path = dir.join(LOCK_FILE);
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&path)
            .map_err(|e| Error::io(&path, "cannot open the reviews lock", e))?;
        if !file
            .metadata()
            .map_err(|e| Error::io(&path, "cannot read", e))?
            .is_file()
        {
            return Err(Error::State(format!(
                "{}: not a regular file",
                path.display()
            )));
        }
        // SAFETY: flock on a file descriptor this process owns.
        if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX) } != 0 {
            return Err(Error::io(
                &path,
                "cannot lock",
                std::io::Error::last_os_error(),
            ));
        }
        Ok(ReviewsLock(file))
    }
}

impl Drop for ReviewsLock {
    fn drop(&mut self) {
        use std::os::unix::io::AsRawFd;
        // SAFETY: unlocking a descriptor this value owns.
        unsafe { libc::flock(self.0.as_raw_fd(), libc::LOCK_UN) };
    }
}

/// Add a verdict to the run folder's reviews file: under the lock, the file read, the
/// verdict appended, the whole written to a temporary file and renamed over it.
pub fn append(dir: &Path, review: Review) -> Result<usize> {
    check(&review)?;
    let _lock = ReviewsLock::take(dir)?;
    let path = dir.join(REVIEWS_FILE);
    let mut all = read(&path)?;
    all.push(review);
    crate::atomic::write_batches(reviews_schema(), &[batch(&all)?], &path)?;
    Ok(all.len())
}

fn check(r: &Review) -> Result<()> {
    let bad = |m: &str| Err(Error::Usage(m.to_owned()));
    if r.reviewer.trim().is_empty() || r.reviewer.len() > MAX_REVIEWER_BYTES {
        return bad("a reviewer's name is 1 to 128 bytes");
    }
    // a name is shown to others: no control or bidirectional characters in it
    if r.reviewer.chars().any(|c| {
        c.is_control() || matches!(c, '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}' | '\u{200e}' | '\u{200f}')
    }) {
        return bad("a reviewer's name holds no control or direction characters");
    }
    if r.note.as_ref().is_some_and(|n| n.len() > MAX_NOTE_BYTES) {
        return bad("a note is at most 4,096 bytes");
    }
    Ok(())
}

/// The latest verdict of each (case, attempt), as a rescore applies them: the last in
/// the file (verdicts are appended under the lock, so the file's order is the order they
/// were given in; a clock, or a `reviewed_at` written by someone else, does not decide).
pub fn latest(reviews: &[Review]) -> Vec<&Review> {
    let mut by: HashMap<(&str, Option<&str>), &Review> = HashMap::new();
    for r in reviews {
        by.insert((r.case_id.as_str(), r.attempt_id.as_deref()), r);
    }
    let mut out: Vec<&Review> = by.into_values().collect();
    out.sort_by(|a, b| (&a.case_id, &a.attempt_id).cmp(&(&b.case_id, &b.attempt_id)));
    out
}

/// The verdicts given on `run_id`, and how many were given on another run (those never
/// apply: a verdict is about one run's response).
pub fn of_run(reviews: Vec<Review>, run_id: &str) -> (Vec<Review>, usize) {
    let total = reviews.len();
    let kept: Vec<Review> = reviews.into_iter().filter(|r| r.run_id == run_id).collect();
    let other = total - kept.len();
    (kept, other)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn review(case: &str, at: &str, verdict: bool) -> Review {
        Review {
            run_id: "r".into(),
            case_id: case.into(),
            attempt_id: None,
            verdict,
            note: Some("looked at it".into()),
            reviewer: "ana".into(),
            reviewed_at: at.into(),
            reason: "echo".into(),
            shown_sha256: "a".repeat(64),
            response_sha256: "b".repeat(64),
        }
    }

    #[test]
    fn verdicts_are_appended_and_the_latest_counts() {
        let dir = tempfile::tempdir().unwrap();
        assert!(read(&dir.path().join(REVIEWS_FILE)).unwrap().is_empty());
        append(dir.path(), review("c1", "2026-12-03T10:00:00Z", true)).unwrap();
        append(dir.path(), review("c2", "2026-12-03T10:01:00Z", false)).unwrap();
        append(dir.path(), review("c1", "2026-12-03T10:02:00Z", false)).unwrap();
        let all = read(&dir.path().join(REVIEWS_FILE)).unwrap();
        assert_eq!(all.len(), 3, "every verdict kept");
        let l = latest(&all);
        assert_eq!(l.len(), 2);
        assert!(!l[0].verdict && l[0].case_id == "c1", "the latest for c1");
        let mut long = review("c3", "2026-12-03T10:03:00Z", true);
        long.note = Some("n".repeat(MAX_NOTE_BYTES + 1));
        assert!(append(dir.path(), long).is_err());
        assert_eq!(read(&dir.path().join(REVIEWS_FILE)).unwrap().len(), 3);
        let mut odd = review("c3", "2026-12-03T10:03:00Z", true);
        odd.reviewer = "ana\u{202e}".into();
        assert!(
            append(dir.path(), odd).is_err(),
            "no direction characters in a name"
        );
        assert!(!rfc3339_utc("9999") && !rfc3339_utc("2026-12-03T10:00:00"));
        assert!(rfc3339_utc("2026-12-03T10:00:00.123456Z") && rfc3339_utc("2026-12-03T10:00:00Z"));
    }

    #[test]
    fn a_forged_reviews_file_is_a_named_error() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(REVIEWS_FILE);
        for (field, mut r) in [
            ("reviewed_at", review("c1", "9999", true)),
            ("sha256", review("c1", "2026-12-03T10:00:00Z", true)),
            ("reviewer", review("c1", "2026-12-03T10:00:00Z", true)),
        ] {
            match field {
                "sha256" => r.response_sha256 = "not hex".into(),
                "reviewer" => r.reviewer = "ana\n".into(),
                _ => {}
            }
            crate::atomic::write_batches(reviews_schema(), &[batch(&[r]).unwrap()], &path).unwrap();
            let e = read(&path).unwrap_err().to_string();
            assert!(
                e.contains("not a reviews file") && e.contains("row 1") && e.contains(REVIEWS_FILE),
                "{field}: {e}"
            );
        }
    }

    #[test]
    fn concurrent_writers_lose_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().to_path_buf();
        let threads: Vec<_> = (0..4)
            .map(|t| {
                let p = path.clone();
                std::thread::spawn(move || {
                    for i in 0..10 {
                        append(
                            &p,
                            review(&format!("c{t}-{i}"), "2026-12-03T10:00:00Z", true),
                        )
                        .unwrap();
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(read(&path.join(REVIEWS_FILE)).unwrap().len(), 40);
    }
}
