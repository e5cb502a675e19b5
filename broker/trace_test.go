package broker_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/ticketing-dev/ticketing/broker"
	"github.com/ticketing-dev/ticketing/server"
)

type traceKey struct{}

// recTracer records every call; each Start puts its name in the context,
// which the matching End must be given back.
type recTracer struct {
	mu    sync.Mutex
	calls []string
}

func (r *recTracer) add(format string, args ...any) {
	r.mu.Lock()
	r.calls = append(r.calls, fmt.Sprintf(format, args...))
	r.mu.Unlock()
}

func (r *recTracer) got() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.calls...)
}

func outcome(err error) string {
	if err == nil {
		return "ok"
	}
	for _, e := range []error{broker.ErrTimedOut, broker.ErrNotHeld, broker.ErrLeaseEnding} {
		if errors.Is(err, e) {
			return e.Error()
		}
	}
	return "other: " + err.Error()
}

func (r *recTracer) TraceAcquireStart(ctx context.Context, d broker.TraceAcquireStartData) context.Context {
	r.add("acquire start %s lease=%v wait=%v work=%v", d.Key, d.Lease, d.Wait, d.Work)
	return context.WithValue(ctx, traceKey{}, "acquire")
}

func (r *recTracer) TraceAcquireEnd(ctx context.Context, d broker.TraceAcquireEndData) {
	r.add("acquire end %s ctx=%v token=%d deadline=%v %s", d.Key, ctx.Value(traceKey{}), d.Token, !d.Deadline.IsZero(), outcome(d.Err))
}

func (r *recTracer) TraceRefreshStart(ctx context.Context, d broker.TraceRefreshStartData) context.Context {
	r.add("refresh start %s token=%d lease=%v", d.Key, d.Token, d.Lease)
	return context.WithValue(ctx, traceKey{}, "refresh")
}

func (r *recTracer) TraceRefreshEnd(ctx context.Context, d broker.TraceRefreshEndData) {
	r.add("refresh end %s ctx=%v token=%d %s", d.Key, ctx.Value(traceKey{}), d.Token, outcome(d.Err))
}

func (r *recTracer) TraceReleaseStart(ctx context.Context, d broker.TraceReleaseStartData) context.Context {
	r.add("release start %s token=%d", d.Key, d.Token)
	return context.WithValue(ctx, traceKey{}, "release")
}

func (r *recTracer) TraceReleaseEnd(ctx context.Context, d broker.TraceReleaseEndData) {
	r.add("release end %s ctx=%v token=%d %s", d.Key, ctx.Value(traceKey{}), d.Token, outcome(d.Err))
}

func (r *recTracer) TraceLost(ctx context.Context, d broker.TraceLostData) {
	r.add("lost %s token=%d done=%v %s", d.Key, d.Token, ctx.Err() != nil, outcome(d.Cause))
}

func equalCalls(t *testing.T, got, want []string) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("tracer calls:\n%q\nwant\n%q", got, want)
	}
	for i := range got {
		if got[i] != want[i] {
			t.Fatalf("tracer call %d: %q, want %q (all: %q)", i, got[i], want[i], got)
		}
	}
}

// TestTracer checks the calls a Config.Tracer gets, in order, with the
// contexts its Start methods returned, against a real server.
func TestTracer(t *testing.T) {
	rs := startServer(t, server.Config{}, "127.0.0.1:0")
	rec := &recTracer{}
	cfg := testConfig(rs.Addr)
	cfg.Tracer = rec
	b := newBroker(t, cfg)
	ctx := t.Context()
	tk, err := b.Acquire(ctx, "k", broker.AcquireOptions{Lease: 30 * s, Wait: 2 * s, Work: s})
	if err != nil {
		t.Fatal(err)
	}
	tok := tk.Token()
	_, err = b.Acquire(ctx, "k", broker.AcquireOptions{Lease: 30 * s})
	mustIs(t, err, broker.ErrTimedOut)
	if err := tk.Refresh(ctx, 20*s); err != nil {
		t.Fatal(err)
	}
	if err := tk.Release(ctx); err != nil {
		t.Fatal(err)
	}
	// A released ticket's refresh is traced too: not held.
	mustIs(t, tk.Refresh(ctx, 20*s), broker.ErrNotHeld)
	equalCalls(t, rec.got(), []string{
		"acquire start k lease=30s wait=2s work=1s",
		fmt.Sprintf("acquire end k ctx=acquire token=%d deadline=true ok", tok),
		"acquire start k lease=30s wait=0s work=0s",
		"acquire end k ctx=acquire token=0 deadline=false " + broker.ErrTimedOut.Error(),
		fmt.Sprintf("refresh start k token=%d lease=20s", tok),
		fmt.Sprintf("refresh end k ctx=refresh token=%d ok", tok),
		fmt.Sprintf("release start k token=%d", tok),
		fmt.Sprintf("release end k ctx=release token=%d ok", tok),
		fmt.Sprintf("refresh start k token=%d lease=20s", tok),
		fmt.Sprintf("refresh end k ctx=refresh token=%d %s", tok, broker.ErrNotHeld.Error()),
	})
}

// TestTracerLost: a KeepAlive whose server has gone signals the possible
// loss to the tracer once, with its cause, after its refreshes were
// traced.
func TestTracerLost(t *testing.T) {
	rs := startServer(t, server.Config{}, "127.0.0.1:0")
	rec := &recTracer{}
	cfg := testConfig(rs.Addr)
	cfg.Tracer = rec
	b := newBroker(t, cfg)
	tk, err := b.Acquire(t.Context(), "k", broker.AcquireOptions{Lease: s})
	if err != nil {
		t.Fatal(err)
	}
	held, err := tk.KeepAlive(t.Context(), s)
	if err != nil {
		t.Fatal(err)
	}
	rs.Stop()
	select {
	case <-held.Done():
	case <-time.After(60 * s):
		t.Fatal("KeepAlive did not signal the loss")
	}
	mustIs(t, context.Cause(held), broker.ErrLeaseEnding)
	deadline := time.Now().Add(30 * s)
	for {
		calls := rec.got()
		last := calls[len(calls)-1]
		if last == fmt.Sprintf("lost k token=%d done=true %s", tk.Token(), broker.ErrLeaseEnding.Error()) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no lost call: %q", calls)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestTracerLostNotHeld: a KeepAlive whose refresh is answered N (the
// operator expired the lock) signals the loss to the tracer with
// ErrNotHeld.
func TestTracerLostNotHeld(t *testing.T) {
	rs := startServer(t, server.Config{}, "127.0.0.1:0")
	rec := &recTracer{}
	cfg := testConfig(rs.Addr)
	cfg.Tracer = rec
	b := newBroker(t, cfg)
	tk, err := b.Acquire(t.Context(), "k", broker.AcquireOptions{Lease: 3 * s})
	if err != nil {
		t.Fatal(err)
	}
	held, err := tk.KeepAlive(t.Context(), 3*s)
	if err != nil {
		t.Fatal(err)
	}
	if err := rs.ExpireLock(t.Context(), "k", tk.Token(), "test"); err != nil {
		t.Fatal(err)
	}
	select {
	case <-held.Done():
	case <-time.After(60 * s):
		t.Fatal("KeepAlive did not signal the loss")
	}
	mustIs(t, context.Cause(held), broker.ErrNotHeld)
	want := fmt.Sprintf("lost k token=%d done=true %s", tk.Token(), broker.ErrNotHeld.Error())
	for deadline := time.Now().Add(30 * s); ; time.Sleep(10 * time.Millisecond) {
		calls := rec.got()
		if calls[len(calls)-1] == want {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no lost call: %q", calls)
		}
	}
}
