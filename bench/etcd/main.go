// Command etcd-bench is ticketing-bench's peer benchmark against etcd v3:
// the same workloads, run with concurrency.Mutex against an etcd cluster,
// reported in the same format, so that the two tools' figures can be set
// side by side (bench/compare.sh does).
//
// It lives in a module of its own so that etcd stays out of the library's
// go.mod.
//
// # The cluster
//
// By default the tool starts an etcd cluster of --members members (1 or 3)
// on loopback ports, each member a subprocess of the tool itself (go.etcd.io/
// etcd/server/v3/embed, v3.7.3) with its data in a temporary directory and
// fsync on (embed's default; the tool refuses to run without it). Members
// are separate processes, as the ticketingd nodes they are compared with
// are: one process holding three members and the client would share one Go
// scheduler and garbage collector between them, which a real deployment
// does not. With --endpoints the tool uses a running cluster instead
// (--tls-ca FILE: over TLS, verified against the CA certificates in FILE).
//
// With --tls the started members speak mutual TLS to each other (peer
// client certificates required) and serve clients over TLS only: the tool
// makes a CA and one node certificate for 127.0.0.1 (internal/pki, as
// 'ticketingd init --cluster' does) in the temporary directory, and its
// clients verify the members against that CA, presenting no certificate.
// bench/compare.sh uses it with TLS=1, where ticketingd runs from an
// 'init' bundle.
//
// # The workloads
//
//	uncontended  every client locks and unlocks a key of its own
//	contended    every client locks and unlocks one shared key
//
// A cycle is Mutex.Lock then Mutex.Unlock; latencies are measured as in
// ticketing-bench (acquire = Lock, acquire+release = the cycle, hand-off =
// from the holder's Unlock call to the next holder's Lock return). Each
// client has its own concurrency.Session (lease TTL --lease, 30 s like
// ticketing-bench's lease_s), created before the run: a Mutex identifies
// its holder by its session's lease, so clients sharing a session would
// all hold a shared key at once. The sessions are spread over --conns
// clientv3 clients (gRPC connections), 2 by default, as ticketing-bench
// multiplexes its clients over 2 sessions. All requests go to the leader's
// client URL (as ticketing's broker sends everything to the serving node);
// --all-endpoints gives the clients every member's URL instead, and a
// follower then forwards the writes to the leader.
//
// Example:
//
//	etcd-bench --members 3 --mode uncontended --clients 64 --duration 10s
//	etcd-bench --members 3 --mode contended --clients 16 --json
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	if os.Getenv(memberEnv) != "" {
		os.Exit(runMember(os.Args[1:], os.Stdout, os.Stderr))
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}
