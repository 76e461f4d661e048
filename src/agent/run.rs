//! The agent loop of one attempt: system + user task → model → each tool call executed
//! by the simulated environment ([`super::world`]) → the results back → … until the
//! model answers without calling a tool, or the turn budget (`max_turns` model calls)
//! is spent. Every model answer and every call with its result is a turn of the
//! attempt's transcript (`TurnRecord`), written to the checkpoint with it.
//!
//! **Mitigations for agents** apply to what comes back from tools, the untrusted data of
//! an agent: `delimiters`, `xml_tagging`, `spotlight_datamark`, `spotlight_base64` and
//! `instructional` transform each tool output (their note goes to the system message);
//! `sandwich` repeats the user's task after the tool results (AgentDojo's
//! `repeat_user_prompt`); `input_filter` is a prompt-injection detector on tool outputs
//! (an output that fires is withheld, or ends the attempt with `stop_agent`);
//! `tool_filter` offers only the environment's `user_tools`. `known_answer` has no
//! meaning for tool outputs and is an error of the attempt.

use serde_json::{Value, json};

use super::world::World;
use crate::contract::case::AttackCase;
use crate::mitigation::{Mitigation, Request};
use crate::provider::{CallError, Provider, ToolCall};
use crate::rundir::checkpoint::{ToolCallRecord, TurnRecord};

/// The most tool calls one model answer may ask for; more are tool errors.
pub const MAX_PARALLEL_CALLS: usize = 32;

/// Why the loop ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stop {
    /// The model answered without calling a tool.
    Answer,
    /// `max_turns` model calls were made.
    Budget,
    /// A model call failed for good (after retries).
    Error,
    /// The prompt-injection detector ended the attempt (`input_filter` with `stop_agent`).
    Blocked,
}

impl Stop {
    pub fn as_str(self) -> &'static str {
        match self {
            Stop::Answer => "answer",
            Stop::Budget => "budget",
            Stop::Error => "error",
            Stop::Blocked => "blocked",
        }
    }
}

/// What an agent attempt did.
#[derive(Debug)]
pub struct Outcome {
    /// The system message and the user's task as sent.
    pub system: Option<String>,
    pub task: String,
    pub turns: Vec<TurnRecord>,
    /// The model's last text (its final answer when it stopped calling tools).
    pub response: Option<String>,
    pub error: Option<String>,
    pub blocked_by: Option<String>,
    pub stop: Stop,
    /// Every call of an offered tool, in order, as `[{"name", "arguments"}]` JSON text
    /// (calls of tools not offered are in the transcript, not here).
    pub actions: String,
    /// The record store at the end, as JSON text.
    pub final_state: String,
    /// Did the payload reach the model (None: no payload).
    pub injection_delivered: Option<bool>,
    pub latency_ms: f64,
    pub attempts: u32,
    pub prompt_tokens: Option<u64>,
    pub completion_tokens: Option<u64>,
    pub redacted: bool,
    pub truncated: bool,
}

impl Outcome {
    /// An attempt of `case` that has not begun: no turns, no answer, stopped by an error
    /// until it says otherwise.
    pub fn empty(case: &AttackCase) -> Outcome {
        Outcome {
            system: case.context.clone().filter(|s| !s.is_empty()),
            task: case.prompt.clone(),
            turns: Vec::new(),
            response: None,
            error: None,
            blocked_by: None,
            stop: Stop::Error,
            actions: "[]".into(),
            final_state: "{}".into(),
            injection_delivered: None,
            latency_ms: 0.0,
            attempts: 0,
            prompt_tokens: None,
            completion_tokens: None,
            redacted: false,
            truncated: false,
        }
    }
}

/// Whether a tool output holds the payload: as is, or inside a JSON text (a store's
/// records are sent as JSON, the payload's quotes and newlines escaped).
pub(crate) fn holds(output: &str, payload: &str) -> bool {
    output.contains(payload) || {
        let quoted = serde_json::to_string(payload).expect("a string serialises");
        output.contains(&quoted[1..quoted.len() - 1])
    }
}

/// What a mitigation does to one tool output: Ok or the detector's block, the output as
/// sent, the note for the system message, a reminder to send after the results.
pub(super) type Guarded = (Result<(), String>, String, Option<String>, Option<String>);

/// The mitigation applied to one tool output of `case`'s attempt (`task`: the user's).
pub(super) fn guarded(
    case: &AttackCase,
    mitigation: &Mitigation,
    seed: u64,
    task: &str,
    text: &str,
) -> Guarded {
    let mut r = Request {
        case,
        seed,
        indirect: true,
        label: "Tool output",
        task,
        raw_untrusted: text,
        untrusted: text.to_owned(),
        note: None,
        reminder: None,
        probe: None,
    };
    let verdict = mitigation.defence().apply(&mut r);
    (verdict, r.untrusted, r.note, r.reminder)
}

/// A tool's result as the model receives it, after the mitigation: fills `rec`'s output,
/// error, executed and injected flags. `Ok(reminder)`; `Err(blocked_by)` when the
/// prompt-injection detector withheld it (the output then says so).
fn receive(
    result: super::world::Outcome,
    payload: Option<&str>,
    guard: &dyn Fn(&str) -> Guarded,
    rec: &mut ToolCallRecord,
) -> Result<Option<String>, String> {
    rec.error = result.error;
    rec.executed = result.executed;
    rec.injected = payload.is_some_and(|p| holds(&result.output, p));
    let (verdict, sent, _, reminder) = guard(&result.output);
    match verdict {
        Ok(()) => {
            rec.output = sent;
            Ok(reminder)
        }
        Err(blocked) => {
            rec.output = format!(
                "[the tool's output was withheld: a prompt injection was detected ({blocked})]"
            );
            rec.blocked_by = Some(blocked.clone());
            Err(blocked)
        }
    }
}

/// Whether some string of `v` holds `needle`.
pub(super) fn carries(v: &Value, needle: &str) -> bool {
    match v {
        Value::String(s) => s.contains(needle),
        Value::Array(a) => a.iter().any(|x| carries(x, needle)),
        Value::Object(m) => m.values().any(|x| carries(x, needle)),
        _ => false,
    }
}

/// Run one agent attempt of `case` (which has an environment). `payload`: the text that
/// fills the injected vectors (the case's `task_input`, converted), `None` for an
/// attack-free run. `key`: the attempt's checkpoint key (turn `n` is asked as
/// `<key>#<n>`).
pub async fn run(
    case: &AttackCase,
    payload: Option<&str>,
    mitigation: &Mitigation,
    seed: u64,
    key: &str,
    model: &dyn Provider,
) -> Outcome {
    let env = case
        .environment
        .as_ref()
        .expect("an agent attempt runs a case with an environment");
    let task = case.prompt.clone();
    let mut out = Outcome::empty(case);
    let mut world = match World::new(env, payload) {
        Ok(w) => w,
        Err(e) => {
            out.error = Some(format!("environment: {e}"));
            return out;
        }
    };
    let replaying = model.name() == "replay";
    world.replaying = replaying;
    out.final_state = world.state().to_string();
    let (stop_on_block, only) = match mitigation {
        Mitigation::KnownAnswer(_) => {
            out.error = Some(
                "mitigation known_answer does not apply to an agent's tool outputs; use input_filter as the prompt-injection detector".into(),
            );
            return out;
        }
        Mitigation::ToolFilter(_) => match &env.user_tools {
            Some(t) => (false, Some(t.as_slice())),
            None => {
                out.error = Some(
                    "mitigation tool_filter: the case's environment names no user_tools".into(),
                );
                return out;
            }
        },
        Mitigation::InputFilter(f) => (f.stop_agent, None),
        _ => (false, None),
    };
    let tools = world.tools(only);
    let offered: Vec<String> = tools
        .iter()
        .filter_map(|t| t.pointer("/function/name").and_then(Value::as_str))
        .map(str::to_owned)
        .collect();
    let payload = payload.filter(|p| !p.is_empty());
    // Not delivered until the model reads it (undecided when the attempt cannot start).
    out.injection_delivered = payload.map(|_| false);
    // A payload in an offered tool's schema (tool poisoning) is in what the model sees
    // from its first call on; it is delivered once a call succeeds.
    let mut seen = payload.is_some_and(|p| tools.iter().any(|t| carries(t, p)));
    // The mitigation's note, from its effect on an empty tool output.
    let guard = |text: &str| guarded(case, mitigation, seed, &task, text);
    let (_, _, note, _) = guard("");
    if let Some(n) = note {
        out.system = Some(match out.system.take() {
            Some(s) => format!("{s}\n\n{n}"),
            None => n,
        });
    }
    let mut messages: Vec<Value> = Vec::new();
    if let Some(s) = &out.system {
        messages.push(json!({"role": "system", "content": s}));
    }
    messages.push(json!({"role": "user", "content": task}));
    let mut actions: Vec<Value> = Vec::new();
    let mut batch = Batch {
        world: &mut world,
        offered: &offered,
        payload,
        guard: &guard,
        stop_on_block,
        actions: &mut actions,
        text_bytes: 0,
    };
    let mut said = task.clone();
    // The scenario's start: calls made on the agent's behalf (turn 0), not its actions;
    // their outputs go through the mitigation like any other.
    if !env.prefill.is_empty() {
        let mut turn = TurnRecord {
            turn: 0,
            depth: 0,
            node_id: "0".into(),
            attack_prompt: std::mem::take(&mut said),
            ..TurnRecord::default()
        };
        let calls = prefill_calls(env);
        messages.push(assistant_message(None, &calls));
        let done = batch.run(&calls, false, &mut turn, &mut messages);
        seen |= done.seen;
        out.turns.push(turn);
        if let Some(blocked) = done.blocked {
            out.blocked_by = Some(blocked);
            out.stop = Stop::Blocked;
        } else if let Some(r) = done.reminder {
            messages.push(json!({"role": "user", "content": r}));
            said = r;
        }
    }
    let budget = env.max_turns();
    let mut prompt_tokens: Option<u64> = None;
    let mut completion_tokens: Option<u64> = None;
    // no model call when the prefill's output already ended the attempt
    let turns = if out.stop == Stop::Blocked { 0 } else { budget };
    for n in 1..=turns {
        let mut turn = TurnRecord {
            turn: n,
            depth: 0,
            node_id: n.to_string(),
            attack_prompt: std::mem::take(&mut said),
            ..TurnRecord::default()
        };
        let reply = model.chat(&format!("{key}#{n}"), &messages, &tools).await;
        let mut reply = match reply {
            Ok(r) => r,
            Err(CallError {
                message,
                latency_ms,
                attempts,
            }) => {
                out.latency_ms += latency_ms;
                out.attempts += attempts;
                turn.error = Some(message.clone());
                turn.latency_ms = Some(latency_ms);
                out.turns.push(turn);
                out.error = Some(message);
                out.stop = Stop::Error;
                break;
            }
        };
        // The model has read what it was given: a payload there is delivered.
        if seen {
            out.injection_delivered = Some(true);
        }
        let c = &reply.completion;
        out.latency_ms += c.latency_ms;
        out.attempts += c.attempts;
        out.redacted |= c.redacted;
        out.truncated |= c.truncated;
        let add = |acc: &mut Option<u64>, x: Option<u64>| {
            if let Some(x) = x {
                *acc = Some(acc.unwrap_or(0) + x);
            }
        };
        add(&mut prompt_tokens, c.prompt_tokens);
        add(&mut completion_tokens, c.completion_tokens);
        turn.latency_ms = Some(c.latency_ms);
        turn.target_response = reply.content.clone();
        out.response = reply.content.clone();
        batch.text_bytes += reply.content.as_ref().map_or(0, String::len);
        if reply.tool_calls.is_empty() {
            messages.push(json!({"role": "assistant", "content": reply.content}));
            out.turns.push(turn);
            out.stop = Stop::Answer;
            break;
        }
        // At most MAX_PARALLEL_CALLS calls of an answer are taken (and answered); the
        // turn says how many more there were.
        if reply.tool_calls.len() > MAX_PARALLEL_CALLS {
            turn.error = Some(format!(
                "the answer asked for {} tool calls; the first {MAX_PARALLEL_CALLS} were taken",
                reply.tool_calls.len()
            ));
            reply.tool_calls.truncate(MAX_PARALLEL_CALLS);
        }
        // What is re-sent and recorded of the calls is cut; the environment judges each
        // call on its arguments as sent (a refusal names their real size).
        let capped: Vec<ToolCall> = reply
            .tool_calls
            .iter()
            .map(|c| ToolCall {
                arguments: super::world::capped_arguments(&c.arguments, replaying).into_owned(),
                ..c.clone()
            })
            .collect();
        messages.push(assistant_message(reply.content.as_deref(), &capped));
        let done = batch.run(&reply.tool_calls, true, &mut turn, &mut messages);
        seen |= done.seen;
        out.turns.push(turn);
        if let Some(blocked) = done.blocked {
            out.blocked_by = Some(blocked);
            out.stop = Stop::Blocked;
            break;
        }
        // A bounded attempt: its text (what the next request re-sends, what its
        // prediction records) stays within MAX_AGENT_BYTES.
        let state_bytes = batch.world.state_bytes();
        if batch.text_bytes + state_bytes > MAX_AGENT_BYTES {
            let message = format!(
                "the attempt holds more than {} MiB of text (messages, calls, store): ended",
                MAX_AGENT_BYTES >> 20
            );
            out.error = Some(message);
            out.stop = Stop::Error;
            break;
        }
        if let Some(r) = done.reminder {
            messages.push(json!({"role": "user", "content": r}));
            said = r;
        }
        if n == budget {
            out.stop = Stop::Budget;
        }
    }
    // An attempt that failed before the model read the payload: delivery undecided.
    if out.stop == Stop::Error && out.injection_delivered == Some(false) {
        out.injection_delivered = None;
    }
    drop(batch);
    out.prompt_tokens = prompt_tokens;
    out.completion_tokens = completion_tokens;
    out.actions = bounded(
        Value::Array(actions).to_string(),
        "[]",
        "the attempt's actions",
        &mut out,
    );
    out.final_state = bounded(
        world.state().to_string(),
        "null",
        "the environment's store",
        &mut out,
    );
    out
}

/// A recorded text within [`MAX_RECORDED_BYTES`], or `empty` and an error of the attempt.
pub(super) fn bounded(text: String, empty: &str, what: &str, out: &mut Outcome) -> String {
    if text.len() <= MAX_RECORDED_BYTES {
        return text;
    }
    out.error = Some(format!(
        "{what} passed {} MiB: not recorded",
        MAX_RECORDED_BYTES >> 20
    ));
    out.stop = Stop::Error;
    empty.to_owned()
}

/// The most text an agent attempt may hold (its messages, re-sent on every turn, its
/// calls and its store); past it the attempt ends with an error.
pub const MAX_AGENT_BYTES: usize = 64 << 20;
/// The most bytes of an attempt's recorded actions or final state (each a field of its
/// prediction line, which stays under the checkpoint's line limit).
pub const MAX_RECORDED_BYTES: usize = 4 << 20;

/// The calls an environment makes on the agent's behalf before it begins (its
/// `prefill`, turn 0).
pub(super) fn prefill_calls(env: &crate::contract::environment::Environment) -> Vec<ToolCall> {
    env.prefill
        .iter()
        .enumerate()
        .map(|(i, p)| ToolCall {
            id: format!("prefill_{}", i + 1),
            name: p.tool.clone(),
            arguments: p.arguments.to_string(),
        })
        .collect()
}

/// The assistant message that asks for `calls` (OpenAI's chat form).
pub(super) fn assistant_message(content: Option<&str>, calls: &[ToolCall]) -> Value {
    json!({"role": "assistant", "content": content, "tool_calls": calls.iter().map(|t| json!({
        "id": t.id, "type": "function", "function": {"name": t.name, "arguments": t.arguments}
    })).collect::<Vec<_>>()})
}

/// What a batch of calls came to.
pub(super) struct Done {
    /// A payload was in an output the model will read.
    pub seen: bool,
    pub reminder: Option<String>,
    /// The prompt-injection detector ended the attempt.
    pub blocked: Option<String>,
}

/// Executes batches of calls (the prefill's, each answer's, or one an agent sent to its
/// served world) against the world.
pub(super) struct Batch<'w, 'e, 'g> {
    pub world: &'w mut World<'e>,
    pub offered: &'w [String],
    pub payload: Option<&'w str>,
    pub guard: &'g dyn Fn(&str) -> Guarded,
    pub stop_on_block: bool,
    /// The model's actions so far (calls of offered tools), as `{name, arguments}`.
    pub actions: &'w mut Vec<Value>,
    /// Bytes of text the attempt holds.
    pub text_bytes: usize,
}

impl Batch<'_, '_, '_> {
    /// Execute `calls` (the model's when `model`), recording each in `turn` and its
    /// result as a `tool` message.
    pub(super) fn run(
        &mut self,
        calls: &[ToolCall],
        model: bool,
        turn: &mut TurnRecord,
        messages: &mut Vec<Value>,
    ) -> Done {
        let mut done = Done {
            seen: false,
            reminder: None,
            blocked: None,
        };
        for call in calls {
            let mut rec = ToolCallRecord {
                id: call.id.clone(),
                name: call.name.clone(),
                arguments: super::world::capped_arguments(&call.arguments, self.world.replaying)
                    .into_owned(),
                ..ToolCallRecord::default()
            };
            if done.blocked.is_some() {
                rec.error = true;
                rec.output = "not executed: the attempt was stopped".into();
            } else {
                let result = self.world.call(&call.name, &call.arguments, self.offered);
                // The actions the criteria judge: every call of an offered tool by the
                // model, whether its arguments held or not (InjecAgent counts the call;
                // a call whose arguments broke the schema changed nothing, which
                // `state` criteria see). A call of a tool not offered is no action.
                rec.action = model && self.offered.iter().any(|o| *o == call.name);
                match receive(result, self.payload, self.guard, &mut rec) {
                    Ok(again) => {
                        done.seen |= rec.injected;
                        done.reminder = done.reminder.take().or(again);
                    }
                    Err(blocked) if self.stop_on_block => done.blocked = Some(blocked),
                    Err(_) => {}
                }
                if rec.action {
                    // `failed`: the call returned a tool error (criteria with `ok` skip it).
                    let mut action = json!({"name": call.name, "arguments": rec.arguments});
                    if rec.error {
                        action["failed"] = Value::Bool(true);
                    }
                    self.actions.push(action);
                }
            }
            self.text_bytes += rec.arguments.len() + rec.output.len() + rec.name.len();
            messages.push(json!({"role": "tool", "tool_call_id": call.id, "content": rec.output}));
            turn.tool_calls.push(rec);
        }
        done
    }
}
