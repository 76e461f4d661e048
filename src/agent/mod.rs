//! Agents under injection: a case with an `environment` runs as a tool-calling agent
//! loop against a simulated environment, and its criteria judge what the agent did
//! (docs/agents.md).
//!
//! - [`world`]: the environment made live; one tool call executed as its data says;
//! - [`schema`]: a call's arguments checked against the tool's JSON Schema;
//! - [`run`]: the loop (model → tool calls → results → model …), mitigations for tool
//!   results, and the trace it records;
//! - [`serve`]: the same world served to an agent pieval does not drive (MCP, HTTP).

pub mod drive;
pub mod otel;
pub mod replay;
pub mod run;
pub mod schema;
pub mod serve;
pub mod stdio;
pub mod traces;
pub mod world;
