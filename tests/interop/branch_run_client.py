#!/usr/bin/env python3
"""The seed's scenario P1 through branch_run, driven by the official Python MCP SDK: an agent
asks foldgate to find the flush handler in a repository of ten source files (`repo_upstream.py`,
declared as upstream "repo"); foldgate runs the sub-task on its own model (the scripted model
server, `foldgate-model-server`, answering from `flush_handler_model.json`): the model lists the
files, reads all ten at once and names the file and function. The agent gets the finding alone.

Checked: the run completes; everything the agent's client received over the wire for the fold
(every response body byte from the start of the branch_run call to its end, counted with
tiktoken's o200k_base) is under 500 tokens and carries no line of any file; the books
(model_usage, tokens_used, compression_ratio) are the provider's as scripted; each model request
carried the operator's key and never the agent's token; the model saw the listing and then the
files' text, so the tools ran through the gateway; branch_status shows a gateway-run branch with
its metered upstream calls.

tiktoken fetches its tables from a host this machine cannot reach: `--bpe` names a local copy of
the o200k_base table (the one the gateway's own tokenizer ships), which tiktoken checks against
the published hash before using it.

Usage: branch_run_client.py --url URL --token JWT --script flush_handler_model.json
       --record REQUESTS.jsonl --api-key KEY --bpe o200k_base.tiktoken
Prints `N passed, N failed` last; exits 1 on any failure.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import shutil
import sys
import tempfile
import traceback
import uuid
from typing import Any

import httpx2
import tiktoken
from mcp.client import Client
from mcp.client.streamable_http import streamable_http_client

from python_client import Checks, structured
from repo_upstream import FILES, FLUSH_FILE, FLUSH_FUNCTION

# The fold's whole cost to the agent, in tokens (P1: "the main context increases by <500").
FOLD_LIMIT = 500
O200K_URL = "https://openaipublic.blob.core.windows.net/encodings/o200k_base.tiktoken"


def o200k(bpe: str) -> tiktoken.Encoding:
    """tiktoken's o200k_base, its table read from `bpe` rather than downloaded."""
    with tempfile.TemporaryDirectory(prefix="foldgate-tiktoken-") as cache:
        # tiktoken looks for a download in its cache under the SHA-1 of the URL, and checks the
        # file's SHA-256 against the published one whichever way it came.
        shutil.copyfile(bpe, os.path.join(cache, hashlib.sha1(O200K_URL.encode()).hexdigest()))
        before = os.environ.get("TIKTOKEN_CACHE_DIR")
        os.environ["TIKTOKEN_CACHE_DIR"] = cache
        try:
            return tiktoken.get_encoding("o200k_base")
        finally:
            if before is None:
                del os.environ["TIKTOKEN_CACHE_DIR"]
            else:
                os.environ["TIKTOKEN_CACHE_DIR"] = before


class _Tee(httpx2.AsyncByteStream):
    """A response body that copies every byte it yields into `sink`."""

    def __init__(self, inner: httpx2.AsyncByteStream, sink: bytearray) -> None:
        self._inner = inner
        self._sink = sink

    async def __aiter__(self):  # type: ignore[override]
        async for chunk in self._inner:
            self._sink.extend(chunk)
            yield chunk

    async def aclose(self) -> None:
        await self._inner.aclose()


class WireTap(httpx2.AsyncBaseTransport):
    """The client's transport: real HTTP, with every response body byte kept, as received."""

    def __init__(self) -> None:
        self._inner = httpx2.AsyncHTTPTransport()
        self.received = bytearray()
        self.encodings: set[str] = set()

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        response = await self._inner.handle_async_request(request)
        if "content-encoding" in response.headers:
            self.encodings.add(response.headers["content-encoding"])
        assert isinstance(response.stream, httpx2.AsyncByteStream)
        response.stream = _Tee(response.stream, self.received)
        return response

    async def aclose(self) -> None:
        await self._inner.aclose()


def strings(value: Any) -> list[str]:
    """Every string inside a JSON value."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, list):
        return [s for item in value for s in strings(item)]
    if isinstance(value, dict):
        return [s for item in value.values() for s in strings(item)]
    return []


def tool_names(body: dict[str, Any]) -> set[str]:
    """The tools a model request offers, in either provider's shape."""
    names = set()
    for tool in body.get("tools") or []:
        names.add(tool.get("function", {}).get("name") or tool.get("name"))
    return names


def scripted_replies(path: str) -> list[dict[str, Any]]:
    with open(path, encoding="utf-8") as f:
        script = json.load(f)
    (entry,) = [e for e in script if e.get("marker") == "flush handler"]
    return entry["replies"]


def file_lines_in(text: str) -> list[str]:
    """Lines of the repository's files (the longer, distinctive ones) that occur in `text`, as
    they are or escaped as in a JSON string."""
    found = []
    for path, content in FILES.items():
        for line in {l.strip() for l in content.splitlines() if len(l.strip()) >= 40}:
            if line in text or json.dumps(line)[1:-1] in text:
                found.append(f"{path}: {line}")
    return found


async def run(args: argparse.Namespace, enc: tiktoken.Encoding, checks: Checks) -> None:
    replies = scripted_replies(args.script)
    reads = [c["arguments"]["path"] for c in replies[1]["tool_calls"]]
    checks.check("the script reads each of the ten files once", sorted(reads) == sorted(FILES), reads)

    tap = WireTap()
    http_client = httpx2.AsyncClient(
        headers={"Authorization": f"Bearer {args.token}"},
        timeout=httpx2.Timeout(30.0, read=300.0),
        transport=tap,
    )
    async with http_client:
        async with Client(streamable_http_client(args.url, http_client=http_client), mode="auto",
                          read_timeout_seconds=120) as client:
            names: set[str] = set()
            for _ in range(50):
                names = {t.name for t in (await client.list_tools()).tools}
                if {"repo__list_files", "repo__read_file"} <= names:
                    break
                await asyncio.sleep(0.2)
            checks.check("tools/list has branch_run and the repo upstream's tools",
                         {"branch_run", "repo__list_files", "repo__read_file"} <= names, sorted(names))
            session_setup = len(tap.received)

            # The fold: from here to the answer, every byte the client receives is its cost.
            mark = len(tap.received)
            result = await client.call_tool("branch_run", {
                "session_id": f"p1-{uuid.uuid4().hex[:10]}",
                "description": "Find the flush handler in the repository",
                "prompt": "The repository's files are reachable with the repo tools. Name the file "
                          "and the function that handle the FLUSH command, and say in a sentence "
                          "what it does.",
                "budget": 32768,
                "timeout_seconds": 120,
            })
            fold = bytes(tap.received[mark:])
            fold_text = fold.decode("utf-8", errors="replace")
            fold_tokens = len(enc.encode(fold_text))
            checks.check("the responses are not compressed (the bytes counted are the text)",
                         not tap.encodings, tap.encodings)
            print(f"fold: the client received {len(fold)} bytes, {fold_tokens} tokens (o200k_base), "
                  f"for branch_run; {session_setup} bytes before it for the handshake and tools/list")
            checks.check(f"everything the client received for the fold is under {FOLD_LIMIT} tokens "
                         f"({fold_tokens})", fold_tokens < FOLD_LIMIT, fold_text[:2000])
            leaked = file_lines_in(fold_text)
            checks.check("the fold carries no line of the ten files", not leaked, leaked[:5])

            run = structured(result)
            checks.check("branch_run completed", run.get("status") == "completed" and run.get("cut") is False, run)
            message = run.get("message", "")
            checks.check("the bytes counted hold the answer (the tap saw the fold)",
                         bool(message) and (message in fold_text or json.dumps(message)[1:-1] in fold_text),
                         fold_text[:500])
            checks.check(f"the finding names {FLUSH_FILE} and {FLUSH_FUNCTION}",
                         FLUSH_FILE in message and FLUSH_FUNCTION in message, message)
            last = replies[-1]
            checks.check("the finding is the model's answer", message == last["text"], message)
            usage = {
                "input_tokens": sum(r["input_tokens"] for r in replies),
                "output_tokens": sum(r["output_tokens"] for r in replies),
                "calls": len(replies),
            }
            checks.check(f"model_usage is the sum of the usage the model reported ({usage})",
                         run.get("model_usage") == usage, run.get("model_usage"))
            used = last["input_tokens"] + last["output_tokens"]
            checks.check(f"tokens_used is the last call's input and output ({used})",
                         run.get("tokens_used") == used, run.get("tokens_used"))
            returned = run.get("tokens_returned")
            checks.check("tokens_returned is the finding's o200k_base count",
                         returned == len(enc.encode(message)), (returned, len(enc.encode(message))))
            ratio = run.get("compression_ratio")
            expected = 1 - returned / used if isinstance(returned, int) and used else None
            checks.check(f"compression_ratio is 1 - tokens_returned/tokens_used ({expected})",
                         isinstance(ratio, (int, float)) and expected is not None and abs(ratio - expected) < 0.0005,
                         ratio)
            checks.check("steps: three model calls and eleven tool calls", run.get("steps") == 14, run.get("steps"))

            with open(args.record, encoding="utf-8") as f:
                lines = [line for line in f.read().splitlines() if line.strip()]
            requests = [json.loads(line) for line in lines]
            checks.check("the model got three requests", len(requests) == 3, len(requests))
            signature = args.token.rsplit(".", 1)[-1]
            for i, (line, req) in enumerate(zip(lines, requests), start=1):
                checks.check(f"model request {i} carries the operator's key",
                             req.get("api_key") == args.api_key
                             and (req["headers"].get("authorization") == f"Bearer {args.api_key}"
                                  or req["headers"].get("x-api-key") == args.api_key),
                             {k: v for k, v in req["headers"].items() if k in ("authorization", "x-api-key")})
                checks.check(f"model request {i} holds nothing of the agent's token",
                             args.token not in line and signature not in line, "the agent's token was sent")
            if len(requests) == 3:
                first, second, third = (r["body"] for r in requests)
                checks.check("the model is offered the repo tools",
                             {"repo__list_files", "repo__read_file"} <= tool_names(first), tool_names(first))
                checks.check("the model's first request holds the task",
                             any("Find the flush handler in the repository" in s for s in strings(first["messages"])),
                             first["messages"])
                seen = strings(second["messages"])
                missing = [p for p in FILES if not any(p in s for s in seen)]
                checks.check("the second request holds list_files' answer (every path)", not missing, missing)
                seen = strings(third["messages"])
                missing = [p for p, text in FILES.items() if not any(text in s for s in seen)]
                checks.check("the third request holds the text of all ten files, as the upstream served it",
                             not missing, missing)

            status = structured(await client.call_tool("branch_status", {"branch_id": run.get("branch_id")}))
            calls = status.get("calls", {})
            by_tool = {t["tool"]: t["calls"] for t in calls.get("by_tool", [])}
            checks.check("branch_status: a gateway-run branch, completed",
                         status.get("kind") == "gateway" and status.get("status") == "completed", status)
            checks.check(f"branch_status: the upstream calls were metered to the branch ({calls.get('count')})",
                         calls.get("count", 0) >= 10
                         and by_tool == {"repo__list_files": 1, "repo__read_file": 10}, calls)
            checks.check("branch_status: the run's books match branch_run's",
                         (status.get("run") or {}).get("model_usage") == usage, status.get("run"))


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", required=True)
    parser.add_argument("--token", required=True)
    parser.add_argument("--script", required=True, help="the model server's script")
    parser.add_argument("--record", required=True, help="the model server's record of requests")
    parser.add_argument("--api-key", required=True, help="the operator's key for the model")
    parser.add_argument("--bpe", required=True, help="the o200k_base table (o200k_base.tiktoken)")
    args = parser.parse_args()
    checks = Checks()
    try:
        await run(args, o200k(args.bpe), checks)
    except Exception:  # noqa: BLE001 - any failure is a failed check, with its traceback
        traceback.print_exc()
        checks.check("branch_run scenario completed", False, "exception")
    print(f"{checks.passed} passed, {checks.failed} failed")
    return 0 if checks.failed == 0 else 1


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
