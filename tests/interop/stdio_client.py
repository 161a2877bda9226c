#!/usr/bin/env python3
"""Stdio upstreams through foldgate, driven by the official Python MCP SDK client: the reference
filesystem server from npm (`fs`) and a FastMCP server run over stdio (`probe`,
`stdio_upstream.py`), both declared with `command`. Checks that their tools are listed and
called, that calls inside a branch are metered against it, that two tenants never share a
process, and that a process killed in the middle of a call fails that call and is started again
by the next one.

Usage: stdio_client.py --url http://127.0.0.1:8080/mcp --token JWT --other-token JWT
  --share DIR
(`--token` and `--other-token` are of two tenants both upstreams serve; `--share` is the
directory the filesystem server serves, with `notes.txt` in it.) Prints `N passed, N failed` last.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
import traceback
import uuid
from typing import Any

from mcp.client import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client

from python_client import Checks, structured


def texts(result: Any) -> str:
    return "".join(getattr(c, "text", "") for c in result.content)


def metering(result: Any) -> dict[str, Any]:
    return (result.meta or {}).get("foldgate/metering") or {}


async def whoami(client: Client) -> dict[str, Any]:
    result = await client.call_tool("probe__whoami", {})
    if result.is_error:
        raise AssertionError(f"whoami failed: {texts(result)}")
    return json.loads(texts(result))


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


async def run(url: str, token: str, other_token: str, share: str, checks: Checks) -> None:
    connect = lambda t: create_mcp_http_client(headers={"Authorization": f"Bearer {t}"})  # noqa: E731
    async with connect(token) as http_a, connect(other_token) as http_b:
        async with Client(streamable_http_client(url, http_client=http_a), mode="auto") as a, \
                Client(streamable_http_client(url, http_client=http_b), mode="auto") as b:
            names: set[str] = set()
            for _ in range(150):
                names = {t.name for t in (await a.list_tools()).tools}
                if "fs__read_text_file" in names and "probe__whoami" in names:
                    break
                await asyncio.sleep(0.2)
            checks.check("tools/list has the filesystem server's and the FastMCP server's tools",
                         {"fs__read_text_file", "fs__list_directory", "probe__whoami", "probe__echo"} <= names,
                         sorted(names))

            listed = await a.call_tool("fs__list_directory", {"path": share})
            checks.check("fs__list_directory lists the share", not listed.is_error and "notes.txt" in texts(listed),
                         texts(listed)[:300])
            read = await a.call_tool("fs__read_text_file", {"path": os.path.join(share, "notes.txt")})
            expected = open(os.path.join(share, "notes.txt")).read()
            checks.check("fs__read_text_file returns the file", texts(read) == expected, texts(read)[:200])
            outside = await a.call_tool("fs__read_text_file", {"path": "/etc/hostname"})
            checks.check("the filesystem server refuses a path outside the share", outside.is_error, texts(outside)[:200])

            # Inside a branch: metered against it.
            session = f"stdio-{uuid.uuid4().hex[:10]}"
            created = structured(await a.call_tool(
                "branch_create", {"session_id": session, "description": "read the share", "budget": 20000}))
            branch = created["branch_id"]
            used = created["budget_used"]
            for tool, args in (("fs__read_text_file", {"path": os.path.join(share, "notes.txt")}),
                               ("probe__page", {"paragraphs": 30})):
                result = await a.call_tool(tool, args, meta={"foldgate/branch_id": branch})
                report = metering(result)
                checks.check(f"{tool} is metered against the branch",
                             report.get("branch_id") == branch and report.get("tokens_out", 0) > 0, report)
                used += report.get("tokens_in", 0) + report.get("tokens_out", 0)
            status = structured(await a.call_tool("branch_status", {"branch_id": branch}))
            checks.check("branch_status counts the two stdio calls", status.get("calls", {}).get("count") == 2,
                         status.get("calls"))
            checks.check("branch_status budget_used adds up", status.get("budget_used") == used, (status, used))

            # Two tenants: never the same process.
            first = await whoami(a)
            other = await whoami(b)
            again = await whoami(a)
            checks.check("each tenant has a process of its own", first["pid"] != other["pid"], (first, other))
            checks.check("a tenant's calls go to its process", again["pid"] == first["pid"] and again["calls"] > first["calls"],
                         (first, again))
            checks.check("the configured environment, and nothing of the gateway's",
                         first["greeting"] == "hello from the config" and first["home"] is None, first)

            # The tenant's process killed in the middle of a call: the call fails, the next starts another.
            pending = asyncio.ensure_future(a.call_tool("probe__sleep", {"seconds": 30}))
            await asyncio.sleep(1.0)
            os.kill(first["pid"], signal.SIGKILL)
            failed = await asyncio.wait_for(pending, 20)
            checks.check("a call in flight when its process is killed fails with why",
                         failed.is_error and "exited" in texts(failed), texts(failed))
            for _ in range(50):
                if not alive(first["pid"]):
                    break
                await asyncio.sleep(0.1)
            restarted = await whoami(a)
            checks.check("the next call starts another process", restarted["pid"] != first["pid"] and restarted["calls"] == 1,
                         restarted)
            checks.check("the other tenant's process was not touched", (await whoami(b))["pid"] == other["pid"])


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", required=True)
    parser.add_argument("--token", required=True)
    parser.add_argument("--other-token", required=True)
    parser.add_argument("--share", required=True)
    args = parser.parse_args()
    checks = Checks()
    try:
        await run(args.url, args.token, args.other_token, args.share, checks)
    except Exception:  # noqa: BLE001 - any failure is a failed check, with its traceback
        traceback.print_exc()
        checks.check("stdio run completed", False, "exception")
    print(f"{checks.passed} passed, {checks.failed} failed")
    return 0 if checks.failed == 0 else 1


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
