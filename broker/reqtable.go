package broker

// reqTable holds a conn's requests awaiting a reply, by req_id. It is an
// array whose length is a power of two, where the request with id i sits
// at i & mask: finding the request a reply names is an index and a
// compare, with no hashing (a map cost three hash operations per request
// on the acquire/release path).
//
// Two requests never share a slot: allocID skips an id whose slot is
// taken (ids are plentiful), and the table doubles before it is half full,
// which keeps that rare. Doubling keeps distinct live ids in distinct
// slots, since their low bits already differed. The table never shrinks:
// its size follows the most requests ever in flight on the conn, and the
// conn lives only as long as its socket.
type reqTable struct {
	slots []*request
	n     int
}

const minReqTable = 64

// free reports whether id's slot is empty.
func (t *reqTable) free(id uint32) bool {
	if len(t.slots) == 0 {
		return true
	}
	return t.slots[id&uint32(len(t.slots)-1)] == nil
}

// get returns the request with this id, or nil.
func (t *reqTable) get(id uint32) *request {
	if len(t.slots) == 0 {
		return nil
	}
	if r := t.slots[id&uint32(len(t.slots)-1)]; r != nil && r.id == id {
		return r
	}
	return nil
}

// reserve makes room for one more request, so that the id allocated next
// is not placed in a crowded table.
func (t *reqTable) reserve() {
	if (t.n+1)*2 <= len(t.slots) {
		return
	}
	size := max(minReqTable, 2*len(t.slots))
	for (t.n+1)*2 > size {
		size *= 2
	}
	slots := make([]*request, size)
	for _, r := range t.slots {
		if r != nil {
			slots[r.id&uint32(size-1)] = r
		}
	}
	t.slots = slots
}

// put adds r, whose id's slot must be free (see free and reserve).
func (t *reqTable) put(r *request) {
	t.slots[r.id&uint32(len(t.slots)-1)] = r
	t.n++
}

// del removes r if it is in the table.
func (t *reqTable) del(r *request) {
	if len(t.slots) == 0 {
		return
	}
	i := r.id & uint32(len(t.slots)-1)
	if t.slots[i] == r {
		t.slots[i] = nil
		t.n--
	}
}

// clear removes every request.
func (t *reqTable) clear() {
	clear(t.slots)
	t.n = 0
}
