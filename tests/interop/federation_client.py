#!/usr/bin/env python3
"""Federation through foldgate, driven by the official Python MCP SDK: a FastMCP upstream
(`fastmcp_upstream.py`, declared as upstream "docs") is reached as `docs__<tool>`, its calls
inside a branch are metered against the branch, and a fold over five pages returns a short
summary with the compression foldgate reports. A slow upstream tool's progress and log messages
reach the client's callbacks through foldgate. With `--admin-token`, the same server is also
registered through the admin API as "docs-team" while the gateway runs: the SDK client sees its
tools appear, calls one inside a branch whose budget cuts the result, and once the registration is
removed sees them go and a call of one refused.

Usage: federation_client.py --url http://127.0.0.1:8080/mcp --token JWT --direct URL
  [--admin-token JWT]
(`--direct` is the upstream's own URL, to compare results.) Prints `N passed, N failed` last.
"""

from __future__ import annotations

import argparse
import asyncio
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
    meta = result.meta or {}
    return meta.get("foldgate/metering") or {}


async def run(url: str, token: str, direct_url: str, checks: Checks) -> None:
    async with create_mcp_http_client() as direct_http:
        async with Client(streamable_http_client(direct_url, http_client=direct_http), mode="legacy") as direct:
            expected_page = texts(await direct.call_tool("get_page", {"slug": "retries", "paragraphs": 20}))

    logged: list[tuple[str, Any]] = []

    async def on_log(params: Any) -> None:
        logged.append((params.level, params.data))

    http_client = create_mcp_http_client(headers={"Authorization": f"Bearer {token}"})
    async with http_client:
        async with Client(streamable_http_client(url, http_client=http_client), mode="auto",
                          logging_callback=on_log) as client:
            names: set[str] = set()
            for _ in range(50):
                names = {t.name for t in (await client.list_tools()).tools}
                if "docs__get_page" in names:
                    break
                await asyncio.sleep(0.2)
            checks.check("tools/list has docs__get_page and docs__search", {"docs__get_page", "docs__search"} <= names, sorted(names))
            tool = next(t for t in (await client.list_tools()).tools if t.name == "docs__get_page")
            checks.check("the upstream's input schema is kept", tool.input_schema.get("required") == ["slug"], tool.input_schema)

            outside = await client.call_tool("docs__get_page", {"slug": "retries", "paragraphs": 20})
            checks.check("a proxied result equals the upstream's own", texts(outside) == expected_page, texts(outside)[:200])
            checks.check("a call outside branches is not charged to one", metering(outside).get("branch_id") is None, metering(outside))

            session = f"fed-{uuid.uuid4().hex[:10]}"
            created = structured(await client.call_tool(
                "branch_create", {"session_id": session, "description": "read the retry docs", "budget": 20000}))
            branch = created["branch_id"]
            used = created["budget_used"]
            passed = 0
            for i in range(5):
                result = await client.call_tool(
                    "docs__get_page", {"slug": f"service-{i}", "paragraphs": 20},
                    meta={"foldgate/branch_id": branch})
                report = metering(result)
                checks.check(f"page {i} is metered against the branch", report.get("branch_id") == branch, report)
                used += report.get("tokens_in", 0) + report.get("tokens_out", 0)
                passed += report.get("tokens_out", 0)
                checks.check(f"page {i}: budget_used adds up", report.get("budget_used") == used, (report, used))
            status = structured(await client.call_tool("branch_status", {"branch_id": branch}))
            checks.check("branch_status counts five calls", status.get("calls", {}).get("count") == 5, status.get("calls"))
            checks.check("branch_status budget_used is what passed through", status.get("budget_used") == used, status)

            returned = structured(await client.call_tool(
                "branch_return", {"branch_id": branch, "message": "Retries: retry.max_attempts with exponential backoff."}))
            ratio = returned.get("compression_ratio", 0)
            checks.check(f"compression ratio {ratio} is above 0.9 ({passed} tokens read)", ratio > 0.9, returned)

            progress: list[tuple[float, float | None, str | None]] = []

            async def on_progress(done: float, total: float | None, message: str | None) -> None:
                progress.append((done, total, message))

            slow = await client.call_tool(
                "docs__slow_report", {"steps": 3}, progress_callback=on_progress,
                meta={"io.modelcontextprotocol/logLevel": "info"})
            checks.check("a slow upstream tool answers through foldgate", texts(slow) == "3 steps done", texts(slow))
            checks.check("its progress reaches the client's callback, step by step",
                         progress == [(i, 3, f"step {i} of 3") for i in (1, 2, 3)], progress)
            checks.check("its log messages at the level asked (info) reach the client, not its debug ones",
                         logged == [("info", f"finished step {i}") for i in (1, 2, 3)], logged)
            logged.clear()
            progress.clear()
            quiet = await client.call_tool("docs__slow_report", {"steps": 2})
            checks.check("without a progress token or a log level, nothing is relayed",
                         texts(quiet) == "2 steps done" and not logged and not progress, (logged, progress))

            try:
                bad = await client.call_tool("docs__get_page", {"paragraphs": "many"})
                checks.check("arguments the schema refuses are refused", False, bad)
            except Exception as e:  # noqa: BLE001 - the SDK raises on a JSON-RPC error
                checks.check("arguments the schema refuses are refused (HTTP 400, -32602)", "slug" in str(e), e)


async def tool_names(client: Client) -> set[str]:
    return {t.name for t in (await client.list_tools()).tools}


async def until(client: Client, present: bool, name: str) -> set[str]:
    """tools/list until `name` is (or is no longer) in it, for up to 15 s."""
    names: set[str] = set()
    for _ in range(75):
        names = await tool_names(client)
        if (name in names) == present:
            break
        await asyncio.sleep(0.2)
    return names


async def registered(url: str, token: str, admin_token: str, direct_url: str, checks: Checks) -> None:
    admin = url.removesuffix("/mcp") + "/admin/v1"
    headers = {"Authorization": f"Bearer {admin_token}"}
    declared = {"name": "docs-team", "url": direct_url, "tenants": ["federation"], "refresh_seconds": 1}
    async with create_mcp_http_client(headers=headers) as http:
        added = await http.post(f"{admin}/upstreams", json=declared)
        checks.check("the admin API registers the upstream (201, source api)",
                     added.status_code == 201 and added.json().get("source") == "api", added.text)
        agent_http = create_mcp_http_client(headers={"Authorization": f"Bearer {token}"})
        async with agent_http:
            async with Client(streamable_http_client(url, http_client=agent_http), mode="auto") as client:
                names = await until(client, True, "docs-team__get_page")
                checks.check("its tools appear in tools/list without a restart",
                             {"docs-team__get_page", "docs-team__search"} <= names, sorted(names))
                session = f"fed-reg-{uuid.uuid4().hex[:10]}"
                created = structured(await client.call_tool(
                    "branch_create", {"session_id": session, "description": "skim one page", "budget": 400}))
                result = await client.call_tool(
                    "docs-team__get_page", {"slug": "retries", "paragraphs": 40},
                    meta={"foldgate/branch_id": created["branch_id"]})
                report = metering(result)
                checks.check("a registered upstream's call is metered against the branch and cut at its budget",
                             report.get("branch_id") == created["branch_id"] and report.get("truncated") is True
                             and "truncated at the branch's token budget" in texts(result), report)
                await client.call_tool("session_end", {"session_id": session})

                removed = await http.delete(f"{admin}/upstreams/docs-team")
                checks.check("the admin API removes it (204)", removed.status_code == 204, removed.text)
                names = await until(client, False, "docs-team__get_page")
                checks.check("its tools leave tools/list, the configured upstream's stay",
                             "docs-team__get_page" not in names and "docs__get_page" in names, sorted(names))
                try:
                    gone = await client.call_tool("docs-team__get_page", {"slug": "retries"})
                    checks.check("a removed upstream's tool is refused", gone.is_error is True, gone)
                except Exception as e:  # noqa: BLE001 - the SDK raises on a JSON-RPC error
                    checks.check("a removed upstream's tool is refused (JSON-RPC error)", "docs-team" in str(e), e)
        audit = (await http.get(f"{admin}/audit")).json()
        actions = [entry["action"] for entry in audit.get("entries", [])][:2]
        checks.check("both changes are in the audit log", actions == ["upstream.remove", "upstream.register"], actions)


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", required=True)
    parser.add_argument("--token", required=True)
    parser.add_argument("--direct", required=True)
    parser.add_argument("--admin-token")
    args = parser.parse_args()
    checks = Checks()
    try:
        await run(args.url, args.token, args.direct, checks)
        if args.admin_token:
            await registered(args.url, args.token, args.admin_token, args.direct, checks)
    except Exception:  # noqa: BLE001 - any failure is a failed check, with its traceback
        traceback.print_exc()
        checks.check("federation run completed", False, "exception")
    print(f"{checks.passed} passed, {checks.failed} failed")
    return 0 if checks.failed == 0 else 1


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
