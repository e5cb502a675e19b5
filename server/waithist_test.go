package server_test

import (
	"math"
	"testing"

	"github.com/ticketing-dev/ticketing/internal/wire"
	"github.com/ticketing-dev/ticketing/server"
)

// TestStatsGrantWaitAndErrorCodes: Stats carries the grant-wait histogram
// (one observation per grant, in the bucket of its wait) and the protocol
// errors by code, which the console turns into percentiles and recent
// counts.
func TestStatsGrantWaitAndErrorCodes(t *testing.T) {
	s, addr := startServer(t, server.Config{})
	before := s.Stats()
	if before.GrantWait.Count != 0 || len(before.GrantWait.Counts) != len(before.GrantWait.Bounds)+1 || before.ProtocolErrorsByCode != nil {
		t.Fatalf("new server: GrantWait %+v, ProtocolErrorsByCode %v", before.GrantWait, before.ProtocolErrorsByCode)
	}
	a := session(t, addr)
	tok := a.acquireOK(1, owner(1), 0, 30, "k")
	a.acquireOK(2, owner(1), 0, 30, "k2")
	b := session(t, addr)
	b.send(acq(3, owner(2), 30, 30, "k"))
	eventually(t, "waiter", func() bool { return s.Stats().Waiters == 1 })
	a.send(rel(4, tok, "k"))
	a.expect(wire.TypeReleased, 4)
	b.expect(wire.TypeGranted, 3)
	bad := session(t, addr)
	bad.send(acq(5, owner(3), 0, 0, "k")) // lease 0: invalid argument
	bad.expectError(wire.CodeInvalidArg, 5)

	st := s.Stats()
	gw := st.GrantWait
	if gw.Count != 3 || gw.Count != st.Grants {
		t.Fatalf("GrantWait.Count %d, Grants %d: want 3 and 3", gw.Count, st.Grants)
	}
	var sum uint64
	for _, c := range gw.Counts {
		sum += c
	}
	if sum != gw.Count {
		t.Fatalf("Counts %v sum to %d, Count %d", gw.Counts, sum, gw.Count)
	}
	if gw.SumS <= 0 {
		t.Fatalf("SumS %v: the waiter waited", gw.SumS)
	}
	if got := st.ProtocolErrorsByCode[wire.CodeInvalidArg]; got != 1 || len(st.ProtocolErrorsByCode) != 1 {
		t.Fatalf("ProtocolErrorsByCode %v: want {%d: 1}", st.ProtocolErrorsByCode, wire.CodeInvalidArg)
	}
	if d := gw.Sub(before.GrantWait); d.Count != 3 {
		t.Fatalf("Sub: Count %d, want 3", d.Count)
	}
	if d := gw.Sub(gw); d.Count != 0 || d.SumS != 0 {
		t.Fatalf("Sub of itself: %+v", d)
	}
}

func TestWaitHistogramQuantile(t *testing.T) {
	h := server.WaitHistogram{Bounds: []float64{0.001, 0.01, 0.1}, Counts: []uint64{50, 40, 10, 0}, Count: 100}
	for _, c := range []struct {
		q, want float64
	}{
		{0, 0},
		{0.5, 0.001},                 // the end of the first bucket
		{0.25, 0.0005},               // halfway into it
		{0.9, 0.01},                  // the end of the second
		{0.95, 0.01 + 0.09*5.0/10.0}, // halfway into the third
		{1, 0.1},
	} {
		got, ok := h.Quantile(c.q)
		if !ok || math.Abs(got-c.want) > 1e-12 {
			t.Errorf("Quantile(%v) = %v, %v; want %v", c.q, got, ok, c.want)
		}
	}
	over := server.WaitHistogram{Bounds: []float64{1}, Counts: []uint64{0, 5}, Count: 5}
	if got, ok := over.Quantile(0.5); !ok || got != 1 {
		t.Errorf("above the last bound: %v, %v; want the last bound", got, ok)
	}
	if _, ok := (server.WaitHistogram{Bounds: []float64{1}, Counts: []uint64{0, 0}}).Quantile(0.5); ok {
		t.Error("empty histogram: ok")
	}
	if _, ok := h.Quantile(1.5); ok {
		t.Error("q 1.5: ok")
	}
}
