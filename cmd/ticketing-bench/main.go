// Command ticketing-bench drives a Ticketing server over loopback and reports
// throughput and latency.
//
// Modes:
//
//	uncontended  every client acquires and releases its own key
//	contended    every client acquires and releases one shared key (FIFO queue);
//	             also reports the release -> grant hand-off latency
//	hold         acquire --locks locks (lease 250 s, wait 0) as fast as
//	             pipelining allows, then report the server's RSS per held lock
//
// Clients are multiplexed over --conns sessions with pipelining by req_id,
// as the real broker does (two sessions per address). With no --addr the
// tool starts an in-process server on a temporary data directory.
//
// Given the nodes of a cluster (--addr a,b,c, or --addr repeated), the tool
// finds the serving node: it dials the nodes in order, follows a NOT_ACTIVE
// (M) hint to the hinted node when that node is in the list, and uses the
// first node that answers HELLO_OK; while none serves (an election) it tries
// again for up to --find-wait. Every session goes to the serving node; a
// leader change during the run ends it with an error.
//
// With --tls-ca the sessions to --addr are TLS (the handshake within the
// dial's 5 s deadline, before HELLO), verified against that CA bundle and
// the host of each address (or --tls-server-name); --tls-cert and --tls-key
// give a client certificate, for a server that requires one
// (--tls-client-ca). A certificate that does not verify, or a TLS alert
// refusing the client, ends the search for the serving node at once, as a
// wrong token does.
//
// Examples:
//
//	ticketing-bench --mode uncontended --clients 64 --conns 2 --duration 10s
//	ticketing-bench --mode contended --clients 64
//	ticketing-bench --mode hold --locks 1000000
//	ticketing-bench --addr 127.0.0.1:5225 --token "$TOKEN" --mode hold --server-pid "$(pidof ticketingd)"
//	ticketing-bench --addr 127.0.0.1:5225,127.0.0.1:5226,127.0.0.1:5227 --mode contended --clients 16
//	ticketing-bench --addr 127.0.0.1:5225,127.0.0.1:5226,127.0.0.1:5227 --token "$(grep -v '^#' DIR/client-tokens)" --tls-ca DIR/ca.pem
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
