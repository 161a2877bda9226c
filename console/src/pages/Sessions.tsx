import { useState } from "preact/hooks";

import { admin } from "../api";
import {
  BudgetBar,
  ErrorNote,
  Freshness,
  Link,
  Status,
  TenantCrumbs,
  TenantNav,
} from "../components/ui";
import { usePoll, useTick } from "../poll";
import { href, navigate } from "../router";
import { ago, clock, count } from "../time";
import type { PageProps } from "./page";
import { PageHeading } from "./page";

const PERIOD = 2000;

export function Sessions({ token, location }: PageProps) {
  const tenant = location.params.get("tenant") ?? "";
  const status = location.params.get("status") === "all" ? "all" : "open";
  // The cursors of the pages before this one; the last is this page's `after`.
  const [cursors, setCursors] = useState<string[]>([]);
  const after = cursors[cursors.length - 1];
  const sessions = usePoll(
    (signal) => admin.sessions(token, tenant, status, after, signal),
    `sessions ${tenant} ${status} ${after ?? ""}`,
    PERIOD,
  );
  const now = useTick(true);
  const list = sessions.data?.sessions;
  const next = sessions.data?.next;

  return (
    <>
      <TenantCrumbs tenant={tenant} />
      <PageHeading title={<>Sessions of {tenant}</>}>
        <Freshness updatedAt={sessions.updatedAt} periodMs={PERIOD} failing={Boolean(sessions.error)} />
      </PageHeading>
      <TenantNav tenant={tenant} current="sessions" />
      <div class="toolbar">
        <label>
          Show{" "}
          <select
            value={status}
            onChange={(e) => {
              setCursors([]);
              const value = (e.currentTarget as HTMLSelectElement).value;
              navigate(href("sessions", { tenant, status: value === "all" ? "all" : null }), true);
            }}
          >
            <option value="open">open sessions</option>
            <option value="all">all sessions</option>
          </select>
        </label>
      </div>
      <ErrorNote error={sessions.error} context="Could not read the sessions" />
      {list && list.length === 0 ? (
        <p class="empty">
          {status === "open" ? "No open sessions." : "No sessions."}
          {cursors.length > 0 ? " This is past the last page." : ""}
        </p>
      ) : null}
      {list && list.length > 0 ? (
        <div class="table-wrap">
          <table>
            <caption class="visually-hidden">
              {status === "open" ? "Open sessions" : "Sessions"} of {tenant}, newest first
            </caption>
            <thead>
              <tr>
                <th scope="col">Session</th>
                <th scope="col">Owner</th>
                <th scope="col">Status</th>
                <th scope="col">Root budget</th>
                <th scope="col" class="num">Branches (active)</th>
                <th scope="col">Opened</th>
                <th scope="col">Last activity</th>
              </tr>
            </thead>
            <tbody>
              {list.map((s) => (
                <tr key={s.session_id}>
                  <th scope="row">
                    <Link
                      class="mono"
                      href={href("session", { tenant, id: s.session_id })}
                    >
                      {s.session_id}
                    </Link>
                  </th>
                  <td>{s.owner}</td>
                  <td>
                    <Status status={s.status} />
                  </td>
                  <td class="budget-cell">
                    <BudgetBar budget={s.budget} label={`Root budget of ${s.session_id}`} />
                  </td>
                  <td class="num">
                    {count(s.branches)} ({count(s.active_branches)})
                  </td>
                  <td>
                    <time dateTime={s.created_at} title={s.created_at}>
                      {clock(s.created_at)}
                    </time>
                  </td>
                  <td>
                    <time dateTime={s.last_activity_at} title={s.last_activity_at}>
                      {ago(s.last_activity_at, now)}
                    </time>
                  </td>
                </tr>
              ))}
            </tbody>
          </table>
        </div>
      ) : null}
      <div class="pager">
        {cursors.length > 0 ? (
          <button type="button" onClick={() => setCursors([])}>
            First page
          </button>
        ) : null}
        {cursors.length > 0 ? (
          <button type="button" onClick={() => setCursors(cursors.slice(0, -1))}>
            Previous page
          </button>
        ) : null}
        {next ? (
          <button type="button" onClick={() => setCursors([...cursors, next])}>
            Next page
          </button>
        ) : null}
      </div>
    </>
  );
}
