#!/usr/bin/env python3
"""An upstream MCP server built with the official Python SDK's MCPServer (FastMCP), for
foldgate's federation checks. Stateful Streamable HTTP with SSE responses, so that the
gateway's upstream client is exercised with sessions and event streams.

Usage: fastmcp_upstream.py --port 9100
"""

from __future__ import annotations

import argparse

import anyio
from mcp.server.mcpserver import Context, MCPServer

server = MCPServer("docs")


def page(slug: str, paragraphs: int) -> str:
    return "\n\n".join(
        f"## {slug} §{i}\nThe {slug} service retries failed requests with exponential backoff; "
        f"see the setting retry.max_attempts (section {i}) and the circuit breaker thresholds."
        for i in range(paragraphs)
    )


@server.tool()
def get_page(slug: str, paragraphs: int = 20) -> str:
    """Fetch a documentation page by its slug."""
    return page(slug, paragraphs)


@server.tool()
def search(query: str, limit: int = 5) -> list[str]:
    """Search the documentation; returns matching slugs."""
    return [f"{query}-{i}" for i in range(limit)]


@server.tool()
async def slow_report(steps: int, ctx: Context) -> str:
    """Work through some steps slowly, reporting progress and logging each."""
    for i in range(1, steps + 1):
        await anyio.sleep(0.2)
        await ctx.report_progress(i, steps, f"step {i} of {steps}")
        await ctx.info(f"finished step {i}")
        await ctx.debug(f"details of step {i}")
    return f"{steps} steps done"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    server.run("streamable-http", host="127.0.0.1", port=args.port)


if __name__ == "__main__":
    main()
