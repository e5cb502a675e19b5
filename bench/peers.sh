#!/usr/bin/env bash
# bench/peers.sh: the peer figures, the Go client (broker) against
# github.com/bsm/redislock, in one run. Builds ticketingd and peers-bench
# (bench/peers, a module of its own), then runs, in alternating rounds, the
# same workloads through
#
#   broker     one broker.Broker (two sessions, every client multiplexed
#              over them) against a fresh standalone ticketingd per run
#              (serve --listen 127.0.0.1:PORT --data-dir TMP --log-level warn)
#   redislock  redislock v0.9.4 on one go-redis v9.23.0 client (a pool of
#              a connection per client) against the Redis at REDIS, as it
#              runs (here without persistence: save "", appendonly no; the
#              tool prints its settings); the keys under peers-bench: are
#              deleted before each run (not FLUSHALL)
#
# with both workloads: uncontended (CLIENTS clients, a key each) and
# contended (CON_CLIENTS clients, one key), lease 30 s and wait 10 s on
# both. Contended, ticketingd queues the waiters and hands the lock on in
# one round trip; redislock polls, each waiter trying again every BACKOFF
# (its LinearBackoff). Before each run peers-bench measures the idle round
# trip of its client to its server; on the contended workload it reports
# the round-trip bound (1 / round-trip p50) and the fraction of it reached
# (of_bound), and the same against the round trip measured during the run
# (a PING per millisecond: of_loaded_bound; steadier on a VM, whose idle
# wake-ups vary from round to round). A round runs each workload against both targets back to
# back (broker first in odd rounds, redislock first in even ones), so the
# runs compared are close in time on a shared machine. At the end it
# prints every run's cycles/s, the medians per target and workload, the
# ratio broker/redislock within each round and of the medians, and the
# contended of_bound and of_loaded_bound of each target.
#
# Settings (environment):
#   ROUNDS=3 DURATION=8s WARMUP=500ms CLIENTS=64 CON_CLIENTS=16
#   REDIS=127.0.0.1:6379   the Redis of redislock (not started by the script)
#   BACKOFF=1ms            redislock's polling interval (LinearBackoff)
#   POOL=0                 go-redis's PoolSize; 0: the larger of the clients and
#                          go-redis's default (10 per GOMAXPROCS), a connection per client
#   OUT=DIR                keep every run's JSON and logs in DIR
#   TICKETINGD=PATH        use this ticketingd binary instead of building one
#
# Example:  ROUNDS=3 DURATION=8s bench/peers.sh
#           ROUNDS=1 DURATION=2s bench/peers.sh     # a check that it works
set -euo pipefail

ROUNDS=${ROUNDS:-3}
DURATION=${DURATION:-8s}
WARMUP=${WARMUP:-500ms}
CLIENTS=${CLIENTS:-64}
CON_CLIENTS=${CON_CLIENTS:-16}
REDIS=${REDIS:-127.0.0.1:6379}
BACKOFF=${BACKOFF:-1ms}
POOL=${POOL:-0}

root=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d "${TMPDIR:-/tmp}/ticketing-peers.XXXXXX")
out=${OUT:-$work/out}
mkdir -p "$out" "$work/bin"

srv=
cleanup() {
  if [ -n "$srv" ]; then
    kill -KILL "$srv" 2>/dev/null || true
    wait "$srv" 2>/dev/null || true
  fi
  rm -rf "$work"
}
trap cleanup EXIT

say() { printf '%s\n' "$*" >&2; }

say "building into $work/bin"
if [ -n "${TICKETINGD:-}" ]; then
  cp "$TICKETINGD" "$work/bin/ticketingd"
else
  (cd "$root" && go build -o "$work/bin/ticketingd" ./cmd/ticketingd)
fi
(cd "$root/bench/peers" && go build -o "$work/bin/peers-bench" .)

# free_port sets port to a loopback port nothing listens on, below the
# kernel's ephemeral range (as bench/compare.sh and internal/harness.FreePort
# do: a port in that range can be given at any moment to an outgoing
# connection, and the server started on it then fails to bind).
port_lo=15000
port_hi=$(awk '{ print $1 - 1 }' /proc/sys/net/ipv4/ip_local_port_range 2>/dev/null || echo 32767)
if [ "$port_hi" -le $((port_lo + 1000)) ]; then port_lo=$((port_hi - 5000)); fi
free_port() {
  while :; do
    port=$((port_lo + RANDOM % (port_hi - port_lo)))
    if ! (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then return; fi
  done
}

# start_ticketingd TAG: a standalone ticketingd on a fresh data dir; sets
# addr once it accepts connections (at --log-level warn it logs nothing
# when it starts listening, so wait for the port).
start_ticketingd() {
  local tag=$1 log="$out/$1.log"
  free_port
  "$work/bin/ticketingd" serve --listen "127.0.0.1:$port" --data-dir "$work/data-$tag" --log-level warn >"$log" 2>&1 &
  srv=$!
  for _ in $(seq 1 300); do
    if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
      addr="127.0.0.1:$port"
      return
    fi
    if ! kill -0 "$srv" 2>/dev/null; then say "ticketingd exited early:"; cat "$log" >&2; return 1; fi
    sleep 0.1
  done
  say "ticketingd not listening after 30 s:"; cat "$log" >&2
  return 1
}

stop_ticketingd() {
  kill -TERM "$srv" 2>/dev/null || true
  wait "$srv" 2>/dev/null || true
  srv=
}

# run_one ROUND TARGET WORKLOAD: one run; appends its figures to results.
run_one() {
  local round=$1 target=$2 workload=$3 clients=$CLIENTS tag json
  [ "$workload" = contended ] && clients=$CON_CLIENTS
  tag="r$round-$target-$workload"
  json="$out/$tag.json"
  local args=(--mode "$workload" --clients "$clients" --duration "$DURATION" --warmup "$WARMUP" --json)
  if [ "$target" = broker ]; then
    start_ticketingd "$tag"
    "$work/bin/peers-bench" --target broker --addr "$addr" "${args[@]}" >"$json" 2>"$out/$tag.err" ||
      { say "peers-bench failed ($tag):"; cat "$out/$tag.err" >&2; stop_ticketingd; return 1; }
    stop_ticketingd
  else
    "$work/bin/peers-bench" --target redislock --redis "$REDIS" --backoff "$BACKOFF" --pool "$POOL" --flush "${args[@]}" >"$json" 2>"$out/$tag.err" ||
      { say "peers-bench failed ($tag):"; cat "$out/$tag.err" >&2; return 1; }
  fi
  python3 - "$json" "$round" >>"$work/results" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
print(r["mode"], r["target"], sys.argv[2], r["cycles_per_sec"], r["acquire_release"]["p50_us"],
      r["acquire_release"]["p99_us"], r.get("of_bound", 0), r.get("redis_scripts_per_cycle", 0), r.get("of_loaded_bound", 0))
PY
  say "$(tail -1 "$work/results" | awk '{ printf "round %s  %-9s %-11s %10.0f cycles/s  p50 %9.1f µs  p99 %9.1f µs", $3, $2, $1, $4, $5, $6
    if ($1 == "contended") printf "  of bound %.2f, of loaded bound %.2f", $7, $9 }')"
}

: >"$work/results"
for round in $(seq 1 "$ROUNDS"); do
  order="broker redislock"
  [ $((round % 2)) = 0 ] && order="redislock broker"
  for workload in uncontended contended; do
    for target in $order; do
      run_one "$round" "$target" "$workload"
    done
  done
done

echo
echo "broker vs redislock: $ROUNDS alternating rounds, $DURATION each ($(nproc) CPUs, $(date -u +%FT%TZ))"
echo "uncontended: $CLIENTS clients; contended: $CON_CLIENTS clients; redislock polls every $BACKOFF"
python3 - "$work/results" <<'PY'
import statistics, sys
runs = [l.split() for l in open(sys.argv[1])]
rows = {}
for w, t, rnd, cps, p50, p99, ofb, spc, oflb in runs:
    rows.setdefault((w, t), []).append((int(rnd), float(cps), float(p50), float(p99), float(ofb), float(spc), float(oflb)))
med = lambda xs: statistics.median(xs) if xs else 0
print()
print("every run (cycles/s):")
for w in ("uncontended", "contended"):
    for t in ("broker", "redislock"):
        print(f"  {w:<12} {t:<10}", "  ".join(f"r{r} {c:,.0f}" for r, c, *_ in rows.get((w, t), [])))
print()
print(f"{'workload':<12} {'target':<10} {'cycles/s':>10} {'p50 µs':>9} {'p99 µs':>9} {'of bound':>9} {'of loaded':>10} {'scripts/cycle':>14}")
for w in ("uncontended", "contended"):
    for t in ("broker", "redislock"):
        rs = rows.get((w, t), [])
        ofb = f"{med([x[4] for x in rs]):.2f}" if w == "contended" else "-"
        oflb = f"{med([x[6] for x in rs]):.2f}" if w == "contended" else "-"
        spc = f"{med([x[5] for x in rs]):.1f}" if t == "redislock" else "-"
        print(f"{w:<12} {t:<10} {med([x[1] for x in rs]):>10,.0f} {med([x[2] for x in rs]):>9.1f} {med([x[3] for x in rs]):>9.1f} {ofb:>9} {oflb:>10} {spc:>14}")
print()
print("broker/redislock:")
for w in ("uncontended", "contended"):
    b = {r: c for r, c, *_ in rows.get((w, "broker"), [])}
    d = {r: c for r, c, *_ in rows.get((w, "redislock"), [])}
    per = [b[r] / d[r] for r in sorted(b) if r in d and d[r] > 0]
    mb, md = med(list(b.values())), med(list(d.values()))
    if md > 0:
        print(f"  {w:<12} of the medians {mb / md:.2f}×; per round " + ", ".join(f"{x:.2f}×" for x in per) +
              f" (median {med(per):.2f}×)")
PY
if [ -n "${OUT:-}" ]; then echo "runs' JSON and logs in $out"; fi
