#!/usr/bin/env bash
# The web console (/console) in a headless browser against a real foldgate:
#   1. the console build committed in crates/foldgate-console/assets is what `npm ci && npm run
#      build` in console/ produces, byte for byte;
#   2. `foldgate serve` on loopback (SQLite in a temporary directory, a known JWT secret, the
#      testkit's files MCP server as an upstream and its scripted model server as a model for
#      tenant acme) with Debian's Chromium driven by npm playwright-core
#      (tests/console/console.test.mjs), while a plain JSON-RPC MCP client creates, returns and
#      has branches ended under it, calls the upstream inside a branch and has the gateway run
#      a branch on the scripted model (tests/console/model-script.json);
#   3. sign-in with an OpenID Connect provider: npm oidc-provider on loopback
#      (tests/console/oidc-provider.mjs) and a second `foldgate serve` that trusts it by OpenID
#      Connect discovery from its issuer URL and whose console signs in there ([console] oidc_*);
#      that gateway also trusts a second oidc-provider ([[auth.issuers]]) with another audience
#      and another tenant claim, and agents of both fold branches under their own tenants.
# Installs what it needs: Chromium with apt-get if /usr/bin/chromium is missing (Playwright never
# downloads a browser), `npm ci` in console/ and tests/console. Screenshots of each step go to
# target/console-screenshots/. Prints `N passed, N failed` last and exits non-zero on any failure.
# FOLDGATE_BIN=path uses that foldgate binary, FOLDGATE_TESTKIT_BIN=dir the testkit's
# foldgate-files-upstream and foldgate-model-server found there, instead of building them.
set -euo pipefail
exec </dev/null
cd "$(dirname "$0")/../.."

ROOT=$(pwd)
HERE="$ROOT/tests/console"
SHOTS="$ROOT/target/console-screenshots"
CHROMIUM=/usr/bin/chromium
export CARGO_BUILD_JOBS="${CARGO_BUILD_JOBS:-2}"
export CARGO_TERM_COLOR=never

log() { printf '\n== console: %s\n' "$*"; }

# wait_url FILE PID PREFIX: the URL a server prints after PREFIX on its first such line of
# FILE, once it has (at most 30 s); nothing if it exits or never does.
wait_url() {
  local file=$1 pid=$2 prefix=$3 i url
  for ((i = 0; i < 150; i++)); do
    url=$(sed -n "s|^$prefix \(http[^ ]*\)\$|\1|p" "$file" 2>/dev/null | head -n 1)
    if [ -n "$url" ]; then
      echo "$url"
      return 0
    fi
    kill -0 "$pid" 2>/dev/null || return 0
    sleep 0.2
  done
}

PASSED=0
FAILED=0
pass() { PASSED=$((PASSED + 1)); echo "PASS $*"; }
fail() { FAILED=$((FAILED + 1)); echo "FAIL $*"; }

# shellcheck source=tests/servers.sh
source "$ROOT/tests/servers.sh"

# --- prerequisites ----------------------------------------------------------------------
log "prerequisites"
command -v node >/dev/null || { echo "node is required (>= 20)"; exit 1; }
command -v npm >/dev/null || { echo "npm is required"; exit 1; }
command -v python3 >/dev/null || { echo "python3 is required (to find free ports)"; exit 1; }
if [ ! -x "$CHROMIUM" ]; then
  echo "no $CHROMIUM: installing Debian's chromium"
  apt-get update
  DEBIAN_FRONTEND=noninteractive apt-get install -y chromium
fi
"$CHROMIUM" --version 2>/dev/null | grep -i chromium || { echo "$CHROMIUM does not run"; exit 1; }

# --- 1. the committed build is reproducible ------------------------------------------------
log "the committed console build is what console/ builds (npm ci && npm run build)"
ASSETS=crates/foldgate-console/assets
(cd "$ROOT/console" && npm ci --no-audit --no-fund --loglevel=error && npm run --silent build >/dev/null)
if git diff --quiet --exit-code -- "$ASSETS" &&
  [ -z "$(git status --porcelain --untracked-files=all -- "$ASSETS")" ]; then
  pass "console build reproduces the committed $ASSETS"
else
  fail "console build differs from the committed $ASSETS (rebuild and commit it):"
  git status --short --untracked-files=all -- "$ASSETS"
fi

# --- 2. the console in Chromium ----------------------------------------------------------
log "npm ci in tests/console"
(cd "$HERE" && npm ci --no-audit --no-fund --loglevel=error)

if [ -n "${FOLDGATE_BIN:-}" ]; then
  FOLDGATE=$FOLDGATE_BIN
else
  log "cargo build -p foldgate"
  cargo build -p foldgate
  FOLDGATE="${CARGO_TARGET_DIR:-$ROOT/target}/debug/foldgate"
fi
[ -x "$FOLDGATE" ] || { echo "no foldgate binary at $FOLDGATE"; exit 1; }
if [ -n "${FOLDGATE_TESTKIT_BIN:-}" ]; then
  TESTKIT=$FOLDGATE_TESTKIT_BIN
else
  log "cargo build -p foldgate-testkit --bin foldgate-files-upstream --bin foldgate-model-server"
  cargo build -p foldgate-testkit --bin foldgate-files-upstream --bin foldgate-model-server
  TESTKIT="${CARGO_TARGET_DIR:-$ROOT/target}/debug"
fi
for bin in foldgate-files-upstream foldgate-model-server; do
  [ -x "$TESTKIT/$bin" ] || { echo "no $bin binary in $TESTKIT"; exit 1; }
done

DIR=$(mktemp -d)
TMPDIRS+=("$DIR")
log "the files MCP server and the scripted model server on loopback"
"$TESTKIT/foldgate-files-upstream" --tools read_file,fail >"$DIR/upstream.out" 2>"$DIR/upstream.err" &
PIDS+=($!)
UPSTREAM_URL=$(wait_url "$DIR/upstream.out" $! "files upstream at")
"$TESTKIT/foldgate-model-server" --script "$HERE/model-script.json" \
  >"$DIR/model.out" 2>"$DIR/model.err" &
PIDS+=($!)
MODEL_URL=$(wait_url "$DIR/model.out" $! "model server at")
if [ -z "$UPSTREAM_URL" ] || [ -z "$MODEL_URL" ]; then
  echo "the upstream or the model server did not start; their output:"
  cat "$DIR"/upstream.* "$DIR"/model.* || true
  fail "the files upstream and the model server started"
  echo
  echo "$PASSED passed, $FAILED failed"
  exit 1
fi
echo "files upstream at $UPSTREAM_URL, model server at $MODEL_URL"
cat >"$DIR/foldgate.toml" <<TOML
[[upstreams]]
name = "files"
url = "$UPSTREAM_URL"
tenants = ["acme"]
refresh_seconds = 1

[[models]]
name = "scripted"
provider = "openai"
base_url = "$MODEL_URL"
model = "console-test"
api_key = "\${LLM_API_KEY}"
tenants = ["acme"]
timeout_seconds = 30
TOML

# started FILE PATTERN PID: waits up to a minute for PATTERN in FILE while PID runs.
started() {
  local i
  for ((i = 0; i < 300; i++)); do
    grep -qE "$2" "$1" 2>/dev/null && return 0
    kill -0 "$3" 2>/dev/null || return 1
    sleep 0.2
  done
  return 1
}

log "foldgate serve on loopback (SQLite)"
read -r PORT OPS_PORT IDP_PORT IDP_B_PORT OIDC_PORT OIDC_OPS_PORT < <(free_ports 6)
SECRET=$(python3 -c 'import secrets; print(secrets.token_hex(32))')
LLM_KEY="sk-console-$(python3 -c 'import secrets; print(secrets.token_hex(16))')"
# What the upstream the browser test registers wants, and a registered model's key: registrations
# may only reference variables named with the credential prefix (the default, FOLDGATE_SECRET_),
# set on the gateway.
UPSTREAM_SECRET=$(python3 -c 'import secrets; print(secrets.token_hex(16))')
CREDENTIAL_PREFIX=FOLDGATE_SECRET_
(cd "$DIR" && exec env "${clean_env[@]}" FOLDGATE_JWT_SECRET="$SECRET" LLM_API_KEY="$LLM_KEY" \
  "${CREDENTIAL_PREFIX}FILES=$UPSTREAM_SECRET" "${CREDENTIAL_PREFIX}MODEL=not-a-real-key" \
  "$FOLDGATE" serve --config "$DIR/foldgate.toml" --database-url "sqlite://$DIR/console.db" \
  --listen "127.0.0.1:$PORT" --ops-listen "127.0.0.1:$OPS_PORT" >"$DIR/stdout" 2>"$DIR/stderr") &
PIDS+=($!)
SERVER_PID=$!

# Two providers, and a gateway that trusts both: the first found by discovery from its issuer
# URL (the MCP URL as audience, the tenant in `tenant`), whose console signs in there asking for
# that audience as the resource; the second also by discovery, with its own audience and the
# tenant in `org`. The second provider also issues tokens for the first one's audience, which the
# gateway must refuse.
ISSUER="http://127.0.0.1:$IDP_PORT"
ISSUER_B="http://127.0.0.1:$IDP_B_PORT"
AUDIENCE_B="api://foldgate-b"
OIDC_BASE="http://127.0.0.1:$OIDC_PORT"
# Random secrets may start with `-`: they are passed as `--name=value`, which
# node's parseArgs reads as the value whatever it starts with.
OIDC_PASSWORD=$(python3 -c 'import secrets; print(secrets.token_urlsafe(12))')
OIDC_AGENT_SECRET=$(python3 -c 'import secrets; print(secrets.token_urlsafe(24))')
OIDC_AGENT_SECRET_B=$(python3 -c 'import secrets; print(secrets.token_urlsafe(24))')
oidc_args=()
(cd "$HERE" && exec node oidc-provider.mjs --port "$IDP_PORT" --gateway "$OIDC_BASE" \
  --audience "$OIDC_BASE/mcp" --password="$OIDC_PASSWORD" --agent-secret="$OIDC_AGENT_SECRET" \
  >"$DIR/idp.stdout" 2>"$DIR/idp.stderr") &
PIDS+=($!)
IDP_PID=$!
(cd "$HERE" && exec node oidc-provider.mjs --port "$IDP_B_PORT" --gateway "$OIDC_BASE" \
  --audience "$AUDIENCE_B" --audience "$OIDC_BASE/mcp" --tenant-claim org --agent-tenant globex \
  --password="$OIDC_PASSWORD" --agent-secret="$OIDC_AGENT_SECRET_B" \
  >"$DIR/idp-b.stdout" 2>"$DIR/idp-b.stderr") &
PIDS+=($!)
IDP_B_PID=$!
cat >"$DIR/oidc.toml" <<TOML
[[auth.issuers]]
issuer = "$ISSUER"
discovery = true

[[auth.issuers]]
issuer = "$ISSUER_B"
discovery = true
audience = "$AUDIENCE_B"
tenant_claim = "org"
TOML
if started "$DIR/idp.stdout" '^oidc provider listening at ' "$IDP_PID" &&
  started "$DIR/idp-b.stdout" '^oidc provider listening at ' "$IDP_B_PID"; then
  (cd "$DIR" && exec env "${clean_env[@]}" \
    FOLDGATE_CONSOLE__OIDC_CLIENT_ID=foldgate-console FOLDGATE_CONSOLE__OIDC_RESOURCE="$OIDC_BASE/mcp" \
    "$FOLDGATE" serve --config "$DIR/oidc.toml" --database-url "sqlite://$DIR/oidc.db" \
    --listen "127.0.0.1:$OIDC_PORT" --ops-listen "127.0.0.1:$OIDC_OPS_PORT" \
    >"$DIR/oidc.stdout" 2>"$DIR/oidc.stderr") &
  PIDS+=($!)
  if started "$DIR/oidc.stdout" '^foldgate is serving MCP at ' $!; then
    oidc_args=(--oidc-base "$OIDC_BASE" --oidc-issuer "$ISSUER" --oidc-password="$OIDC_PASSWORD"
      --oidc-agent-secret="$OIDC_AGENT_SECRET" --oidc-issuer-b "$ISSUER_B"
      --oidc-audience-b "$AUDIENCE_B" --oidc-agent-secret-b="$OIDC_AGENT_SECRET_B")
  else
    echo "the gateway with OpenID Connect sign-in did not start; its output:"
    cat "$DIR/oidc.stdout" "$DIR/oidc.stderr" || true
    fail "foldgate serve with [[auth.issuers]] and [console] oidc_client_id started"
  fi
else
  echo "the OpenID Connect providers did not start; their output:"
  cat "$DIR"/idp.std* "$DIR"/idp-b.std* || true
  fail "the OpenID Connect providers (oidc-provider) started"
fi

if ! started "$DIR/stdout" '^foldgate is serving MCP at ' "$SERVER_PID"; then
  echo "foldgate did not start; its output:"
  cat "$DIR/stdout" "$DIR/stderr" || true
  fail "foldgate serve started"
else
  token() {
    env "${clean_env[@]}" FOLDGATE_JWT_SECRET="$SECRET" FOLDGATE_LISTEN="127.0.0.1:$PORT" \
      "$FOLDGATE" token --ttl 30m "$@"
  }
  ADMIN=$(token --tenant ops --sub console-operator --scope foldgate:admin)
  TENANT_ADMIN=$(token --tenant acme --sub acme-operator --scope tenant:admin)
  AGENT=$(token --tenant acme --sub agent-1 --scope "fold:read fold:write")
  OTHER_AGENT=$(token --tenant globex --sub agent-2 --scope "fold:read fold:write")
  MCP_ONLY=$(token --tenant acme --sub agent-3 --scope "fold:read fold:write")
  rm -rf "$SHOTS"
  log "Chromium ($CHROMIUM) against http://127.0.0.1:$PORT/console"
  if (cd "$HERE" && timeout 300 node console.test.mjs --base "http://127.0.0.1:$PORT" \
    --admin "$ADMIN" --tenant-admin "$TENANT_ADMIN" --agent "$AGENT" --other-agent "$OTHER_AGENT" \
    --mcp-only "$MCP_ONLY" --upstream-secret "$UPSTREAM_SECRET" \
    --credential-prefix "$CREDENTIAL_PREFIX" --shots "$SHOTS" --chromium "$CHROMIUM" "${oidc_args[@]}" |
    tee "$DIR/browser.log"); then
    browser_ok=yes
  else
    browser_ok=""
  fi
  # The browser's checks count one by one.
  read -r b_passed b_failed < <(sed -n 's/^\([0-9]*\) passed, \([0-9]*\) failed$/\1 \2/p' "$DIR/browser.log" | tail -n 1) || true
  PASSED=$((PASSED + ${b_passed:-0}))
  FAILED=$((FAILED + ${b_failed:-0}))
  if [ -z "$browser_ok" ]; then
    # A crash before the summary still fails the run.
    [ "${b_failed:-0}" -gt 0 ] || fail "console in Chromium: the browser test did not finish"
    echo "--- foldgate's warnings and errors"
    grep -E '"level":"(WARN|ERROR)"' "$DIR/stderr" | tail -n 20 || true
    if [ "${#oidc_args[@]}" -gt 0 ]; then
      echo "--- the gateway with OpenID Connect sign-in: warnings and errors"
      grep -E '"level":"(WARN|ERROR)"' "$DIR/oidc.stderr" | tail -n 20 || true
      echo "--- the OpenID Connect providers' errors"
      tail -n 20 "$DIR/idp.stderr" "$DIR/idp-b.stderr" || true
    fi
  fi
  echo "screenshots in $SHOTS:"
  ls "$SHOTS" 2>/dev/null | sed 's/^/  /' || true
fi

echo
echo "$PASSED passed, $FAILED failed"
[ "$FAILED" -eq 0 ]
