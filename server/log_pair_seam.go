package server

import (
	"encoding/binary"
	"fmt"

	"github.com/ticketing-dev/ticketing/server/internal/lockcore"
)

// The pair's replication log: how the active's commands become durable
// on the passive.
//
// The active applies every command of its core to its machine at once, in
// the order proposed (so the outcome, a token included, is decided there).
// While its passive is attached, the command also goes down the out link
// and the core gets its outcome (Core.Applied) only when the passive has
// acknowledged it: the answer to the client never runs ahead of the
// standby. While none is attached, the outcome is given at once
// (unreplicated, counted and logged). Attaching sends a snapshot of the
// machine first; detaching (the link lost, the peer silent or not
// acknowledging) hands every command in flight its outcome at once.

// pairLog is the pair's lockcore.Proposer.
type pairLog struct{ p *pair }

// Propose applies p's command to the machine (under sh.mu) and streams it
// to an attached passive.
func (l pairLog) Propose(lp *lockcore.Proposal) bool {
	p := l.p
	p.seq++
	p.buf = lp.AppendCommand(p.buf[:0], p.seq)
	res, err := applyCommand(p.m, p.buf)
	if err != nil {
		// Not reached: the command was just encoded.
		res = lockcore.Result{Freed: lp.IsFree(), Fatal: true, Err: err}
	}
	p.last.Store(p.m.Last())
	p.nheld.Store(int64(p.m.Len()))
	if res.Err != nil && lp.Grants() {
		if _, ok := p.failedLog.due(lp.At(), 1); ok {
			p.s.log.Error("pair: no token left in this node's epoch: grants of free keys are answered B until it serves again under a new epoch (a failover or a restart)", "ceiling", p.m.Ceiling())
		}
	}
	if o := p.attached; o != nil {
		seq := p.seq
		if !o.queue(frameCommand, p.buf, seq) {
			// The link is lost or its queue is full: its writer closes
			// it (no connection is touched here), which ends its reader,
			// whose linkDown detaches (outside this core event) and gives
			// this command its outcome after those before it.
			o.fail()
		}
		p.pending = append(p.pending, pairPending{seq: seq, at: lp.At(), lp: lp, res: res})
		return false
	}
	p.unreplicated.Add(1)
	lp.SetResult(res)
	return true
}

// applyCommand applies an encoded command (type, seq, body) to m.
func applyCommand(m *lockcore.Machine, cmd []byte) (lockcore.Result, error) {
	if len(cmd) == 0 {
		return lockcore.Result{}, fmt.Errorf("%w: empty command", errPairLink)
	}
	d := lockcore.NewDecoder(cmd[1:])
	d.Uvarint()
	return m.ApplyCommand(d, cmd[0])
}

// acked is the passive's acknowledgement of every stream frame up to seq
// on out link o.
func (p *pair) acked(o *outLink, seq uint64) {
	sh := &p.sh
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if p.attached != o || !p.sh.serving {
		return
	}
	n := 0
	for n < len(p.pending) && p.pending[n].seq <= seq {
		n++
	}
	if n == 0 {
		return
	}
	done := p.pending[:n]
	p.pending = p.pending[n:]
	now := p.s.shardNow(sh)
	for i := range done {
		if done[i].lp == nil {
			continue // an epoch move ('F'), not a command
		}
		p.s.applied(sh, now, done[i].lp, done[i].res)
		done[i].lp = nil
	}
}

// linkDown is the end of out link o.
func (p *pair) linkDown(o *outLink) {
	sh := &p.sh
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if p.attached == o {
		p.detachLocked("the peer link was lost")
	}
}

// detachLocked stops replicating (under sh.mu): every command in flight
// gets its outcome now, and the link is closed, so that the next attach
// starts with a snapshot.
func (p *pair) detachLocked(why string) {
	o := p.attached
	if o == nil {
		return
	}
	p.attached = nil
	p.replicating.Store(false)
	o.close()
	pend := p.pending
	p.pending = nil
	p.s.log.Warn("pair: serving unreplicated: "+why+"; commands are applied and answered by this node alone until the passive is attached again",
		"in_flight", len(pend))
	now := p.s.shardNow(&p.sh)
	for i := range pend {
		if pend[i].lp == nil {
			continue // an epoch move ('F'), not a command
		}
		p.unreplicated.Add(1)
		p.s.applied(&p.sh, now, pend[i].lp, pend[i].res)
	}
}

// maybeAttach starts replicating to the peer (under p.mu) if this node
// serves, its out link is up, and the peer's last heartbeat, within two
// intervals, says it is passive.
func (p *pair) maybeAttach(now int64) {
	o := p.out.Load()
	if o == nil || p.serving == 0 || p.peer.state != 4 /* bstar.Passive */ || now >= p.fsm.PeerExpiry {
		return
	}
	sh := &p.sh
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if !p.sh.serving || p.attached == o {
		return
	}
	if p.attached != nil {
		p.detachLocked("the peer link was replaced")
	}
	snap := p.m.Snapshot()
	seq, ceil := p.seq, p.m.Ceiling()
	if !o.queue(frameSnapshot, snap, seq, ceil) {
		return
	}
	p.attached = o
	p.replicating.Store(true)
	p.s.log.Info("pair: replicating to the passive: every command is answered after the passive has acknowledged it",
		"snapshot_bytes", len(snap), "held_locks", p.m.Len(), "seq", seq)
}

// inStream is the replication stream's state on one in link.
type inStream struct {
	snap bool // a snapshot came on this link
}

// applyStream applies a stream frame on the passive; it returns the seq
// to acknowledge (0: none).
func (p *pair) applyStream(st *inStream, typ byte, body []byte) (uint64, error) {
	if len(body) < 8 {
		return 0, fmt.Errorf("%w: short stream frame", errPairLink)
	}
	seq := binary.BigEndian.Uint64(body)
	sh := &p.sh
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if p.sh.serving {
		// Both serve (a split brain): the heartbeats decide who steps
		// down; this node takes no stream meanwhile, and acknowledges
		// nothing, so the peer detaches.
		return 0, nil
	}
	switch typ {
	case frameSnapshot:
		if len(body) < 16 {
			return 0, fmt.Errorf("%w: short snapshot", errPairLink)
		}
		m, err := lockcore.RestoreMachine(body[16:])
		if err != nil {
			return 0, err
		}
		m.SetCeiling(binary.BigEndian.Uint64(body[8:]))
		p.m = m
		p.seq = seq
		p.hasState = true
		st.snap = true
		p.s.log.Info("pair: caught up from the active's snapshot: this passive can take over", "held_locks", m.Len(), "last_token", m.Last(), "seq", seq)
	default:
		if !st.snap {
			return 0, fmt.Errorf("%w: a command before the snapshot", errPairLink)
		}
		if seq != p.seq+1 {
			return 0, fmt.Errorf("%w: command %d after %d", errPairLink, seq, p.seq)
		}
		if typ == frameFloor {
			// The active moved to a new epoch: the counter raised into
			// it, grants up to its end.
			if len(body) != 24 {
				return 0, fmt.Errorf("%w: malformed floor frame", errPairLink)
			}
			p.m.Raise(binary.BigEndian.Uint64(body[8:]))
			p.m.SetCeiling(binary.BigEndian.Uint64(body[16:]))
		} else if _, err := applyCommand(p.m, body[8:]); err != nil {
			return 0, err
		}
		p.seq = seq
	}
	p.last.Store(p.m.Last())
	p.ceil.Store(p.m.Ceiling())
	p.nheld.Store(int64(p.m.Len()))
	return seq, nil
}

// resyncLocked sets key's projection from the machine (under sh.mu).
// (Not reached: the active's machine applies each command as it is
// proposed, in the order the core proposed it.)
func (p *pair) resyncLocked(key string) {
	h, ok := p.m.Holding(key)
	p.s.resyncKey(&p.sh, "pair", key, h, ok)
}

func beUint64(b []byte) uint64 { return binary.BigEndian.Uint64(b) }
