//! `provider: replay` for agents: the model's recorded turns of an earlier run, looked
//! up by `<attempt>#<turn>`. The environment is simulated again from the case, so the
//! same turns give the same tool results, the same trace and the same verdicts.

use std::collections::HashMap;
use std::path::Path;

use async_trait::async_trait;

use crate::error::Result;
use crate::provider::{AgentTurn, CallError, Completion, Message, Provider, ToolCall};
use crate::rundir::PredictionRecord;
use crate::rundir::checkpoint::scan_checkpoint;

pub struct AgentReplay {
    /// By `<attempt>#<turn>`: the recorded answer, or the error and its latency.
    turns: HashMap<String, Result<AgentTurn, (String, f64)>>,
}

impl AgentReplay {
    /// The agent turns of a run's `predictions.jsonl`.
    pub fn open(source: &Path) -> Result<AgentReplay> {
        if source
            .extension()
            .is_some_and(|e| e.eq_ignore_ascii_case("parquet"))
        {
            return Err(crate::error::Error::config(
                source,
                "replaying agents needs a run's predictions.jsonl (the agent turns are not in a Parquet predictions file)",
            ));
        }
        let mut turns = HashMap::new();
        scan_checkpoint(source, |r: PredictionRecord| {
            if r.agent_stop.is_none() {
                return;
            }
            let id = r.key().to_owned();
            for t in r.turns {
                let answer = match (
                    &t.error,
                    t.target_response.is_some() || !t.tool_calls.is_empty(),
                ) {
                    (Some(e), false) => Err((e.clone(), t.latency_ms.unwrap_or(0.0))),
                    _ => Ok(AgentTurn {
                        content: t.target_response.clone(),
                        tool_calls: t
                            .tool_calls
                            .iter()
                            .map(|c| ToolCall {
                                id: c.id.clone(),
                                name: c.name.clone(),
                                arguments: c.arguments.clone(),
                            })
                            .collect(),
                        completion: Completion {
                            latency_ms: t.latency_ms.unwrap_or(0.0),
                            attempts: 1,
                            ..Completion::default()
                        },
                    }),
                };
                turns.entry(format!("{id}#{}", t.turn)).or_insert(answer);
            }
        })?;
        Ok(AgentReplay { turns })
    }

    pub fn is_empty(&self) -> bool {
        self.turns.is_empty()
    }
}

#[async_trait]
impl Provider for AgentReplay {
    fn name(&self) -> &str {
        "replay"
    }

    async fn complete(&self, key: &str, _: &[Message]) -> Result<Completion, CallError> {
        Err(CallError {
            message: format!("replay: {key:?} is not an agent turn"),
            latency_ms: 0.0,
            attempts: 0,
        })
    }

    async fn chat(
        &self,
        key: &str,
        _: &[serde_json::Value],
        _: &[serde_json::Value],
    ) -> Result<AgentTurn, CallError> {
        match self.turns.get(key) {
            Some(Ok(t)) => Ok(t.clone()),
            Some(Err((e, latency_ms))) => Err(CallError {
                message: e.clone(),
                latency_ms: *latency_ms,
                attempts: 1,
            }),
            None => Err(CallError {
                message: format!("replay: the recorded run has no agent turn {key:?}"),
                latency_ms: 0.0,
                attempts: 0,
            }),
        }
    }
}
