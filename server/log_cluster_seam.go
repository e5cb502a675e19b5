package server

import (
	"math"
	"time"

	"github.com/ticketing-dev/ticketing/server/internal/lockcore"
)

// The Raft mode's replication log, and the leader's lock core on it.
//
// A cluster node's mode (see lockpath.go) is the *cluster: while it leads,
// one lock core (cluster.sh) over all keys takes the sessions' requests.
// Its commands go through raftLog into the leader's proposer
// (log_cluster_proposer.go), which packs them into hashicorp/raft entries;
// every node applies the committed entries to a lockcore.Machine
// (log_cluster_fsm.go), and on the leader applied hands each outcome back to
// the core, which only then answers. At a takeover the core is promoted
// with the applied holdings, every lease restarted (log_cluster.go, takeOver);
// when the node loses its leadership it is demoted and the sessions close
// with M.

// proposal is a command of the lock core in flight on the leader: what
// the proposer counts it against (raftLog.Propose).
type proposal struct {
	lp  *lockcore.Proposal
	key string
	at  int64   // proposed (server clock)
	q   *pqueue // the queue (session) it counts against
}

// raftLog is the Raft mode's lockcore.Proposer: a command goes to the
// proposer's queue of the session it is charged to, into the next log
// entries; its outcome comes back when the entry applies (applied): a
// key's commands in the order proposed, different keys' perhaps not. It
// never applies at once.
type raftLog struct{ cl *cluster }

// Propose queues p's command (under sh.mu, as every core event).
func (l raftLog) Propose(p *lockcore.Proposal) bool {
	l.cl.proposeLocked(&proposal{lp: p, key: p.Key(), at: p.At()}, p.By(), p.AppendCommand)
	return false
}

// applied gives the lock core the outcomes of an applied entry's commands
// of the current stint (the FSM calls it after applying the entry, off its
// lock).
func (cl *cluster) applied(stint uint64, res []cmdResult) {
	s := cl.s
	sh := &cl.sh
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if !sh.serving || stint != cl.stint {
		return
	}
	now := s.shardNow(sh)
	first := int64(math.MaxInt64)
	cl.entryApplied()
	for _, r := range res {
		p := cl.pending[r.seq]
		if p == nil {
			continue
		}
		delete(cl.pending, r.seq)
		cl.appliedLocked(p)
		first = min(first, p.at)
		s.applied(sh, now, p.lp, r.res)
	}
	// The entry's earliest command: its wait is the entry's commit latency
	// (with the wait for its turn in the proposer).
	if first != math.MaxInt64 {
		cl.commitLatency.Observe(float64(now-first) / 1e9)
		cl.entryCommands.Observe(float64(len(res)))
	}
}

// proposalLimited counts an ACQUIRE answered B at MaxProposals, and logs
// at most once per second with the count since the last line.
func (cl *cluster) proposalLimited() {
	cl.s.m.busy.Add(1)
	if since, ok := cl.limitLog.due(cl.s.now(), cl.proposalLimit.Add(1)); ok {
		cl.s.log.Warn("cluster: max-proposals commands await their commit: ACQUIREs of free keys answered B; the log does not keep up with the clients (check ticketing_raft_commit_seconds and which sessions send the most), or raise max-proposals if the leader has the memory",
			"max_proposals", cl.cfg.MaxProposals, "count", since)
	}
}

// slowCommit counts a grant answered B because its commit took took (ns),
// more than ElectionTimeout, and logs at most once per second with the
// count since the last line.
func (cl *cluster) slowCommit(took int64) {
	cl.s.m.busy.Add(1)
	if since, ok := cl.slowLog.due(cl.s.now(), cl.slowGrants.Add(1)); ok {
		cl.s.log.Warn("cluster: a grant took longer than raft-election to commit: answered B (not granted) and freed again; check the disk and network latency of the nodes, or raise raft-election",
			"commit", time.Duration(took).Round(time.Millisecond), "raft_election", cl.cfg.ElectionTimeout, "count", since)
	}
}

// resync sets key's projection from the machine (after a command that did
// not apply as projected; not reached); under sh.mu.
func (cl *cluster) resync(key string) {
	h, ok := cl.fsm.holding(key)
	cl.s.resyncKey(&cl.sh, "cluster", key, h, ok)
}

// The lock path's questions (lockLog, lockpath.go): one table, the
// leader's scheduler, which serves while this node leads; elsewhere the
// lock browser reads the applied machine, and an operator's Expire is
// refused with the leader's address.

func (cl *cluster) shardOf([]byte) *shard { return &cl.sh }
func (cl *cluster) tables() int           { return 1 }
func (cl *cluster) table(int) *shard      { return &cl.sh }
func (cl *cluster) notServing() error     { return cl.notLeader() }

// admitRequest: a session waits for its turn while MaxSessionProposals
// of its commands await their apply (admitLocked); its commands are
// charged to its number.
func (cl *cluster) admitRequest(_ *shard, c *conn) (uint64, bool, bool) {
	waited, ok := cl.admitLocked(c)
	if !ok {
		return 0, waited, false
	}
	return cl.sessionID(c), waited, true
}

func (cl *cluster) readApplied(f func(m *lockcore.Machine)) string {
	cl.fsm.mu.Lock()
	defer cl.fsm.mu.Unlock()
	f(cl.fsm.sm)
	return ViewFollowerApplied
}

func (cl *cluster) counts() modeCounts {
	last := cl.fsm.last.Load()
	return modeCounts{last: last, ceiling: last, held: int(cl.fsm.nheld.Load())}
}

// close is shutdown, then the scheduler's timer stops.
func (cl *cluster) close() {
	cl.shutdown()
	cl.sh.stopTimer()
}
