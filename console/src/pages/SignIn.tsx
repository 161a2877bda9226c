import { useEffect, useRef, useState } from "preact/hooks";

import { ApiError, admin } from "../api";

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

export function SignIn(props: { onSignIn: (token: string) => void; message?: string }) {
  const [token, setToken] = useState("");
  const [error, setError] = useState<string | undefined>(props.message);
  const [busy, setBusy] = useState(false);
  const field = useRef<HTMLTextAreaElement>(null);
  useEffect(() => field.current?.focus(), []);

  const submit = async (event: Event) => {
    event.preventDefault();
    const value = token.trim().replace(/^Bearer\s+/i, "");
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

  return (
    <main id="main" class="signin">
      <h1>Sign in to the foldgate console</h1>
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
          aria-describedby={error ? "token-hint signin-error" : "token-hint"}
          aria-invalid={error ? true : undefined}
          value={token}
          onInput={(e) => setToken((e.currentTarget as HTMLTextAreaElement).value)}
        />
        {error ? (
          <p class="note note-error" role="alert" id="signin-error">
            {error}
          </p>
        ) : null}
        <button type="submit" class="primary" disabled={busy}>
          {busy ? "Checking…" : "Sign in"}
        </button>
        <p class="hint">
          Mint one with <code>foldgate token --tenant ops --sub you --scope foldgate:admin --ttl 1h</code>.
        </p>
      </form>
    </main>
  );
}
