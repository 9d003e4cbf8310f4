#!/usr/bin/env bash
# Runs N edge_server replicas and HAProxy in front of them on this machine, with the
# repository's HAProxy configuration (systemd/haproxy/edge-server.cfg):
#
#   scripts/deploy/replicas.sh [N] [serve options...]     (N defaults to 3)
#
# Clients use http://127.0.0.1:8080 (EDGE_LB_PORT); replica i listens on 8080+i and is
# named r<i> (X-Edge-Replica); HAProxy's stats page is http://127.0.0.1:8404/. Replicas on
# one machine share its cores: each gets cores/N threads unless --threads is given.
# Ctrl-C (or SIGTERM) drains the replicas and stops everything.
set -euo pipefail
cd "$(dirname "$0")/../.."
n=3
if [[ "${1:-}" =~ ^[0-9]+$ ]]; then n="$1"; shift; fi
lb_port="${EDGE_LB_PORT:-8080}"
stats_port="${EDGE_LB_STATS_PORT:-8404}"
if ! command -v haproxy >/dev/null 2>&1; then
    echo "replicas.sh: haproxy is not installed (Debian: apt-get install haproxy)" >&2
    exit 1
fi
if [ ! -x .venv/bin/python ]; then
    source scripts/_venv.sh
    install_project .
fi
extra=("$@")
if [[ " ${extra[*]} " != *" --threads "* ]]; then
    threads=$(( $(nproc) / n )); (( threads >= 1 )) || threads=1
    extra+=(--threads "$threads")
fi
run_dir="$(mktemp -d)"
pids=()
stop() {
    trap - INT TERM EXIT
    for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
    wait || true
    echo "logs: $run_dir"
}
trap stop INT TERM EXIT
replica_args=()
for i in $(seq 1 "$n"); do
    port=$(( lb_port + i ))
    .venv/bin/python -m edge_server serve --port "$port" --replica-name "r$i" "${extra[@]}" \
        >"$run_dir/r$i.log" 2>&1 &
    pids+=($!)
    replica_args+=(--replica "127.0.0.1:$port")
done
.venv/bin/python scripts/deploy/haproxy_config.py --listen "127.0.0.1:$lb_port" \
    --stats "127.0.0.1:$stats_port" --foreground "${replica_args[@]}" >"$run_dir/haproxy.cfg"
haproxy -db -f "$run_dir/haproxy.cfg" >"$run_dir/haproxy.log" 2>&1 &
pids+=($!)
for i in $(seq 1 "$n"); do
    until curl -sf "http://127.0.0.1:$(( lb_port + i ))/health" >/dev/null; do
        kill -0 "${pids[$(( i - 1 ))]}" 2>/dev/null || { cat "$run_dir/r$i.log" >&2; exit 1; }
        sleep 0.5
    done
done
echo "$n replicas behind http://127.0.0.1:$lb_port (stats: http://127.0.0.1:$stats_port/)"
echo "logs: $run_dir; Ctrl-C to stop"
wait
