package server

import (
	"testing"
	"time"
)

// newTestProposer returns a leader's proposer alone (no Raft): entries are
// taken from it with nextEntryLocked and handed back with entryApplied.
func newTestProposer() *cluster {
	cl := &cluster{s: &Server{epoch: time.Now()}, pending: make(map[uint64]*proposal), pwake: make(chan struct{}, 1)}
	cl.resetProposerLocked(1)
	return cl
}

// testQueue queues n commands for session by, of keys of their own.
func (cl *cluster) testQueue(by uint64, key string, n int) {
	for i := range n {
		p := &proposal{key: key + string(rune('a'+i))}
		cl.proposeLocked(p, by, func(b []byte, _ uint64) []byte { return append(b, byte(by)) })
	}
}

// testContend makes the sessions heavy held back at their bound (their
// readers wait in admitLocked) and a session seen sending a request at a
// time.
func (cl *cluster) testContend(heavy ...uint64) {
	now := cl.s.now()
	for _, id := range heavy {
		h := cl.queueFor(id)
		h.waiting.Store(true)
		h.heldAt.Store(now)
		cl.nwaiting.Add(1)
	}
	cl.heldAt.Store(now)
	cl.lightAt = now
}

// TestClusterProposerContendedExpressOnlyForLight: while the log is
// contended, a held-back session whose commands are not in an entry in
// flight does not get the express entry (it took it after nearly every
// apply, so the light session's request waited behind it); the light
// session's request does, at once, alone.
func TestClusterProposerContendedExpressOnlyForLight(t *testing.T) {
	cl := newTestProposer()
	cl.testContend(1, 3)
	cl.testQueue(1, "h", 40)
	cl.pmu.Lock()
	if !cl.contendedLocked(cl.s.now()) {
		t.Fatal("not contended")
	}
	if e, _ := cl.nextEntryLocked(); e == nil || cl.pinflight != 1 {
		t.Fatalf("first entry %d bytes, %d in flight: want one", len(e), cl.pinflight)
	}
	cl.pmu.Unlock()
	// Another held-back session's commands, none in an entry in flight.
	cl.testQueue(3, "g", 40)
	cl.pmu.Lock()
	if e, _ := cl.nextEntryLocked(); e != nil {
		t.Fatalf("a held-back session got an express entry (%d bytes) while the log is contended", len(e))
	}
	cl.pmu.Unlock()
	cl.testQueue(2, "l", 1)
	cl.pmu.Lock()
	defer cl.pmu.Unlock()
	e, _ := cl.nextEntryLocked()
	if e == nil {
		t.Fatal("the light session's request got no express entry")
	}
	if body := e[len(entryHeader(1, 1)):]; string(body) != "\x02" {
		t.Fatalf("the express entry holds %q, want the light session's command alone", body)
	}
}

// TestClusterProposerContendedPacing: while the log is contended, the
// next entry of the held-back session is proposed only about as long after
// its last one applied as that one took, leaving the log idle for a light
// session's request; without contention it goes at once.
func TestClusterProposerContendedPacing(t *testing.T) {
	for _, contended := range []bool{true, false} {
		cl := newTestProposer()
		if contended {
			cl.testContend(1)
		}
		cl.testQueue(1, "h", 200)
		cl.pmu.Lock()
		if e, _ := cl.nextEntryLocked(); e == nil {
			t.Fatal("no first entry")
		}
		cl.pmu.Unlock()
		time.Sleep(20 * time.Millisecond) // the entry takes 20 ms to apply
		cl.entryApplied()
		cl.pmu.Lock()
		e, wait := cl.nextEntryLocked()
		cl.pmu.Unlock()
		switch {
		case contended && e != nil:
			t.Errorf("contended: the next entry of the held-back session was proposed at once after the last one applied")
		case contended && (wait < 10*time.Millisecond || wait > time.Duration(contendedWindow)):
			t.Errorf("contended: the next entry is paced by %v, want about as long as the last took (20 ms or more), at most %v", wait, time.Duration(contendedWindow))
		case !contended && e == nil:
			t.Errorf("not contended: the next entry was not proposed at once (wait %v)", wait)
		}
	}
}
