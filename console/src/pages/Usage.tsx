// What a tenant used over a span of days, per day, upstream or model: a
// chart of the tokens, the same numbers as a table, and every figure of the
// report with its total, including what folding saved. Read again every
// 5 s: each replica writes its usage every second.

import { useEffect, useState } from "preact/hooks";

import { admin, type GroupBy, type UsageReport, type UsageRow } from "../api";
import { BarChart, type Group, type Series } from "../components/chart";
import { ErrorNote, Freshness, Link, TenantCrumbs, TenantNav } from "../components/ui";
import { usePoll } from "../poll";
import { href, navigate } from "../router";
import { serverNow, count } from "../time";
import type { PageProps } from "./page";
import { PageHeading } from "./page";

const PERIOD = 5000;
const DAY_MS = 86_400_000;
const GROUPINGS: GroupBy[] = ["day", "upstream", "model"];

/** A UTC day as YYYY-MM-DD. */
function isoDay(ms: number): string {
  return new Date(ms).toISOString().slice(0, 10);
}

function dayMs(day: string): number {
  return Date.parse(`${day}T00:00:00Z`);
}

function isDay(text: string | null): text is string {
  return text !== null && /^\d{4}-\d{2}-\d{2}$/.test(text) && !Number.isNaN(dayMs(text));
}

const spentIn = (r: UsageRow) => r.branch_tokens_in + r.branch_tokens_out;
const spentOutside = (r: UsageRow) => r.outside_tokens_in + r.outside_tokens_out;
const spentModel = (r: UsageRow) => r.model_input_tokens + r.model_output_tokens;
const spent = (r: UsageRow) => spentIn(r) + spentOutside(r) + spentModel(r);

const SERIES: { series: Series; value: (r: UsageRow) => number; groupings: GroupBy[] }[] = [
  {
    series: { key: "branch", label: "Upstream calls in branches", short: "In branches" },
    value: spentIn,
    groupings: ["day", "upstream"],
  },
  {
    series: { key: "outside", label: "Upstream calls outside branches", short: "Outside branches" },
    value: spentOutside,
    groupings: ["day", "upstream"],
  },
  {
    series: { key: "model", label: "Model calls", short: "Model calls" },
    value: spentModel,
    groupings: ["day", "model"],
  },
];
const RETURNED: Series = { key: "returned", label: "Returned into callers' context", short: "Returned" };

function emptyRow(key: string): UsageRow {
  return {
    key,
    branch_calls: 0,
    branch_tokens_in: 0,
    branch_tokens_out: 0,
    outside_calls: 0,
    outside_tokens_in: 0,
    outside_tokens_out: 0,
    model_calls: 0,
    model_input_tokens: 0,
    model_output_tokens: 0,
    returns: 0,
    tokens_folded: 0,
    tokens_returned: 0,
    tokens_saved: 0,
  };
}

/** The report's rows; by day, every day of the span, those without usage as zeros. */
function chartRows(report: UsageReport): UsageRow[] {
  if (report.group_by !== "day") return report.rows;
  const byDay = new Map(report.rows.map((r) => [r.key, r]));
  const rows: UsageRow[] = [];
  const last = dayMs(report.to);
  for (let at = dayMs(report.from); at <= last && rows.length < 400; at += DAY_MS) {
    const key = isoDay(at);
    rows.push(byDay.get(key) ?? emptyRow(key));
  }
  return rows;
}

function axisLabel(key: string, groupBy: GroupBy): string {
  if (groupBy === "day") {
    return new Date(dayMs(key)).toLocaleDateString("en-GB", { day: "numeric", month: "short", timeZone: "UTC" });
  }
  return key.length > 14 ? `${key.slice(0, 13)}…` : key;
}

const NOUN: Record<GroupBy, string> = { day: "day", upstream: "upstream", model: "model" };

function summary(report: UsageReport, series: typeof SERIES, rows: UsageRow[]): string {
  const t = report.total;
  const parts = series.map((s) => `${count(s.value(t))} by ${s.series.label.toLowerCase()}`);
  let text =
    `Tokens by ${NOUN[report.group_by]}, ${report.from} to ${report.to} (UTC): ` +
    `${count(spent(t))} spent (${parts.join(", ")})`;
  if (report.group_by === "day") {
    text +=
      `; ${count(t.tokens_returned)} returned into callers' context by ${count(t.returns)} ` +
      `${t.returns === 1 ? "return" : "returns"}, ${count(t.tokens_folded)} folded, ` +
      `${count(t.tokens_saved)} saved`;
  }
  const most = rows.reduce<UsageRow | undefined>((m, r) => (!m || spent(r) > spent(m) ? r : m), undefined);
  if (most && spent(most) > 0) {
    const which = report.group_by === "day" ? "The busiest day" : `The ${NOUN[report.group_by]} spending most`;
    text += `. ${which}: ${most.key}, ${count(spent(most))}`;
  }
  return `${text}.`;
}

/** The figures of a report, in column groups; the groups a grouping fills in. */
const COLUMNS: { group: string; groupings: GroupBy[]; fields: [keyof UsageRow, string][] }[] = [
  {
    group: "Upstream calls in branches",
    groupings: ["day", "upstream"],
    fields: [
      ["branch_calls", "Calls"],
      ["branch_tokens_in", "Tokens in"],
      ["branch_tokens_out", "Tokens out"],
    ],
  },
  {
    group: "Upstream calls outside branches",
    groupings: ["day", "upstream"],
    fields: [
      ["outside_calls", "Calls"],
      ["outside_tokens_in", "Tokens in"],
      ["outside_tokens_out", "Tokens out"],
    ],
  },
  {
    group: "Model calls",
    groupings: ["day", "model"],
    fields: [
      ["model_calls", "Calls"],
      ["model_input_tokens", "Input"],
      ["model_output_tokens", "Output"],
    ],
  },
  {
    group: "Folding (depth-1 branches that returned)",
    groupings: ["day"],
    fields: [
      ["returns", "Returns"],
      ["tokens_folded", "Tokens folded"],
      ["tokens_returned", "Tokens returned"],
      ["tokens_saved", "Tokens saved by folding"],
    ],
  },
];

function ReportTable(props: { report: UsageReport }) {
  const { report } = props;
  const columns = COLUMNS.filter((c) => c.groupings.includes(report.group_by));
  const cells = (row: UsageRow) =>
    columns.flatMap((c) =>
      c.fields.map(([field]) => (
        <td key={field} class="num" data-field={field}>
          {count(row[field] as number)}
        </td>
      )),
    );
  const noun = NOUN[report.group_by];
  return (
    <div class="table-wrap">
      <table class="usage-table">
        <caption class="visually-hidden">
          Usage of {report.tenant} by {noun}, {report.from} to {report.to}, with the total
        </caption>
        <colgroup>
          <col />
        </colgroup>
        {columns.map((c) => (
          <colgroup key={c.group} span={c.fields.length} class="usage-group" />
        ))}
        <thead>
          <tr>
            <td />
            {columns.map((c) => (
              <th key={c.group} scope="colgroup" colSpan={c.fields.length} class="group-head">
                {c.group}
              </th>
            ))}
          </tr>
          <tr>
            <th scope="col">{noun === "day" ? "Day (UTC)" : noun === "upstream" ? "Upstream" : "Model"}</th>
            {columns.flatMap((c) =>
              c.fields.map(([field, label]) => (
                <th key={field} scope="col" class="num">
                  {label}
                </th>
              )),
            )}
          </tr>
        </thead>
        <tbody>
          {report.rows.map((row) => (
            <tr key={row.key}>
              <th scope="row" class={noun === "day" ? "mono" : "wrap"}>
                {row.key}
              </th>
              {cells(row)}
            </tr>
          ))}
        </tbody>
        <tfoot>
          <tr class="total">
            <th scope="row">Total</th>
            {cells(report.total)}
          </tr>
        </tfoot>
      </table>
    </div>
  );
}

function Totals(props: { report: UsageReport }) {
  const t = props.report.total;
  const byDay = props.report.group_by === "day";
  const tiles: [string, number, string?][] = [
    ["Tokens spent", spent(t), "counted towards quotas"],
    ...(byDay
      ? ([
          ["Returns", t.returns, "depth-1 branches"],
          ["Tokens folded", t.tokens_folded, "kept out of callers' context"],
          ["Tokens returned", t.tokens_returned, "their findings"],
          ["Tokens saved by folding", t.tokens_saved, "folded minus returned"],
        ] as [string, number, string][])
      : []),
  ];
  return (
    <dl class="totals">
      {tiles.map(([name, value, note]) => (
        <div key={name} class={name === "Tokens saved by folding" ? "tile tile-saved" : "tile"}>
          <dt>{name}</dt>
          <dd>
            <span class="tile-value">{count(value)}</span>
            {note ? <span class="tile-note">{note}</span> : null}
          </dd>
        </div>
      ))}
    </dl>
  );
}

export function Usage({ token, location }: PageProps) {
  const tenant = location.params.get("tenant") ?? "";
  const fromParam = location.params.get("from");
  const toParam = location.params.get("to");
  const groupParam = location.params.get("group_by");
  const groupBy: GroupBy = GROUPINGS.includes(groupParam as GroupBy) ? (groupParam as GroupBy) : "day";
  const from = isDay(fromParam) ? fromParam : undefined;
  const to = isDay(toParam) ? toParam : undefined;

  const usage = usePoll(
    (signal) => admin.usage(token, tenant, { from, to, group_by: groupBy }, signal),
    `usage ${tenant} ${from ?? ""} ${to ?? ""} ${groupBy}`,
    PERIOD,
  );

  // The form: the span and grouping shown, until changed and applied.
  const defaults = () => {
    const today = serverNow();
    const end = to ?? isoDay(today);
    return { from: from ?? isoDay(dayMs(end) - 6 * DAY_MS), to: end, groupBy };
  };
  const [form, setForm] = useState(defaults);
  useEffect(() => setForm(defaults()), [from, to, groupBy]);

  const report = usage.data;
  const series = SERIES.filter((s) => s.groupings.includes(groupBy));
  const rows = report ? chartRows(report) : [];
  const groups: Group[] = rows.map((r) => ({
    key: r.key,
    label: axisLabel(r.key, groupBy),
    values: series.map((s) => s.value(r)),
    beside: groupBy === "day" ? r.tokens_returned : undefined,
  }));

  const preset = (days: number | "month") => {
    const today = isoDay(serverNow());
    const start = days === "month" ? `${today.slice(0, 8)}01` : isoDay(dayMs(today) - (days - 1) * DAY_MS);
    return href("usage", { tenant, from: start, to: today, group_by: groupBy === "day" ? null : groupBy });
  };

  return (
    <>
      <TenantCrumbs tenant={tenant} page="usage" />
      <PageHeading title={<>Usage of {tenant}</>}>
        <Freshness updatedAt={usage.updatedAt} periodMs={PERIOD} failing={Boolean(usage.error)} />
      </PageHeading>
      <TenantNav tenant={tenant} current="usage" />
      <form
        class="toolbar span-form"
        aria-label="Span and grouping"
        onSubmit={(e) => {
          e.preventDefault();
          navigate(
            href("usage", {
              tenant,
              from: form.from || null,
              to: form.to || null,
              group_by: form.groupBy === "day" ? null : form.groupBy,
            }),
          );
        }}
      >
        <label>
          From{" "}
          <input
            type="date"
            name="from"
            value={form.from}
            required
            onInput={(e) => setForm({ ...form, from: (e.currentTarget as HTMLInputElement).value })}
          />
        </label>
        <label>
          to{" "}
          <input
            type="date"
            name="to"
            value={form.to}
            required
            onInput={(e) => setForm({ ...form, to: (e.currentTarget as HTMLInputElement).value })}
          />
        </label>
        <span class="muted">(UTC days, both included; at most 366)</span>
        <label>
          Group by{" "}
          <select
            name="group_by"
            value={form.groupBy}
            onChange={(e) => setForm({ ...form, groupBy: (e.currentTarget as HTMLSelectElement).value as GroupBy })}
          >
            <option value="day">day</option>
            <option value="upstream">upstream</option>
            <option value="model">model</option>
          </select>
        </label>
        <button type="submit" class="primary">
          Show
        </button>
        <span class="presets">
          <Link href={preset(7)}>Last 7 days</Link>
          <Link href={preset(30)}>Last 30 days</Link>
          <Link href={preset("month")}>This month</Link>
        </span>
      </form>
      <ErrorNote error={usage.error} context="Could not read the usage" />
      {report ? (
        <>
          <Totals report={report} />
          <section class="panel chart-panel" aria-labelledby="chart-title">
            <h2 id="chart-title">
              Tokens by {NOUN[report.group_by]}{" "}
              <span class="muted chart-span">
                {report.from} to {report.to}
              </span>
            </h2>
            <div class="chart-layout">
              <BarChart
                label={summary(report, series, rows)}
                stacked={series.map((s) => s.series)}
                beside={groupBy === "day" ? RETURNED : undefined}
                groups={groups}
              />
              <div
                class="table-wrap chart-table"
                role="region"
                aria-label="The chart's numbers"
                tabIndex={0}
              >
                <table class="compact-rows">
                  <caption class="visually-hidden">The chart's numbers: tokens by {NOUN[report.group_by]}</caption>
                  <thead>
                    <tr>
                      <th scope="col">{report.group_by === "day" ? "Day (UTC)" : report.group_by === "upstream" ? "Upstream" : "Model"}</th>
                      {series.map((s) => (
                        <th key={s.series.key} scope="col" class="num" title={s.series.label}>
                          {s.series.short}
                        </th>
                      ))}
                      {groupBy === "day" ? (
                        <th scope="col" class="num" title={RETURNED.label}>
                          {RETURNED.short}
                        </th>
                      ) : null}
                    </tr>
                  </thead>
                  <tbody>
                    {rows.length === 0 ? (
                      <tr>
                        <td colSpan={series.length + 2} class="empty">
                          No usage in this span.
                        </td>
                      </tr>
                    ) : null}
                    {rows.map((r) => (
                      <tr key={r.key}>
                        <th scope="row" class={groupBy === "day" ? "mono" : "wrap"}>
                          {r.key}
                        </th>
                        {series.map((s) => (
                          <td key={s.series.key} class="num">
                            {count(s.value(r))}
                          </td>
                        ))}
                        {groupBy === "day" ? <td class="num">{count(r.tokens_returned)}</td> : null}
                      </tr>
                    ))}
                  </tbody>
                </table>
              </div>
            </div>
          </section>
          <h2 class="section-title">Every figure, by {NOUN[report.group_by]}</h2>
          {report.group_by !== "day" ? (
            <p class="hint">
              By {report.group_by}, only the {report.group_by === "upstream" ? "upstream call" : "model"}{" "}
              figures are kept; folding (returns, tokens saved) is reported by day.
            </p>
          ) : null}
          {report.rows.length === 0 ? (
            <p class="empty">
              No usage recorded from {report.from} to {report.to}.
            </p>
          ) : (
            <ReportTable report={report} />
          )}
        </>
      ) : null}
    </>
  );
}
