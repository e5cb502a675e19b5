#!/usr/bin/env bash
# bench/compare.sh: the cluster and etcd figures in one run. Builds
# ticketingd, ticketing-bench and etcd-bench (bench/etcd, a module of its
# own), then runs, in alternating rounds, the same workloads against
#
#   standalone  one ticketingd process on a temporary data dir
#   cluster     three ticketingd processes: serve --cluster on loopback
#               (plain TCP between the nodes; TLS=1: see below),
#               ticketing-bench given all three addresses finds the leader
#   cluster-er  the same with --early-release (R as soon as the leader has
#               queued the release, before it commits: a deviation from
#               the protocol; see docs/operations.md)
#   etcd        a 3-member etcd v3.7.3 (etcd-bench starts the members as
#               subprocesses, fsync on; concurrency.Mutex)
#   cluster-base  the cluster target with another ticketingd binary
#               (BASE_TICKETINGD=PATH), for a before/after comparison in
#               the same alternating run
#
# with both workloads: uncontended (UNC_CLIENTS clients, a key each) and
# contended (CON_CLIENTS clients, one key). Every run gets a fresh deployment.
# A round runs each workload against each target back to back, so the runs
# that are compared are close in time on a shared machine. At the end it
# prints every run's cycles/s and acquire+release p50/p99, the medians per
# target and workload (with the contended hand-off p50), and the ratios
# cluster/standalone and cluster/etcd of the median cycles/s.
#
# Settings (environment):
#   ROUNDS=3 DURATION=10s WARMUP=500ms UNC_CLIENTS=64 CON_CLIENTS=16 CONNS=2
#   TARGETS="standalone cluster cluster-er etcd"   a subset runs only those
#   OUT=DIR                             keep every run's JSON and logs in DIR
#   TICKETINGD=PATH                     use this ticketingd binary instead of building one
#   BASE_TICKETINGD=PATH                the binary of target cluster-base (required by it), e.g.
#                                       one built from an earlier commit: git worktree add /tmp/base
#                                       <commit> && (cd /tmp/base && go build -o /tmp/base.bin ./cmd/ticketingd)
#   TLS=1                               ticketingd as deployed, from the files of 'ticketingd init':
#                                       cluster and cluster-er are started from a bundle of
#                                       'init --cluster' (3 nodes on 127.0.0.1: mutual TLS between
#                                       the nodes, TLS from the clients, a client token; cluster-er
#                                       adds --early-release on the command line), standalone
#                                       from one of 'init --tls' (TLS, a client token), and
#                                       ticketing-bench gets --tls-ca DIR/ca.pem and the token.
#                                       Those bundles require no client certificate. etcd gets
#                                       etcd-bench --tls: mutual TLS between its members and TLS
#                                       from the clients, with a CA of its own (no client
#                                       certificates, no auth token).
#
# Example:  ROUNDS=3 DURATION=10s bench/compare.sh
#           ROUNDS=3 DURATION=10s TLS=1 TARGETS="standalone cluster cluster-er" bench/compare.sh
set -euo pipefail

ROUNDS=${ROUNDS:-3}
DURATION=${DURATION:-10s}
WARMUP=${WARMUP:-500ms}
UNC_CLIENTS=${UNC_CLIENTS:-64}
CON_CLIENTS=${CON_CLIENTS:-16}
CONNS=${CONNS:-2}
TARGETS=${TARGETS:-standalone cluster cluster-er etcd}
TLS=${TLS:-}
case $TLS in
  "" | 0) TLS= ;;
  1) ;;
  *) printf 'bench/compare.sh: TLS=%s: want TLS=1 (or unset)\n' "$TLS" >&2; exit 2 ;;
esac

root=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d "${TMPDIR:-/tmp}/ticketing-compare.XXXXXX")
out=${OUT:-$work/out}
mkdir -p "$out" "$work/bin"

pids=()
cleanup() {
  local p
  for p in "${pids[@]}"; do
    kill -KILL "$p" 2>/dev/null || true
  done
  for p in "${pids[@]}"; do
    wait "$p" 2>/dev/null || true
  done
  rm -rf "$work"
}
trap cleanup EXIT

say() { printf '%s\n' "$*" >&2; }

say "building into $work/bin"
(cd "$root" && go build -o "$work/bin/ticketing-bench" ./cmd/ticketing-bench)
if [ -n "${TICKETINGD:-}" ]; then
  cp "$TICKETINGD" "$work/bin/ticketingd"
else
  (cd "$root" && go build -o "$work/bin/ticketingd" ./cmd/ticketingd)
fi
case " $TARGETS " in
  *" etcd "*) (cd "$root/bench/etcd" && go build -o "$work/bin/etcd-bench" .) ;;
esac
case " $TARGETS " in
  *" cluster-base "*)
    if [ -z "${BASE_TICKETINGD:-}" ] || [ ! -x "$BASE_TICKETINGD" ]; then
      say "bench/compare.sh: target cluster-base needs BASE_TICKETINGD=PATH (an executable ticketingd)"
      exit 2
    fi
    cp "$BASE_TICKETINGD" "$work/bin/ticketingd-base"
    ;;
esac

# free_port sets port to a loopback port nothing listens on (and that this
# script has not handed out yet); free_port N sets it to the first of N
# consecutive such ports. (It sets a variable rather than printing the
# port: in a $(...) subshell the record of the ports handed out would be
# lost.)
# The ports are taken below the kernel's ephemeral range (as
# internal/harness.FreePort does): a port in it can be given at any moment
# to an outgoing connection (the bench's, a node's to its peers), and the
# node started on it then fails to bind.
used_ports=" "
port_lo=15000
port_hi=$(awk '{ print $1 - 1 }' /proc/sys/net/ipv4/ip_local_port_range 2>/dev/null || echo 32767)
if [ "$port_hi" -le $((port_lo + 1000)) ]; then port_lo=$((port_hi - 5000)); fi
free_port() {
  local n=${1:-1} p i
  while :; do
    p=$((port_lo + RANDOM % (port_hi - port_lo - n)))
    for ((i = 0; i < n; i++)); do
      case $used_ports in *" $((p + i)) "*) continue 2 ;; esac
      if (exec 3<>"/dev/tcp/127.0.0.1/$((p + i))") 2>/dev/null; then continue 2; fi
    done
    for ((i = 0; i < n; i++)); do used_ports+="$((p + i)) "; done
    port=$p
    return
  done
}

# wait_listening LOG PID: until the node logged that it accepts connections.
wait_listening() {
  local log=$1 pid=$2
  for _ in $(seq 1 300); do
    if grep -q 'msg=listening' "$log" 2>/dev/null; then return 0; fi
    if ! kill -0 "$pid" 2>/dev/null; then
      say "ticketingd exited early:"; cat "$log" >&2; return 1
    fi
    sleep 0.1
  done
  say "ticketingd not listening after 30 s:"; cat "$log" >&2
  return 1
}

# stop_nodes: SIGTERM every started node, wait for each.
stop_nodes() {
  local p
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  pids=()
}

# start_standalone: one ticketingd; sets addrs (and with TLS=1 bench_args).
start_standalone() {
  local tag=$1 port dir log
  free_port
  dir="$work/data-$tag"
  log="$out/$tag.log"
  if [ -n "$TLS" ]; then
    # A deployment of 'init --tls' (TLS, a client token), its data dir inside.
    dir="$work/deploy-$tag"
    "$work/bin/ticketingd" init --dir "$dir" --tls --port "$port" >"$out/$tag-init.log" 2>&1 ||
      { say "ticketingd init --tls failed ($tag):"; cat "$out/$tag-init.log" >&2; return 1; }
    tls_bench_args "$dir" "$out/$tag-init.log"
    "$work/bin/ticketingd" serve --config "$dir/ticketingd.yaml" --log-level warn >"$log" 2>&1 &
  else
    "$work/bin/ticketingd" serve --listen "127.0.0.1:$port" --data-dir "$dir" --log-level warn >"$log" 2>&1 &
  fi
  pids+=($!)
  # The listening line is logged at info; at warn, wait for the port.
  for _ in $(seq 1 300); do
    if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then break; fi
    if ! kill -0 "${pids[-1]}" 2>/dev/null; then say "ticketingd exited early:"; cat "$log" >&2; return 1; fi
    sleep 0.1
  done
  addrs="127.0.0.1:$port"
}

# tls_bench_args DIR INITLOG: ticketing-bench's flags for the deployment
# 'ticketingd init' wrote into DIR: its CA, and the token of the URL that
# init printed (export TICKETING_URL='ticketing://TOKEN@...').
tls_bench_args() {
  local token
  token=$(sed -n "s/^ *export TICKETING_URL='ticketing:\/\/\([^@']*\)@.*\$/\1/p" "$2")
  if [ -z "$token" ]; then say "no TICKETING_URL with a token in $2"; return 1; fi
  bench_args=(--tls-ca "$1/ca.pem" --token "$token")
}

# start_cluster_tls TAG [EXTRA SERVE FLAGS...]: the three nodes of a bundle
# of 'init --cluster' on 127.0.0.1 (peer mutual TLS, client TLS, a client
# token), each started with serve --config and the extra flags, which
# override the config; sets addrs and bench_args.
start_cluster_tls() {
  local tag=$1 bundle="$work/bundle-$1" cbase rbase abase i
  shift
  local bin=${node_bin:-$work/bin/ticketingd}
  free_port 3; cbase=$port
  free_port 3; rbase=$port
  free_port 3; abase=$port
  "$work/bin/ticketingd" init --cluster --dir "$bundle" --node n1=127.0.0.1 --node n2=127.0.0.1 --node n3=127.0.0.1 \
    --port "$cbase" --raft-port "$rbase" --admin-port "$abase" >"$out/$tag-init.log" 2>&1 ||
    { say "ticketingd init --cluster failed ($tag):"; cat "$out/$tag-init.log" >&2; return 1; }
  tls_bench_args "$bundle" "$out/$tag-init.log"
  for i in 1 2 3; do
    "$bin" serve --config "$bundle/n$i/ticketingd.yaml" --log-level info "$@" >"$out/$tag-n$i.log" 2>&1 &
    pids+=($!)
  done
  for i in 1 2 3; do
    wait_listening "$out/$tag-n$i.log" "${pids[i-1]}"
  done
  addrs="127.0.0.1:$cbase,127.0.0.1:$((cbase + 1)),127.0.0.1:$((cbase + 2))"
}

# start_cluster: three ticketingd nodes, serve --cluster; sets addrs. With
# TLS=1, start_cluster_tls.
start_cluster() { # start_cluster TAG [EXTRA SERVE FLAGS...]
  if [ -n "$TLS" ]; then
    start_cluster_tls "$@"
    return
  fi
  local tag=$1 i peers="" list=""
  shift
  local bin=${node_bin:-$work/bin/ticketingd}
  local -a cport rport
  for i in 1 2 3; do
    free_port; cport[i]=$port
    free_port; rport[i]=$port
    peers+="${peers:+,}n$i=127.0.0.1:${rport[i]}"
    list+="${list:+,}127.0.0.1:${cport[i]}"
  done
  for i in 1 2 3; do
    local log="$out/$tag-n$i.log"
    "$bin" serve --cluster --node-id "n$i" \
      --listen "127.0.0.1:${cport[i]}" --advertise "127.0.0.1:${cport[i]}" \
      --raft-listen "127.0.0.1:${rport[i]}" --peers "$peers" \
      --data-dir "$work/data-$tag-n$i" --log-level info "$@" >"$log" 2>&1 &
    pids+=($!)
  done
  for i in 1 2 3; do
    wait_listening "$out/$tag-n$i.log" "${pids[i-1]}"
  done
  addrs=$list
}

# field FILE BLOCK KEY: KEY of the JSON object BLOCK ("" for the top level)
# in ticketing-bench's / etcd-bench's indented --json output.
field() {
  awk -v block="$2" -v key="$3" '
    block == "" && $0 ~ "^  \"" key "\":" { v = $2; sub(/,$/, "", v); print v; exit }
    block != "" && $0 ~ "^  \"" block "\": \\{" { inb = 1; next }
    inb && /^  }/ { inb = 0 }
    inb && $0 ~ "\"" key "\":" { v = $2; sub(/,$/, "", v); print v; exit }
  ' "$1"
}

# run_one ROUND TARGET WORKLOAD
run_one() {
  local round=$1 target=$2 workload=$3 clients json tag
  clients=$UNC_CLIENTS
  [ "$workload" = contended ] && clients=$CON_CLIENTS
  tag="r$round-$target-$workload"
  json="$out/$tag.json"
  case $target in
    standalone | cluster | cluster-er | cluster-base)
      bench_args=()
      case $target in
        cluster-er) start_cluster "$tag" --early-release ;;
        cluster-base) node_bin="$work/bin/ticketingd-base" start_cluster "$tag" ;;
        *) "start_$target" "$tag" ;;
      esac
      "$work/bin/ticketing-bench" --addr "$addrs" --find-wait 30s --mode "$workload" "${bench_args[@]}" \
        --clients "$clients" --conns "$CONNS" --duration "$DURATION" --warmup "$WARMUP" --json >"$json" 2>"$out/$tag.err" ||
        { say "ticketing-bench failed ($tag):"; cat "$out/$tag.err" >&2; stop_nodes; return 1; }
      stop_nodes
      ;;
    etcd)
      local etcd_tls=()
      [ -n "$TLS" ] && etcd_tls=(--tls)
      "$work/bin/etcd-bench" --members 3 "${etcd_tls[@]}" --mode "$workload" --clients "$clients" --conns "$CONNS" \
        --duration "$DURATION" --warmup "$WARMUP" --json >"$json" 2>"$out/$tag.err" ||
        { say "etcd-bench failed ($tag):"; cat "$out/$tag.err" >&2; return 1; }
      ;;
    *) say "unknown target $target"; return 1 ;;
  esac
  local cps p50 p99 hand
  cps=$(field "$json" "" cycles_per_sec)
  p50=$(field "$json" acquire_release p50_us)
  p99=$(field "$json" acquire_release p99_us)
  hand=$(field "$json" handoff p50_us)
  printf '%s %s %s %s %s %s %s\n' "$workload" "$target" "$round" "$cps" "$p50" "$p99" "${hand:-0}" >>"$work/results"
  local line
  line=$(printf 'round %s  %-11s %-11s %10.0f cycles/s  p50 %9.1f µs  p99 %9.1f µs' "$round" "$target" "$workload" "$cps" "$p50" "$p99")
  [ -n "$hand" ] && line+=$(printf '  hand-off p50 %9.1f µs' "$hand")
  say "$line"
}

: >"$work/results"
for round in $(seq 1 "$ROUNDS"); do
  for workload in uncontended contended; do
    for target in $TARGETS; do
      run_one "$round" "$target" "$workload"
    done
  done
done

# median WORKLOAD TARGET COLUMN
median() {
  awk -v w="$1" -v t="$2" -v c="$3" '$1 == w && $2 == t { print $c }' "$work/results" | sort -g |
    awk '{ v[NR] = $1 } END { if (NR == 0) exit; if (NR % 2) print v[(NR + 1) / 2]; else print (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
}

echo
echo "ticketing vs etcd: median of $ROUNDS alternating rounds, $DURATION each ($(nproc) CPUs, $(date -u +%FT%TZ))"
if [ -n "$TLS" ]; then
  echo "TLS=1: ticketingd from the files of 'ticketingd init' (cluster: peer mutual TLS; clients: TLS and a token); etcd-bench --tls (members: mutual TLS; clients: TLS)"
fi
printf '%-12s %-11s %8s %12s %12s %12s %14s\n' workload target clients "cycles/s" "p50 µs" "p99 µs" "hand-off p50"
for workload in uncontended contended; do
  clients=$UNC_CLIENTS
  [ "$workload" = contended ] && clients=$CON_CLIENTS
  for target in $TARGETS; do
    hand=-
    [ "$workload" = contended ] && hand=$(printf '%.1f µs' "$(median "$workload" "$target" 7)")
    printf '%-12s %-11s %8s %12.0f %12.1f %12.1f %14s\n' "$workload" "$target" "$clients" \
      "$(median "$workload" "$target" 4)" "$(median "$workload" "$target" 5)" "$(median "$workload" "$target" 6)" "$hand"
  done
done
echo
# ratio WORKLOAD A B: median cycles/s of A over B's, then the ratio of A
# to B within each round (the two ran minutes apart at most): their
# median, range and, against etcd, how many rounds reached 10×.
ratio() {
  local a b rounds
  a=$(median "$1" "$2" 4)
  b=$(median "$1" "$3" 4)
  if [ -z "$a" ] || [ -z "$b" ]; then return; fi
  rounds=$(awk -v w="$1" -v ta="$2" -v tb="$3" '
    $1 == w && $2 == ta { a[$3] = $4 }
    $1 == w && $2 == tb { b[$3] = $4 }
    END { for (r in a) if ((r in b) && b[r] > 0) print a[r] / b[r] }' "$work/results" | sort -g |
    awk -v bar="$([ "$3" = etcd ] && echo 10)" '{ v[NR] = $1; if (bar != "" && $1 >= bar) reached++ }
      END { if (NR == 0) exit
            m = (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2
            printf "per round: median %.2f×, %.2f–%.2f×", m, v[1], v[NR]
            if (bar != "") printf ", %d of %d rounds ≥ %d×", reached, NR, bar }')
  awk -v a="$a" -v b="$b" -v w="$1" -v n="$2/$3" -v r="$rounds" 'BEGIN { if (b > 0) printf "%-12s %-22s %8.2f×   %s\n", w, n, a / b, r }'
}
for workload in uncontended contended; do
  ratio "$workload" cluster standalone
  ratio "$workload" cluster etcd
  ratio "$workload" cluster-er etcd
  ratio "$workload" cluster-er cluster
  ratio "$workload" cluster-base etcd
  ratio "$workload" cluster cluster-base
  ratio "$workload" standalone etcd
done
if [ -n "${OUT:-}" ]; then echo "runs' JSON and logs in $out"; fi
