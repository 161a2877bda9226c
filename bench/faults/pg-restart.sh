#!/usr/bin/env bash
# Postgres stopped under load, then started again:
#   - while it is down, tool calls fail fast with HTTP 503 and JSON-RPC
#     error -32004 (not a hang, not a 200 with an internal error), and
#     /readyz answers 503;
#   - once it is back, the same gateway process serves again without a
#     restart, and the load's last seconds are error-free;
#   - no branch a client saw created is lost.
#
# This stops the Postgres cluster that everyone on the machine uses: it
# refuses to run unless FOLDGATE_FAULTS_ALLOW_PG_RESTART=1. It uses its own
# database on that server.
# Settings: see lib.sh; FOLDGATE_FAULTS_PG_CLUSTER ("15 main": version and
# name for pg_ctlcluster; a private cluster works as well, with
# FOLDGATE_FAULTS_PG pointing at its port), FOLDGATE_FAULTS_PG_DOWNTIME
# (seconds, 8).
set -euo pipefail

if [[ ${FOLDGATE_FAULTS_ALLOW_PG_RESTART:-0} != 1 ]]; then
    echo "This scenario stops and starts the Postgres cluster, disrupting everything else that" >&2
    echo "uses it. Set FOLDGATE_FAULTS_ALLOW_PG_RESTART=1 to run it." >&2
    exit 2
fi
source "$(dirname "$0")/lib.sh"

read -r PG_VERSION PG_CLUSTER <<<"${FOLDGATE_FAULTS_PG_CLUSTER:-15 main}"
DOWNTIME=${FOLDGATE_FAULTS_PG_DOWNTIME:-8}
LOAD_SECONDS=40
STOP_AFTER=10

pg() { pg_ctlcluster --skip-systemctl-redirect "$PG_VERSION" "$PG_CLUSTER" "$@"; }
pg_running() { pg_lsclusters -h | awk -v v="$PG_VERSION" -v c="$PG_CLUSTER" '$1 == v && $2 == c {print $4}' | grep -q online; }

OUT=$(out_dir pg-restart)
# Whatever happens, Postgres is left running.
trap 'pg_running || pg start; cleanup' EXIT
create_database pgrestart
PORT=$(free_port)
OPS=$(free_port)
RUN_ID=pg$(date +%s)
write_config "$OUT/foldgate.toml"
echo "figures and logs in $OUT"

start_gateway "$PORT" "$OPS" "$DB_URL" "$OUT/foldgate.toml" "$OUT/gateway.log"
PID=$GATEWAY_PID
TOKEN=$(token "$PORT")
echo "before the outage: $(mcp_call "$PORT" "$TOKEN")"

"$BENCH" run --url "http://127.0.0.1:$PORT/mcp" --jwt-secret "$SECRET" --audience "$AUDIENCE" \
    --mode fold --agents 8 --duration "${LOAD_SECONDS}s" --warmup 0s --branch-timeout 30 \
    --request-timeout 10s --sample-interval 1s --error-backoff 100ms \
    --run-id "$RUN_ID" --record "$OUT/branches.jsonl" --json "$OUT/load.json" --progress \
    >"$OUT/load.txt" 2>"$OUT/load-progress.txt" &
LOAD=$!

sleep "$STOP_AFTER"
STOPPED_AT=$(now)
pg stop
echo "Postgres stopped ($(elapsed "$STOPPED_AT") s to stop)"

# Probe while it is down: one call after another, and the ready probe.
PROBES=()
for _ in 1 2 3 4 5; do
    PROBES+=("$(mcp_call "$PORT" "$TOKEN")")
    sleep 0.3
done
READY_CODE=$(curl -s -o "$OUT/readyz.txt" -w '%{http_code} %{time_total}' "http://127.0.0.1:$OPS/readyz")
MCP_READY_CODE=$(curl -s -o /dev/null -w '%{http_code} %{time_total}' "http://127.0.0.1:$PORT/readyz")
printf 'during the outage, tools/call: %s\n' "${PROBES[@]}"
echo "during the outage, /readyz: ops port $READY_CODE ($(cat "$OUT/readyz.txt")), MCP port $MCP_READY_CODE"

sleep "$(python3 -c "print(max(0, $DOWNTIME - float('$(elapsed "$STOPPED_AT")')))")"
pg start
STARTED_AT=$(now)
echo "Postgres started after $(python3 -c "print(f'{$STARTED_AT - $STOPPED_AT:.1f}')") s down"

# The same process serves again.
RECOVERED=""
for _ in $(seq 1 200); do
    RESULT=$(mcp_call "$PORT" "$TOKEN")
    if [[ $RESULT == "200 "*" none" ]]; then
        RECOVERED=$(elapsed "$STARTED_AT")
        break
    fi
    sleep 0.1
done
echo "serving again ${RECOVERED:-never} s after Postgres started: $RESULT"

wait "$LOAD" || true
cat "$OUT/load.txt"
set +e
"$BENCH" verify --database-url "$DB_URL" --run-id "$RUN_ID" --record "$OUT/branches.jsonl" \
    --settle 0s --max-late 60s --json "$OUT/verify.json" >"$OUT/verify.txt"
VERIFIED=$?
set -e
cat "$OUT/verify.txt"

fast_503() {
    local probe status secs code
    for probe in "${PROBES[@]}"; do
        read -r status secs code <<<"$probe"
        [[ $status == 503 && $code == -32004 ]] || return 1
    done
}
# A call may wait for a connection (database.acquire_timeout) when
# it is the one that tries the database again; the others must not wait.
mostly_fast() {
    local probe status secs code slow=0
    for probe in "${PROBES[@]}"; do
        read -r status secs code <<<"$probe"
        python3 -c "import sys; sys.exit(0 if $secs < 0.5 else 1)" || slow=$((slow + 1))
    done
    ((slow <= 1))
}
check "calls during the outage get 503 with JSON-RPC -32004" fast_503
check "calls during the outage fail fast (all but one < 0.5 s)" mostly_fast
check "/readyz answers 503 during the outage" test "${READY_CODE%% *}" = 503 -a "${MCP_READY_CODE%% *}" = 503
check "the gateway serves again without a restart" test -n "$RECOVERED"
check "the gateway process is the same" kill -0 "$PID"
check "no branch the clients saw created is lost" test "$(jq '.lost' "$OUT/verify.json")" = 0
check "no errors in the last 10 s of the load" test "$(jq '[.rounds[0].series[-10:][] | .errors_per_s] | add == 0' "$OUT/load.json")" = true
finish
