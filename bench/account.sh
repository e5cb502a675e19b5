#!/usr/bin/env bash
# bench/account.sh: where a cycle's CPU goes. Starts a fresh
# standalone ticketingd or a 3-node cluster (serve --cluster on loopback,
# as bench/compare.sh does), runs ticketing-bench against it, records
# every CPU system-wide with perf (perf record -a -g, frame pointers) for
# RECORD in the middle of the run, and prints bench/cpuaccount's table:
# for each process (client, standalone, leader, follower-1/2, kernel
# workers) and kind of work (client, server, wire codec, raft, Go runtime,
# alloc+GC, kernel fsync / file write / network / scheduling / other), the
# microseconds of CPU per cycle; for a cluster also the leader's log
# entries per second, commands per entry and mean commit latency in the
# same window (from its /metrics). The cycles of the window are the run's
# cycles/s times RECORD (the run is steady after its warm-up). perf's own
# cost is in the figures (a few per cent at the default frequency), so
# compare tables of one script, not these with bench/compare.sh's cycles/s.
#
# Settings (environment):
#   TARGET=cluster|standalone MODE=uncontended|contended CLIENTS=64 (16 for contended)
#   DURATION=14s RECORD=6s FREQ=499 TICKETINGD=PATH (default: built from this checkout)
#   DATA=DIR   parent of the data dirs (default: a temporary dir under $TMPDIR;
#              DATA=/dev/shm puts the logs on tmpfs: no fsync cost, not durable)
#   NODE_ENV="GOMAXPROCS=1"   environment of the ticketingd processes
#   OUT=DIR    keep perf.data, the bench's JSON and the nodes' logs there
#
# Needs perf (linux-perf), curl and, for kernel stacks, root or
# kernel.perf_event_paranoid <= 1.
#
# Example:  TARGET=cluster bench/account.sh
#           TARGET=standalone bench/account.sh
set -euo pipefail
TARGET=${TARGET:-cluster}
MODE=${MODE:-uncontended}
if [ "$MODE" = contended ]; then CLIENTS=${CLIENTS:-16}; else CLIENTS=${CLIENTS:-64}; fi
DURATION=${DURATION:-14s}
RECORD=${RECORD:-6}
RECORD=${RECORD%s}
FREQ=${FREQ:-499}
NODE_ENV=${NODE_ENV:-}
command -v perf >/dev/null || { echo "bench/account.sh: needs perf (apt-get install linux-perf)" >&2; exit 2; }
root=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d "${TMPDIR:-/tmp}/ticketing-account.XXXXXX")
data=$(mktemp -d "${DATA:-$work}/ticketing-account-data.XXXXXX")
out=${OUT:-$work/out}
mkdir -p "$out"
pids=()
cleanup() {
  local p
  for p in "${pids[@]}"; do kill -KILL "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work" "$data"
}
trap cleanup EXIT
(cd "$root" && go build -o "$work/ticketing-bench" ./cmd/ticketing-bench && go build -o "$work/cpuaccount" ./bench/cpuaccount)
if [ -n "${TICKETINGD:-}" ]; then cp "$TICKETINGD" "$work/ticketingd"; else (cd "$root" && go build -o "$work/ticketingd" ./cmd/ticketingd); fi

# Ports below the ephemeral range (see bench/compare.sh's free_port).
port_hi=$(awk '{ print $1 - 1 }' /proc/sys/net/ipv4/ip_local_port_range 2>/dev/null || echo 32767)
base=$((15000 + RANDOM % (port_hi - 15000 - 10)))
wait_port() {
  for _ in $(seq 1 300); do
    if (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; then return 0; fi
    sleep 0.1
  done
  echo "bench/account.sh: nothing listens on $1 after 30 s" >&2
  return 1
}
declare -A role_of # port -> pid
case $TARGET in
  standalone)
    env $NODE_ENV "$work/ticketingd" serve --listen "127.0.0.1:$base" --data-dir "$data/s" --log-level warn >"$out/standalone.log" 2>&1 &
    pids+=($!); role_of[$base]=$!
    addrs="127.0.0.1:$base"
    ;;
  cluster)
    peers="n1=127.0.0.1:$((base + 4)),n2=127.0.0.1:$((base + 5)),n3=127.0.0.1:$((base + 6))"
    addrs=""
    for i in 1 2 3; do
      env $NODE_ENV "$work/ticketingd" serve --cluster --node-id "n$i" --listen "127.0.0.1:$((base + i))" \
        --advertise "127.0.0.1:$((base + i))" --raft-listen "127.0.0.1:$((base + 3 + i))" --peers "$peers" \
        --admin-listen "127.0.0.1:$((base + 6 + i))" --data-dir "$data/n$i" --log-level warn >"$out/n$i.log" 2>&1 &
      pids+=($!); role_of[$((base + i))]=$!
      addrs+="${addrs:+,}127.0.0.1:$((base + i))"
    done
    ;;
  *) echo "bench/account.sh: TARGET=$TARGET: want cluster or standalone" >&2; exit 2 ;;
esac
for p in "${!role_of[@]}"; do wait_port "$p"; done

"$work/ticketing-bench" --addr "$addrs" --mode "$MODE" --clients "$CLIENTS" --duration "$DURATION" --json >"$out/bench.json" 2>"$out/bench.err" &
bench=$!
pids+=($bench)
# raft_totals PORT: the leader's entries, their commands and the sum of
# their commit latencies so far (ticketing_raft_entry_commands,
# ticketing_raft_commit_seconds), from its /metrics.
raft_totals() {
  curl -fsS "http://127.0.0.1:$1/metrics" | awk '
    /^ticketing_raft_entry_commands_count / { n = $2 }
    /^ticketing_raft_entry_commands_sum / { c = $2 }
    /^ticketing_raft_commit_seconds_sum / { s = $2 }
    END { printf "%s %s %s\n", n + 0, c + 0, s + 0 }'
}
# The sessions find the serving node and warm up; record in the middle.
sleep 3
leader_admin=
if [ "$TARGET" = cluster ]; then
  for i in 1 2 3; do
    if curl -fsS "http://127.0.0.1:$((base + 6 + i))/metrics" | grep -q '^ticketing_raft_leader 1'; then leader_admin=$((base + 6 + i)); fi
  done
  r0=$(raft_totals "$leader_admin")
fi
perf record -a -g -F "$FREQ" -o "$out/perf.data" -- sleep "$RECORD" 2>"$out/perf.err" >/dev/null
if [ -n "$leader_admin" ]; then r1=$(raft_totals "$leader_admin"); fi
wait "$bench" || { echo "ticketing-bench failed:" >&2; cat "$out/bench.err" >&2; exit 1; }

num() { sed -n "s/^  \"$1\": \\([0-9.e+]*\\),\$/\\1/p" "$out/bench.json" | head -1; }
serving=$(sed -n 's/^  "addr": "127.0.0.1:\([0-9]*\)",$/\1/p' "$out/bench.json")
cps=$(num cycles_per_sec)
roles=(-role "$bench=client")
n=0
for p in "${!role_of[@]}"; do
  if [ "$TARGET" = standalone ]; then
    roles+=(-role "${role_of[$p]}=standalone")
  elif [ "$p" = "$serving" ]; then
    roles+=(-role "${role_of[$p]}=leader")
  else
    n=$((n + 1)); roles+=(-role "${role_of[$p]}=follower-$n")
  fi
done
cycles=$(awk -v c="$cps" -v r="$RECORD" 'BEGIN { printf "%.0f", c * r }')
printf '%s %s, %s clients: %.0f cycles/s over the run; perf -F %s for %s s (%s cycles)\n\n' \
  "$TARGET" "$MODE" "$CLIENTS" "$cps" "$FREQ" "$RECORD" "$cycles"
if [ -n "$leader_admin" ]; then
  # shellcheck disable=SC2086
  awk -v r="$RECORD" -v a="$r0" -v b="$r1" 'BEGIN {
    split(a, x, " "); split(b, y, " "); n = y[1] - x[1]
    if (n > 0) printf "leader, same window: %.0f log entries/s, %.1f commands per entry, mean commit (first command queued to the entry applied) %.0f µs\n\n", n / r, (y[2] - x[2]) / n, (y[3] - x[3]) / n * 1e6
  }'
fi
perf script -F comm,pid,tid,time,event,ip,sym,dso -i "$out/perf.data" 2>/dev/null | "$work/cpuaccount" "${roles[@]}" -hz "$FREQ" -cycles "$cycles"
