package lockcore

import (
	"container/heap"

	"github.com/ticketing-dev/ticketing/internal/wire"
)

// The Core's record of a key, its queue, and the orders it keeps them in.

// entry is the Core's view of one key: the holding as it will be once
// every command in flight applies (held, owner, lease_s, owned-only; token
// 0 while the command that made it held is in flight), its waiters, and
// its place in the lease lists. A free entry is kept idleTTL for reuse, so
// that acquiring the same key again allocates nothing.
//
// It is kept to 96 bytes (a size class; TestEntrySize): a standalone
// server holds millions. What only a replicated core needs (the session charged, the
// commands in flight) is in x, made when first needed.
type entry struct {
	key       string
	owner     Owner
	token     uint64
	end       int64 // held, token known: the lease end; free: when the entry may be forgotten
	prev, nx  *entry
	q         *queue // waiters (and the entry's place in Core.keys)
	x         *entryExt
	client    *Client // the holder's session (Acquire.Client; nil: restored, or none)
	list      uint16
	linked    bool
	held      bool
	lease     uint8
	ownedOnly bool
}

// entryExt is the part of an entry that a core whose commands are in
// flight, or charged to sessions, needs.
type entryExt struct {
	by      uint64    // Acquire.By of the ACQUIRE that made the holding (0: restored, or none)
	pend    *Proposal // the command in flight whose apply gives the holding its token
	freeing *Proposal // the Free in flight of the holding before (its token: freeing.tok)
}

func (e *entry) ext() *entryExt {
	if e.x == nil {
		e.x = new(entryExt)
	}
	return e.x
}

func (e *entry) by() uint64 {
	if e.x == nil {
		return 0
	}
	return e.x.by
}

// setBy records the session charged for the holding (no entryExt for 0).
func (e *entry) setBy(by uint64) {
	if by != 0 || e.x != nil {
		e.ext().by = by
	}
}

func (e *entry) pending() *Proposal {
	if e.x == nil {
		return nil
	}
	return e.x.pend
}

// freeingOf is e's Free in flight, if any (e may be nil).
func (e *entry) freeingOf() *Proposal {
	if e == nil || e.x == nil {
		return nil
	}
	return e.x.freeing
}

// inFlight reports whether a command of e is in flight.
func (e *entry) inFlight() bool { return e.x != nil && (e.x.pend != nil || e.x.freeing != nil) }

// Lease lists: the entries of each lease_s, appended when their lease
// starts, so each list is sorted by lease end and a sweep looks only at
// heads. List 0 holds free entries (sorted by when they may be forgotten),
// restoredList the holdings restored by Promote (inserted sorted).
const (
	idleList     = 0
	restoredList = wire.MaxLeaseS + 1
	numLists     = restoredList + 1
)

type expList struct{ head, tail *entry }

func (c *Core) link(e *entry, list uint16) {
	l := &c.lists[list]
	e.list, e.linked, e.nx = list, true, nil
	e.prev = l.tail
	if l.tail != nil {
		l.tail.nx = e
	} else {
		l.head = e
		c.nonempty[list>>6] |= 1 << (list & 63)
	}
	l.tail = e
}

func (c *Core) unlink(e *entry) {
	if !e.linked {
		return
	}
	l := &c.lists[e.list]
	if e.prev != nil {
		e.prev.nx = e.nx
	} else {
		l.head = e.nx
	}
	if e.nx != nil {
		e.nx.prev = e.prev
	} else {
		l.tail = e.prev
	}
	if l.head == nil {
		c.nonempty[e.list>>6] &^= 1 << (e.list & 63)
	}
	e.prev, e.nx, e.linked = nil, nil, false
}

// Waiter is an ACQUIRE waiting in a key's queue (or, retrying, for the
// grant in flight of its own holding). The driver keeps it under its
// req_id, to Cancel or Drop it.
type Waiter struct {
	g          grantee
	e          *entry
	prev, next *Waiter
	hidx       int32 // 1-based position in Core.waits (0: none)
	done       bool  // answered, dropped, or in a proposed grant
	proposed   bool  // its grant is in flight (or it is the holder's retry awaiting it): CANCEL leaves it alone
	tok        bool  // a token waiter (Config.TokenWait): in Core.tokenq, not in a key's queue
	err        error // a token waiter: why there was no token
}

// ReqID is the waiting ACQUIRE's req_id.
func (w *Waiter) ReqID() uint32 { return w.g.reqID }

// Session is the waiting ACQUIRE's session.
func (w *Waiter) Session() Session { return w.g.s }

type queue struct {
	head, tail *Waiter
	n          int
	byOwner    map[Owner]*Waiter
	hidx       int32 // the entry's 1-based position in Core.keys (held with a known lease end); 0: not in it
}

func (q *queue) push(w *Waiter) {
	w.prev, w.next = q.tail, nil
	if q.tail != nil {
		q.tail.next = w
	} else {
		q.head = w
	}
	q.tail = w
	q.n++
	q.byOwner[w.g.owner] = w
}

func (q *queue) remove(w *Waiter) {
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
	if q.byOwner[w.g.owner] == w {
		delete(q.byOwner, w.g.owner)
	}
}

// replace puts nw in old's place.
func (q *queue) replace(old, nw *Waiter) {
	nw.prev, nw.next = old.prev, old.next
	if old.prev != nil {
		old.prev.next = nw
	} else {
		q.head = nw
	}
	if old.next != nil {
		old.next.prev = nw
	} else {
		q.tail = nw
	}
	old.prev, old.next = nil, nil
	q.byOwner[nw.g.owner] = nw
}

// waitHeap orders the queued waiters by deadline; keyHeap the held keys
// with waiters by lease end: the instants Next reports.
type waitHeap []*Waiter

func (h waitHeap) Len() int           { return len(h) }
func (h waitHeap) Less(i, j int) bool { return h[i].g.deadline < h[j].g.deadline }
func (h waitHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].hidx, h[j].hidx = int32(i+1), int32(j+1)
}
func (h *waitHeap) Push(x any) { w := x.(*Waiter); *h = append(*h, w); w.hidx = int32(len(*h)) }
func (h *waitHeap) Pop() any {
	old := *h
	w := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	w.hidx = 0
	return w
}

type keyHeap []*entry

func (h keyHeap) Len() int           { return len(h) }
func (h keyHeap) Less(i, j int) bool { return h[i].end < h[j].end }
func (h keyHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].q.hidx, h[j].q.hidx = int32(i+1), int32(j+1)
}
func (h *keyHeap) Push(x any) { e := x.(*entry); *h = append(*h, e); e.q.hidx = int32(len(*h)) }
func (h *keyHeap) Pop() any {
	old := *h
	e := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	e.q.hidx = 0
	return e
}

// watchKey puts e, held with a known lease end and with waiters, in the
// key heap (or moves it there).
func (c *Core) watchKey(e *entry) {
	if e.q.hidx != 0 {
		heap.Fix(&c.keys, int(e.q.hidx)-1)
		return
	}
	heap.Push(&c.keys, e)
}

func (c *Core) unwatchKey(e *entry) {
	if e.q != nil && e.q.hidx != 0 {
		heap.Remove(&c.keys, int(e.q.hidx)-1)
	}
}

func (c *Core) unwatchWaiter(w *Waiter) {
	if w.hidx != 0 {
		heap.Remove(&c.waits, int(w.hidx)-1)
	}
}
