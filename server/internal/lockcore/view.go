package lockcore

import (
	"slices"
	"strings"
)

// The lock browser's view of a core and of a machine: read-only, under
// whatever serialises the core (its driver's mutex) or the machine (its
// apply lock). Nothing here changes a holding; the one admin event that
// does, Expire, is in core.go.

// Client is a session's identity as the lock browser shows it: the client
// name from its HELLO and its remote address. A driver makes one per
// session and passes it with every ACQUIRE (Acquire.Client); the holdings
// and waiters it causes share it. It refers to nothing else of the
// session, so a holding that outlives its session keeps only these two
// strings alive.
type Client struct {
	Name string // the HELLO's client name (may be empty)
	Addr string // the remote address, host:port
}

// LockQuery selects held locks for a page: those whose key starts with
// Prefix and sorts after After (bytewise; "" from the first), at most
// Limit of them (Limit <= 0: none).
type LockQuery struct {
	Prefix string
	After  string
	Limit  int
}

// match reports whether key is selected by q (Limit aside).
func (q *LockQuery) match(key string) bool {
	return strings.HasPrefix(key, q.Prefix) && key > q.After
}

// LockInfo is one held lock as the browser shows it.
type LockInfo struct {
	Key       string
	Owner     Owner
	Token     uint64
	LeaseS    uint8
	OwnedOnly bool
	// LeaseEnd is when the lease ends, on the core's clock (the now its
	// events come with); 0 from a Machine, which keeps no lease ends.
	LeaseEnd int64
	// Waiters is the number of ACQUIREs queued for the key (0 from a
	// Machine, which has no queues).
	Waiters int
	// Client is the holder's session, when known: nil for a holding
	// restored by Promote or Resync, and from a Machine.
	Client *Client
}

// WaiterInfo is one ACQUIRE waiting in a key's queue.
type WaiterInfo struct {
	Owner     Owner
	Client    *Client // its session (nil: the driver gave none)
	Arrived   int64   // when it was read (core clock)
	Deadline  int64   // when its wait_s ends (core clock): T then
	LeaseS    uint8   // the lease it asked for
	OwnedOnly bool
}

// LockDetail is one held key with its waiters, oldest first (the order in
// which they will be granted).
type LockDetail struct {
	LockInfo
	Queue []WaiterInfo
}

// addPage puts info into page, which is sorted by key and at most limit
// long; it reports whether a selected lock is left out of the page (info
// itself, or the last one, pushed out). The map's order is random, so a
// page of a large table takes few insertions after it fills.
func addPage(page []LockInfo, info LockInfo, limit int) ([]LockInfo, bool) {
	if limit <= 0 {
		return page, true
	}
	full := len(page) >= limit
	if full && info.Key >= page[len(page)-1].Key {
		return page, true
	}
	i, _ := slices.BinarySearchFunc(page, info.Key, func(a LockInfo, k string) int { return strings.Compare(a.Key, k) })
	if !full {
		return slices.Insert(page, i, info), false
	}
	copy(page[i+1:], page[i:len(page)-1])
	page[i] = info
	return page, true
}

// Locks appends to page the core's held locks that q selects and whose
// lease has not ended at now, merged with what page has, sorted by key and
// cut to q.Limit; more reports whether a selected lock was left out. A
// holding whose grant is still in flight (no token yet) is not shown.
// Passing one page through the cores of several shards merges them.
func (c *Core) Locks(now int64, q LockQuery, page []LockInfo) (_ []LockInfo, more bool) {
	live := func(e *entry) bool { return e.held && e.token != 0 && now < e.end }
	for k, e := range c.m {
		if !q.match(k) {
			continue
		}
		// The key is in the map's bucket, the entry behind a pointer: a
		// key past a full page is passed over without reading its entry
		// (but for the first, to know there is more).
		if q.Limit > 0 && len(page) >= q.Limit && k >= page[len(page)-1].Key {
			more = more || live(e)
			continue
		}
		if !live(e) {
			continue
		}
		var cut bool
		page, cut = addPage(page, c.info(e), q.Limit)
		more = more || cut
	}
	return page, more
}

func (c *Core) info(e *entry) LockInfo {
	n := 0
	if e.q != nil {
		n = e.q.n
	}
	return LockInfo{Key: e.key, Owner: e.owner, Token: e.token, LeaseS: e.lease, OwnedOnly: e.ownedOnly,
		LeaseEnd: e.end, Waiters: n, Client: e.client}
}

// Lock returns key's holding and its waiters in FIFO order, if key is
// held with a known token and its lease has not ended at now.
func (c *Core) Lock(now int64, key string) (LockDetail, bool) {
	e := c.m[key]
	if e == nil || !e.held || e.token == 0 || now >= e.end {
		return LockDetail{}, false
	}
	d := LockDetail{LockInfo: c.info(e)}
	if e.q != nil {
		d.Queue = make([]WaiterInfo, 0, e.q.n)
		for w := e.q.head; w != nil; w = w.next {
			g := &w.g
			d.Queue = append(d.Queue, WaiterInfo{Owner: g.owner, Client: g.client, Arrived: g.arrived,
				Deadline: g.deadline, LeaseS: g.lease, OwnedOnly: g.ownedOnly})
		}
	}
	return d, true
}

// Locks appends to page the machine's holdings that q selects, merged,
// sorted by key and cut to q.Limit, as Core.Locks does (no lease ends, no
// waiters, no clients: a machine keeps none).
func (m *Machine) Locks(q LockQuery, page []LockInfo) (_ []LockInfo, more bool) {
	for k, h := range m.h {
		if !q.match(k) {
			continue
		}
		var cut bool
		page, cut = addPage(page, machineInfo(k, h), q.Limit)
		more = more || cut
	}
	return page, more
}

func machineInfo(key string, h holding) LockInfo {
	return LockInfo{Key: key, Owner: h.owner, Token: h.token, LeaseS: h.lease, OwnedOnly: h.ownedOnly}
}

// Lock returns key's holding as Machine.Locks shows it, if it is held.
func (m *Machine) Lock(key string) (LockDetail, bool) {
	h, ok := m.h[key]
	if !ok {
		return LockDetail{}, false
	}
	return LockDetail{LockInfo: machineInfo(key, h)}, true
}
