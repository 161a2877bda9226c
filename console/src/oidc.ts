// Signing in with the deployment's OpenID Connect provider, when the gateway
// names one (/console/config.json): the Authorization Code flow with PKCE
// (S256), `state` and `nonce`, run by this page as a public client. The
// protocol (discovery, PKCE, the checks of the answer and of the ID token,
// the code exchange) is oauth4webapi's. The token obtained is then used
// exactly as a pasted one (auth.ts).
//
// What the page needs between leaving for the provider and coming back
// (the state, nonce and PKCE verifier) is kept in this tab's sessionStorage,
// used once, and removed as soon as the provider's answer arrives.

import * as oauth from "oauth4webapi";

import { BASE } from "./router";

/** The provider operators sign in with, as the gateway describes it. */
export interface OidcSettings {
  issuer: string;
  client_id: string;
  scopes: string[];
  /** Which token is sent to the admin API. */
  token: "access_token" | "id_token";
  /** An RFC 8707 resource indicator to send, if any. */
  resource?: string;
  /** Origins besides this one that the page may reach (its connect-src). */
  connect_origins: string[];
}

/**
 * A sign-in that did not complete: what to tell the operator, and (from the
 * callback) the console address the sign-in started from.
 */
export class SignInError extends Error {
  constructor(
    message: string,
    readonly returnTo?: string,
  ) {
    super(message);
  }
}

/** The console page that the provider sends the operator back to. */
export const CALLBACK_PAGE = "callback";

const PENDING = "foldgate.console.oidc";

interface Pending {
  state: string;
  nonce: string;
  verifier: string;
  redirectUri: string;
  /** The console address to return to once signed in. */
  returnTo: string;
  settings: OidcSettings;
}

let settingsRequest: Promise<OidcSettings | null> | undefined;

/**
 * How operators sign in: the provider, or null when tokens are pasted only
 * (also when the gateway cannot say: pasting always works).
 */
export function loadSettings(): Promise<OidcSettings | null> {
  settingsRequest ??= fetch(`${BASE}config.json`, { headers: { Accept: "application/json" } })
    .then((response) => (response.ok ? response.json() : null))
    .then((body: { oidc?: OidcSettings | null } | null) => body?.oidc ?? null)
    .catch(() => null);
  return settingsRequest;
}

/** How the provider is named on the page: its issuer without the scheme. */
export function providerName(settings: OidcSettings): string {
  try {
    const url = new URL(settings.issuer);
    return (url.host + url.pathname).replace(/\/+$/, "");
  } catch {
    return settings.issuer;
  }
}

/** Plain http is allowed by the gateway for a loopback issuer only. */
function insecure(settings: OidcSettings): boolean {
  return new URL(settings.issuer).protocol === "http:";
}

/** Reads and checks the provider's discovery document. */
async function discover(settings: OidcSettings): Promise<oauth.AuthorizationServer> {
  const issuer = new URL(settings.issuer);
  const where = `${settings.issuer.replace(/\/+$/, "")}/.well-known/openid-configuration`;
  let response: Response;
  try {
    response = await oauth.discoveryRequest(issuer, {
      algorithm: "oidc",
      [oauth.allowInsecureRequests]: insecure(settings),
    });
  } catch (e) {
    throw new SignInError(
      `Could not reach the identity provider's discovery document (${where}): ${reason(e)}. ` +
        `The provider must answer this page's origin (${window.location.origin}) with CORS.`,
    );
  }
  let as: oauth.AuthorizationServer;
  try {
    as = await oauth.processDiscoveryResponse(issuer, response);
  } catch (e) {
    throw new SignInError(
      `The identity provider's discovery document (${where}) is not usable: ${reason(e)}.`,
    );
  }
  if (!as.authorization_endpoint || !as.token_endpoint) {
    throw new SignInError(
      `The identity provider's discovery document (${where}) names no authorization or ` +
        "token endpoint.",
    );
  }
  const origin = new URL(as.token_endpoint).origin;
  if (origin !== window.location.origin && !settings.connect_origins.includes(origin)) {
    throw new SignInError(
      `The identity provider's token endpoint is on ${origin}, which this page may not reach. ` +
        "Add that origin to the gateway's console.oidc_connect_origins " +
        "(FOLDGATE_CONSOLE__OIDC_CONNECT_ORIGINS).",
    );
  }
  return as;
}

function callbackUri(): string {
  return `${window.location.origin}${BASE}${CALLBACK_PAGE}`;
}

/**
 * Sends the operator to the provider's sign-in; they come back to the
 * callback page, then to `returnTo`. Resolves only if it could not leave.
 */
export async function beginSignIn(settings: OidcSettings, returnTo: string): Promise<void> {
  if (!window.isSecureContext) {
    throw new SignInError(
      "Signing in with the identity provider needs the console on https (or on localhost): " +
        "browsers offer the cryptography it needs (WebCrypto, for PKCE) only there. " +
        "Paste a token instead.",
    );
  }
  const as = await discover(settings);
  const verifier = oauth.generateRandomCodeVerifier();
  const pending: Pending = {
    state: oauth.generateRandomState(),
    nonce: oauth.generateRandomNonce(),
    verifier,
    redirectUri: callbackUri(),
    returnTo,
    settings,
  };
  const url = new URL(as.authorization_endpoint as string);
  const params = url.searchParams;
  params.set("client_id", settings.client_id);
  params.set("redirect_uri", pending.redirectUri);
  params.set("response_type", "code");
  params.set("scope", settings.scopes.join(" "));
  params.set("code_challenge", await oauth.calculatePKCECodeChallenge(verifier));
  params.set("code_challenge_method", "S256");
  params.set("state", pending.state);
  params.set("nonce", pending.nonce);
  if (settings.resource) params.set("resource", settings.resource);
  try {
    sessionStorage.setItem(PENDING, JSON.stringify(pending));
  } catch {
    throw new SignInError(
      "This browser refused to keep the sign-in's state for the tab (sessionStorage).",
    );
  }
  window.location.assign(url.href);
}

/** The pending sign-in of this tab, removed: it is used once. */
function takePending(): Pending | null {
  try {
    const text = sessionStorage.getItem(PENDING);
    sessionStorage.removeItem(PENDING);
    return text ? (JSON.parse(text) as Pending) : null;
  } catch {
    return null;
  }
}

export interface SignedIn {
  token: string;
  returnTo: string;
  provider: string;
}

/**
 * Completes the sign-in from the provider's answer (the callback page's
 * URL): checks it belongs to the sign-in this tab started, exchanges the
 * code, and returns the token. Throws a SignInError with where to return.
 */
export async function completeSignIn(answer: URL): Promise<SignedIn> {
  const pending = takePending();
  const fail = (message: string) => new SignInError(message, pending?.returnTo ?? BASE);
  if (!pending) {
    throw fail(
      "This tab has no sign-in waiting for the identity provider's answer (it was completed " +
        "already, or started in another tab). Sign in again.",
    );
  }
  if (answer.searchParams.get("state") !== pending.state) {
    throw fail(
      "The identity provider's answer does not belong to the sign-in this tab started (its " +
        "state differs), so it was not used. Sign in again.",
    );
  }
  const { settings } = pending;
  const provider = providerName(settings);
  try {
    const as = await discover(settings);
    const client: oauth.Client = { client_id: settings.client_id };
    let params: URLSearchParams;
    try {
      params = oauth.validateAuthResponse(as, client, answer, pending.state);
    } catch (e) {
      if (e instanceof oauth.AuthorizationResponseError) {
        throw new SignInError(
          `${provider} did not sign you in: ${e.error}` +
            (e.error_description ? ` (${e.error_description})` : "") +
            (e.error === "access_denied" ? ". The sign-in was refused or cancelled." : "."),
        );
      }
      throw new SignInError(`The identity provider's answer is not valid: ${reason(e)}.`);
    }
    let response: Response;
    try {
      response = await oauth.authorizationCodeGrantRequest(
        as,
        client,
        oauth.None(),
        params,
        pending.redirectUri,
        pending.verifier,
        {
          additionalParameters: settings.resource ? { resource: settings.resource } : undefined,
          [oauth.allowInsecureRequests]: insecure(settings),
        },
      );
    } catch (e) {
      throw new SignInError(
        `Could not reach the identity provider's token endpoint (${as.token_endpoint}): ` +
          `${reason(e)}. ` +
          `The provider must answer this page's origin (${window.location.origin}) with CORS.`,
      );
    }
    let result: oauth.TokenEndpointResponse;
    try {
      result = await oauth.processAuthorizationCodeResponse(as, client, response, {
        expectedNonce: pending.nonce,
        requireIdToken: true,
      });
    } catch (e) {
      if (e instanceof oauth.ResponseBodyError) {
        throw new SignInError(
          `${provider} refused to exchange the sign-in's code for a token: ${e.error}` +
            (e.error_description ? ` (${e.error_description})` : "") +
            ` (HTTP ${e.status}).`,
        );
      }
      throw new SignInError(`The identity provider's token response is not valid: ${reason(e)}.`);
    }
    const token = settings.token === "id_token" ? result.id_token : result.access_token;
    if (!token) {
      throw new SignInError(`${provider} issued no ${settings.token.replace("_", " ")}.`);
    }
    return { token, returnTo: pending.returnTo, provider };
  } catch (e) {
    throw fail(e instanceof SignInError ? e.message : `The sign-in failed: ${reason(e)}`);
  }
}

function reason(e: unknown): string {
  return (e instanceof Error ? e.message : String(e)).replace(/\.$/, "");
}
