package server

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ticketing-dev/ticketing/internal/wire"
)

// An E code the metrics do not know in advance (above 7, the codec's last
// today) is counted under its own number, not folded into a lower code's
// series (code&7 turned 9 into 1, "malformed", and 8 into an unexposed 0).
func TestProtocolErrorsUnknownCode(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	s, err := New(Config{DataDir: t.TempDir(), Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	s.m.protoError(8)
	s.m.protoError(9)
	s.m.protoError(9)
	s.m.protoError(wire.CodeInvalidArg)
	s.m.protoError(wire.CodeShuttingDown) // not the peer's error: not counted

	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, mf := range mfs {
		if mf.GetName() != "ticketing_protocol_errors_total" {
			continue
		}
		for _, m := range mf.Metric {
			if len(m.Label) != 1 || m.Label[0].GetName() != "code" {
				t.Fatalf("labels %v, want one named code", m.Label)
			}
			got[m.Label[0].GetValue()] = m.Counter.GetValue()
		}
	}
	want := map[string]float64{"1": 0, "2": 0, "3": 0, "4": 1, "6": 0, "7": 0, "8": 1, "9": 2}
	if len(got) != len(want) {
		t.Errorf("series %v, want %v", got, want)
	}
	for code, v := range want {
		if g, ok := got[code]; !ok || g != v {
			t.Errorf("code=%q: %v (present %v), want %v", code, g, ok, v)
		}
	}
	if pe := s.Stats().ProtocolErrors; pe != 4 {
		t.Errorf("Stats().ProtocolErrors = %d, want 4", pe)
	}
}

// BenchmarkGranted is the hot-path cost of counting a grant (counter and
// grant-wait histogram), from all CPUs at once.
func BenchmarkGranted(b *testing.B) {
	s, err := New(Config{DataDir: b.TempDir()})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	b.RunParallel(func(pb *testing.PB) {
		var w int64
		for pb.Next() {
			s.m.granted(w)
			w = (w + 7_919_000) % 3_000_000_000
		}
	})
}
