// The web console in a headless Chromium against a real foldgate, while an
// MCP client (plain JSON-RPC over HTTP to /mcp) folds branches:
//   sign-in (refusals on a bad token and on a token without an admin scope,
//   then keyboard-only with an admin token), the tenants, a tenant's open
//   sessions, a live session whose tree shows a branch appear and end as the
//   client creates and returns it, a branch's details (its result as text,
//   the upstream calls the client made in it), a gateway-run branch's run and
//   steps (a step's full body opened with the keyboard), ending a branch from
//   the console (and the agent finding it ended), the
//   audit entry, ending the session; a tenant's limits changed by the
//   deployment admin (saved, a refusal shown with nothing changed, the audit
//   entry, every override cleared), its usage report filling in as the
//   client's branches return; upstreams and models: an upstream MCP server
//   (served by this script, wanting the secret the gateway has in the
//   variable <credential prefix>FILES) registered through the page, seen up with
//   its tools, called by the agent and removed, a model registered, and
//   registrations with literal secrets refused with the gateway's message;
//   and a tenant admin who cannot see another tenant and reads its limits,
//   its upstreams and models without a form. With --oidc-base, a second
//   gateway that trusts two OpenID Connect providers (oidc-provider.mjs) by
//   discovery and whose console signs in with the first (--oidc-issuer):
//   agents of both fold branches, each under the tenant its provider's own
//   claim names, and a token of the second for the first one's audience is
//   refused; then the console's policy and settings, an answer with a state
//   the tab did not send, a sign-in the user denies at the provider, then one
//   through the provider's login and consent back to the tenants page, where
//   both agents' sessions are under their tenants. Screenshots of every step
//   go to --shots.
//
// Usage: node console.test.mjs --base http://127.0.0.1:PORT --admin JWT --tenant-admin JWT
//          --agent JWT --other-agent JWT --mcp-only JWT --upstream-secret S
//          --credential-prefix P --shots DIR
//          [--oidc-base URL --oidc-issuer URL --oidc-password P --oidc-agent-secret S
//           --oidc-issuer-b URL --oidc-audience-b AUD --oidc-agent-secret-b S]
// Prints `N passed, N failed` last; exits 1 on any failure.

import { mkdirSync } from "node:fs";
import { createServer } from "node:http";
import { join } from "node:path";
import { parseArgs } from "node:util";

import { chromium } from "playwright-core";

const { values: args } = parseArgs({
  options: {
    base: { type: "string" },
    admin: { type: "string" },
    "tenant-admin": { type: "string" },
    agent: { type: "string" },
    "other-agent": { type: "string" },
    "mcp-only": { type: "string" },
    "upstream-secret": { type: "string" },
    "credential-prefix": { type: "string" },
    shots: { type: "string" },
    chromium: { type: "string", default: "/usr/bin/chromium" },
    "oidc-base": { type: "string" },
    "oidc-issuer": { type: "string" },
    "oidc-password": { type: "string" },
    "oidc-agent-secret": { type: "string" },
    "oidc-issuer-b": { type: "string" },
    "oidc-audience-b": { type: "string" },
    "oidc-agent-secret-b": { type: "string" },
  },
});
for (const name of ["base", "admin", "tenant-admin", "agent", "other-agent", "mcp-only", "upstream-secret", "credential-prefix", "shots"]) {
  if (!args[name]) {
    console.error(`missing --${name}`);
    process.exit(2);
  }
}
const BASE = args.base;
const TENANT = "acme";
const OTHER = "globex";
const SESSION = `console-live-${Date.now().toString(36)}`;
// Variables set on the gateway, which registrations may reference.
const FILES_REF = `\${${args["credential-prefix"]}FILES}`;
const MODEL_REF = `\${${args["credential-prefix"]}MODEL}`;
mkdirSync(args.shots, { recursive: true });

let passed = 0;
let failed = 0;
function check(label, ok, detail = "") {
  if (ok) {
    passed += 1;
    console.log(`ok   ${label}`);
  } else {
    failed += 1;
    console.log(`FAIL ${label}${detail ? `: ${typeof detail === "string" ? detail : JSON.stringify(detail)}` : ""}`);
  }
  return ok;
}

/** Runs one step; a throw fails it and the run goes on where it can. */
async function step(label, body) {
  try {
    await body();
  } catch (e) {
    check(label, false, e instanceof Error ? e.message.split("\n").slice(0, 6).join(" | ") : String(e));
    await screenshot(`failed-${label.replace(/[^a-z0-9]+/gi, "-")}`).catch(() => {});
  }
}

// --- the MCP client: JSON-RPC POSTs to /mcp ------------------------------------------------
let rpcId = 0;
async function tool(token, name, args, headers = {}, base = BASE) {
  rpcId += 1;
  const response = await fetch(`${base}/mcp`, {
    method: "POST",
    headers: {
      Authorization: `Bearer ${token}`,
      "Content-Type": "application/json",
      Accept: "application/json, text/event-stream",
      "MCP-Protocol-Version": "2025-11-25",
      ...headers,
    },
    body: JSON.stringify({ jsonrpc: "2.0", id: rpcId, method: "tools/call", params: { name, arguments: args } }),
  });
  const text = await response.text();
  if (!response.ok) throw new Error(`${name}: HTTP ${response.status} ${text}`);
  const message = JSON.parse(text);
  if (message.error) throw new Error(`${name}: ${JSON.stringify(message.error)}`);
  return message.result;
}

async function createBranch(token, session, description, extra = {}, base = BASE) {
  const result = await tool(
    token,
    "branch_create",
    {
      session_id: session,
      description,
      prompt: `Work on: ${description}`,
      budget: 4000,
      timeout_seconds: 300,
      ...extra,
    },
    {},
    base,
  );
  if (result.isError) throw new Error(`branch_create refused: ${JSON.stringify(result.content)}`);
  return result.structuredContent.branch_id;
}

async function adminApi(token, method, path, body) {
  const headers = { Authorization: `Bearer ${token}` };
  if (body !== undefined) headers["Content-Type"] = "application/json";
  const response = await fetch(`${BASE}/admin/v1${path}`, {
    method,
    headers,
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  return { status: response.status, body: await response.json().catch(() => null) };
}

function findNode(nodes, id) {
  for (const node of nodes) {
    if (node.branch_id === id) return node;
    const found = findNode(node.children, id);
    if (found) return found;
  }
  return null;
}

// --- an upstream MCP server to register: JSON answers, wants the secret ---------------------
const UPSTREAM_TOOLS = [
  { name: "read_file", description: "Reads a file", inputSchema: { type: "object", properties: { path: { type: "string" } }, required: ["path"] } },
  { name: "list_files", description: "Lists files", inputSchema: { type: "object", properties: {} } },
  { name: "delete_file", description: "Deletes a file", inputSchema: { type: "object", properties: { path: { type: "string" } } } },
];
const upstreamServer = createServer(async (request, response) => {
  if (request.method !== "POST") {
    response.writeHead(405).end();
    return;
  }
  if (request.headers.authorization !== `Bearer ${args["upstream-secret"]}`) {
    response.writeHead(401, { "Content-Type": "application/json" }).end('{"error":"unauthorized"}');
    return;
  }
  let body = "";
  for await (const chunk of request) body += chunk;
  const message = JSON.parse(body);
  if (message.id === undefined) {
    response.writeHead(202).end();
    return;
  }
  let answer;
  if (message.method === "initialize") {
    answer = {
      result: {
        protocolVersion: message.params?.protocolVersion ?? "2025-11-25",
        capabilities: { tools: {} },
        serverInfo: { name: "console-files", version: "1.0.0" },
      },
    };
  } else if (message.method === "tools/list") {
    answer = { result: { tools: UPSTREAM_TOOLS } };
  } else if (message.method === "tools/call") {
    answer = { result: { content: [{ type: "text", text: `the contents of ${message.params?.arguments?.path}` }] } };
  } else {
    answer = { error: { code: -32601, message: `no method ${message.method}` } };
  }
  response
    .writeHead(200, { "Content-Type": "application/json", "Mcp-Session-Id": "console-files-session" })
    .end(JSON.stringify({ jsonrpc: "2.0", id: message.id, ...answer }));
});
await new Promise((resolve) => upstreamServer.listen(0, "127.0.0.1", resolve));
const UPSTREAM_URL = `http://127.0.0.1:${upstreamServer.address().port}/mcp`;

/** The tools an MCP client sees (tools/list). */
async function listTools(token) {
  rpcId += 1;
  const response = await fetch(`${BASE}/mcp`, {
    method: "POST",
    headers: {
      Authorization: `Bearer ${token}`,
      "Content-Type": "application/json",
      Accept: "application/json, text/event-stream",
      "MCP-Protocol-Version": "2025-11-25",
    },
    body: JSON.stringify({ jsonrpc: "2.0", id: rpcId, method: "tools/list", params: {} }),
  });
  const message = JSON.parse(await response.text());
  if (message.error) throw new Error(`tools/list: ${JSON.stringify(message.error)}`);
  return message.result.tools.map((t) => t.name);
}

// --- the browser ---------------------------------------------------------------------------
const browser = await chromium.launch({
  executablePath: args.chromium,
  args: [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
  ],
});
const context = await browser.newContext({ viewport: { width: 1366, height: 768 }, locale: "en-GB" });
const page = await context.newPage();
const problems = [];
page.on("console", (m) => {
  // The refusals the test provokes (400, 401, 403, 404) are logged by the browser.
  if (m.type() === "error" && !/status of 40[0134]/.test(m.text())) problems.push(m.text());
});
page.on("pageerror", (e) => problems.push(`page error: ${e.message}`));
page.setDefaultTimeout(10_000);

let shot = 0;
async function screenshot(name, fullPage = false, of = page) {
  shot += 1;
  const file = join(args.shots, `${String(shot).padStart(2, "0")}-${name}.png`);
  await of.screenshot({ path: file, fullPage });
  console.log(`     screenshot ${file}`);
}

const node = (id) => page.locator(`article[data-branch-id="${id}"]`);
const statusOf = (id) => node(id).locator(".status").first();

let branchA;
let branchB;
let branchC;

try {
  // The first branches, before anyone signs in: tenants appear once they had one.
  await step("the agent opens a session with a branch", async () => {
    branchA = await createBranch(args.agent, SESSION, "survey the flaky tests");
    await createBranch(args["other-agent"], "globex-work", "globex's own branch");
    check("the agent opens a session with a branch (and globex one of its own)", Boolean(branchA));
  });

  await step("/console serves the page with its security headers", async () => {
    const response = await page.goto(`${BASE}/console`);
    const headers = response.headers();
    check("/console redirects to /console/", page.url() === `${BASE}/console/`, page.url());
    const csp = headers["content-security-policy"] ?? "";
    check(
      "the page has a strict Content-Security-Policy and nosniff",
      csp.includes("default-src 'self'") &&
        csp.includes("script-src 'self'") &&
        !csp.includes("unsafe-inline") &&
        headers["x-content-type-options"] === "nosniff" &&
        headers["cache-control"] === "no-cache",
      headers,
    );
    await page.getByRole("heading", { name: "Sign in to the foldgate console" }).waitFor();
    await screenshot("sign-in");
  });

  await step("a bad token is refused with a clear message", async () => {
    await page.getByLabel("Admin bearer token").fill("not-a-token");
    await page.getByRole("button", { name: "Sign in" }).click();
    const alert = page.getByRole("alert");
    await alert.waitFor();
    const text = await alert.innerText();
    check("a bad token: the 401 is explained", /refused this token \(401 unauthorized/.test(text), text);
    await screenshot("sign-in-refused-401");
  });

  await step("a token without an admin scope is refused", async () => {
    await page.getByLabel("Admin bearer token").fill(args["mcp-only"]);
    await page.getByRole("button", { name: "Sign in" }).click();
    await page.getByRole("alert").filter({ hasText: "403" }).waitFor();
    const text = await page.getByRole("alert").innerText();
    check("an MCP-only token: the 403 names the scopes needed", /403 forbidden/.test(text) && text.includes("tenant:admin"), text);
    await screenshot("sign-in-refused-403");
  });

  await step("sign in with the keyboard alone", async () => {
    await page.getByLabel("Admin bearer token").fill("");
    await page.getByLabel("Admin bearer token").focus();
    await page.keyboard.insertText(args.admin);
    await page.keyboard.press("Tab");
    const focused = await page.evaluate(() => document.activeElement?.textContent);
    check("Tab moves from the token to the Sign in button", focused === "Sign in", focused);
    await page.keyboard.press("Enter");
    await page.getByRole("heading", { name: "Tenants", level: 1 }).waitFor();
    const stored = await page.evaluate(() => ({
      session: Object.keys(sessionStorage).length,
      local: Object.keys(localStorage).length,
      url: location.href,
      cookies: document.cookie,
    }));
    check(
      "the token is in sessionStorage only (not localStorage, a cookie or the URL)",
      stored.session === 1 && stored.local === 0 && stored.cookies === "" && !stored.url.includes(args.admin.slice(0, 20)),
      stored,
    );
  });

  await step("tenants", async () => {
    const row = page.getByRole("row").filter({ has: page.getByRole("link", { name: TENANT, exact: true }) });
    await row.waitFor();
    const cells = await row.locator("td").allInnerTexts();
    // open sessions, active branches, tokens today
    check("the tenants list shows acme with 1 open session and 1 active branch", cells[0] === "1" && cells[1] === "1", cells);
    check("and globex", (await page.getByRole("link", { name: OTHER, exact: true }).count()) === 1);
    await screenshot("tenants");
    await page.getByRole("link", { name: TENANT, exact: true }).click();
  });

  await step("a tenant's open sessions", async () => {
    await page.getByRole("heading", { name: `Sessions of ${TENANT}` }).waitFor();
    const link = page.getByRole("link", { name: SESSION });
    await link.waitFor();
    check("the tenant's open sessions list the live session", true);
    await screenshot("sessions");
    await link.click();
  });

  await step("the live session's tree", async () => {
    await page.getByRole("heading", { name: `Session ${SESSION}` }).waitFor();
    await node(branchA).waitFor();
    check("the session page shows the tree with the first branch", (await statusOf(branchA).innerText()) === "active");
    const first = await node(branchA).locator(".deadline").innerText();
    await page.waitForTimeout(2100);
    const later = await node(branchA).locator(".deadline").innerText();
    check("an active branch's deadline counts down", /left$/.test(first) && first !== later, `${first} → ${later}`);
    await screenshot("session-tree");
  });

  await step("a branch appears while the client creates it", async () => {
    branchB = await createBranch(args.agent, SESSION, "read the CI logs", { parent_branch_id: branchA });
    await node(branchB).waitFor({ timeout: 5000 });
    const nested = await page
      .locator(`li:has(> article[data-branch-id="${branchA}"]) > ul > li > article[data-branch-id="${branchB}"]`)
      .count();
    check("the new child branch appears in the tree under its parent, without a reload", nested === 1);
    const activity = await page.locator(".activity").innerText();
    check("the change is announced in the live region", activity.includes("New branch “read the CI logs”"), activity);
    await screenshot("branch-appeared");
  });

  await step("the branch ends when the client returns it", async () => {
    // Two upstream calls inside the branch first: one read, one tool error.
    const inBranch = { "Foldgate-Branch": branchB };
    const read = await tool(args.agent, "files__read_file", { path: "ci.yml", lines: 3 }, inBranch);
    const failing = await tool(args.agent, "files__fail", {}, inBranch);
    if (read.isError || failing.isError !== true) throw new Error(JSON.stringify({ read, failing }));
    const returned = await tool(args.agent, "branch_return", {
      branch_id: branchB,
      message: "Found it: <b>not bold</b> <script>alert(1)</script> the retry loop in ci.yml",
    });
    if (returned.isError) throw new Error(JSON.stringify(returned.content));
    await page.waitForFunction(
      (id) => document.querySelector(`article[data-branch-id="${id}"] .status`)?.textContent === "completed",
      branchB,
      { timeout: 5000 },
    );
    check("the returned branch turns completed in the tree", true);
    await node(branchB).getByRole("link", { name: "read the CI logs" }).click();
    const result = page.locator("pre.result");
    await result.waitFor();
    const text = await result.innerText();
    const elements = await result.locator("b, script").count();
    check(
      "its details show the result as text, never as HTML",
      text.includes("<b>not bold</b>") && text.includes("<script>") && elements === 0,
      { text, elements },
    );
    await screenshot("branch-returned-details");
  });

  await step("a branch's upstream calls", async () => {
    const rows = page.locator(".calls-table tbody tr");
    await rows.nth(1).waitFor();
    const cells = await rows.evaluateAll((trs) => trs.map((tr) => [...tr.children].map((c) => c.textContent.trim())));
    // Tool, in, out, charged, duration, outcome, time: newest first.
    check(
      "its details list its two calls, newest first, with tool, tokens, duration, outcome and time",
      cells.length === 2 &&
        cells[0][0] === "files__fail" && cells[0][5] === "tool error" &&
        cells[1][0] === "files__read_file" && cells[1][5] === "ok" &&
        cells.every((c) => /^[0-9,]+$/.test(c[1]) && /^[0-9,]+$/.test(c[3]) && / (ms|s)$/.test(c[4]) && /^\d\d:\d\d:\d\d$/.test(c[6])),
      cells,
    );
    const api = await adminApi(args.admin, "GET", `/tenants/${TENANT}/branches/${branchB}`);
    const charged = api.body?.calls?.map((c) => c.tokens_charged.toLocaleString("en"));
    check(
      "the same calls as the admin API's",
      api.status === 200 && JSON.stringify(charged) === JSON.stringify(cells.map((c) => c[3])) &&
        api.body.branch.calls === 2,
      { charged, api: api.body?.calls },
    );
    check("an agent's branch has no run or steps", (await page.locator("#steps-title, #run-title").count()) === 0);
    await page.locator(".calls-table").scrollIntoViewIfNeeded();
    await screenshot("branch-calls");
  });

  await step("a gateway-run branch's run and steps", async () => {
    const description = "find the retry loop in the CI configuration";
    const run = await tool(args.agent, "branch_run", {
      session_id: SESSION,
      description,
      prompt: "The flaky tests are retried somewhere in CI; say where.",
      budget: 6000,
      timeout_seconds: 60,
    });
    const result = run.structuredContent ?? {};
    if (run.isError || result.status !== "completed") throw new Error(`branch_run: ${JSON.stringify(run)}`);
    const runId = result.branch_id;
    await node(runId).waitFor({ timeout: 5000 });
    check("the gateway-run branch appears in the tree, marked so", (await node(runId).locator(".kind").innerText()) === "gateway-run");
    await node(runId).getByRole("link", { name: description }).click();
    const fields = page.locator(".run-fields");
    await fields.waitFor();
    const runText = await fields.innerText();
    check(
      "its details show the run: model, state, steps, what the provider billed",
      runText.includes("scripted") && runText.includes("done") && runText.includes("2 model calls, 1,860 input, 79 output tokens"),
      runText,
    );
    const steps = page.locator("ol.steps > li");
    await steps.nth(3).waitFor();
    const seqs = await steps.evaluateAll((items) => items.map((li) => li.getAttribute("data-seq")));
    const summaries = await page.locator("ol.steps .step-summary").allInnerTexts();
    check(
      "its four steps in the order the run made them, each summed up",
      JSON.stringify(seqs) === JSON.stringify(["0", "1", "2", "3"]) &&
        summaries[0].includes("asked for files__read_file, files__read_file") &&
        summaries[1].startsWith("files__read_file returned: //") &&
        summaries[3].startsWith("Answered: The retry loop is in ci.yml"),
      summaries,
    );
    const head = await steps.nth(0).locator(".step-head").innerText();
    check("a model step shows its tokens and duration", head.includes("620 in / 48 out tokens") && / (ms|s)/.test(head), head);
    const calls = await page.locator(".calls-table tbody tr").count();
    check("the run's upstream calls are listed as the branch's", calls === 2, calls);

    // The full body of the last step, reached and opened with the keyboard.
    await steps.nth(2).locator("summary").focus();
    await page.keyboard.press("Tab");
    const focused = await page.evaluate(() => ({
      seq: document.activeElement?.closest("li.step")?.getAttribute("data-seq"),
      tag: document.activeElement?.tagName,
      outline: getComputedStyle(document.activeElement).outlineStyle,
    }));
    await page.keyboard.press("Enter");
    const body = steps.nth(3).locator("pre.step-text");
    await body.waitFor();
    check(
      "Tab reaches the next step's Full body, with a visible focus ring; Enter shows its whole text",
      focused.seq === "3" && focused.tag === "SUMMARY" && focused.outline === "solid" &&
        (await body.innerText()).includes("handler_2 in tests/retry.rs"),
      focused,
    );
    await steps.nth(0).locator("summary").click();
    const asked = await steps.nth(0).locator(".tool-calls").innerText();
    check("a model step's body lists the tool calls it asked for, with their arguments", asked.includes('"path":"ci.yml"') && asked.includes("call_helper"), asked);
    const api = await adminApi(args.admin, "GET", `/tenants/${TENANT}/branches/${runId}`);
    check(
      "the admin API agrees: the run, four steps, two calls",
      api.status === 200 && api.body.run?.state === "done" && api.body.steps.length === 4 && api.body.calls.length === 2,
      api.body?.run,
    );
    await steps.nth(3).scrollIntoViewIfNeeded();
    await screenshot("gateway-run-steps");
  });

  await step("ending a branch from the console", async () => {
    branchC = await createBranch(args.agent, SESSION, "bisect the regression");
    await node(branchC).waitFor({ timeout: 5000 });
    await node(branchC).getByRole("button", { name: "End branch" }).click();
    const confirm = node(branchC).getByRole("group");
    await confirm.waitFor();
    const focused = await page.evaluate(() => document.activeElement?.textContent);
    check("ending asks first, with the focus on Cancel", focused === "Cancel", focused);
    await screenshot("end-branch-confirm");
    await node(branchC).getByRole("button", { name: "Yes, end it" }).click();
    await page.waitForFunction(
      (id) => document.querySelector(`article[data-branch-id="${id}"] .status`)?.textContent?.startsWith("failed"),
      branchC,
      { timeout: 5000 },
    );
    const status = await statusOf(branchC).innerText();
    check("the console shows it failed, ended_by_operator", status === "failed · ended_by_operator", status);
    const notice = await page.locator(".note-ok").innerText();
    check("and says so", notice.includes("failed, ended_by_operator"), notice);
    await screenshot("branch-ended-by-operator");

    const session = await adminApi(args.admin, "GET", `/tenants/${TENANT}/sessions/${SESSION}`);
    const ended = session.body && findNode(session.body.branches, branchC);
    check(
      "the admin API confirms: failed, ended_by_operator",
      ended?.status === "failed" && ended?.reason === "ended_by_operator",
      ended,
    );
    const again = await tool(args.agent, "branch_return", { branch_id: branchC, message: "too late" });
    check(
      "the agent's branch_return on it is refused (branch_not_active)",
      again.isError === true && JSON.stringify(again).includes("branch_not_active"),
      again,
    );
    const twice = await adminApi(args.admin, "POST", `/tenants/${TENANT}/branches/${branchC}/end`);
    check("ending it again is 409 branch_not_active", twice.status === 409 && twice.body?.error?.code === "branch_not_active", twice);
  });

  await step("the audit log", async () => {
    await page.getByRole("navigation", { name: "Console" }).getByRole("link", { name: "Audit log" }).click();
    await page.getByRole("heading", { name: "Audit log", level: 1 }).waitFor();
    const row = page.getByRole("row").filter({ hasText: branchC });
    await row.waitFor();
    const text = await row.innerText();
    check("the audit log has the branch.end by the operator", text.includes("branch.end") && text.includes("console-operator"), text);
    await screenshot("audit");
    await page.goBack();
  });

  await step("ending the session from the console", async () => {
    await page.getByRole("heading", { name: `Session ${SESSION}` }).waitFor();
    await page.getByRole("button", { name: "End session" }).click();
    await page.getByRole("button", { name: "Yes, end the session" }).click();
    const notice = page.locator(".note-ok").filter({ hasText: "Session ended" });
    await notice.waitFor();
    const text = await notice.innerText();
    check("ending the session ends its active branch with it", text.includes("1 active branch ended"), text);
    await page.waitForFunction(
      (id) => document.querySelector(`article[data-branch-id="${id}"] .status`)?.textContent?.includes("session_ended"),
      branchA,
      { timeout: 5000 },
    );
    const status = await page.locator(".session-head .status").first().innerText();
    check("the session shows ended, its branch failed · session_ended", status === "ended", status);
    await screenshot("session-ended");
  });

  // A depth-1 branch that returns (after a child of its own did): the usage
  // report counts it, with what it spent and what it returned.
  await step("the client folds a branch into its caller", async () => {
    const session = `console-usage-${Date.now().toString(36)}`;
    const parent = await createBranch(args.agent, session, "collect the failing jobs");
    const child = await createBranch(args.agent, session, "read one job's log", { parent_branch_id: parent });
    const long = Array.from({ length: 60 }, (_, i) => `job ${i}: step "test" failed after retry ${i % 3}`).join("\n");
    for (const [id, message] of [
      [child, long],
      [parent, "Three jobs fail in the same test: the retry loop in ci.yml."],
    ]) {
      const returned = await tool(args.agent, "branch_return", { branch_id: id, message });
      if (returned.isError) throw new Error(JSON.stringify(returned.content));
    }
    check("the client returns a depth-1 branch (after its child)", true);
  });

  const limitRow = (name) => page.locator(`tr[data-limit="${name}"]`);
  // A limit's effective value, and where it comes from.
  const limitValue = async (name) =>
    (await limitRow(name).locator('td[data-col="value"], td[data-col="from"]').allInnerTexts()).map((t) => t.trim());

  await step("limits: the deployment admin changes a tenant's", async () => {
    await page.getByRole("navigation", { name: "Breadcrumb" }).getByRole("link", { name: TENANT, exact: true }).click();
    await page.getByRole("heading", { name: `Sessions of ${TENANT}` }).waitFor();
    await page.getByRole("navigation", { name: `Tenant ${TENANT}` }).getByRole("link", { name: "Limits" }).click();
    await page.getByRole("heading", { name: `Limits of ${TENANT}`, level: 1 }).waitFor();
    await limitRow("max_budget").waitFor();
    check(
      "the limits page shows the deployment's settings, and an edit form to a deployment admin",
      (await limitValue("max_budget"))[1] === "deployment's" &&
        (await page.getByRole("group", { name: "Budgets, in tokens" }).count()) === 1,
      await limitValue("max_budget"),
    );
    await page.getByLabel("Default budget").fill("12000");
    await page.getByLabel("Max budget").fill("48,000");
    await page.getByLabel("Tokens per day").fill("2000000");
    await page.getByLabel("Tool listing").selectOption("search");
    await page.getByRole("button", { name: "Save" }).click();
    const saved = page.locator("#limits-outcome.note-ok");
    await saved.waitFor();
    check("saving says so", (await saved.innerText()).startsWith("Saved."), await saved.innerText());
    const focused = await page.evaluate(() => document.activeElement?.id);
    check("the outcome takes the focus", focused === "limits-outcome", focused);
    const max = await limitValue("max_budget");
    const def = await limitValue("default_budget");
    const day = await limitValue("tokens_per_day");
    check(
      "the new effective values are shown, marked as set for this tenant",
      max[0] === "48,000" && max[1] === "set for this tenant" && def[0] === "12,000" && day[0] === "2,000,000" &&
        (await limitValue("max_depth"))[1] === "deployment's",
      { max, def, day },
    );
    const listing = await limitValue("tool_listing");
    check(
      "the tool listing chosen is shown as set for this tenant",
      listing[0] === "search: tool_search and the tools used" && listing[1] === "set for this tenant",
      listing,
    );
    const bar = await page.getByRole("img", { name: /^Spent today: / }).getAttribute("aria-label");
    check("today's spending is shown against the new daily quota", /of 2,000,000 tokens spent/.test(bar ?? ""), bar);
    const who = await page.locator(".last-change").innerText();
    check("and who changed them last", who.includes("Last changed") && who.includes("console-operator (ops)"), who);
    const api = await adminApi(args.admin, "GET", `/tenants/${TENANT}/limits`);
    check(
      "the admin API confirms the overrides and the effective limits",
      api.status === 200 &&
        JSON.stringify(api.body.overrides) ===
          JSON.stringify({ default_budget: 12000, max_budget: 48000, tokens_per_day: 2000000, tool_listing: "search" }) &&
        api.body.effective.tool_listing === "search" &&
        api.body.effective.max_budget === 48000 &&
        api.body.effective.tokens_per_day === 2000000,
      api,
    );
    await screenshot("limits-saved", true);
  });

  await step("limits: a change the gateway refuses", async () => {
    // With the keyboard: type into the field, Enter submits the form.
    const field = page.getByLabel("Default budget");
    await field.focus();
    await page.keyboard.press("ControlOrMeta+a");
    await page.keyboard.type("60000");
    await page.keyboard.press("Enter");
    const refused = page.locator("#limits-outcome.note-error");
    await refused.waitFor();
    const text = await refused.innerText();
    check(
      "a default budget above the max budget shows the API's 400 and its message",
      text.includes("400 invalid_request") && text.includes("default_budget (60000) <= max_budget (48000)"),
      text,
    );
    const described = await field.getAttribute("aria-describedby");
    check(
      "the refusal is linked to the fields it names (aria-describedby, aria-invalid)",
      (described ?? "").split(" ").includes("limits-outcome") && (await field.getAttribute("aria-invalid")) === "true",
      described,
    );
    const api = await adminApi(args.admin, "GET", `/tenants/${TENANT}/limits`);
    check(
      "and nothing changed",
      api.body?.overrides?.default_budget === 12000 && (await limitValue("default_budget"))[0] === "12,000",
      api.body?.overrides,
    );
    await screenshot("limits-refused", true);
    await page.getByRole("button", { name: "Reset form" }).click();
    check("Reset form puts the saved overrides back", (await field.inputValue()) === "12000", await field.inputValue());
    // What is not a number is not sent: the field says so and takes the focus.
    const depth = page.getByLabel("Max depth");
    await depth.fill("three");
    await page.getByRole("button", { name: "Save" }).click();
    const note = await page.locator("#limit-max_depth-error").innerText();
    const at = await page.evaluate(() => document.activeElement?.id);
    check(
      "a field that is not a whole number is marked, described and focused, and nothing is sent",
      note.includes("whole number") && at === "limit-max_depth" &&
        (await depth.getAttribute("aria-describedby")).includes("limit-max_depth-error") &&
        (await page.locator("#limits-outcome").count()) === 0,
      { note, at },
    );
    await page.getByRole("button", { name: "Reset form" }).click();
  });

  await step("limits: the change is in the audit log", async () => {
    await page.getByRole("navigation", { name: "Console" }).getByRole("link", { name: "Audit log" }).click();
    await page.getByRole("heading", { name: "Audit log", level: 1 }).waitFor();
    const rows = page.getByRole("row").filter({ hasText: "limits.update" });
    await rows.first().waitFor();
    const texts = await rows.allInnerTexts();
    check(
      "one limits.update of acme by the operator, with the overrides (the refused change wrote none)",
      texts.length === 1 && texts[0].includes("console-operator") && texts[0].includes("max_budget: 48000") &&
        texts[0].includes("tokens_per_day: 2000000"),
      texts,
    );
    await screenshot("audit-limits-update");
  });

  await step("limits: the tool listing back to the deployment's", async () => {
    await page.goto(`${BASE}/console/limits?tenant=${TENANT}`);
    await page.getByRole("heading", { name: `Limits of ${TENANT}`, level: 1 }).waitFor();
    await limitRow("tool_listing").waitFor();
    const select = page.getByLabel("Tool listing");
    check("the form shows the listing set for the tenant", (await select.inputValue()) === "search", await select.inputValue());
    await select.selectOption("");
    await page.getByRole("button", { name: "Save" }).click();
    await page.locator("#limits-outcome.note-ok").waitFor();
    const listing = await limitValue("tool_listing");
    const api = await adminApi(args.admin, "GET", `/tenants/${TENANT}/limits`);
    check(
      "choosing the deployment's removes the override, and every upstream tool is listed again",
      listing[0] === "full: every upstream tool" && listing[1] === "deployment's" &&
        api.body?.overrides?.tool_listing === undefined && api.body?.overrides?.max_budget === 48000,
      { listing, overrides: api.body?.overrides },
    );
  });

  await step("limits: clearing every override", async () => {
    const put = await adminApi(args.admin, "PUT", `/tenants/${OTHER}/limits`, { tokens_per_month: 9000000, models: [] });
    if (put.status !== 200) throw new Error(`PUT ${OTHER} limits: ${JSON.stringify(put)}`);
    await page.goto(`${BASE}/console/limits?tenant=${OTHER}`);
    await page.getByRole("heading", { name: `Limits of ${OTHER}`, level: 1 }).waitFor();
    await limitRow("tokens_per_month").waitFor();
    const month = await limitValue("tokens_per_month");
    const models = await limitValue("models");
    check(
      "an empty allow-list reads none, and the form's None box is ticked",
      month[0] === "9,000,000" && models[0] === "none" && models[1] === "set for this tenant" &&
        (await page.getByLabel(/No model/).isChecked()) &&
        (await page.getByLabel("Models", { exact: true }).isDisabled()),
      { month, models },
    );
    await page.getByRole("button", { name: "Clear all overrides" }).click();
    await page.getByRole("button", { name: "Yes, clear them" }).click();
    const cleared = page.locator("#limits-outcome.note-ok");
    await cleared.waitFor();
    const text = await cleared.innerText();
    const after = await limitValue("tokens_per_month");
    const api = await adminApi(args.admin, "GET", `/tenants/${OTHER}/limits`);
    check(
      "Clear all overrides removes them: no quota, every model",
      text.startsWith("Cleared.") && after[0] === "no quota" && after[1] === "deployment's" &&
        JSON.stringify(api.body?.overrides) === "{}" && api.body?.effective?.models === null,
      { text, after, api: api.body?.overrides },
    );
    await screenshot("limits-cleared");
  });

  await step("usage: the report fills in as branches return", async () => {
    await page.getByRole("navigation", { name: "Console" }).getByRole("link", { name: "Tenants" }).click();
    await page.getByRole("link", { name: `Usage of ${TENANT}` }).click();
    await page.getByRole("heading", { name: `Usage of ${TENANT}`, level: 1 }).waitFor();
    // Each replica writes its usage about once a second; the page reads every 5 s.
    await page.waitForFunction(
      () => {
        const cell = (f) => Number(document.querySelector(`tfoot [data-field="${f}"]`)?.textContent?.replace(/,/g, "") ?? "0");
        return cell("returns") >= 1 && cell("tokens_folded") > 0;
      },
      null,
      { timeout: 15_000 },
    );
    const total = Object.fromEntries(
      await page.locator("tfoot td[data-field]").evaluateAll((cells) =>
        cells.map((c) => [c.getAttribute("data-field"), Number(c.textContent.replace(/,/g, ""))]),
      ),
    );
    check("the total shows returns and the tokens folded", total.returns >= 1 && total.tokens_folded > 0, total);
    const api = await adminApi(args.admin, "GET", `/tenants/${TENANT}/usage`);
    check(
      "the same numbers as the admin API's report",
      api.status === 200 && api.body.total.returns === total.returns && api.body.total.tokens_folded === total.tokens_folded &&
        api.body.total.tokens_saved === total.tokens_saved,
      { api: api.body?.total, total },
    );
    const chart = page.getByRole("img", { name: /^Tokens by day, / });
    const label = (await chart.getAttribute("aria-label")) ?? "";
    const today = new Date().toISOString().slice(0, 10);
    const returnsWords = `${total.returns} ${total.returns === 1 ? "return" : "returns"}`;
    check(
      "the chart is an image whose name sums it up (seven days, returns, tokens folded)",
      label.includes(`to ${today} (UTC)`) && label.includes(returnsWords) && (await chart.locator("rect").count()) > 0,
      label,
    );
    const days = await page.locator(".chart-table tbody tr").count();
    const todayRow = await page.locator(".chart-table tbody tr").filter({ hasText: today }).innerText();
    check("its numbers are in a table: one row per day of the last seven", days === 7 && todayRow.length > 0, { days, todayRow });
    await screenshot("usage", true);
    await page.getByLabel("Group by").selectOption("upstream");
    await page.getByRole("button", { name: "Show" }).click();
    await page.getByRole("heading", { name: /^Tokens by upstream/ }).waitFor();
    check("grouping by upstream reads the report again", page.url().includes("group_by=upstream"), page.url());
  });

  // Upstreams and models: registered, watched and removed through the page.
  const registerUpstream = () => page.getByRole("form", { name: "Register an upstream" });
  const registerModel = () => page.getByRole("form", { name: "Register a chat model" });
  const upstreamRow = (name) => page.locator(`tr[data-upstream="${name}"]`);
  const modelRow = (name) => page.locator(`tr[data-model="${name}"]`);
  const cell = async (row, col) => (await row.locator(`[data-col="${col}"]`).innerText()).trim();

  await step("upstreams and models: the page", async () => {
    await page.getByRole("navigation", { name: "Console" }).getByRole("link", { name: "Upstreams and models" }).click();
    await page.getByRole("heading", { name: "Upstreams and models", level: 1 }).waitFor();
    // The configuration file's upstream and model: listed, read-only here.
    const files = upstreamRow("files");
    await files.waitFor();
    const filesSource = await cell(files, "source");
    check(
      "the configuration's upstream and model are listed read-only, with both registration forms for a deployment admin",
      filesSource.includes("configuration file") &&
        (await files.getByRole("button").count()) === 0 &&
        (await modelRow("scripted").count()) === 1 &&
        (await modelRow("scripted").getByRole("button").count()) === 0 &&
        (await registerUpstream().count()) === 1 &&
        (await registerModel().count()) === 1,
      filesSource,
    );
    await screenshot("federation-configured", true);
  });

  await step("upstreams and models: a literal secret is refused", async () => {
    const form = registerUpstream();
    await form.getByLabel("Name", { exact: true }).fill("console-files");
    await form.getByLabel("URL").fill(UPSTREAM_URL);
    await form.getByLabel("Tenants").fill(TENANT);
    await form.getByLabel("Tools allow-list").fill("read_file, list_files");
    await form.getByLabel("Header name 1").fill("Authorization");
    await form.getByLabel("Header value 1").fill(`Bearer ${args["upstream-secret"]}`);
    await form.getByRole("button", { name: "Register upstream" }).click();
    const refused = page.locator("#up-outcome.note-error");
    await refused.waitFor();
    const text = await refused.innerText();
    check(
      "the gateway's 400 is shown beside the form, naming the header",
      text.includes("400 invalid_request") && text.includes("headers.Authorization") &&
        text.includes("must be a reference to an environment variable") && !text.includes(args["upstream-secret"]),
      text,
    );
    const value = form.getByLabel("Header value 1");
    check(
      "the refusal takes the focus and marks the header's fields",
      (await page.evaluate(() => document.activeElement?.id)) === "up-outcome" &&
        (await value.getAttribute("aria-invalid")) === "true" &&
        (await value.getAttribute("aria-describedby")).split(" ").includes("up-outcome"),
    );
    const api = await adminApi(args.admin, "GET", "/upstreams");
    check(
      "and nothing was registered",
      api.status === 200 && api.body.upstreams.every((u) => u.source === "config"),
      api.body,
    );
    await screenshot("federation-refused-literal", true);
  });

  await step("upstreams and models: registering an upstream", async () => {
    const form = registerUpstream();
    // The rest of the form is kept; the value becomes a reference, Enter submits.
    const value = form.getByLabel("Header value 1");
    await value.fill("");
    await value.focus();
    await page.keyboard.insertText(`Bearer ${FILES_REF}`);
    await page.keyboard.press("Enter");
    const done = page.locator("#up-outcome.note-ok");
    await done.waitFor();
    check(
      "registering says so, and empties the form",
      (await done.innerText()).startsWith("Registered the upstream console-files.") &&
        (await form.getByLabel("Name", { exact: true }).inputValue()) === "",
      await done.innerText(),
    );
    const row = upstreamRow("console-files");
    await row.waitFor();
    await page.waitForFunction(
      () => document.querySelector('tr[data-upstream="console-files"] [data-col="status"]')?.textContent?.trim() === "Up",
      null,
      { timeout: 20_000 },
    );
    const tools = await cell(row, "tools");
    const source = await cell(row, "source");
    check(
      "it becomes Up (a word and a shape) with the 2 tools its allow-list keeps, for acme, registered by the operator",
      tools.startsWith("2") && tools.includes("only read_file, list_files") &&
        (await row.locator('[data-col="status"] svg').count()) === 1 &&
        (await cell(row, "tenants")) === TENANT && (await cell(row, "error")) === "none" &&
        source.includes("admin API") && source.includes("ops/console-operator"),
      { tools, source },
    );
    const api = await adminApi(args.admin, "GET", "/upstreams");
    const view = api.body?.upstreams?.find((u) => u.name === "console-files");
    check(
      "the admin API agrees: up, 2 tools, headers named but not shown",
      view?.up === true && view.tools === 2 && JSON.stringify(view.headers) === '["Authorization"]',
      view,
    );
    const listed = await listTools(args.agent);
    check(
      "the agent sees its allowed tools (console-files__read_file, not delete_file)",
      listed.includes("console-files__read_file") && listed.includes("console-files__list_files") &&
        !listed.includes("console-files__delete_file"),
      listed,
    );
    const called = await tool(args.agent, "console-files__read_file", { path: "README.md" });
    check(
      "and calls one through the gateway",
      !called.isError && JSON.stringify(called.content).includes("the contents of README.md"),
      called,
    );
    const wide = await page.evaluate(() => document.documentElement.scrollWidth <= window.innerWidth);
    check("the page fits a 1366-pixel-wide screen without scrolling sideways", wide);
    await screenshot("federation-upstream-up");
    await screenshot("federation-upstream-up-full", true);
  });

  await step("upstreams and models: registering a model", async () => {
    const form = registerModel();
    await form.getByLabel("Name", { exact: true }).fill("console-chat");
    await form.getByLabel("Provider").selectOption("anthropic");
    await form.getByLabel("Base URL").fill("http://127.0.0.1:9/v1");
    await form.getByLabel("Model id").fill("claude-test");
    await form.getByLabel("API key reference").fill("sk-literal-key");
    await form.getByLabel("Tenants").fill(TENANT);
    await form.getByRole("button", { name: "Register model" }).click();
    const refused = page.locator("#model-outcome.note-error");
    await refused.waitFor();
    const text = await refused.innerText();
    check(
      "a literal API key is refused with the gateway's message, naming api_key",
      text.includes("400 invalid_request") && text.includes("api_key:") &&
        (await form.getByLabel("API key reference").getAttribute("aria-invalid")) === "true",
      text,
    );
    await form.getByLabel("API key reference").fill(MODEL_REF);
    await form.getByRole("button", { name: "Register model" }).click();
    const done = page.locator("#model-outcome.note-ok");
    await done.waitFor();
    check("registering the model says so", (await done.innerText()).startsWith("Registered the model console-chat."));
    const row = modelRow("console-chat");
    await row.waitFor();
    await page.waitForFunction(
      () => document.querySelector('tr[data-model="console-chat"] [data-col="status"]')?.textContent?.trim() === "No calls yet",
      null,
      { timeout: 20_000 },
    );
    const model = (await row.locator("th").innerText()).replace(/\s+/g, " ");
    check(
      "it is listed with its provider, model id and base URL, no calls yet, registered by the operator",
      model.includes("console-chat") && model.includes("anthropic · claude-test") && model.includes("http://127.0.0.1:9/v1") &&
        (await cell(row, "calls")) === "0 (0)" && (await cell(row, "ok")) === "never" &&
        (await cell(row, "source")).includes("ops/console-operator"),
      model,
    );
    const api = await adminApi(args.admin, "GET", "/models");
    const view = api.body?.models?.find((m) => m.name === "console-chat");
    check(
      "the admin API lists it, with its health and without its key",
      view?.provider === "anthropic" && view.health?.attempts === 0 && view.source === "api" &&
        !JSON.stringify(api.body).includes(`${args["credential-prefix"]}MODEL`),
      view,
    );
    await screenshot("federation-model-registered", true);
  });

  await step("upstreams and models: removing the upstream", async () => {
    const row = upstreamRow("console-files");
    await row.getByRole("button", { name: "Remove the upstream console-files" }).click();
    await row.getByRole("group").waitFor();
    const focused = await page.evaluate(() => document.activeElement?.textContent);
    check("removing asks first, with the focus on Cancel", focused === "Cancel", focused);
    await screenshot("federation-remove-confirm");
    await row.getByRole("button", { name: "Yes, remove it" }).click();
    const notice = page.locator(".note-ok").filter({ hasText: "Removed the upstream console-files." });
    await notice.waitFor();
    await row.waitFor({ state: "detached" });
    const api = await adminApi(args.admin, "GET", "/upstreams");
    check(
      "it is gone from the page and the admin API, and the outcome takes the focus",
      !api.body?.upstreams?.some((u) => u.name === "console-files") &&
        (await page.evaluate(() => document.activeElement?.classList.contains("note-ok"))),
      api.body,
    );
    let listed = [];
    for (let i = 0; i < 20; i++) {
      listed = await listTools(args.agent);
      if (!listed.some((t) => t.startsWith("console-files__"))) break;
      await page.waitForTimeout(250);
    }
    check("its tools leave the agent's tools/list", !listed.some((t) => t.startsWith("console-files__")), listed);
    await screenshot("federation-upstream-removed");
  });

  await step("a tenant admin sees only its own tenant", async () => {
    await page.getByRole("button", { name: "Sign out" }).click();
    await page.getByRole("heading", { name: "Sign in to the foldgate console" }).waitFor();
    const left = await page.evaluate(() => Object.keys(sessionStorage).length);
    check("signing out forgets the token", left === 0, left);
    // Signing in again would stay on this session's page: start from the tenants.
    await page.goto(`${BASE}/console/`);
    await page.getByLabel("Admin bearer token").fill(args["tenant-admin"]);
    await page.getByRole("button", { name: "Sign in" }).click();
    await page.getByRole("heading", { name: "Tenants", level: 1 }).waitFor();
    await page.getByRole("link", { name: TENANT, exact: true }).waitFor();
    const links = await page.locator("tbody th a").allInnerTexts();
    check("a tenant admin's tenants list holds its own tenant only", links.length === 1 && links[0] === TENANT, links);
    await screenshot("tenant-admin-tenants");
    await page.goto(`${BASE}/console/sessions?tenant=${OTHER}`);
    const alert = page.getByRole("alert");
    await alert.waitFor();
    const text = await alert.innerText();
    check("another tenant's sessions: no such tenant (404)", text.includes("no such tenant (404 not_found)"), text);
    await screenshot("tenant-admin-other-tenant");
    const api = await adminApi(args["tenant-admin"], "GET", `/tenants/${OTHER}/sessions`);
    check("the admin API agrees: 404 for the tenant admin", api.status === 404, api);
  });

  await step("a tenant admin reads its limits, read-only", async () => {
    await page.goto(`${BASE}/console/limits?tenant=${TENANT}`);
    await page.getByRole("heading", { name: `Limits of ${TENANT}`, level: 1 }).waitFor();
    await limitRow("max_budget").waitFor();
    const note = await page.getByRole("region", { name: "Read only" }).innerText();
    const inputs = await page.locator("main input, main button").count();
    check(
      "a tenant admin sees the limits without a form, and why",
      (await limitValue("max_budget"))[0] === "48,000" && inputs === 0 && note.includes("foldgate:admin"),
      { inputs, note },
    );
    await screenshot("tenant-admin-limits", true);
    const put = await adminApi(args["tenant-admin"], "PUT", `/tenants/${TENANT}/limits`, { tokens_per_day: 99999999 });
    check("the admin API refuses a tenant admin's change: 403 forbidden", put.status === 403 && put.body?.error?.code === "forbidden", put);
  });

  await step("a tenant admin reads the upstreams and models, without forms", async () => {
    await page.goto(`${BASE}/console/`);
    await page.getByRole("navigation", { name: "Console" }).getByRole("link", { name: "Upstreams and models" }).click();
    await page.getByRole("heading", { name: "Upstreams and models", level: 1 }).waitFor();
    await modelRow("console-chat").waitFor();
    const controls = await page.locator("main form, main input, main button").count();
    const alerts = await page.getByRole("alert").count();
    const note = await page.getByRole("region", { name: "Read only" }).innerText();
    check(
      "a tenant admin sees the model serving acme, no form or button, no refusal, and why",
      controls === 0 && alerts === 0 && note.includes("foldgate:admin") &&
        (await upstreamRow("files").count()) === 1,
      { controls, alerts, note },
    );
    await screenshot("tenant-admin-federation", true);
    const post = await adminApi(args["tenant-admin"], "POST", "/models", {
      name: "acme-own", provider: "openai", base_url: "http://127.0.0.1:9/v1", model: "m",
    });
    check("the admin API refuses a tenant admin's registration: 403 forbidden", post.status === 403 && post.body?.error?.code === "forbidden", post);
  });

  check("no script errors or Content-Security-Policy violations in the page", problems.length === 0, problems);

  if (args["oidc-base"]) await signInWithProvider();
} finally {
  await browser.close();
  upstreamServer.closeAllConnections();
  upstreamServer.close();
}

console.log(`\n${passed} passed, ${failed} failed`);
process.exit(failed === 0 ? 0 : 1);

// --- sign-in with the OpenID Connect provider -----------------------------------------------
async function signInWithProvider() {
  const OIDC = args["oidc-base"];
  const ISSUER = args["oidc-issuer"];
  const PROVIDER = ISSUER.replace(/^https?:\/\//, "");
  const signInButton = (p) => p.getByRole("button", { name: `Sign in with ${PROVIDER}` });
  const oidcProblems = [];
  async function tab() {
    // A browser of its own: no session at the provider yet.
    const ctx = await browser.newContext({ viewport: { width: 1366, height: 768 }, locale: "en-GB" });
    const p = await ctx.newPage();
    p.setDefaultTimeout(15_000);
    p.on("console", (m) => {
      // The test provider has no favicon.
      const missingAtProvider = p.url().startsWith(ISSUER) && /status of 404/.test(m.text());
      if (m.type() === "error" && !missingAtProvider) oidcProblems.push(`${p.url()}: ${m.text()}`);
    });
    p.on("pageerror", (e) => oidcProblems.push(`page error: ${e.message}`));
    return p;
  }
  /** From the console to the provider's login form, signed in there. */
  async function logIn(p, password = args["oidc-password"]) {
    await signInButton(p).click();
    await p.waitForURL((url) => url.href.startsWith(`${ISSUER}/interaction/`));
    await p.getByLabel("Username").fill("operator");
    await p.getByLabel("Password").fill(password);
    await p.getByRole("button", { name: "Sign in" }).click();
  }

  /** An agent's access token from a provider (client credentials) for `resource`. */
  async function agentToken(issuer, secret, resource) {
    const response = await fetch(`${issuer}/token`, {
      method: "POST",
      body: new URLSearchParams({
        grant_type: "client_credentials",
        client_id: "agent",
        client_secret: secret,
        resource,
        scope: "fold:read fold:write",
      }),
    });
    const body = await response.json();
    if (!body.access_token) throw new Error(`no token from ${issuer}: ${JSON.stringify(body)}`);
    return body.access_token;
  }
  const claimsOf = (jwt) => JSON.parse(Buffer.from(jwt.split(".")[1] ?? "", "base64url").toString() || "{}");

  await step("an agent folds a branch with a token from the provider", async () => {
    const agent = await agentToken(ISSUER, args["oidc-agent-secret"], `${OIDC}/mcp`);
    const branch = await createBranch(agent, "oidc-session", "a branch behind the provider's token", {}, OIDC);
    check("the gateway takes the provider's JWTs (discovery from its issuer, audience, tenant claim)", Boolean(branch), branch);
  });

  const ISSUER_B = args["oidc-issuer-b"];
  if (ISSUER_B) {
    await step("an agent of the second provider folds a branch under its own tenant claim", async () => {
      const agent = await agentToken(ISSUER_B, args["oidc-agent-secret-b"], args["oidc-audience-b"]);
      const claims = claimsOf(agent);
      const branch = await createBranch(agent, "oidc-session-b", "a branch behind the second provider's token", {}, OIDC);
      check(
        "the gateway takes the second provider's JWTs (its own audience, the tenant in `org`)",
        Boolean(branch) && claims.iss === ISSUER_B && claims.aud === args["oidc-audience-b"] && claims.org === "globex" && !("tenant" in claims),
        { branch, claims },
      );
    });

    await step("a token of the second provider for the first one's audience is refused", async () => {
      const token = await agentToken(ISSUER_B, args["oidc-agent-secret-b"], `${OIDC}/mcp`);
      const response = await fetch(`${OIDC}/mcp`, {
        method: "POST",
        headers: {
          Authorization: `Bearer ${token}`,
          "Content-Type": "application/json",
          Accept: "application/json, text/event-stream",
          "MCP-Protocol-Version": "2025-11-25",
        },
        body: JSON.stringify({ jsonrpc: "2.0", id: 1, method: "tools/call", params: { name: "branch_status", arguments: { session_id: "oidc-session-b" } } }),
      });
      const challenge = response.headers.get("www-authenticate") ?? "";
      check(
        "refused with 401: the second provider's token carries the first one's audience, not its own",
        response.status === 401 && claimsOf(token).aud === `${OIDC}/mcp` && challenge.includes("audience mismatch"),
        { status: response.status, challenge },
      );
    });

    await step("the metadata lists both providers", async () => {
      const metadata = await (await fetch(`${OIDC}/.well-known/oauth-protected-resource/mcp`)).json();
      check(
        "/.well-known/oauth-protected-resource names both issuers as authorization servers",
        JSON.stringify(metadata.authorization_servers) === JSON.stringify([ISSUER, ISSUER_B]),
        metadata,
      );
    });
  }

  const first = await tab();
  await step("with a provider configured, the sign-in page offers it", async () => {
    const response = await first.goto(`${OIDC}/console/`);
    const csp = response.headers()["content-security-policy"] ?? "";
    check(
      "the policy lets the page reach the provider's origin, and nothing else changes",
      csp.includes(`connect-src 'self' ${ISSUER};`) && csp.includes("script-src 'self';") && csp.includes("form-action 'self'"),
      csp,
    );
    const settings = await (await fetch(`${OIDC}/console/config.json`)).json();
    check(
      "/console/config.json names the issuer, the public client, the scopes and the resource",
      settings.oidc?.issuer === ISSUER &&
        settings.oidc?.client_id === "foldgate-console" &&
        settings.oidc?.scopes.join(" ") === "openid foldgate:admin tenant:admin" &&
        settings.oidc?.token === "access_token" &&
        settings.oidc?.resource === `${OIDC}/mcp`,
      settings,
    );
    const plain = await (await fetch(`${BASE}/console/config.json`)).json();
    check("without a provider, config.json says so and the policy is unchanged", plain.oidc === null, plain);
    await signInButton(first).waitFor();
    const focused = await first.evaluate(() => document.activeElement?.textContent ?? "");
    check(
      `the page offers "Sign in with ${PROVIDER}" first, and the token field stays`,
      focused === `Sign in with ${PROVIDER}` && (await first.getByLabel("Admin bearer token").isVisible()),
      focused,
    );
    await screenshot("oidc-sign-in", false, first);
  });

  await step("an answer with a state this tab did not send is refused", async () => {
    await signInButton(first).click();
    await first.waitForURL((url) => url.href.startsWith(`${ISSUER}/interaction/`));
    await first.goto(`${OIDC}/console/callback?code=forged-code&state=forged-state&iss=${encodeURIComponent(ISSUER)}`);
    const alert = first.getByRole("alert");
    await alert.waitFor();
    const text = await alert.innerText();
    const token = await first.evaluate(() => sessionStorage.getItem("foldgate.console.token"));
    check(
      "a forged answer: its state differs, nothing is exchanged, and the console leaves the callback address",
      text.includes("does not belong to the sign-in this tab started (its state differs)") &&
        token === null &&
        first.url() === `${OIDC}/console/`,
      { text, url: first.url() },
    );
    await screenshot("oidc-bad-state", false, first);
    await first.goto(`${OIDC}/console/callback?code=replayed&state=forged-state`);
    const again = await first.getByRole("alert").innerText();
    check("an answer with no sign-in waiting in the tab is refused", again.includes("no sign-in waiting"), again);
  });

  await step("a sign-in the user denies at the provider", async () => {
    await first.goto(`${OIDC}/console/`);
    await logIn(first, "not the password");
    const wrong = await first.getByRole("alert").innerText();
    check("the provider's login form refuses a wrong password", wrong.includes("Wrong username or password"), wrong);
    await first.getByLabel("Password").fill(args["oidc-password"]);
    await first.getByLabel("Username").fill("operator");
    await first.getByRole("button", { name: "Sign in" }).click();
    await first.getByRole("heading", { name: "Allow access" }).waitFor();
    await first.getByRole("button", { name: "Deny" }).click();
    await first.waitForURL(`${OIDC}/console/`);
    const alert = first.getByRole("alert");
    await alert.waitFor();
    const text = await alert.innerText();
    check(
      "the refusal is shown (access_denied and the provider's description), the paste still offered",
      text.includes(`${PROVIDER} did not sign you in: access_denied (End-User aborted interaction)`) &&
        (await first.getByLabel("Admin bearer token").isVisible()) &&
        (await signInButton(first).isVisible()),
      text,
    );
    const stored = await first.evaluate(() => Object.keys(sessionStorage));
    check("nothing is kept after a refusal", stored.length === 0, stored);
    await screenshot("oidc-denied", false, first);
  });

  const second = await tab();
  await step("signing in through the provider's login and consent", async () => {
    await second.goto(`${OIDC}/console/`);
    await logIn(second);
    await second.getByRole("heading", { name: "Allow access" }).waitFor();
    const asked = await second.locator("main p").first().innerText();
    check(
      "the consent page lists the scopes the console asks for",
      ["openid", "foldgate:admin", "tenant:admin"].every((s) => asked.includes(s)),
      asked,
    );
    await screenshot("oidc-consent", false, second);
    await second.getByRole("button", { name: "Allow" }).click();
    await second.getByRole("heading", { name: "Tenants", level: 1 }).waitFor();
    await second.getByRole("link", { name: "acme", exact: true }).waitFor();
    const who = await second.locator(".who").innerText();
    check(
      "back in the console, signed in as the provider's user, the tenants page loads",
      second.url() === `${OIDC}/console/` && who.includes("operator (ops)") && who.includes("foldgate:admin"),
      { url: second.url(), who },
    );
    const stored = await second.evaluate(() => ({
      keys: Object.keys(sessionStorage),
      token: sessionStorage.getItem("foldgate.console.token") ?? "",
    }));
    const claims = JSON.parse(Buffer.from(stored.token.split(".")[1] ?? "", "base64url").toString() || "{}");
    check(
      "the access token is kept as a pasted one (sessionStorage, alone): a JWT of the provider for the gateway",
      stored.keys.length === 1 && claims.iss === ISSUER && claims.aud === `${OIDC}/mcp` && claims.tenant === "ops",
      { keys: stored.keys, claims },
    );
    await screenshot("oidc-tenants", false, second);
    if (ISSUER_B) {
      // Each agent's session is under the tenant its own provider's claim named.
      const session = async (tenant, id) =>
        (await fetch(`${OIDC}/admin/v1/tenants/${tenant}/sessions/${id}`, { headers: { Authorization: `Bearer ${stored.token}` } })).status;
      const seen = {
        "acme/oidc-session": await session("acme", "oidc-session"),
        "globex/oidc-session-b": await session("globex", "oidc-session-b"),
        "acme/oidc-session-b": await session("acme", "oidc-session-b"),
        "globex/oidc-session": await session("globex", "oidc-session"),
      };
      check(
        "the admin API shows the first agent's session under acme (`tenant`) and the second's under globex (`org`)",
        seen["acme/oidc-session"] === 200 && seen["globex/oidc-session-b"] === 200 &&
          seen["acme/oidc-session-b"] === 404 && seen["globex/oidc-session"] === 404 &&
          (await second.getByRole("link", { name: "globex", exact: true }).isVisible()),
        seen,
      );
    }
    await second.getByRole("button", { name: "Sign out" }).click();
    await signInButton(second).waitFor();
  });

  check("no script errors or Content-Security-Policy violations during the sign-ins", oidcProblems.length === 0, oidcProblems);
}
