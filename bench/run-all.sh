#!/usr/bin/env bash
# Reproduces every figure in docs/performance.md in one go, from release
# builds: gateway against the bare rmcp baseline (branch_status, fold
# cycles, proxied calls) at 1, 16 and 64 agents, deadline scale, the soak,
# and the fault scenarios. Run it on an otherwise idle machine.
#
# Settings (environment):
#   FOLDGATE_BENCH_OUT       where results go (default <target>/bench/<time>)
#   FOLDGATE_BENCH_PG        Postgres server URL without a database
#                            (default postgres://postgres@127.0.0.1:5432)
#   FOLDGATE_BENCH_PG_PARAMS query string for the gateway's database URLs
#                            (default sslmode=disable: Postgres on loopback)
#   FOLDGATE_BENCH_DURATION  measured time per run (default 20s)
#   FOLDGATE_BENCH_ROUNDS    baseline/gateway alternations per run (default 3)
#   FOLDGATE_BENCH_SOAK      soak duration (default 30m; 0 skips it)
#   FOLDGATE_BENCH_BRANCHES  branches of the deadline-scale run (default 10000)
#   FOLDGATE_BENCH_FAULTS    1 (default) runs the fault scenarios; 0 skips
#   FOLDGATE_FAULTS_ALLOW_PG_RESTART=1 also runs the Postgres restart
#                            scenario (it stops the shared cluster)
# Needs: cargo, psql, jq, curl, python3.
set -euo pipefail

REPO=$(cd "$(dirname "$0")/.." && pwd)
TARGET_DIR=${CARGO_TARGET_DIR:-$REPO/target}
OUT=${FOLDGATE_BENCH_OUT:-$TARGET_DIR/bench/$(date +%Y%m%d-%H%M%S)}
PG=${FOLDGATE_BENCH_PG:-postgres://postgres@127.0.0.1:5432}
PG_PARAMS=${FOLDGATE_BENCH_PG_PARAMS-sslmode=disable}
DURATION=${FOLDGATE_BENCH_DURATION:-20s}
ROUNDS=${FOLDGATE_BENCH_ROUNDS:-3}
SOAK=${FOLDGATE_BENCH_SOAK:-30m}
FAULTS=${FOLDGATE_BENCH_FAULTS:-1}
BRANCHES=${FOLDGATE_BENCH_BRANCHES:-10000}
mkdir -p "$OUT"

(cd "$REPO" && cargo build --release -p foldgate -p foldgate-bench)
FOLDGATE=$TARGET_DIR/release/foldgate
BENCH=$TARGET_DIR/release/foldgate-bench

# shellcheck source=bench/databases.sh
. "$REPO/bench/databases.sh"
# bench_db NAME: a fresh database for one part of the run; sets DB.
bench_db() {
    fresh_db "foldgate_bench_$1_$(date +%s)_$$"
}

echo "results in $OUT"
uptime | tee "$OUT/load-average-start.txt"

# The gateway against the baseline, closed loop, same agents, same run.
for mode in status fold; do
    for agents in 1 16 64; do
        echo "== $mode, $agents agents"
        bench_db "$mode$agents"
        "$BENCH" run --spawn-gateway "$FOLDGATE" --database-url "$DB" \
            --gateway-log "$OUT/$mode-$agents.gateway.log" --baseline --rounds "$ROUNDS" \
            --mode "$mode" --agents "$agents" --duration "$DURATION" \
            --json "$OUT/$mode-$agents.json" | tee "$OUT/$mode-$agents.txt"
    done
done

# Proxied calls: the bench's echo server as the gateway's upstream.
echo "== proxy, 16 agents"
bench_db proxy16
if ! "$BENCH" run --spawn-gateway "$FOLDGATE" --database-url "$DB" \
    --gateway-log "$OUT/proxy-16.gateway.log" --baseline --rounds "$ROUNDS" \
    --mode proxy --agents 16 --duration "$DURATION" \
    --json "$OUT/proxy-16.json" 2>&1 | tee "$OUT/proxy-16.txt"; then
    echo "proxy run failed (see $OUT/proxy-16.txt)"
fi

# The latency a proxied call gains through the gateway, against calling the
# upstream directly: metered to a branch, and outside any branch.
for mode in proxy proxy-outside; do
    echo "== $mode, 1 agent"
    bench_db "${mode//-/_}1"
    "$BENCH" run --spawn-gateway "$FOLDGATE" --database-url "$DB" \
        --gateway-log "$OUT/$mode-1.gateway.log" --baseline --rounds "$ROUNDS" \
        --mode "$mode" --agents 1 --duration "$DURATION" \
        --json "$OUT/$mode-1.json" | tee "$OUT/$mode-1.txt" || echo "$mode run failed"
done

echo "== deadline scale: $BRANCHES branches"
bench_db deadlines
"$BENCH" deadlines --spawn-gateway "$FOLDGATE" --database-url "$DB" \
    --gateway-log "$OUT/deadlines.gateway.log" --branches "$BRANCHES" --timeout 60 --agents 16 --tenants 20 \
    --json "$OUT/deadlines.json" | tee "$OUT/deadlines.txt" || echo "deadline scale FAILED"

if [[ $SOAK != 0 ]]; then
    echo "== soak: $SOAK at 200 calls/s"
    bench_db soak
    "$BENCH" run --spawn-gateway "$FOLDGATE" --database-url "$DB" \
        --gateway-log "$OUT/soak.gateway.log" --mode fold --agents 32 \
        --soak --rate 200 --duration "$SOAK" --soak-warmup 60s --sample-interval 10s \
        --json "$OUT/soak.json" | tee "$OUT/soak.txt"
fi

if [[ $FAULTS == 1 ]]; then
    for scenario in kill-restart two-replicas slow-clients pg-restart; do
        if [[ $scenario == pg-restart && ${FOLDGATE_FAULTS_ALLOW_PG_RESTART:-0} != 1 ]]; then
            echo "== $scenario skipped (set FOLDGATE_FAULTS_ALLOW_PG_RESTART=1)"
            continue
        fi
        echo "== fault: $scenario"
        FOLDGATE_FAULTS_OUT="$OUT/$scenario" FOLDGATE_FAULTS_TARGET_DIR="$TARGET_DIR" \
            "$REPO/bench/faults/$scenario.sh" 2>&1 | tee "$OUT/$scenario.txt" || echo "$scenario FAILED"
    done
fi

uptime | tee "$OUT/load-average-end.txt"

# One table of the headline figures.
{
    echo "| run | gateway calls/s | gateway p50 / p99 ms | baseline calls/s | baseline p50 / p99 ms | ratio | cycles/s | errors |"
    echo "|---|---|---|---|---|---|---|---|"
    for f in "$OUT"/status-*.json "$OUT"/fold-*.json "$OUT"/proxy-*.json; do
        [[ -f $f ]] || continue
        jq -r --arg run "$(basename "$f" .json)" '
            def f1: . * 10 | round / 10;
            def f2: . * 100 | round / 100;
            "| \($run) | \(.comparison.gateway_per_s // .gateway.calls_per_s | f1) | \(.comparison.gateway.p50_ms // .gateway.latency.p50_ms | f2) / \(.comparison.gateway.p99_ms // .gateway.latency.p99_ms | f2) | \(.comparison.baseline_per_s // 0 | f1) | \(.comparison.baseline.p50_ms // 0 | f2) / \(.comparison.baseline.p99_ms // 0 | f2) | \(.comparison.throughput_ratio // 0 | f2) | \(.gateway.cycles_per_s | f1) | \(.gateway.error_calls) |"' "$f"
    done
} | tee "$OUT/summary.md"
echo "results in $OUT"
