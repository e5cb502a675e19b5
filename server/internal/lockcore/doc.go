// Package lockcore is the lock table's one set of rules: the only place
// where a lock decision is made, in every mode the server runs in.
//
// It has two halves.
//
// The Machine is the replicated state: the holdings (key -> owner, token,
// lease_s, owned-only flag) and the highest token applied. It is
// deterministic: the same commands in the same order give the same state on
// every node. The rules it applies (rules.go: is the key free, may this
// RELEASE free it, may this expiry) are the rules the scheduler projects.
//
// The Core is the scheduler in front of it: FIFO waiters, wait deadlines,
// lease ends, capacity, owned release, cancel, and the lease restart of a
// takeover (Promote; etcd's lessor.Promote(extend) and Demote are the
// model). A Core reads no clock, starts no goroutine, does no I/O and has
// no lock of its own: every event comes in with the caller's now
// (nanoseconds on a monotonic clock), under whatever serialises that core
// (a shard mutex standalone, the leader's scheduler lock in a cluster), and
// its effects go out, the way go.etcd.io/raft's RawNode hands out Ready:
//
//   - replies to sessions (Effects, read after each event);
//   - commands for a Proposer (the replication seam): a Grant when a free
//     key is acquired, a Free when a holding ends (a release, or an
//     expiry, with the grant to the next waiter in the same command). An
//     event only records them; reading its Effects hands them to the
//     Proposer, in order, once the event has ended, so that no event calls
//     into a log (which may read a clock or write to a network link);
//   - the next instant something is due (Next, NextExpiry), at which the
//     driver calls Tick.
//
// Besides the sessions' requests and Tick, an operator's Expire (expire
// now: a lease end with the exact token, as its running out would be) is
// an event of the Core; Core.Scan and Core.Lock (and Machine.Scan and
// Machine.Lock, without lease ends, queues or sessions) are a read-only
// view for the lock browser (view.go), whose holder identity is the
// Client the driver gives with each ACQUIRE. Scan seeks in an ordered
// index of the keys (a B-tree the Core changes when it makes or forgets
// an entry, the Machine when a key becomes held or free) and visits at
// most a given number of keys, so that a driver can page through a large
// table in bounded chunks.
//
// A command changes the projection at once (the key is held, or free, as
// it will be once the command applies) and its outcome comes back through
// Applied. A Proposer that applies at once (standalone: the token store
// gives the token) returns the outcome from Propose, so nothing is ever in
// flight; one that replicates (Raft) returns it later, in log order, and
// the Core keeps what a client must not see before the commit: a grant's
// token is unknown until its command applies, a RELEASE is answered R only
// once its Free applies (unless Config.EarlyRelease), and a RELEASE that
// finds the lease ended is answered N only once the expiry applies, so a
// deposed leader never says N for a lock its successor still holds.
package lockcore
