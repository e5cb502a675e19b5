#!/usr/bin/env bash
# bench/ab.sh: two standalone ticketingd binaries against each other, in
# alternating rounds of the same runs of ticketing-bench (uncontended,
# UNC_CLIENTS clients with a key each; contended, CON_CLIENTS clients on one
# key), each round a fresh server on a fresh data dir for each binary. It
# prints every round's cycles/s and, per workload, the ratio B/A of each
# round and their median: a before/after figure from one run on a shared
# machine (for instance a change against the commit before it).
#
#   A=/path/to/old/ticketingd B=/path/to/new/ticketingd bench/ab.sh
#
# Settings: ROUNDS=5 DURATION=8s UNC_CLIENTS=64 CON_CLIENTS=16; BENCH=path
# of ticketing-bench (default: built from this checkout).
set -euo pipefail
: "${A:?A=old ticketingd binary}" "${B:?B=new ticketingd binary}"
ROUNDS=${ROUNDS:-5}
DURATION=${DURATION:-8s}
UNC_CLIENTS=${UNC_CLIENTS:-64}
CON_CLIENTS=${CON_CLIENTS:-16}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
BENCH=${BENCH:-}
if [ -z "$BENCH" ]; then
  (cd "$(dirname "$0")/.." && go build -o "$tmp/ticketing-bench" ./cmd/ticketing-bench)
  BENCH=$tmp/ticketing-bench
fi
cps() { python3 -c 'import json,sys; print(round(json.load(sys.stdin)["cycles_per_sec"]))'; }
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()'; }
results=$tmp/results
for r in $(seq 1 "$ROUNDS"); do
  for which in A B; do
    bin=${!which}
    d=$tmp/data-$r-$which
    port=$(free_port)
    "$bin" serve --listen "127.0.0.1:$port" --data-dir "$d" >"$tmp/log-$r-$which" 2>&1 &
    pid=$!
    for _ in $(seq 50); do grep -q listening "$tmp/log-$r-$which" && break; sleep 0.1; done
    u=$("$BENCH" --addr "127.0.0.1:$port" --mode uncontended --clients "$UNC_CLIENTS" --duration "$DURATION" --json | cps)
    c=$("$BENCH" --addr "127.0.0.1:$port" --mode contended --clients "$CON_CLIENTS" --duration "$DURATION" --json | cps)
    kill "$pid"; wait "$pid" 2>/dev/null || true
    echo "round $r $which uncontended $u contended $c" | tee -a "$results"
  done
done
python3 - "$results" <<'PY'
import statistics, sys
d = {}
for line in open(sys.argv[1]):
    _, r, which, _, u, _, c = line.split()
    d.setdefault(r, {})[which] = (int(u), int(c))
for i, name in ((0, "uncontended"), (1, "contended")):
    rs = [d[r]["B"][i] / d[r]["A"][i] for r in d]
    print(f"{name:12s} B/A per round {' '.join(f'{x:.3f}' for x in rs)}  median {statistics.median(rs):.3f}")
PY
