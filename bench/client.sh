#!/usr/bin/env bash
# bench/client.sh: the Go client (broker) against the project's load tool
# (ticketing-bench), both against the same standalone ticketingd, in
# alternating rounds of one run. Each round runs the tool
# uncontended (CLIENTS clients over 2 sessions, a key each) for DURATION,
# then BenchmarkAcquireRelease (64 goroutines, a cancellable ctx each,
# -benchtime Nx) of each broker test binary given, pointed at the same
# server through TICKETING_BENCH_ADDR. It prints every round's cycles/s,
# each process's CPU per cycle (user+system, from /usr/bin/time; the
# server's from /proc), the ratio broker/tool per round and the medians.
#
#   bench/client.sh                                  # the broker of this checkout
#   OLD=/path/old-broker.test bench/client.sh        # and an older one, alternating
#
# Settings: ROUNDS=8 DURATION=4s N=800000 CLIENTS=64;
# BENCH=BenchmarkAcquireReleaseBackground measures the broker with
# context.Background() (plain receives instead of a select on the reply
# and ctx.Done) instead of BenchmarkAcquireRelease, OLDBENCH the same for
# OLD (default: BENCH; with OLD set to the same binary as NEW, it compares
# the two benchmarks of one binary); NEW=path of the broker test binary
# (default: built from this checkout); BENCHFLAGS (extra
# flags of the broker test binaries, e.g. -test.cpuprofile=FILE). A test
# binary is built with `go test -c -o FILE ./broker/`.
set -euo pipefail
ROUNDS=${ROUNDS:-8}
DURATION=${DURATION:-4s}
N=${N:-800000}
CLIENTS=${CLIENTS:-64}
BENCH=${BENCH:-BenchmarkAcquireRelease}
here=$(cd "$(dirname "$0")/.." && pwd)
tmp=$(mktemp -d)
srv=
cleanup() { [ -n "$srv" ] && kill "$srv" 2>/dev/null; wait 2>/dev/null; rm -rf "$tmp"; }
trap cleanup EXIT
(cd "$here" && go build -o "$tmp/ticketingd" ./cmd/ticketingd && go build -o "$tmp/ticketing-bench" ./cmd/ticketing-bench)
if [ -z "${NEW:-}" ]; then
  (cd "$here" && go test -c -o "$tmp/new.test" ./broker/)
  NEW=$tmp/new.test
fi
names=(new)
bins=("$NEW")
benches=("$BENCH")
if [ -n "${OLD:-}" ]; then names+=(old); bins+=("$OLD"); benches+=("${OLDBENCH:-$BENCH}"); fi
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()')
"$tmp/ticketingd" serve --listen "127.0.0.1:$port" --data-dir "$tmp/data" >"$tmp/server.log" 2>&1 &
srv=$!
for _ in $(seq 50); do grep -q listening "$tmp/server.log" && break; sleep 0.1; done
addr=127.0.0.1:$port
# srvcpu prints the server's CPU time so far, in seconds.
srvcpu() { awk -v hz="$(getconf CLK_TCK)" '{print ($14+$15)/hz}' "/proc/$srv/stat"; }
results=$tmp/results
echo "server $addr (pid $srv); $(uptime)"
for r in $(seq 1 "$ROUNDS"); do
  s0=$(srvcpu)
  /usr/bin/time -f '%U %S' -o "$tmp/time" "$tmp/ticketing-bench" --addr "$addr" --mode uncontended \
    --clients "$CLIENTS" --conns 2 --duration "$DURATION" --json >"$tmp/tool.json"
  s1=$(srvcpu)
  python3 - "$tmp/tool.json" "$tmp/time" "$s0" "$s1" "$DURATION" "$r" >>"$results" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
u, s = map(float, open(sys.argv[2]).read().split()[-2:])
cps = d["cycles_per_sec"]
dur = float(sys.argv[5].rstrip("s")) + 0.5  # the tool's default warmup is measured in CPU too
cycles = cps * dur
srv = float(sys.argv[4]) - float(sys.argv[3])
print(f"{sys.argv[6]} tool {cps:.0f} {(u+s)/cycles*1e6:.2f} {srv/cycles*1e6:.2f}")
PY
  order=("${!bins[@]}")
  if [ $((r % 2)) -eq 0 ] && [ ${#bins[@]} -eq 2 ]; then order=(1 0); fi # the second slot runs on a warmer server: alternate
  for i in "${order[@]}"; do
    s0=$(srvcpu)
    TICKETING_BENCH_ADDR=$addr /usr/bin/time -f '%U %S' -o "$tmp/time" "${bins[$i]}" -test.run '^$' \
      -test.bench "^${benches[$i]}\$" -test.benchmem -test.benchtime "${N}x" ${BENCHFLAGS:-} >"$tmp/bench.out"
    s1=$(srvcpu)
    python3 - "$tmp/bench.out" "$tmp/time" "$s0" "$s1" "$N" "$r" "${names[$i]}" >>"$results" <<'PY'
import re, sys
out = open(sys.argv[1]).read()
m = re.search(r"BenchmarkAcquireRelease\S*\s+\d+\s+[\d.]+ ns/op\s+([\d.]+) cycles/s\s+(\d+) B/op\s+(\d+) allocs/op", out)
if not m:
    sys.exit("no benchmark line in:\n" + out)
u, s = map(float, open(sys.argv[2]).read().split()[-2:])
n = int(sys.argv[5])
srv = float(sys.argv[4]) - float(sys.argv[3])
print(f"{sys.argv[6]} {sys.argv[7]} {float(m.group(1)):.0f} {(u+s)/n*1e6:.2f} {srv/n*1e6:.2f} {m.group(2)}B {m.group(3)}allocs")
PY
  done
  grep "^$r " "$results" | sed 's/^/round /'
done
python3 - "$results" <<'PY'
import statistics, sys
rounds = {}
for line in open(sys.argv[1]):
    f = line.split()
    rounds.setdefault(f[0], {})[f[1]] = (float(f[2]), float(f[3]), float(f[4]))
names = [n for n in next(iter(rounds.values())) if n != "tool"]
print("cycles/s, then client and server CPU in us per cycle (medians)")
for n in ["tool"] + names:
    for j, what in enumerate(("cycles/s", "client us/cycle", "server us/cycle")):
        print(f"  {n:5s} {what:16s} median {statistics.median(r[n][j] for r in rounds.values()):.2f}")
for n in names:
    rs = [r[n][0] / r["tool"][0] for r in rounds.values()]
    print(f"{n}/tool per round {' '.join(f'{x:.3f}' for x in rs)}  median {statistics.median(rs):.3f}  ({min(rs):.3f}-{max(rs):.3f})")
if "old" in names:
    rs = [r["new"][0] / r["old"][0] for r in rounds.values()]
    print(f"new/old per round {' '.join(f'{x:.3f}' for x in rs)}  median {statistics.median(rs):.3f}")
PY
echo "$(uptime)"
