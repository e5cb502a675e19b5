package lockcore

import (
	"strings"

	"github.com/google/btree"
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

// ScanResult is how far one Scan went: a later Scan with After = Last
// goes on from there.
type ScanResult struct {
	// Last is the last key visited ("" if none): every selected lock up
	// to it is in the page.
	Last string
	// Visited is the number of keys visited (held or not): the scan's
	// work, at most its max.
	Visited int
	// Done: no key after Last starts with the prefix; the scan of the
	// query is complete.
	Done bool
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

// Scan appends to page, in key order, the core's held locks that q
// selects and whose lease has not ended at now, visiting at most max keys
// of the core's ordered index and stopping once it has appended q.Limit
// locks. It starts at the first key that q selects (a seek: the keys
// before it, and those of other prefixes, are not visited) and stops at
// the first that does not start with q.Prefix, so a query's work is the
// keys of its prefix it goes through, never the table's size. The keys
// visited include free entries kept for reuse and grants still in flight
// (no token yet), which are not shown. The driver calls it under its
// mutex, in chunks (a small max), releasing the mutex between them.
func (c *Core) Scan(now int64, q LockQuery, max int, page []LockInfo) ([]LockInfo, ScanResult) {
	return scanIndex(c.idx, entryKey, func(k string) *entry { return &entry{key: k} }, q, max, page, func(e *entry) (LockInfo, bool) {
		if !e.held || e.token == 0 || now >= e.end {
			return LockInfo{}, false
		}
		return c.info(e), true
	})
}

// The ordered indexes of keys: a Core's of its entries (those of c.m, by
// key: a pointer each), a Machine's of its held keys. They are B-trees of
// degree indexDegree (nodes of up to 63 items).
const indexDegree = 32

func newEntryIndex() *btree.BTreeG[*entry] {
	return btree.NewG(indexDegree, func(a, b *entry) bool { return a.key < b.key })
}

func newKeyIndex() *btree.BTreeG[string] {
	return btree.NewG(indexDegree, func(a, b string) bool { return a < b })
}

func entryKey(e *entry) string { return e.key }
func itself(k string) string   { return k }

// scanIndex is Core.Scan and Machine.Scan over t, whose items' keys are
// key(item) (pivot makes an item to seek to); show returns an item's
// lock, if it is to be shown.
func scanIndex[T any](t *btree.BTreeG[T], key func(T) string, pivot func(string) T, q LockQuery, max int, page []LockInfo, show func(T) (LockInfo, bool)) ([]LockInfo, ScanResult) {
	var r ScanResult
	if q.Limit <= 0 || max <= 0 {
		return page, r
	}
	// The first key selected: the prefix's first, or the one after After.
	from, skip := q.Prefix, false
	if q.After >= q.Prefix {
		from, skip = q.After, true
	}
	shown := 0
	r.Done = true
	t.AscendGreaterOrEqual(pivot(from), func(it T) bool {
		k := key(it)
		if skip && k == from {
			return true
		}
		if !strings.HasPrefix(k, q.Prefix) {
			return false // past the prefix: done
		}
		if r.Visited >= max || shown >= q.Limit {
			r.Done = false
			return false
		}
		r.Visited++
		r.Last = k
		if li, ok := show(it); ok {
			page = append(page, li)
			shown++
		}
		return true
	})
	return page, r
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

// Scan is Core.Scan over the machine's holdings (no lease ends, no
// waiters, no clients: a machine keeps none). Its driver calls it under
// whatever serialises the machine's commands, in chunks.
func (m *Machine) Scan(q LockQuery, max int, page []LockInfo) ([]LockInfo, ScanResult) {
	return scanIndex(m.idx, itself, itself, q, max, page, func(k string) (LockInfo, bool) {
		h, ok := m.h[k]
		return machineInfo(k, h), ok
	})
}

func machineInfo(key string, h holding) LockInfo {
	return LockInfo{Key: key, Owner: h.owner, Token: h.token, LeaseS: h.lease, OwnedOnly: h.ownedOnly}
}

// Lock returns key's holding as Machine.Scan shows it, if it is held.
func (m *Machine) Lock(key string) (LockDetail, bool) {
	h, ok := m.h[key]
	if !ok {
		return LockDetail{}, false
	}
	return LockDetail{LockInfo: machineInfo(key, h)}, true
}
