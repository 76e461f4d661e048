//! The model calls: each pending attempt (a case, or with an `attack` section a case ×
//! converter pipeline or strategy, `crate::attack`) assembled by its mitigation, sent to
//! the backend (a provider, a replayed run, or nothing in a dry run) with bounded
//! concurrency, and appended to the checkpoint as it finishes. A multi-turn attempt
//! writes its transcript as turn lines before its prediction line (no line over the
//! readers' limit), so a killed run resumes at the attempt without losing or repeating
//! a turn. Progress goes to the caller's
//! callback.

use std::path::Path;
use std::sync::Arc;

use futures::StreamExt;

use super::{Progress, RunEvent, notes};
use crate::attack::convert::{Ctx, translation_request};
use crate::attack::payload::{locate, target};
use crate::attack::transcript::{TranscriptReplay, translate_key};
use crate::attack::{AttackPlan, Attempt, attempts};
use crate::contract::case::AttackCase;
use crate::detect::criteria::{Compiled, Response};
use crate::detect::echo::Given;
use crate::detect::leak::Prepared;
use crate::detect::refusal::RefusalDetector;
use crate::error::{Error, Result};
use crate::experiment::config::Config;
use crate::mitigation::{Mitigation, Plan, plan, probe_passes};
use crate::provider::config::ModelSection;
use crate::provider::config::{ExecutionMode, ProviderKind};
use crate::provider::replay::{ReplayProvider, resolve_source};
use crate::provider::{AttemptScope, CallError, Message, Provider};
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

enum Answers {
    Call(Box<dyn Provider>),
    /// Single-turn answers by attempt or case; a multi-turn run's target turns.
    Replay(ReplayProvider, Option<TranscriptReplay>),
    DryRun,
}

/// The models an attack section adds: the attacker (and TAP's evaluator), the translator.
struct Helpers {
    attacker: Option<Box<dyn Provider>>,
    translator: Option<Box<dyn Provider>>,
    /// A replayed run's agent turns (`provider: replay` with agentic cases).
    agents: Option<crate::agent::replay::AgentReplay>,
}

/// Every model the run calls, built once from the config: the target (a calling
/// provider, a replay of recorded answers, or nothing in a dry run) and the helpers an
/// attack section adds. A replay source is resolved here and nowhere else.
fn targets(
    cfg: &Config,
    pending: &[(&AttackCase, Attempt)],
    progress: Option<&Progress>,
) -> Result<(Answers, Helpers)> {
    let dry = cfg.model.execution_mode == ExecutionMode::DryRun;
    let source = |m: &ModelSection| {
        resolve_source(
            m.replay_from.as_deref().unwrap_or_default(),
            &cfg.experiment.output_dir,
        )
    };
    let call = |m: &ModelSection| {
        crate::provider::build(m, cfg.experiment.seed, &mut |line| {
            if let Some(p) = progress {
                p(RunEvent::Note(line))
            }
        })
    };
    let helper = |m: &Option<ModelSection>| -> Result<Option<Box<dyn Provider>>> {
        match m {
            None => Ok(None),
            Some(_) if dry => Ok(None),
            Some(m) if m.provider == ProviderKind::Replay => {
                Ok(Some(Box::new(TranscriptReplay::open(&source(m)?)?)))
            }
            Some(m) => call(m).map(Some),
        }
    };
    let attack = cfg.attack.as_ref();
    let helpers = Helpers {
        attacker: helper(attack.map_or(&None, |a| &a.attacker))?,
        translator: helper(attack.map_or(&None, |a| &a.translator))?,
        agents: None,
    };
    if dry {
        return Ok((Answers::DryRun, helpers));
    }
    if cfg.model.provider != ProviderKind::Replay {
        return Ok((Answers::Call(call(&cfg.model)?), helpers));
    }
    let source = source(&cfg.model)?;
    let multi_turn = attack.is_some_and(|a| a.strategy.is_some());
    let agents = pending
        .iter()
        .any(|(c, _)| c.environment.is_some())
        .then(|| crate::agent::replay::AgentReplay::open(&source))
        .transpose()?;
    Ok((
        Answers::Replay(
            ReplayProvider::open(&source)?,
            multi_turn
                .then(|| TranscriptReplay::open(&source))
                .transpose()?,
        ),
        Helpers { agents, ..helpers },
    ))
}

/// Every attempt of the cases not in `done` (checkpoint keys).
pub(super) fn pending_attempts<'c>(
    cfg: &Config,
    cases: &'c [AttackCase],
    done: &std::collections::HashSet<String>,
) -> Result<Vec<(&'c AttackCase, Attempt)>> {
    let plan = attack_plan(cfg)?;
    Ok(cases
        .iter()
        .flat_map(|c| {
            attempts(
                plan.as_ref(),
                &c.case_id,
                c.label.map(|v| v.as_str()) == Some("benign"),
            )
            .into_iter()
            .map(move |a| (c, a))
        })
        .filter(|(c, a)| !done.contains(a.id().unwrap_or(&c.case_id)))
        .collect())
}

/// The config's attack plan (checked when the config was loaded; a snapshot edited since
/// is refused here).
fn attack_plan(cfg: &Config) -> Result<Option<AttackPlan>> {
    cfg.attack
        .as_ref()
        .map(|a| {
            AttackPlan::from_section(a).map_err(|(k, m)| Error::State(format!("attack.{k}: {m}")))
        })
        .transpose()
}

/// Run every pending attempt; returns the tally and whether the run was interrupted.
pub(super) fn execute_all(
    cfg: &Config,
    run_id: &str,
    pending: &[(&AttackCase, Attempt)],
    dir: &Path,
    progress: Option<&Progress>,
) -> Result<(Tally, bool)> {
    let (backend, helpers) = targets(cfg, pending, progress)?;
    let (backend, helpers) = (Arc::new(backend), Arc::new(helpers));
    let plan = attack_plan(cfg)?;
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
    let by_id: std::collections::HashMap<&str, &AttackCase> = pending
        .iter()
        .map(|(c, _)| (c.case_id.as_str(), *c))
        .collect();
    let mut compiled: std::collections::HashMap<
        crate::contract::criteria::SuccessCriteria,
        Option<Compiled>,
    > = std::collections::HashMap::new();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| Error::Internal(format!("cannot start the async runtime: {e}")))?;
    // A target that keeps files in the run folder opens them, and completes what a
    // killed run left (an application's plants removed) before anything is sent.
    let note = notes(progress);
    if let Answers::Call(p) = backend.as_ref() {
        rt.block_on(p.open_run(dir, Arc::clone(&note)))?;
    }
    let judge = match &cfg.evaluation.judge {
        Some(j) if cfg.model.execution_mode != ExecutionMode::DryRun => {
            // A judge that cannot work (no key, no model) fails the run before the model
            // is paid for.
            let judge = crate::judge::Judge::open(j, Some(dir))?.with_notes(notes(progress));
            rt.block_on(judge.preflight())?;
            Some(judge)
        }
        _ => None,
    };
    // Multi-turn strategies put undecided criteria to the judge turn by turn.
    let strategy_judge = judge
        .as_ref()
        .filter(|_| plan.as_ref().is_some_and(|p| p.strategy.is_some()));
    // Checked when the config was loaded; a snapshot edited since is refused here.
    let mitigation = Mitigation::from_section(&cfg.mitigation)
        .map_err(|m| Error::State(format!("mitigation.params: {m}")))?;
    let concurrency = cfg.model.concurrency.max(1);
    // Each agentic attempt's world served to the agent (`model.world`), on one server
    // for the run.
    let hub = match (&cfg.model.world, backend.as_ref()) {
        (Some(w), Answers::Call(_)) => {
            let addr = w
                .addr()
                .map_err(|m| Error::State(format!("model.world.listen: {m}")))?;
            Some(rt.block_on(crate::agent::serve::Hub::start(addr))?)
        }
        _ => None,
    };
    // The trace receiver (`model.traces`): the spans of an agent whose tools are real.
    let receiver = match (&cfg.model.traces, backend.as_ref()) {
        (Some(t), Answers::Call(_)) => {
            let addr = t
                .addr()
                .map_err(|m| Error::State(format!("model.traces.listen: {m}")))?;
            Some(rt.block_on(crate::agent::traces::Receiver::start(addr, dir))?)
        }
        _ => None,
    };
    let call_start = std::time::Instant::now();
    let result = rt.block_on(async {
        let mut tally = Tally::default();
        if let Answers::Call(provider) = backend.as_ref() {
            tally.speed.backend = provider.backend();
            tally.speed.instances = tally.speed.backend.as_ref().map(|_| provider.instances());
        }
        let attempt = AttemptRunner {
            cfg,
            run_id,
            plan: plan.as_ref(),
            mitigation: &mitigation,
            judge: strategy_judge,
            hub: hub.as_ref(),
            receiver: receiver.as_ref(),
        };
        let mut stream = futures::stream::iter(pending.iter().map(|(case, spec)| {
            let backend = Arc::clone(&backend);
            let helpers = Arc::clone(&helpers);
            let attempt = &attempt;
            async move { attempt.run(case, spec, backend, helpers).await }
        }))
        .buffer_unordered(concurrency);
        let mut ctrl_c = std::pin::pin!(tokio::signal::ctrl_c());
        let mut prepared = Prepared::default();
        loop {
            let next = tokio::select! {
                r = stream.next() => r,
                _ = &mut ctrl_c => {
                    // What the attempts cut short had planted is removed now (first:
                    // nothing below may stop it).
                    if let Answers::Call(target) = backend.as_ref()
                        && let Some(line) = target.close_run().await
                    {
                        note(&line);
                    }
                    // The strategies' verdicts so far: a resume scores without asking again.
                    if let Some(j) = strategy_judge {
                        j.persist(Some(dir))?;
                    }
                    if let Some(p) = progress { p(RunEvent::Interrupted); }
                    return Ok((tally, true));
                }
            };
            let Some(mut record) = next else { break };
            // A multi-turn attempt: its turn lines, then its prediction line.
            crate::rundir::checkpoint::write_attempt(&mut file, &path, &mut record)?;
            record.turns = Vec::new();
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
                    // what the model was given, as scoring reads it (score_cases.sql)
                    let given = Given::new(
                        [
                            record.request_prompt.as_deref(),
                            Some(case.prompt.as_str()),
                            record.request_task_input.as_deref(),
                            case.task_input.as_deref(),
                        ],
                        case.context.as_deref(),
                    );
                    let response = Response::new(text, &prepared, refusals).with_given(&given);
                    if m.decide(&response).success == Some(true) {
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
        if let Answers::Call(target) = backend.as_ref()
            && let Some(line) = target.close_run().await
        {
            note(&line);
        }
        // The strategies' verdicts: scoring finds the final answers' among them.
        if let Some(j) = strategy_judge {
            j.persist(Some(dir))?;
        }
        if let Some(p) = progress {
            p(RunEvent::CallsDone);
        }
        let sp = &mut tally.speed;
        let rate = |n: u64, secs: f64| (secs > 0.0).then(|| n as f64 / secs);
        sp.prompt_tokens_per_s = rate(sp.prompt_tokens, sp.prompt_secs);
        sp.generation_tokens_per_s = rate(sp.completion_tokens, sp.generation_secs);
        sp.cases_per_minute = rate(tally.done * 60, call_start.elapsed().as_secs_f64());
        Ok((tally, false))
    });
    if let Some(h) = &hub {
        rt.block_on(h.stop());
    }
    if let Some(r) = &receiver {
        rt.block_on(r.stop());
        let dropped = r.dropped();
        if dropped > 0 {
            note(&format!(
                "trace receiver: {dropped} span(s) of traces no attempt started were dropped"
            ));
        }
    }
    result
}

/// What every attempt shares.
struct AttemptRunner<'a> {
    cfg: &'a Config,
    run_id: &'a str,
    plan: Option<&'a AttackPlan>,
    mitigation: &'a Mitigation,
    judge: Option<&'a crate::judge::Judge>,
    /// The world server (`model.world`), for an agent with its own loop.
    hub: Option<&'a crate::agent::serve::Hub>,
    /// The trace receiver (`model.traces`), for an agent whose tools are real.
    receiver: Option<&'a crate::agent::traces::Receiver>,
}

impl AttemptRunner<'_> {
    /// One attempt; against a calling target, inside its scope ([`provider::ATTEMPT`]):
    /// begun (a session, what is planted), run, and ended whatever happened.
    async fn run(
        &self,
        case: &AttackCase,
        spec: &Attempt,
        backend: Arc<Answers>,
        helpers: Arc<Helpers>,
    ) -> PredictionRecord {
        let Answers::Call(target) = backend.as_ref() else {
            return self.attempt(case, spec, backend, helpers).await;
        };
        let key = spec.id().unwrap_or(&case.case_id).to_owned();
        let mut scope = AttemptScope::new(&key, case);
        scope.traceparent = Some(crate::agent::otel::traceparent(self.run_id, &key));
        scope.otlp_traces_url = self.receiver.map(|r| r.url());
        let scope = Arc::new(scope);
        let begun = target.begin(&scope).await;
        let mut rec = match begun {
            Ok(()) => {
                crate::provider::ATTEMPT
                    .scope(
                        Arc::clone(&scope),
                        self.attempt(case, spec, Arc::clone(&backend), helpers),
                    )
                    .await
            }
            Err(e) => {
                let mut rec = self.record(case, spec);
                rec.error = Some(e.message);
                rec.latency_ms = Some(e.latency_ms);
                rec.attempts = e.attempts;
                rec.completed_at = crate::text::utc_rfc3339(crate::text::unix_now());
                rec
            }
        };
        target.end(&scope).await;
        let st = scope.state();
        rec.planted = st.planted.clone();
        rec.removed = st.removed.filter(|_| st.planted.is_some());
        if let (Some(false), Some(e)) = (rec.removed, &st.cleanup_error) {
            rec.cleanup_error = Some(e.clone());
        }
        rec
    }

    /// The record every attempt starts from.
    fn record(&self, case: &AttackCase, spec: &Attempt) -> PredictionRecord {
        let cfg = self.cfg;
        PredictionRecord {
            case_id: case.case_id.clone(),
            run_id: self.run_id.to_owned(),
            provider: cfg.model.provider.as_str().to_owned(),
            model_name: cfg.model.name.clone(),
            execution_mode: cfg.model.execution_mode.as_str().to_owned(),
            mitigation: cfg.mitigation.name.as_str().to_owned(),
            attempt_id: spec.id().map(str::to_owned),
            attack_pipeline: spec.pipeline_label(),
            attack_strategy: spec.strategy_label(),
            ..PredictionRecord::default()
        }
    }

    async fn attempt(
        &self,
        case: &AttackCase,
        spec: &Attempt,
        backend: Arc<Answers>,
        helpers: Arc<Helpers>,
    ) -> PredictionRecord {
        let cfg = self.cfg;
        let seed = cfg.experiment.seed;
        let mut rec = self.record(case, spec);
        let key = spec.id().unwrap_or(&case.case_id).to_owned();
        if matches!(spec, Attempt::Strategy { .. }) && case.environment.is_some() {
            rec.error = Some(
                "attack strategies hold a conversation with a model; an agentic case (environment) runs its own loop: use converters for it".into(),
            );
            rec.completed_at = crate::text::utc_rfc3339(crate::text::unix_now());
            return rec;
        }
        if matches!(spec, Attempt::Strategy { .. }) {
            self.strategy(case, &key, &mut rec, &backend, &helpers)
                .await;
            rec.completed_at = crate::text::utc_rfc3339(crate::text::unix_now());
            return rec;
        }
        // The case as sent: its payload converted by the attempt's pipeline.
        let mut sent = std::borrow::Cow::Borrowed(case);
        if let (
            Some(attack),
            Attempt::Converted {
                pipeline: i,
                variant,
                ..
            },
        ) = (self.plan, spec)
        {
            let pipeline = &attack.pipelines[*i];
            let located = locate(case);
            rec.payload_located = Some(located.how.to_owned());
            let ctx = Ctx {
                seed,
                case_id: &case.case_id,
                variant: *variant,
                target: target(case),
            };
            let (before, after) = pipeline.split_at_translate();
            let mut text = before.apply(located.text(case), &ctx);
            if let (Some(after), Some(language)) = (after, pipeline.translation()) {
                let translated = match helpers.translator.as_deref() {
                    // A dry run calls nothing: the text goes untranslated.
                    None => Ok(text.clone()),
                    Some(t) => t
                        .complete(
                            &translate_key(&key),
                            &[Message::user(translation_request(
                                &text, language, ctx.target,
                            ))],
                        )
                        .await
                        .map(|c| {
                            rec.translation = Some(c.text.clone());
                            c.text.trim().to_owned()
                        }),
                };
                match translated {
                    Ok(t) => text = after.apply(&t, &ctx),
                    Err(e) => {
                        let p = plan(case, self.mitigation, seed);
                        rec.request_prompt = Some(p.request_prompt);
                        rec.error = Some(format!(
                            "{}{}",
                            crate::attack::transcript::TRANSLATOR_ERROR,
                            e.message
                        ));
                        rec.attempts += e.attempts;
                        rec.completed_at = crate::text::utc_rfc3339(crate::text::unix_now());
                        return rec;
                    }
                }
            }
            sent = std::borrow::Cow::Owned(located.replace(case, &text));
        }
        if sent.environment.is_some() {
            self.agent(&key, &sent, &mut rec, &backend, &helpers).await;
            rec.completed_at = crate::text::utc_rfc3339(crate::text::unix_now());
            return rec;
        }
        // Planted delivery: the application reads the case's content from where setup
        // planted it; the message is the user task alone.
        let planted = cfg
            .model
            .http
            .as_ref()
            .is_some_and(|h| h.delivery == crate::provider::http::config::Delivery::Planted);
        if planted && sent.attack_surface.is_indirect() && sent.task_input.is_some() {
            sent.to_mut().task_input = None;
        }
        let p = plan(&sent, self.mitigation, seed);
        execute_one(&key, p, &backend, rec).await
    }

    /// An agentic attempt (`crate::agent`): the loop against the case's environment,
    /// its payload (the `task_input`, converted) in the injected vectors; a benign case
    /// runs with the vectors' defaults.
    async fn agent(
        &self,
        key: &str,
        case: &AttackCase,
        rec: &mut PredictionRecord,
        backend: &Answers,
        helpers: &Helpers,
    ) {
        let payload = if case.is_benign() {
            None
        } else {
            case.task_input.as_deref()
        };
        let seed = self.cfg.experiment.seed;
        let served = self.cfg.model.world.is_some();
        let out = match (backend, &helpers.agents) {
            (Answers::DryRun, _) => {
                rec.request_context = case.context.clone();
                rec.request_prompt = Some(case.prompt.clone());
                rec.request_task_input = payload.map(str::to_owned);
                return;
            }
            (Answers::Call(p), _) if served => {
                let Some(hub) = self.hub else {
                    rec.error = Some("world server: not started".into());
                    return;
                };
                crate::agent::drive::drive(
                    hub,
                    case,
                    payload,
                    self.mitigation,
                    seed,
                    key,
                    p.as_ref(),
                )
                .await
            }
            (Answers::Call(p), _) if self.receiver.is_some() => {
                let receiver = self.receiver.expect("matched");
                let wait = self.cfg.model.traces.as_ref().map_or(10.0, |t| t.wait_s);
                let traceparent = crate::agent::otel::traceparent(self.run_id, key);
                crate::agent::drive::traced(
                    receiver,
                    std::time::Duration::from_secs_f64(wait),
                    case,
                    payload,
                    self.mitigation,
                    key,
                    p.as_ref(),
                    &traceparent,
                )
                .await
            }
            (Answers::Replay(..), Some(r)) if served => {
                crate::agent::drive::replay(case, payload, self.mitigation, seed, key, r).await
            }
            (Answers::Call(p), _) => {
                crate::agent::run::run(case, payload, self.mitigation, seed, key, p.as_ref()).await
            }
            (Answers::Replay(..), Some(r)) => {
                crate::agent::run::run(case, payload, self.mitigation, seed, key, r).await
            }
            (Answers::Replay(..), None) => {
                rec.error = Some("replay: the recorded run holds no agent turns".into());
                return;
            }
        };
        rec.request_context = out.system;
        rec.request_prompt = Some(out.task);
        rec.request_task_input = payload.map(str::to_owned);
        rec.response_text = out.response;
        rec.error = out.error;
        rec.blocked_by = out.blocked_by;
        rec.latency_ms = Some(out.latency_ms);
        rec.attempts = out.attempts;
        rec.prompt_tokens = out.prompt_tokens;
        rec.completion_tokens = out.completion_tokens;
        rec.response_redacted = out.redacted;
        rec.response_truncated = out.truncated;
        // the model's turns (turn 0, the environment's prefill, is not one)
        rec.turns_used = Some(out.turns.iter().filter(|t| t.turn > 0).count() as u32);
        rec.turns = out.turns;
        rec.agent_actions = Some(out.actions);
        // "null": no store known (an agent whose tools are real)
        rec.final_state = (out.final_state != "null").then_some(out.final_state);
        rec.injection_delivered = out.injection_delivered;
        rec.agent_stop = Some(out.stop.as_str().to_owned());
    }

    /// A multi-turn attempt (`crate::attack::strategy`).
    async fn strategy(
        &self,
        case: &AttackCase,
        key: &str,
        rec: &mut PredictionRecord,
        backend: &Answers,
        helpers: &Helpers,
    ) {
        let Some(spec) = self.plan.and_then(|p| p.strategy.as_ref()) else {
            return;
        };
        let target: &dyn Provider = match backend {
            Answers::DryRun => {
                let p = plan(case, self.mitigation, self.cfg.experiment.seed);
                rec.request_prompt = Some(p.request_prompt);
                rec.request_context = p.request_context;
                rec.request_task_input = p.request_task_input;
                return;
            }
            Answers::Call(p) => p.as_ref(),
            Answers::Replay(_, Some(t)) => t,
            Answers::Replay(_, None) => {
                rec.error = Some("replay: the recorded run holds no transcripts".into());
                return;
            }
        };
        let Some(attacker) = helpers.attacker.as_deref() else {
            rec.error = Some("attacker: no attacker model".into());
            return;
        };
        let out = crate::attack::strategy::Attack {
            case,
            attempt_id: key,
            spec,
            mitigation: self.mitigation,
            seed: self.cfg.experiment.seed,
            attacker,
            target,
            judge: self.judge,
            // The verdicts recorded with the target's answers, when they are replayed.
            recorded: match backend {
                Answers::Replay(_, Some(t)) => Some(t),
                _ => None,
            },
            held: crate::attack::strategy::Held::new(crate::rundir::checkpoint::MAX_ATTEMPT_BYTES),
        }
        .run()
        .await;
        if let Some(p) = out.plan {
            rec.request_prompt = Some(p.request_prompt);
            rec.request_context = p.request_context;
            rec.request_task_input = p.request_task_input;
            rec.blocked_by = p.blocked_by;
        }
        rec.response_text = out.response;
        rec.latency_ms = out.latency_ms;
        rec.error = out.error;
        rec.attempts = out.calls;
        rec.turns_used = Some(out.turns_used);
        rec.success_turn = out.success_turn;
        rec.turns = out.turns;
    }
}

/// A single-turn attempt: the request `plan` sent to the backend, the answer recorded.
async fn execute_one(
    key: &str,
    plan: Plan,
    backend: &Answers,
    mut rec: PredictionRecord,
) -> PredictionRecord {
    rec.request_prompt = Some(plan.request_prompt.clone());
    rec.request_context = plan.request_context.clone();
    rec.request_task_input = plan.request_task_input.clone();
    rec.blocked_by = plan.blocked_by.clone();
    let fail = |rec: &mut PredictionRecord, e: CallError, what: &str| {
        rec.error = Some(format!("{what}{}", e.message));
        rec.latency_ms = Some(e.latency_ms);
        rec.attempts += e.attempts;
    };
    match backend {
        _ if plan.blocked_by.is_some() => {}
        Answers::DryRun => {}
        Answers::Replay(r, _) => match r.recorded(key) {
            Some(recorded) => {
                rec.response_text = recorded.response_text.clone();
                rec.error = recorded.error.clone();
                rec.blocked_by = recorded.blocked_by.clone();
                rec.latency_ms = recorded.latency_ms;
                rec.attempts = 1;
            }
            None => match r.complete(key, &plan.messages).await {
                Ok(_) => {}
                Err(e) => fail(&mut rec, e, ""),
            },
        },
        Answers::Call(p) => {
            let mut go = true;
            if let Some((probe, probe_key)) = &plan.probe {
                match p.complete(key, probe).await {
                    Ok(answer) => {
                        rec.attempts += answer.attempts;
                        if !probe_passes(&answer.text, probe_key) {
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
                match p.complete(key, &plan.messages).await {
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
