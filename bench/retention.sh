#!/usr/bin/env bash
# Retention under load: a Postgres database seeded with TREES ended branch
# trees of two months ago (one depth-1 branch each, CALLS upstream calls per
# branch: 1,000,000 call rows by default), then two runs of the same fold
# load (16 agents) against one gateway each (release build):
#   1. retention off: the folding calls alone;
#   2. retention on: the gateway prunes the backlog while the agents fold.
# Prints the create and return latencies of both runs, how long pruning
# took, and what was left; writes every report to the output directory.
#
#   bench/retention.sh [FOLDGATE]
#
# Settings (environment): FOLDGATE_BENCH_OUT, FOLDGATE_BENCH_PG,
# FOLDGATE_BENCH_BIN as for ab.sh; FOLDGATE_BENCH_DURATION (default 60s);
# RETENTION_TREES (default 100000); RETENTION_CALLS (calls per branch,
# default 10). Needs: psql.
set -euo pipefail

REPO=$(cd "$(dirname "$0")/.." && pwd)
TARGET_DIR=${CARGO_TARGET_DIR:-$REPO/target}
FOLDGATE=${1:-$TARGET_DIR/release/foldgate}
OUT=${FOLDGATE_BENCH_OUT:-$TARGET_DIR/bench/retention-$(date +%Y%m%d-%H%M%S)}
PG=${FOLDGATE_BENCH_PG:-postgres://postgres@127.0.0.1:5432}
DURATION=${FOLDGATE_BENCH_DURATION:-60s}
BENCH=${FOLDGATE_BENCH_BIN:-$TARGET_DIR/release/foldgate-bench}
TREES=${RETENTION_TREES:-100000}
CALLS=${RETENTION_CALLS:-10}
mkdir -p "$OUT"

# shellcheck source=bench/databases.sh
source "$REPO/bench/databases.sh"
fresh_db "fg_retention_$$"
"$FOLDGATE" migrate --database-url "$DB" >/dev/null

echo "seeding $TREES ended trees with $CALLS calls each"
psql "$DB" -qAt -v ON_ERROR_STOP=1 <<SQL
INSERT INTO sessions (tenant_id, session_id, owner_sub, status, budget, used, reserved,
                      created_at, last_activity_at, ended_at)
SELECT 'old-' || (g % 8), 'old-' || g, 'agent', 'ended', 1000000, 0, 0,
       now() - interval '61 days', now() - interval '60 days', now() - interval '60 days'
FROM generate_series(1, $TREES / 10) AS g;
INSERT INTO branches (id, tenant_id, session_id, owner_sub, depth, description, prompt, budget,
                      used, reserved, status, created_at, deadline_at, completed_at, result)
SELECT gen_random_uuid(), 'old-' || (s % 8), 'old-' || s, 'agent', 1, 'old work', 'p', 8192,
       1100, 0, 'completed', now() - interval '61 days', now() - interval '61 days' + interval '5 minutes',
       now() - interval '60 days' + make_interval(secs => s * 10 + b), 'done'
FROM generate_series(1, $TREES / 10) AS s, generate_series(1, 10) AS b;
INSERT INTO branch_calls (id, tenant_id, branch_id, upstream, tool, tokens_in, tokens_out,
                          tokens_charged, duration_ms, outcome, called_at)
SELECT gen_random_uuid(), b.tenant_id, b.id, 'files', 'read_file', 10, 100, 110, 5, 'ok', b.created_at
FROM branches AS b, generate_series(1, $CALLS);
VACUUM ANALYZE;
SQL
count() { psql "$DB" -qAt -c "SELECT (SELECT count(*) FROM branches), (SELECT count(*) FROM branch_calls), (SELECT count(*) FROM sessions)"; }
echo "before: branches|calls|sessions = $(count)"

config() {
    cat <<TOML
[api.rate_limit]
per_second = 1000000
burst = 1000000

[folding.limits]
max_active_per_session = 1000
max_active_per_tenant = 1000000
max_active_total = 1000000
creations_per_minute = 1000000

[retention]
branches = "$1d"
sessions = "$1d"
interval = "5s"
TOML
}

run() {
    local name=$1 days=$2
    config "$days" >"$OUT/$name.toml"
    local started=$SECONDS
    "$BENCH" run --spawn-gateway "$FOLDGATE" --database-url "$DB" --gateway-config "$OUT/$name.toml" \
        --gateway-log "$OUT/$name.log" --mode fold --agents 16 --warmup 2s --duration "$DURATION" \
        --json "$OUT/$name.json" >"$OUT/$name.txt" 2>&1
    echo "== $name ($((SECONDS - started)) s)"
    grep -E "branch_create|branch_return|cycles" "$OUT/$name.txt" || cat "$OUT/$name.txt"
}

run retention-off 0
echo "after the run without retention: branches|calls|sessions = $(count)"
run retention-on 30
echo "after the run with retention: branches|calls|sessions = $(count)"
echo "retention passes (from the gateway's log):"
grep 'retention deleted what ended long ago' "$OUT/retention-on.log" | cut -c1-400 | head -20 || true
echo "reports in $OUT"
