#!/usr/bin/env bash
# Two builds of the gateway in the same run: each configuration is run with
# the previous binary and with this one, alternating, each on a fresh
# Postgres database and against the bare rmcp baseline, with the same load
# generator (this build's `foldgate-bench`). Prints one line per run and
# writes every report to the output directory.
#
#   bench/ab.sh PREVIOUS_FOLDGATE THIS_FOLDGATE [CONFIG ...]
#
# A CONFIG is MODE:AGENTS (default: fold:1 fold:16 fold:64 status:16
# proxy-outside:16). Settings (environment):
#   FOLDGATE_BENCH_OUT       where results go (default <target>/bench/ab-<time>)
#   FOLDGATE_BENCH_PG        Postgres server URL without a database
#                            (default postgres://postgres@127.0.0.1:5432)
#   FOLDGATE_BENCH_DURATION  measured time per round (default 10s)
#   FOLDGATE_BENCH_ROUNDS    baseline/gateway alternations per run (default 2)
#   FOLDGATE_BENCH_REPEAT    how often each binary runs each configuration (default 2)
#   FOLDGATE_BENCH_BIN       the load generator (default <target>/release/foldgate-bench)
# Needs: psql, jq.
set -euo pipefail

if [ $# -lt 2 ]; then
    sed -n '2,19p' "$0" | sed 's/^# \{0,1\}//'
    exit 2
fi
PREVIOUS=$1
THIS=$2
shift 2
CONFIGS=("$@")
[ ${#CONFIGS[@]} -gt 0 ] || CONFIGS=(fold:1 fold:16 fold:64 status:16 proxy-outside:16)

REPO=$(cd "$(dirname "$0")/.." && pwd)
TARGET_DIR=${CARGO_TARGET_DIR:-$REPO/target}
OUT=${FOLDGATE_BENCH_OUT:-$TARGET_DIR/bench/ab-$(date +%Y%m%d-%H%M%S)}
PG=${FOLDGATE_BENCH_PG:-postgres://postgres@127.0.0.1:5432}
DURATION=${FOLDGATE_BENCH_DURATION:-10s}
ROUNDS=${FOLDGATE_BENCH_ROUNDS:-2}
REPEAT=${FOLDGATE_BENCH_REPEAT:-2}
BENCH=${FOLDGATE_BENCH_BIN:-$TARGET_DIR/release/foldgate-bench}
mkdir -p "$OUT"

PG_PARAMS=sslmode=disable
# shellcheck source=bench/databases.sh
. "$REPO/bench/databases.sh"

echo "results in $OUT"
uptime | tee "$OUT/load-average-start.txt"
printf '%-18s %-8s %3s %10s %10s %8s %22s %22s %12s %7s\n' config binary run \
    "gw calls/s" "base c/s" cycles/s "gateway p50/p99 ms" "create|return p99 ms" "CPU us/call" errors
for config in "${CONFIGS[@]}"; do
    mode=${config%%:*}
    agents=${config##*:}
    for run in $(seq 1 "$REPEAT"); do
        for which in previous this; do
            binary=$PREVIOUS
            [ "$which" = this ] && binary=$THIS
            name="foldgate_ab_${mode//-/_}${agents}_${which}_${run}_$$"
            fresh_db "$name"
            report="$OUT/$mode-$agents-$which-$run.json"
            "$BENCH" run --spawn-gateway "$binary" --database-url "$DB" \
                --gateway-log "$OUT/$mode-$agents-$which-$run.gateway.log" --baseline \
                --rounds "$ROUNDS" --mode "$mode" --agents "$agents" --duration "$DURATION" \
                --json "$report" >"$OUT/$mode-$agents-$which-$run.txt" 2>&1 || {
                echo "$config $which $run failed (see $OUT/$mode-$agents-$which-$run.txt)"
                continue
            }
            jq -r --arg c "$config" --arg w "$which" --arg r "$run" '
                def f(x): if x == null then "-" else (x * 100 | round / 100 | tostring) end;
                [$c, $w, $r,
                 f(.gateway.calls_per_s), f(.baseline.calls_per_s), f(.gateway.cycles_per_s),
                 (f(.gateway.latency.p50_ms) + "/" + f(.gateway.latency.p99_ms)),
                 (f(.gateway.tools.branch_create.p99_ms) + "|" + f(.gateway.tools.branch_return.p99_ms)),
                 f(.gateway.cpu.target_us_per_call), (.gateway.error_calls | tostring)]
                | @tsv' "$report" |
                awk -F'\t' '{printf "%-18s %-8s %3s %10s %10s %8s %22s %22s %12s %7s\n", $1,$2,$3,$4,$5,$6,$7,$8,$9,$10}'
        done
    done
done
uptime | tee "$OUT/load-average-end.txt"
