// Drive foldgate with the official TypeScript MCP SDK (npm @modelcontextprotocol/sdk).
//
// Lists the tools, then runs branch_create -> branch_status -> branch_return -> session_end and
// checks the structured results.
//
// Usage: node ts_client.mjs --url http://127.0.0.1:8080/mcp --token JWT
// The token may also come from FOLDGATE_TOKEN. Prints `N passed, N failed` last; exits 1 on any
// failure.

import { randomUUID } from "node:crypto";
import { parseArgs } from "node:util";

import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";

const EXPECTED_TOOLS = ["branch_create", "branch_status", "branch_return", "session_end"];

const { values: args } = parseArgs({
  options: { url: { type: "string" }, token: { type: "string" } },
});
const url = args.url;
const token = args.token ?? process.env.FOLDGATE_TOKEN;
if (!url || !token) {
  console.error("usage: node ts_client.mjs --url URL --token JWT (or FOLDGATE_TOKEN)");
  process.exit(2);
}

let passed = 0;
let failed = 0;
function check(label, ok, detail = "") {
  if (ok) {
    passed += 1;
    console.log(`ok   ${label}`);
  } else {
    failed += 1;
    console.log(`FAIL ${label}: ${typeof detail === "string" ? detail : JSON.stringify(detail)}`);
  }
  return ok;
}

function structured(result) {
  const data = result.structuredContent;
  if (data === null || typeof data !== "object") {
    throw new Error(`no structured content: ${JSON.stringify(result)}`);
  }
  return data;
}

async function run() {
  const transport = new StreamableHTTPClientTransport(new URL(url), {
    requestInit: { headers: { Authorization: `Bearer ${token}` } },
  });
  const client = new Client({ name: "foldgate-interop-ts", version: "0.1.0" });
  await client.connect(transport);
  try {
    const version = transport.protocolVersion;
    check(`connected (protocol ${version})`, typeof version === "string" && version.length > 0, version);
    check(
      "server identifies as foldgate",
      client.getServerVersion()?.name === "foldgate",
      client.getServerVersion(),
    );
    check("server declares the tools capability", Boolean(client.getServerCapabilities()?.tools));

    const listed = await client.listTools();
    const names = listed.tools.map((tool) => tool.name);
    check(
      "tools/list has the folding tools",
      EXPECTED_TOOLS.every((name) => names.includes(name)),
      names,
    );

    const sessionId = `interop-ts-${randomUUID().slice(0, 12)}`;
    const created = await client.callTool({
      name: "branch_create",
      arguments: {
        session_id: sessionId,
        description: "interop check from the TypeScript SDK",
        prompt: "Summarise the interop run.",
        budget: 1500,
        timeout_seconds: 120,
      },
    });
    check("branch_create is not an error", created.isError !== true, created.content);
    const data = structured(created);
    const branchId = data.branch_id;
    check("branch_create returns a branch_id", typeof branchId === "string" && branchId.length > 0, data);
    check("first branch has depth 1", data.depth === 1, data);
    check("budget_allocated is 1500", data.budget_allocated === 1500, data);

    const status = await client.callTool({ name: "branch_status", arguments: { branch_id: branchId } });
    check("branch_status is not an error", status.isError !== true, status.content);
    const sdata = structured(status);
    check("branch_status names the branch", sdata.branch_id === branchId, sdata);
    check("branch_status reports it active", sdata.status === "active", sdata);
    check("branch_status session_id matches", sdata.session_id === sessionId, sdata);

    const message = "Done: the TypeScript SDK talked to foldgate.";
    const returned = await client.callTool({
      name: "branch_return",
      arguments: { branch_id: branchId, message, outcome: "success" },
    });
    check("branch_return is not an error", returned.isError !== true, returned.content);
    const rdata = structured(returned);
    check("branch_return success is true", rdata.success === true, rdata);
    check(
      "branch_return tokens_used is a non-negative integer",
      Number.isInteger(rdata.tokens_used) && rdata.tokens_used >= 0,
      rdata,
    );
    check("branch_return echoes the message", rdata.message === message, rdata);

    const after = structured(
      await client.callTool({ name: "branch_status", arguments: { branch_id: branchId } }),
    );
    check("branch_status after return is completed", after.status === "completed", after);

    const ended = await client.callTool({ name: "session_end", arguments: { session_id: sessionId } });
    check("session_end is not an error", ended.isError !== true, ended.content);
  } finally {
    await client.close();
  }
}

try {
  await run();
} catch (error) {
  console.error(error);
  check("run completed", false, String(error?.message ?? error));
}
console.log(`${passed} passed, ${failed} failed`);
process.exit(failed > 0 ? 1 : 0);
