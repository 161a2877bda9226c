"""Fold foldgate's agent-run branches out of an agent's own message history.

foldgate keeps the books of a branch (``branch_create`` ... ``branch_return``): its budget, its
deadline, and the upstream calls charged to it. It cannot take anything out of its client's
transcript: the agent loop has to drop the branch's turns itself. :class:`FoldingHistory` does
that for a custom agent loop built on the official Python MCP SDK (PyPI ``mcp`` 2.x):

* it holds the conversation as plain dicts, in the shape of one chat API, chosen once:
  ``"openai"`` (Chat Completions: assistant ``tool_calls``, then one ``role: "tool"`` message per
  call) or ``"anthropic"`` (Messages: ``tool_use`` blocks in the assistant message, then one
  ``role: "user"`` message holding every ``tool_result`` block of the turn);
* :meth:`FoldingHistory.run_tool_calls` executes the tool calls of the last assistant message
  through foldgate, in order, and appends their results in that shape. Upstream tools
  (``<upstream>__<tool>``) called while a branch is open carry ``_meta["foldgate/branch_id"]``, so
  foldgate meters them to that branch;
* when a ``branch_return`` completes, every message from the assistant message that called
  ``branch_create`` for that branch to the end of the turn is removed, and two messages take their
  place: that assistant message with only its ``branch_create`` call, and the result of that call,
  which now carries what the branch returned (the message as foldgate scrubbed it, the status and
  the tokens it used). Nested branches fold innermost first; a branch that returns while branches
  inside it are still open takes them with it (foldgate ends them too).

A branch that foldgate ended on its own (budget used up, deadline passed, parent or session ended)
is folded the same way once the agent calls ``branch_return`` for it and gets ``branch_not_active``
back, after ``branch_status`` confirms the end; or, without waiting for the agent, by
:meth:`FoldingHistory.fold_ended`. Such a branch returned nothing through foldgate, so its record
carries its status and reason and no message; the text the agent tried to return was never
scrubbed by foldgate and is left out unless ``keep_unreturned_message=True``.

Every fold is reported (:class:`FoldReport`): how many messages were removed and how many
characters they held, as counted by :func:`message_chars`.

Only ``mcp`` is needed. Example, with the OpenAI Python SDK as the model client::

    async with connect("https://foldgate.example/mcp", token) as client:
        history = FoldingHistory(client, shape="openai", session_id="conv-42")
        history.append({"role": "user", "content": "How are retries configured?"})
        tools = await history.tool_specs()
        while True:
            reply = openai.chat.completions.create(model=..., messages=history.messages, tools=tools)
            history.append(reply.choices[0].message)
            turn = await history.run_tool_calls()
            for fold in turn.folds:
                log.info("folded %s: %d messages, %d chars", fold.branch_id,
                         fold.messages_dropped, fold.chars_dropped)
            if not turn.calls:
                break
"""

from __future__ import annotations

import copy
import json
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, Literal, cast

import mcp.types as types
from mcp import Client, MCPError
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client

__all__ = [
    "BRANCH_META_KEY",
    "FOLDGATE_TOOLS",
    "METERING_META_KEY",
    "CallOutcome",
    "FoldReport",
    "FoldingHistory",
    "OpenBranch",
    "Shape",
    "ToolCall",
    "TurnOutcome",
    "connect",
    "message_chars",
    "tool_calls_of",
]

Shape = Literal["openai", "anthropic"]
"""The message shape of a history: OpenAI Chat Completions or Anthropic Messages."""

Message = dict[str, Any]

BRANCH_META_KEY = "foldgate/branch_id"
"""The ``_meta`` key of a ``tools/call`` that names the branch the call is charged to."""

METERING_META_KEY = "foldgate/metering"
"""The ``_meta`` key of an upstream tool's result that reports what foldgate charged."""

FOLDGATE_TOOLS = frozenset(
    {
        "branch_create",
        "branch_return",
        "branch_status",
        "session_end",
        "branch_run",
        "memory_search",
        "memory_record",
        "memory_feedback",
    }
)
"""foldgate's own tools. Every other tool is an upstream's and is charged to the open branch."""

_ENDED_STATUSES = frozenset({"completed", "failed", "timeout"})


def message_chars(message: Mapping[str, Any]) -> int:
    """The size of a message in characters: the length of its compact JSON form
    (``json.dumps(message, ensure_ascii=False, separators=(",", ":"))``), which is close to
    what it adds to a request to the model."""
    return len(json.dumps(message, ensure_ascii=False, separators=(",", ":"), default=str))


@dataclass(frozen=True)
class ToolCall:
    """One tool call of an assistant message, whatever its shape."""

    id: str
    name: str
    arguments: dict[str, Any]
    """The parsed arguments (an OpenAI call's JSON string, decoded)."""
    invalid_arguments: str | None = None
    """Why the arguments could not be read (then they are not sent), or ``None``."""


def tool_calls_of(message: Mapping[str, Any], shape: Shape) -> list[ToolCall]:
    """The tool calls of an assistant message in the given shape, in order."""
    if message.get("role") != "assistant":
        return []
    calls: list[ToolCall] = []
    if shape == "openai":
        for call in message.get("tool_calls") or []:
            function = call.get("function") or {}
            raw = function.get("arguments")
            arguments: Any = {}
            problem = None
            if isinstance(raw, str) and raw.strip():
                try:
                    arguments = json.loads(raw)
                except json.JSONDecodeError as e:
                    problem = f"the arguments are not valid JSON: {e}"
            elif isinstance(raw, Mapping):
                arguments = dict(raw)
            if problem is None and not isinstance(arguments, dict):
                problem = "the arguments are not a JSON object"
            calls.append(
                ToolCall(str(call.get("id")), str(function.get("name")), arguments if problem is None else {}, problem)
            )
    else:
        content = message.get("content")
        for block in content if isinstance(content, list) else []:
            if isinstance(block, Mapping) and block.get("type") == "tool_use":
                arguments = block.get("input")
                problem = None if isinstance(arguments, Mapping) else "the input is not an object"
                calls.append(
                    ToolCall(
                        str(block.get("id")),
                        str(block.get("name")),
                        dict(arguments) if isinstance(arguments, Mapping) else {},
                        problem,
                    )
                )
    return calls


@dataclass
class OpenBranch:
    """A branch the agent opened in this history and has not folded yet."""

    branch_id: str
    session_id: str
    call_id: str
    """The id of the ``branch_create`` tool call that opened it."""
    description: str
    depth: int
    parent_branch_id: str | None
    ended: bool = False
    """Whether foldgate is known to have ended it (by a return, or on its own); upstream calls
    are then no longer charged to it."""
    end_reason: str | None = None
    """Why, when foldgate reported it (``budget_exhausted`` from a metering report)."""
    upstream_calls: int = 0
    """Upstream calls the helper charged to this branch."""
    tokens_in: int = 0
    tokens_out: int = 0


@dataclass(frozen=True)
class CallOutcome:
    """What one tool call of a turn did."""

    call: ToolCall
    result: types.CallToolResult | None
    """foldgate's result, or ``None`` when the call was not made or was answered by a JSON-RPC error."""
    is_error: bool
    error_code: str | None
    """foldgate's refusal code (``branch_not_active``, ``budget_exhausted``, ...), the JSON-RPC
    error code as text, ``invalid_arguments`` (not sent), or ``unreadable_result`` (the SDK
    refused the result, see :meth:`FoldingHistory.run_tool_calls`); ``None`` on success."""
    charged_to: str | None
    """The branch named in the call's ``_meta`` (upstream tools only)."""
    metering: dict[str, Any] | None
    """``_meta["foldgate/metering"]`` of an upstream tool's result."""
    rpc_error: dict[str, Any] | None = None
    """The JSON-RPC error (``code``, ``message``, ``data``) that answered the call, if one did."""


@dataclass(frozen=True)
class FoldReport:
    """One fold: what it removed from the history and what it left in its place."""

    branch_id: str
    session_id: str
    status: str
    """How the branch ended: ``completed``, ``failed`` or ``timeout``."""
    reason: str | None
    """Why foldgate ended it, when it did (``budget_exhausted``, ``deadline_exceeded``,
    ``parent_returning``, ``session_ended``; ``reported_failure`` for ``outcome: "failure"``)."""
    message: str | None
    """The message the branch returned, as foldgate scrubbed it; ``None`` when foldgate ended
    the branch before it returned."""
    tokens_used: int | None
    """Everything foldgate charged to the branch, by its own count."""
    forced: bool
    """Whether foldgate ended the branch itself rather than through the agent's ``branch_return``."""
    messages_dropped: int
    """Messages removed from the history."""
    chars_dropped: int
    """Their size, by :func:`message_chars`."""
    messages_kept: int
    """Messages put in their place (2: the branch call and its result)."""
    chars_kept: int
    nested: tuple[str, ...]
    """Branches still open inside this one, folded away with it."""
    upstream_calls: int
    """Upstream calls the helper charged to the branch."""

    @property
    def chars_saved(self) -> int:
        return self.chars_dropped - self.chars_kept


@dataclass(frozen=True)
class TurnOutcome:
    """What :meth:`FoldingHistory.run_tool_calls` did."""

    calls: list[CallOutcome] = field(default_factory=list)
    folds: list[FoldReport] = field(default_factory=list)


@dataclass
class _PendingFold:
    branch: OpenBranch
    status: str
    reason: str | None
    message: str | None
    tokens_used: int | None
    forced: bool
    unreturned_message: str | None = None


@asynccontextmanager
async def connect(
    url: str,
    token: str,
    *,
    mode: str = "auto",
    headers: Mapping[str, str] | None = None,
    read_timeout_seconds: float | None = None,
) -> AsyncIterator[Client]:
    """An MCP client connected to foldgate at ``url`` with a bearer token.

    ``mode`` is the SDK's: ``"auto"`` (``server/discover``, falling back to ``initialize``),
    ``"legacy"`` or a protocol version."""
    all_headers = {"Authorization": f"Bearer {token}", **(headers or {})}
    async with create_mcp_http_client(headers=all_headers) as http_client:
        transport = streamable_http_client(url, http_client=http_client)
        async with Client(transport, mode=mode, read_timeout_seconds=read_timeout_seconds) as client:
            yield client


class FoldingHistory:
    """An agent's message history that folds foldgate branches out of itself.

    ``messages`` is the history, a list of plain dicts in ``shape``; pass it to the model as it
    is. Append the model's replies with :meth:`append`, then run their tool calls with
    :meth:`run_tool_calls`. Append other messages (user turns) with :meth:`append` too, or edit
    ``messages`` directly: the helper finds a branch's start by the id of its ``branch_create``
    call, not by position. Folding replaces messages in place: ``messages`` stays the same list.

    ``session_id``, when given, is filled into ``branch_create``, ``branch_status`` and
    ``session_end`` calls that lack one. ``keep_unreturned_message`` keeps, in the record of a
    branch foldgate ended on its own, the message the agent then tried to return (marked as never
    scrubbed by foldgate). ``on_fold`` is called with each :class:`FoldReport`.
    """

    def __init__(
        self,
        client: Client,
        *,
        shape: Shape = "openai",
        messages: list[Message] | None = None,
        session_id: str | None = None,
        keep_unreturned_message: bool = False,
        on_fold: Callable[[FoldReport], None] | None = None,
    ) -> None:
        if shape not in ("openai", "anthropic"):
            raise ValueError(f"shape must be 'openai' or 'anthropic', not {shape!r}")
        self.client = client
        self.shape: Shape = shape
        self.messages: list[Message] = messages if messages is not None else []
        self.session_id = session_id
        self.keep_unreturned_message = keep_unreturned_message
        self.on_fold = on_fold
        self.folds: list[FoldReport] = []
        """Every fold so far, oldest first."""
        self._branches: list[OpenBranch] = []

    # --- the history -------------------------------------------------------------------------

    def append(self, message: Mapping[str, Any] | Any) -> None:
        """Appends a message: a dict, or an SDK object with ``model_dump()`` (such as an OpenAI
        ``ChatCompletionMessage``), stored as its dict without ``None`` fields."""
        self.messages.append(_as_dict(message))

    def extend(self, messages: Iterable[Mapping[str, Any] | Any]) -> None:
        for message in messages:
            self.append(message)

    @property
    def open_branches(self) -> tuple[OpenBranch, ...]:
        """The branches opened in this history and not folded yet, outermost first."""
        return tuple(self._branches)

    @property
    def current_branch(self) -> OpenBranch | None:
        """The innermost open branch foldgate has not ended: the one upstream calls are charged to."""
        return next((b for b in reversed(self._branches) if not b.ended), None)

    # --- tools -------------------------------------------------------------------------------

    async def tool_specs(self) -> list[dict[str, Any]]:
        """foldgate's tools (its own and its upstreams') as tool definitions for the shape's API."""
        tools: list[types.Tool] = []
        cursor: str | None = None
        while True:
            listed = await self.client.list_tools(cursor=cursor) if cursor else await self.client.list_tools()
            tools.extend(listed.tools)
            cursor = listed.next_cursor
            if not cursor:
                break
        if self.shape == "openai":
            return [
                {
                    "type": "function",
                    "function": {"name": t.name, "description": t.description or "", "parameters": t.input_schema},
                }
                for t in tools
            ]
        return [{"name": t.name, "description": t.description or "", "input_schema": t.input_schema} for t in tools]

    async def call_tool(self, name: str, arguments: Mapping[str, Any] | None = None) -> types.CallToolResult:
        """Calls a tool outside the conversation (nothing is added to the history). An upstream
        tool is charged to :attr:`current_branch`. Branch tools called this way do not change the
        helper's books: open and return the model's branches through :meth:`run_tool_calls`."""
        meta = self._branch_meta(name)
        return await self.client.call_tool(name, dict(arguments or {}), meta=meta)

    async def run_tool_calls(self, message: Mapping[str, Any] | Any | None = None) -> TurnOutcome:
        """Runs the tool calls of an assistant message (by default the last message of the
        history; a message given here is appended first), one after another, appends their
        results, then folds every branch whose return completed in this turn, innermost first.

        Calls made in the same turn as a ``branch_return``, and their results, belong to the
        branch and are folded with it. A JSON-RPC error (invalid arguments, rate limit, an
        upstream's error) becomes an error result the model can read. So does an upstream result
        the SDK refuses (its ``RuntimeError``, such as structured content missing for a tool with
        an output schema). Neither carries a metering report: after either, for a call charged to
        a branch, the helper asks ``branch_status`` whether the branch is still active. Transport
        failures raise, and then nothing is appended."""
        if message is not None:
            self.append(message)
        if not self.messages:
            return TurnOutcome()
        calls = tool_calls_of(self.messages[-1], self.shape)
        if not calls:
            return TurnOutcome()
        outcomes: list[CallOutcome] = []
        pending: list[_PendingFold] = []
        for call in calls:
            outcomes.append(await self._execute(call, pending))
        self._append_results(outcomes)
        folds = [self._fold(p) for p in pending if p.branch in self._branches]
        return TurnOutcome(outcomes, folds)

    async def fold_ended(self) -> list[FoldReport]:
        """Asks foldgate (``branch_status``) about every open branch and folds, outermost first,
        those it has ended, up to the end of the history. Call it between turns, for a branch that
        ran out of budget or time when the agent is not going to return it itself."""
        folds: list[FoldReport] = []
        for branch in list(self._branches):
            if branch not in self._branches:
                continue  # folded with an outer branch
            status = await self._status(branch.branch_id)
            if status is None or status.get("status") not in _ENDED_STATUSES:
                continue
            folds.append(
                self._fold(
                    _PendingFold(
                        branch,
                        str(status["status"]),
                        status.get("reason"),
                        None,
                        _int_or_none(status.get("budget_used")),
                        forced=True,
                    )
                )
            )
        return folds

    # --- calls -------------------------------------------------------------------------------

    def _charged_branch(self, name: str) -> str | None:
        """The branch a call of this tool is charged to: the current one, for upstream tools."""
        branch = self.current_branch
        return None if name in FOLDGATE_TOOLS or branch is None else branch.branch_id

    def _branch_meta(self, name: str) -> types.RequestParamsMeta | None:
        branch_id = self._charged_branch(name)
        return None if branch_id is None else cast(types.RequestParamsMeta, {BRANCH_META_KEY: branch_id})

    async def _execute(self, call: ToolCall, pending: list[_PendingFold]) -> CallOutcome:
        if call.invalid_arguments is not None:
            return CallOutcome(call, None, True, "invalid_arguments", None, None)
        arguments = dict(call.arguments)
        if self.session_id is not None and call.name in ("branch_create", "session_end"):
            arguments.setdefault("session_id", self.session_id)
        if (
            self.session_id is not None
            and call.name == "branch_status"
            and "branch_id" not in arguments
            and "session_id" not in arguments
        ):
            arguments["session_id"] = self.session_id
        charged_to = self._charged_branch(call.name)
        meta = self._branch_meta(call.name)
        try:
            result = await self.client.call_tool(call.name, arguments, meta=meta)
        except MCPError as e:
            # An error carries no metering report: if the call was charged to a branch (an
            # upstream's own JSON-RPC error is), ask foldgate whether it ended the branch.
            error = {"code": e.code, "message": e.message, "data": e.data}
            await self._check_charged_branch(charged_to, counted=False)
            return CallOutcome(call, None, True, str(e.code), charged_to, None, error)
        except RuntimeError as e:
            if call.name in FOLDGATE_TOOLS:
                raise
            # The SDK received a result it refuses to hand over: for a tool that declares an
            # output schema, a result without structured content (as a result cut at a branch's
            # budget can be). Its metering report is lost with it.
            error = {"code": "unreadable_result", "message": str(e)}
            await self._check_charged_branch(charged_to, counted=True)
            return CallOutcome(call, None, True, "unreadable_result", charged_to, None, error)
        code = _refusal_code(result) if result.is_error else None
        metering = (result.meta or {}).get(METERING_META_KEY) if result.meta else None
        outcome = CallOutcome(call, result, bool(result.is_error), code, charged_to, metering)

        if call.name == "branch_create" and not result.is_error:
            created = _structured(result)
            if isinstance(created.get("branch_id"), str):
                self._branches.append(
                    OpenBranch(
                        branch_id=created["branch_id"],
                        session_id=str(created.get("session_id") or arguments.get("session_id")),
                        call_id=call.id,
                        description=str(arguments.get("description", "")),
                        depth=int(created.get("depth") or 0),
                        parent_branch_id=created.get("parent_branch_id"),
                    )
                )
        elif call.name == "branch_return":
            await self._after_return(arguments, result, code, pending)
        elif call.name == "session_end" and not result.is_error:
            await self._after_session_end(str(arguments.get("session_id")), pending)
        elif call.name not in FOLDGATE_TOOLS:
            self._after_upstream_call(charged_to, result, code, metering)
        return outcome

    async def _after_return(
        self, arguments: Mapping[str, Any], result: types.CallToolResult, code: str | None, pending: list[_PendingFold]
    ) -> None:
        branch = self._branch(arguments.get("branch_id"))
        if branch is None:
            return
        if not result.is_error:
            returned = _structured(result)
            ended_as = str(returned.get("status") or "completed")
            reason = "reported_failure" if ended_as == "failed" else None
            self._mark_ended(branch)
            pending.append(
                _PendingFold(
                    branch,
                    ended_as,
                    reason,
                    returned.get("message"),
                    _int_or_none(returned.get("tokens_used")),
                    forced=False,
                )
            )
        elif code == "branch_not_active":
            # foldgate ended the branch before the agent returned it: check, then fold what
            # foldgate says, not what the agent tried to return.
            status = await self._status(branch.branch_id)
            if status is not None and status.get("status") in _ENDED_STATUSES:
                self._mark_ended(branch)
                message = arguments.get("message")
                pending.append(
                    _PendingFold(
                        branch,
                        str(status["status"]),
                        status.get("reason"),
                        None,
                        _int_or_none(status.get("budget_used")),
                        forced=True,
                        unreturned_message=message if isinstance(message, str) else None,
                    )
                )

    async def _after_session_end(self, session_id: str, pending: list[_PendingFold]) -> None:
        # Every branch of the session has ended: folding its outermost open branch takes the
        # others with it.
        outermost = next((b for b in self._branches if b.session_id == session_id), None)
        if outermost is None:
            return
        for branch in self._branches:
            if branch.session_id == session_id:
                branch.ended = True
        status = await self._status(outermost.branch_id) or {}
        pending.append(
            _PendingFold(
                outermost,
                str(status.get("status") or "failed"),
                status.get("reason", "session_ended"),
                None,
                _int_or_none(status.get("budget_used")),
                forced=True,
            )
        )

    def _after_upstream_call(
        self, charged_to: str | None, result: types.CallToolResult, code: str | None, metering: Any
    ) -> None:
        branch = self._branch(charged_to)
        if branch is None:
            return
        if isinstance(metering, Mapping):
            if metering.get("branch_id") == branch.branch_id:
                branch.upstream_calls += 1
                branch.tokens_in += int(metering.get("tokens_in") or 0)
                branch.tokens_out += int(metering.get("tokens_out") or 0)
            if metering.get("branch_force_returned"):
                branch.ended, branch.end_reason = True, "budget_exhausted"
            elif metering.get("branch_ended"):
                branch.ended = True
        elif code == "branch_not_active":
            # Refused before the call was made: the branch had ended (its deadline, say).
            branch.ended = True

    async def _check_charged_branch(self, charged_to: str | None, *, counted: bool) -> None:
        """After an upstream call whose metering report is lost: count it (if it was surely
        charged) and ask ``branch_status`` whether the branch it named is still active."""
        branch = self._branch(charged_to)
        if branch is None:
            return
        if counted:
            branch.upstream_calls += 1
        status = await self._status(branch.branch_id)
        if status is not None and status.get("status") in _ENDED_STATUSES:
            branch.ended = True
            branch.end_reason = status.get("reason")

    def _mark_ended(self, branch: OpenBranch) -> None:
        # A branch's return ends every branch opened inside it.
        index = self._branches.index(branch)
        for inner in self._branches[index:]:
            inner.ended = True

    def _branch(self, branch_id: Any) -> OpenBranch | None:
        return next((b for b in self._branches if b.branch_id == branch_id), None)

    async def _status(self, branch_id: str) -> dict[str, Any] | None:
        try:
            result = await self.client.call_tool("branch_status", {"branch_id": branch_id})
        except MCPError:
            return None
        return None if result.is_error else _structured(result)

    # --- results and folds -------------------------------------------------------------------

    def _append_results(self, outcomes: list[CallOutcome]) -> None:
        if self.shape == "openai":
            for o in outcomes:
                self.messages.append({"role": "tool", "tool_call_id": o.call.id, "content": _openai_text(o)})
        else:
            blocks: list[dict[str, Any]] = []
            for o in outcomes:
                block: dict[str, Any] = {
                    "type": "tool_result",
                    "tool_use_id": o.call.id,
                    "content": _anthropic_blocks(o),
                }
                if o.is_error:
                    block["is_error"] = True
                blocks.append(block)
            self.messages.append({"role": "user", "content": blocks})

    def _start_of(self, branch: OpenBranch) -> int | None:
        for index in range(len(self.messages) - 1, -1, -1):
            if any(c.id == branch.call_id for c in tool_calls_of(self.messages[index], self.shape)):
                return index
        return None

    def _fold(self, p: _PendingFold) -> FoldReport:
        branch = p.branch
        index = self._branches.index(branch)
        nested = tuple(b.branch_id for b in self._branches[index + 1 :])
        del self._branches[index:]
        start = self._start_of(branch)
        record: dict[str, Any] = {
            "branch_id": branch.branch_id,
            "status": p.status,
            "reason": p.reason,
            "tokens_used": p.tokens_used,
            "message": p.message,
        }
        if p.forced:
            record["note"] = (
                f"foldgate ended this branch ({p.reason or p.status}) before it returned; "
                "its turns were folded out of this conversation and it returned no message."
            )
            if self.keep_unreturned_message and p.unreturned_message is not None:
                record["unreturned_message"] = p.unreturned_message
                record["note"] += " unreturned_message is what the branch tried to return; foldgate never scrubbed it."
        else:
            record["note"] = "This branch has ended; its turns were folded out of this conversation."
        if start is None:
            # The branch's call is no longer in the history (edited by the caller): nothing to drop.
            removed: list[Message] = []
            kept: list[Message] = []
        else:
            removed = self.messages[start:]
            kept = [self._call_record(self.messages[start], branch), self._result_record(branch, record, p)]
            self.messages[start:] = kept
        report = FoldReport(
            branch_id=branch.branch_id,
            session_id=branch.session_id,
            status=p.status,
            reason=p.reason,
            message=p.message,
            tokens_used=p.tokens_used,
            forced=p.forced,
            messages_dropped=len(removed),
            chars_dropped=sum(message_chars(m) for m in removed),
            messages_kept=len(kept),
            chars_kept=sum(message_chars(m) for m in kept),
            nested=nested,
            upstream_calls=branch.upstream_calls,
        )
        self.folds.append(report)
        if self.on_fold is not None:
            self.on_fold(report)
        return report

    def _call_record(self, message: Message, branch: OpenBranch) -> Message:
        """The assistant message that opened the branch, with only its ``branch_create`` call
        (other calls of that message ran inside the branch). Text and thinking blocks stay."""
        kept = copy.deepcopy(message)
        if self.shape == "openai":
            kept["tool_calls"] = [c for c in kept.get("tool_calls") or [] if c.get("id") == branch.call_id]
        else:
            kept["content"] = [
                b
                for b in kept.get("content") or []
                if not (isinstance(b, Mapping) and b.get("type") == "tool_use" and b.get("id") != branch.call_id)
            ]
        return kept

    def _result_record(self, branch: OpenBranch, record: dict[str, Any], p: _PendingFold) -> Message:
        text = json.dumps(record, ensure_ascii=False)
        if self.shape == "openai":
            return {"role": "tool", "tool_call_id": branch.call_id, "content": text}
        block: dict[str, Any] = {
            "type": "tool_result",
            "tool_use_id": branch.call_id,
            "content": [{"type": "text", "text": text}],
        }
        if p.status != "completed":
            block["is_error"] = True
        return {"role": "user", "content": [block]}


# --- rendering results --------------------------------------------------------------------------


def _as_dict(message: Mapping[str, Any] | Any) -> Message:
    if isinstance(message, Mapping):
        return dict(message)
    dump = getattr(message, "model_dump", None)
    if callable(dump):
        return dict(dump(exclude_none=True))
    raise TypeError(f"a message must be a dict or have model_dump(), not {type(message).__name__}")


def _structured(result: types.CallToolResult) -> dict[str, Any]:
    data = result.structured_content
    if isinstance(data, dict):
        return data
    for item in result.content:
        if isinstance(item, types.TextContent):
            try:
                parsed = json.loads(item.text)
            except json.JSONDecodeError:
                continue
            if isinstance(parsed, dict):
                return parsed
    return {}


def _refusal_code(result: types.CallToolResult) -> str | None:
    error = _structured(result).get("error")
    code = error.get("code") if isinstance(error, Mapping) else None
    return code if isinstance(code, str) else None


def _int_or_none(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _error_text(outcome: CallOutcome) -> str:
    """The text of a call that has no result: its arguments could not be read, or a JSON-RPC
    error answered it."""
    if outcome.call.invalid_arguments is not None:
        error: dict[str, Any] = {"code": "invalid_arguments", "message": outcome.call.invalid_arguments}
    else:
        error = {k: v for k, v in (outcome.rpc_error or {"code": outcome.error_code}).items() if v is not None}
    return json.dumps({"error": error}, ensure_ascii=False, default=str)


def _item_text(item: types.ContentBlock) -> str:
    if isinstance(item, types.TextContent):
        return item.text
    if isinstance(item, types.EmbeddedResource):
        resource = item.resource
        if isinstance(resource, types.TextResourceContents):
            return resource.text
        return f"[binary resource {resource.uri} ({resource.mime_type or 'unknown type'})]"
    if isinstance(item, types.ImageContent):
        return f"[image ({item.mime_type})]"
    if isinstance(item, types.AudioContent):
        return f"[audio ({item.mime_type})]"
    if isinstance(item, types.ResourceLink):
        return f"[resource {item.uri}]"
    return json.dumps(item.model_dump(mode="json", by_alias=True, exclude_none=True))


def _result_texts(result: types.CallToolResult) -> list[str]:
    texts = [_item_text(item) for item in result.content]
    if not texts and result.structured_content is not None:
        texts = [json.dumps(result.structured_content, ensure_ascii=False)]
    return texts


def _openai_text(outcome: CallOutcome) -> str:
    if outcome.result is None:
        return _error_text(outcome)
    return "\n".join(_result_texts(outcome.result))


def _anthropic_blocks(outcome: CallOutcome) -> list[dict[str, Any]]:
    if outcome.result is None:
        return [{"type": "text", "text": _error_text(outcome)}]
    blocks: list[dict[str, Any]] = []
    for item in outcome.result.content:
        if isinstance(item, types.ImageContent):
            blocks.append(
                {"type": "image", "source": {"type": "base64", "media_type": item.mime_type, "data": item.data}}
            )
        else:
            blocks.append({"type": "text", "text": _item_text(item)})
    if not blocks:
        blocks = [{"type": "text", "text": t} for t in _result_texts(outcome.result)] or [{"type": "text", "text": ""}]
    return blocks
