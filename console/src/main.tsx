// The console: sign-in, then one page at a time. A page is a component
// listed in PAGES under its path; adding one (and its nav entry) is all a
// new admin API endpoint needs.

import "./style.css";

import type { FunctionComponent } from "preact";
import { render } from "preact";
import { useEffect, useRef, useState } from "preact/hooks";

import { ApiError, setUnauthorizedHandler } from "./api";
import { clearToken, identity, loadToken, saveToken } from "./auth";
import { Link } from "./components/ui";
import { CALLBACK_PAGE } from "./oidc";
import { Audit } from "./pages/Audit";
import { Callback } from "./pages/Callback";
import { Federation } from "./pages/Federation";
import { Limits } from "./pages/Limits";
import { NotFound, type PageProps } from "./pages/page";
import { Session } from "./pages/Session";
import { Sessions } from "./pages/Sessions";
import { SignIn, refusal } from "./pages/SignIn";
import { Tenants } from "./pages/Tenants";
import { Usage } from "./pages/Usage";
import { href, navigate, noteMove, useLocation } from "./router";

const PAGES: Record<string, FunctionComponent<PageProps>> = {
  "": Tenants,
  sessions: Sessions,
  session: Session,
  audit: Audit,
  limits: Limits,
  usage: Usage,
  federation: Federation,
};

/** The header's links: which pages they lead to, and which they stand for. */
const NAV: { label: string; page: string; covers: string[] }[] = [
  { label: "Tenants", page: "", covers: ["", "sessions", "session", "limits", "usage"] },
  { label: "Audit log", page: "audit", covers: ["audit"] },
  { label: "Upstreams and models", page: "federation", covers: ["federation"] },
];

function App() {
  const [token, setToken] = useState<string | null>(loadToken);
  const [message, setMessage] = useState<string | undefined>();
  const location = useLocation();
  const signedIn = useRef(token !== null);
  signedIn.current = token !== null;

  useEffect(() => {
    setUnauthorizedHandler((error: ApiError) => {
      if (!signedIn.current) return;
      clearToken();
      setMessage(`You were signed out. ${refusal(error)}`);
      setToken(null);
    });
  }, []);

  const signIn = (value: string) => {
    saveToken(value);
    noteMove();
    setMessage(undefined);
    setToken(value);
  };

  if (location.page === CALLBACK_PAGE) {
    // Back from the identity provider: then to where the sign-in started.
    return (
      <>
        <Header />
        <Callback
          onSignIn={(value, returnTo) => {
            signIn(value);
            navigate(returnTo, true);
          }}
          onFailure={(text, returnTo) => {
            setMessage(text);
            navigate(returnTo, true);
          }}
        />
      </>
    );
  }

  if (token === null) {
    return (
      <>
        <Header />
        <SignIn message={message} onSignIn={signIn} />
      </>
    );
  }

  const who = identity(token);
  const Page = PAGES[location.page] ?? NotFound;
  const signOut = () => {
    clearToken();
    setMessage("You signed out. The token was removed from this tab.");
    setToken(null);
  };
  return (
    <>
      <Header>
        <nav aria-label="Console" class="nav">
          {NAV.map((item) => (
            <Link
              key={item.page}
              href={href(item.page)}
              current={item.covers.includes(location.page)}
            >
              {item.label}
            </Link>
          ))}
        </nav>
        <div class="who">
          <span>
            {who.subject ? <b>{who.subject}</b> : "signed in"}
            {who.tenant ? ` (${who.tenant})` : ""}
            {who.scopes.length > 0 ? ` · ${who.scopes.join(" ")}` : ""}
          </span>
          <button type="button" onClick={signOut}>
            Sign out
          </button>
        </div>
      </Header>
      <main id="main">
        <Page
          key={`${location.page} ${location.params.get("tenant") ?? ""} ${location.params.get("id") ?? ""}`}
          token={token}
          identity={who}
          location={location}
        />
      </main>
    </>
  );
}

function Header(props: { children?: preact.ComponentChildren }) {
  return (
    <header class="top">
      <a class="skip" href="#main">
        Skip to content
      </a>
      <span class="brand">
        fold<span>gate</span> console
      </span>
      {props.children}
    </header>
  );
}

const root = document.getElementById("app");
if (root) {
  root.textContent = "";
  render(<App />, root);
}
