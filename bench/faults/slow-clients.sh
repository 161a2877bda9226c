#!/usr/bin/env bash
# Slow and abandoned clients do not pin the gateway's memory or sockets:
# 500 connections that send half of their headers and stall, 500 that send
# half of their body and stall, and 500 requests abandoned right after they
# were sent. For each, the gateway's memory, descriptors and TCP sockets are
# sampled before, while they stall, and after they let go, and a
# well-behaved client checks that it is still served meanwhile.
#   - after each round, the client connections are gone, descriptors are
#     back to where they were (but for database connections the pool may
#     have opened meanwhile) and resident memory within 20% (+ 8 MiB);
#   - the well-behaved client saw no error;
#   - stalled bodies are answered 503 at `api.request_timeout`, and stalled
#     headers closed at `api.header_read_timeout` (both set to 5 s here).
# Settings: see lib.sh; FOLDGATE_FAULTS_CONNECTIONS (500),
# FOLDGATE_FAULTS_HOLD (seconds, 12).
set -euo pipefail
source "$(dirname "$0")/lib.sh"

CONNECTIONS=${FOLDGATE_FAULTS_CONNECTIONS:-500}
HOLD=${FOLDGATE_FAULTS_HOLD:-12}

OUT=$(out_dir slow-clients)
trap cleanup EXIT
create_database slow
PORT=$(free_port)
OPS=$(free_port)
write_config "$OUT/foldgate.toml"
# The timeouts are [api] settings: prepend them so that they land in [api]
# and not in the last table of the file.
{ printf '[api]\nrequest_timeout = "5s"\nheader_read_timeout = "5s"\n\n'; cat "$OUT/foldgate.toml"; } >"$OUT/foldgate.toml.new"
mv "$OUT/foldgate.toml.new" "$OUT/foldgate.toml"
echo "figures and logs in $OUT"
ulimit -n 65536 2>/dev/null || true

start_gateway "$PORT" "$OPS" "$DB_URL" "$OUT/foldgate.toml" "$OUT/gateway.log"
PID=$GATEWAY_PID

for kind in half-headers half-body abandon; do
    "$BENCH" slow-clients --url "http://127.0.0.1:$PORT/mcp" --pid "$PID" --jwt-secret "$SECRET" --audience "$AUDIENCE" \
        --kind "$kind" --connections "$CONNECTIONS" --hold "${HOLD}s" --json "$OUT/$kind.json"
    released() {
        # Descriptors: the client connections are gone; the database pool
        # may have grown to its maximum (10) meanwhile.
        jq -e '(.after.inbound <= .before.inbound + 2)
               and (.after.fds <= .before.fds + 12)
               and (.after.rss_kib <= .before.rss_kib * 1.2 + 8192)' "$OUT/$kind.json" >/dev/null
    }
    check "$kind: descriptors and memory released" released
    check "$kind: a well-behaved client was served meanwhile" \
        test "$(jq '.probe.error_calls == 0 and .probe.ok_calls > 0' "$OUT/$kind.json")" = true
done
check "half-body: stalled requests answered at the request timeout" \
    test "$(jq ".closed_by_server == .connections - .connect_failures" "$OUT/half-body.json")" = true
check "half-headers: stalled request heads closed at the header-read timeout" \
    test "$(jq ".closed_by_server == .connections - .connect_failures" "$OUT/half-headers.json")" = true
finish
