// Package integration holds the end-to-end and fault-injection tests of
// Ticketing: real ticketingd processes (built from cmd/ticketingd), the
// real broker, and real databases through the fence adapters. It has no
// code of its own; the helpers are in package harness.
//
// # Running
//
//	TICKETING_TEST_POSTGRES_DSN='postgres://postgres@127.0.0.1:5432/test?sslmode=disable' \
//	TICKETING_TEST_MYSQL_DSN='root@tcp(127.0.0.1:3306)/test' \
//	go test -race -count=1 ./integration/...
//
// Without a DSN the tests that need that database skip (they fail when
// CI=true; see internal/testdb). A failing test writes its operation
// history as JSON lines under $TICKETING_TEST_ARTIFACTS (default
// os.TempDir()/ticketing-artifacts/<test name>) and logs the stderr of its
// servers and workers.
//
// # Scenarios
//
//   - TestPauseStory_InProcess, TestPauseStory_SIGSTOP: a holder pauses
//     past its lease, another acquires and writes, and the first one's
//     late write is refused by the fence (stale token), or, when it paused
//     inside its transaction, by the lease check before commit.
//   - TestServerKill9UnderLoad: ticketingd is killed with SIGKILL under load
//     and restarted on the same port and data directory; the broker
//     reconnects by itself and tokens keep increasing across restarts.
//   - TestAuthAndTLS: a deployment written by 'ticketingd init --tls', and
//     every TLS mode and token case of the broker against it.
//   - TestChaosFencedCounter: four counterworker processes do fenced
//     read-modify-write increments for 30 s (CI) while a nemesis SIGSTOPs
//     lock holders past their lease and kill -9s and restarts the server;
//     the counter must equal the write log, tokens must increase in commit
//     order, and at least one stale rejection and one kill must happen. A
//     control run without the fence must detect lost updates.
//   - TestBrokerThroughFaultProxy: a broker talks to the server through
//     faultproxy (delay, mid-frame cuts, blackhole, reset); every outcome
//     must be one the semantics allow, no token is granted twice, and
//     confirmed holdings of a key never overlap.
//   - TestCluster*: a 3-node ticketingd --cluster (harness.StartCluster)
//     whose Raft links all go through fault proxies, one broker given the
//     three addresses, and a load of acquires and releases recorded in a
//     History; after each test the history passes CheckTokensUnique,
//     CheckNoTicketAfterIndeterminate, CheckTokensFollowRealTime,
//     CheckLeaseExclusion and CheckReleasedIntervals, and every key used is
//     acquirable again. TestClusterKill9Leader kills the leader 10 times
//     in a row (peer TLS; failover p50/max logged and written to
//     failover.json in its artifact directory); TestClusterSIGSTOPLeader
//     stops it past two leases (it steps down on SIGCONT);
//     TestClusterPartitions isolates the leader, then a follower;
//     TestClusterFullRestart stops all three (SIGTERM; SIGKILL) and restarts them
//     (held locks kept, tokens above); TestClusterCancelUnderContention
//     cancels queued ACQUIREs during hand-offs (no node may exit).
//     TestClusterKeepAliveAcrossFailover (refresh_test.go) holds one key
//     with Ticket.KeepAlive (lease 6 s) for 20 leases (120 s) through a
//     leader kill -9 while a second job tries it: never granted to the
//     second job, one token, the keep-alive context never cancelled, a
//     fenced write at the end commits; the history carries the refreshed
//     deadline. TICKETING_LONGJOB_LEASE and TICKETING_LONGJOB_LEASES set
//     the lease and the count: 30s and 20 is the ten-minute job.
//     TestClusterKeepAliveStopped (refresh_kill_test.go) stops a
//     keep-alive without a release: the second job is granted the key only
//     after the first job's last (refreshed) conservative deadline, and the
//     first job's late fenced write is stale.
//     TestClusterRefreshSurvivesLeaderKill refreshes a 3 s lease once to
//     30 s and kills the leader: the new leader keeps the key from the
//     second job past where a restart from the acquire's lease would have
//     freed it, until the holder releases it.
//   - TestPairIdentityTwoPairs (identity_test.go): a broker given the
//     addresses of two pairs with cluster=pair-a in its URL uses only pair
//     A (pair B's nodes apply no token) and logs the refusal of pair B.
//   - TestPair*: a hot-standby pair (harness.StartPair: ticketingd serve
//     --pair primary|backup, the peer link through fault proxies, mutual
//     peer TLS) with the broker as its witness; the nodes' state is read
//     from /status, never by a HELLO to a passive node (a HELLO is a
//     client request: it may make a passive node whose peer is silent
//     active). TestPairKill9Active kills the active 10 times under load
//     (default 1 s heartbeat and 2 s PairSettle; held locks kept, the
//     killed node back passive and in sync, its client port closed to
//     the broker by a proxy until then, the load run's checkers;
//     failover p50/max/min logged and written to failover.json);
//     TestPairRestarts restarts the nodes in every order (a primary alone
//     serves only after its start guard, a backup alone never, both at
//     once keep tokens increasing, a primary restarted behind an active
//     backup never serves, resyncs and then stays passive naming it);
//     TestPairSplitBrainNewActiveDies freezes (SIGSTOP) the backup that
//     took over in a split brain before the link heals (the primary's
//     fenced writes to what the backup wrote are then stale), kills and
//     restarts it, and checks that the primary's next grant is above every
//     token the backup issued and its fenced write commits;
//     TestPairSplitBrain cuts the link
//     while a broker reaches each node, so that both serve, and checks
//     through the fence (SQLite) that the primary's writes after the
//     backup's are stale, with no lost update, then heals it (the lower
//     epoch steps down with M and resyncs); TestPairCutLinkNoTakeover cuts
//     the link with one broker on the active: the backup never takes over.
//   - TestContainers_*: the fence's commit-order load and the migrations on
//     PostgreSQL and MariaDB started by testcontainers-go from the images
//     named by TICKETING_TEST_POSTGRES_IMAGE / TICKETING_TEST_MYSQL_IMAGE
//     (built offline by integration/images; see its README).
package integration
