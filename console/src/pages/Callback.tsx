import { useEffect } from "preact/hooks";

import { ApiError, admin } from "../api";
import { SignInError, completeSignIn } from "../oidc";
import { href } from "../router";
import { providerRefusal } from "./SignIn";

/** The provider's answer is used once, even if the page is shown again. */
let started = false;

/**
 * Where the identity provider sends the operator back: completes the
 * sign-in, checks the token with the gateway as a pasted one is checked,
 * and hands it over, or says why it failed. Either way the console then
 * leaves this address (it holds the code) for the page the sign-in
 * started from.
 */
export function Callback(props: {
  onSignIn: (token: string, returnTo: string) => void;
  onFailure: (message: string, returnTo: string) => void;
}) {
  useEffect(() => {
    if (started) return;
    started = true;
    void (async () => {
      let signedIn;
      try {
        signedIn = await completeSignIn(new URL(window.location.href));
      } catch (e) {
        const error = e instanceof SignInError ? e : new SignInError(String(e));
        props.onFailure(error.message, error.returnTo ?? href(""));
        return;
      }
      try {
        await admin.tenants(signedIn.token);
      } catch (e) {
        props.onFailure(
          e instanceof ApiError ? providerRefusal(signedIn.provider, e) : String(e),
          signedIn.returnTo,
        );
        return;
      }
      props.onSignIn(signedIn.token, signedIn.returnTo);
    })();
  }, []);

  return (
    <main id="main" class="signin">
      <h1>Signing in…</h1>
      <p class="panel" role="status">
        Completing the sign-in with the identity provider.
      </p>
    </main>
  );
}
