//! An agentic attempt whose agent has its own loop (`model.world`, docs/agents.md): the
//! case's world is served for the attempt ([`super::serve`]), the target — the team's
//! agent behind `http`, `exec`, `websocket`, `openai` or `anthropic` — is sent the user's
//! task once, with the world's address, and pieval waits for its final answer. What the
//! agent did is what its world recorded: each call a turn (in the order they came), the
//! calls of offered tools its actions, the store at the end its final state — judged by
//! the same criteria as pieval's own loop ([`super::run`]).
//!
//! A replay runs the recorded calls through the same world again, in their order, and
//! takes the recorded answer: the same outputs, records and verdicts.

use std::sync::Arc;

use serde_json::{Value, json};

use super::replay::AgentReplay;
use super::run::{Outcome, Stop, bounded};
use super::serve::{Hub, Live};
use crate::contract::case::AttackCase;
use crate::mitigation::Mitigation;
use crate::provider::{AgentTurn, CallError, Provider};
use crate::rundir::checkpoint::TurnRecord;

/// The world served to the agent until the attempt takes it back — also when the
/// attempt is dropped half-way (Ctrl-C): no world outlives its attempt.
struct Served<'h> {
    hub: &'h Hub,
    id: String,
}

impl Served<'_> {
    fn take(self) -> Option<Live> {
        let live = self.hub.take(&self.id);
        std::mem::forget(self);
        live
    }
}

impl Drop for Served<'_> {
    fn drop(&mut self) {
        self.hub.take(&self.id);
    }
}

/// The attempt's world, or the outcome of one that cannot start.
fn open(
    case: &AttackCase,
    payload: Option<&str>,
    mitigation: &Mitigation,
    seed: u64,
) -> Result<(Live, Vec<Value>), Box<Outcome>> {
    let mut out = Outcome::empty(case);
    let live = match Live::new(
        Arc::new(case.clone()),
        payload,
        Arc::new(mitigation.clone()),
        seed,
    ) {
        Ok(l) => l,
        Err(e) => {
            out.error = Some(e);
            return Err(Box::new(out));
        }
    };
    // what pieval's own loop sends first: the system message (the case's context and
    // the mitigation's note), the task, the scenario's start
    let mut messages = Vec::new();
    if let Some(s) = system(case, &live) {
        messages.push(json!({"role": "system", "content": s}));
    }
    messages.push(json!({"role": "user", "content": case.prompt}));
    messages.extend(live.prefill.iter().cloned());
    Ok((live, messages))
}

fn system(case: &AttackCase, live: &Live) -> Option<String> {
    let context = case.context.clone().filter(|s| !s.is_empty());
    match (context, &live.note) {
        (Some(c), Some(n)) => Some(format!("{c}\n\n{n}")),
        (Some(c), None) => Some(c),
        (None, n) => n.clone(),
    }
}

/// One attempt of `case` with its world served on `hub` and `target` driving the agent.
/// `key` names the attempt (its checkpoint key).
pub async fn drive(
    hub: &Hub,
    case: &AttackCase,
    payload: Option<&str>,
    mitigation: &Mitigation,
    seed: u64,
    key: &str,
    target: &dyn Provider,
) -> Outcome {
    let (live, messages) = match open(case, payload, mitigation, seed) {
        Ok(x) => x,
        Err(out) => return *out,
    };
    if let Some(b) = live.blocked.clone() {
        // the scenario's start was withheld and ended the attempt (input_filter with
        // stop_agent): the agent is not called, as in pieval's own loop
        return finish(case, live, payload, Err(None), Some(b));
    }
    let (id, address) = match hub.open(live) {
        Ok(x) => x,
        Err(e) => {
            let mut out = Outcome::empty(case);
            out.error = Some(format!("world server: {e}"));
            return out;
        }
    };
    let served = Served { hub, id };
    let _ = crate::provider::ATTEMPT.try_with(|s| s.state().world = Some(address));
    let reply = target.chat(&format!("{key}#1"), &messages, &[]).await;
    let _ = crate::provider::ATTEMPT.try_with(|s| s.state().world = None);
    let Some(live) = served.take() else {
        let mut out = Outcome::empty(case);
        out.error = Some("world server: the attempt's world was gone".into());
        return out;
    };
    finish(case, live, payload, reply.map_err(Some), None)
}

/// A served attempt again from its records (`provider: replay`): the recorded calls
/// through the same world, in their order, then the recorded answer.
pub async fn replay(
    case: &AttackCase,
    payload: Option<&str>,
    mitigation: &Mitigation,
    seed: u64,
    key: &str,
    recorded: &AgentReplay,
) -> Outcome {
    let (mut live, _) = match open(case, payload, mitigation, seed) {
        Ok(x) => x,
        Err(out) => return *out,
    };
    live.replaying();
    if let Some(b) = live.blocked.clone() {
        return finish(case, live, payload, Err(None), Some(b));
    }
    // the agent's calls are turns 1, 2, …; its answer the turn after them
    let mut n = 1;
    loop {
        let turn = recorded.chat(&format!("{key}#{n}"), &[], &[]).await;
        match turn {
            Ok(t) if !t.tool_calls.is_empty() => {
                for c in &t.tool_calls {
                    live.call(&c.name, &c.arguments);
                    if let Some(last) = live.turns.last_mut() {
                        last.latency_ms = Some(t.completion.latency_ms);
                    }
                }
                n += 1;
            }
            other => return finish(case, live, payload, other.map_err(Some), None),
        }
    }
}

/// The outcome of a served attempt from what its world recorded and the agent's reply
/// (`Err(None)`: the agent was not called).
fn finish(
    case: &AttackCase,
    live: Live,
    payload: Option<&str>,
    reply: Result<AgentTurn, Option<CallError>>,
    blocked: Option<String>,
) -> Outcome {
    let mut out = Outcome::empty(case);
    out.system = system(case, &live);
    let final_state = live.state().to_string();
    let Live {
        mut turns,
        actions,
        delivered,
        prefill_injected,
        blocked: world_blocked,
        error: world_error,
        ..
    } = live;
    let n = turns.iter().filter(|t| t.turn > 0).count() as u32 + 1;
    let mut last = TurnRecord {
        turn: n,
        depth: 0,
        node_id: n.to_string(),
        ..TurnRecord::default()
    };
    let payload = payload.filter(|p| !p.is_empty());
    let read = delivered || prefill_injected;
    out.injection_delivered = payload.map(|_| read);
    out.blocked_by = blocked.or(world_blocked);
    match reply {
        Ok(r) => {
            let c = &r.completion;
            out.latency_ms = c.latency_ms;
            out.attempts = c.attempts;
            out.prompt_tokens = c.prompt_tokens;
            out.completion_tokens = c.completion_tokens;
            out.redacted = c.redacted;
            out.truncated = c.truncated;
            last.latency_ms = Some(c.latency_ms);
            last.target_response = r.content.clone();
            out.response = r.content;
            out.stop = Stop::Answer;
            if !r.tool_calls.is_empty() {
                let e = format!(
                    "the target answered with {} tool call(s) ({}): an agent served its world makes its calls to the world (model.world), and answers with text",
                    r.tool_calls.len(),
                    crate::text::excerpt(&r.tool_calls[0].name, 64)
                );
                last.error = Some(e.clone());
                out.error = Some(e);
                out.stop = Stop::Error;
            }
            turns.push(last);
        }
        Err(Some(e)) => {
            out.latency_ms = e.latency_ms;
            out.attempts = e.attempts;
            last.latency_ms = Some(e.latency_ms);
            last.error = Some(e.message.clone());
            turns.push(last);
            out.error = Some(e.message);
            out.stop = Stop::Error;
            if !read {
                // failed before anything reached the agent: delivery undecided
                out.injection_delivered = None;
            }
        }
        Err(None) => {}
    }
    if out.blocked_by.is_some() {
        out.stop = Stop::Blocked;
    }
    if let Some(e) = world_error {
        // the world ended the attempt (its calls past their budget, its text past its
        // bound): the agent's answer came after its world stopped taking calls
        out.error = Some(e);
        out.stop = Stop::Error;
    }
    out.actions = bounded(
        Value::Array(actions).to_string(),
        "[]",
        "the attempt's actions",
        &mut out,
    );
    out.final_state = bounded(final_state, "null", "the environment's store", &mut out);
    if let Some(first) = turns.first_mut()
        && first.attack_prompt.is_empty()
    {
        first.attack_prompt = case.prompt.clone();
    }
    out.turns = turns;
    out
}

/// One attempt of `case` whose agent's tools are real (`model.traces`): the task sent
/// once with the attempt's `traceparent`, the agent's calls read from the spans its trace
/// brought to `receiver` (mapped as `pieval import otel` maps them), waiting up to `wait`
/// after its answer for its root span. Nothing is simulated: no store, and a payload is
/// delivered when a result its spans recorded held it.
#[allow(clippy::too_many_arguments)]
pub async fn traced(
    receiver: &super::traces::Receiver,
    wait: std::time::Duration,
    case: &AttackCase,
    payload: Option<&str>,
    mitigation: &Mitigation,
    key: &str,
    target: &dyn Provider,
    traceparent: &str,
) -> Outcome {
    let mut out = Outcome::empty(case);
    if !matches!(mitigation, Mitigation::None(_)) {
        out.error = Some(
            "an agent whose tools are real is measured as it is: its mitigations are its own (mitigation none); pieval's act on the outputs of its world (model.world)".into(),
        );
        return out;
    }
    let mut messages = Vec::new();
    if let Some(s) = &out.system {
        messages.push(json!({"role": "system", "content": s}));
    }
    messages.push(json!({"role": "user", "content": case.prompt}));
    receiver.expect(traceparent);
    let reply = target.chat(&format!("{key}#1"), &messages, &[]).await;
    let (spans, ended) = receiver.take(traceparent, wait).await;
    let refs: Vec<&crate::agent::otel::Span> = spans.iter().collect();
    let calls = crate::agent::otel::calls_of(&refs);
    let payload = payload.filter(|p| !p.is_empty());
    let mut turns = Vec::new();
    let mut actions = Vec::new();
    let mut delivered = false;
    for (i, c) in calls.into_iter().enumerate() {
        let n = i as u32 + 1;
        let arguments = match &c.arguments {
            Value::String(s) => s.clone(),
            v => v.to_string(),
        };
        let injected =
            payload.is_some_and(|p| c.output.as_deref().is_some_and(|o| super::run::holds(o, p)));
        delivered |= injected;
        actions.push(json!({"name": c.name, "arguments": arguments}));
        turns.push(TurnRecord {
            turn: n,
            depth: 0,
            node_id: n.to_string(),
            tool_calls: vec![crate::rundir::checkpoint::ToolCallRecord {
                id: if c.id.is_empty() {
                    format!("call_{n}")
                } else {
                    c.id
                },
                name: c.name,
                arguments,
                executed: c.output.is_some(),
                output: c.output.unwrap_or_default(),
                error: c.error,
                action: true,
                injected,
                ..Default::default()
            }],
            ..TurnRecord::default()
        });
    }
    let n = turns.len() as u32 + 1;
    let mut last = TurnRecord {
        turn: n,
        depth: 0,
        node_id: n.to_string(),
        ..TurnRecord::default()
    };
    out.injection_delivered = payload.map(|_| delivered);
    out.stop = Stop::Answer;
    match reply {
        Ok(r) => {
            let c = &r.completion;
            out.latency_ms = c.latency_ms;
            out.attempts = c.attempts;
            out.redacted = c.redacted;
            out.truncated = c.truncated;
            last.latency_ms = Some(c.latency_ms);
            last.target_response = r.content.clone();
            out.response = r.content;
        }
        Err(e) => {
            out.latency_ms = e.latency_ms;
            out.attempts = e.attempts;
            last.latency_ms = Some(e.latency_ms);
            last.error = Some(e.message.clone());
            out.error = Some(e.message);
            out.stop = Stop::Error;
        }
    }
    turns.push(last);
    if out.error.is_none() && !ended {
        out.error = Some(format!(
            "the agent's trace did not end within {} s: its root span (the child of the traceparent pieval sent) never came, {} span(s) did — export with the traceparent's context and flush before answering",
            wait.as_secs_f64(),
            spans.len()
        ));
        out.stop = Stop::Error;
    }
    if let Some(first) = turns.first_mut() {
        first.attack_prompt = case.prompt.clone();
    }
    out.turns = turns;
    out.actions = bounded(
        Value::Array(actions).to_string(),
        "[]",
        "the attempt's actions",
        &mut out,
    );
    // the tools are real: their store is not pieval's to know
    out.final_state = "null".into();
    out
}
