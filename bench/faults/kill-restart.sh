#!/usr/bin/env bash
# A gateway killed with SIGKILL in the middle of a load run, then restarted
# on the same database:
#   - no branch lost: every branch a client saw created is in the database;
#   - none ended twice: the books balance and no branch has two terminal
#     log events;
#   - deadlines that passed while no gateway ran fire within seconds of the
#     restart; the others within 1 s. Branches the killed process had
#     claimed but not yet ended wait for their claim to lapse
#     (`supervisor.claim_lease`, 30 s by default, 3 s here) before the new
#     process takes them;
#   - clients recover: the load goes on after the errors, and its last
#     seconds are error-free.
# Settings: see lib.sh; FOLDGATE_FAULTS_AGENTS (16), FOLDGATE_FAULTS_DOWNTIME
# (seconds without a gateway, 5).
set -euo pipefail
source "$(dirname "$0")/lib.sh"

AGENTS=${FOLDGATE_FAULTS_AGENTS:-16}
DOWNTIME=${FOLDGATE_FAULTS_DOWNTIME:-5}
LOAD_SECONDS=40
KILL_AFTER=12

OUT=$(out_dir kill-restart)
trap cleanup EXIT
create_database kill
PORT=$(free_port)
OPS=$(free_port)
RUN_ID=kill$(date +%s)
CLAIM_LEASE_MS=3000
write_config "$OUT/foldgate.toml" "
[supervisor]
claim_lease = \"${CLAIM_LEASE_MS}ms\""
echo "figures and logs in $OUT"

start_gateway "$PORT" "$OPS" "$DB_URL" "$OUT/foldgate.toml" "$OUT/gateway-1.log"
FIRST_PID=$GATEWAY_PID

# Every 5th cycle is abandoned with 3 s deadlines, so that deadlines keep
# falling due, also while no gateway runs.
"$BENCH" run --url "http://127.0.0.1:$PORT/mcp" --jwt-secret "$SECRET" --audience "$AUDIENCE" \
    --mode fold --agents "$AGENTS" --duration "${LOAD_SECONDS}s" --warmup 0s \
    --abandon-every 5 --branch-timeout 3 --request-timeout 5s --sample-interval 1s \
    --run-id "$RUN_ID" --record "$OUT/branches.jsonl" --json "$OUT/load.json" --progress \
    >"$OUT/load.txt" 2>"$OUT/load-progress.txt" &
LOAD=$!

sleep "$KILL_AFTER"
KILLED_AT=$(now)
kill -9 "$FIRST_PID"
wait "$FIRST_PID" 2>/dev/null || true
echo "killed the gateway (pid $FIRST_PID) at $KILLED_AT; down for ${DOWNTIME}s"
sleep "$DOWNTIME"

RESTARTED_AT=$(now)
start_gateway "$PORT" "$OPS" "$DB_URL" "$OUT/foldgate.toml" "$OUT/gateway-2.log"
READY_AT=$(now)
echo "restarted (pid $GATEWAY_PID): ready $(python3 -c "print(f'{$READY_AT-$RESTARTED_AT:.2f}')") s after start"

wait "$LOAD" || true
cat "$OUT/load.txt"

set +e
"$BENCH" verify --database-url "$DB_URL" --run-id "$RUN_ID" --record "$OUT/branches.jsonl" \
    --outage "$KILLED_AT,$READY_AT" --restart-slack 5s --max-late 1s --settle 10s \
    --log "$OUT/gateway-1.log" --log "$OUT/gateway-2.log" --whole-database --json "$OUT/verify.json"
VERIFIED=$?
set -e

load_figure() { jq -r "$1" "$OUT/load.json"; }
echo
echo "load: $(load_figure '.gateway.ok_calls') ok calls, $(load_figure '.gateway.error_calls') failed: $(load_figure '.gateway.errors | to_entries | map("\(.key) \(.value.count)") | join(", ")')"
echo "recorded: $(jq -r '"\(.recorded_created) created, \(.lost) lost, \(.fired_after_outage) deadlines passed while down"' "$OUT/verify.json")"
echo "fired after the restart: $(jq -r '.after_outage_ms | if . then "p50 \(.p50|floor) ms, max \(.max|floor) ms" else "none" end' "$OUT/verify.json")"

check "the database agrees with the clients (verify)" test "$VERIFIED" -eq 0
check "the run went on after the kill" test "$(jq '[.rounds[0].series[] | select(.t_s > '"$((KILL_AFTER + DOWNTIME + 3))"') | .ok_per_s] | add > 0' "$OUT/load.json")" = true
check "every failed call was a connection to the killed gateway" \
    test "$(jq '.gateway.errors | keys - ["transport:connect", "transport:request"] | length == 0' "$OUT/load.json")" = true
check "no errors in the last 10 s of the run" test "$(jq '[.rounds[0].series[-10:][] | .errors_per_s] | add == 0' "$OUT/load.json")" = true
check "some deadlines passed while no gateway ran" test "$(jq '.fired_after_outage > 0' "$OUT/verify.json")" = true
finish
