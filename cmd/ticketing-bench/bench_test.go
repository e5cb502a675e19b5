package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/ticketing-dev/ticketing/internal/wire"
	"github.com/ticketing-dev/ticketing/server"
	"github.com/ticketing-dev/ticketing/server/servertest"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

func runJSON(t *testing.T, args ...string) *result {
	t.Helper()
	var out, errb bytes.Buffer
	if code := run(t.Context(), append(args, "--json"), &out, &errb); code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	var r result
	if err := json.Unmarshal(out.Bytes(), &r); err != nil {
		t.Fatalf("%v: %s", err, out.String())
	}
	return &r
}

// The required smoke test: one second against an in-process server.
func TestBenchUncontendedReportsCycles(t *testing.T) {
	r := runJSON(t, "--mode", "uncontended", "--duration", "1s", "--warmup", "0", "--clients", "16", "--conns", "2")
	if r.Cycles == 0 || r.CyclesPerSec <= 0 {
		t.Fatalf("no cycles: %+v", r)
	}
	if !r.InProcess || r.Acquire == nil || r.Acquire.Count != r.Cycles || r.Cycle.P99US < r.Cycle.P50US {
		t.Errorf("result: %+v", r)
	}
	if r.TimedOut+r.Busy+r.NotHeld != 0 {
		t.Errorf("unexpected outcomes: %+v", r)
	}
}

func TestBenchContendedReportsHandoff(t *testing.T) {
	r := runJSON(t, "--mode", "contended", "--duration", "500ms", "--warmup", "0", "--clients", "8", "--conns", "8")
	if r.Cycles == 0 || r.Handoff == nil || r.Handoff.Count == 0 {
		t.Fatalf("result: %+v", r)
	}
}

func TestBenchHold(t *testing.T) {
	r := runJSON(t, "--mode", "hold", "--locks", "5000", "--clients", "4", "--window", "16")
	if r.Hold == nil || r.Hold.Granted != 5000 || r.Hold.ServerHeld != 5000 || r.Hold.RSSAfterBytes == 0 {
		t.Fatalf("hold: %+v", r.Hold)
	}
}

// --addr with --token drives an external server.
func TestBenchExternalServer(t *testing.T) {
	ts := servertest.Start(t, server.Config{ClientTokens: []string{"tok"}})
	defer ts.Close()
	srv := ts.Server()
	r := runJSON(t, "--addr", ts.Addr(), "--token", "tok", "--duration", "300ms", "--warmup", "0", "--clients", "4")
	if r.InProcess || r.Cycles == 0 {
		t.Fatalf("result: %+v", r)
	}
	if st := srv.Stats(); st.Grants < r.Cycles || st.HeldLocks != 0 {
		t.Errorf("server stats %+v after %d cycles", st, r.Cycles)
	}

	var out, errb bytes.Buffer
	code := run(t.Context(), []string{"--addr", ts.Addr(), "--token", "wrong", "--duration", "100ms"}, &out, &errb)
	if code != 1 || !strings.Contains(errb.String(), "unauthorized") {
		t.Errorf("wrong token: exit %d, %s", code, errb.String())
	}
}

func TestBenchUsage(t *testing.T) {
	for _, args := range [][]string{{"--mode", "fast"}, {"--rate", "-1"}, {"--clients", "0"}, {"--bogus"}, {"--server-pid", "1"}, {"extra"}} {
		var out, errb bytes.Buffer
		if code := run(context.Background(), args, &out, &errb); code != 2 {
			t.Errorf("%v: exit %d, %s", args, code, errb.String())
		}
	}
}

// BenchmarkAcquireRelease: one ACQUIRE+RELEASE cycle per op, through the
// tool's multiplexed client, against an in-process server, b.N spread over
// GOMAXPROCS*8 goroutines sharing two sessions.
func BenchmarkAcquireRelease(b *testing.B) {
	srv := servertest.Start(b, server.Config{})
	defer srv.Close()
	clk := newClock()
	var conns []*muxConn
	for range 2 {
		c, err := dialMux(srv.Addr(), "", nil, clk)
		if err != nil {
			b.Fatal(err)
		}
		defer c.close()
		conns = append(conns, c)
	}
	var next uint64
	var mu = make(chan struct{}, 1)
	b.SetParallelism(8)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		mu <- struct{}{}
		next++
		id := next
		<-mu
		c := conns[id%2]
		key := fmt.Appendf(nil, "bench-%d-%d", time.Now().UnixNano(), id)
		ch := make(chan reply, 1)
		acq := wire.Request{Type: wire.TypeAcquire, Owner: newOwner(), LeaseS: 30, Key: key}
		for pb.Next() {
			if err := c.send(&acq, ch); err != nil {
				b.Error(err)
				return
			}
			r := <-ch
			if r.typ != wire.TypeGranted {
				b.Errorf("acquire: %q %v", r.typ, r.err)
				return
			}
			if err := c.send(&wire.Request{Type: wire.TypeRelease, Token: r.token, Key: key}, ch); err != nil {
				b.Error(err)
				return
			}
			if r := <-ch; r.typ != wire.TypeReleased {
				b.Errorf("release: %q %v", r.typ, r.err)
				return
			}
		}
	})
}
