package broker_test

import (
	"bytes"
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ticketing-dev/ticketing/broker"
	"github.com/ticketing-dev/ticketing/internal/wire"
)

// Protocol version 2 (docs/protocol.md "Version 2 additions"; cancel and release
// on a version-2 session, docs/semantics.md), against the fake speaking
// version 2 (f.SetVersion(2)); the fake's default, version 1 only, is
// what every other test of the package runs against.

func newFakeV2(t testing.TB) *fakeServer {
	f := newFake(t)
	f.SetVersion(2)
	return f
}

// downAddr returns an address where nothing listens.
func downAddr(t testing.TB) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}

// oneSession returns a broker with exactly one ready session, to f: a
// cluster of f and a node that is down (one session per address).
func oneSession(t testing.TB, f *fakeServer, tweak func(*broker.Config)) *broker.Broker {
	t.Helper()
	cfg := testConfig(f.Addr, downAddr(t))
	if tweak != nil {
		tweak(&cfg)
	}
	return newBroker(t, cfg)
}

// recordingDialer keeps every byte the broker writes, per connection.
type recordingDialer struct {
	mu    sync.Mutex
	conns []*recordedConn
}

type recordedConn struct {
	net.Conn
	mu  sync.Mutex
	out []byte
}

func (c *recordedConn) Write(p []byte) (int, error) {
	c.mu.Lock()
	c.out = append(c.out, p...)
	c.mu.Unlock()
	return c.Conn.Write(p)
}

func (d *recordingDialer) Dial(ctx context.Context, network, addr string) (net.Conn, error) {
	var nd net.Dialer
	c, err := nd.DialContext(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	rc := &recordedConn{Conn: c}
	d.mu.Lock()
	d.conns = append(d.conns, rc)
	d.mu.Unlock()
	return rc, nil
}

// written returns everything written on every connection, in dial order.
func (d *recordingDialer) written() [][]byte {
	d.mu.Lock()
	defer d.mu.Unlock()
	var out [][]byte
	for _, c := range d.conns {
		c.mu.Lock()
		out = append(out, append([]byte(nil), c.out...))
		c.mu.Unlock()
	}
	return out
}

// logOf returns the fake's log entries of type typ.
func logOf(f *fakeServer, typ byte) []fakeReq {
	var out []fakeReq
	for _, r := range f.Log() {
		if r.Type == typ {
			out = append(out, r)
		}
	}
	return out
}

func TestV2_Negotiation(t *testing.T) {
	t.Run("version-1 node: E(2) to version 3, then 2, then version 1 at once", func(t *testing.T) {
		f := newFake(t) // version 1 only, as a server before version 2
		d := &recordingDialer{}
		cfg := testConfig(f.Addr)
		// A refusal would wait half an hour: only an immediate retry
		// makes the sessions ready within WaitReady's 10 s.
		cfg.BackoffMin, cfg.BackoffMax = time.Hour, time.Hour
		cfg.Dialer = d.Dial
		b := allReady(t, f, cfg)
		// Each step down (3 to 2, 2 to 1) costs one E(2), or two when
		// both sessions asked at once.
		if n := f.versionRefused.Load(); n < 2 || n > 4 {
			t.Fatalf("%d HELLOs of versions 3 and 2 refused, want 2 to 4 (one per session and version at most)", n)
		}
		for _, fc := range f.Conns() {
			if fc.Version != 1 {
				t.Fatalf("session of version %d, want 1", fc.Version)
			}
		}
		hello3 := mustHexT(t, "000000084800000001030000") // the protocol's test vector
		if w := d.written(); !bytes.HasPrefix(w[0], hello3) {
			t.Fatalf("first HELLO %x, want version 3 %x", w[0], hello3)
		}
		tk, err := b.Acquire(t.Context(), "k", broker.AcquireOptions{Lease: 5 * s})
		if err != nil {
			t.Fatal(err)
		}
		if err := tk.Release(t.Context()); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("a version-1 node restarted: two E(2) per reconnect, then version 1", func(t *testing.T) {
		f := newFake(t)
		b := allReady(t, f, testConfig(f.Addr))
		for round := range 3 {
			f = f.Restart(1)
			eventually(t, "sessions reopened", func() bool { return f.hellos.Load() >= 2 && b.ReadySessions() == 2 })
			// Each session asks for version 3 again after its drop (the
			// node might have been upgraded) at most once: each E(2) is
			// retried with the next lower version at once, and the next
			// version-3 HELLO waits for the next drop.
			if n := f.versionRefused.Load(); n < 2 || n > 4 {
				t.Fatalf("round %d: %d HELLOs of versions 3 and 2 refused for 2 reconnects, want 2 to 4", round, n)
			}
			for _, fc := range f.Conns() {
				if fc.Version != 1 {
					t.Fatalf("round %d: session of version %d, want 1", round, fc.Version)
				}
			}
		}
	})
	t.Run("failed opens after the fallback ask for version 1 only", func(t *testing.T) {
		for name, hello := range map[string]func(*fakeConn, *wire.Request){
			"closed without answer": func(fc *fakeConn, _ *wire.Request) { fc.Close() },
			"token refused": func(fc *fakeConn, req *wire.Request) {
				fc.send(wire.AppendError(nil, req.ReqID, wire.CodeUnauthorized, "unauthorized"))
				fc.Close()
			},
		} {
			t.Run(name, func(t *testing.T) {
				f := newFake(t) // version 1: the fake answers E(2) itself
				f.Hello = hello
				b, err := broker.New(testConfig(f.Addr))
				if err != nil {
					t.Fatal(err)
				}
				defer b.Close()
				// No session is ever ready, so none drops: no version-3
				// or version-2 HELLO after each session's first, however
				// many redials.
				waitHellos(t, f, 12)
				if n := f.versionRefused.Load(); n > 4 {
					t.Fatalf("%d HELLOs of versions 3 and 2 refused in %d redials, want at most one per session and version", n, f.hellos.Load())
				}
			})
		}
	})
	t.Run("E(2) to version 1 after the fallback: version 2 asked again", func(t *testing.T) {
		// The fallback stays set while no session is ready (here the
		// version-1 HELLO goes unanswered), then the node comes back
		// speaking version 2 only: E(2) to the version-1 HELLO makes the
		// next one ask for version 2.
		f := newFake(t)
		var v2only atomic.Bool
		f.Hello = func(fc *fakeConn, req *wire.Request) {
			switch {
			case !v2only.Load():
				fc.Close()
			case req.Version == 1:
				fc.send(wire.AppendError(nil, req.ReqID, wire.CodeVersion, "version 1 not supported"))
				fc.Close()
			default:
				fc.sendResp(&wire.Response{Type: wire.TypeHelloOK, ReqID: req.ReqID, Version: req.Version, Role: 1, Node: []byte("fake")})
			}
		}
		b, err := broker.New(testConfig(f.Addr))
		if err != nil {
			t.Fatal(err)
		}
		defer b.Close()
		waitHellos(t, f, 4) // version-1 HELLOs, after the fake's E(2)
		f.SetVersion(2)
		v2only.Store(true)
		// (Not WaitReady: both sessions' latest attempts may be that
		// refusal for good for a moment, which WaitReady returns.)
		eventually(t, "version-2 sessions", func() bool { return b.ReadySessions() == 2 })
	})
	t.Run("rolling upgrade: a version-1 node restarted at version 2 gets version-2 sessions", func(t *testing.T) {
		f := newFake(t) // version 1 only
		b := allReady(t, f, testConfig(f.Addr))
		for _, fc := range f.Conns() {
			if fc.Version != 1 {
				t.Fatalf("session of version %d before the upgrade, want 1", fc.Version)
			}
		}
		f = f.Restart(2) // the node upgraded
		eventually(t, "sessions reopened", func() bool { return f.hellos.Load() >= 2 && b.ReadySessions() == 2 })
		if n := f.versionRefused.Load(); n < 1 || n > 2 {
			t.Fatalf("%d version-3 HELLOs refused by a version-2 node, want 1 or 2", n)
		}
		for _, fc := range f.Conns() {
			if fc.Version != 2 {
				t.Fatalf("session of version %d after the upgrade, want 2", fc.Version)
			}
		}
		// Version 2 in use: a cancelled waiter is CANCELled, its session
		// kept (on version 1 the fake would grant "wait" at once, and
		// acquireParked would time out).
		hellos := f.hellos.Load()
		cancel, done, acq := acquireParked(t, b, f, "wait")
		cancel()
		err := <-done
		mustIs(t, err, broker.ErrIndeterminate, context.Canceled)
		eventually(t, "CANCEL received", func() bool { return len(logOf(f, wire.TypeCancel)) == 1 })
		if c := logOf(f, wire.TypeCancel)[0]; c.ReqID != acq.ReqID || c.Conn != acq.Conn {
			t.Fatalf("CANCEL %+v does not name the ACQUIRE %+v", c, acq)
		}
		tk, err := b.Acquire(t.Context(), "after", broker.AcquireOptions{Lease: 5 * s})
		if err != nil {
			t.Fatal(err)
		}
		if err := tk.Release(t.Context()); err != nil {
			t.Fatal(err)
		}
		if n := f.hellos.Load(); n != hellos || f.Count(wire.TypeReleaseOwned) != 1 {
			t.Fatalf("%d new HELLOs, %d RELEASE_OWNED: want the sessions kept and V used", n-hellos, f.Count(wire.TypeReleaseOwned))
		}
	})
	t.Run("per node: a version-2 node keeps version 2 beside a version-1 node", func(t *testing.T) {
		f1, f2 := newFake(t), newFakeV2(t)
		b := newBroker(t, testConfig(f1.Addr, f2.Addr))
		eventually(t, "two sessions", func() bool { return b.ReadySessions() == 2 })
		if f1.versionRefused.Load() != 2 || f2.versionRefused.Load() != 1 {
			t.Fatalf("refused: node 1 %d (want 2: versions 3 and 2), node 2 %d (want 1: version 3)", f1.versionRefused.Load(), f2.versionRefused.Load())
		}
		if v1, v2 := f1.Conns()[0].Version, f2.Conns()[0].Version; v1 != 1 || v2 != 2 {
			t.Fatalf("session versions %d and %d, want 1 and 2", v1, v2)
		}
		var tks []*broker.Ticket
		for i := range 4 { // round robin: both nodes, two each
			tk, err := b.Acquire(t.Context(), fmt.Sprint("k", i), broker.AcquireOptions{Lease: 5 * s})
			if err != nil {
				t.Fatal(err)
			}
			tks = append(tks, tk)
		}
		for _, tk := range tks {
			if err := tk.Release(t.Context()); err != nil {
				t.Fatal(err)
			}
		}
		if f1.Count(wire.TypeReleaseOwned) != 0 || f1.Count(wire.TypeRelease) == 0 {
			t.Fatalf("version-1 node: %d V, %d U", f1.Count(wire.TypeReleaseOwned), f1.Count(wire.TypeRelease))
		}
		if f2.Count(wire.TypeRelease) != 0 || f2.Count(wire.TypeReleaseOwned) == 0 {
			t.Fatalf("version-2 node: %d U, %d V", f2.Count(wire.TypeRelease), f2.Count(wire.TypeReleaseOwned))
		}
	})
	t.Run("E(2) to version 1 is still a refusal for good", func(t *testing.T) {
		f := newFake(t)
		f.Hello = func(fc *fakeConn, req *wire.Request) {
			fc.send(wire.AppendError(nil, req.ReqID, wire.CodeVersion, "version 1 not supported"))
			fc.Close()
		}
		h := &captureHandler{}
		cfg := testConfig(f.Addr)
		cfg.Logger = slog.New(h)
		b, err := broker.New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		defer b.Close()
		err = b.WaitReady(within(t, 5*s))
		var se *broker.ServerError
		if !errors.As(err, &se) || se.Code != wire.CodeVersion || errors.Is(err, broker.ErrNotReady) {
			t.Fatalf("want the refusal for good *ServerError code 2, got %v", err)
		}
		// Each redial (after BackoffMax) asks for version 3 again, gets
		// E(2) twice and falls back: each step logged at Info once, not
		// per redial.
		waitHellos(t, f, 6)
		if n := f.versionRefused.Load(); n < 3 {
			t.Fatalf("%d HELLOs of versions 3 and 2 refused in %d redials: version 3 not asked again", n, f.hellos.Load())
		}
		info := map[string]int{}
		for _, l := range h.since(0, slog.LevelInfo) {
			if l.msg == msgFallback || l.msg == msgFallback3 {
				info[l.msg]++
			}
		}
		if info[msgFallback] != 1 || info[msgFallback3] != 1 {
			t.Fatalf("fallback lines at Info %v, want one of each step", info)
		}
	})
	t.Run("HELLO_OK with another version than asked is a protocol error", func(t *testing.T) {
		f := newFake(t)
		f.SetVersion(3)
		f.Hello = func(fc *fakeConn, req *wire.Request) {
			fc.sendResp(&wire.Response{Type: wire.TypeHelloOK, ReqID: req.ReqID, Version: 1, Role: 1})
		}
		b, err := neverReady(t, f)
		if !strings.Contains(err.Error(), "HELLO_OK with version 1 to a version-3 HELLO") {
			t.Fatalf("error does not name the version mismatch: %v", err)
		}
		if f.versionRefused.Load() != 0 || b.ReadySessions() != 0 {
			t.Fatal("the mismatch must not open a session nor fall back")
		}
	})
}

func mustHexT(t testing.TB, s string) []byte {
	t.Helper()
	b, err := hex.DecodeString(s)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// acquireParked starts an Acquire of key (a script word that parks it on
// the fake) with a cancellable ctx, waits until the fake holds it, and
// returns the cancel and the Acquire's result.
func acquireParked(t *testing.T, b *broker.Broker, f *fakeServer, key string) (context.CancelFunc, <-chan error, fakeReq) {
	t.Helper()
	n := len(logOf(f, wire.TypeAcquire))
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() {
		tk, err := b.Acquire(ctx, key, broker.AcquireOptions{Lease: 10 * s, Wait: 30 * s})
		if tk != nil {
			err = errors.New("a Ticket despite the cancellation")
		}
		done <- err
	}()
	var acq fakeReq
	eventually(t, "ACQUIRE parked on the fake", func() bool {
		l := logOf(f, wire.TypeAcquire)
		if len(l) <= n {
			return false
		}
		acq = l[n]
		for _, fc := range f.Conns() {
			if fc.ID == acq.Conn && fc.IsParked(acq.ReqID) {
				return true
			}
		}
		return false
	})
	return cancel, done, acq
}

func TestV2_Cancel(t *testing.T) {
	t.Run("CANCEL on the wire, Indeterminate at once, session kept", func(t *testing.T) {
		f := newFakeV2(t)
		d := &recordingDialer{}
		b := oneSession(t, f, func(c *broker.Config) { c.Dialer = d.Dial })
		// waitdeaf: the fake never answers, not even after the CANCEL; the
		// caller does not wait for a reply.
		cancel, done, acq := acquireParked(t, b, f, "waitdeaf")
		cancel()
		err := <-done
		mustIs(t, err, broker.ErrIndeterminate, context.Canceled)
		if !strings.Contains(err.Error(), "CANCEL sent") {
			t.Fatalf("error %v", err)
		}
		eventually(t, "CANCEL received", func() bool { return len(logOf(f, wire.TypeCancel)) == 1 })
		if c := logOf(f, wire.TypeCancel)[0]; c.ReqID != acq.ReqID || c.Conn != acq.Conn {
			t.Fatalf("CANCEL %+v does not name the ACQUIRE %+v", c, acq)
		}
		want := wire.AppendCancel(nil, acq.ReqID) // 0000000543 + req_id
		found := false
		for _, w := range d.written() {
			found = found || bytes.Contains(w, want)
		}
		if !found {
			t.Fatalf("no CANCEL frame %x on the wire", want)
		}
		// The session lives on and carries the next requests.
		for i := range 5 {
			tk, err := b.Acquire(t.Context(), fmt.Sprint("after", i), broker.AcquireOptions{Lease: 5 * s})
			if err != nil {
				t.Fatal(err)
			}
			if err := tk.Release(t.Context()); err != nil {
				t.Fatal(err)
			}
		}
		if n := f.hellos.Load(); n != 1 || b.ReadySessions() != 1 {
			t.Fatalf("%d HELLOs, %d ready sessions: the session was not kept", n, b.ReadySessions())
		}
	})
	t.Run("a late T after CANCEL is quietly consumed", func(t *testing.T) {
		f := newFakeV2(t)
		b := oneSession(t, f, nil)
		for range 3 {
			cancel, done, _ := acquireParked(t, b, f, "wait")
			cancel()
			mustIs(t, <-done, broker.ErrIndeterminate, context.Canceled)
		}
		eventually(t, "the fake answered every CANCEL with T", func() bool {
			return f.Count(wire.TypeCancel) == 3 && f.Conns()[0].Parked() == 0
		})
		// A T the broker did not absorb would be an unknown response:
		// session-fatal. The session still works, and releases nothing.
		tk, err := b.Acquire(t.Context(), "k", broker.AcquireOptions{Lease: 5 * s})
		if err != nil {
			t.Fatal(err)
		}
		if err := tk.Release(t.Context()); err != nil {
			t.Fatal(err)
		}
		if n := f.hellos.Load(); n != 1 {
			t.Fatalf("%d HELLOs: the session was closed", n)
		}
		if v := logOf(f, wire.TypeReleaseOwned); len(v) != 1 || v[0].Key != "k" {
			t.Fatalf("releases %+v, want only k's", v)
		}
	})
	t.Run("a late G after CANCEL is released by token and owner", func(t *testing.T) {
		f := newFakeV2(t)
		b := oneSession(t, f, nil)
		cancel, done, acq := acquireParked(t, b, f, "waitgrant")
		cancel()
		mustIs(t, <-done, broker.ErrIndeterminate, context.Canceled)
		eventually(t, "the late grant released", func() bool { return len(logOf(f, wire.TypeReleaseOwned)) == 1 })
		v := logOf(f, wire.TypeReleaseOwned)[0]
		if v.Token != f.nextToken.Load() || v.Owner != acq.Owner || v.Key != "waitgrant" {
			t.Fatalf("release %+v: want token %d, key waitgrant and the ACQUIRE's owner %x", v, f.nextToken.Load(), acq.Owner)
		}
		if f.Count(wire.TypeRelease) != 0 || f.hellos.Load() != 1 {
			t.Fatalf("%d U, %d HELLOs", f.Count(wire.TypeRelease), f.hellos.Load())
		}
	})
	t.Run("a G read after the session turned fatal, for a cancelled ACQUIRE, is released", func(t *testing.T) {
		f := newFakeV2(t)
		b := allReady(t, f, testConfig(f.Addr))
		f.SetHandle(func(fc *fakeConn, req *wire.Request) {
			if req.Type != wire.TypeCancel {
				f.script(fc, req)
				return
			}
			// An unknown req_id (fatal), then the grant, in one write.
			out := wire.AppendSimple(nil, wire.TypeTimedOut, req.ReqID+1000)
			fc.send(wire.AppendGranted(out, req.ReqID, f.nextToken.Add(1), 0))
		})
		cancel, done, acq := acquireParked(t, b, f, "wait")
		cancel()
		mustIs(t, <-done, broker.ErrIndeterminate, context.Canceled)
		eventually(t, "the grant released", func() bool { return f.Released(f.nextToken.Load()) == 1 })
		v := logOf(f, wire.TypeReleaseOwned)
		if len(v) != 1 || v[0].Owner != acq.Owner {
			t.Fatalf("releases %+v, want one V with the owner %x", v, acq.Owner)
		}
	})
	t.Run("no reply even after CANCEL: the reply deadline still closes the session", func(t *testing.T) {
		f := newFakeV2(t)
		b := oneSession(t, f, func(c *broker.Config) { c.ReplyGrace = 100 * time.Millisecond })
		n := len(logOf(f, wire.TypeAcquire))
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan error, 1)
		go func() { _, err := b.Acquire(ctx, "waitdeaf", broker.AcquireOptions{Lease: 10 * s}); done <- err }()
		eventually(t, "sent", func() bool { return len(logOf(f, wire.TypeAcquire)) > n })
		cancel()
		mustIs(t, <-done, broker.ErrIndeterminate, context.Canceled)
		eventually(t, "session closed and reopened", func() bool { return f.hellos.Load() >= 2 })
	})
}

// lockQueue is a fake server's lock table for one key on a version-2
// session: FIFO waiters, CANCEL answers a queued waiter T, RELEASE_OWNED
// frees only for the right token and owner and grants the next waiter.
type lockQueue struct {
	f       *fakeServer
	mu      sync.Mutex
	held    bool
	token   uint64
	owner   [16]byte
	waiters []queued
}

type queued struct {
	fc    *fakeConn
	id    uint32
	owner [16]byte
}

func (q *lockQueue) grantLocked(w queued) {
	q.held, q.token, q.owner = true, q.f.nextToken.Add(1), w.owner
	w.fc.send(wire.AppendGranted(nil, w.id, q.token, 0))
}

func (q *lockQueue) handle(fc *fakeConn, req *wire.Request) {
	q.mu.Lock()
	defer q.mu.Unlock()
	switch req.Type {
	case wire.TypePing:
		fc.send(wire.AppendSimple(nil, wire.TypePong, req.ReqID))
	case wire.TypeAcquire:
		w := queued{fc, req.ReqID, req.Owner}
		if !q.held {
			q.grantLocked(w)
			return
		}
		q.waiters = append(q.waiters, w)
	case wire.TypeCancel:
		for i, w := range q.waiters {
			if w.fc == fc && w.id == req.ReqID {
				q.waiters = append(q.waiters[:i], q.waiters[i+1:]...)
				fc.send(wire.AppendSimple(nil, wire.TypeTimedOut, req.ReqID))
				return
			}
		}
	case wire.TypeRelease, wire.TypeReleaseOwned:
		if !q.held || req.Token != q.token || (req.Type == wire.TypeReleaseOwned && req.Owner != q.owner) {
			fc.send(wire.AppendSimple(nil, wire.TypeNotHeld, req.ReqID))
			return
		}
		fc.send(wire.AppendSimple(nil, wire.TypeReleased, req.ReqID))
		q.held = false
		if len(q.waiters) > 0 {
			w := q.waiters[0]
			q.waiters = q.waiters[1:]
			q.grantLocked(w)
		}
	}
}

func (q *lockQueue) queued() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.waiters)
}

// TestV2_HundredWaitersHalfCancelled: 100 ACQUIREs wait for one key on one
// session; every other one is cancelled. The 50 cancelled are
// Indeterminate at once; the other 50 are untouched: each is granted in
// turn and releases, with no Indeterminate, on the same session.
func TestV2_HundredWaitersHalfCancelled(t *testing.T) {
	f := newFakeV2(t)
	q := &lockQueue{f: f}
	f.SetHandle(q.handle)
	b := oneSession(t, f, nil)
	holder, err := b.Acquire(t.Context(), "q", broker.AcquireOptions{Lease: 30 * s})
	if err != nil {
		t.Fatal(err)
	}
	const n = 100
	results := make([]error, n)
	cancels := make([]context.CancelFunc, n)
	var wg sync.WaitGroup
	var cancelledDone sync.WaitGroup
	for i := range n {
		ctx, cancel := context.WithCancel(t.Context())
		cancels[i] = cancel
		wg.Add(1)
		if i%2 == 1 {
			cancelledDone.Add(1)
		}
		go func() {
			defer wg.Done()
			if i%2 == 1 {
				defer cancelledDone.Done()
			}
			tk, err := b.Acquire(ctx, "q", broker.AcquireOptions{Lease: 30 * s, Wait: 60 * s})
			if err == nil {
				err = tk.Release(t.Context())
			}
			results[i] = err
		}()
	}
	eventually(t, "100 waiters queued", func() bool { return q.queued() == n })
	for i := 1; i < n; i += 2 {
		cancels[i]()
	}
	// The cancelled return without any reply to their ACQUIREs (the fake
	// answers the CANCELs, but the callers do not wait for that).
	cancelledDone.Wait()
	// (Or the session closed, as a cancel does on version 1.)
	eventually(t, "50 cancelled waiters removed", func() bool { return q.queued() == n/2 || f.hellos.Load() != 1 })
	if err := holder.Release(t.Context()); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	indeterminate, granted := 0, 0
	for i, err := range results {
		if i%2 == 1 {
			mustIs(t, err, broker.ErrIndeterminate, context.Canceled)
			continue
		}
		if errors.Is(err, broker.ErrIndeterminate) {
			indeterminate++
		}
		if err == nil {
			granted++
		} else {
			t.Errorf("waiter %d: %v", i, err)
		}
	}
	t.Logf("uncancelled waiters: %d granted and released, %d Indeterminate (of %d)", granted, indeterminate, n/2)
	if granted != n/2 {
		t.Fatalf("%d of %d uncancelled waiters granted", granted, n/2)
	}
	if cs := logOf(f, wire.TypeCancel); len(cs) != n/2 || f.hellos.Load() != 1 {
		t.Fatalf("%d CANCELs (want %d), %d HELLOs (want 1)", len(cs), n/2, f.hellos.Load())
	}
	for i := range cancels {
		cancels[i]()
	}
}

func TestV2_ReleaseOwned(t *testing.T) {
	t.Run("every release on a version-2 session is V with the ticket's owner", func(t *testing.T) {
		f := newFakeV2(t)
		b := allReady(t, f, testConfig(f.Addr))
		owners := map[uint64][16]byte{} // token -> ACQUIRE owner
		// explicit Release
		tk, err := b.Acquire(t.Context(), "explicit", broker.AcquireOptions{Lease: 30 * s})
		if err != nil {
			t.Fatal(err)
		}
		owners[tk.Token()] = logOf(f, wire.TypeAcquire)[0].Owner
		if err := tk.Release(t.Context()); err != nil {
			t.Fatal(err)
		}
		// compensating release: lease too short for the budget
		_, err = b.Acquire(t.Context(), "short", broker.AcquireOptions{Lease: s, Work: s})
		mustIs(t, err, broker.ErrLeaseTooShort)
		owners[f.nextToken.Load()] = logOf(f, wire.TypeAcquire)[1].Owner
		// the drop safety net
		tok := acquireAndDrop(t, b)
		owners[tok] = logOf(f, wire.TypeAcquire)[2].Owner
		eventually(t, "background release", func() bool {
			runtime.GC()
			return f.Released(tok) == 1
		})
		// Close
		tk, err = b.Acquire(t.Context(), "closed", broker.AcquireOptions{Lease: 30 * s})
		if err != nil {
			t.Fatal(err)
		}
		owners[tk.Token()] = logOf(f, wire.TypeAcquire)[3].Owner
		b.Close()
		if f.Count(wire.TypeRelease) != 0 {
			t.Fatalf("%d U on a version-2 session", f.Count(wire.TypeRelease))
		}
		vs := logOf(f, wire.TypeReleaseOwned)
		if len(vs) != 4 {
			t.Fatalf("%d V, want 4: %+v", len(vs), vs)
		}
		for _, v := range vs {
			if o, ok := owners[v.Token]; !ok || o != v.Owner {
				t.Fatalf("V %+v: want the owner %x of the ACQUIRE granted token %d", v, o, v.Token)
			}
		}
		// Owners are fresh per acquire.
		seen := map[[16]byte]bool{}
		for _, o := range owners {
			if seen[o] {
				t.Fatal("owner reused")
			}
			seen[o] = true
		}
	})
	t.Run("version 1: U, and never C or V, even after a cancel", func(t *testing.T) {
		f := newFake(t)
		b := allReady(t, f, testConfig(f.Addr))
		tk, err := b.Acquire(t.Context(), "k", broker.AcquireOptions{Lease: 30 * s})
		if err != nil {
			t.Fatal(err)
		}
		if err := tk.Release(t.Context()); err != nil {
			t.Fatal(err)
		}
		_, err = b.Acquire(t.Context(), "short", broker.AcquireOptions{Lease: s, Work: s})
		mustIs(t, err, broker.ErrLeaseTooShort)
		ctx, cancel := context.WithCancel(t.Context())
		go func() {
			eventually(t, "sent", func() bool { return f.Count(wire.TypeAcquire) == 3 })
			cancel()
		}()
		_, err = b.Acquire(ctx, "never", broker.AcquireOptions{Lease: 10 * s, Wait: 10 * s})
		mustIs(t, err, broker.ErrIndeterminate, context.Canceled)
		// Version 1: the cancel closed the session.
		eventually(t, "session closed and reopened", func() bool { return f.hellos.Load() >= 3 && b.ReadySessions() == 2 })
		tk, err = b.Acquire(t.Context(), "k2", broker.AcquireOptions{Lease: 30 * s})
		if err != nil {
			t.Fatal(err)
		}
		b.Close()
		if c, v, u := f.Count(wire.TypeCancel), f.Count(wire.TypeReleaseOwned), f.Count(wire.TypeRelease); c != 0 || v != 0 || u != 3 {
			t.Fatalf("version 1: %d C, %d V, %d U; want 0, 0, 3", c, v, u)
		}
		for _, fc := range f.Conns() {
			if fc.Version != 1 {
				t.Fatalf("session of version %d", fc.Version)
			}
		}
	})
}

// A RELEASE resent after its session dropped is encoded for the session
// that carries it: V on the version-2 node, U on the version-1 node.
func TestV2_ReleaseRetryOnTheOtherVersion(t *testing.T) {
	f1, f2 := newFake(t), newFakeV2(t)
	var mu sync.Mutex
	attempts := map[uint64][]byte{} // token -> the frame types of its release attempts
	closeFirst := func(f *fakeServer) func(fc *fakeConn, req *wire.Request) {
		return func(fc *fakeConn, req *wire.Request) {
			if req.Type != wire.TypeRelease && req.Type != wire.TypeReleaseOwned {
				f.script(fc, req)
				return
			}
			mu.Lock()
			attempts[req.Token] = append(attempts[req.Token], req.Type)
			first := len(attempts[req.Token]) == 1
			mu.Unlock()
			if first {
				fc.Close() // nothing answered: the broker resends on the other node
				return
			}
			fc.send(wire.AppendSimple(nil, wire.TypeReleased, req.ReqID))
		}
	}
	f1.SetHandle(closeFirst(f1))
	f2.SetHandle(closeFirst(f2))
	f2.nextToken.Store(1000) // tokens distinct across the two fakes
	cfg := testConfig(f1.Addr, f2.Addr)
	b := newBroker(t, cfg)
	for i := range 4 {
		eventually(t, "both nodes ready", func() bool { return b.ReadySessions() == 2 })
		tk, err := b.Acquire(t.Context(), fmt.Sprint("k", i), broker.AcquireOptions{Lease: 30 * s})
		if err != nil {
			t.Fatal(err)
		}
		if err := tk.Release(t.Context()); err != nil {
			t.Fatal(err)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	crossed := 0
	for tok, types := range attempts {
		if len(types) != 2 {
			t.Fatalf("token %d: %d release attempts, want 2", tok, len(types))
		}
		if types[0] != types[1] {
			crossed++
		}
	}
	// Every V went to the version-2 node and every U to the version-1
	// node (the fakes refuse the others with E(1), which would have failed
	// a Release), and the resends crossed to the other node.
	if f1.Count(wire.TypeReleaseOwned) != 0 || f2.Count(wire.TypeRelease) != 0 || crossed != 4 {
		t.Fatalf("V on the version-1 node %d, U on the version-2 node %d, crossed %d of 4", f1.Count(wire.TypeReleaseOwned), f2.Count(wire.TypeRelease), crossed)
	}
}
