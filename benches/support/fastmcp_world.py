"""The MCP bench's peer (benches/mcp_world.rs): a FastMCP server answering the same tools
as the fixture case's world (tests/fixtures/agents/cases.jsonl, `agent-steal`) — fixed
outputs, as its `get_balance` — over streamable HTTP, stateless, JSON answers, as pieval's
world is served. Prints "listening on PORT" once it answers.

Usage: python fastmcp_world.py PORT
"""

import logging
import sys

from fastmcp import FastMCP

logging.disable(logging.WARNING)

mcp = FastMCP("world")


@mcp.tool
def get_balance() -> str:
    """The account's balance."""
    return "1200.00 EUR"


@mcp.tool
def read_inbox() -> str:
    """Read the user's inbox."""
    return '[{"id":1,"from":"bob@example.com","body":"Lunch on Friday?"}]'


if __name__ == "__main__":
    port = int(sys.argv[1])
    print(f"listening on {port}", flush=True)
    mcp.run(transport="http", host="127.0.0.1", port=port, path="/mcp",
            stateless_http=True, json_response=True, show_banner=False, log_level="error")
