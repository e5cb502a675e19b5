#!/usr/bin/env bash
# bench/pair.sh: the cost of a hot-standby pair's synchronous replication.
# Alternating rounds of the same ticketing-bench runs (uncontended,
# UNC_CLIENTS clients with a key each; contended, CON_CLIENTS clients on
# one key) against a standalone ticketingd and against the active node of a
# pair (two processes on this machine, peer link with mutual TLS from an
# 'init --pair' bundle; the clients speak plain TCP to both, as the
# standalone's do), each round on fresh data dirs. It prints every round's
# cycles/s and, per workload, the ratio pair/standalone of each round and
# their median.
#
#   bench/pair.sh
#
# Settings: ROUNDS=5 DURATION=8s UNC_CLIENTS=64 CON_CLIENTS=16;
# TICKETINGD and BENCH: paths of the binaries (default: built from this
# checkout).
set -euo pipefail
ROUNDS=${ROUNDS:-5}
DURATION=${DURATION:-8s}
UNC_CLIENTS=${UNC_CLIENTS:-64}
CON_CLIENTS=${CON_CLIENTS:-16}
here=$(cd "$(dirname "$0")/.." && pwd)
tmp=$(mktemp -d)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; rm -rf "$tmp"; }
trap cleanup EXIT
TICKETINGD=${TICKETINGD:-}
if [ -z "$TICKETINGD" ]; then
  (cd "$here" && go build -o "$tmp/ticketingd" ./cmd/ticketingd)
  TICKETINGD=$tmp/ticketingd
fi
BENCH=${BENCH:-}
if [ -z "$BENCH" ]; then
  (cd "$here" && go build -o "$tmp/ticketing-bench" ./cmd/ticketing-bench)
  BENCH=$tmp/ticketing-bench
fi
cps() { python3 -c 'import json,sys; print(round(json.load(sys.stdin)["cycles_per_sec"]))'; }
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()'; }
"$TICKETINGD" init --pair --dir "$tmp/bundle" --node primary=127.0.0.1 --node backup=127.0.0.1 >/dev/null
waitlog() { for _ in $(seq 100); do grep -q "$2" "$1" && return 0; sleep 0.1; done; echo "no '$2' in $1" >&2; cat "$1" >&2; return 1; }
results=$tmp/results
for r in $(seq 1 "$ROUNDS"); do
  for which in standalone pair; do
    port=$(free_port)
    if [ "$which" = standalone ]; then
      "$TICKETINGD" serve --listen "127.0.0.1:$port" --data-dir "$tmp/data-$r" --log-format json >"$tmp/log-$r-s" 2>&1 &
      pids=("$!")
      waitlog "$tmp/log-$r-s" listening
    else
      pp=$(free_port) bp=$(free_port) bc=$(free_port)
      for role in primary backup; do
        if [ "$role" = primary ]; then
          self=$pp peer=$bp client=$port
        else
          self=$bp peer=$pp client=$bc
        fi
        b=$tmp/bundle/$role
        "$TICKETINGD" serve --pair "$role" --listen "127.0.0.1:$client" --peer "127.0.0.1:$peer" --peer-listen "127.0.0.1:$self" \
          --peer-tls-cert "$b/node.pem" --peer-tls-key "$b/node-key.pem" --peer-tls-ca "$b/ca.pem" \
          --data-dir "$tmp/pair-$r-$role" --log-format json >"$tmp/log-$r-$role" 2>&1 &
        pids+=("$!")
      done
      waitlog "$tmp/log-$r-primary" '"pair: replicating to the passive'
      waitlog "$tmp/log-$r-backup" '"pair: caught up'
    fi
    u=$("$BENCH" --addr "127.0.0.1:$port" --mode uncontended --clients "$UNC_CLIENTS" --duration "$DURATION" --json | cps)
    c=$("$BENCH" --addr "127.0.0.1:$port" --mode contended --clients "$CON_CLIENTS" --duration "$DURATION" --json | cps)
    if [ "$which" = pair ] && grep -q 'serving unreplicated' "$tmp/log-$r-primary"; then
      echo "round $r: the pair stopped replicating during the run; its figure is not the replicated one" >&2
      grep 'serving unreplicated' "$tmp/log-$r-primary" >&2
    fi
    for p in "${pids[@]}"; do kill "$p"; wait "$p" 2>/dev/null || true; done
    pids=()
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
    rs = [d[r]["pair"][i] / d[r]["standalone"][i] for r in d]
    print(f"{name:12s} pair/standalone per round {' '.join(f'{x:.3f}' for x in rs)}  median {statistics.median(rs):.3f}")
PY
