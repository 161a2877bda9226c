#!/usr/bin/env bash
# Two gateways on one Postgres behind round robin (the load generator
# alternates requests between them, as a load balancer would, so a branch
# created on one is often returned on the other):
#   - both serve the load and both supervise deadlines;
#   - one is killed with SIGKILL mid-run: no branch is lost, none ends
#     twice, and the survivor fires every deadline — also those of branches
#     created through the dead one — within 1 s, except those the dead one
#     had claimed, which wait for their claim lease (`supervisor.claim_lease`,
#     set to 2 s here) to run out.
# Settings: see lib.sh; FOLDGATE_FAULTS_AGENTS (16).
set -euo pipefail
source "$(dirname "$0")/lib.sh"

AGENTS=${FOLDGATE_FAULTS_AGENTS:-16}
LOAD_SECONDS=40
KILL_AFTER=15
CLAIM_LEASE_MS=2000

OUT=$(out_dir two-replicas)
trap cleanup EXIT
create_database replicas
PORT_A=$(free_port) OPS_A=$(free_port) PORT_B=$(free_port) OPS_B=$(free_port)
RUN_ID=repl$(date +%s)
write_config "$OUT/foldgate.toml" "
[supervisor]
claim_lease = \"${CLAIM_LEASE_MS}ms\""
echo "figures and logs in $OUT"

start_gateway "$PORT_A" "$OPS_A" "$DB_URL" "$OUT/foldgate.toml" "$OUT/gateway-a.log"
PID_A=$GATEWAY_PID
start_gateway "$PORT_B" "$OPS_B" "$DB_URL" "$OUT/foldgate.toml" "$OUT/gateway-b.log"
PID_B=$GATEWAY_PID

"$BENCH" run --url "http://127.0.0.1:$PORT_A/mcp" --url "http://127.0.0.1:$PORT_B/mcp" \
    --jwt-secret "$SECRET" --audience "$AUDIENCE" --balance request \
    --mode fold --agents "$AGENTS" --duration "${LOAD_SECONDS}s" --warmup 0s \
    --abandon-every 5 --branch-timeout 3 --request-timeout 5s --sample-interval 1s \
    --run-id "$RUN_ID" --record "$OUT/branches.jsonl" --json "$OUT/load.json" --progress \
    >"$OUT/load.txt" 2>"$OUT/load-progress.txt" &
LOAD=$!

sleep "$KILL_AFTER"
events() { jq -c 'select(.fields.message == "'"$2"'")' "$1" 2>/dev/null | wc -l; }
CREATED_A=$(events "$OUT/gateway-a.log" "branch created")
CREATED_B=$(events "$OUT/gateway-b.log" "branch created")
FIRED_A=$(events "$OUT/gateway-a.log" "branch force-returned")
FIRED_B=$(events "$OUT/gateway-b.log" "branch force-returned")
KILLED_AT=$(now)
kill -9 "$PID_B"
wait "$PID_B" 2>/dev/null || true
echo "before the kill: A created $CREATED_A and fired $FIRED_A, B created $CREATED_B and fired $FIRED_B"
echo "killed B (pid $PID_B) at $KILLED_AT"

wait "$LOAD" || true
cat "$OUT/load.txt"
FIRED_A_AFTER=$(( $(events "$OUT/gateway-a.log" "branch force-returned") - FIRED_A ))

# Deadlines B had claimed when it died wait for the lease: they count as an
# outage of the lease's length.
LEASE_END=$(python3 -c "print($KILLED_AT + $CLAIM_LEASE_MS / 1000)")
set +e
"$BENCH" verify --database-url "$DB_URL" --run-id "$RUN_ID" --record "$OUT/branches.jsonl" \
    --outage "$KILLED_AT,$LEASE_END" --restart-slack 1s --max-late 1s --settle 10s \
    --log "$OUT/gateway-a.log" --log "$OUT/gateway-b.log" --whole-database --json "$OUT/verify.json"
VERIFIED=$?
set -e
echo "after the kill: A fired $FIRED_A_AFTER deadlines"

check "the database agrees with the clients (verify)" test "$VERIFIED" -eq 0
check "both replicas served the load" test "$CREATED_A" -gt 0 -a "$CREATED_B" -gt 0
check "both replicas supervised deadlines" test "$FIRED_A" -gt 0 -a "$FIRED_B" -gt 0
check "the survivor fired the deadlines after the kill" test "$FIRED_A_AFTER" -gt 0
check "the survivor kept the load going" test "$(jq '[.rounds[0].series[-10:][] | .ok_per_s] | add > 0' "$OUT/load.json")" = true
check "every failed call was a connection to the killed replica" \
    test "$(jq '.gateway.errors | keys - ["transport:connect", "transport:request"] | length == 0' "$OUT/load.json")" = true
finish
