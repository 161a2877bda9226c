#!/usr/bin/env python3
"""A stdio MCP server built with the official Python SDK's MCPServer (FastMCP), for foldgate's
stdio-upstream checks: foldgate runs it as child processes and speaks MCP on its stdin and
stdout.

Its tools: `whoami` (this process's id, how many calls it has served, and the value of the
environment variable `PROBE_GREETING`), `echo`, `page` (a long text) and `sleep`.

Usage: stdio_upstream.py (no arguments; foldgate starts it)
"""

from __future__ import annotations

import json
import os
import sys
import time

from mcp.server.mcpserver import MCPServer

server = MCPServer("probe")
CALLS = {"n": 0}


@server.tool()
def whoami() -> str:
    """This process's id, its calls so far, and its greeting."""
    CALLS["n"] += 1
    return json.dumps({
        "pid": os.getpid(),
        "calls": CALLS["n"],
        "greeting": os.environ.get("PROBE_GREETING"),
        "home": os.environ.get("HOME"),
    })


@server.tool()
def echo(text: str) -> str:
    """Echo the text."""
    CALLS["n"] += 1
    return text


@server.tool()
def page(paragraphs: int = 20) -> str:
    """A long page of text."""
    CALLS["n"] += 1
    return "\n\n".join(f"Paragraph {i}: the stdio upstream answers through foldgate." for i in range(paragraphs))


@server.tool()
def sleep(seconds: float) -> str:
    """Answer after a while."""
    CALLS["n"] += 1
    time.sleep(seconds)
    return "slept"


def main() -> None:
    print(f"probe stdio server {os.getpid()} starting", file=sys.stderr, flush=True)
    server.run("stdio")


if __name__ == "__main__":
    main()
