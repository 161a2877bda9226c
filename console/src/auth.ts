// The operator's bearer token: kept in sessionStorage (this tab only, gone
// when it closes), never in localStorage, a cookie or a URL.

const KEY = "foldgate.console.token";

export function loadToken(): string | null {
  try {
    return sessionStorage.getItem(KEY);
  } catch {
    return null;
  }
}

export function saveToken(token: string): void {
  try {
    sessionStorage.setItem(KEY, token);
  } catch {
    // Storage refused (private mode quotas): the token lives in memory only.
  }
}

export function clearToken(): void {
  try {
    sessionStorage.removeItem(KEY);
  } catch {
    // Nothing stored.
  }
}

/** What the token says of itself, for display only: the gateway decides. */
export interface Identity {
  subject?: string;
  tenant?: string;
  scopes: string[];
  expires?: number;
}

export function identity(token: string): Identity {
  const part = token.split(".")[1];
  if (!part) return { scopes: [] };
  try {
    const base64 = part.replace(/-/g, "+").replace(/_/g, "/");
    const bytes = Uint8Array.from(atob(base64), (c) => c.charCodeAt(0));
    const claims = JSON.parse(new TextDecoder().decode(bytes)) as Record<string, unknown>;
    const text = (v: unknown) => (typeof v === "string" ? v : undefined);
    const scopes = [claims.scope, claims.scp]
      .flatMap((v) => (Array.isArray(v) ? v : typeof v === "string" ? [v] : []))
      .flatMap((v) => (typeof v === "string" ? v.split(/\s+/) : []))
      .filter((s) => s.endsWith(":admin"));
    return {
      subject: text(claims.sub),
      tenant: text(claims.tenant),
      scopes,
      expires: typeof claims.exp === "number" ? claims.exp * 1000 : undefined,
    };
  } catch {
    return { scopes: [] };
  }
}
