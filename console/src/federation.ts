// The admin API's upstreams and models (/admin/v1/upstreams, /models), as
// the console uses them. The shapes follow
// crates/foldgate-admin/src/federation.rs.

import { call, seg } from "./api";

/** Where a declaration comes from: the configuration file (read-only here) or the API. */
export type Source = "config" | "api";

/** Who registered a declaration through the API, and when. */
export interface Registered {
  at: string;
  /** `<tenant>/<subject>` of the token. */
  by: string;
}

export interface UpstreamView {
  name: string;
  /** Without credentials or query. */
  url: string;
  /** null: every tenant. */
  tenants: string[] | null;
  /** The allow-list; null: every tool it lists. */
  tools_allowed: string[] | null;
  /** The names of the headers foldgate sends it. */
  headers: string[];
  up: boolean;
  /** Tools it offers agents now. */
  tools: number;
  last_error: string | null;
  source: Source;
  registered: Registered | null;
}

export interface ModelHealth {
  attempts: number;
  failures: number;
  last_ok_at: string | null;
  last_error: string | null;
  last_error_at: string | null;
}

export interface ModelView {
  name: string;
  provider: string;
  model: string;
  base_url: string;
  tenants: string[] | null;
  embeddings: boolean;
  /** null while the replica that answered cannot use it. */
  health: ModelHealth | null;
  /** Why the replica that answered cannot use it. */
  error: string | null;
  source: Source;
  registered: Registered | null;
}

/** The body of POST /upstreams: an `[[upstreams]]` entry; unset fields take their defaults. */
export interface UpstreamRegistration {
  name: string;
  url: string;
  tenants?: string[];
  tools?: string[];
  headers?: Record<string, string>;
}

/** The body of POST /models: a chat model's `[[models]]` entry. */
export interface ModelRegistration {
  name: string;
  provider: "openai" | "anthropic";
  base_url: string;
  model: string;
  api_key?: string;
  tenants?: string[];
}

/**
 * What the gateway answers with when a registration is not loaded on the
 * replica yet (it reads them every few seconds).
 */
export const NOT_LOADED = "registered; not loaded on this replica yet";

export const federation = {
  upstreams: (token: string, signal?: AbortSignal) =>
    call<{ upstreams: UpstreamView[] }>(token, "GET", "/upstreams", signal),
  models: (token: string, signal?: AbortSignal) =>
    call<{ models: ModelView[] }>(token, "GET", "/models", signal),
  registerUpstream: (token: string, body: UpstreamRegistration) =>
    call<UpstreamView>(token, "POST", "/upstreams", undefined, { body, mayForbid: true }),
  removeUpstream: (token: string, name: string) =>
    call<void>(token, "DELETE", `/upstreams/${seg(name)}`, undefined, { mayForbid: true }),
  registerModel: (token: string, body: ModelRegistration) =>
    call<ModelView>(token, "POST", "/models", undefined, { body, mayForbid: true }),
  removeModel: (token: string, name: string) =>
    call<void>(token, "DELETE", `/models/${seg(name)}`, undefined, { mayForbid: true }),
};
