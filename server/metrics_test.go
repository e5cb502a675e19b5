package server_test

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/ticketing-dev/ticketing/internal/wire"
	"github.com/ticketing-dev/ticketing/server"
)

func TestMetrics(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	s, addr := startServer(t, server.Config{Registerer: reg})
	a := session(t, addr)
	tok := a.acquireOK(1, owner(1), 0, 30, "k")
	b := session(t, addr)
	b.send(acq(2, owner(2), 0, 30, "k"))
	b.expect(wire.TypeTimedOut, 2)
	b.send(acq(3, owner(2), 30, 30, "k"))
	eventually(t, "waiter", func() bool { return s.Stats().Waiters == 1 })
	a.send(rel(4, 12345, "k"))
	a.expect(wire.TypeNotHeld, 4)
	a.send(rel(5, tok, "k"))
	a.expect(wire.TypeReleased, 5)
	b.expect(wire.TypeGranted, 3)
	bad := session(t, addr)
	bad.send(acq(6, owner(3), 0, 0, "k"))
	bad.expectError(wire.CodeInvalidArg, 6)
	eventually(t, "bad session gone", func() bool { return s.Stats().Sessions == 2 })

	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]*dto.MetricFamily{}
	for _, mf := range mfs {
		got[mf.GetName()] = mf
	}
	value := func(name string, labels ...string) float64 {
		mf := got[name]
		if mf == nil {
			t.Fatalf("metric %s missing", name)
		}
	next:
		for _, m := range mf.Metric {
			for i, lp := range m.Label {
				if i*2+1 >= len(labels) || lp.GetName() != labels[i*2] || lp.GetValue() != labels[i*2+1] {
					continue next
				}
			}
			switch {
			case m.Gauge != nil:
				return m.Gauge.GetValue()
			case m.Counter != nil:
				return m.Counter.GetValue()
			case m.Histogram != nil:
				return float64(m.Histogram.GetSampleCount())
			}
		}
		t.Fatalf("metric %s%v missing", name, labels)
		return 0
	}
	for _, tc := range []struct {
		name   string
		labels []string
		want   float64
	}{
		{"ticketing_sessions", nil, 2},
		{"ticketing_held_locks", nil, 1},
		{"ticketing_waiters", nil, 0},
		{"ticketing_grants_total", nil, 2},
		{"ticketing_timeouts_total", nil, 1},
		{"ticketing_busy_total", nil, 0},
		{"ticketing_released_total", nil, 1},
		{"ticketing_not_held_total", nil, 1},
		{"ticketing_protocol_errors_total", []string{"code", "4"}, 1},
		{"ticketing_protocol_errors_total", []string{"code", "1"}, 0},
		{"ticketing_grant_wait_seconds", nil, 2},
		{"ticketing_cancelled_total", nil, 0},
	} {
		if v := value(tc.name, tc.labels...); v != tc.want {
			t.Errorf("%s%v = %v, want %v", tc.name, tc.labels, v, tc.want)
		}
	}

	// After Close, a new server can register on the same registry.
	s.Close()
	s2, err := newServer(t, server.Config{DataDir: t.TempDir(), Registerer: reg})
	if err != nil {
		t.Fatalf("re-register: %v", err)
	}
	s2.Close()
}

// Two servers in one process register on two registries; each registry
// shows its own server's numbers.
func TestMetricsTwoRegistries(t *testing.T) {
	reg1, reg2 := prometheus.NewPedanticRegistry(), prometheus.NewPedanticRegistry()
	_, addr1 := startServer(t, server.Config{Registerer: reg1})
	_, addr2 := startServer(t, server.Config{Registerer: reg2})
	session(t, addr1).acquireOK(1, owner(1), 0, 30, "k")
	c := session(t, addr2)
	c.acquireOK(1, owner(1), 0, 30, "a")
	c.acquireOK(2, owner(1), 0, 30, "b")
	for _, tc := range []struct {
		reg  *prometheus.Registry
		want float64
	}{{reg1, 1}, {reg2, 2}} {
		mfs, err := tc.reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		found := false
		for _, mf := range mfs {
			switch mf.GetName() {
			case "ticketing_grants_total":
				found = true
				if v := mf.Metric[0].Counter.GetValue(); v != tc.want {
					t.Errorf("grants_total = %v, want %v", v, tc.want)
				}
			case "ticketing_grant_wait_seconds":
				if v := mf.Metric[0].Histogram.GetSampleCount(); v != uint64(tc.want) {
					t.Errorf("grant_wait_seconds count = %v, want %v", v, tc.want)
				}
			}
		}
		if !found {
			t.Error("grants_total missing")
		}
	}
}
