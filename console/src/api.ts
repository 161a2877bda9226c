// The admin API (/admin/v1), as the console uses it. The shapes follow
// crates/foldgate-admin/src/views.rs; GET /admin/v1/openapi.json describes
// them in full.

import { noteServerDate } from "./time";

export const API = "/admin/v1";

export interface Budget {
  total: number;
  used: number;
  reserved: number;
}

export interface Tenant {
  tenant: string;
  open_sessions: number;
  active_branches: number;
  tokens_today: number;
}

export interface SessionView {
  session_id: string;
  owner: string;
  status: string;
  budget: Budget;
  created_at: string;
  last_activity_at: string;
  ended_at: string | null;
}

export interface SessionSummary extends SessionView {
  branches: number;
  active_branches: number;
}

export interface ModelUsage {
  model: string;
  calls: number;
  input_tokens: number;
  output_tokens: number;
}

export interface BranchNode {
  branch_id: string;
  kind: string;
  status: string;
  reason: string | null;
  depth: number;
  description: string;
  budget: Budget;
  created_at: string;
  deadline_at: string;
  completed_at: string | null;
  calls: number;
  call_tokens: number;
  returned_tokens: number | null;
  result: string | null;
  model_usage: ModelUsage | null;
  children: BranchNode[];
}

export interface SessionDetail extends SessionView {
  branches: BranchNode[];
}

/** One upstream call of a branch. */
export interface CallView {
  id: string;
  upstream: string;
  tool: string;
  tokens_in: number;
  tokens_out: number;
  tokens_charged: number;
  duration_ms: number;
  /** ok, tool_error, upstream_error, truncated or refused. */
  outcome: string;
  called_at: string;
}

/** A gateway-run branch's run. */
export interface RunView {
  model: string;
  state: string;
  tools: string[];
  steps: number;
  model_calls: number;
  input_tokens: number;
  output_tokens: number;
  resumes: number;
  lease_owner: string | null;
  lease_until: string | null;
  created_at: string;
  updated_at: string;
}

/** A tool call a model step asked for; `arguments` is compact JSON. */
export interface ToolCallView {
  id: string;
  name: string;
  arguments: string;
}

/** One step of a run: a model call, or a tool call the model asked for. */
export interface StepView {
  seq: number;
  kind: string;
  input_tokens: number;
  output_tokens: number;
  duration_ms: number;
  repeated: boolean;
  at: string;
  /** A model step's text. */
  text: string | null;
  tool_calls: ToolCallView[];
  /** A tool step: the call it answers, its tool, its result. */
  call_id: string | null;
  tool: string | null;
  result: string | null;
  error: boolean | null;
  /** Some of its text was cut by the API. */
  truncated: boolean;
}

/** A branch with its children, its calls, and a gateway run's steps (each newest first). */
export interface BranchDetail {
  session_id: string;
  parent_id: string | null;
  branch: BranchNode;
  calls: CallView[];
  calls_next: string | null;
  run: RunView | null;
  steps: StepView[];
  steps_next: number | null;
}

export interface SessionEnded {
  session_id: string;
  branches_ended: number;
  session_ended: boolean;
}

/** A tenant's overrides: only the fields an operator set. */
export interface LimitOverrides {
  max_active_per_session?: number;
  max_active_per_tenant?: number;
  creations_per_minute?: number;
  max_depth?: number;
  default_budget?: number;
  max_budget?: number;
  session_budget?: number;
  models?: string[];
  upstreams?: string[];
  tokens_per_day?: number;
  tokens_per_month?: number;
  tool_listing?: ToolListing;
}

/** How `tools/list` shows upstream tools: every one, or `tool_search` and those used. */
export type ToolListing = "full" | "search";

/** The limits a tenant's branches are held to: the deployment's, with its overrides. */
export interface EffectiveLimits {
  max_active_per_session: number;
  max_active_per_tenant: number;
  creations_per_minute: number;
  max_depth: number;
  default_budget: number;
  max_budget: number;
  session_budget: number;
  /** null: every model configured for the tenant. */
  models: string[] | null;
  /** null: every upstream configured for the tenant. */
  upstreams: string[] | null;
  /** null: no quota. */
  tokens_per_day: number | null;
  tokens_per_month: number | null;
  tool_listing: ToolListing;
}

export interface LimitsView {
  tenant: string;
  overrides: LimitOverrides;
  effective: EffectiveLimits;
  spent_today: number;
  spent_this_month: number;
  updated_at: string | null;
  updated_by: { tenant: string; subject: string } | null;
}

export type GroupBy = "day" | "upstream" | "model";

export interface UsageRow {
  key: string;
  branch_calls: number;
  branch_tokens_in: number;
  branch_tokens_out: number;
  outside_calls: number;
  outside_tokens_in: number;
  outside_tokens_out: number;
  model_calls: number;
  model_input_tokens: number;
  model_output_tokens: number;
  returns: number;
  tokens_folded: number;
  tokens_returned: number;
  tokens_saved: number;
}

export interface UsageReport {
  tenant: string;
  from: string;
  to: string;
  group_by: GroupBy;
  rows: UsageRow[];
  total: UsageRow;
}

export interface AuditEntry {
  id: string;
  at: string;
  actor: { tenant: string; subject: string };
  tenant: string | null;
  action: string;
  target: string;
  detail: unknown;
}

/** A refusal or failure, with the API's stable code and message. */
export class ApiError extends Error {
  constructor(
    readonly status: number,
    readonly code: string,
    message: string,
  ) {
    super(message);
  }

  /** The message with its status and code, as shown to the operator. */
  describe(): string {
    return this.status === 0 ? this.message : `${this.message} (${this.status} ${this.code})`;
  }
}

/** Told when the gateway refuses the token, so that the console signs out. */
let onUnauthorized: (error: ApiError) => void = () => {};

export function setUnauthorizedHandler(handler: (error: ApiError) => void): void {
  onUnauthorized = handler;
}

async function errorOf(response: Response): Promise<ApiError> {
  let code = "http_" + response.status;
  let message = response.statusText || "request failed";
  try {
    const body: unknown = await response.json();
    const error = (body as { error?: { code?: unknown; message?: unknown } })?.error;
    if (typeof error?.code === "string") code = error.code;
    if (typeof error?.message === "string") message = error.message;
  } catch {
    // Not the API's JSON: keep the HTTP status text.
  }
  return new ApiError(response.status, code, message);
}

/**
 * Calls the admin API with the operator's token. `path` is relative to
 * /admin/v1. A 401 or 403 after signing in means the token no longer
 * serves (expired, or its keys rotated): the console signs out. Except
 * where `mayForbid` says a 403 is this call's own refusal (changing limits
 * takes more than reading them): then it is only reported.
 */
export async function call<T>(
  token: string,
  method: "GET" | "POST" | "PUT" | "DELETE",
  path: string,
  signal?: AbortSignal,
  options: { body?: unknown; mayForbid?: boolean } = {},
): Promise<T> {
  let response: Response;
  const headers: Record<string, string> = {
    Authorization: `Bearer ${token}`,
    Accept: "application/json",
  };
  if (options.body !== undefined) headers["Content-Type"] = "application/json";
  try {
    response = await fetch(API + path, {
      method,
      headers,
      body: options.body === undefined ? undefined : JSON.stringify(options.body),
      cache: "no-store",
      credentials: "omit",
      signal,
    });
  } catch (e) {
    if (e instanceof DOMException && e.name === "AbortError") throw e;
    throw new ApiError(0, "network", "The gateway could not be reached.");
  }
  noteServerDate(response.headers.get("Date"));
  if (!response.ok) {
    const error = await errorOf(response);
    const refused = error.status === 401 || (error.status === 403 && !options.mayForbid);
    if (refused) onUnauthorized(error);
    throw error;
  }
  // 204 No Content (a removal): nothing to read.
  if (response.status === 204) return undefined as T;
  return (await response.json()) as T;
}

/** A query string from the values that are set. */
export function query(params: Record<string, string | number | undefined | null>): string {
  const search = new URLSearchParams();
  for (const [name, value] of Object.entries(params)) {
    if (value !== undefined && value !== null && value !== "") search.set(name, String(value));
  }
  const text = search.toString();
  return text ? `?${text}` : "";
}

export const seg = encodeURIComponent;

export const admin = {
  tenants: (token: string, signal?: AbortSignal) =>
    call<{ tenants: Tenant[] }>(token, "GET", "/tenants", signal),
  sessions: (
    token: string,
    tenant: string,
    status: "open" | "all",
    after: string | undefined,
    signal?: AbortSignal,
  ) =>
    call<{ sessions: SessionSummary[]; next: string | null }>(
      token,
      "GET",
      `/tenants/${seg(tenant)}/sessions${query({ status, after })}`,
      signal,
    ),
  session: (token: string, tenant: string, id: string, signal?: AbortSignal) =>
    call<SessionDetail>(token, "GET", `/tenants/${seg(tenant)}/sessions/${seg(id)}`, signal),
  branch: (
    token: string,
    tenant: string,
    id: string,
    page: { calls_limit?: number; steps_limit?: number },
    signal?: AbortSignal,
  ) =>
    call<BranchDetail>(
      token,
      "GET",
      `/tenants/${seg(tenant)}/branches/${seg(id)}${query(page)}`,
      signal,
    ),
  endBranch: (token: string, tenant: string, branch: string) =>
    call<{ branch: BranchNode }>(
      token,
      "POST",
      `/tenants/${seg(tenant)}/branches/${seg(branch)}/end`,
    ),
  endSession: (token: string, tenant: string, id: string) =>
    call<SessionEnded>(token, "POST", `/tenants/${seg(tenant)}/sessions/${seg(id)}/end`),
  limits: (token: string, tenant: string, signal?: AbortSignal) =>
    call<LimitsView>(token, "GET", `/tenants/${seg(tenant)}/limits`, signal),
  /** Replaces the tenant's overrides; `{}` removes them all. */
  putLimits: (token: string, tenant: string, overrides: LimitOverrides) =>
    call<LimitsView>(token, "PUT", `/tenants/${seg(tenant)}/limits`, undefined, {
      body: overrides,
      mayForbid: true,
    }),
  usage: (
    token: string,
    tenant: string,
    span: { from?: string; to?: string; group_by: GroupBy },
    signal?: AbortSignal,
  ) =>
    call<UsageReport>(
      token,
      "GET",
      `/tenants/${seg(tenant)}/usage${query(span)}`,
      signal,
    ),
  audit: (
    token: string,
    tenant: string | undefined,
    before: string | undefined,
    signal?: AbortSignal,
  ) =>
    call<{ entries: AuditEntry[]; next: string | null }>(
      token,
      "GET",
      `/audit${query({ tenant, before })}`,
      signal,
    ),
};
