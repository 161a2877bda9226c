// A tenant's limits: what its branches are held to (the deployment's
// settings with the tenant's overrides), its token quotas with what it spent
// towards them, and who last changed them. A deployment admin changes the
// overrides here; a tenant admin reads them.

import { useEffect, useLayoutEffect, useRef, useState } from "preact/hooks";

import { ApiError, admin, type LimitOverrides, type LimitsView, type ToolListing } from "../api";
import {
  ConfirmButton,
  ErrorNote,
  Freshness,
  QuotaBar,
  TenantCrumbs,
  TenantNav,
} from "../components/ui";
import { usePoll } from "../poll";
import { clock, count } from "../time";
import type { PageProps } from "./page";
import { PageHeading } from "./page";

const PERIOD = 5000;

type NumberName =
  | "max_active_per_session"
  | "max_active_per_tenant"
  | "creations_per_minute"
  | "max_depth"
  | "default_budget"
  | "max_budget"
  | "session_budget"
  | "tokens_per_day"
  | "tokens_per_month";
type ListName = "models" | "upstreams";
type FieldName = NumberName | ListName | "tool_listing";

interface NumberField {
  name: NumberName;
  /** In the form, beside its field. */
  label: string;
  /** In the table of effective limits. */
  title: string;
  /** What it governs, in a few words. */
  about: string;
}

/** The numeric overrides, in the fieldsets the form groups them in. */
const GROUPS: { legend: string; fields: NumberField[] }[] = [
  {
    legend: "Branches",
    fields: [
      {
        name: "max_active_per_session",
        label: "Active per session",
        title: "Active branches per session",
        about: "branches at once in one session",
      },
      {
        name: "max_active_per_tenant",
        label: "Active per tenant",
        title: "Active branches per tenant",
        about: "branches at once across its sessions",
      },
      {
        name: "creations_per_minute",
        label: "Creations per minute",
        title: "Creations per minute",
        about: "branches one session may create",
      },
      {
        name: "max_depth",
        label: "Max depth",
        title: "Max depth",
        about: "a session's first branch is depth 1",
      },
    ],
  },
  {
    legend: "Budgets, in tokens",
    fields: [
      {
        name: "default_budget",
        label: "Default budget",
        title: "Default budget",
        about: "of a branch whose create names none",
      },
      {
        name: "max_budget",
        label: "Max budget",
        title: "Max budget",
        about: "larger requests are capped to this",
      },
      {
        name: "session_budget",
        label: "Session budget",
        title: "Session budget",
        about: "the root pool of each session",
      },
    ],
  },
  {
    legend: "Token quotas",
    fields: [
      {
        name: "tokens_per_day",
        label: "Tokens per day",
        title: "Tokens per day",
        about: "per UTC day",
      },
      {
        name: "tokens_per_month",
        label: "Tokens per month",
        title: "Tokens per month",
        about: "per calendar month (UTC)",
      },
    ],
  },
];

const NUMBER_FIELDS: NumberField[] = GROUPS.flatMap((g) => g.fields);
const QUOTAS: NumberName[] = ["tokens_per_day", "tokens_per_month"];
const BUDGETS: NumberName[] = ["default_budget", "max_budget", "session_budget"];

const LISTS: { name: ListName; label: string; noun: string; none: string }[] = [
  {
    name: "models",
    label: "Models",
    noun: "model",
    none: "No model: gateway-run branches refused",
  },
  {
    name: "upstreams",
    label: "Upstreams",
    noun: "upstream",
    none: "No upstream: every upstream's tools hidden",
  },
];

/** How each tool listing reads, in the table and the form. */
const LISTINGS: Record<ToolListing, string> = {
  full: "full: every upstream tool",
  search: "search: tool_search and the tools used",
};

/** The form as typed: numbers as text, lists as comma-separated names, the listing ("" keeps the deployment's). */
type Draft = Record<NumberName, string> &
  Record<ListName, string> &
  Record<`${ListName}None`, boolean> & { tool_listing: "" | ToolListing };

function draftOf(o: LimitOverrides): Draft {
  const draft = {} as Draft;
  for (const f of NUMBER_FIELDS) draft[f.name] = o[f.name] === undefined ? "" : String(o[f.name]);
  for (const l of LISTS) {
    const list = o[l.name];
    draft[l.name] = list ? list.join(", ") : "";
    draft[`${l.name}None`] = list !== undefined && list.length === 0;
  }
  draft.tool_listing = o.tool_listing ?? "";
  return draft;
}

/**
 * The overrides a draft stands for, or what is wrong with it. Only what
 * cannot be sent is checked here; the gateway checks the rest (zeros,
 * budgets out of order) and its message is shown.
 */
function overridesOf(draft: Draft): { overrides?: LimitOverrides; errors: Partial<Record<FieldName, string>> } {
  const overrides: LimitOverrides = {};
  const errors: Partial<Record<FieldName, string>> = {};
  for (const f of NUMBER_FIELDS) {
    const text = draft[f.name].replace(/[\s,_]/g, "");
    if (text === "") continue;
    const value = Number(text);
    if (!/^\d+$/.test(text) || !Number.isSafeInteger(value)) {
      errors[f.name] = "Enter a whole number, or leave it empty.";
      continue;
    }
    overrides[f.name] = value;
  }
  for (const l of LISTS) {
    if (draft[`${l.name}None`]) {
      overrides[l.name] = [];
      continue;
    }
    const names = draft[l.name]
      .split(",")
      .map((n) => n.trim())
      .filter((n) => n !== "");
    if (names.length > 0) overrides[l.name] = [...new Set(names)];
  }
  if (draft.tool_listing !== "") overrides.tool_listing = draft.tool_listing;
  return Object.keys(errors).length > 0 ? { errors } : { overrides, errors };
}

/** The fields a refusal names (`max_depth` must be at least 1; `budget` …). */
function fieldsOf(error: ApiError): FieldName[] {
  const named = /^`([a-z_]+)`/.exec(error.message)?.[1];
  if (!named) return [];
  // The budgets are checked together; the message names those out of order.
  if (named === "budget") {
    const mentioned = BUDGETS.filter((b) => error.message.includes(`${b} (`));
    return mentioned.length > 0 ? mentioned : BUDGETS;
  }
  const known: string[] = [...NUMBER_FIELDS.map((f) => f.name), ...LISTS.map((l) => l.name), "tool_listing"];
  return known.includes(named) ? [named as FieldName] : [];
}

function listText(list: string[] | null): string {
  if (list === null) return "all configured";
  if (list.length === 0) return "none";
  return list.join(", ");
}

/** Where an effective value comes from, in words. */
function Source(props: { overridden: boolean }) {
  return props.overridden ? (
    <span class="source source-override">set for this tenant</span>
  ) : (
    <span class="source">deployment's</span>
  );
}

function Effective(props: { view: LimitsView }) {
  const { view } = props;
  const { effective, overrides } = view;
  const rows: { name: FieldName; label: string; value: string }[] = [
    ...NUMBER_FIELDS.map((f) => {
      const value = effective[f.name];
      return {
        name: f.name,
        label: f.title,
        value: value === null ? "no quota" : count(value),
      };
    }),
    ...LISTS.map((l) => ({ name: l.name, label: l.label, value: listText(effective[l.name]) })),
    { name: "tool_listing", label: "Tool listing", value: LISTINGS[effective.tool_listing] },
  ];
  return (
    <section class="panel" aria-labelledby="effective-title">
      <h2 id="effective-title">Effective limits</h2>
      <table class="limits-table">
        <caption class="visually-hidden">
          The limits {view.tenant}'s branches are held to, and whether each is set for this tenant
          or the deployment's
        </caption>
        <thead>
          <tr>
            <th scope="col">Limit</th>
            <th scope="col">API field</th>
            <th scope="col" class="num">
              Value
            </th>
            <th scope="col">From</th>
          </tr>
        </thead>
        <tbody>
          {rows.map((r) => (
            <tr key={r.name} data-limit={r.name}>
              <th scope="row">{r.label}</th>
              <td>
                <code class="field-name">{r.name}</code>
              </td>
              <td
                class={r.name === "models" || r.name === "upstreams" || r.name === "tool_listing" ? "wrap" : "num"}
                data-col="value"
              >
                {r.value}
              </td>
              <td data-col="from">
                <Source overridden={overrides[r.name] !== undefined} />
              </td>
            </tr>
          ))}
        </tbody>
      </table>
      <p class="hint table-note">
        <i>all configured</i>: every model or upstream configured for {view.tenant}; <i>none</i>: an
        empty list, none of them.
      </p>
    </section>
  );
}

function Quotas(props: { view: LimitsView }) {
  const { view } = props;
  return (
    <section class="panel quotas" aria-labelledby="quotas-title">
      <h2 id="quotas-title">Token quotas</h2>
      <div class="quota-row">
        <span class="quota-label">Today (UTC)</span>
        <QuotaBar label="Spent today" spent={view.spent_today} quota={view.effective.tokens_per_day} />
      </div>
      <div class="quota-row">
        <span class="quota-label">This month</span>
        <QuotaBar
          label="Spent this month"
          spent={view.spent_this_month}
          quota={view.effective.tokens_per_month}
        />
      </div>
      <p class="hint">
        Upstream calls' tokens inside and outside branches, and what model providers billed for
        gateway-run branches, as every replica has written them (each writes every second).
      </p>
    </section>
  );
}

function LastChange(props: { view: LimitsView }) {
  const { view } = props;
  const none = Object.keys(view.overrides).length === 0;
  if (!view.updated_at) {
    return <p class="last-change">Never changed: {view.tenant} has the deployment's settings.</p>;
  }
  return (
    <p class="last-change">
      {none ? "Overrides cleared" : "Last changed"}{" "}
      <time dateTime={view.updated_at} title={view.updated_at}>
        {clock(view.updated_at)}
      </time>{" "}
      by <b>{view.updated_by?.subject ?? "?"}</b>
      {view.updated_by ? <span class="muted"> ({view.updated_by.tenant})</span> : null}.
      {none ? ` ${view.tenant} has the deployment's settings.` : ""}
    </p>
  );
}

interface Outcome {
  text: string;
  error: boolean;
  /** The fields the refusal names. */
  fields: FieldName[];
  id: number;
}

function EditForm(props: {
  token: string;
  view: LimitsView;
  onSaved: (view: LimitsView) => void;
}) {
  const { token, view } = props;
  const tenant = view.tenant;
  // What the draft started from; a read showing other overrides replaces an
  // untouched draft, and is pointed out beside an edited one.
  const [base, setBase] = useState<LimitOverrides>(view.overrides);
  const [draft, setDraft] = useState<Draft>(() => draftOf(view.overrides));
  const [errors, setErrors] = useState<Partial<Record<FieldName, string>>>({});
  const [outcome, setOutcome] = useState<Outcome | null>(null);
  const [busy, setBusy] = useState(false);
  const outcomeRef = useRef<HTMLParagraphElement>(null);
  const formRef = useRef<HTMLFormElement>(null);

  const edited = JSON.stringify(draft) !== JSON.stringify(draftOf(base));
  const changedElsewhere = JSON.stringify(base) !== JSON.stringify(view.overrides);
  useEffect(() => {
    if (changedElsewhere && !edited) {
      setBase(view.overrides);
      setDraft(draftOf(view.overrides));
    }
  }, [JSON.stringify(view.overrides)]);

  useLayoutEffect(() => {
    if (outcome) outcomeRef.current?.focus();
  }, [outcome?.id]);

  const set = (name: keyof Draft, value: string | boolean) => {
    setDraft((d) => ({ ...d, [name]: value }));
    if (errors[name as FieldName]) setErrors((e) => ({ ...e, [name]: undefined }));
  };

  const put = async (overrides: LimitOverrides, done: string) => {
    setBusy(true);
    try {
      const saved = await admin.putLimits(token, tenant, overrides);
      setBase(saved.overrides);
      setDraft(draftOf(saved.overrides));
      setErrors({});
      setOutcome({ text: done, error: false, fields: [], id: Date.now() });
      props.onSaved(saved);
    } catch (e) {
      const error = e instanceof ApiError ? e : new ApiError(0, "client", String(e));
      setOutcome({
        text: `Not saved: ${error.describe()}. Nothing was changed.`,
        error: true,
        fields: fieldsOf(error),
        id: Date.now(),
      });
    } finally {
      setBusy(false);
    }
  };

  const submit = (event: Event) => {
    event.preventDefault();
    const { overrides, errors: found } = overridesOf(draft);
    setErrors(found);
    if (!overrides) {
      setOutcome(null);
      const first = NUMBER_FIELDS.find((f) => found[f.name]);
      if (first) formRef.current?.querySelector<HTMLInputElement>(`#limit-${first.name}`)?.focus();
      return;
    }
    void put(overrides, `Saved. ${tenant}'s limits apply on every replica within about a second.`);
  };

  const describedBy = (name: FieldName, hint: string) =>
    [
      hint,
      errors[name] ? `limit-${name}-error` : null,
      outcome?.error && outcome.fields.includes(name) ? "limits-outcome" : null,
    ]
      .filter(Boolean)
      .join(" ");
  const invalid = (name: FieldName) =>
    Boolean(errors[name]) || Boolean(outcome?.error && outcome.fields.includes(name));

  return (
    <form
      ref={formRef}
      class="panel limits-form"
      aria-labelledby="edit-title"
      aria-describedby="edit-hint"
      noValidate
      onSubmit={submit}
    >
      <h2 id="edit-title">Change {tenant}'s overrides</h2>
      <p class="hint" id="edit-hint">
        Leave a field empty to keep the deployment's setting. Saving replaces every override with
        what the form holds.
      </p>
      {GROUPS.map((group) => (
        <fieldset key={group.legend}>
          <legend>{group.legend}</legend>
          <div class="fields-grid">
            {group.fields.map((f) => {
              const id = `limit-${f.name}`;
              const known = view.overrides[f.name] === undefined ? view.effective[f.name] : undefined;
              const quota = QUOTAS.includes(f.name);
              const fallback = quota
                ? "empty: no quota"
                : known !== undefined && known !== null
                  ? `empty: the deployment's ${count(known)}`
                  : "empty: the deployment's";
              return (
                <div class="field" key={f.name}>
                  <label for={id}>{f.label}</label>
                  <input
                    id={id}
                    name={f.name}
                    type="text"
                    inputMode="numeric"
                    autoComplete="off"
                    spellcheck={false}
                    value={draft[f.name]}
                    aria-invalid={invalid(f.name) ? true : undefined}
                    aria-describedby={describedBy(f.name, `${id}-hint`)}
                    onInput={(e) => set(f.name, (e.currentTarget as HTMLInputElement).value)}
                  />
                  <span class="hint field-hint" id={`${id}-hint`}>
                    {f.about}; {fallback}
                  </span>
                  {errors[f.name] ? (
                    <span class="field-error" id={`${id}-error`}>
                      {errors[f.name]}
                    </span>
                  ) : null}
                </div>
              );
            })}
          </div>
        </fieldset>
      ))}
      <fieldset>
        <legend>Models and upstreams it may use</legend>
        <div class="fields-grid lists">
          {LISTS.map((l) => {
            const id = `limit-${l.name}`;
            const none = draft[`${l.name}None`];
            return (
              <div class="field" key={l.name}>
                <label for={id}>{l.label}</label>
                <input
                  id={id}
                  name={l.name}
                  type="text"
                  autoComplete="off"
                  spellcheck={false}
                  value={none ? "" : draft[l.name]}
                  disabled={none}
                  placeholder={none ? "none" : undefined}
                  aria-invalid={invalid(l.name) ? true : undefined}
                  aria-describedby={describedBy(l.name, `${id}-hint`)}
                  onInput={(e) => set(l.name, (e.currentTarget as HTMLInputElement).value)}
                />
                <span class="hint field-hint" id={`${id}-hint`}>
                  names separated by commas; empty: every {l.noun} configured for {tenant}
                </span>
                <label class="check">
                  <input
                    type="checkbox"
                    name={`${l.name}-none`}
                    checked={none}
                    onChange={(e) => set(`${l.name}None`, (e.currentTarget as HTMLInputElement).checked)}
                  />{" "}
                  {l.none}
                </label>
              </div>
            );
          })}
        </div>
      </fieldset>
      <fieldset>
        <legend>Upstream tools in its agents' tool list</legend>
        <div class="field">
          <label for="limit-tool_listing">Tool listing</label>
          <select
            id="limit-tool_listing"
            name="tool_listing"
            value={draft.tool_listing}
            aria-invalid={invalid("tool_listing") ? true : undefined}
            aria-describedby={describedBy("tool_listing", "limit-tool_listing-hint")}
            onChange={(e) => set("tool_listing", (e.currentTarget as HTMLSelectElement).value)}
          >
            <option value="">
              the deployment's ({view.overrides.tool_listing === undefined ? view.effective.tool_listing : "as configured"})
            </option>
            <option value="full">{LISTINGS.full}</option>
            <option value="search">{LISTINGS.search}</option>
          </select>
          <span class="hint field-hint" id="limit-tool_listing-hint">
            search lists tool_search instead of every tool; any tool it may call is called by name either way
          </span>
        </div>
      </fieldset>
      {changedElsewhere && edited ? (
        <p class="note note-warn">
          The overrides were changed elsewhere since you began editing. Saving replaces them with
          this form; <i>Reset form</i> shows them.
        </p>
      ) : null}
      {outcome ? (
        <p
          ref={outcomeRef}
          id="limits-outcome"
          tabIndex={-1}
          class={`note ${outcome.error ? "note-error" : "note-ok"}`}
          role={outcome.error ? "alert" : "status"}
        >
          {outcome.text}
        </p>
      ) : null}
      <div class="form-actions">
        <button type="submit" class="primary" disabled={busy}>
          {busy ? "Saving…" : "Save"}
        </button>
        <button
          type="button"
          disabled={busy || !edited}
          onClick={() => {
            setBase(view.overrides);
            setDraft(draftOf(view.overrides));
            setErrors({});
            setOutcome(null);
          }}
        >
          Reset form
        </button>
        <span class="form-actions-end">
          <ConfirmButton
            label="Clear all overrides"
            question={`Remove every override of ${tenant}?`}
            confirmLabel="Yes, clear them"
            busyLabel="Clearing…"
            onConfirm={() =>
              put({}, `Cleared. ${tenant} has the deployment's settings again (on every replica within about a second).`)
            }
          />
        </span>
      </div>
    </form>
  );
}

export function Limits({ token, identity, location }: PageProps) {
  const tenant = location.params.get("tenant") ?? "";
  const limits = usePoll((signal) => admin.limits(token, tenant, signal), `limits ${tenant}`, PERIOD);
  // The answer to a save, shown until a later read replaces it.
  const [saved, setSaved] = useState<{ at: number; view: LimitsView } | null>(null);
  const view =
    saved && (!limits.updatedAt || saved.at >= limits.updatedAt) ? saved.view : limits.data;
  const deployment = identity.scopes.includes("foldgate:admin");

  return (
    <>
      <TenantCrumbs tenant={tenant} page="limits" />
      <PageHeading title={<>Limits of {tenant}</>}>
        <Freshness updatedAt={limits.updatedAt} periodMs={PERIOD} failing={Boolean(limits.error)} />
      </PageHeading>
      <TenantNav tenant={tenant} current="limits" />
      <ErrorNote error={limits.error} context="Could not read the limits" />
      {view ? (
        <>
          <LastChange view={view} />
          <div class="limits-layout">
            <div class="limits-read">
              <Quotas view={view} />
              <Effective view={view} />
            </div>
            {deployment ? (
              <EditForm
                key={tenant}
                token={token}
                view={view}
                onSaved={(v) => {
                  setSaved({ at: Date.now(), view: v });
                  limits.refresh();
                }}
              />
            ) : (
              <section class="panel read-only" aria-labelledby="read-only-title">
                <h2 id="read-only-title">Read only</h2>
                <p>
                  Only a deployment admin (a token with the scope <code>foldgate:admin</code>) may
                  change a tenant's limits: a tenant admin raising its own quota would make quotas
                  pointless. Ask the deployment's operators for a change.
                </p>
              </section>
            )}
          </div>
        </>
      ) : null}
    </>
  );
}
