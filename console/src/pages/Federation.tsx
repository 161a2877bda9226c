// The upstream MCP servers and model providers the deployment fronts, with
// how each is doing on the replica that answers. A deployment admin
// registers and removes them here (those of the configuration file are
// read-only); a tenant admin reads those serving its tenant.

import "./Federation.css";

import { useLayoutEffect, useRef, useState } from "preact/hooks";

import { ApiError } from "../api";
import { ConfirmButton, ErrorNote, Freshness, Notice } from "../components/ui";
import {
  federation,
  type ModelRegistration,
  type ModelView,
  NOT_LOADED,
  type Registered,
  type UpstreamRegistration,
  type UpstreamView,
} from "../federation";
import { usePoll } from "../poll";
import { clock, count } from "../time";
import type { PageProps } from "./page";
import { PageHeading } from "./page";

const PERIOD = 5000;

type NoticeState = { text: string; error: boolean; id: number } | null;

// --- status ---------------------------------------------------------------------------

type HealthKind = "up" | "down" | "waiting" | "idle";

/** A status in words, with a shape that differs for each kind: never colour alone. */
function Health(props: { kind: HealthKind; text: string }) {
  const { kind } = props;
  return (
    <span class={`health health-${kind}`}>
      <svg class="health-icon" viewBox="0 0 16 16" width="16" height="16" aria-hidden="true" focusable="false">
        {kind === "up" ? (
          <>
            <circle class="ic-solid" cx="8" cy="8" r="7.5" />
            <path class="ic-mark" d="M4.3 8.3l2.5 2.5 4.9-5.2" />
          </>
        ) : kind === "down" ? (
          <>
            <path class="ic-solid" d="M8 0.5 15.5 8 8 15.5 0.5 8Z" />
            <path class="ic-mark" d="M5.6 5.6l4.8 4.8M10.4 5.6l-4.8 4.8" />
          </>
        ) : kind === "waiting" ? (
          <circle class="ic-ring ic-dashed" cx="8" cy="8" r="6.25" />
        ) : (
          <circle class="ic-ring" cx="8" cy="8" r="6.25" />
        )}
      </svg>
      {props.text}
    </span>
  );
}

function upstreamHealth(u: UpstreamView): { kind: HealthKind; text: string } {
  if (u.up) return { kind: "up", text: "Up" };
  if (u.last_error === null || u.last_error === NOT_LOADED) return { kind: "waiting", text: "Starting" };
  return { kind: "down", text: "Down" };
}

function modelHealth(m: ModelView): { kind: HealthKind; text: string } {
  const h = m.health;
  if (!h) {
    return m.error === NOT_LOADED ? { kind: "waiting", text: "Starting" } : { kind: "down", text: "Unusable" };
  }
  if (h.attempts === 0) return { kind: "idle", text: "No calls yet" };
  const failedLast =
    h.last_error_at !== null && (h.last_ok_at === null || Date.parse(h.last_error_at) > Date.parse(h.last_ok_at));
  return failedLast ? { kind: "down", text: "Failing" } : { kind: "up", text: "OK" };
}

function Time(props: { at: string | null; none: string }) {
  if (!props.at) return <span class="muted">{props.none}</span>;
  return (
    <time dateTime={props.at} title={props.at}>
      {clock(props.at)}
    </time>
  );
}

function TenantList(props: { tenants: string[] | null }) {
  if (props.tenants === null) return <span class="muted">every tenant</span>;
  return <>{props.tenants.join(", ")}</>;
}

function SourceCell(props: { source: "config" | "api"; registered: Registered | null }) {
  if (props.source === "config" || !props.registered) {
    return (
      <>
        <span class="origin">configuration file</span>
        <span class="sub">read-only here</span>
      </>
    );
  }
  return (
    <>
      <span class="origin origin-api">admin API</span>
      <span class="sub">
        by <b>{props.registered.by}</b>, <Time at={props.registered.at} none="" />
      </span>
    </>
  );
}

function LastError(props: { text: string | null; at?: string | null }) {
  if (!props.text) return <span class="muted">none</span>;
  return (
    <>
      <span class="error-text">{props.text}</span>
      {props.at ? (
        <span class="sub">
          <Time at={props.at} none="" />
        </span>
      ) : null}
    </>
  );
}

/** Removes a registration, asking first; what happened goes to `notify`. */
function RemoveButton(props: {
  kind: "upstream" | "model";
  name: string;
  remove: () => Promise<void>;
  notify: (notice: NoticeState) => void;
  after: string;
}) {
  const { kind, name } = props;
  return (
    <ConfirmButton
      label={
        <>
          Remove<span class="visually-hidden"> the {kind} {name}</span>
        </>
      }
      question={`Remove ${name} from every replica?`}
      confirmLabel="Yes, remove it"
      busyLabel="Removing…"
      onConfirm={async () => {
        try {
          await props.remove();
          props.notify({ text: `Removed the ${kind} ${name}. ${props.after}`, error: false, id: Date.now() });
        } catch (e) {
          const error = e instanceof ApiError ? e : new ApiError(0, "client", String(e));
          props.notify({ text: `Not removed: ${error.describe()}`, error: true, id: Date.now() });
        }
      }}
    />
  );
}

// --- the lists --------------------------------------------------------------------------

function UpstreamTable(props: {
  list: UpstreamView[];
  deployment: boolean;
  token: string;
  notify: (notice: NoticeState) => void;
  onChanged: () => void;
}) {
  const { list, deployment } = props;
  return (
    <div class="table-wrap">
      <table class="federation-table">
        <caption class="visually-hidden">
          Upstream MCP servers with their status on the replica that answered
        </caption>
        <thead>
          <tr>
            <th scope="col">Upstream</th>
            <th scope="col">Status</th>
            <th scope="col" class="num">
              Tools offered
            </th>
            <th scope="col">Tenants served</th>
            <th scope="col">Last error</th>
            <th scope="col">Source</th>
            {deployment ? <th scope="col">Actions</th> : null}
          </tr>
        </thead>
        <tbody>
          {list.map((u) => {
            const health = upstreamHealth(u);
            return (
              <tr key={u.name} data-upstream={u.name}>
                <th scope="row">
                  <span class="entry-name">{u.name}</span>
                  <span class="sub mono wrap">{u.url}</span>
                  {u.headers.length > 0 ? (
                    <span class="sub">sends {u.headers.join(", ")}</span>
                  ) : null}
                </th>
                <td data-col="status">
                  <Health {...health} />
                </td>
                <td class="num" data-col="tools">
                  {count(u.tools)}
                  <span class="sub">
                    {u.tools_allowed === null ? "all it lists" : `only ${u.tools_allowed.join(", ")}`}
                  </span>
                </td>
                <td class="wrap" data-col="tenants">
                  <TenantList tenants={u.tenants} />
                </td>
                <td class="wrap" data-col="error">
                  <LastError text={u.last_error} />
                </td>
                <SourceAndActions
                  entry={u}
                  kind="upstream"
                  deployment={deployment}
                  remove={() => federation.removeUpstream(props.token, u.name)}
                  onChanged={props.onChanged}
                  notify={props.notify}
                  after="Its tools leave every replica within seconds."
                />
              </tr>
            );
          })}
        </tbody>
      </table>
    </div>
  );
}

/** A row's last cells: where the entry comes from and, for a deployment
 * admin, removing one registered through the API. */
function SourceAndActions(props: {
  entry: { name: string; source: UpstreamView["source"]; registered: UpstreamView["registered"] };
  kind: "upstream" | "model";
  deployment: boolean;
  remove: () => Promise<unknown>;
  onChanged: () => void;
  notify: (notice: NoticeState) => void;
  after: string;
}) {
  const { entry } = props;
  return (
    <>
      <td data-col="source">
        <SourceCell source={entry.source} registered={entry.registered} />
      </td>
      {props.deployment ? (
        <td data-col="actions">
          {entry.source === "api" ? (
            <RemoveButton
              kind={props.kind}
              name={entry.name}
              remove={async () => {
                await props.remove();
                props.onChanged();
              }}
              notify={props.notify}
              after={props.after}
            />
          ) : null}
        </td>
      ) : null}
    </>
  );
}

function ModelTable(props: {
  list: ModelView[];
  deployment: boolean;
  token: string;
  notify: (notice: NoticeState) => void;
  onChanged: () => void;
}) {
  const { list, deployment } = props;
  return (
    <div class="table-wrap">
      <table class="federation-table">
        <caption class="visually-hidden">
          Model providers with their calls on the replica that answered
        </caption>
        <thead>
          <tr>
            <th scope="col">Model</th>
            <th scope="col">Status</th>
            <th scope="col" class="num">
              Attempts (failed)
            </th>
            <th scope="col">Last success</th>
            <th scope="col">Last error</th>
            <th scope="col">Tenants served</th>
            <th scope="col">Source</th>
            {deployment ? <th scope="col">Actions</th> : null}
          </tr>
        </thead>
        <tbody>
          {list.map((m) => {
            const health = modelHealth(m);
            const h = m.health;
            return (
              <tr key={m.name} data-model={m.name}>
                <th scope="row">
                  <span class="entry-name">{m.name}</span>
                  {m.embeddings ? <span class="tag">embeddings</span> : null}
                  <span class="sub">
                    {m.provider} · <span class="mono">{m.model}</span>
                  </span>
                  <span class="sub mono wrap">{m.base_url}</span>
                </th>
                <td data-col="status">
                  <Health {...health} />
                </td>
                <td class="num" data-col="calls">
                  {h ? (
                    <>
                      {count(h.attempts)} ({count(h.failures)})
                    </>
                  ) : (
                    <span class="muted">—</span>
                  )}
                </td>
                <td data-col="ok">
                  {h ? <Time at={h.last_ok_at} none="never" /> : <span class="muted">—</span>}
                </td>
                <td class="wrap" data-col="error">
                  {h ? <LastError text={h.last_error} at={h.last_error_at} /> : <LastError text={m.error} />}
                </td>
                <td class="wrap" data-col="tenants">
                  <TenantList tenants={m.tenants} />
                </td>
                <SourceAndActions
                  entry={m}
                  kind="model"
                  deployment={deployment}
                  remove={() => federation.removeModel(props.token, m.name)}
                  onChanged={props.onChanged}
                  notify={props.notify}
                  after="Branches can no longer run on it, on every replica within seconds."
                />
              </tr>
            );
          })}
        </tbody>
      </table>
    </div>
  );
}

// --- the forms ---------------------------------------------------------------------------

/** Names typed with commas (or spaces) between them; none: undefined. */
function names(text: string): string[] | undefined {
  const list = [...new Set(text.split(/[\s,]+/).filter((n) => n !== ""))];
  return list.length > 0 ? list : undefined;
}

/** Where a refusal went; the fields it names are marked. */
interface Outcome {
  text: string;
  error: boolean;
  /** Field ids the refusal names. */
  fields: string[];
  id: number;
}

/** The field a refusal's message (or code) names, among `known`: "api_key: …", "url \"…\" …". */
function namedField(error: ApiError, known: string[]): string | undefined {
  if (error.code === "already_registered" || error.code === "declared_in_config") return "name";
  const message = error.message.replace(/^on this replica: /, "");
  const first = /^([a-z_]+)/.exec(message)?.[1];
  return first && known.includes(first) ? first : undefined;
}

function useOutcome() {
  const [outcome, setOutcome] = useState<Outcome | null>(null);
  const ref = useRef<HTMLParagraphElement>(null);
  useLayoutEffect(() => {
    if (outcome) ref.current?.focus();
  }, [outcome?.id]);
  return { outcome, setOutcome, ref };
}

function OutcomeNote(props: { id: string; outcome: Outcome | null; outcomeRef: preact.Ref<HTMLParagraphElement> }) {
  const { outcome } = props;
  if (!outcome) return null;
  return (
    <p
      ref={props.outcomeRef}
      id={props.id}
      tabIndex={-1}
      class={`note ${outcome.error ? "note-error" : "note-ok"}`}
      role={outcome.error ? "alert" : "status"}
    >
      {outcome.text}
    </p>
  );
}

/** A labelled text field with its hint, tied to a refusal that names it. */
function TextField(props: {
  id: string;
  label: string;
  value: string;
  onInput: (value: string) => void;
  hint?: preact.ComponentChildren;
  placeholder?: string;
  invalid: boolean;
  outcomeId: string;
  required?: boolean;
  mono?: boolean;
}) {
  const hintId = `${props.id}-hint`;
  const describedBy = [props.hint ? hintId : null, props.invalid ? props.outcomeId : null]
    .filter(Boolean)
    .join(" ");
  return (
    <div class="field">
      <label for={props.id}>
        {props.label}
        {props.required ? null : <span class="optional"> (optional)</span>}
      </label>
      <input
        id={props.id}
        type="text"
        class={props.mono ? "mono" : undefined}
        autoComplete="off"
        spellcheck={false}
        value={props.value}
        placeholder={props.placeholder}
        aria-required={props.required ? true : undefined}
        aria-invalid={props.invalid ? true : undefined}
        aria-describedby={describedBy || undefined}
        onInput={(e) => props.onInput((e.currentTarget as HTMLInputElement).value)}
      />
      {props.hint ? (
        <span class="hint field-hint" id={hintId}>
          {props.hint}
        </span>
      ) : null}
    </div>
  );
}

interface HeaderRow {
  key: number;
  name: string;
  value: string;
}


function UpstreamForm(props: { token: string; onRegistered: () => void }) {
  const [name, setName] = useState("");
  const [url, setUrl] = useState("");
  const [tenants, setTenants] = useState("");
  const [tools, setTools] = useState("");
  const nextKey = useRef(1);
  const [headers, setHeaders] = useState<HeaderRow[]>([{ key: 0, name: "", value: "" }]);
  const [busy, setBusy] = useState(false);
  const { outcome, setOutcome, ref } = useOutcome();
  const focusRow = useRef<number | null>(null);
  const formRef = useRef<HTMLFormElement>(null);

  useLayoutEffect(() => {
    if (focusRow.current === null) return;
    formRef.current?.querySelector<HTMLInputElement>(`#up-header-${focusRow.current}-name`)?.focus();
    focusRow.current = null;
  }, [headers]);

  const invalid = (field: string) => Boolean(outcome?.error && outcome.fields.includes(field));
  const setRow = (key: number, change: Partial<HeaderRow>) =>
    setHeaders((rows) => rows.map((r) => (r.key === key ? { ...r, ...change } : r)));

  const submit = async (event: Event) => {
    event.preventDefault();
    const body: UpstreamRegistration = { name: name.trim(), url: url.trim() };
    const tenantList = names(tenants);
    if (tenantList) body.tenants = tenantList;
    const toolList = names(tools);
    if (toolList) body.tools = toolList;
    const sent = headers.filter((h) => h.name.trim() !== "" || h.value !== "");
    if (sent.length > 0) body.headers = Object.fromEntries(sent.map((h) => [h.name.trim(), h.value]));
    setBusy(true);
    try {
      const view = await federation.registerUpstream(props.token, body);
      setName("");
      setUrl("");
      setTenants("");
      setTools("");
      setHeaders([{ key: nextKey.current++, name: "", value: "" }]);
      setOutcome({
        text: `Registered the upstream ${view.name}. It is live on this replica now and on every replica within seconds; its status in the list shows when it answers.`,
        error: false,
        fields: [],
        id: Date.now(),
      });
      props.onRegistered();
    } catch (e) {
      const error = e instanceof ApiError ? e : new ApiError(0, "client", String(e));
      const field = namedField(error, ["name", "url", "tenants", "tools", "headers"]);
      const fields = field ? [field] : [];
      if (field === "headers") {
        // "headers.Authorization: …" or "headers: \"X-Key\" is …": the row it names.
        const header = /^(?:on this replica: )?headers(?:\.([^:\s]+)|: "([^"]*)")/.exec(error.message);
        const which = header?.[1] ?? header?.[2];
        const row = sent.find((h) => h.name.trim().toLowerCase() === which?.toLowerCase()) ?? sent[0];
        if (row) fields.push(`header-${row.key}`);
      }
      setOutcome({ text: `Not registered: ${error.describe()}`, error: true, fields, id: Date.now() });
    } finally {
      setBusy(false);
    }
  };

  return (
    <form
      ref={formRef}
      class="panel register-form"
      aria-labelledby="register-upstream-title"
      noValidate
      onSubmit={submit}
    >
      <h2 id="register-upstream-title">Register an upstream</h2>
      <p class="hint form-intro">
        An MCP server (Streamable HTTP). Agents of the tenants it serves see its tools as{" "}
        <code>name__tool</code>.
      </p>
      <div class="fields-grid upstream-fields">
        <TextField
          id="up-name"
          label="Name"
          value={name}
          onInput={setName}
          required
          invalid={invalid("name")}
          outcomeId="up-outcome"
          hint="letters, digits, - and _; at most 32"
        />
        <TextField
          id="up-url"
          label="URL"
          value={url}
          onInput={setUrl}
          required
          mono
          placeholder="https://search.team.svc:9000/mcp"
          invalid={invalid("url")}
          outcomeId="up-outcome"
        />
        <TextField
          id="up-tenants"
          label="Tenants"
          value={tenants}
          onInput={setTenants}
          invalid={invalid("tenants")}
          outcomeId="up-outcome"
          hint="names separated by commas; empty: every tenant"
        />
        <TextField
          id="up-tools"
          label="Tools allow-list"
          value={tools}
          onInput={setTools}
          invalid={invalid("tools")}
          outcomeId="up-outcome"
          hint="its tool names separated by commas; empty: all it lists"
        />
      </div>
      <fieldset class="header-rows" aria-describedby="up-headers-hint">
        <legend>Headers sent with every request</legend>
        <p class="hint field-hint" id="up-headers-hint">
          A value must reference environment variables set on every replica, named with the
          deployment's <code>[admin] credential_env_prefix</code> (<code>FOLDGATE_SECRET_</code> by
          default), such as <code>{"Bearer ${FOLDGATE_SECRET_TEAM_SEARCH}"}</code>. A literal
          secret is refused: none is stored. A row left empty is not sent.
        </p>
        {headers.map((h, index) => {
          const rowInvalid = invalid(`header-${h.key}`);
          const describedBy = rowInvalid ? "up-headers-hint up-outcome" : "up-headers-hint";
          return (
            <div class="header-row" key={h.key}>
              <div class="field">
                <label for={`up-header-${h.key}-name`}>
                  Header name<span class="visually-hidden"> {index + 1}</span>
                </label>
                <input
                  id={`up-header-${h.key}-name`}
                  type="text"
                  autoComplete="off"
                  spellcheck={false}
                  placeholder="Authorization"
                  value={h.name}
                  aria-invalid={rowInvalid ? true : undefined}
                  aria-describedby={describedBy}
                  onInput={(e) => setRow(h.key, { name: (e.currentTarget as HTMLInputElement).value })}
                />
              </div>
              <div class="field">
                <label for={`up-header-${h.key}-value`}>
                  Header value<span class="visually-hidden"> {index + 1}</span>
                </label>
                <input
                  id={`up-header-${h.key}-value`}
                  type="text"
                  class="mono"
                  autoComplete="off"
                  spellcheck={false}
                  placeholder={"Bearer ${FOLDGATE_SECRET_…}"}
                  value={h.value}
                  aria-invalid={rowInvalid ? true : undefined}
                  aria-describedby={describedBy}
                  onInput={(e) => setRow(h.key, { value: (e.currentTarget as HTMLInputElement).value })}
                />
              </div>
              <button
                type="button"
                class="row-remove"
                onClick={() => {
                  const rest = headers.filter((r) => r.key !== h.key);
                  const left = rest.length > 0 ? rest : [{ key: nextKey.current++, name: "", value: "" }];
                  setHeaders(left);
                  focusRow.current = left[Math.min(index, left.length - 1)]?.key ?? null;
                }}
              >
                Remove<span class="visually-hidden"> header {index + 1}</span>
              </button>
            </div>
          );
        })}
        <button
          type="button"
          class="row-add"
          onClick={() => {
            const key = nextKey.current++;
            focusRow.current = key;
            setHeaders((rows) => [...rows, { key, name: "", value: "" }]);
          }}
        >
          Add a header
        </button>
      </fieldset>
      <OutcomeNote id="up-outcome" outcome={outcome} outcomeRef={ref} />
      <div class="form-actions">
        <button type="submit" class="primary" disabled={busy}>
          {busy ? "Registering…" : "Register upstream"}
        </button>
      </div>
    </form>
  );
}

function ModelForm(props: { token: string; onRegistered: () => void }) {
  const [name, setName] = useState("");
  const [provider, setProvider] = useState<"openai" | "anthropic">("openai");
  const [baseUrl, setBaseUrl] = useState("");
  const [model, setModel] = useState("");
  const [apiKey, setApiKey] = useState("");
  const [tenants, setTenants] = useState("");
  const [busy, setBusy] = useState(false);
  const { outcome, setOutcome, ref } = useOutcome();
  const invalid = (field: string) => Boolean(outcome?.error && outcome.fields.includes(field));

  const submit = async (event: Event) => {
    event.preventDefault();
    const body: ModelRegistration = {
      name: name.trim(),
      provider,
      base_url: baseUrl.trim(),
      model: model.trim(),
    };
    if (apiKey.trim() !== "") body.api_key = apiKey.trim();
    const tenantList = names(tenants);
    if (tenantList) body.tenants = tenantList;
    setBusy(true);
    try {
      const view = await federation.registerModel(props.token, body);
      setName("");
      setBaseUrl("");
      setModel("");
      setApiKey("");
      setTenants("");
      setOutcome({
        text: `Registered the model ${view.name}. Gateway-run branches of the tenants it serves may use it on every replica within seconds.`,
        error: false,
        fields: [],
        id: Date.now(),
      });
      props.onRegistered();
    } catch (e) {
      const error = e instanceof ApiError ? e : new ApiError(0, "client", String(e));
      const field = namedField(error, ["name", "provider", "base_url", "model", "api_key", "tenants"]);
      setOutcome({
        text: `Not registered: ${error.describe()}`,
        error: true,
        fields: field ? [field] : [],
        id: Date.now(),
      });
    } finally {
      setBusy(false);
    }
  };

  return (
    <form class="panel register-form" aria-labelledby="register-model-title" noValidate onSubmit={submit}>
      <h2 id="register-model-title">Register a chat model</h2>
      <p class="hint form-intro">
        A model provider for gateway-run branches (<code>branch_run</code>). Embeddings models are
        declared in the configuration file only.
      </p>
      <div class="fields-grid">
        <TextField
          id="model-name"
          label="Name"
          value={name}
          onInput={setName}
          required
          invalid={invalid("name")}
          outcomeId="model-outcome"
          hint="what branch_run's model names; letters, digits, -, _ and ."
        />
        <div class="field">
          <label for="model-provider">Provider</label>
          <select
            id="model-provider"
            value={provider}
            aria-invalid={invalid("provider") ? true : undefined}
            aria-describedby={invalid("provider") ? "model-outcome" : undefined}
            onChange={(e) => setProvider((e.currentTarget as HTMLSelectElement).value as "openai" | "anthropic")}
          >
            <option value="openai">OpenAI-compatible (openai)</option>
            <option value="anthropic">Anthropic (anthropic)</option>
          </select>
        </div>
        <TextField
          id="model-base_url"
          label="Base URL"
          value={baseUrl}
          onInput={setBaseUrl}
          required
          mono
          placeholder="https://api.openai.com/v1"
          invalid={invalid("base_url")}
          outcomeId="model-outcome"
          hint="the provider's API root"
        />
        <TextField
          id="model-model"
          label="Model id"
          value={model}
          onInput={setModel}
          required
          mono
          invalid={invalid("model")}
          outcomeId="model-outcome"
          hint="the provider's name for the model"
        />
        <TextField
          id="model-api_key"
          label="API key reference"
          value={apiKey}
          onInput={setApiKey}
          mono
          placeholder={"${FOLDGATE_SECRET_…}"}
          invalid={invalid("api_key")}
          outcomeId="model-outcome"
          hint={
            <>
              a variable reference as for an upstream's headers, such as{" "}
              <code>{"${FOLDGATE_SECRET_OPENAI}"}</code>; empty: no key
            </>
          }
        />
        <TextField
          id="model-tenants"
          label="Tenants"
          value={tenants}
          onInput={setTenants}
          invalid={invalid("tenants")}
          outcomeId="model-outcome"
          hint="names separated by commas; empty: every tenant"
        />
      </div>
      <OutcomeNote id="model-outcome" outcome={outcome} outcomeRef={ref} />
      <div class="form-actions">
        <button type="submit" class="primary" disabled={busy}>
          {busy ? "Registering…" : "Register model"}
        </button>
      </div>
    </form>
  );
}

// --- the page ------------------------------------------------------------------------------

export function Federation({ token, identity }: PageProps) {
  const read = usePoll(
    async (signal) => {
      const [upstreams, models] = await Promise.all([
        federation.upstreams(token, signal),
        federation.models(token, signal),
      ]);
      return { upstreams: upstreams.upstreams, models: models.models };
    },
    "federation",
    PERIOD,
  );
  const deployment = identity.scopes.includes("foldgate:admin");
  const [upstreamNotice, setUpstreamNotice] = useState<NoticeState>(null);
  const [modelNotice, setModelNotice] = useState<NoticeState>(null);
  const upstreams = read.data?.upstreams;
  const models = read.data?.models;
  const whose = deployment ? "" : identity.tenant ? ` serving ${identity.tenant}` : " serving your tenant";

  return (
    <>
      <PageHeading title="Upstreams and models">
        <Freshness updatedAt={read.updatedAt} periodMs={PERIOD} failing={Boolean(read.error)} />
      </PageHeading>
      <p class="muted page-intro">
        The upstream MCP servers and model providers{whose}, as the replica that answered sees
        them: whether each answers, and what went wrong last.
      </p>
      <ErrorNote error={read.error} context="Could not read the upstreams and models" />

      <section class="federation-section" aria-labelledby="upstreams-title">
        <h2 id="upstreams-title">
          Upstream MCP servers{upstreams ? <span class="muted count"> ({count(upstreams.length)})</span> : null}
        </h2>
        <Notice notice={upstreamNotice} />
        {upstreams && upstreams.length === 0 ? (
          <p class="empty">No upstream MCP server{deployment ? " is configured or registered" : whose}.</p>
        ) : null}
        {upstreams && upstreams.length > 0 ? (
          <UpstreamTable
            list={upstreams}
            deployment={deployment}
            token={token}
            notify={setUpstreamNotice}
            onChanged={read.refresh}
          />
        ) : null}
      </section>

      <section class="federation-section" aria-labelledby="models-title">
        <h2 id="models-title">
          Models{models ? <span class="muted count"> ({count(models.length)})</span> : null}
        </h2>
        <Notice notice={modelNotice} />
        {models && models.length === 0 ? (
          <p class="empty">No model{deployment ? " is configured or registered" : whose}.</p>
        ) : null}
        {models && models.length > 0 ? (
          <ModelTable
            list={models}
            deployment={deployment}
            token={token}
            notify={setModelNotice}
            onChanged={read.refresh}
          />
        ) : null}
        {models && models.length > 0 ? (
          <p class="hint table-note">
            Attempts count each retry; a model's figures are those of the replica that answered,
            since it started.
          </p>
        ) : null}
      </section>

      {deployment ? (
        <div class="register-layout">
          <UpstreamForm token={token} onRegistered={read.refresh} />
          <ModelForm token={token} onRegistered={read.refresh} />
        </div>
      ) : (
        <section class="panel read-only" aria-labelledby="read-only-title">
          <h2 id="read-only-title">Read only</h2>
          <p>
            Registering and removing upstreams and models takes a deployment admin (a token with
            the scope <code>foldgate:admin</code>). Ask the deployment's operators to add one for
            your tenant.
          </p>
        </section>
      )}
    </>
  );
}
