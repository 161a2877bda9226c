#!/usr/bin/env bash
# The figures of the capacity model in docs/performance.md: for each
# operation mix, the CPU one call costs the gateway and Postgres, and what
# Postgres did for it (statements of the folding functions, rows written per
# table, WAL written and flushed). One gateway (release build) against a
# fresh database per mix, closed loop, no baseline.
#
#   bench/capacity.sh [FOLDGATE] [CONFIG ...]
#
# A CONFIG is MODE:AGENTS (default: status:16 fold:16 proxy-outside:16
# proxy:16). Postgres must run on this machine (its CPU is read from /proc).
# Settings (environment): FOLDGATE_BENCH_OUT, FOLDGATE_BENCH_PG,
# FOLDGATE_BENCH_DURATION (default 10s), FOLDGATE_BENCH_BIN, as for ab.sh.
# Needs: psql, jq, pgrep.
set -euo pipefail

REPO=$(cd "$(dirname "$0")/.." && pwd)
TARGET_DIR=${CARGO_TARGET_DIR:-$REPO/target}
FOLDGATE=${1:-$TARGET_DIR/release/foldgate}
[ $# -gt 0 ] && shift
CONFIGS=("$@")
[ ${#CONFIGS[@]} -gt 0 ] || CONFIGS=(status:16 fold:16 proxy-outside:16 proxy:16)
OUT=${FOLDGATE_BENCH_OUT:-$TARGET_DIR/bench/capacity-$(date +%Y%m%d-%H%M%S)}
PG=${FOLDGATE_BENCH_PG:-postgres://postgres@127.0.0.1:5432}
DURATION=${FOLDGATE_BENCH_DURATION:-10s}
BENCH=${FOLDGATE_BENCH_BIN:-$TARGET_DIR/release/foldgate-bench}
TICKS=$(getconf CLK_TCK)
mkdir -p "$OUT"

# CPU seconds of every Postgres process so far: the live ones, and those
# that exited (counted by the postmaster, which waited for them).
pg_cpu() {
    local postmaster total=0 pid
    postmaster=$(pgrep -o -x postgres)
    for pid in $(pgrep -x postgres); do
        [ -r "/proc/$pid/stat" ] || continue
        total=$((total + $(awk '{print $14 + $15}' "/proc/$pid/stat" 2>/dev/null || echo 0)))
    done
    total=$((total + $(awk '{print $16 + $17}' "/proc/$postmaster/stat")))
    echo "scale=3; $total / $TICKS" | bc
}

PG_PARAMS=sslmode=disable
# shellcheck source=bench/databases.sh
. "$REPO/bench/databases.sh"

echo "results in $OUT"
uptime | tee "$OUT/load-average-start.txt"
for config in "${CONFIGS[@]}"; do
    mode=${config%%:*}
    agents=${config##*:}
    name="foldgate_capacity_${mode//-/_}${agents}_$$"
    fresh_db "$name"
    # Counts calls and time of the folding functions (statements inside them
    # are not counted separately).
    psql "$PG/postgres" -qAtc "ALTER DATABASE $name SET track_functions = 'pl'" >/dev/null
    db=$DB
    psql "$db" -qAtc "SELECT pg_stat_reset_shared('wal')" >/dev/null
    before=$(pg_cpu)
    "$BENCH" run --spawn-gateway "$FOLDGATE" --database-url "$db" \
        --gateway-log "$OUT/$mode-$agents.gateway.log" --mode "$mode" --agents "$agents" \
        --duration "$DURATION" --json "$OUT/$mode-$agents.json" >"$OUT/$mode-$agents.txt" 2>&1
    after=$(pg_cpu)
    calls=$(jq '.gateway.ok_calls' "$OUT/$mode-$agents.json")
    jq -r --arg c "$config" --arg pg "$(echo "scale=1; ($after - $before) * 1000000 / $calls" | bc)" '
        "\($c): \(.gateway.calls_per_s | round) calls/s, \(.gateway.cycles_per_s | . * 10 | round / 10) cycles/s, gateway \(.gateway.cpu.target_us_per_call | round) us/call, Postgres \($pg) us/call, machine \(.gateway.cpu.machine_busy_pct | round)% busy, \(.gateway.error_calls) errors"' \
        "$OUT/$mode-$agents.json" | tee -a "$OUT/summary.txt"
    {
        echo "-- $config: per call"
        psql "$db" -qAt -F ' ' -c "
            SELECT 'function', funcname, round(calls::numeric / $calls, 3) AS per_call,
                   round((total_time / NULLIF(calls, 0))::numeric, 3) AS ms_each
            FROM pg_stat_user_functions ORDER BY calls DESC" \
            -c "
            SELECT 'table', relname, round(n_tup_ins::numeric / $calls, 3) AS inserts,
                   round(n_tup_upd::numeric / $calls, 3) AS updates,
                   round(n_tup_hot_upd::numeric / NULLIF(n_tup_upd, 0), 2) AS hot_share
            FROM pg_stat_user_tables WHERE n_tup_ins + n_tup_upd > 0 ORDER BY n_tup_upd DESC" \
            -c "
            SELECT 'wal', round(wal_records::numeric / $calls, 2) AS records,
                   round(wal_bytes::numeric / $calls) AS bytes,
                   round(wal_sync::numeric / $calls, 3) AS flushes
            FROM pg_stat_wal"
    } | tee -a "$OUT/summary.txt"
done
uptime | tee "$OUT/load-average-end.txt"
