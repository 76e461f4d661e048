//! The model calls: each pending case assembled by its mitigation, sent to the backend
//! (a provider, a replayed run, or nothing in a dry run) with bounded concurrency, and
//! appended to the checkpoint as it finishes. Progress goes to the caller's callback.

use std::io::Write;
use std::path::Path;
use std::sync::Arc;

use futures::StreamExt;

use super::{Progress, RunEvent, notes};
use crate::contract::case::AttackCase;
use crate::detect::criteria::{Compiled, Response};
use crate::detect::leak::Prepared;
use crate::detect::refusal::RefusalDetector;
use crate::error::{Error, Result};
use crate::experiment::config::{Config, ExecutionMode, ProviderKind};
use crate::mitigation::{Mitigation, Plan, plan, probe_passes};
use crate::provider::replay::{ReplayProvider, resolve_source};
use crate::provider::{CallError, Provider};
use crate::rundir::{ModelSpeed, PredictionRecord};

/// Counters shown while running.
#[derive(Default)]
pub(super) struct Tally {
    pub done: u64,
    pub errors: u64,
    pub blocked: u64,
    successes: u64,
    pub speed: ModelSpeed,
}

enum Backend {
    Call(Box<dyn Provider>),
    Replay(ReplayProvider),
    DryRun,
}

fn backend(cfg: &Config, progress: Option<&Progress>) -> Result<Backend> {
    if cfg.model.execution_mode == ExecutionMode::DryRun {
        return Ok(Backend::DryRun);
    }
    match cfg.model.provider {
        ProviderKind::Replay => {
            let spec = cfg.model.replay_from.as_deref().unwrap_or_default();
            let source = resolve_source(spec, &cfg.experiment.output_dir)?;
            Ok(Backend::Replay(ReplayProvider::open(&source)?))
        }
        ProviderKind::Openai | ProviderKind::Local => Ok(Backend::Call(crate::provider::build(
            &cfg.model,
            cfg.experiment.seed,
            &mut |line| {
                if let Some(p) = progress {
                    p(RunEvent::Note(line))
                }
            },
        )?)),
    }
}

/// Run every pending case; returns the tally and whether the run was interrupted.
pub(super) fn execute_all(
    cfg: &Config,
    run_id: &str,
    pending: &[&AttackCase],
    dir: &Path,
    progress: Option<&Progress>,
) -> Result<(Tally, bool)> {
    let backend = Arc::new(backend(cfg, progress)?);
    let path = dir.join(crate::rundir::PREDICTIONS_FILE);
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .map_err(|e| Error::io(&path, "cannot open checkpoint", e))?;
    if let Some(p) = progress {
        p(RunEvent::Calling {
            pending: pending.len() as u64,
        });
    }
    let refusals = RefusalDetector::default_pack();
    // For the live success count: criteria compiled once per distinct criteria.
    let by_id: std::collections::HashMap<&str, &AttackCase> =
        pending.iter().map(|c| (c.case_id.as_str(), *c)).collect();
    let mut compiled: std::collections::HashMap<
        crate::contract::criteria::SuccessCriteria,
        Option<Compiled>,
    > = std::collections::HashMap::new();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| Error::Internal(format!("cannot start the async runtime: {e}")))?;
    if let Some(j) = &cfg.evaluation.judge
        && cfg.model.execution_mode != ExecutionMode::DryRun
    {
        // A judge that cannot work (no key, no model) fails the run before the model is
        // paid for.
        let judge = crate::judge::Judge::open(j, Some(dir))?.with_notes(notes(progress));
        rt.block_on(judge.preflight())?;
    }
    // Checked when the config was loaded; a snapshot edited since is refused here.
    let mitigation = Mitigation::from_section(&cfg.mitigation)
        .map_err(|m| Error::State(format!("mitigation.params: {m}")))?;
    let concurrency = cfg.model.concurrency.max(1);
    let call_start = std::time::Instant::now();
    rt.block_on(async {
        let mut tally = Tally::default();
        if let Backend::Call(provider) = backend.as_ref() {
            tally.speed.backend = provider.backend();
            tally.speed.instances = tally.speed.backend.as_ref().map(|_| provider.instances());
        }
        let mut stream = futures::stream::iter(pending.iter().map(|case| {
            let backend = Arc::clone(&backend);
            let p = plan(case, &mitigation, cfg.experiment.seed);
            execute_one(case, p, backend, cfg, run_id)
        }))
        .buffer_unordered(concurrency);
        let mut ctrl_c = std::pin::pin!(tokio::signal::ctrl_c());
        let mut prepared = Prepared::default();
        loop {
            let next = tokio::select! {
                r = stream.next() => r,
                _ = &mut ctrl_c => {
                    if let Some(p) = progress { p(RunEvent::Interrupted); }
                    return Ok((tally, true));
                }
            };
            let Some(record) = next else { break };
            let mut line = serde_json::to_string(&record)
                .map_err(|e| Error::Internal(format!("cannot encode a prediction: {e}")))?;
            line.push('\n');
            file.write_all(line.as_bytes())
                .map_err(|e| Error::io(&path, "cannot append to checkpoint", e))?;
            tally.done += 1;
            tally.errors += u64::from(record.error.is_some());
            let sp = &mut tally.speed;
            sp.prompt_tokens += record.prompt_tokens.unwrap_or(0);
            sp.completion_tokens += record.completion_tokens.unwrap_or(0);
            sp.prompt_secs += record.prompt_secs.unwrap_or(0.0);
            sp.generation_secs += record.generation_secs.unwrap_or(0.0);
            tally.blocked += u64::from(record.blocked_by.is_some());
            if let (Some(_), Some(text), Some(case)) = (
                progress,
                record
                    .response_text
                    .as_deref()
                    .filter(|_| record.blocked_by.is_none()),
                by_id.get(record.case_id.as_str()),
            ) {
                let matcher = compiled
                    .entry(case.success_criteria.clone())
                    .or_insert_with(|| Compiled::compile(&case.success_criteria).ok());
                if let Some(m) = matcher {
                    prepared.load(text);
                    if m.eval(&Response::new(text, &prepared, refusals)).0 == Some(true) {
                        tally.successes += 1;
                    }
                }
            }
            if let Some(p) = progress {
                p(RunEvent::CaseDone {
                    successes: tally.successes,
                    errors: tally.errors,
                    blocked: tally.blocked,
                });
            }
        }
        file.sync_data()
            .map_err(|e| Error::io(&path, "cannot flush checkpoint", e))?;
        if let Some(p) = progress {
            p(RunEvent::CallsDone);
        }
        let sp = &mut tally.speed;
        let rate = |n: u64, secs: f64| (secs > 0.0).then(|| n as f64 / secs);
        sp.prompt_tokens_per_s = rate(sp.prompt_tokens, sp.prompt_secs);
        sp.generation_tokens_per_s = rate(sp.completion_tokens, sp.generation_secs);
        sp.cases_per_minute = rate(tally.done * 60, call_start.elapsed().as_secs_f64());
        Ok((tally, false))
    })
}

async fn execute_one(
    case: &AttackCase,
    plan: Plan,
    backend: Arc<Backend>,
    cfg: &Config,
    run_id: &str,
) -> PredictionRecord {
    let mut rec = PredictionRecord {
        case_id: case.case_id.clone(),
        run_id: run_id.to_owned(),
        provider: cfg.model.provider.as_str().to_owned(),
        model_name: cfg.model.name.clone(),
        request_prompt: Some(plan.request_prompt.clone()),
        request_context: plan.request_context.clone(),
        request_task_input: plan.request_task_input.clone(),
        execution_mode: cfg.model.execution_mode.as_str().to_owned(),
        mitigation: cfg.mitigation.name.as_str().to_owned(),
        blocked_by: plan.blocked_by.clone(),
        ..PredictionRecord::default()
    };
    let fail = |rec: &mut PredictionRecord, e: CallError, what: &str| {
        rec.error = Some(format!("{what}{}", e.message));
        rec.latency_ms = Some(e.latency_ms);
        rec.attempts += e.attempts;
    };
    match backend.as_ref() {
        _ if plan.blocked_by.is_some() => {}
        Backend::DryRun => {}
        Backend::Replay(r) => match r.recorded(&case.case_id) {
            Some(recorded) => {
                rec.response_text = recorded.response_text.clone();
                rec.error = recorded.error.clone();
                rec.blocked_by = recorded.blocked_by.clone();
                rec.latency_ms = recorded.latency_ms;
                rec.attempts = 1;
            }
            None => match r.complete(&case.case_id, &plan.messages).await {
                Ok(_) => {}
                Err(e) => fail(&mut rec, e, ""),
            },
        },
        Backend::Call(p) => {
            let mut go = true;
            if let Some((probe, key)) = &plan.probe {
                match p.complete(&case.case_id, probe).await {
                    Ok(answer) => {
                        rec.attempts += answer.attempts;
                        if !probe_passes(&answer.text, key) {
                            rec.blocked_by = Some("known_answer".into());
                            go = false;
                        }
                        rec.probe_response = Some(answer.text);
                    }
                    Err(e) => {
                        fail(&mut rec, e, "known_answer probe: ");
                        go = false;
                    }
                }
            }
            if go {
                match p.complete(&case.case_id, &plan.messages).await {
                    Ok(c) => {
                        rec.response_text = Some(c.text);
                        rec.response_redacted = c.redacted;
                        rec.response_truncated = c.truncated;
                        rec.latency_ms = Some(c.latency_ms);
                        rec.attempts += c.attempts;
                        rec.prompt_tokens = c.prompt_tokens;
                        rec.completion_tokens = c.completion_tokens;
                        rec.prompt_secs = c.prompt_secs;
                        rec.generation_secs = c.generation_secs;
                    }
                    Err(e) => fail(&mut rec, e, ""),
                }
            }
        }
    }
    rec.completed_at = crate::text::utc_rfc3339(crate::text::unix_now());
    rec
}
