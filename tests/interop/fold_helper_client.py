#!/usr/bin/env python3
"""The history-folding helper (integrations/python/foldgate_fold.py) against a real foldgate and
the FastMCP upstream `docs` (fastmcp_upstream.py), driven by a scripted agent loop: no model, the
script decides every tool call, in the message shape of each supported API.

1. For the OpenAI and the Anthropic shape: a branch is opened, upstream calls are made in it (and
   metered to it, by the `_meta` the helper adds), a second branch is nested, both return; the
   history then holds no trace of the pages read but holds what the branches returned, the
   returned secret is redacted, foldgate's `tokens_used` covers the calls, and the helper's
   report of what it dropped is exact.
2. A branch foldgate force-returns at its budget: later calls are no longer charged to it, and
   the agent's `branch_return` (answered `branch_not_active`) still folds it, with what foldgate
   says of it and not what the agent tried to return (unless asked to keep that).
3. The same end found by `fold_ended()`, without the agent returning.
4. A branch returned while a branch inside it is open: foldgate ends the inner one, the helper
   folds both at once.

Usage: fold_helper_client.py --url http://127.0.0.1:8080/mcp --token JWT
Prints `N passed, N failed` last; exits 1 on any failure.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import traceback
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "integrations" / "python"))

from foldgate_fold import FoldingHistory, FoldReport, TurnOutcome, connect  # noqa: E402
from python_client import Checks, structured  # noqa: E402

# A secret the agent puts in a returned message: foldgate must redact it before it reaches the
# parent context, and nothing of it may stay in the folded history. Built from parts so that the
# source holds no token-shaped string.
LEAKED = "ghp_" + "R7kP2mX9qL4vN8wZ3tY6bH1cJ5dF0gS2aE7u"
PAGE_MARK = "retries failed requests with exponential backoff"


def chars(message: dict[str, Any]) -> int:
    """The documented size of a message: its compact JSON."""
    return len(json.dumps(message, ensure_ascii=False, separators=(",", ":")))


def text_of(result: Any) -> str:
    return "\n".join(getattr(c, "text", "") for c in result.content)


class ScriptedAgent:
    """Plays the model: appends assistant messages with the tool calls it is told to make, in the
    history's shape, and lets the helper run them."""

    def __init__(self, history: FoldingHistory, session: str) -> None:
        self.history = history
        self.session = session
        self.count = 0
        self.last_assistant: dict[str, Any] = {}

    def call(self, name: str, arguments: dict[str, Any]) -> tuple[str, str, dict[str, Any]]:
        self.count += 1
        prefix = "call" if self.history.shape == "openai" else "toolu"
        return (f"{prefix}_{self.count:03d}", name, arguments)

    def assistant(self, calls: list[tuple[str, str, dict[str, Any]]], text: str) -> dict[str, Any]:
        if self.history.shape == "openai":
            return {
                "role": "assistant",
                "content": text,
                "tool_calls": [
                    {"id": cid, "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}
                    for cid, name, args in calls
                ],
            }
        return {
            "role": "assistant",
            "content": [{"type": "text", "text": text}]
            + [{"type": "tool_use", "id": cid, "name": name, "input": args} for cid, name, args in calls],
        }

    def result_messages(self, turn: TurnOutcome) -> list[dict[str, Any]]:
        """The messages a turn's results make, as the shape defines them: what the helper must
        have appended (every result here is made of text items)."""

        def blocks(outcome: Any) -> list[dict[str, Any]]:
            assert outcome.result is not None
            return [{"type": "text", "text": c.text} for c in outcome.result.content]

        if self.history.shape == "openai":
            return [{"role": "tool", "tool_call_id": o.call.id, "content": text_of(o.result)} for o in turn.calls]
        results = []
        for o in turn.calls:
            block: dict[str, Any] = {"type": "tool_result", "tool_use_id": o.call.id, "content": blocks(o)}
            if o.is_error:
                block["is_error"] = True
            results.append(block)
        return [{"role": "user", "content": results}]

    async def turn(self, *calls: tuple[str, dict[str, Any]], text: str = "") -> TurnOutcome:
        made = [self.call(name, args) for name, args in calls]
        self.last_assistant = self.assistant(made, text or f"step {self.count}")
        return await self.history.run_tool_calls(self.last_assistant)

    def appended(self, turn: TurnOutcome) -> list[dict[str, Any]]:
        """What the last turn appended before any fold: its assistant message and its results."""
        return [self.last_assistant, *self.result_messages(turn)]


def prefix_messages(shape: str) -> list[dict[str, Any]]:
    user = {"role": "user", "content": "How does the service retry failed requests? Read the docs."}
    if shape == "openai":
        return [{"role": "system", "content": "You are a careful engineer."}, user]
    return [user]


def dump(messages: list[dict[str, Any]]) -> str:
    return json.dumps(messages, ensure_ascii=False)


def record_of(history: FoldingHistory, report: FoldReport) -> dict[str, Any]:
    """The record a fold left: the JSON in the result of the branch's create call."""
    last = history.messages[-1]
    if history.shape == "openai":
        return json.loads(last["content"])
    return json.loads(last["content"][0]["content"][0]["text"])


def check_fold(
    checks: Checks,
    label: str,
    history: FoldingHistory,
    report: FoldReport,
    before: list[dict[str, Any]],
    start: int,
    added: list[dict[str, Any]],
) -> None:
    """`before` is the history before the turn that folded, `start` the index of the message that
    opened the branch, `added` the messages the folding turn appended: the fold must have removed
    exactly before[start:] + added and left before[:start] + two records."""
    removed = before[start:] + added
    checks.check(
        f"{label}: report counts {len(removed)} messages dropped",
        report.messages_dropped == len(removed),
        (report.messages_dropped, len(removed)),
    )
    want_chars = sum(chars(m) for m in removed)
    checks.check(
        f"{label}: report counts {want_chars} characters dropped",
        report.chars_dropped == want_chars,
        (report.chars_dropped, want_chars),
    )
    kept = history.messages[start:]
    checks.check(
        f"{label}: history keeps what came before the branch, then two records",
        history.messages[:start] == before[:start] and len(kept) == 2 and report.messages_kept == 2,
        [m.get("role") for m in history.messages],
    )
    checks.check(
        f"{label}: report counts the records' characters",
        report.chars_kept == sum(chars(m) for m in kept) and report.chars_saved > 0,
        (report.chars_kept, report.chars_saved),
    )


async def nested_scenario(client: Any, shape: str, checks: Checks) -> None:
    label = f"[{shape}]"
    session = f"fold-{shape}-{uuid.uuid4().hex[:10]}"
    history = FoldingHistory(client, shape=shape, messages=prefix_messages(shape))
    agent = ScriptedAgent(history, session)

    # Open branch A.
    turn = await agent.turn(
        ("branch_create", {"session_id": session, "description": "read the retry docs", "budget": 20000}),
        text="I will read the docs in a branch.",
    )
    created_a = structured(turn.calls[0].result)
    a = created_a["branch_id"]
    checks.check(
        f"{label} branch A is open and current",
        history.current_branch and history.current_branch.branch_id == a,
        history.open_branches,
    )
    a_used = created_a["budget_used"]
    a_call_tokens = 0

    def metered(turn: TurnOutcome, branch: str, what: str) -> int:
        nonlocal a_used, a_call_tokens
        spent = 0
        for outcome in turn.calls:
            if not outcome.call.name.startswith("docs__"):
                continue
            m = outcome.metering or {}
            ok = outcome.charged_to == branch and m.get("branch_id") == branch and not m.get("truncated")
            checks.check(
                f"{label} {what}: {outcome.call.name} metered to {'A' if branch == a else 'B'}",
                ok,
                (outcome.charged_to, m),
            )
            spent += m.get("tokens_in", 0) + m.get("tokens_out", 0)
            if branch == a:
                a_used += m.get("tokens_in", 0) + m.get("tokens_out", 0)
                a_call_tokens += m.get("tokens_in", 0) + m.get("tokens_out", 0)
                checks.check(f"{label} {what}: A's budget_used adds up", m.get("budget_used") == a_used, (m, a_used))
        return spent

    turn = await agent.turn(("docs__search", {"query": "retries", "limit": 3}))
    metered(turn, a, "search")
    turn = await agent.turn(
        ("docs__get_page", {"slug": "service-0", "paragraphs": 15}),
        ("docs__get_page", {"slug": "service-1", "paragraphs": 15}),
    )
    metered(turn, a, "two pages in one turn")
    checks.check(f"{label} the pages are in the history while A is open", PAGE_MARK in dump(history.messages))

    # Open branch B inside A, and call an upstream tool in the same turn: it belongs to B.
    start_b = len(history.messages)
    turn = await agent.turn(
        ("branch_create", {"session_id": session, "description": "the circuit breaker", "budget": 3000}),
        ("docs__get_page", {"slug": "breaker", "paragraphs": 8}),
    )
    created_b = structured(turn.calls[0].result)
    b = created_b["branch_id"]
    checks.check(
        f"{label} branch B is nested in A",
        created_b.get("depth") == 2 and created_b.get("parent_branch_id") == a,
        created_b,
    )
    b_tokens = metered(turn, b, "a call in B's create turn")
    turn = await agent.turn(("docs__search", {"query": "breaker", "limit": 2}))
    b_tokens += metered(turn, b, "search in B")
    checks.check(f"{label} B is current", history.current_branch and history.current_branch.branch_id == b)

    # Return B: the innermost fold.
    message_b = "Breaker: opens after five failures, half-open after 30 s."
    before = list(history.messages)
    turn = await agent.turn(("branch_return", {"branch_id": b, "message": message_b}))
    returned_b = structured(turn.calls[0].result)
    (fold_b,) = turn.folds
    checks.check(
        f"{label} B folded on its return",
        fold_b.branch_id == b and fold_b.status == "completed" and not fold_b.forced,
        fold_b,
    )
    check_fold(checks, f"{label} fold of B", history, fold_b, before, start_b, agent.appended(turn))
    record = record_of(history, fold_b)
    checks.check(
        f"{label} B's record carries its returned message",
        record.get("message") == returned_b["message"] == message_b,
        record,
    )
    checks.check(
        f"{label} B's record has foldgate's tokens_used",
        record.get("tokens_used") == returned_b["tokens_used"] == fold_b.tokens_used,
        (record, returned_b),
    )
    checks.check(
        f"{label} B's page is gone, A's pages stay",
        "## breaker" not in dump(history.messages) and "## service-0" in dump(history.messages),
    )
    checks.check(
        f"{label} B's report: 2 upstream calls, nothing nested",
        fold_b.upstream_calls == 2 and fold_b.nested == (),
        fold_b,
    )
    checks.check(f"{label} A is current again", history.current_branch and history.current_branch.branch_id == a)
    status_b = structured(await client.call_tool("branch_status", {"branch_id": b}))
    checks.check(
        f"{label} B's tokens_used ({returned_b['tokens_used']}) = its prompt + its calls ({b_tokens}) + the message",
        returned_b["tokens_used"]
        == status_b["budget_used"]
        == created_b["budget_used"] + b_tokens + returned_b["tokens_returned"],
        (returned_b, status_b),
    )
    checks.check(f"{label} branch_status counts B's 2 calls", status_b["calls"]["count"] == 2, status_b.get("calls"))
    a_used += returned_b["tokens_used"]  # what an ended child spent is the parent's

    # One more page in A and A's return in the same turn; the message carries a secret.
    message_a = f"Retries: retry.max_attempts, exponential backoff; breaker opens after five failures. (token {LEAKED})"
    before = list(history.messages)
    start_a = len(prefix_messages(shape))
    turn = await agent.turn(
        ("docs__get_page", {"slug": "service-2", "paragraphs": 10}),
        ("branch_return", {"branch_id": a, "message": message_a}),
    )
    metered(turn, a, "a page in A's return turn")
    returned_a = structured(turn.calls[1].result)
    (fold_a,) = turn.folds
    checks.check(f"{label} A folded on its return", fold_a.branch_id == a and fold_a.status == "completed", fold_a)
    checks.check(
        f"{label} A's report: 4 upstream calls, nothing nested",
        fold_a.upstream_calls == 4 and fold_a.nested == (),
        fold_a,
    )
    checks.check(
        f"{label} after both folds no branch is open", history.open_branches == () and history.current_branch is None
    )
    text = dump(history.messages)
    checks.check(
        f"{label} no page text is left in the history",
        PAGE_MARK not in text and "## service-" not in text and "## breaker" not in text,
        text[:600],
    )
    checks.check(f"{label} no upstream call is left in the history", "docs__" not in text, text[:600])
    check_fold(checks, f"{label} fold of A", history, fold_a, before, start_a, agent.appended(turn))
    record = record_of(history, fold_a)
    checks.check(
        f"{label} A's record carries the message as foldgate scrubbed it",
        record.get("message") == returned_a["message"] and returned_a["message"] in text,
        record,
    )
    checks.check(
        f"{label} the secret is redacted and gone from the history",
        LEAKED not in text and returned_a.get("redactions", 0) >= 1,
        returned_a,
    )
    checks.check(f"{label} B's message went into A: it is folded away too", message_b not in text)
    call_record = history.messages[start_a]
    if shape == "openai":
        ok = [c["function"]["name"] for c in call_record["tool_calls"]] == ["branch_create"] and call_record[
            "content"
        ] == "I will read the docs in a branch."
    else:
        ok = [b.get("name") for b in call_record["content"] if b["type"] == "tool_use"] == [
            "branch_create"
        ] and call_record["content"][0]["text"] == "I will read the docs in a branch."
    checks.check(f"{label} the call record is A's create call with the text before it", ok, call_record)

    status_a = structured(await client.call_tool("branch_status", {"branch_id": a}))
    checks.check(
        f"{label} branch_status: A completed, 4 calls of its own",
        status_a["status"] == "completed" and status_a["calls"]["count"] == 4,
        status_a,
    )
    checks.check(
        f"{label} A's tokens_used ({returned_a['tokens_used']}) = its prompt + its calls ({a_call_tokens})"
        f" + B's {returned_b['tokens_used']} + the message",
        returned_a["tokens_used"]
        == status_a["budget_used"]
        == created_a["budget_used"] + a_call_tokens + returned_b["tokens_used"] + returned_a["tokens_returned"],
        (returned_a, status_a["budget_used"], created_a["budget_used"], a_call_tokens),
    )
    ended = structured(await client.call_tool("session_end", {"session_id": session}))
    checks.check(f"{label} session ended", ended.get("session_ended") is True, ended)


async def forced_scenario(client: Any, checks: Checks) -> None:
    label = "[forced]"
    session = f"fold-forced-{uuid.uuid4().hex[:10]}"

    # 2a. Budget exhausted, then the agent returns: branch_not_active, folded all the same.
    history = FoldingHistory(client, shape="openai", messages=prefix_messages("openai"))
    agent = ScriptedAgent(history, session)
    turn = await agent.turn(
        ("branch_create", {"session_id": session, "description": "skim a long page", "budget": 300})
    )
    branch = structured(turn.calls[0].result)["branch_id"]
    turn = await agent.turn(("docs__get_page", {"slug": "long", "paragraphs": 60}))
    cut = turn.calls[0]
    # get_page declares an output schema (FastMCP derives one from `-> str`), so MCP requires a
    # successful result to carry structured content conforming to it, and the SDK refuses one
    # without: a page cut at the budget must still be one the client can read.
    if checks.check(
        f"{label} the cut page reaches the SDK client (output schema honoured)",
        cut.result is not None,
        (cut.error_code, (cut.rpc_error or {}).get("message")),
    ):
        m = cut.metering or {}
        checks.check(
            f"{label} the long page is cut and the branch force-returned",
            m.get("branch_id") == branch and m.get("truncated") and m.get("branch_force_returned"),
            m,
        )
        checks.check(
            f"{label} the cut page says so",
            "force-returned (budget_exhausted)" in text_of(cut.result),
            text_of(cut.result)[-200:],
        )
    else:
        checks.check(
            f"{label} the refused result is an error result for the model",
            cut.error_code == "unreadable_result" and "unreadable_result" in dump(history.messages[-1:]),
            history.messages[-1:],
        )
    status = structured(await client.call_tool("branch_status", {"branch_id": branch}))
    checks.check(
        f"{label} foldgate force-returned the branch (timeout, budget_exhausted)",
        status.get("status") == "timeout" and status.get("reason") == "budget_exhausted",
        status,
    )
    checks.check(
        f"{label} the helper no longer charges calls to it",
        history.current_branch is None and len(history.open_branches) == 1 and history.open_branches[0].ended,
        history.open_branches,
    )
    turn = await agent.turn(("docs__search", {"query": "retries", "limit": 1}))
    m = turn.calls[0].metering or {}
    checks.check(
        f"{label} the next call names no branch and is charged to none",
        turn.calls[0].charged_to is None and m.get("branch_id") is None and not turn.calls[0].is_error,
        (turn.calls[0].charged_to, m),
    )
    unreturned = "Partial: the page starts with retry.max_attempts."
    turn = await agent.turn(("branch_return", {"branch_id": branch, "message": unreturned}))
    checks.check(
        f"{label} branch_return is refused: branch_not_active",
        turn.calls[0].is_error and turn.calls[0].error_code == "branch_not_active",
        turn.calls[0],
    )
    checks.check(
        f"{label} the branch is folded anyway", len(turn.folds) == 1 and history.open_branches == (), turn.folds
    )
    if turn.folds:
        fold = turn.folds[0]
        checks.check(
            f"{label} report: forced, timeout, budget_exhausted, no message, tokens_used 300",
            fold.forced
            and fold.status == "timeout"
            and fold.reason == "budget_exhausted"
            and fold.message is None
            and fold.tokens_used == 300,
            fold,
        )
        checks.check(
            f"{label} report: 8 messages dropped (4 turns of call and result)",
            fold.messages_dropped == 8 and fold.upstream_calls == 1,
            fold,
        )
        text = dump(history.messages)
        record = record_of(history, fold)
        checks.check(
            f"{label} the history holds foldgate's account",
            record.get("status") == "timeout"
            and record.get("reason") == "budget_exhausted"
            and record.get("message") is None,
            record,
        )
        checks.check(
            f"{label} no page, no refusal and no unscrubbed message remain",
            PAGE_MARK not in text
            and "branch_not_active" not in text
            and unreturned not in text
            and len(history.messages) == 4,
            text[:600],
        )

    # 2b. The same with keep_unreturned_message: the agent's text is kept, marked.
    history = FoldingHistory(
        client, shape="anthropic", messages=prefix_messages("anthropic"), keep_unreturned_message=True
    )
    agent = ScriptedAgent(history, session)
    turn = await agent.turn(
        ("branch_create", {"session_id": session, "description": "skim another page", "budget": 300})
    )
    branch = structured(turn.calls[0].result)["branch_id"]
    await agent.turn(("docs__get_page", {"slug": "long-2", "paragraphs": 60}))
    turn = await agent.turn(("branch_return", {"branch_id": branch, "message": unreturned}))
    record = record_of(history, turn.folds[0]) if turn.folds else {}
    checks.check(
        f"{label} keep_unreturned_message keeps the agent's text, marked",
        record.get("unreturned_message") == unreturned and "never scrubbed" in record.get("note", ""),
        record,
    )
    last = history.messages[-1]["content"][0]
    checks.check(
        f"{label} anthropic: the record of a forced end is an error result",
        last.get("is_error") is True and last.get("tool_use_id") == history.messages[-2]["content"][-1]["id"],
        last,
    )

    # 3. Exhausted, and folded by fold_ended() without the agent returning.
    session = f"fold-ended-{uuid.uuid4().hex[:10]}"
    history = FoldingHistory(client, shape="openai", messages=prefix_messages("openai"))
    agent = ScriptedAgent(history, session)
    turn = await agent.turn(
        ("branch_create", {"session_id": session, "description": "a third long page", "budget": 300})
    )
    branch = structured(turn.calls[0].result)["branch_id"]
    await agent.turn(("docs__get_page", {"slug": "long-3", "paragraphs": 60}))
    folds = await history.fold_ended()
    checks.check(
        "[fold_ended] the exhausted branch is folded on foldgate's word",
        len(folds) == 1
        and folds[0].branch_id == branch
        and folds[0].forced
        and folds[0].reason == "budget_exhausted"
        and folds[0].messages_dropped == 4,
        folds,
    )
    checks.check(
        "[fold_ended] nothing of the page remains",
        PAGE_MARK not in dump(history.messages) and len(history.messages) == 4,
    )
    checks.check("[fold_ended] a second call finds nothing to fold", await history.fold_ended() == [])

    # 4. Returning an outer branch while an inner one is open folds both.
    outer_turn = await agent.turn(("branch_create", {"session_id": session, "description": "outer", "budget": 6000}))
    outer = structured(outer_turn.calls[0].result)["branch_id"]
    inner_turn = await agent.turn(("branch_create", {"session_id": session, "description": "inner", "budget": 2000}))
    inner = structured(inner_turn.calls[0].result)["branch_id"]
    turn = await agent.turn(("docs__get_page", {"slug": "inner", "paragraphs": 5}))
    checks.check(
        "[parent returning] the inner branch's call is metered to it",
        turn.calls[0].charged_to == inner == (turn.calls[0].metering or {}).get("branch_id"),
        turn.calls[0].metering,
    )
    turn = await agent.turn(("branch_return", {"branch_id": outer, "message": "Outer done."}))
    returned = structured(turn.calls[0].result)
    checks.check(
        "[parent returning] foldgate ended the inner branch",
        returned.get("children_force_returned") == [inner],
        returned,
    )
    checks.check(
        "[parent returning] one fold, of the outer branch, with the inner one nested",
        len(turn.folds) == 1
        and turn.folds[0].branch_id == outer
        and turn.folds[0].nested == (inner,)
        and turn.folds[0].messages_dropped == 8,
        turn.folds,
    )
    checks.check(
        "[parent returning] history: prompt, two records of two branches",
        len(history.messages) == 6 and history.open_branches == () and "## inner" not in dump(history.messages),
    )
    await client.call_tool("session_end", {"session_id": session})


async def run(url: str, token: str, checks: Checks) -> None:
    async with connect(url, token, mode="auto") as client:
        for _ in range(50):
            names = {t.name for t in (await client.list_tools()).tools}
            if "docs__get_page" in names:
                break
            await asyncio.sleep(0.2)
        history = FoldingHistory(client, shape="anthropic")
        specs = await history.tool_specs()
        checks.check(
            "tool_specs lists foldgate's and the upstream's tools in the shape's form",
            {"branch_create", "docs__get_page"} <= {s["name"] for s in specs}
            and all("input_schema" in s for s in specs),
            [s.get("name") for s in specs],
        )
        for shape in ("openai", "anthropic"):
            await nested_scenario(client, shape, checks)
        await forced_scenario(client, checks)


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", required=True)
    parser.add_argument("--token", required=True)
    args = parser.parse_args()
    checks = Checks()
    try:
        await run(args.url, args.token, checks)
    except Exception:  # noqa: BLE001 - any failure is a failed check, with its traceback
        traceback.print_exc()
        checks.check("fold helper run completed", False, "exception")
    print(f"{checks.passed} passed, {checks.failed} failed")
    return 0 if checks.failed == 0 else 1


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
