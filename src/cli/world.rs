//! `pieval world stdio --url URL`: an attempt's served world (`model.world`) over MCP's
//! stdio transport, for an agent that spawns its tools (docs/agents.md).

use crate::cli::ExitStatus;
use crate::error::{Error, Result};

#[derive(Debug, clap::Subcommand)]
pub enum Command {
    /// Speak MCP on stdin/stdout for one attempt's world: the agent's MCP client starts
    /// this as its server's command. The world's token is read from the environment
    /// variable PIEVAL_WORLD_TOKEN (never an argument).
    Stdio(StdioArgs),
}

#[derive(Debug, clap::Args)]
pub struct StdioArgs {
    /// The world's mcp_url or http_url (http://127.0.0.1:<port>/w/<id>/mcp).
    #[arg(long)]
    url: String,
}

pub fn run(cmd: Command) -> Result<ExitStatus> {
    match cmd {
        Command::Stdio(args) => {
            let env = crate::agent::stdio::TOKEN_ENV;
            let token = std::env::var(env)
                .ok()
                .filter(|t| !t.is_empty())
                .ok_or_else(|| {
                    Error::State(format!(
                        "world stdio: set {env} to the world's token (world.token)"
                    ))
                })?;
            crate::secrets::register(&token);
            crate::agent::stdio::serve(&args.url, token)?;
            Ok(ExitStatus::Success)
        }
    }
}
