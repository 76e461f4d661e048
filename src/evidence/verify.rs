//! `pieval verify`: check a control envelope's signature and recompute every subject's
//! sha256 from the files; any changed byte fails, naming the subject.

use std::path::{Component, Path, PathBuf};

use ed25519_dalek::VerifyingKey;
use serde::Serialize;
use serde_json::Value;

use super::controls::{INDEX_FILE, INDEX_PREDICATE_TYPE, PREDICATE_TYPE, STATEMENT_TYPE};
use super::dsse::{Envelope, PAYLOAD_TYPE, SignatureCheck};
use crate::error::{Error, Result};
use crate::text::excerpt;

/// One subject: what the statement says and what the file holds now.
#[derive(Debug, Clone, Serialize)]
pub struct SubjectCheck {
    pub name: String,
    pub expected_sha256: String,
    /// None when the file is missing.
    pub actual_sha256: Option<String>,
    pub ok: bool,
}

/// The signature verdict.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case", tag = "state", content = "key_id")]
pub enum SignatureVerdict {
    Valid(String),
    /// A public key was given and no signature verifies with it.
    Invalid,
    /// A public key was given and the envelope carries no signature.
    Unsigned,
    /// No public key was given: the signature was not checked.
    NotChecked,
}

/// What verifying one envelope found.
#[derive(Debug, Clone, Serialize)]
pub struct VerifyReport {
    pub envelope: PathBuf,
    pub run_dir: PathBuf,
    pub control_id: Option<String>,
    pub status: Option<String>,
    pub signature: SignatureVerdict,
    pub subjects: Vec<SubjectCheck>,
    /// `controls/index.json` (the signed list of the controls folder) rather than a
    /// control's envelope.
    pub index: bool,
    /// An envelope in `controls/envelopes/` whose file name is not its control's id
    /// (an envelope copied over another control's name).
    pub misnamed: Option<String>,
    /// An envelope the controls folder's signed index does not list (planted later).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub unlisted: bool,
    /// Run files present that the signed index does not list (added after signing).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub unlisted_files: Vec<String>,
    /// The run's signed index is missing, so its controls folder is bound by nothing.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub index_missing: bool,
    pub ok: bool,
}

impl VerifyReport {
    /// Why it failed, one phrase per problem (empty when ok). What comes from the
    /// envelope is escaped: a forged envelope is hostile text.
    pub fn problems(&self) -> Vec<String> {
        let mut out = Vec::new();
        match &self.signature {
            SignatureVerdict::Invalid => {
                out.push("the signature does not verify with the public key".into())
            }
            SignatureVerdict::Unsigned => out.push("the envelope is not signed".into()),
            _ => {}
        }
        if self.index_missing {
            out.push(format!(
                "the run has no signed index ({}/{INDEX_FILE}), so nothing binds its controls folder: run pieval controls again",
                crate::rundir::CONTROLS_DIR
            ));
        }
        for f in &self.unlisted_files {
            out.push(format!(
                "the run holds {f}, which the signed index does not list"
            ));
        }
        if self.unlisted {
            out.push("the envelope is not in the controls folder's signed index".into());
        }
        if let Some(stem) = &self.misnamed {
            out.push(format!(
                "the file is named {} but holds control {}",
                excerpt(stem, 80),
                excerpt(self.control_id.as_deref().unwrap_or("?"), 80)
            ));
        }
        for s in self.subjects.iter().filter(|s| !s.ok) {
            out.push(match &s.actual_sha256 {
                None => format!("subject {} is missing", excerpt(&s.name, 200)),
                Some(actual) => format!(
                    "subject {} changed: sha256 {} (the statement says {})",
                    excerpt(&s.name, 200),
                    actual,
                    excerpt(&s.expected_sha256, 80)
                ),
            });
        }
        out
    }
}

/// The run folder of an envelope at `RUN/controls/envelopes/ID.json`, or of the index
/// at `RUN/controls/index.json`.
fn default_run_dir(envelope: &Path) -> Option<PathBuf> {
    let parent = envelope.parent()?;
    if envelope.file_name()? == INDEX_FILE && parent.file_name()? == "controls" {
        return parent.parent().map(Path::to_path_buf);
    }
    let controls = parent.parent()?;
    (parent.file_name()? == "envelopes" && controls.file_name()? == "controls")
        .then(|| controls.parent().map(Path::to_path_buf))
        .flatten()
}

/// A subject name must stay inside the run folder: relative, no `..`.
fn subject_path(run: &Path, name: &str) -> Option<PathBuf> {
    let rel = Path::new(name);
    let clean = !name.is_empty()
        && !name.contains('\\')
        && rel.components().all(|c| matches!(c, Component::Normal(_)));
    clean.then(|| run.join(rel))
}

/// The sha256 of files already read in this verification: envelopes of one run name the
/// same run files, which are hashed once.
#[derive(Default)]
pub struct Digests(std::collections::HashMap<PathBuf, String>);

impl Digests {
    fn of(&mut self, file: &Path) -> Result<String> {
        if let Some(d) = self.0.get(file) {
            return Ok(d.clone());
        }
        let d = crate::digest::sha256_file_in(file, crate::files::Links::Refuse)?;
        self.0.insert(file.to_path_buf(), d.clone());
        Ok(d)
    }
}

/// Verify one envelope. `run_dir` overrides where subjects are looked up (default: the
/// run folder the envelope sits in).
pub fn verify_envelope(
    path: &Path,
    key: Option<&VerifyingKey>,
    run_dir: Option<&Path>,
) -> Result<VerifyReport> {
    verify_envelope_with(path, key, run_dir, &mut Digests::default())
}

/// [`verify_envelope`], sharing the digests of files already hashed.
pub fn verify_envelope_with(
    path: &Path,
    key: Option<&VerifyingKey>,
    run_dir: Option<&Path>,
    digests: &mut Digests,
) -> Result<VerifyReport> {
    let envelope = Envelope::read(path)?;
    let bad = |msg: String| Error::config(path, msg);
    if envelope.payload_type != PAYLOAD_TYPE {
        return Err(bad(format!(
            "payloadType is {:?}, expected {PAYLOAD_TYPE:?}",
            envelope.payload_type
        )));
    }
    let run = match run_dir {
        Some(d) => d.to_path_buf(),
        None => default_run_dir(path).ok_or_else(|| {
            bad(
                "not under RUN/controls/envelopes/: say where the run folder is with --run-dir"
                    .into(),
            )
        })?,
    };
    let signature = match key {
        None => SignatureVerdict::NotChecked,
        Some(k) => match envelope.check_signatures(k)? {
            SignatureCheck::Valid(id) => SignatureVerdict::Valid(id),
            SignatureCheck::Invalid => SignatureVerdict::Invalid,
            SignatureCheck::Unsigned => SignatureVerdict::Unsigned,
        },
    };
    let payload = envelope.payload_bytes().map_err(|e| bad(e.to_string()))?;
    let statement: Value = serde_json::from_slice(&payload)
        .map_err(|e| bad(format!("the payload is not a JSON in-toto Statement: {e}")))?;
    if statement["_type"] != STATEMENT_TYPE {
        return Err(bad(format!(
            "the payload's _type is {}, expected {STATEMENT_TYPE:?}",
            statement["_type"]
        )));
    }
    let subjects = statement["subject"]
        .as_array()
        .filter(|s| !s.is_empty())
        .ok_or_else(|| bad("the statement has no subject".into()))?;
    let mut checks = Vec::with_capacity(subjects.len());
    for s in subjects {
        let name = s["name"]
            .as_str()
            .ok_or_else(|| bad("a subject has no name".into()))?;
        let expected = s["digest"]["sha256"]
            .as_str()
            .ok_or_else(|| bad(format!("subject {name} has no sha256 digest")))?;
        subject_path(&run, name).ok_or_else(|| {
            bad(format!(
                "subject name {name:?} is not a plain relative path inside the run folder"
            ))
        })?;
        // A subject is read only as a regular file inside the run folder, never through
        // a symbolic link (the folder may come from someone else).
        let actual = match crate::rundir::artifact(&run, name) {
            Ok(Some(file)) => Some(digests.of(&file)?),
            Ok(None) | Err(_) => None,
        };
        checks.push(SubjectCheck {
            name: name.to_owned(),
            expected_sha256: expected.to_owned(),
            ok: actual.as_deref() == Some(expected),
            actual_sha256: actual,
        });
    }
    let predicate = &statement["predicate"];
    let index = statement["predicateType"] == INDEX_PREDICATE_TYPE;
    if !index && statement["predicateType"] != PREDICATE_TYPE {
        return Err(bad(format!(
            "the statement's predicateType is {}, not a pieval control result or index",
            excerpt(&statement["predicateType"].to_string(), 120)
        )));
    }
    let control_id = predicate["control"]["id"].as_str().map(str::to_owned);
    // An envelope in controls/envelopes/ must be named after the control it holds.
    let in_envelopes = path
        .parent()
        .and_then(Path::file_name)
        .is_some_and(|n| n == "envelopes");
    let stem = path.file_stem().map(|s| s.to_string_lossy().into_owned());
    let misnamed = (!index && in_envelopes && stem.as_deref() != control_id.as_deref())
        .then(|| stem.unwrap_or_default());
    // The index binds the whole controls folder and the run files a consumer reads:
    // anything there it does not list was added after signing.
    let unlisted_files = if index {
        unlisted_files(&run, &checks)?
    } else {
        Vec::new()
    };
    let ok = !matches!(
        signature,
        SignatureVerdict::Invalid | SignatureVerdict::Unsigned
    ) && misnamed.is_none()
        && unlisted_files.is_empty()
        && checks.iter().all(|c| c.ok);
    Ok(VerifyReport {
        envelope: path.to_path_buf(),
        run_dir: run,
        control_id,
        status: predicate["result"]["status"].as_str().map(str::to_owned),
        signature,
        subjects: checks,
        index,
        misnamed,
        unlisted: false,
        unlisted_files,
        index_missing: false,
        ok,
    })
}

/// The signed index of each run whose envelopes were verified without it: an envelope
/// binds its own subjects, the index binds the rest of the controls folder (a file added
/// to `controls/evidence/`, a `turns.parquet` written after signing), so verifying the
/// envelopes alone must verify the index too. A run without one gets a failing report.
pub fn indexes_not_given(
    reports: &[VerifyReport],
    key: Option<&VerifyingKey>,
    digests: &mut Digests,
) -> Result<Vec<VerifyReport>> {
    let mut runs: Vec<&Path> = Vec::new();
    for r in reports {
        if !runs.contains(&r.run_dir.as_path())
            && !reports.iter().any(|i| i.index && i.run_dir == r.run_dir)
        {
            runs.push(&r.run_dir);
        }
    }
    let mut out = Vec::new();
    for run in runs {
        let rel = format!("{}/{INDEX_FILE}", crate::rundir::CONTROLS_DIR);
        match crate::rundir::artifact(run, &rel)? {
            Some(path) => out.push(verify_envelope_with(&path, key, Some(run), digests)?),
            None => out.push(VerifyReport {
                envelope: run.join(&rel),
                run_dir: run.to_path_buf(),
                control_id: None,
                status: None,
                signature: SignatureVerdict::NotChecked,
                subjects: Vec::new(),
                index: true,
                misnamed: None,
                unlisted: false,
                unlisted_files: Vec::new(),
                index_missing: true,
                ok: false,
            }),
        }
    }
    Ok(out)
}

/// What the run holds that a signed index does not list: every entry of the controls
/// folder (walked without following links; a link, a FIFO or a device there is
/// unlisted whatever its name) and the run files a consumer reads.
fn unlisted_files(run: &Path, subjects: &[SubjectCheck]) -> Result<Vec<String>> {
    use std::collections::BTreeSet;
    let listed: BTreeSet<&str> = subjects.iter().map(|s| s.name.as_str()).collect();
    let mut out = Vec::new();
    for name in super::controls::RUN_SUBJECTS {
        if std::fs::symlink_metadata(run.join(name)).is_ok() && !listed.contains(name) {
            out.push(name.to_owned());
        }
    }
    // The controls folder, at most a few levels deep and a bounded number of entries
    // (a received folder may hold anything).
    const MAX_ENTRIES: usize = 100_000;
    let mut seen = 0usize;
    let mut stack = vec![crate::rundir::CONTROLS_DIR.to_owned()];
    while let Some(rel) = stack.pop() {
        let dir = run.join(&rel);
        let entries = match std::fs::read_dir(&dir) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(Error::io(&dir, "cannot list", e)),
        };
        for entry in entries {
            let entry = entry.map_err(|e| Error::io(&dir, "cannot list", e))?;
            seen += 1;
            if seen > MAX_ENTRIES {
                return Err(Error::State(format!(
                    "{}: more than {MAX_ENTRIES} entries; not a controls folder pieval wrote",
                    run.join(crate::rundir::CONTROLS_DIR).display()
                )));
            }
            let name = format!("{rel}/{}", entry.file_name().to_string_lossy());
            let t = entry
                .file_type()
                .map_err(|e| Error::io(entry.path(), "cannot read", e))?;
            if t.is_dir() {
                stack.push(name);
            } else if name == format!("{}/{INDEX_FILE}", crate::rundir::CONTROLS_DIR) {
                // The index itself (a link or FIFO there fails before this point).
            } else if !t.is_file() || !listed.contains(name.as_str()) {
                out.push(name);
            }
        }
    }
    out.sort();
    Ok(out)
}

/// Verify a run's whole controls folder with `key`: its signed index and every envelope,
/// and that the envelopes present are exactly those the index lists. Empty when the run
/// has no controls folder. A problem is a report with `ok == false` (or an error for an
/// unreadable envelope).
pub fn verify_controls_folder(run: &Path, key: &VerifyingKey) -> Result<Vec<VerifyReport>> {
    let controls = run.join(crate::rundir::CONTROLS_DIR);
    if !controls.exists() {
        return Err(Error::State(format!(
            "{}: no controls folder, so nothing in it is signed (run pieval controls --sign-key)",
            run.display()
        )));
    }
    let index_path = crate::rundir::artifact(run, &format!("{}/{INDEX_FILE}", crate::rundir::CONTROLS_DIR))?
        .ok_or_else(|| {
            Error::State(format!(
                "{}: a controls folder without its signed index ({INDEX_FILE}): run pieval controls again",
                controls.display()
            ))
        })?;
    let mut digests = Digests::default();
    let index = verify_envelope_with(&index_path, Some(key), Some(run), &mut digests)?;
    let listed: std::collections::BTreeSet<String> = index
        .subjects
        .iter()
        .filter_map(|s| {
            s.name
                .strip_prefix("controls/envelopes/")
                .map(str::to_owned)
        })
        .collect();
    let mut reports = vec![index];
    let envelopes = controls.join("envelopes");
    let mut names: Vec<String> = std::fs::read_dir(&envelopes)
        .map_err(|e| Error::io(&envelopes, "cannot list", e))?
        .filter_map(|e| e.ok().map(|e| e.file_name().to_string_lossy().into_owned()))
        .collect();
    names.sort();
    for name in &names {
        let path = envelopes.join(name);
        let mut report = verify_envelope_with(&path, Some(key), Some(run), &mut digests)?;
        if !listed.contains(name) {
            // Planted after the index was signed.
            report.ok = false;
            report.unlisted = true;
        }
        reports.push(report);
    }
    Ok(reports)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subject_names_cannot_escape() {
        let run = Path::new("/r");
        assert_eq!(
            subject_path(run, "a/b.parquet"),
            Some(PathBuf::from("/r/a/b.parquet"))
        );
        for bad in ["../x", "/etc/passwd", "a/../../x", "", "a\\..\\x", "./a"] {
            assert!(subject_path(run, bad).is_none(), "{bad}");
        }
    }

    #[test]
    fn problems_escape_what_the_envelope_says() {
        let report = VerifyReport {
            envelope: "e.json".into(),
            run_dir: "r".into(),
            control_id: None,
            status: None,
            signature: SignatureVerdict::NotChecked,
            index: false,
            misnamed: None,
            unlisted: false,
            unlisted_files: Vec::new(),
            index_missing: false,
            subjects: vec![SubjectCheck {
                name: "evil\u{1b}[31m.txt".into(),
                expected_sha256: "\u{1b}]0;x\u{7}".into(),
                actual_sha256: Some("00".into()),
                ok: false,
            }],
            ok: false,
        };
        let text = report.problems().join("; ");
        assert!(
            !text.contains('\u{1b}') && !text.contains('\u{7}'),
            "{text:?}"
        );
        assert!(text.contains("evil\\u{1b}[31m.txt"), "{text}");
    }

    #[test]
    fn run_dir_from_the_envelope_path() {
        assert_eq!(
            default_run_dir(Path::new("results/r1/controls/envelopes/X.json")),
            Some(PathBuf::from("results/r1"))
        );
        assert_eq!(default_run_dir(Path::new("x/X.json")), None);
    }
}

/// `pieval verify`: each envelope (and the index of each controls folder they come from,
/// when not given) checked against the files it names, and its signature against
/// `public_key`; whether all passed, and the reports. Without a key nothing is
/// authenticated, which passes only with `digest_only`.
pub fn verify_all(
    envelopes: &[PathBuf],
    public_key: Option<&Path>,
    run_dir: Option<&Path>,
    digest_only: bool,
) -> Result<(bool, Vec<VerifyReport>)> {
    if envelopes.is_empty() {
        return Err(Error::Usage(
            "no envelope to verify: give at least one (an empty list proves nothing)".into(),
        ));
    }
    let key = public_key
        .map(crate::evidence::dsse::read_verifying_key)
        .transpose()?;
    let mut reports = Vec::with_capacity(envelopes.len());
    let mut digests = Digests::default();
    for path in envelopes {
        reports.push(verify_envelope_with(
            path,
            key.as_ref(),
            run_dir,
            &mut digests,
        )?);
    }
    // The index binds the rest of each run's controls folder: verified too when only
    // envelopes were given.
    let extra = indexes_not_given(&reports, key.as_ref(), &mut digests)?;
    reports.extend(extra);
    let ok = reports.iter().all(|r| r.ok) && (key.is_some() || digest_only);
    Ok((ok, reports))
}
