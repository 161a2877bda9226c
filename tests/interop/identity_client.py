#!/usr/bin/env python3
"""Caller identity through foldgate, driven by the official Python MCP SDK: two agents of two
tenants call `whoami__whoami` (identity_upstream.py behind foldgate with `identity = "token"`),
once outside any branch and once inside one, and each is answered as itself, as the upstream
verified foldgate's minted token.

Usage: identity_client.py --url http://127.0.0.1:8080/mcp --token JWT --other-token JWT
(`--token` is alice of tenant team-a with fold:write; `--other-token` bob of team-b.)
Prints `N passed, N failed` last.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import traceback
import uuid
from typing import Any

from mcp.client import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client

from python_client import Checks, structured


def answer(result: Any) -> dict[str, Any]:
    return json.loads("".join(getattr(c, "text", "") for c in result.content))


async def whoami(url: str, token: str, branch: bool) -> tuple[dict[str, Any], str | None]:
    http_client = create_mcp_http_client(headers={"Authorization": f"Bearer {token}"})
    async with http_client, Client(streamable_http_client(url, http_client=http_client), mode="auto") as client:
        for _ in range(100):
            if "whoami__whoami" in {t.name for t in (await client.list_tools()).tools}:
                break
            await asyncio.sleep(0.2)
        branch_id = None
        meta = None
        if branch:
            created = structured(await client.call_tool("branch_create", {
                "session_id": f"who-{uuid.uuid4().hex[:8]}", "description": "ask who", "budget": 2000}))
            branch_id = created["branch_id"]
            meta = {"foldgate/branch_id": branch_id}
        result = await client.call_tool("whoami__whoami", {}, meta=meta)
        if result.is_error:
            raise AssertionError(f"whoami__whoami failed: {result}")
        return answer(result), branch_id


async def run(url: str, token: str, other: str, checks: Checks) -> None:
    seen, _ = await whoami(url, token, branch=False)
    checks.check("the upstream verified alice's minted token and answered as alice of team-a",
                 (seen["tenant"], seen["sub"], seen["branch"]) == ("team-a", "alice", None), seen)
    seen, branch = await whoami(url, token, branch=True)
    checks.check("inside a branch the minted token names it",
                 (seen["sub"], seen["branch"]) == ("alice", branch), (seen, branch))
    seen, _ = await whoami(url, other, branch=False)
    checks.check("another tenant's agent is answered as itself",
                 (seen["tenant"], seen["sub"], seen["scope"]) == ("team-b", "bob", "fold:write"), seen)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--url", required=True)
    parser.add_argument("--token", required=True)
    parser.add_argument("--other-token", required=True)
    args = parser.parse_args()
    checks = Checks()
    try:
        asyncio.run(run(args.url, args.token, args.other_token, checks))
    except Exception:  # noqa: BLE001 - any failure is a failed check, with its traceback
        traceback.print_exc()
        checks.check("the identity run completed", False, "exception")
    print(f"{checks.passed} passed, {checks.failed} failed")
    return 0 if checks.failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
