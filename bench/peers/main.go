// Command peers-bench is the peer benchmark of the Go client (package
// broker) against github.com/bsm/redislock (v0.9.4, on go-redis v9.23.0):
// the same two workloads, run by the same loop through each library as its
// users call it, reported in ticketing-bench's format, so that the figures
// can be set side by side (bench/peers.sh does, in alternating rounds).
//
// It lives in a module of its own so that redislock and go-redis stay out
// of the library's go.mod; it uses this checkout's broker through a
// replace directive.
//
// # The targets
//
//	broker     one broker.Broker (broker.Connect(--addr): two sessions to
//	           the node, which it multiplexes every client over, as by
//	           default) against a running ticketingd; each client goroutine
//	           has a cancellable context of its own, as broker's
//	           BenchmarkAcquireRelease does. Acquire(ctx, key,
//	           AcquireOptions{Lease: --lease, Wait: --wait}), then
//	           Ticket.Release.
//	redislock  one redislock.Client over one go-redis client (its pool
//	           sized to the larger of --clients and go-redis's default,
//	           10 per GOMAXPROCS: a connection per client, so the pool is
//	           never what the clients wait for; --pool sets another size)
//	           against --redis.
//	           Obtain(ctx with a --wait timeout, key, --lease,
//	           RetryStrategy LinearBackoff(--backoff)), then Lock.Release.
//
// The tool starts neither server: bench/peers.sh starts a fresh standalone
// ticketingd per run, and uses the Redis already running.
//
// # The workloads
//
//	uncontended  every client acquires and releases a key of its own
//	contended    every client acquires and releases one shared key
//
// A cycle is an acquire then a release; latencies are measured as in
// ticketing-bench and etcd-bench (acquire, acquire+release, and, on the
// contended workload, hand-off: from the holder's release call to the
// next holder's acquire return). Keys are peers-bench:RUN:N (RUN random per
// run), on both targets.
//
// Contended, the two libraries wait differently. ticketingd queues the
// waiters (the ACQUIRE carries its wait) and grants the lock to the next
// one when the holder releases: one hand-off costs one round trip (the
// release goes out, the next holder's grant comes back). Redis has no wait
// queue: redislock polls, each waiter trying SET NX again every --backoff
// (1 ms by default) until it gets the key or its context ends. So its
// hand-off is the release plus the time until some waiter's next try,
// and each waiter sends up to a thousand tries a second meanwhile.
//
// # The round-trip bound
//
// Before the workload the tool measures the idle round trip of a no-op
// through the same client stack, --pings times: for redislock, go-redis's
// Client.Ping (as Obtain, a command on a pooled connection from the
// calling goroutine); for the broker, which exposes no ping, a PING of
// the protocol on a session of its own, written by a writer goroutine and
// read by a reader goroutine as the broker's sessions do (ticketing-bench's
// pingRTT measures the same way). On the contended workload at most one
// hand-off per round trip is possible, so the tool reports
// bound_cycles_per_sec = 1 / round-trip p50 and of_bound = cycles_per_sec /
// bound_cycles_per_sec. During the run it also sends one PING per
// millisecond the same way (ping_rtt_under_load, as ticketing-bench's), and
// reports loaded_bound_cycles_per_sec and of_loaded_bound against that
// round trip's p50: the one a hand-off meets, steadier than the idle one
// on a machine whose wake-ups from idle vary (a VM).
//
// Errors: any acquire or release error ends the run with exit 1 (a
// contended acquire that waits --wait, 10 s, without the lock too), except
// redislock.ErrNotObtained, which is counted (not_obtained) and the client
// goes on; with the linear backoff it cannot happen before --wait ends.
//
// Example:
//
//	peers-bench --target broker --addr 127.0.0.1:5225 --mode uncontended --clients 64 --duration 8s
//	peers-bench --target redislock --mode contended --clients 16 --json
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}
