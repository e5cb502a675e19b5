// Package harness is the toolkit of the integration tests: it builds the
// real binaries, runs ticketingd as a subprocess that can be killed,
// paused and restarted on the same port and data directory, records a
// history of operations, and checks it.
//
// It is an ordinary (non-test) package so that every integration test file
// and worker binary can use it; it assumes nothing of the test framework
// beyond testing.TB.
//
// # Binaries
//
// Binary(tb, pkg) builds a package once per test process (go build, in the
// module root) and caches the path; Ticketingd(tb) is the server. Call
// RemoveBinaries from TestMain after m.Run. BuildPackage and BuildBinaries
// build into a directory of your choice.
//
// # Processes
//
// StartServer runs "ticketingd serve --listen L --data-dir D --log-format
// json [Args...]" on a FreePort and a temporary data directory (unless
// given), waits for its "listening" line, and registers a Cleanup that
// kills it and, if the test failed, logs the stderr of every generation.
// Server.Kill9 (SIGKILL and wait), Stop (SIGTERM and wait), Pause/Resume
// (SIGSTOP/SIGCONT) and Restart (same address and data directory,
// retrying while the port is still in use) inject faults.
//
// StartProcess runs any binary (a worker) with its stdout and stderr
// captured; Process.ReadJSON reads its stdout reports line by line;
// Stop/Cont/Kill9 signal it.
//
// # Clusters
//
// StartCluster runs a Raft cluster of ticketingd --cluster nodes on
// 127.0.0.1, bootstrapped with --peers, optionally with mutual peer TLS
// (certificates from internal/pki). Every node's Raft address in the
// configuration (--raft-advertise) is a faultproxy in front of its
// --raft-listen, so Cluster.Cut(a, b), Isolate(i) and Heal blackhole and
// restore chosen links; the proxy tells who dialled a connection from the
// owner of its source socket (Linux /proc). WaitLeader and WaitConverged
// read the nodes' admin /status; ClusterNode.Restart, Pause (returns once
// the process is stopped) and the Server methods inject faults. Hello and
// WaitHint send a raw HELLO (a follower answers M with the leader's client
// address).
//
// # Pairs
//
// StartPair runs a hot-standby pair (ticketingd serve --pair primary and
// --pair backup) on 127.0.0.1, optionally with mutual peer TLS; each
// node's --peer is a faultproxy in front of the other's --peer-listen, so
// Pair.Cut blackholes the peer link both ways and Heal restores it,
// leaving the client addresses alone. PairNode.Status reads the node's
// /status pair object; WaitSettled (an active replicating to a passive in
// sync) and PairNode.WaitStatus wait on it. None of them sends a HELLO: a
// HELLO to a passive node is a client request of its state machine and
// makes it active if its peer has been silent for two heartbeats. The
// nodes restart with Server.Restart. OpenSession keeps a raw session open
// to see what a node sends it unasked (the M of a node that steps down).
//
// # History and checkers
//
// A History records operations (process, kind, key, invoke and complete
// times on a monotonic clock, outcome, token) from any goroutine; Acquire
// and Release record broker calls (with the ticket's deadline); Event
// records faults; Record adds an op whose times the caller set, for
// operations timed elsewhere (a worker subprocess's reports, placed on the
// time line with FromWall). On failure,
// WriteArtifact writes it as JSON lines under $TICKETING_TEST_ARTIFACTS
// (default os.TempDir()/ticketing-artifacts/<test name>).
//
// The checkers return an error listing the violations:
//
//   - CheckTokensUnique: no token granted twice;
//   - CheckNoTicketAfterIndeterminate: a failed acquire carries no ticket,
//     and no release or fenced write uses a token its process was not
//     granted;
//   - CheckTokensIncreaseAcross: grants after a barrier (a restart) are
//     above every grant before another (the kill);
//   - CheckOutcomes with Within: only the allowed outcomes in a window
//     (during an outage, say);
//   - CheckFencedIncreasing: committed fenced writes of a resource carry
//     increasing tokens;
//   - CheckTokensFollowRealTime: a grant that completed before another was
//     invoked has the smaller token;
//   - CheckLeaseExclusion: per key, no grant completed before the previous
//     holder's conservative deadline or release, whichever came first;
//   - CheckReleasedIntervals: per key, the [grant, release] intervals of
//     tickets whose release was confirmed do not overlap, in token order.
//
// Violations lets checkers elsewhere (package checker, the chaos test's
// write log) report alike.
package harness
