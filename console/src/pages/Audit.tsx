import { useState } from "preact/hooks";

import { admin, type AuditEntry } from "../api";
import { ErrorNote, Freshness, Link, TenantNav } from "../components/ui";
import { usePoll } from "../poll";
import { href, navigate } from "../router";
import { clock } from "../time";
import type { PageProps } from "./page";
import { PageHeading } from "./page";

const PERIOD = 5000;

function detailText(action: string, detail: unknown): string {
  if (detail && typeof detail === "object" && !Array.isArray(detail)) {
    if (action === "limits.update" && Object.keys(detail).length === 0) return "every override removed";
    return Object.entries(detail as Record<string, unknown>)
      .map(([k, v]) => `${k}: ${typeof v === "string" ? v : JSON.stringify(v)}`)
      .join(", ");
  }
  return JSON.stringify(detail);
}

/** The changed branch or session, linked to its session when it has one. */
function Target({ entry }: { entry: AuditEntry }) {
  const detail = (entry.detail ?? {}) as { session_id?: unknown };
  if (entry.tenant && entry.action.startsWith("session.")) {
    return <Link href={href("session", { tenant: entry.tenant, id: entry.target })}>{entry.target}</Link>;
  }
  if (entry.tenant && entry.action.startsWith("branch.") && typeof detail.session_id === "string") {
    const to = href("session", { tenant: entry.tenant, id: detail.session_id, branch: entry.target });
    return <Link href={to}>{entry.target}</Link>;
  }
  if (entry.tenant && entry.action.startsWith("limits.")) {
    return <Link href={href("limits", { tenant: entry.tenant })}>{entry.target}</Link>;
  }
  return <>{entry.target}</>;
}

export function Audit({ token, identity, location }: PageProps) {
  const tenant = location.params.get("tenant") ?? undefined;
  const [cursors, setCursors] = useState<string[]>([]);
  const before = cursors[cursors.length - 1];
  const audit = usePoll(
    (signal) => admin.audit(token, tenant, before, signal),
    `audit ${tenant ?? ""} ${before ?? ""}`,
    PERIOD,
  );
  const [filter, setFilter] = useState(tenant ?? "");
  const entries = audit.data?.entries;
  const next = audit.data?.next;
  const deployment = identity.scopes.includes("foldgate:admin");

  return (
    <>
      <PageHeading title={tenant ? <>Audit log of {tenant}</> : "Audit log"}>
        <Freshness updatedAt={audit.updatedAt} periodMs={PERIOD} failing={Boolean(audit.error)} />
      </PageHeading>
      {tenant ? <TenantNav tenant={tenant} current="audit" /> : null}
      <p class="muted">Changes made through the admin API, newest first.</p>
      {deployment ? (
        <form
          class="toolbar"
          role="search"
          onSubmit={(e) => {
            e.preventDefault();
            setCursors([]);
            navigate(href("audit", { tenant: filter.trim() || null }));
          }}
        >
          <label for="audit-tenant">Tenant</label>
          <input
            id="audit-tenant"
            type="text"
            value={filter}
            placeholder="every tenant"
            spellcheck={false}
            onInput={(e) => setFilter((e.currentTarget as HTMLInputElement).value)}
          />
          <button type="submit">Show</button>
          {tenant ? <Link href={href("audit")}>Every tenant</Link> : null}
        </form>
      ) : null}
      <ErrorNote error={audit.error} context="Could not read the audit log" />
      {entries && entries.length === 0 ? <p class="empty">No changes recorded.</p> : null}
      {entries && entries.length > 0 ? (
        <div class="table-wrap">
          <table class="audit">
            <caption class="visually-hidden">Audit entries, newest first</caption>
            <thead>
              <tr>
                <th scope="col">When</th>
                <th scope="col">Who</th>
                <th scope="col">Tenant</th>
                <th scope="col">Action</th>
                <th scope="col">Target</th>
                <th scope="col">Detail</th>
              </tr>
            </thead>
            <tbody>
              {entries.map((e) => (
                <tr key={e.id}>
                  <td>
                    <time dateTime={e.at} title={e.at}>
                      {clock(e.at)}
                    </time>
                  </td>
                  <td>
                    {e.actor.subject} <span class="muted">({e.actor.tenant})</span>
                  </td>
                  <td>{e.tenant ?? "—"}</td>
                  <td>
                    <code>{e.action}</code>
                  </td>
                  <td class="mono wrap">
                    <Target entry={e} />
                  </td>
                  <td class="wrap">{detailText(e.action, e.detail)}</td>
                </tr>
              ))}
            </tbody>
          </table>
        </div>
      ) : null}
      <div class="pager">
        {cursors.length > 0 ? (
          <button type="button" onClick={() => setCursors([])}>
            Newest
          </button>
        ) : null}
        {cursors.length > 0 ? (
          <button type="button" onClick={() => setCursors(cursors.slice(0, -1))}>
            Newer
          </button>
        ) : null}
        {next ? (
          <button type="button" onClick={() => setCursors([...cursors, next])}>
            Older
          </button>
        ) : null}
      </div>
    </>
  );
}
