// A real OpenID Connect provider for the console's sign-in test: npm
// oidc-provider on loopback, with
//   - the console as a public client (no secret, PKCE) whose redirect URI is
//     <gateway>/console/callback, allowed to call the token endpoint from the
//     console's origin (CORS);
//   - one user, `operator`, who signs in with a login form (password
//     --password) and then allows or denies the console on a consent page;
//   - access tokens as JWTs for the gateway (resource indicators): for the
//     audience --audience (repeat it to accept several resources), the admin
//     scopes the console asks for, and the tenant in the claim --tenant-claim
//     (default `tenant`, the gateway's default);
//   - an `agent` client (client credentials, secret --agent-secret) whose
//     tokens carry fold:read fold:write for tenant --agent-tenant (default
//     acme), so that the test can fold a branch through the gateway with a
//     token from this provider.
// Its discovery document is at <issuer>/.well-known/openid-configuration.
// Two of them, with different audiences and tenant claims, stand for two
// identity providers the gateway trusts.
//
// Usage: node oidc-provider.mjs --port PORT --gateway http://127.0.0.1:GW --audience AUD
//          [--audience AUD2] --password PASSWORD --agent-secret SECRET
//          [--tenant-claim CLAIM] [--agent-tenant TENANT]
// Prints `oidc provider listening at ISSUER` once it serves.

import { generateKeyPairSync, randomBytes } from "node:crypto";
import { createServer } from "node:http";
import { parseArgs } from "node:util";

import Provider, { errors } from "oidc-provider";

const { values: args } = parseArgs({
  options: {
    port: { type: "string" },
    gateway: { type: "string" },
    audience: { type: "string", multiple: true },
    password: { type: "string" },
    "agent-secret": { type: "string" },
    "tenant-claim": { type: "string", default: "tenant" },
    "agent-tenant": { type: "string", default: "acme" },
  },
});
for (const name of ["port", "gateway", "audience", "password", "agent-secret"]) {
  if (!args[name]?.length) {
    console.error(`missing --${name}`);
    process.exit(2);
  }
}

const ISSUER = `http://127.0.0.1:${args.port}`;
const OPERATOR = "operator";
const CONSOLE_CLIENT = "foldgate-console";
const AGENT_CLIENT = "agent";
const TENANT_OF = { [CONSOLE_CLIENT]: "ops", [AGENT_CLIENT]: args["agent-tenant"] };
const SCOPES_OF = { [CONSOLE_CLIENT]: "foldgate:admin tenant:admin", [AGENT_CLIENT]: "fold:read fold:write" };

const signingKey = {
  ...generateKeyPairSync("rsa", { modulusLength: 2048 }).privateKey.export({ format: "jwk" }),
  kid: "console-test",
  use: "sig",
  alg: "RS256",
};

const provider = new Provider(ISSUER, {
  clients: [
    {
      client_id: CONSOLE_CLIENT,
      token_endpoint_auth_method: "none",
      application_type: "web",
      grant_types: ["authorization_code"],
      response_types: ["code"],
      redirect_uris: [`${args.gateway}/console/callback`],
    },
    {
      client_id: AGENT_CLIENT,
      client_secret: args["agent-secret"],
      token_endpoint_auth_method: "client_secret_post",
      grant_types: ["client_credentials"],
      response_types: [],
      redirect_uris: [],
    },
  ],
  jwks: { keys: [signingKey] },
  cookies: { keys: [randomBytes(32).toString("hex")] },
  scopes: ["openid"],
  claims: { openid: ["sub"] },
  pkce: { required: () => true },
  // The console's origin (its redirect URI's) may call the token endpoint.
  clientBasedCORS: (_ctx, origin, client) =>
    client.redirectUris.some((uri) => new URL(uri).origin === origin),
  findAccount: (_ctx, sub) =>
    sub === OPERATOR ? { accountId: sub, claims: () => ({ sub }) } : undefined,
  interactions: { url: (_ctx, interaction) => `/interaction/${interaction.uid}` },
  features: {
    devInteractions: { enabled: false },
    clientCredentials: { enabled: true },
    resourceIndicators: {
      enabled: true,
      defaultResource: (_ctx, _client, oneOf) => oneOf,
      useGrantedResource: () => true,
      getResourceServerInfo: (_ctx, resource, client) => {
        if (!args.audience.includes(resource)) throw new errors.InvalidTarget();
        return {
          audience: resource,
          scope: SCOPES_OF[client.clientId] ?? "",
          accessTokenFormat: "jwt",
          accessTokenTTL: 600,
          jwt: { sign: { alg: "RS256" } },
        };
      },
    },
  },
  extraTokenClaims: (ctx, token) =>
    token.kind === "AccessToken" || token.kind === "ClientCredentials"
      ? { [args["tenant-claim"]]: TENANT_OF[token.clientId] }
      : undefined,
  ttl: { AccessToken: 600, ClientCredentials: 600, IdToken: 600, Session: 3600, Grant: 3600 },
  renderError: (ctx, out) => {
    ctx.type = "html";
    ctx.body = page("Error", `<p role="alert">${escape(out.error)}: ${escape(out.error_description ?? "")}</p>`);
  },
});
provider.on("server_error", (_ctx, error) => console.error("provider error:", error));

function escape(text) {
  return String(text).replace(/[&<>"']/g, (c) => `&#${c.charCodeAt(0)};`);
}

function page(title, body) {
  return `<!doctype html><html lang="en"><head><meta charset="utf-8"><title>${escape(title)} · test provider</title></head>
<body><main><h1>${escape(title)}</h1>${body}</main></body></html>`;
}

async function form(req) {
  let text = "";
  for await (const chunk of req) text += chunk;
  return new URLSearchParams(text);
}

function send(res, status, html) {
  res.statusCode = status;
  res.setHeader("Content-Type", "text/html; charset=utf-8");
  res.setHeader("Cache-Control", "no-store");
  res.end(html);
}

function loginPage(uid, client, error) {
  return page(
    "Sign in to the test provider",
    `<p>${escape(client)} asks you to sign in.</p>
${error ? `<p role="alert">${escape(error)}</p>` : ""}
<form method="post" action="/interaction/${uid}/login">
  <p><label>Username <input name="username" autocomplete="username" required></label></p>
  <p><label>Password <input name="password" type="password" autocomplete="current-password" required></label></p>
  <p><button type="submit">Sign in</button></p>
</form>`,
  );
}

function consentPage(uid, client, scopes) {
  return page(
    "Allow access",
    `<p>${escape(client)} asks for: ${escape(scopes.join(" "))}</p>
<form method="post" action="/interaction/${uid}/confirm"><button type="submit">Allow</button></form>
<form method="post" action="/interaction/${uid}/abort"><button type="submit">Deny</button></form>`,
  );
}

/** The login and consent pages, and what their forms post. */
async function interaction(req, res, path) {
  const [, , uid, action] = path.split("/");
  const details = await provider.interactionDetails(req, res);
  if (details.uid !== uid) return send(res, 400, page("Error", "<p>interaction mismatch</p>"));
  const { prompt, params } = details;
  if (req.method === "GET" && !action) {
    if (prompt.name === "login") return send(res, 200, loginPage(uid, params.client_id));
    const wanted = [
      ...(prompt.details.missingOIDCScope ?? []),
      ...Object.values(prompt.details.missingResourceScopes ?? {}).flat(),
    ];
    return send(res, 200, consentPage(uid, params.client_id, wanted));
  }
  if (req.method !== "POST") return send(res, 405, page("Error", "<p>method not allowed</p>"));
  if (action === "login") {
    const body = await form(req);
    if (body.get("username") !== OPERATOR || body.get("password") !== args.password) {
      return send(res, 200, loginPage(uid, params.client_id, "Wrong username or password."));
    }
    return provider.interactionFinished(req, res, { login: { accountId: OPERATOR } }, { mergeWithLastSubmission: false });
  }
  if (action === "confirm") {
    const grant = details.grantId
      ? await provider.Grant.find(details.grantId)
      : new provider.Grant({ accountId: details.session.accountId, clientId: params.client_id });
    const missing = prompt.details;
    if (missing.missingOIDCScope) grant.addOIDCScope(missing.missingOIDCScope.join(" "));
    if (missing.missingOIDCClaims) grant.addOIDCClaims(missing.missingOIDCClaims);
    for (const [resource, scopes] of Object.entries(missing.missingResourceScopes ?? {})) {
      grant.addResourceScope(resource, scopes.join(" "));
    }
    const grantId = await grant.save();
    return provider.interactionFinished(req, res, { consent: { grantId } }, { mergeWithLastSubmission: true });
  }
  if (action === "abort") {
    return provider.interactionFinished(
      req,
      res,
      { error: "access_denied", error_description: "End-User aborted interaction" },
      { mergeWithLastSubmission: false },
    );
  }
  return send(res, 404, page("Error", "<p>not found</p>"));
}

const callback = provider.callback();
const server = createServer((req, res) => {
  const path = new URL(req.url, ISSUER).pathname;
  if (path.startsWith("/interaction/")) {
    interaction(req, res, path).catch((error) => {
      console.error("interaction error:", error);
      if (!res.headersSent) send(res, 500, page("Error", `<p role="alert">${escape(error.message)}</p>`));
    });
    return;
  }
  callback(req, res);
});
server.listen(Number(args.port), "127.0.0.1", () => {
  console.log(`oidc provider listening at ${ISSUER}`);
});
for (const signal of ["SIGTERM", "SIGINT"]) {
  process.on(signal, () => {
    server.close(() => process.exit(0));
    server.closeAllConnections();
  });
}
