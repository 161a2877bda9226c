// The web console in a headless Chromium against a real foldgate, while an
// MCP client (plain JSON-RPC over HTTP to /mcp) folds branches:
//   sign-in (refusals on a bad token and on a token without an admin scope,
//   then keyboard-only with an admin token), the tenants, a tenant's open
//   sessions, a live session whose tree shows a branch appear and end as the
//   client creates and returns it, a branch's details (its result as text),
//   ending a branch from the console (and the agent finding it ended), the
//   audit entry, ending the session, and a tenant admin who cannot see
//   another tenant. Screenshots of every step go to --shots.
//
// Usage: node console.test.mjs --base http://127.0.0.1:PORT --admin JWT --tenant-admin JWT
//          --agent JWT --other-agent JWT --mcp-only JWT --shots DIR
// Prints `N passed, N failed` last; exits 1 on any failure.

import { mkdirSync } from "node:fs";
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
    shots: { type: "string" },
    chromium: { type: "string", default: "/usr/bin/chromium" },
  },
});
for (const name of ["base", "admin", "tenant-admin", "agent", "other-agent", "mcp-only", "shots"]) {
  if (!args[name]) {
    console.error(`missing --${name}`);
    process.exit(2);
  }
}
const BASE = args.base;
const TENANT = "acme";
const OTHER = "globex";
const SESSION = `console-live-${Date.now().toString(36)}`;
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
async function tool(token, name, args) {
  rpcId += 1;
  const response = await fetch(`${BASE}/mcp`, {
    method: "POST",
    headers: {
      Authorization: `Bearer ${token}`,
      "Content-Type": "application/json",
      Accept: "application/json, text/event-stream",
      "MCP-Protocol-Version": "2025-11-25",
    },
    body: JSON.stringify({ jsonrpc: "2.0", id: rpcId, method: "tools/call", params: { name, arguments: args } }),
  });
  const text = await response.text();
  if (!response.ok) throw new Error(`${name}: HTTP ${response.status} ${text}`);
  const message = JSON.parse(text);
  if (message.error) throw new Error(`${name}: ${JSON.stringify(message.error)}`);
  return message.result;
}

async function createBranch(token, session, description, extra = {}) {
  const result = await tool(token, "branch_create", {
    session_id: session,
    description,
    prompt: `Work on: ${description}`,
    budget: 4000,
    timeout_seconds: 300,
    ...extra,
  });
  if (result.isError) throw new Error(`branch_create refused: ${JSON.stringify(result.content)}`);
  return result.structuredContent.branch_id;
}

async function adminApi(token, method, path) {
  const response = await fetch(`${BASE}/admin/v1${path}`, {
    method,
    headers: { Authorization: `Bearer ${token}` },
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
  if (m.type() === "error" && !/status of 40[134]/.test(m.text())) problems.push(m.text());
});
page.on("pageerror", (e) => problems.push(`page error: ${e.message}`));
page.setDefaultTimeout(10_000);

let shot = 0;
async function screenshot(name) {
  shot += 1;
  const file = join(args.shots, `${String(shot).padStart(2, "0")}-${name}.png`);
  await page.screenshot({ path: file, fullPage: false });
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

  check("no script errors or Content-Security-Policy violations in the page", problems.length === 0, problems);
} finally {
  await browser.close();
}

console.log(`\n${passed} passed, ${failed} failed`);
process.exit(failed === 0 ? 0 : 1);
