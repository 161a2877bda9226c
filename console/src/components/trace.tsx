// What a branch did, under its details: its upstream calls (newest first)
// and, for a gateway-run branch, its run and the run's steps (in the order
// the run made them), each step with a summary and its full body behind a
// disclosure. Read from GET /tenants/T/branches/B while the branch is shown.

import type { ComponentChildren } from "preact";

import {
  admin,
  type BranchNode,
  type CallView,
  type RunView,
  type StepView,
} from "../api";
import { usePoll } from "../poll";
import { clock, count } from "../time";
import { ErrorNote } from "./ui";

/** Reads while the branch is active, then now and then (it no longer changes). */
const ACTIVE_PERIOD = 1500;
const ENDED_PERIOD = 15_000;
/** Calls asked for per read (the API pages further with `calls_before`). */
const CALLS = 200;
/** How much of a step's text its one-line summary shows. */
const SUMMARY_CHARS = 160;

export function duration(ms: number): string {
  if (ms < 1000) return `${ms} ms`;
  if (ms < 60_000) return `${(ms / 1000).toFixed(ms < 10_000 ? 2 : 1)} s`;
  return `${Math.floor(ms / 60_000)}m ${String(Math.round((ms % 60_000) / 1000)).padStart(2, "0")}s`;
}

/** The first line of `text`, shortened to `max` characters. */
function firstLine(text: string, max = SUMMARY_CHARS): string {
  const line = text.trim().split("\n", 1)[0] ?? "";
  return line.length > max ? `${line.slice(0, max - 1)}…` : line;
}

const OUTCOMES: Record<string, string> = {
  ok: "ok",
  tool_error: "tool error",
  upstream_error: "upstream error",
  truncated: "truncated",
  refused: "refused",
};

function Outcome(props: { outcome: string }) {
  return (
    <span class={`outcome outcome-${props.outcome}`}>{OUTCOMES[props.outcome] ?? props.outcome}</span>
  );
}

function Calls(props: { calls: CallView[]; total: number; more: boolean }) {
  const { calls } = props;
  if (calls.length === 0) {
    return <p class="muted">No upstream calls.</p>;
  }
  return (
    <>
      <div class="table-wrap trace-table" role="region" aria-labelledby="calls-title" tabIndex={0}>
        <table class="compact-rows calls-table">
          <caption class="visually-hidden">Upstream calls of the branch, newest first</caption>
          <thead>
            <tr>
              <th scope="col">Tool</th>
              <th scope="col" class="num">
                In
              </th>
              <th scope="col" class="num">
                Out
              </th>
              <th scope="col" class="num">
                Charged
              </th>
              <th scope="col" class="num">
                Duration
              </th>
              <th scope="col">Outcome</th>
              <th scope="col">Time</th>
            </tr>
          </thead>
          <tbody>
            {calls.map((c) => (
              <tr key={c.id} data-call-id={c.id}>
                <th scope="row" class="mono wrap">
                  <span class="muted">{c.upstream}__</span>
                  {c.tool}
                </th>
                <td class="num">{count(c.tokens_in)}</td>
                <td class="num">{count(c.tokens_out)}</td>
                <td class="num">{count(c.tokens_charged)}</td>
                <td class="num">{duration(c.duration_ms)}</td>
                <td>
                  <Outcome outcome={c.outcome} />
                </td>
                <td>
                  <time dateTime={c.called_at} title={c.called_at}>
                    {clock(c.called_at)}
                  </time>
                </td>
              </tr>
            ))}
          </tbody>
        </table>
      </div>
      {props.more ? (
        <p class="table-note muted">
          The latest {count(calls.length)} of {count(props.total)} calls; the admin API gives the
          older ones (<code>calls_before</code>).
        </p>
      ) : null}
    </>
  );
}

function Run(props: { run: RunView }) {
  const { run } = props;
  const rows: [string, ComponentChildren][] = [
    ["Model", <span class="mono">{run.model}</span>],
    ["State", <span class={`run-state run-${run.state}`}>{run.state}</span>],
    ["Steps", count(run.steps)],
    [
      "Billed",
      `${count(run.model_calls)} model ${run.model_calls === 1 ? "call" : "calls"}, ${count(
        run.input_tokens,
      )} input, ${count(run.output_tokens)} output tokens`,
    ],
    ["Taken over", run.resumes === 0 ? "never" : `${count(run.resumes)} times`],
    [
      "Held by",
      run.lease_owner ? (
        <>
          <span class="mono">{run.lease_owner}</span>
          {run.lease_until ? (
            <>
              {" "}
              until <time dateTime={run.lease_until}>{clock(run.lease_until)}</time>
            </>
          ) : null}
        </>
      ) : (
        "—"
      ),
    ],
    ["Tools", run.tools.length === 0 ? "none" : <span class="mono">{run.tools.join(", ")}</span>],
  ];
  return (
    <dl class="fields run-fields">
      {rows.map(([name, value]) => (
        <div key={name}>
          <dt>{name}</dt>
          <dd>{value}</dd>
        </div>
      ))}
    </dl>
  );
}

/** A step in one line: what the model said and asked for, or what a tool gave back. */
function summary(step: StepView): string {
  if (step.kind === "tool") {
    const result = firstLine(step.result ?? "");
    return `${step.tool ?? "?"} ${step.error ? "failed" : "returned"}${result ? `: ${result}` : " nothing"}`;
  }
  const text = firstLine(step.text ?? "");
  if (step.tool_calls.length > 0) {
    const asked = step.tool_calls.map((c) => c.name).join(", ");
    return text ? `${text} — asked for ${asked}` : `Asked for ${asked}`;
  }
  return text ? `Answered: ${text}` : "Answered with no text";
}

function Step(props: { step: StepView }) {
  const { step } = props;
  const tokens =
    step.kind === "model" ? `${count(step.input_tokens)} in / ${count(step.output_tokens)} out` : null;
  return (
    <li class={`step step-${step.kind}`} data-seq={step.seq}>
      <div class="step-head">
        <span class="step-seq">#{step.seq}</span>
        <span class={`step-kind kind-${step.kind}`}>{step.kind === "model" ? "model" : "tool"}</span>
        {step.kind === "tool" && step.error ? <span class="outcome outcome-tool_error">error</span> : null}
        {tokens ? <span class="step-tokens">{tokens} tokens</span> : null}
        <span class="step-duration">{duration(step.duration_ms)}</span>
        <time dateTime={step.at} title={step.at} class="muted">
          {clock(step.at)}
        </time>
        {step.repeated ? (
          <span class="step-note" title="Made again after another replica took the run over">
            repeated
          </span>
        ) : null}
      </div>
      <p class="step-summary">{summary(step)}</p>
      <details class="step-body">
        <summary>
          Full body<span class="visually-hidden"> of step {step.seq}</span>
          {step.truncated ? <span class="muted"> (cut by the API)</span> : null}
        </summary>
        {step.kind === "tool" ? (
          <dl class="fields">
            <div>
              <dt>Tool</dt>
              <dd class="mono">{step.tool ?? "—"}</dd>
            </div>
            <div>
              <dt>Answers call</dt>
              <dd class="mono">{step.call_id ?? "—"}</dd>
            </div>
            <div>
              <dt>Error</dt>
              <dd>{step.error ? "yes" : "no"}</dd>
            </div>
          </dl>
        ) : null}
        {step.kind === "tool" ? (
          <pre class="result step-text" tabIndex={0} aria-label={`Result of step ${step.seq}`}>
            {step.result ?? ""}
          </pre>
        ) : (
          <>
            {step.text ? (
              <pre class="result step-text" tabIndex={0} aria-label={`Text of step ${step.seq}`}>
                {step.text}
              </pre>
            ) : (
              <p class="muted">No text.</p>
            )}
            {step.tool_calls.length > 0 ? (
              <ol class="tool-calls" aria-label={`Tool calls asked for in step ${step.seq}`}>
                {step.tool_calls.map((c) => (
                  <li key={c.id}>
                    <span class="mono">{c.name}</span> <span class="muted mono">({c.id})</span>
                    <pre class="arguments">{c.arguments || "{}"}</pre>
                  </li>
                ))}
              </ol>
            ) : null}
          </>
        )}
        {step.truncated ? (
          <p class="table-note muted">Texts over 4 KiB and arguments over 1 KiB are cut.</p>
        ) : null}
      </details>
    </li>
  );
}

function Steps(props: { steps: StepView[]; total: number; more: boolean }) {
  if (props.steps.length === 0) {
    return <p class="muted">No steps yet.</p>;
  }
  // The API gives the newest first; a run reads best in the order it was made.
  const inOrder = [...props.steps].reverse();
  return (
    <>
      {props.more ? (
        <p class="table-note muted">
          The latest {count(props.steps.length)} of {count(props.total)} steps; the admin API gives
          the earlier ones (<code>steps_before</code>).
        </p>
      ) : null}
      <ol class="steps" aria-labelledby="steps-title">
        {inOrder.map((s) => (
          <Step key={s.seq} step={s} />
        ))}
      </ol>
    </>
  );
}

/** The calls, run and steps of `node`, read from the admin API. */
export function BranchTrace(props: { token: string; tenant: string; node: BranchNode }) {
  const { token, tenant, node } = props;
  const live = node.status === "active";
  const trace = usePoll(
    (signal) => admin.branch(token, tenant, node.branch_id, { calls_limit: CALLS }, signal),
    `branch ${tenant} ${node.branch_id}`,
    live ? ACTIVE_PERIOD : ENDED_PERIOD,
  );
  const detail = trace.data;
  return (
    <div class="trace" aria-busy={detail ? undefined : "true"}>
      <ErrorNote error={trace.error} context="Could not read the branch's calls and steps" />
      {detail?.run ? (
        <>
          <h3 id="run-title">Run</h3>
          <Run run={detail.run} />
        </>
      ) : null}
      <h3 id="calls-title">
        Upstream calls <span class="h-note">newest first</span>
      </h3>
      {detail ? (
        <Calls calls={detail.calls} total={node.calls} more={detail.calls_next !== null} />
      ) : (
        <p class="muted">Loading…</p>
      )}
      {node.kind === "gateway" ? (
        <>
          <h3 id="steps-title">
            Steps <span class="h-note">in the order the run made them</span>
          </h3>
          {detail ? (
            <Steps
              steps={detail.steps}
              total={detail.run?.steps ?? detail.steps.length}
              more={detail.steps_next !== null}
            />
          ) : (
            <p class="muted">Loading…</p>
          )}
        </>
      ) : null}
    </div>
  );
}
