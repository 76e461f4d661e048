//! The run folder's typed manifest: committed manifests (tests/fixtures/runs, written by
//! earlier builds) are read and written back byte for byte; a fresh run's manifest too;
//! older folders load; keys from other versions survive.

use std::path::Path;

use crate::common::{pieval, repo, run};
use pieval::rundir::{Manifest, RunStatus};

fn fixtures() -> Vec<std::path::PathBuf> {
    let mut dirs: Vec<_> = std::fs::read_dir(repo("tests/fixtures/runs"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.join("manifest.json").is_file())
        .collect();
    dirs.sort();
    assert_eq!(dirs.len(), 4, "{dirs:?}");
    dirs
}

fn round_trip(dir: &Path) -> (Manifest, String, String) {
    let text = std::fs::read_to_string(dir.join("manifest.json")).unwrap();
    let m = Manifest::parse(&text, &dir.join("manifest.json")).unwrap();
    let again = format!("{}\n", m.to_text().unwrap());
    (m, text, again)
}

#[test]
fn committed_manifests_round_trip_byte_for_byte() {
    for dir in fixtures() {
        let (m, text, again) = round_trip(&dir);
        assert!(text == again, "{} changed:\n{again}", dir.display());
        assert!(
            m.extra.is_empty(),
            "{}: unknown keys {:?}",
            dir.display(),
            m.extra
        );
        assert_eq!(
            m.dataset_snapshot.selected_case_ids.len() as u64,
            m.replay_hints.selected
        );
    }
}

#[test]
fn typed_fields_read_what_the_runs_recorded() {
    let by_name = |prefix: &str| {
        let dir = fixtures()
            .into_iter()
            .find(|d| d.file_name().unwrap().to_str().unwrap().starts_with(prefix))
            .unwrap();
        round_trip(&dir).0
    };
    let running = by_name("quickstart-20261130T225104Z");
    assert_eq!(running.status, Some(RunStatus::Running));
    assert_eq!(running.experiment_name(), Some("quickstart"));
    assert_eq!(running.model_snapshot.provider, "local");
    assert_eq!(running.dataset_snapshot.selected_case_ids.len(), 48);
    assert!(running.results.is_none() && running.finished_at.is_none());

    let done = by_name("quickstart-20261130T231041Z");
    assert_eq!(done.status, Some(RunStatus::Completed));
    let r = done.results.as_ref().unwrap();
    assert_eq!(r.rows, 6);
    // A dry run: no responses, so no attack was decided.
    let asr = r.attack_success_rate.as_ref().unwrap();
    assert_eq!((asr.n, asr.k, asr.rate), (0, 0, None));
    assert!(done.rescored_at.is_some());

    let failed = by_name("broken-model");
    assert_eq!(failed.status, Some(RunStatus::Failed));
    assert!(
        failed
            .error
            .as_deref()
            .unwrap()
            .contains("cannot open model")
    );
    assert_eq!(failed.resumed_at.as_ref().map(Vec::len), Some(1));
    assert_eq!(failed.mitigation_snapshot.name, "delimiters");
    assert_eq!(
        failed.dataset_snapshot.selection_snapshot.include["attack_surface"],
        ["email", "web_page"]
    );

    let older = by_name("older-format");
    assert!(older.results.as_ref().unwrap().model_speed.is_none());
}

#[test]
fn keys_from_other_versions_are_kept_and_a_bad_manifest_is_located() {
    let dir = &fixtures()[0];
    let text = std::fs::read_to_string(dir.join("manifest.json")).unwrap();
    let mut v: serde_json::Value = serde_json::from_str(&text).unwrap();
    v["from_the_future"] = serde_json::json!({"a": [1, 2]});
    v["dataset_snapshot"]["shards"] = serde_json::json!(3);
    let text = format!("{}\n", serde_json::to_string_pretty(&v).unwrap());
    let m = Manifest::parse(&text, Path::new("m.json")).unwrap();
    assert_eq!(format!("{}\n", m.to_text().unwrap()), text);

    v["replay_hints"]["selected"] = serde_json::json!("many");
    let e = Manifest::parse(&v.to_string(), Path::new("m.json")).unwrap_err();
    assert!(
        e.to_string()
            .contains("m.json:1: replay_hints.selected: not a valid manifest"),
        "{e}"
    );
}

/// A run made now writes a manifest that reads back into the same bytes, and the older
/// folders load in `runs show`.
#[test]
fn a_fresh_run_round_trips_and_old_folders_show() {
    let dir = tempfile::tempdir().unwrap();
    let run_dir = crate::common::dry_run(dir.path(), 5);
    let out = run_dir.parent().unwrap().to_path_buf();
    let (m, text, again) = round_trip(&run_dir);
    assert_eq!(text, again);
    assert_eq!(m.status, Some(RunStatus::Completed));
    assert!(m.results.unwrap().model_speed.is_some());

    for fixture in fixtures() {
        let copy = out.join(fixture.file_name().unwrap());
        std::fs::create_dir_all(&copy).unwrap();
        std::fs::copy(fixture.join("manifest.json"), copy.join("manifest.json")).unwrap();
        let r = run(pieval().args(["runs", "show"]).arg(&copy));
        assert_eq!(r.code, 0, "{}", r.stderr);
        let status = round_trip(&fixture).0.status.unwrap();
        assert!(
            r.stdout
                .contains(&format!("status         {}", status.as_str())),
            "{}",
            r.stdout
        );
    }
}
