package broker

import (
	"math/rand/v2"
	"testing"
)

// TestReqTable checks the in-flight table against a map model: ids come
// from conn.allocID (which skips ids whose slot is taken), requests stay
// for random spans, some for very long, and req_ids wrap around.
func TestReqTable(t *testing.T) {
	c := &conn{nextID: ^uint32(0) - 5000, cancelled: map[uint32]lostGrant{}} // wraps early
	model := map[uint32]*request{}
	rng := rand.New(rand.NewPCG(1, 2))
	var live []*request
	var prev uint32
	wrapped := false
	for step := range 200000 {
		if len(live) > 0 && (rng.IntN(2) == 0 || len(live) > 3000) {
			i := rng.IntN(len(live))
			r := live[i]
			if i < 100 && step < 150000 {
				continue // the first hundred stay in flight for a long time
			}
			live[i] = live[len(live)-1]
			live = live[:len(live)-1]
			c.inflight.del(r)
			delete(model, r.id)
		} else {
			c.inflight.reserve()
			id := c.allocID()
			if id == 0 {
				t.Fatal("req_id 0 allocated")
			}
			wrapped = wrapped || id < prev
			prev = id
			if _, busy := model[id]; busy {
				t.Fatalf("step %d: req_id %d allocated while in flight", step, id)
			}
			r := &request{id: id}
			c.inflight.put(r)
			model[id] = r
			live = append(live, r)
		}
		if step%997 == 0 {
			if c.inflight.n != len(model) {
				t.Fatalf("step %d: table holds %d, model %d", step, c.inflight.n, len(model))
			}
			for id, r := range model {
				if got := c.inflight.get(id); got != r {
					t.Fatalf("step %d: get(%d) = %p, want %p", step, id, got, r)
				}
			}
			if 2*c.inflight.n > len(c.inflight.slots) {
				t.Fatalf("step %d: %d requests in %d slots", step, c.inflight.n, len(c.inflight.slots))
			}
		}
	}
	if !wrapped {
		t.Fatal("req_ids did not wrap around")
	}
	// An id that is not in flight is not found, even if its slot is taken.
	for _, r := range live {
		if got := c.inflight.get(r.id + uint32(len(c.inflight.slots))); got != nil {
			t.Fatalf("get of an id sharing the slot of %d found %d", r.id, got.id)
		}
	}
}
