// Command ticketingd is the Ticketing lock server.
//
// Subcommands:
//
//	ticketingd serve   run the server (flags or --config FILE)
//	ticketingd init    write a ready deployment: config, client token, TLS CA and certificate
//	                   (with --cluster: a bundle for every node of a Raft cluster;
//	                   with --pair: for the two nodes of a hot-standby pair)
//	ticketingd cluster show or change a cluster's membership through a node's admin listener
//	ticketingd console serve the web console without a server (planning: the deployment page);
//	                   a server has it, live, on its admin listener
//	ticketingd version print the module version, VCS revision and Go version (also --version)
//
// Exit status: 0 on success, 2 for a usage error (bad flag, bad config file
// content), 1 for a runtime error (cannot listen, corrupt data directory,
// unreadable file). See docs/operations.md.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	// After the first signal, restore the default handling so that a second
	// SIGINT/SIGTERM kills a server whose graceful shutdown is stuck.
	context.AfterFunc(ctx, stop)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}
