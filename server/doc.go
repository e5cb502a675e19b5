// Package server is the Ticketing lock service as a library: a server
// speaking protocol versions 1, 2 and 3 over TCP or TLS, standalone, as a
// node of a Raft cluster (Config.Cluster) or as one node of a hot-standby
// pair (Config.Pair). ticketingd serve is this package with a
// configuration file, flags and an admin listener around it.
//
// # Embedding
//
//	srv, err := server.New(server.Config{DataDir: "/var/lib/ticketing"})
//	if err != nil {
//		return err
//	}
//	go srv.ListenAndServe(":5225") // returns ErrServerClosed after Shutdown
//	...
//	err = srv.Shutdown(ctx)
//
// New validates the Config (every zero field means its documented default),
// opens the token store in DataDir and starts the background sweeper; it
// does not listen. Serve (any number of listeners), Shutdown, Close, Addr
// and Stats are safe for concurrent use. Close or Shutdown must be called
// to release the data directory and the background goroutines, even if
// Serve never ran. Shutdown sends E(5) to every connection and waits for
// them to close (or for ctx); Close closes them at once.
//
// Config.TLS (a *tls.Config) serves TLS; Config.ClientTokens makes HELLO
// require one of them; Config.Logger receives slog records (never a
// token); Config.Registerer receives the Prometheus collectors. The admin
// HTTP handler (health, status, metrics, cluster membership, the lock
// browser and the console) is package server/admin: mount
// admin.New(srv, admin.Options{...}) on an http.Server of your own.
// Package servertest starts an in-process server for tests.
//
// # What it guarantees
//
// Every grant carries a fencing token above every token issued before it,
// across all keys, restarts (kill -9 included) and, in a cluster or a
// pair, failovers. Tokens are reserved durably ahead of use, so a restart
// continues above every token ever issued; a corrupt or unwritable data
// directory, or a used one whose ceiling is gone, stops New with an error,
// never a restart from scratch. Held locks
// survive a failover in a cluster, and in a pair for the grants its
// passive acknowledged; a standalone node's held locks end with its
// process.
//
// # Where the behaviour is documented
//
// The repository's docs/ pages are the reference, and they are the same
// text for the library and for ticketingd:
//
//	docs/protocol.md    the wire protocol, every frame and session rule
//	docs/server.md      this package in detail: sessions, locks, versions,
//	                      roles, Raft and pair modes, tokens, limits,
//	                      the lock browser, shutdown
//	docs/operations.md  every setting, the metrics, the admin endpoints,
//	                      clusters, pairs, crashes, upgrades
//	docs/ha.md          what each mode keeps when a node fails
//
// # The code: the lock core, the lock path, the modes, the sessions
//
// The code is in four rooms, and a file's name says which it is in:
//
//	internal/lockcore/   the lock core: every lock rule, once (no clock, no I/O)
//	lockpath.go          the lock path, once for every mode: a request goes
//	                       into one core event; its replies go out as
//	                       effects and its commands to the mode's log
//	log_standalone*.go   the modes, each a log behind the seam
//	log_cluster*.go        lockcore.Proposer and a few answers to the lock
//	log_pair*.go           path (lockLog): standalone (the token store), the
//	                       Raft cluster, the hot-standby pair; replicated.go
//	                       holds what the two replicated ones share
//	session*.go          the sessions: frames in, frames out
//
// Every lock decision is made once, in internal/lockcore: a deterministic
// Machine (the replicated holdings and the highest token) and a Core in
// front of it (waiters, deadlines, capacity) that reads no clock and does
// no I/O. Each replication log implements lockcore.Proposer: standalone
// applies at once with tokens from the durable store, the cluster commits
// through Raft before answering, the pair applies on the active node and
// answers once the passive has acknowledged. docs/server.md, "The code",
// has the longer map.
package server
