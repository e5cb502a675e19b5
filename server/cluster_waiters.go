package server

import "github.com/ticketing-dev/ticketing/internal/wire"

// The Raft leader's waiter and queue types. The standalone scheduler runs
// on lockcore; the leader's scheduler (cluster.go) still has these of its
// own until it is moved onto the same core.

// waiter is an ACQUIRE waiting in a key's queue on the leader, or one
// whose grant is proposed.
type waiter struct {
	c          *conn
	reqID      uint32
	owner      [wire.OwnerLen]byte
	lease      uint8
	arrived    int64
	deadline   int64 // arrived + wait_s: past it the waiter gets T, never G
	prev, next *waiter
	timer      timer // wait_s deadline
	done       bool  // granted, timed out or dropped (under cluster.mu)
	ownedOnly  bool
	ck         *ckey
	proposed   bool // its grant is proposed (being committed: a CANCEL leaves it alone)
}

type waitQueue struct {
	head, tail *waiter
	n          int
	byOwner    map[[wire.OwnerLen]byte]*waiter
}

func (q *waitQueue) push(w *waiter) {
	w.prev, w.next = q.tail, nil
	if q.tail != nil {
		q.tail.next = w
	} else {
		q.head = w
	}
	q.tail = w
	q.n++
	q.byOwner[w.owner] = w
}

func (q *waitQueue) remove(w *waiter) {
	if w.prev != nil {
		w.prev.next = w.next
	} else {
		q.head = w.next
	}
	if w.next != nil {
		w.next.prev = w.prev
	} else {
		q.tail = w.prev
	}
	w.prev, w.next = nil, nil
	q.n--
	if q.byOwner[w.owner] == w {
		delete(q.byOwner, w.owner)
	}
}

// enqueue queues w at the end of q or, when old (the same owner's earlier
// ACQUIRE of the key) is waiting, in old's place; old is answered T.
func (s *Server) enqueue(q *waitQueue, w, old *waiter) {
	if old == nil {
		q.push(w)
		return
	}
	w.prev, w.next = old.prev, old.next
	if old.prev != nil {
		old.prev.next = w
	} else {
		q.head = w
	}
	if old.next != nil {
		old.next.prev = w
	} else {
		q.tail = w
	}
	old.prev, old.next = nil, nil
	q.byOwner[w.owner] = w
	old.done = true
	old.timer.Stop()
	s.m.timeouts.Add(1)
	old.c.replySimpleQueued(wire.TypeTimedOut, old.reqID)
}
