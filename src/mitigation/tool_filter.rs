//! `tool_filter`: an agent is offered only the tools its user's task needs (the
//! environment's `user_tools`), so an injected instruction cannot reach the others
//! (AgentDojo's tool filter, Debenedetti et al. 2024, which asks the model to choose;
//! here the case declares them, so the filter is deterministic). Cases without an
//! environment are sent unchanged.

use super::{Defence, Entry, Mitigation, Request};

#[derive(Clone, Debug, PartialEq)]
pub struct ToolFilter;

pub const ENTRY: Entry = Entry {
    name: "tool_filter",
    params: &[],
    what: "offers an agent only the tools its task needs (the environment's `user_tools`); an agentic case without them is an error of the attempt",
    build: |_| Mitigation::ToolFilter(ToolFilter),
};

impl Defence for ToolFilter {
    fn apply(&self, _: &mut Request<'_>) -> Result<(), String> {
        Ok(())
    }
}
