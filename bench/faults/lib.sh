# Shared by the fault scenarios: binaries, a fresh database, gateways
# started in the background, and small helpers. Sourced, not run.
#
# Settings (environment):
#   FOLDGATE_FAULTS_PROFILE     release (default) or debug: which build to use
#   FOLDGATE_FAULTS_TARGET_DIR  the Cargo target directory (default:
#                               $CARGO_TARGET_DIR, else <repo>/target)
#   FOLDGATE_FAULTS_PG          Postgres server URL without a database
#                               (default postgres://postgres@127.0.0.1:5432)
#   FOLDGATE_FAULTS_OUT         where figures and logs go (default: a new
#                               directory under <target>/faults)
#   FOLDGATE_FAULTS_KEEP=1      keep the scenario's database afterwards

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
PROFILE=${FOLDGATE_FAULTS_PROFILE:-release}
TARGET_DIR=${FOLDGATE_FAULTS_TARGET_DIR:-${CARGO_TARGET_DIR:-$REPO/target}}
FOLDGATE=$TARGET_DIR/$PROFILE/foldgate
BENCH=$TARGET_DIR/$PROFILE/foldgate-bench
PG_SERVER=${FOLDGATE_FAULTS_PG:-postgres://postgres@127.0.0.1:5432}
SECRET=$(head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n')
AUDIENCE=foldgate-faults
GATEWAY_PIDS=()
DATABASE=""

for bin in "$FOLDGATE" "$BENCH"; do
    if [[ ! -x $bin ]]; then
        echo "missing $bin: cargo build --${PROFILE/debug/profile=dev} -p foldgate -p foldgate-bench" >&2
        exit 2
    fi
done
for tool in psql curl jq python3; do
    command -v "$tool" >/dev/null || { echo "this scenario needs $tool" >&2; exit 2; }
done

# out_dir NAME: creates and prints the scenario's output directory.
out_dir() {
    local dir=${FOLDGATE_FAULTS_OUT:-$TARGET_DIR/faults/$1-$(date +%Y%m%d-%H%M%S)}
    mkdir -p "$dir"
    echo "$dir"
}

now() { date +%s.%N; }

# elapsed SINCE: seconds from SINCE (a `now` value) to now.
elapsed() { python3 -c "import sys,time; print(f'{time.time()-float(sys.argv[1]):.2f}')" "$1"; }

free_port() {
    python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

# create_database NAME: a fresh database on the server, dropped on exit;
# sets DB_URL. (Not in a command substitution: DATABASE must reach the
# exit trap.)
create_database() {
    DATABASE="foldgate_fault_$1_$(date +%s)_$$"
    psql "$PG_SERVER/postgres" -qAtc "CREATE DATABASE $DATABASE" >/dev/null
    DB_URL="$PG_SERVER/$DATABASE"
}

drop_database() {
    if [[ -n $DATABASE && ${FOLDGATE_FAULTS_KEEP:-0} != 1 ]]; then
        psql "$PG_SERVER/postgres" -qAtc "DROP DATABASE IF EXISTS $DATABASE WITH (FORCE)" >/dev/null 2>&1 || true
    fi
}

# write_config FILE [EXTRA_TOML]: the gateway configuration of the
# scenarios: limits high enough that the load measures the gateway, a
# shared audience so that several replicas accept the same tokens.
write_config() {
    cat >"$1" <<EOF
[auth]
audience = "$AUDIENCE"

[api.rate_limit]
per_second = 1000000
burst = 1000000

[folding.limits]
max_active_per_session = 1000
max_active_per_tenant = 1000000
max_active_total = 1000000
creations_per_minute = 1000000
${2:-}
EOF
}

# The gateway reads every FOLDGATE_* variable as a setting and refuses
# unknown ones: it must not see the scenarios' own switches. `env` with
# these arguments runs a command without them, with the scenario's secret.
GATEWAY_ENV=()
for name in $(compgen -e); do
    if [[ $name == FOLDGATE_* || $name == DATABASE_URL ]]; then
        GATEWAY_ENV+=(-u "$name")
    fi
done
# The branch lifecycle lines (created, returned) are at `debug`.
GATEWAY_ENV+=(FOLDGATE_JWT_SECRET="$SECRET" RUST_LOG="${RUST_LOG:-info,foldgate_engine=debug}")

# start_gateway PORT OPS_PORT DATABASE_URL CONFIG LOG: starts a gateway in
# the background and sets GATEWAY_PID (the gateway's own process id, so
# that a signal reaches it); waits until it is ready.
start_gateway() {
    local port=$1 ops=$2 url=$3 config=$4 log=$5
    env "${GATEWAY_ENV[@]}" "$FOLDGATE" serve --listen "127.0.0.1:$port" --ops-listen "127.0.0.1:$ops" \
        --database-url "$url" --migrate --config "$config" >>"$log.out" 2>>"$log" &
    GATEWAY_PID=$!
    GATEWAY_PIDS+=("$GATEWAY_PID")
    if ! wait_ready "$ops" 60 || ! kill -0 "$GATEWAY_PID" 2>/dev/null; then
        echo "the gateway on port $port did not become ready" >&2
        tail -5 "$log" >&2
        return 1
    fi
}

# wait_ready OPS_PORT SECONDS: polls /readyz until it answers 200.
wait_ready() {
    local deadline=$((SECONDS + $2))
    while ((SECONDS < deadline)); do
        if [[ $(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$1/readyz") == 200 ]]; then
            return 0
        fi
        sleep 0.05
    done
    return 1
}

# mcp_call PORT TOKEN: one tools/call (branch_status of a session);
# prints "HTTP_STATUS SECONDS JSON_RPC_ERROR_CODE".
mcp_call() {
    local body
    body=$(mktemp)
    local meta
    meta=$(curl -s -o "$body" -w '%{http_code} %{time_total}' --max-time 30 \
        -H "Authorization: Bearer $2" -H 'Content-Type: application/json' \
        -H 'Accept: application/json, text/event-stream' -H 'MCP-Protocol-Version: 2025-11-25' \
        "http://127.0.0.1:$1/mcp" \
        -d '{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"branch_status","arguments":{"session_id":"probe"}}}' \
        || true)
    echo "$meta $(jq -r '.error.code // "none"' "$body" 2>/dev/null || echo unparsable)"
    rm -f "$body"
}

# token PORT: a token for the scenarios' gateways.
token() {
    env "${GATEWAY_ENV[@]}" FOLDGATE_JWT_AUDIENCE="$AUDIENCE" FOLDGATE_LISTEN="127.0.0.1:$1" \
        "$FOLDGATE" token --tenant faults-probe --sub prober
}

stop_gateways() {
    local pid
    for pid in "${GATEWAY_PIDS[@]}"; do
        kill "$pid" 2>/dev/null || true
    done
    for pid in "${GATEWAY_PIDS[@]}"; do
        wait "$pid" 2>/dev/null || true
    done
}

cleanup() {
    stop_gateways
    drop_database
}

FAILURES=()
# check CONDITION_TEXT COMMAND...: runs the command; records a failure.
check() {
    local what=$1
    shift
    if "$@"; then
        echo "ok: $what"
    else
        echo "FAILED: $what"
        FAILURES+=("$what")
    fi
}

finish() {
    if ((${#FAILURES[@]} > 0)); then
        echo "${#FAILURES[@]} check(s) failed"
        exit 1
    fi
    echo "all checks passed"
}
