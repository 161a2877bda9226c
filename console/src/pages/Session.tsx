// A session and its branch tree, read again every 1.5 s: branches appear as
// agents create them, change state as they end, and count down to their
// deadlines. A branch's details are shown beside the tree, with its upstream
// calls and, for a gateway-run branch, its run's steps.

import { useEffect, useRef, useState } from "preact/hooks";

import { ApiError, admin, type BranchNode, type SessionDetail } from "../api";
import {
  BudgetBar,
  ConfirmButton,
  ErrorNote,
  Freshness,
  Link,
  Notice,
  Status,
} from "../components/ui";
import { BranchTrace } from "../components/trace";
import { usePoll, useTick } from "../poll";
import { href } from "../router";
import { ago, clock, count, span } from "../time";
import type { PageProps } from "./page";
import { PageHeading } from "./page";

const PERIOD = 1500;

function flatten(nodes: BranchNode[], into: BranchNode[] = []): BranchNode[] {
  for (const node of nodes) {
    into.push(node);
    flatten(node.children, into);
  }
  return into;
}

function shortId(id: string): string {
  // br_<uuid v7>: the uuid's last 12 digits tell siblings apart.
  return id.length > 16 ? `br_…${id.slice(-8)}` : id;
}

/** What changed between two reads of the tree, in words. */
function changes(before: Map<string, BranchNode>, after: BranchNode[]): string[] {
  const said: string[] = [];
  for (const node of after) {
    const old = before.get(node.branch_id);
    const name = `“${node.description}”`;
    if (!old) {
      said.push(`New branch ${name} (${node.status}).`);
    } else if (old.status !== node.status) {
      said.push(
        `Branch ${name} is now ${node.status}${node.reason ? ` (${node.reason})` : ""}.`,
      );
    }
  }
  return said;
}

function Deadline(props: { node: BranchNode; now: number }) {
  const { node, now } = props;
  const deadline = Date.parse(node.deadline_at);
  if (node.status === "active") {
    const left = deadline - now;
    return (
      <span class={left < 30_000 ? "deadline deadline-near" : "deadline"}>
        <time dateTime={node.deadline_at} title={`deadline ${node.deadline_at}`}>
          {left >= 0 ? `${span(left)} left` : `${span(-left)} past the deadline`}
        </time>
      </span>
    );
  }
  return (
    <span class="deadline">
      ended{" "}
      <time dateTime={node.completed_at ?? ""} title={node.completed_at ?? ""}>
        {node.completed_at ? clock(node.completed_at) : "—"}
      </time>
    </span>
  );
}

function Usage(props: { node: BranchNode }) {
  const { node } = props;
  return (
    <span class="usage">
      {count(node.calls)} {node.calls === 1 ? "call" : "calls"}, {count(node.call_tokens)} call
      tokens
      {node.model_usage ? (
        <>
          {" · "}model {node.model_usage.model}: {count(node.model_usage.calls)} calls,{" "}
          {count(node.model_usage.input_tokens)} in / {count(node.model_usage.output_tokens)} out
        </>
      ) : null}
    </span>
  );
}

interface Actions {
  tenant: string;
  sessionId: string;
  selected: string | null;
  now: number;
  endBranch: (node: BranchNode) => Promise<void>;
}

function Tree(props: { nodes: BranchNode[]; actions: Actions; top?: boolean }) {
  return (
    <ul class={props.top ? "tree" : undefined}>
      {props.nodes.map((node) => (
        <li key={node.branch_id}>
          <TreeNode node={node} actions={props.actions} />
          {node.children.length > 0 ? <Tree nodes={node.children} actions={props.actions} /> : null}
        </li>
      ))}
    </ul>
  );
}

function TreeNode(props: { node: BranchNode; actions: Actions }) {
  const { node, actions } = props;
  const selected = actions.selected === node.branch_id;
  return (
    <article
      class={`node node-${node.status}${selected ? " node-selected" : ""}`}
      aria-label={`Branch ${node.description}, ${node.status}`}
      data-branch-id={node.branch_id}
    >
      <div class="node-head">
        <Status status={node.status} reason={node.reason} />
        <Link
          class="node-title"
          href={href("session", {
            tenant: actions.tenant,
            id: actions.sessionId,
            branch: node.branch_id,
          })}
          current={selected}
        >
          {node.description}
        </Link>
        <span class="mono muted" title={node.branch_id}>
          {shortId(node.branch_id)}
        </span>
        <span class="kind">{node.kind === "gateway" ? "gateway-run" : "agent"}</span>
      </div>
      <div class="node-body">
        <BudgetBar budget={node.budget} label={`Budget of ${node.description}`} />
        <Deadline node={node} now={actions.now} />
        <Usage node={node} />
        {node.status === "active" ? (
          <ConfirmButton
            label="End branch"
            question={`End “${node.description}” and its active branches?`}
            confirmLabel="Yes, end it"
            onConfirm={() => actions.endBranch(node)}
          />
        ) : null}
      </div>
    </article>
  );
}

function Details(props: {
  node: BranchNode | undefined;
  id: string | null;
  close: string;
  token: string;
  tenant: string;
}) {
  const { node } = props;
  const ref = useRef<HTMLHeadingElement>(null);
  useEffect(() => {
    if (props.id) ref.current?.focus({ preventScroll: false });
  }, [props.id]);
  if (!props.id) {
    return (
      <aside class="details panel" aria-label="Branch details">
        <p class="muted">Choose a branch in the tree to see its details and its result.</p>
      </aside>
    );
  }
  if (!node) {
    return (
      <aside class="details panel" aria-label="Branch details">
        <h2 ref={ref} tabIndex={-1}>
          Branch not in this session
        </h2>
        <p class="mono">{props.id}</p>
        <Link href={props.close}>Close</Link>
      </aside>
    );
  }
  const rows: [string, preact.ComponentChildren][] = [
    ["Branch id", <span class="mono">{node.branch_id}</span>],
    ["Kind", node.kind === "gateway" ? "gateway (branch_run)" : "agent (branch_create)"],
    ["Status", <Status status={node.status} />],
    ["Reason", node.reason ?? "—"],
    ["Depth", String(node.depth)],
    ["Budget total", count(node.budget.total)],
    ["Used", count(node.budget.used)],
    ["Reserved for children", count(node.budget.reserved)],
    ["Created", <time dateTime={node.created_at}>{clock(node.created_at)}</time>],
    ["Deadline", <time dateTime={node.deadline_at}>{clock(node.deadline_at)}</time>],
    [
      "Ended",
      node.completed_at ? <time dateTime={node.completed_at}>{clock(node.completed_at)}</time> : "—",
    ],
    ["Upstream calls", count(node.calls)],
    ["Call tokens", count(node.call_tokens)],
    ["Returned tokens", node.returned_tokens === null ? "—" : count(node.returned_tokens)],
    [
      "Model",
      node.model_usage
        ? `${node.model_usage.model}: ${count(node.model_usage.calls)} calls, ${count(
            node.model_usage.input_tokens,
          )} input, ${count(node.model_usage.output_tokens)} output tokens`
        : "—",
    ],
    ["Children", String(node.children.length)],
  ];
  return (
    <aside class="details panel" aria-labelledby="details-title">
      <div class="details-head">
        <h2 id="details-title" ref={ref} tabIndex={-1}>
          {node.description}
        </h2>
        <Link href={props.close} class="close">
          Close<span class="visually-hidden"> details</span>
        </Link>
      </div>
      <dl class="fields">
        {rows.map(([name, value]) => (
          <div key={name}>
            <dt>{name}</dt>
            <dd>{value}</dd>
          </div>
        ))}
      </dl>
      <h3>Result</h3>
      {node.result === null ? (
        <p class="muted">{node.status === "active" ? "Not returned yet." : "No result."}</p>
      ) : (
        <pre class="result" tabIndex={0} aria-label="Result text">
          {node.result}
        </pre>
      )}
      <BranchTrace key={node.branch_id} token={props.token} tenant={props.tenant} node={node} />
    </aside>
  );
}

export function Session({ token, location }: PageProps) {
  const tenant = location.params.get("tenant") ?? "";
  const id = location.params.get("id") ?? "";
  const selected = location.params.get("branch");
  const session = usePoll(
    (signal) => admin.session(token, tenant, id, signal),
    `session ${tenant} ${id}`,
    PERIOD,
  );
  const detail: SessionDetail | undefined = session.data;
  const all = detail ? flatten(detail.branches) : [];
  const anyActive = all.some((n) => n.status === "active");
  const now = useTick(anyActive);

  // Announce what changed since the last read.
  const seen = useRef<Map<string, BranchNode> | null>(null);
  const [activity, setActivity] = useState<string>("");
  useEffect(() => {
    if (!detail) return;
    const before = seen.current;
    seen.current = new Map(all.map((n) => [n.branch_id, n]));
    if (before) {
      const said = changes(before, all);
      if (said.length > 0) setActivity(said.join(" "));
    }
  }, [session.updatedAt]);

  const [notice, setNotice] = useState<{ text: string; error: boolean; id: number } | null>(null);
  const say = (text: string, error: boolean) => setNotice({ text, error, id: Date.now() });

  const endBranch = async (node: BranchNode) => {
    try {
      const ended = await admin.endBranch(token, tenant, node.branch_id);
      const b = ended.branch;
      say(`Ended “${b.description}”: ${b.status}${b.reason ? `, ${b.reason}` : ""}.`, false);
    } catch (e) {
      say(`Could not end “${node.description}”: ${describe(e)}`, true);
    }
    session.refresh();
  };
  const endSession = async () => {
    try {
      const ended = await admin.endSession(token, tenant, id);
      say(
        ended.session_ended
          ? `Session ended; ${ended.branches_ended} active ${ended.branches_ended === 1 ? "branch" : "branches"} ended with it.`
          : `${ended.branches_ended} active branches ended, but the session was used again meanwhile and stays open.`,
        false,
      );
    } catch (e) {
      say(`Could not end the session: ${describe(e)}`, true);
    }
    session.refresh();
  };

  const close = href("session", { tenant, id });
  const actions: Actions = { tenant, sessionId: id, selected, now, endBranch };

  return (
    <>
      <nav aria-label="Breadcrumb" class="crumbs">
        <Link href={href("")}>Tenants</Link> <span aria-hidden="true">›</span>{" "}
        <Link href={href("sessions", { tenant })}>{tenant}</Link>{" "}
        <span aria-hidden="true">›</span> session
      </nav>
      <PageHeading title={<>Session <span class="mono">{id}</span></>}>
        <Freshness updatedAt={session.updatedAt} periodMs={PERIOD} failing={Boolean(session.error)} />
      </PageHeading>
      <ErrorNote error={session.error} context="Could not read the session" />
      {detail ? (
        <section class="session-head panel" aria-label="Session summary">
          <div class="facts">
            <span>
              <Status status={detail.status} />
            </span>
            <span>
              owner <b>{detail.owner}</b>
            </span>
            <span>
              opened <time dateTime={detail.created_at}>{clock(detail.created_at)}</time>
            </span>
            <span>
              last activity{" "}
              <time dateTime={detail.last_activity_at}>{ago(detail.last_activity_at, now)}</time>
            </span>
            {detail.ended_at ? (
              <span>
                ended <time dateTime={detail.ended_at}>{clock(detail.ended_at)}</time>
              </span>
            ) : null}
            <span>
              {all.length} {all.length === 1 ? "branch" : "branches"},{" "}
              {all.filter((n) => n.status === "active").length} active
            </span>
          </div>
          <div class="session-budget">
            <span class="label">Root pool</span>
            <BudgetBar budget={detail.budget} label="Root pool of the session" />
          </div>
          {detail.status === "open" ? (
            <div class="session-actions">
              <ConfirmButton
                label="End session"
                question="End this session and every active branch in it?"
                confirmLabel="Yes, end the session"
                onConfirm={endSession}
              />
            </div>
          ) : null}
        </section>
      ) : null}
      <Notice notice={notice} />
      <p class="activity" role="status" aria-live="polite">
        {activity}
      </p>
      {detail ? (
        <div class={selected ? "split split-details" : "split"}>
          <section class="tree-wrap" aria-labelledby="tree-title">
            <h2 id="tree-title">Branch tree</h2>
            {detail.branches.length === 0 ? (
              <p class="empty">No branches.</p>
            ) : (
              <Tree nodes={detail.branches} actions={actions} top />
            )}
          </section>
          <Details
            node={selected ? all.find((n) => n.branch_id === selected) : undefined}
            id={selected}
            close={close}
            token={token}
            tenant={tenant}
          />
        </div>
      ) : null}
    </>
  );
}

function describe(e: unknown): string {
  return e instanceof ApiError ? e.describe() : String(e);
}
