package server

import (
	"sync"
	"time"

	"github.com/ticketing-dev/ticketing/internal/raft"
)

// What the leader's Raft transport saw of each peer: hashicorp/raft
// (v1.8.0) keeps the leader's per-follower state (match index, last
// contact) private and Stats() reports none of it, so the transport
// wrapper (gatedTransport) records each peer's replies to the leader's
// AppendEntries RPCs (heartbeats, which run every HeartbeatTimeout/10 or
// so, and the appends that are not pipelined). Each reply carries the
// follower's last log index (AppendEntriesResponse.LastLog): that is what
// ClusterMember.LogIndex shows. It equals the follower's match index once
// the follower's log agrees with the leader's (after the leader's first
// successful append of its term); it is the follower's own word, not the
// leader's match index, and the replies to pipelined appends are not
// seen (a wrapped pipeline would need a goroutine per pipeline): under
// writes it can be one heartbeat interval behind.

// peerContact is what the leader saw of one peer.
type peerContact struct {
	ok       time.Time // the last reply
	logIndex uint64    // its LastLog
	fail     time.Time // the last failed RPC
	err      string    // its error
}

// contacts records the replies of the peers, by server ID.
type contacts struct {
	mu    sync.Mutex
	peers map[raft.ServerID]*peerContact
}

// record notes the outcome of an AppendEntries RPC to id.
func (c *contacts) record(id raft.ServerID, resp *raft.AppendEntriesResponse, err error) {
	now := time.Now()
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.peers == nil {
		c.peers = make(map[raft.ServerID]*peerContact)
	}
	p := c.peers[id]
	if p == nil {
		p = &peerContact{}
		c.peers[id] = p
	}
	if err != nil {
		p.fail, p.err = now, err.Error()
		return
	}
	p.ok, p.logIndex = now, resp.LastLog
}

// get returns what was seen of id.
func (c *contacts) get(id raft.ServerID) (peerContact, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	p := c.peers[id]
	if p == nil {
		return peerContact{}, false
	}
	return *p, true
}

// AppendEntries sends an AppendEntries RPC and records the peer's reply
// (or the failure) for ClusterStatus. The identity probes (term 0) are not
// Raft's and are not recorded.
func (t *gatedTransport) AppendEntries(id raft.ServerID, target raft.ServerAddress, args *raft.AppendEntriesRequest, resp *raft.AppendEntriesResponse) error {
	err := t.Transport.AppendEntries(id, target, args, resp)
	if args.Term != 0 {
		t.cl.contacts.record(id, resp, err)
	}
	return err
}

// memberContact fills in the leader's view of member m: reachable, last
// contact, log index and lag. reachWithin is how recent a reply must be
// (the heartbeat timeout: a follower that hears nothing for that long
// starts an election), lastIndex the leader's last log index.
func (c *contacts) memberContact(m *ClusterMember, reachWithin time.Duration, lastIndex uint64, now time.Time) {
	p, ok := c.get(raft.ServerID(m.ID))
	reachable := ok && !p.ok.IsZero() && !p.fail.After(p.ok) && now.Sub(p.ok) < reachWithin
	m.Reachable = &reachable
	if !ok {
		return
	}
	if !p.ok.IsZero() {
		ms := now.Sub(p.ok).Milliseconds()
		m.SinceContactMS = &ms
		li := p.logIndex
		m.LogIndex = &li
		var lag uint64
		if lastIndex > li {
			lag = lastIndex - li
		}
		m.Lag = &lag
	}
	if p.fail.After(p.ok) {
		m.LastError = p.err
	}
}
