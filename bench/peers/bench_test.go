package main

import (
	"bytes"
	"context"
	"encoding/json"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/ticketing-dev/ticketing/server"
	"github.com/ticketing-dev/ticketing/server/servertest"
)

// TestMain checks that a run leaves no goroutine behind: the broker, the
// go-redis pool and the ping's reader and writer are all closed.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func runJSON(t *testing.T, args ...string) *result {
	t.Helper()
	var out, errb bytes.Buffer
	if code := run(t.Context(), append(args, "--json"), &out, &errb); code != 0 {
		t.Fatalf("%v: exit %d: %s", args, code, errb.String())
	}
	var r result
	if err := json.Unmarshal(out.Bytes(), &r); err != nil {
		t.Fatalf("%v: %s", err, out.String())
	}
	return &r
}

// checkRuns runs both workloads briefly through one target and checks
// what they report.
func checkRuns(t *testing.T, target ...string) {
	t.Helper()
	short := []string{"--clients", "4", "--duration", "300ms", "--warmup", "0", "--pings", "50"}
	r := runJSON(t, append(append(target, "--mode", "uncontended"), short...)...)
	if r.Cycles == 0 || r.CyclesPerSec <= 0 || r.Acquire.Count != r.Cycles || r.Cycle.P99US < r.Cycle.P50US || r.Handoff != nil {
		t.Fatalf("uncontended: %+v", r)
	}
	if r.PingRTT == nil || r.PingRTT.Count != 50 || r.BoundPerSec != 0 || r.OfBound != 0 || r.LeaseS != 30 || r.WaitS != 10 {
		t.Errorf("uncontended: %+v", r)
	}
	r = runJSON(t, append(append(target, "--mode", "contended"), short...)...)
	if r.Cycles == 0 || r.Handoff == nil || r.Handoff.Count == 0 || r.BoundPerSec <= 0 || r.OfBound <= 0 {
		t.Fatalf("contended: %+v", r)
	}
}

func TestBroker(t *testing.T) {
	srv := servertest.Start(t, server.Config{})
	checkRuns(t, "--target", "broker", "--addr", srv.Addr())
	if held := srv.Server().Stats().HeldLocks; held != 0 {
		t.Errorf("%d locks still held after the runs", held)
	}

	var out, errb bytes.Buffer
	if code := run(t.Context(), []string{"--target", "broker", "--addr", srv.Addr(), "--mode", "contended", "--clients", "2", "--duration", "100ms", "--warmup", "0", "--pings", "10"}, &out, &errb); code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	for _, want := range []string{"broker, mode contended: 2 clients over 2 sessions", " cycles/s (acquire+release)", "  hand-off ", "  idle round trip ", "  round-trip bound "} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
}

// redisAddr is the Redis of the redislock half: PEERS_BENCH_REDIS, or the
// local one. Unreachable, the test skips, unless CI is set.
func redisAddr(t *testing.T) string {
	addr := os.Getenv("PEERS_BENCH_REDIS")
	if addr == "" {
		addr = "127.0.0.1:6379"
	}
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("Redis at %s: %v (CI is set: no skipping)", addr, err)
		}
		t.Skipf("no Redis at %s: %v", addr, err)
	}
	c.Close()
	return addr
}

func TestRedislock(t *testing.T) {
	addr := redisAddr(t)
	checkRuns(t, "--target", "redislock", "--redis", addr, "--flush")
	r := runJSON(t, "--target", "redislock", "--redis", addr, "--clients", "3", "--duration", "100ms", "--warmup", "0", "--pings", "10")
	if r.Conns < 3 || r.BackoffMS != 1 || !strings.HasPrefix(r.Library, "redislock v0.9.4 (go-redis v9.23.0)") || r.ScriptsPerCycle < 2 {
		t.Errorf("%+v", r)
	}
}

func TestUsage(t *testing.T) {
	for _, args := range [][]string{
		{}, {"--target", "etcd"}, {"--target", "broker"}, {"--target", "redislock", "--mode", "hold"},
		{"--target", "redislock", "--clients", "0"}, {"--target", "redislock", "--lease", "1500ms"},
		{"--target", "redislock", "--wait", "300s"}, {"--target", "redislock", "--backoff", "0"}, {"--target", "redislock", "--pool", "-1"},
		{"--target", "redislock", "extra"},
	} {
		var out, errb bytes.Buffer
		if code := run(context.Background(), args, &out, &errb); code != 2 {
			t.Errorf("%v: exit %d, %s", args, code, errb.String())
		}
	}
}

// A server that is not there fails the run (exit 1) with its address.
func TestUnreachable(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	ctx, cancel := context.WithTimeout(t.Context(), time.Second)
	defer cancel()
	var out, errb bytes.Buffer
	if code := run(ctx, []string{"--target", "broker", "--addr", addr, "--duration", "100ms"}, &out, &errb); code != 1 || !strings.Contains(errb.String(), addr) {
		t.Errorf("exit %d, stderr %s", code, errb.String())
	}
}
