import { useEffect, useRef, useState } from "preact/hooks";

import { ApiError, admin } from "../api";
import { type OidcSettings, SignInError, beginSignIn, loadSettings, providerName } from "../oidc";

/** Explains a refusal of the token in the operator's terms. */
export function refusal(error: ApiError): string {
  if (error.status === 401) {
    return (
      `The gateway refused this token (401 ${error.code}: ${error.message}). ` +
      "Check that it is complete, not expired, and signed for this deployment."
    );
  }
  if (error.status === 403) {
    return (
      `This token is valid but may not use the admin API (403 ${error.code}). ` +
      "It needs the scope foldgate:admin (every tenant) or tenant:admin (its own tenant)."
    );
  }
  return `Could not sign in: ${error.describe()}`;
}

/** Explains the gateway's refusal of a token the identity provider issued. */
export function providerRefusal(provider: string, error: ApiError): string {
  if (error.status === 401) {
    return (
      `${provider} signed you in, but the gateway refused the token it issued ` +
      `(401 ${error.code}: ${error.message}). The gateway's [auth] settings (jwks_url, issuer, ` +
      "audience, tenant_claim) must match the tokens of this provider."
    );
  }
  if (error.status === 403) {
    return (
      `${provider} signed you in, but its token may not use the admin API ` +
      `(403 ${error.code}). It needs the scope foldgate:admin (every tenant) or tenant:admin ` +
      "(its own tenant): have the provider grant one, and check the gateway's console.oidc_scopes."
    );
  }
  return `Could not sign in: ${error.describe()}`;
}

export function SignIn(props: { onSignIn: (token: string) => void; message?: string }) {
  const [token, setToken] = useState("");
  const [error, setError] = useState<string | undefined>(props.message);
  // Whether the error is about the pasted token rather than the provider
  // (without a provider, every error is).
  const [tokenError, setTokenError] = useState(false);
  const [busy, setBusy] = useState(false);
  const [oidc, setOidc] = useState<OidcSettings | null>(null);
  const [leaving, setLeaving] = useState(false);
  const field = useRef<HTMLTextAreaElement>(null);
  const providerButton = useRef<HTMLButtonElement>(null);
  useEffect(() => field.current?.focus(), []);
  useEffect(() => {
    let live = true;
    void loadSettings().then((settings) => live && setOidc(settings));
    return () => {
      live = false;
    };
  }, []);
  useEffect(() => {
    // The provider's button comes first, unless the operator started typing.
    if (oidc && document.activeElement === field.current && !field.current?.value) {
      providerButton.current?.focus();
    }
  }, [oidc]);

  const signInAtProvider = async () => {
    if (!oidc) return;
    setLeaving(true);
    setError(undefined);
    setTokenError(false);
    try {
      const here = window.location.pathname + window.location.search;
      await beginSignIn(oidc, here);
    } catch (e) {
      setError(e instanceof SignInError ? e.message : `Could not sign in: ${String(e)}`);
      setLeaving(false);
    }
  };

  const submit = async (event: Event) => {
    event.preventDefault();
    const value = token.trim().replace(/^Bearer\s+/i, "");
    setTokenError(true);
    if (!value) {
      setError("Paste a token first.");
      return;
    }
    setBusy(true);
    setError(undefined);
    try {
      await admin.tenants(value);
      props.onSignIn(value);
    } catch (e) {
      setError(e instanceof ApiError ? refusal(e) : String(e));
    } finally {
      setBusy(false);
    }
  };

  const fieldInvalid = Boolean(error) && (tokenError || !oidc);
  const alert = error ? (
    <p class="note note-error" role="alert" id="signin-error">
      {error}
    </p>
  ) : null;

  return (
    <main id="main" class="signin">
      <h1>Sign in to the foldgate console</h1>
      {oidc ? (
        <>
          {alert}
          <section class="panel signin-provider" aria-label="Identity provider">
            <button
              ref={providerButton}
              type="button"
              class="primary"
              disabled={busy || leaving}
              onClick={() => void signInAtProvider()}
            >
              {leaving ? "Opening the sign-in…" : `Sign in with ${providerName(oidc)}`}
            </button>
            <p class="hint">
              You sign in at <code>{oidc.issuer}</code> and come back here. Its token is kept in
              this tab only, like a pasted one.
            </p>
          </section>
          <p class="signin-or">or paste a token</p>
        </>
      ) : null}
      <form onSubmit={submit} class="panel">
        <label for="token">Admin bearer token</label>
        <p class="hint" id="token-hint">
          A JWT with the scope <code>foldgate:admin</code> (every tenant) or{" "}
          <code>tenant:admin</code> (its own tenant). It is kept in this tab only, and forgotten
          when the tab closes or you sign out.
        </p>
        <textarea
          ref={field}
          id="token"
          name="token"
          rows={4}
          spellcheck={false}
          autocomplete="off"
          autocapitalize="off"
          aria-describedby={fieldInvalid ? "token-hint signin-error" : "token-hint"}
          aria-invalid={fieldInvalid ? true : undefined}
          value={token}
          onInput={(e) => setToken((e.currentTarget as HTMLTextAreaElement).value)}
        />
        {oidc ? null : alert}
        <button type="submit" class={oidc ? undefined : "primary"} disabled={busy}>
          {busy ? "Checking…" : "Sign in"}
        </button>
        {oidc ? null : (
          <p class="hint">
            Mint one with <code>foldgate token --tenant ops --sub you --scope foldgate:admin --ttl 1h</code>.
          </p>
        )}
      </form>
    </main>
  );
}
