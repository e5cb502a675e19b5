package server_test

import (
	"bytes"
	"log/slog"
	"strings"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ticketing-dev/ticketing/internal/wire"
	"github.com/ticketing-dev/ticketing/server"
)

type syncBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *syncBuf) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *syncBuf) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

func roleGauge(t *testing.T, reg prometheus.Gatherer) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == "ticketing_role" {
			return mf.Metric[0].Gauge.GetValue()
		}
	}
	t.Fatal("no ticketing_role")
	return 0
}

// TestSetRole switches a serving node to standby and back: every session
// and its waiters get M with the new hint and close, held locks stay held,
// HELLOs get M meanwhile, and the node serves again after the switch back.
func TestSetRole(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	var logs syncBuf
	s, addr := startServer(t, server.Config{Registerer: reg, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	if st := s.Stats(); st.Role != "standalone" || st.Standby || roleGauge(t, reg) != 1 {
		t.Fatalf("initial role: %+v, gauge %v", st, roleGauge(t, reg))
	}
	a, b := session(t, addr), session(t, addr)
	tok := a.acquireOK(2, owner(1), 0, 30, "held")
	b.send(acq(2, owner(2), 30, 30, "held"))
	eventually(t, "b waits", func() bool { return s.Stats().Waiters == 1 })

	if err := s.SetRole(server.RoleStandby, "node-b:5225"); err != nil {
		t.Fatal(err)
	}
	for _, c := range []*client{a, b} {
		// b's ACQUIRE sees the session-fatal M first: no G, no T.
		if r := c.expect(wire.TypeNotActive, 0); string(r.Hint) != "node-b:5225" {
			t.Fatalf("hint %q", r.Hint)
		}
		c.expectClosed()
	}
	c := dial(t, addr)
	c.send(helloReq(1, ""))
	if r := c.expect(wire.TypeNotActive, 1); string(r.Hint) != "node-b:5225" {
		t.Fatalf("HELLO on a standby: hint %q", r.Hint)
	}
	c.expectClosed()
	eventually(t, "sessions closed", func() bool { st := s.Stats(); return st.Sessions == 0 && st.Waiters == 0 })
	if st := s.Stats(); st.Role != "standby" || !st.Standby || st.HeldLocks != 1 || roleGauge(t, reg) != 0 {
		t.Fatalf("standby: %+v, gauge %v", st, roleGauge(t, reg))
	}
	if r, h := s.Role(); r != server.RoleStandby || h != "node-b:5225" {
		t.Fatalf("Role() = %v %q", r, h)
	}

	// Back to serving: the lock held before the switch is still a's.
	if err := s.SetRole(server.RoleStandalone, ""); err != nil {
		t.Fatal(err)
	}
	d := session(t, addr)
	d.send(acq(2, owner(2), 0, 30, "held"))
	d.expect(wire.TypeTimedOut, 2)
	d.send(rel(3, tok, "held"))
	d.expect(wire.TypeReleased, 3)
	if tok2 := d.acquireOK(4, owner(2), 0, 30, "held"); tok2 <= tok {
		t.Fatalf("token %d after %d", tok2, tok)
	}

	// Another serving role: HELLO_OK says it; open sessions go on.
	if err := s.SetRole(server.RoleLeader, ""); err != nil {
		t.Fatal(err)
	}
	e := dial(t, addr)
	e.send(helloReq(1, ""))
	if r := e.expect(wire.TypeHelloOK, 1); r.Role != wire.RoleLeader {
		t.Fatalf("HELLO_OK role %d", r.Role)
	}
	d.send(ping(5))
	d.expect(wire.TypePong, 5)
	if st := s.Stats(); st.Role != "leader" || roleGauge(t, reg) != 3 {
		t.Fatalf("leader: %+v", st)
	}

	if err := s.SetRole(server.Role(9), ""); err == nil {
		t.Error("SetRole(9) succeeded")
	}
	if err := s.SetRole(server.RoleStandby, strings.Repeat("h", wire.MaxNameLen+1)); err == nil {
		t.Error("a 256-byte hint was accepted")
	}
	if n := strings.Count(logs.String(), "role changed"); n != 3 {
		t.Errorf("%d role change log lines, want 3:\n%s", n, logs.String())
	}
}

// TestSetRoleClosesPending: a connection that has not sent HELLO yet gets M
// too.
func TestSetRoleClosesPending(t *testing.T) {
	s, addr := startServer(t, server.Config{})
	c := dial(t, addr)
	eventually(t, "accepted", func() bool { return s.Stats().Pending == 1 })
	if err := s.SetRole(server.RoleStandby, "elsewhere"); err != nil {
		t.Fatal(err)
	}
	if r := c.expect(wire.TypeNotActive, 0); string(r.Hint) != "elsewhere" {
		t.Fatalf("hint %q", r.Hint)
	}
	c.expectClosed()
}
