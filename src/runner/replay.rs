//! Replaying a run received from elsewhere (`pieval replay RUN [--rescore]`), and the
//! trust policy that goes with it: a run folder is not trusted. Endpoints and key
//! variables it records are called only when the user confirms them (`--trust-endpoint`)
//! or brings their own sections; local files its config names outside the folder are read
//! only with `--trust-paths`; its recorded judge verdicts serve a rescore only with
//! `--trust-judgements`, its reviewers' verdicts only with `--trust-reviews`. A rescore
//! scores the stored predictions again; a replay re-runs the experiment on the same
//! corpus and selection (or refuses).

use std::path::{Path, PathBuf};

use super::{Ended, Progress, RunEvent, RunOptions, RunOutcome};
use crate::error::{Error, Result};
use crate::experiment::config::{Config, LoadedConfig};
use crate::experiment::selection::select;
use crate::provider::config::ProviderKind;
use crate::rundir::{Manifest, ModelSpeed};

/// What the user confirmed of a received run.
#[derive(Clone, Debug, Default)]
pub struct Trust {
    /// Recorded base URLs that may be called (exactly as recorded).
    pub endpoints: Vec<String>,
    /// Use the run's recorded judge verdicts (those whose every input matches).
    pub judgements: bool,
    /// Apply the run's reviewers' verdicts.
    pub reviews: bool,
    /// Use local files the run's config names outside the folder.
    pub paths: bool,
}

/// A replay: the run folder, what the user brings of their own, what they trust.
#[derive(Clone, Debug, Default)]
pub struct ReplayOptions {
    pub dir: PathBuf,
    /// Score the stored predictions again instead of re-running.
    pub rescore: bool,
    /// The user's copy of the corpus (a re-run; its sha256 must be the recorded one).
    pub dataset: Option<PathBuf>,
    /// A judge config of the user's, instead of the run's.
    pub judge: Option<PathBuf>,
    /// An experiment config whose model (and attack models) replace the run's.
    pub model_from: Option<PathBuf>,
    /// A rescore on a cluster: its URL, and the staging folder.
    pub cluster: Option<(String, Option<PathBuf>)>,
    pub trust: Trust,
}

/// A note for the user, through the run's progress callback.
fn note(notes: &Progress, text: String) {
    notes(RunEvent::Note(&text));
}

/// Replay or rescore a received run; `rerun` gives the run options of a re-run (the
/// caller's progress display) from the config's path.
pub fn replay(
    args: &ReplayOptions,
    notes: &Progress,
    rerun: &dyn Fn(PathBuf) -> RunOptions,
) -> Result<RunOutcome> {
    let dir = args.dir.clone();
    let manifest = Manifest::read(&dir)?;
    if !args.rescore && manifest.extra.contains_key("import") {
        return Err(Error::State(format!(
            "{}: an imported run holds another tool's results, which pieval cannot call again; rescore it (pieval replay {} --rescore)",
            dir.display(),
            dir.display()
        )));
    }
    let mpath = dir.join(crate::rundir::MANIFEST_FILE);
    let mut config = Config::from_snapshot(&manifest.config_snapshot, &mpath)?;
    let run_id = manifest.run_id.clone();
    // Endpoints and key variables from a run folder are not trusted: they are replaced
    // by the user's own sections, or confirmed with --trust-endpoint.
    if let Some(f) = &args.judge {
        config.evaluation.judge = Some(crate::judge::config::JudgeSection::load(f)?);
    } else if let Some(j) = &config.evaluation.judge {
        trust_endpoint(
            "evaluation.judge",
            j.provider,
            j.base_url.as_deref(),
            j.api_key_env.as_deref(),
            &args.trust.endpoints,
            "--judge FILE",
        )?;
    }
    let own = args.model_from.as_deref().map(Config::load).transpose()?;
    if let Some(d) = &args.dataset {
        config.dataset.path = d.clone();
    }
    if let Some(own) = &own {
        config.model = own.config.model.clone();
    } else if !args.rescore {
        // an application target: every origin it would call confirmed, with the
        // variables whose values it would send there
        let m = &config.model;
        let (origins, vars): (Vec<String>, Vec<String>) = match (m.provider, &m.http, &m.websocket)
        {
            (ProviderKind::Http, Some(h), _) => {
                (h.origins(), h.secrets.values().cloned().collect())
            }
            (ProviderKind::Websocket, _, Some(w)) => (
                w.origin().into_iter().collect(),
                w.secrets.values().cloned().collect(),
            ),
            _ => (Vec::new(), Vec::new()),
        };
        let vars = vars.join(", $");
        for origin in origins {
            trust_endpoint(
                "model",
                ProviderKind::Openai,
                Some(&origin),
                (!vars.is_empty()).then_some(vars.as_str()),
                &args.trust.endpoints,
                "--model-from CONFIG",
            )?;
        }
        if config.model.provider == ProviderKind::Exec {
            // a command from a received run folder is never started
            let command = config
                .model
                .exec
                .as_ref()
                .map(|x| x.command.join(" "))
                .unwrap_or_default();
            return Err(Error::State(format!(
                "the run's model is the command {}, and a run folder is not trusted: give --model-from CONFIG (your own exec section) to run it again",
                crate::text::escape_control(&crate::text::excerpt(&command, 200))
            )));
        }
        trust_endpoint(
            "model",
            config.model.provider,
            config.model.base_url.as_deref(),
            config.model.api_key_env.as_deref(),
            &args.trust.endpoints,
            "--model-from CONFIG",
        )?;
    }
    let mut own_attack: Vec<&str> = Vec::new();
    // The attack's attacker and translator models: the user's own (from the
    // --model-from config's attack section), or confirmed like the model's endpoint.
    if let Some(attack) = &mut config.attack
        && !args.rescore
    {
        let theirs = own.as_ref().and_then(|o| o.config.attack.as_ref());
        for (name, section, mine) in [
            (
                "attack.attacker",
                &mut attack.attacker,
                theirs.and_then(|a| a.attacker.clone()),
            ),
            (
                "attack.translator",
                &mut attack.translator,
                theirs.and_then(|a| a.translator.clone()),
            ),
        ] {
            if let Some(m) = mine {
                *section = Some(m);
                own_attack.push(name);
            } else if let Some(m) = section {
                trust_endpoint(
                    name,
                    m.provider,
                    m.base_url.as_deref(),
                    m.api_key_env.as_deref(),
                    &args.trust.endpoints,
                    "--model-from CONFIG (with its attack section)",
                )?;
            }
        }
    }
    // Files the received config names outside the run folder: read (a judge cache even
    // written) only when the user confirms them or brings their own section.
    if !args.trust.paths {
        let named = named_paths(
            &config,
            args.dataset.is_none(),
            args.judge.is_none(),
            own.is_some(),
            &own_attack,
            args.rescore,
        );
        if !named.is_empty() {
            let list = named
                .iter()
                .map(|(k, p)| format!("{k}: {}", crate::text::escape_control(p)))
                .collect::<Vec<_>>()
                .join(", ");
            return Err(Error::State(format!(
                "the run's config names local files outside the run folder ({list}), and a run folder is not trusted: give your own (--dataset PATH, --judge FILE, --model-from CONFIG), or --trust-paths to let pieval use these files"
            )));
        }
    }
    if args.rescore {
        let reviews =
            crate::rundir::reviews::read(&dir.join(crate::rundir::reviews::REVIEWS_FILE))?;
        if !reviews.is_empty() && !args.trust.reviews {
            note(
                notes,
                format!(
                    "note: the run's {} reviewer verdict(s) in {} were not applied (a run folder is not trusted); --trust-reviews applies them",
                    reviews.len(),
                    crate::rundir::reviews::REVIEWS_FILE
                ),
            );
        }
        let reviews = if args.trust.reviews {
            let (kept, other) = crate::rundir::reviews::of_run(reviews, &run_id);
            if other > 0 {
                note(
                    notes,
                    format!(
                        "note: {other} reviewer verdict(s) were given on another run than {run_id} and are not applied"
                    ),
                );
            }
            kept
        } else {
            Vec::new()
        };
        let scored = super::score_run(
            &dir,
            &run_id,
            &config,
            Some(notes),
            args.cluster
                .as_ref()
                .map(|(url, staging)| (url.as_str(), staging.as_deref())),
            crate::judge::RunVerdicts::Received {
                serve: args.trust.judgements,
                merge: args.trust.judgements,
            },
            reviews,
            false,
            None,
        )?;
        if let Some(j) = scored.judge.as_ref().filter(|j| j.run_verdicts_unused > 0) {
            note(
                notes,
                format!(
                    "note: the run's {} recorded verdict(s) were not used (a run folder is not trusted); the judge was asked instead. --trust-judgements uses them when every input matches",
                    j.run_verdicts_unused
                ),
            );
        }
        let mut m = manifest.clone();
        super::finish_manifest(&mut m, &scored);
        m.rescored_at = Some(crate::text::utc_rfc3339(crate::text::unix_now()));
        m.write(&dir)?;
        let results = dir.parent().unwrap_or(Path::new("."));
        let catalog = super::run_index::Catalog::open(results)?;
        catalog.record(&super::run_index::RunRow::from_manifest(&m, &dir))?;
        let outcome = RunOutcome {
            run_id,
            dir: dir.clone(),
            status: Ended::Rescored,
            selected: scored.rows as usize,
            executed: 0,
            resumed: 0,
            errors: scored.predictions.provider_errors,
            blocked: 0,
            speed: ModelSpeed::default(),
            score: Some(scored),
            guardrail: None,
            report: None,
        };
        return Ok(outcome);
    }
    // Same corpus, same selection, or refuse.
    let want_sha = manifest.dataset_snapshot.sha256.as_str();
    let corpus = super::load_cases(&config.dataset.path)?;
    if corpus.sha256 != want_sha {
        return Err(Error::State(format!(
            "cannot replay {run_id}: the corpus {} changed (sha256 {} now, {} when the run was made); use --rescore to re-score the stored predictions instead",
            config.dataset.path.display(),
            &corpus.sha256[..12],
            &want_sha[..want_sha.len().min(12)]
        )));
    }
    if corpus.includes_sha256 != manifest.dataset_snapshot.includes_sha256 {
        return Err(Error::State(format!(
            "cannot replay {run_id}: the shared environment files {} includes changed since \
             the run was made; use --rescore to re-score the stored predictions instead",
            config.dataset.path.display()
        )));
    }
    let selected = select(
        &corpus.cases,
        &config.selection,
        config.experiment.seed,
        config.experiment.sample_size,
    )?;
    let recorded = &manifest.dataset_snapshot.selected_case_ids;
    if &selected.selected_case_ids != recorded {
        return Err(Error::State(format!(
            "cannot replay {run_id}: the selection differs ({} case(s) now, {} recorded)",
            selected.selected_case_ids.len(),
            recorded.len()
        )));
    }
    let loaded = LoadedConfig {
        config,
        path: manifest
            .config_source_path
            .as_deref()
            .map(PathBuf::from)
            .unwrap_or_default(),
        sha256: manifest.replay_hints.config_sha256.clone(),
    };
    let mut opts = rerun(loaded.path.clone());
    opts.output_dir = dir.parent().map(Path::to_path_buf);
    super::run_loaded(loaded, &opts)
}

/// The local files a received run's config names ([`Config::local_paths`]), as (key,
/// path), that this replay would use: for a rescore only the judge's; for a re-run every
/// one. Those of a section the user replaced with their own are left out: the judge
/// (`judge_is_runs` false), the corpus (`dataset_is_runs` false), the model (`own_model`)
/// and the attack sections named in `own_attack`.
fn named_paths(
    config: &Config,
    dataset_is_runs: bool,
    judge_is_runs: bool,
    own_model: bool,
    own_attack: &[&str],
    rescore: bool,
) -> Vec<(String, String)> {
    config
        .local_paths()
        .into_iter()
        .filter(|(key, _)| {
            let section = key.rsplit_once('.').map_or(key.as_str(), |(s, _)| s);
            match section {
                "evaluation.judge" => judge_is_runs,
                _ if rescore => false,
                "dataset" => dataset_is_runs,
                "model" => !own_model,
                s => !own_attack.contains(&s),
            }
        })
        .map(|(k, p)| (k, p.display().to_string()))
        .collect()
}

/// An endpoint recorded in a received run may be called only when the user confirms it
/// (`--trust-endpoint URL`, exactly the recorded base_url) or brings their own section.
fn trust_endpoint(
    section: &str,
    provider: crate::provider::config::ProviderKind,
    base_url: Option<&str>,
    api_key_env: Option<&str>,
    trusted: &[String],
    own: &str,
) -> Result<()> {
    let url = match provider {
        ProviderKind::Openai => base_url.unwrap_or_default(),
        ProviderKind::Anthropic => base_url.unwrap_or(crate::provider::anthropic::DEFAULT_BASE_URL),
        _ => return Ok(()),
    };
    if trusted.iter().any(|t| t == url) {
        return Ok(());
    }
    let key = api_key_env
        .map(|k| format!(" with the key in ${}", crate::text::escape_control(k)))
        .unwrap_or_default();
    Err(Error::State(format!(
        "the run's {section} calls {}{key}, and a run folder is not trusted: give {own} (your own settings), or --trust-endpoint {} to confirm this endpoint",
        crate::text::escape_control(url),
        crate::text::escape_control(url)
    )))
}
