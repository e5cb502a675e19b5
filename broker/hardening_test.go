package broker_test

import (
	"context"
	"errors"
	"net"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ticketing-dev/ticketing/broker"
	"github.com/ticketing-dev/ticketing/internal/wire"
	"github.com/ticketing-dev/ticketing/server"
)

// ---------------------------------------------------------------- the server's word is bounded

// TestServerWordBounded: the broker does not take the server's word
// where it cannot be true.
func TestServerWordBounded(t *testing.T) {
	f := newFake(t)
	b := allReady(t, f, testConfig(f.Addr))
	t.Run("forged waited_ms is taken as the elapsed time", func(t *testing.T) {
		before := time.Now()
		tk, err := b.Acquire(t.Context(), "waited:4294967295", broker.AcquireOptions{Lease: 5 * s})
		after := time.Now()
		if err != nil {
			t.Fatal(err)
		}
		defer tk.Release(t.Context())
		// t0 + elapsed + lease, elapsed at most after-before.
		if limit := after.Add(5 * s); tk.Deadline().After(limit) {
			t.Fatalf("deadline %v after t0+elapsed+lease (%v): Remaining %v on a 5s lease",
				tk.Deadline(), limit, tk.Remaining())
		}
		// And no earlier than the call plus most of the lease (the
		// deadline, not Remaining: a stall before reading it would shrink
		// Remaining).
		if r, low := tk.Remaining(), before.Add(4*s); r > 5*s || tk.Deadline().Before(low) {
			t.Fatalf("deadline %v after the call, remaining %v on a 5s lease", tk.Deadline().Sub(before), r)
		}
		t.Logf("waited_ms 4294967295 on a 5s lease: Remaining %v", tk.Remaining())
	})
	t.Run("G with token 0 is malformed", func(t *testing.T) {
		hellos := f.hellos.Load()
		n := len(f.Log())
		tk, err := b.Acquire(t.Context(), "token0", broker.AcquireOptions{Lease: 5 * s})
		if tk != nil {
			t.Fatalf("ticket with token %d", tk.Token())
		}
		mustIs(t, err, broker.ErrIndeterminate)
		if !strings.Contains(err.Error(), "token 0") {
			t.Fatalf("error does not say why: %v", err)
		}
		eventually(t, "the session reopened", func() bool { return f.hellos.Load() > hellos })
		for _, r := range f.Log()[n:] {
			if r.Type == wire.TypeRelease {
				t.Fatalf("released token %d of a malformed grant", r.Token)
			}
		}
	})
}

// ---------------------------------------------------------------- exactly one outcome

// within is a context that ends after d (or with the test).
func within(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), d)
	t.Cleanup(cancel)
	return ctx
}

// check asserts that err matches exactly the one outcome want (a sentinel's
// name, "*ServerError", or "" for nil), plus the extra targets.
func check(t *testing.T, err error, want string, extra ...error) {
	t.Helper()
	if want == "" {
		if err != nil {
			t.Fatalf("want nil, got %v", err)
		}
		return
	}
	if got := outcomesOf(err); !slices.Equal(got, []string{want}) {
		t.Fatalf("error %q matches %v, want exactly [%s]", err, got, want)
	}
	for _, e := range extra {
		if !errors.Is(err, e) {
			t.Fatalf("error %q does not match %v", err, e)
		}
	}
}

// The TestOutcomes_ tests walk every outcome path of Acquire, Release,
// WaitReady, New and Close against the fake and the real server, and check
// that each error matches exactly one outcome.

func TestOutcomes_Acquire(t *testing.T) {
	f := newFake(t)
	f.SetHandle(func(fc *fakeConn, req *wire.Request) {
		switch string(req.Key) {
		case "e3":
			fc.send(wire.AppendError(nil, req.ReqID, wire.CodeUnauthorized, "scripted"))
		case "e3-other": // an E naming no request: fatal for the others
			fc.send(wire.AppendError(nil, 0, wire.CodeUnauthorized, "scripted"))
		case "m-other":
			fc.sendResp(&wire.Response{Type: wire.TypeNotActive, ReqID: 0})
		default:
			f.script(fc, req)
		}
	})
	cfg := testConfig(f.Addr)
	b := allReady(t, f, cfg)
	acq := func(t *testing.T, ctx context.Context, key string, wait, lease, work time.Duration) error {
		t.Helper()
		eventually(t, "ready sessions", func() bool { return b.ReadySessions() == 2 })
		tk, err := b.Acquire(ctx, key, broker.AcquireOptions{Lease: lease, Wait: wait, Work: work})
		if tk != nil {
			tk.Release(t.Context())
		}
		return err
	}
	for _, c := range []struct {
		key  string
		want string
	}{
		{"granted", ""},
		{"timeout", "ErrTimedOut"},
		{"busy", "ErrBusy"},
		{"notactive", "ErrNotActive"},
		{"error", "*ServerError"},
		{"e3", "ErrUnauthorized"},
		{"close", "ErrIndeterminate"},
		{"malformed", "ErrIndeterminate"},
		{"unknownid", "ErrIndeterminate"},
		{"token0", "ErrIndeterminate"},
		{"e3-other", "ErrIndeterminate"}, // not ErrUnauthorized: the E named no request
		{"m-other", "ErrIndeterminate"},  // not ErrNotActive
	} {
		t.Run(c.key, func(t *testing.T) {
			check(t, acq(t, t.Context(), c.key, 0, 5*s, 0), c.want)
		})
	}
	t.Run("invalid argument", func(t *testing.T) {
		check(t, acq(t, t.Context(), "", 0, 5*s, 0), "ErrInvalidArgument")
	})
	t.Run("lease too short", func(t *testing.T) {
		check(t, acq(t, t.Context(), "k", 0, s, s), "ErrLeaseTooShort")
	})
	t.Run("cancelled before sending", func(t *testing.T) {
		ctx, cancel := context.WithCancel(t.Context())
		cancel()
		check(t, acq(t, ctx, "k", 0, 5*s, 0), "ErrUnsent", context.Canceled)
	})
	t.Run("cancelled after sending", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
		defer cancel()
		check(t, acq(t, ctx, "never", 5*s, 5*s, 0), "ErrIndeterminate", context.DeadlineExceeded)
	})
}

func TestOutcomes_AcquireClosed(t *testing.T) {
	f := newFake(t)
	b := allReady(t, f, testConfig(f.Addr))
	done := make(chan error, 1)
	go func() {
		_, err := b.Acquire(context.Background(), "never", broker.AcquireOptions{Lease: 5 * s, Wait: 5 * s})
		done <- err
	}()
	eventually(t, "ACQUIRE received", func() bool { return len(f.Log()) == 1 })
	b.Close()
	check(t, <-done, "ErrIndeterminate") // not ErrClosed: it may have been granted
	_, err := b.Acquire(t.Context(), "k", broker.AcquireOptions{Lease: 5 * s})
	check(t, err, "ErrClosed")
	check(t, b.WaitReady(t.Context()), "ErrClosed")
}

func TestOutcomes_AcquireNoSession(t *testing.T) {
	f := newFake(t)
	f.Hello = refuseToken("right")
	b, _ := broker.New(testConfig(f.Addr))
	defer b.Close()
	waitHellos(t, f, 2)
	_, err := b.Acquire(t.Context(), "k", broker.AcquireOptions{Lease: 5 * s})
	check(t, err, "ErrUnsent") // the refusal is in the message only

	// The last session error is a dial timeout: the Acquire, not
	// cancelled, must not match context.DeadlineExceeded.
	cfg := testConfig("127.0.0.1:1")
	cfg.DialTimeout = 20 * time.Millisecond
	var dials atomic.Int64
	cfg.Dialer = func(ctx context.Context, network, addr string) (net.Conn, error) {
		dials.Add(1)
		<-ctx.Done()
		return nil, ctx.Err()
	}
	b2, _ := broker.New(cfg)
	defer b2.Close()
	eventually(t, "a dial timed out", func() bool { return dials.Load() >= 3 })
	_, err = b2.Acquire(t.Context(), "k", broker.AcquireOptions{Lease: 5 * s})
	check(t, err, "ErrUnsent")
	if errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "deadline exceeded") {
		t.Fatalf("an Acquire that was not cancelled: %v", err)
	}
}

func TestOutcomes_Release(t *testing.T) {
	var refuse atomic.Bool
	f := newFake(t)
	f.Hello = func(fc *fakeConn, req *wire.Request) {
		if refuse.Load() {
			fc.Close()
			return
		}
		fc.sendResp(&wire.Response{Type: wire.TypeHelloOK, ReqID: req.ReqID, Version: 1, Role: 1})
	}
	f.SetHandle(func(fc *fakeConn, req *wire.Request) {
		if req.Type == wire.TypeRelease && strings.Contains(string(req.Key), "rel-dropall") {
			// The chaos case: the RELEASE is sent, its session drops,
			// and no session is ready for the rest of the window.
			refuse.Store(true)
			f.DropAll()
			return
		}
		f.script(fc, req)
	})
	cfg := testConfig(f.Addr)
	cfg.ReleaseWindow = 300 * time.Millisecond
	b := allReady(t, f, cfg)
	grant := func(t *testing.T, key string) *broker.Ticket {
		t.Helper()
		eventually(t, "ready sessions", func() bool { return b.ReadySessions() == 2 })
		tk, err := b.Acquire(t.Context(), key, broker.AcquireOptions{Lease: 30 * s})
		if err != nil {
			t.Fatal(err)
		}
		return tk
	}
	t.Run("released, twice", func(t *testing.T) {
		tk := grant(t, "k")
		check(t, tk.Release(t.Context()), "")
		check(t, tk.Release(t.Context()), "")
	})
	t.Run("not held", func(t *testing.T) {
		check(t, grant(t, "rel-notheld").Release(t.Context()), "ErrNotHeld")
	})
	t.Run("unconfirmed", func(t *testing.T) {
		check(t, grant(t, "rel-never").Release(t.Context()), "ErrReleaseUnconfirmed")
	})
	t.Run("cancelled after sending", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
		defer cancel()
		check(t, grant(t, "rel-never").Release(ctx), "ErrReleaseUnconfirmed", context.DeadlineExceeded)
	})
	t.Run("sent, then no session for the rest of the window", func(t *testing.T) {
		tk := grant(t, "rel-dropall")
		err := tk.Release(t.Context())
		check(t, err, "ErrReleaseUnconfirmed") // not ErrUnsent: it may have been released
		if n := f.Released(tk.Token()); n != 1 {
			t.Fatalf("RELEASE received %d times", n)
		}
	})
	t.Run("nothing sent in the window, or before a cancel", func(t *testing.T) {
		refuse.Store(false)
		tk := grant(t, "k")
		refuse.Store(true)
		f.DropAll()
		eventually(t, "no session", func() bool { return b.ReadySessions() == 0 })
		ctx, cancel := context.WithCancel(t.Context())
		cancel()
		check(t, tk.Release(ctx), "ErrUnsent", context.Canceled)
		check(t, tk.Release(t.Context()), "ErrUnsent")
		// Still held: released once a session is back.
		refuse.Store(false)
		eventually(t, "a ready session", func() bool { return b.ReadySessions() > 0 })
		check(t, tk.Release(t.Context()), "")
	})
	t.Run("after Close", func(t *testing.T) {
		tk := grant(t, "k")
		b.Close()
		check(t, tk.Release(t.Context()), "") // Close's own release
		check(t, b.WaitReady(t.Context()), "ErrClosed")
	})
}

func TestOutcomes_ReleaseClosed(t *testing.T) {
	f := newFake(t)
	b := allReady(t, f, testConfig(f.Addr))
	tk, err := b.Acquire(t.Context(), "rel-notheld", broker.AcquireOptions{Lease: 30 * s})
	if err != nil {
		t.Fatal(err)
	}
	b.Close()
	check(t, tk.Release(t.Context()), "ErrNotHeld") // Close's release got N
}

func TestOutcomes_WaitReady(t *testing.T) {
	pki := newPKI(t)
	tlsFake := newFakeOn(t, "127.0.0.1:0", pki.ServerTLS)
	wrongVersion := newFake(t)
	wrongVersion.Hello = func(fc *fakeConn, req *wire.Request) {
		fc.send(wire.AppendError(nil, req.ReqID, wire.CodeVersion, "version 1 not supported"))
		fc.Close()
	}
	unauth := newFake(t)
	unauth.Hello = refuseToken("right")
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	down := ln.Addr().String()
	ln.Close()
	standby := startServer(t, server.Config{Standby: true}, "127.0.0.1:0")
	wait := func(t *testing.T, cfg broker.Config, d time.Duration) error {
		b, err := broker.New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		defer b.Close()
		ctx, cancel := context.WithTimeout(t.Context(), d)
		defer cancel()
		return b.WaitReady(ctx)
	}
	t.Run("unauthorized", func(t *testing.T) {
		check(t, wait(t, testConfig(unauth.Addr), 5*s), "ErrUnauthorized")
	})
	t.Run("unsupported version", func(t *testing.T) {
		err := wait(t, testConfig(wrongVersion.Addr), 5*s)
		check(t, err, "*ServerError")
		var se *broker.ServerError
		if !errors.As(err, &se) || se.Code != wire.CodeVersion {
			t.Fatalf("want *ServerError code 2, got %v", err)
		}
	})
	t.Run("certificate rejected", func(t *testing.T) {
		cfg := testConfig(tlsFake.Addr)
		cfg.TLS = broker.TLSConfig{Mode: broker.TLSCAFile, CAFile: pki.CAFile, ServerName: "other.test"}
		check(t, wait(t, cfg, 5*s), "ErrCertificate")
	})
	t.Run("server down", func(t *testing.T) {
		check(t, wait(t, testConfig(down), 200*time.Millisecond), "ErrNotReady", context.DeadlineExceeded)
	})
	t.Run("standby only", func(t *testing.T) {
		check(t, wait(t, testConfig(standby.Addr), 200*time.Millisecond), "ErrNotReady", context.DeadlineExceeded)
	})
	t.Run("one node refuses, one is down: not every node refused", func(t *testing.T) {
		check(t, wait(t, testConfig(unauth.Addr, down), 200*time.Millisecond), "ErrNotReady", context.DeadlineExceeded)
	})
}

func TestOutcomes_New(t *testing.T) {
	_, err := broker.New(broker.Config{})
	check(t, err, "ErrInvalidConfig")
	_, err = broker.ParseURL("ticketing://h?tls=maybe")
	check(t, err, "ErrInvalidConfig")
}

func TestOutcomes_RealServer(t *testing.T) {
	rs := startServer(t, server.Config{ClientTokens: []string{"good"}, MaxLocks: 2}, "127.0.0.1:0")
	cfg := testConfig(rs.Addr)
	cfg.Token = "good"
	cfg.ReleaseWindow = 300 * time.Millisecond
	b := newBroker(t, cfg)
	tk, err := b.Acquire(t.Context(), "k", broker.AcquireOptions{Lease: s})
	check(t, err, "")
	_, err = b.Acquire(t.Context(), "k", broker.AcquireOptions{Lease: 5 * s})
	check(t, err, "ErrTimedOut")
	_, err = b.Acquire(t.Context(), "k2", broker.AcquireOptions{Lease: 5 * s, Work: 5 * s})
	check(t, err, "ErrLeaseTooShort")
	_, err = b.Acquire(t.Context(), "k", broker.AcquireOptions{Lease: 251 * s})
	check(t, err, "ErrInvalidArgument")
	other, err := b.Acquire(t.Context(), "k3", broker.AcquireOptions{Lease: 5 * s})
	check(t, err, "")
	_, err = b.Acquire(t.Context(), "k4", broker.AcquireOptions{Lease: 5 * s}) // a third lock: MaxLocks 2
	check(t, err, "ErrBusy")
	check(t, other.Release(t.Context()), "")
	eventually(t, "lease over", func() bool { return tk.Remaining() < -100*time.Millisecond })
	check(t, tk.Release(t.Context()), "ErrNotHeld")

	held, err := b.Acquire(t.Context(), "h", broker.AcquireOptions{Lease: 30 * s})
	check(t, err, "")
	done := make(chan error, 1)
	go func() {
		_, err := b.Acquire(context.Background(), "h", broker.AcquireOptions{Lease: 5 * s, Wait: 10 * s})
		done <- err
	}()
	eventually(t, "waiter queued", func() bool { return rs.Stats().Waiters == 1 })
	rs.Stop()
	check(t, <-done, "ErrIndeterminate")
	eventually(t, "no session", func() bool { return b.ReadySessions() == 0 })
	check(t, held.Release(t.Context()), "ErrUnsent") // no session in the whole window
	_, err = b.Acquire(t.Context(), "k", broker.AcquireOptions{Lease: 5 * s})
	check(t, err, "ErrUnsent")

	rs2 := startServer(t, server.Config{ClientTokens: []string{"good"}}, "127.0.0.1:0")
	cfg2 := testConfig(rs2.Addr)
	cfg2.Token = "bad"
	b2, _ := broker.New(cfg2)
	defer b2.Close()
	check(t, b2.WaitReady(within(t, 5*s)), "ErrUnauthorized")
	_, err = b2.Acquire(t.Context(), "k", broker.AcquireOptions{Lease: 5 * s})
	check(t, err, "ErrUnsent")
}

// ---------------------------------------------------------------- WaitReady refused for good

func TestWaitReady_RefusedForGood(t *testing.T) {
	t.Run("wrong token: returns at once, redials at the maximum backoff", func(t *testing.T) {
		f := newFake(t)
		f.Hello = refuseToken("right")
		cfg := testConfig(f.Addr)
		cfg.Token = "wrong"
		cfg.BackoffMin, cfg.BackoffMax = 10*time.Millisecond, s
		start := time.Now()
		b, err := broker.New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		defer b.Close()
		ctx, cancel := context.WithTimeout(t.Context(), 5*s)
		defer cancel()
		err = b.WaitReady(ctx)
		check(t, err, "ErrUnauthorized")
		if ctx.Err() != nil {
			t.Fatal("WaitReady waited for its ctx")
		}
		t.Logf("WaitReady returned after %v: %v", time.Since(start), err)
		// After a refusal for good every redial waits at least
		// BackoffMax/2 (500ms): at most 1 + elapsed/500ms HELLOs per session.
		// (The exponential backoff from 10ms would make at least 7 per
		// session in 1.5s.)
		time.Sleep(1500*time.Millisecond - time.Since(start))
		n := f.hellos.Load()
		elapsed := time.Since(start)
		limit := 2 * (1 + int64(elapsed/(500*time.Millisecond)))
		t.Logf("%d HELLOs in %v (limit %d)", n, elapsed, limit)
		if n > limit {
			t.Fatalf("%d HELLOs in %v, want at most %d", n, elapsed, limit)
		}
	})
	t.Run("a later fix on the server side is picked up", func(t *testing.T) {
		var fixed atomic.Bool
		f := newFake(t)
		f.Hello = func(fc *fakeConn, req *wire.Request) {
			if !fixed.Load() {
				fc.send(wire.AppendError(nil, req.ReqID, wire.CodeUnauthorized, "unauthorized"))
				fc.Close()
				return
			}
			fc.sendResp(&wire.Response{Type: wire.TypeHelloOK, ReqID: req.ReqID, Version: 1, Role: 1})
		}
		cfg := testConfig(f.Addr)
		cfg.BackoffMax = 300 * time.Millisecond
		b, _ := broker.New(cfg)
		defer b.Close()
		check(t, b.WaitReady(within(t, 5*s)), "ErrUnauthorized")
		fixed.Store(true)
		// WaitReady reports the latest attempts: it may say "refused"
		// again until the next redial, at most BackoffMax later.
		eventually(t, "a ready session", func() bool { return b.ReadySessions() > 0 })
		ctx, cancel := context.WithTimeout(t.Context(), 10*s)
		defer cancel()
		if err := b.WaitReady(ctx); err != nil {
			t.Fatal(err)
		}
		tk, err := b.Acquire(t.Context(), "k", broker.AcquireOptions{Lease: 5 * s})
		if err != nil {
			t.Fatal(err)
		}
		tk.Release(t.Context())
	})
}
