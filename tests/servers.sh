# Sourced by the test scripts that run foldgate and other servers as
# processes: background processes and temporary directories cleaned up on
# exit, free loopback ports, and an environment without the caller's
# foldgate settings.

# PIDS: background processes to stop on exit; TMPDIRS: directories to remove.
PIDS=()
TMPDIRS=()
cleanup() {
  local pid dir
  for pid in "${PIDS[@]}"; do
    kill "$pid" 2>/dev/null || true
  done
  for pid in "${PIDS[@]}"; do
    wait "$pid" 2>/dev/null || true
  done
  for dir in "${TMPDIRS[@]}"; do
    rm -rf "$dir"
  done
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# free_ports N: N free loopback ports, bound at once, reported, released.
free_ports() {
  python3 - "$1" <<'PY'
import socket, sys
socks = []
for _ in range(int(sys.argv[1])):
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    socks.append(s)
print(" ".join(str(s.getsockname()[1]) for s in socks))
for s in socks:
    s.close()
PY
}

# clean_env: `env` arguments that run foldgate with no FOLDGATE_* or
# DATABASE_URL from the caller's environment, so that "zero configuration"
# really is zero configuration.
clean_env=()
while IFS= read -r name; do
  case "$name" in FOLDGATE_* | DATABASE_URL) clean_env+=(-u "$name") ;; esac
done < <(compgen -e)
