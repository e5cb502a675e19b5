package broker_test

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ticketing-dev/ticketing/broker"
	"github.com/ticketing-dev/ticketing/internal/wire"
)

const s = time.Second

// fenceTicket is the fence package's Ticket interface.
type fenceTicket interface {
	Key() string
	Token() uint64
	Remaining() time.Duration
	Release(ctx context.Context) error
}

var _ fenceTicket = (*broker.Ticket)(nil)

// ---------------------------------------------------------------- concurrent use

func TestConcurrentUse(t *testing.T) {
	f := newFake(t)
	b := allReady(t, f, testConfig(f.Addr))
	const workers, each = 50, 20
	var mu sync.Mutex
	seen := map[uint64]bool{}
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range each {
				tk, err := b.Acquire(t.Context(), fmt.Sprintf("k%d-%d", w, i), broker.AcquireOptions{Lease: 10 * s})
				if err != nil {
					errs <- err
					return
				}
				mu.Lock()
				dup := seen[tk.Token()]
				seen[tk.Token()] = true
				mu.Unlock()
				if dup {
					errs <- fmt.Errorf("token %d returned twice", tk.Token())
					return
				}
				if err := tk.Release(t.Context()); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if len(seen) != workers*each {
		t.Fatalf("got %d tickets, want %d", len(seen), workers*each)
	}
}

// ---------------------------------------------------------------- New never blocks

func TestNewNeverBlocks(t *testing.T) {
	t.Run("server down at New", func(t *testing.T) {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addr := ln.Addr().String()
		ln.Close()
		b, err := broker.New(testConfig(addr))
		if err != nil {
			t.Fatalf("New with the server down: %v", err)
		}
		defer b.Close()
		_, err = b.Acquire(t.Context(), "k", broker.AcquireOptions{Lease: s})
		mustIs(t, err, broker.ErrUnsent)
		// The server comes up: the background sessions find it.
		f := newFakeOn(t, addr, nil)
		ctx, cancel := context.WithTimeout(t.Context(), 10*s)
		defer cancel()
		if err := b.WaitReady(ctx); err != nil {
			t.Fatal(err)
		}
		if _, err := b.Acquire(t.Context(), "k", broker.AcquireOptions{Lease: 2 * s}); err != nil {
			t.Fatal(err)
		}
		_ = f
	})
	t.Run("invalid configuration fails at New", func(t *testing.T) {
		dir := t.TempDir()
		bad := filepath.Join(dir, "bad.pem")
		os.WriteFile(bad, []byte("not a certificate"), 0o600)
		for name, cfg := range map[string]broker.Config{
			"no address":        {},
			"empty address":     {Addrs: []string{""}},
			"bad port":          {Addrs: []string{"h:99999"}},
			"missing CA file":   {Addrs: []string{"h:1"}, TLS: broker.TLSConfig{Mode: broker.TLSCAFile, CAFile: filepath.Join(dir, "none.pem")}},
			"CA file not PEM":   {Addrs: []string{"h:1"}, TLS: broker.TLSConfig{Mode: broker.TLSCAFile, CAFile: bad}},
			"CA mode no file":   {Addrs: []string{"h:1"}, TLS: broker.TLSConfig{Mode: broker.TLSCAFile}},
			"negative duration": {Addrs: []string{"h:1"}, KeepAlive: -1},
			"window above 5s":   {Addrs: []string{"h:1"}, ReleaseWindow: 6 * s},
			"unknown TLS mode":  {Addrs: []string{"h:1"}, TLS: broker.TLSConfig{Mode: 42}},
			"token over 255 b":  {Addrs: []string{"h:1"}, Token: strings.Repeat("x", 256)},
		} {
			t.Run(name, func(t *testing.T) {
				b, err := broker.New(cfg)
				if err == nil {
					b.Close()
					t.Fatal("New succeeded")
				}
				mustIs(t, err, broker.ErrInvalidConfig)
			})
		}
	})
	t.Run("dropped session reopened without disturbing the other", func(t *testing.T) {
		f := newFake(t)
		b := allReady(t, f, testConfig(f.Addr))
		slow := make(chan error, 1)
		go func() {
			tk, err := b.Acquire(t.Context(), "delay:300ms", broker.AcquireOptions{Lease: 10 * s, Wait: 5 * s})
			if err == nil {
				err = tk.Release(t.Context())
			}
			slow <- err
		}()
		eventually(t, "slow acquire sent", func() bool { return len(f.Log()) == 1 })
		// The next request goes to the other session, which the server closes.
		_, err := b.Acquire(t.Context(), "close", broker.AcquireOptions{Lease: 10 * s, Wait: 5 * s})
		mustIs(t, err, broker.ErrIndeterminate)
		if err := <-slow; err != nil {
			t.Fatalf("request on the other session was disturbed: %v", err)
		}
		eventually(t, "session reopened", func() bool { return f.hellos.Load() == 3 && b.ReadySessions() == 2 })
	})
	t.Run("reconnect backoff grows", func(t *testing.T) {
		// A server that refuses every HELLO: attempts are spaced by the
		// capped exponential backoff, not a tight loop.
		f := newFake(t)
		f.Hello = func(fc *fakeConn, req *wire.Request) {
			fc.send(wire.AppendError(nil, 1, wire.CodeShuttingDown, "go away"))
			fc.Close()
		}
		cfg := testConfig(f.Addr)
		cfg.BackoffMin, cfg.BackoffMax = 20*time.Millisecond, 80*time.Millisecond
		start := time.Now()
		b, err := broker.New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		defer b.Close()
		time.Sleep(500 * time.Millisecond)
		eventually(t, "a few HELLOs", func() bool { return f.hellos.Load() >= 4 })
		// Two sessions, each at most one attempt per 10 ms (the shortest
		// pause), counted over the time until the count was read however
		// long a stall made it; without backoff, thousands in 500 ms.
		n := f.hellos.Load()
		elapsed := time.Since(start)
		if limit := 2 * (1 + int64(elapsed/(10*time.Millisecond))); n > limit {
			t.Fatalf("%d HELLOs in %v, want at most %d", n, elapsed, limit)
		}
	})
	t.Run("reconnect backoff grows when sessions drop right after HELLO", func(t *testing.T) {
		// A flapping node (HELLO answered, then the session dropped at
		// once) must not be redialled at BackoffMin forever.
		f := newFake(t)
		f.Hello = func(fc *fakeConn, req *wire.Request) {
			fc.sendResp(&wire.Response{Type: wire.TypeHelloOK, ReqID: req.ReqID, Version: 1, Role: 1})
			fc.Close()
		}
		cfg := testConfig(f.Addr)
		cfg.BackoffMin, cfg.BackoffMax = 10*time.Millisecond, 200*time.Millisecond
		start := time.Now()
		b, err := broker.New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		defer b.Close()
		time.Sleep(600 * time.Millisecond)
		eventually(t, "a few HELLOs", func() bool { return f.hellos.Load() >= 4 })
		// Growing, the pauses are 5+10+20+40+80 ms at least, then 100 ms at
		// least: per session at most 7 + elapsed/100ms attempts, counted
		// over the time until the count was read however long a stall made
		// it. A session that a stall kept open for BackoffMax restarts its
		// backoff (at most once per 200 ms, six quick attempts each): 3 more
		// per 100 ms. That is 62 at 600 ms; at BackoffMin: about 160.
		n := f.hellos.Load()
		elapsed := time.Since(start)
		if limit := 2 * (7 + 4*int64(elapsed/(100*time.Millisecond))); n > limit {
			t.Fatalf("%d HELLOs in %v, want at most %d", n, elapsed, limit)
		}
	})
}

// ---------------------------------------------------------------- sessions

func TestSessions(t *testing.T) {
	t.Run("one address, two sessions", func(t *testing.T) {
		f := newFake(t)
		b := allReady(t, f, testConfig(f.Addr))
		if got := b.ReadySessions(); got != 2 {
			t.Fatalf("ready sessions %d, want 2", got)
		}
		if n := f.accepted.Load(); n != 2 {
			t.Fatalf("connections %d, want 2", n)
		}
	})
	t.Run("cluster, one session per address", func(t *testing.T) {
		fs := []*fakeServer{newFake(t), newFake(t), newFake(t)}
		b := newBroker(t, testConfig(fs[0].Addr, fs[1].Addr, fs[2].Addr))
		eventually(t, "3 sessions", func() bool { return b.ReadySessions() == 3 })
		for i, f := range fs {
			if n := f.accepted.Load(); n != 1 {
				t.Fatalf("node %d: %d connections, want 1", i, n)
			}
		}
	})
	t.Run("node answering M is not used and retried later", func(t *testing.T) {
		active, standby := newFake(t), newFake(t)
		standby.Hello = func(fc *fakeConn, req *wire.Request) {
			fc.sendResp(&wire.Response{Type: wire.TypeNotActive, ReqID: req.ReqID, Hint: []byte(active.Addr)})
			fc.Close()
		}
		b := newBroker(t, testConfig(standby.Addr, active.Addr))
		for i := range 10 {
			tk, err := b.Acquire(t.Context(), fmt.Sprint("k", i), broker.AcquireOptions{Lease: 5 * s})
			if err != nil {
				t.Fatal(err)
			}
			tk.Release(t.Context())
		}
		if n := standby.Count(wire.TypeAcquire) + standby.Count(wire.TypeRelease); n != 0 {
			t.Fatalf("standby got %d requests", n)
		}
		eventually(t, "standby retried", func() bool { return standby.hellos.Load() >= 3 })
		if b.ReadySessions() != 1 {
			t.Fatalf("ready sessions %d, want 1", b.ReadySessions())
		}
	})
}

// ---------------------------------------------------------------- round robin, keepalive

func TestRoundRobinAndKeepalive(t *testing.T) {
	t.Run("acquire and release share one rotation", func(t *testing.T) {
		f := newFake(t)
		b := allReady(t, f, testConfig(f.Addr))
		for i := range 10 {
			tk, err := b.Acquire(t.Context(), fmt.Sprint("k", i), broker.AcquireOptions{Lease: 5 * s})
			if err != nil {
				t.Fatal(err)
			}
			if err := tk.Release(t.Context()); err != nil {
				t.Fatal(err)
			}
		}
		log := f.Log()
		perConn := map[int]int{}
		for i := 0; i+1 < len(log); i += 2 {
			a, u := log[i], log[i+1]
			perConn[a.Conn]++
			perConn[u.Conn]++
			if a.Conn == u.Conn {
				t.Fatalf("acquire and its release went to the same session %d: not one rotation", a.Conn)
			}
		}
		if len(perConn) != 2 || perConn[0] != 10 || perConn[1] != 10 {
			t.Fatalf("requests per session %v, want 10 and 10", perConn)
		}
	})
	t.Run("no ready session fails at once with unsent", func(t *testing.T) {
		f := newFake(t)
		f.Hello = func(fc *fakeConn, req *wire.Request) { fc.Close() }
		b, err := broker.New(testConfig(f.Addr))
		if err != nil {
			t.Fatal(err)
		}
		defer b.Close()
		before := f.bytes.Load()
		_, err = b.Acquire(t.Context(), "k", broker.AcquireOptions{Lease: 10 * s, Wait: 10 * s}) // must not wait 10 s for a session
		mustIs(t, err, broker.ErrUnsent)
		if errors.Is(err, broker.ErrIndeterminate) {
			t.Fatal("unsent must not be indeterminate")
		}
		// No session has been ready since New: the error says what to do.
		if !strings.Contains(err.Error(), "call WaitReady at start-up") {
			t.Errorf("Acquire before any ready session: %v, want a word about WaitReady", err)
		}
		_ = before
	})
	t.Run("a plain server closing HELLOs unanswered is not taken for TLS", func(t *testing.T) {
		// What a plain ticketingd does at max-pending-conns: the TLS
		// probe gets no handshake, so the sessions keep retrying, and
		// WaitReady ends with its context, not ErrTLSRequired.
		f := newFake(t)
		f.Hello = func(fc *fakeConn, req *wire.Request) { fc.Close() }
		_, err := neverReady(t, f)
		if strings.Contains(err.Error(), "TLS") {
			t.Errorf("WaitReady: %v, want no word about TLS", err)
		}
	})
	t.Run("no ready session after one was ready: no word about WaitReady", func(t *testing.T) {
		f := newFake(t)
		var hellos atomic.Int32
		f.Hello = func(fc *fakeConn, req *wire.Request) {
			if hellos.Add(1) > 1 {
				fc.Close() // every later session is refused
				return
			}
			fc.sendResp(&wire.Response{Type: wire.TypeHelloOK, ReqID: req.ReqID, Version: req.Version, Role: 1, Node: []byte("fake")})
		}
		b, err := broker.New(testConfig(f.Addr))
		if err != nil {
			t.Fatal(err)
		}
		defer b.Close()
		if err := b.WaitReady(t.Context()); err != nil {
			t.Fatal(err)
		}
		for _, c := range f.Conns() {
			c.Close()
		}
		eventually(t, "the session is down", func() bool { return b.ReadySessions() == 0 })
		_, err = b.Acquire(t.Context(), "k", broker.AcquireOptions{Lease: 10 * s, Wait: 10 * s})
		mustIs(t, err, broker.ErrUnsent)
		if strings.Contains(err.Error(), "WaitReady") {
			t.Errorf("Acquire after a session was ready: %v, want no word about WaitReady", err)
		}
	})
	t.Run("keepalive PINGs on every session", func(t *testing.T) {
		f := newFake(t)
		cfg := testConfig(f.Addr)
		cfg.KeepAlive, cfg.KeepAliveTimeout = 20*time.Millisecond, time.Second
		allReady(t, f, cfg)
		eventually(t, "pings on both sessions", func() bool {
			cs := f.Conns()
			return len(cs) == 2 && cs[0].pings.Load() >= 2 && cs[1].pings.Load() >= 2
		})
	})
	t.Run("unanswered PING closes the session", func(t *testing.T) {
		f := newFake(t)
		f.SetHandle(func(fc *fakeConn, req *wire.Request) {
			if req.Type != wire.TypePing {
				f.script(fc, req)
			} // PINGs are never answered: a dead peer
		})
		cfg := testConfig(f.Addr)
		cfg.KeepAlive, cfg.KeepAliveTimeout = 20*time.Millisecond, 50*time.Millisecond
		allReady(t, f, cfg)
		eventually(t, "sessions reopened after keepalive timeouts", func() bool { return f.hellos.Load() >= 4 })
	})
	t.Run("PING due behind a stuck write still times out, no hang", func(t *testing.T) {
		// The peer stopped reading: the writer blocks in Write, so the PING
		// that falls due is never written. The keepalive timeout must count
		// from when the PING fell due, or the session (and an Acquire with
		// no deadline on it) hangs until the reply grace, here an hour.
		f := newFake(t)
		d := &stallDialer{marker: []byte("stall")}
		cfg := testConfig(f.Addr)
		cfg.Dialer = d.Dial
		cfg.KeepAlive, cfg.KeepAliveTimeout = 20*time.Millisecond, 100*time.Millisecond
		b := allReady(t, f, cfg)
		done := make(chan error, 1)
		go func() {
			_, err := b.Acquire(context.Background(), "stall", broker.AcquireOptions{Lease: 5 * s})
			done <- err
		}()
		select {
		case err := <-done:
			mustIs(t, err, broker.ErrIndeterminate)
		case <-time.After(30 * s): // the reply grace is an hour
			t.Fatal("Acquire hung on a session whose writer is stuck")
		}
	})
	t.Run("pipelined, no head-of-line blocking", func(t *testing.T) {
		f := newFake(t)
		b := allReady(t, f, testConfig(f.Addr))
		slow := make(chan error, 2)
		for i := range 2 { // one waiting ACQUIRE on each session
			go func() {
				_, err := b.Acquire(t.Context(), fmt.Sprintf("never/%d", i), broker.AcquireOptions{Lease: 10 * s, Wait: 5 * s})
				slow <- err
			}()
		}
		eventually(t, "slow acquires sent", func() bool { return len(f.Log()) == 2 })
		for i := range 20 {
			tk, err := b.Acquire(t.Context(), fmt.Sprint("fast", i), broker.AcquireOptions{Lease: 5 * s})
			if err != nil {
				t.Fatal(err)
			}
			tk.Release(t.Context())
		}
		select {
		case err := <-slow:
			t.Fatalf("a waiting acquire ended early: %v", err)
		default:
		}
		b.Close()
		for range 2 {
			mustIs(t, <-slow, broker.ErrIndeterminate)
		}
	})
}

// ---------------------------------------------------------------- WaitReady

func TestWaitReady(t *testing.T) {
	t.Run("ready", func(t *testing.T) {
		f := newFake(t)
		b, _ := broker.New(testConfig(f.Addr))
		defer b.Close()
		if err := b.WaitReady(t.Context()); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("wrong token shows as unauthorized", func(t *testing.T) {
		f := newFake(t)
		f.Hello = refuseToken("right")
		cfg := testConfig(f.Addr)
		cfg.Token = "wrong"
		b, _ := broker.New(cfg)
		defer b.Close()
		// Refused for good by every session: WaitReady returns at once,
		// long before its ctx (5 s) ends.
		ctx, cancel := context.WithTimeout(t.Context(), 5*s)
		defer cancel()
		err := b.WaitReady(ctx)
		mustIs(t, err, broker.ErrUnauthorized)
		if ctx.Err() != nil || errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("WaitReady waited for its ctx: %v", err)
		}
		var se *broker.ServerError
		if !errors.As(err, &se) || se.Code != 3 {
			t.Fatalf("want *ServerError code 3, got %v", err)
		}
		if strings.Contains(err.Error(), "wrong") {
			t.Fatalf("error shows the token: %v", err)
		}
	})
	t.Run("server down carries the dial error", func(t *testing.T) {
		ln, _ := net.Listen("tcp", "127.0.0.1:0")
		addr := ln.Addr().String()
		ln.Close()
		b, _ := broker.New(testConfig(addr))
		defer b.Close()
		ctx, cancel := context.WithTimeout(t.Context(), 200*time.Millisecond)
		defer cancel()
		err := b.WaitReady(ctx)
		mustIs(t, err, broker.ErrNotReady, context.DeadlineExceeded)
		var op *net.OpError
		if !errors.As(err, &op) {
			t.Fatalf("want the dial error, got %v", err)
		}
	})
	t.Run("after Close", func(t *testing.T) {
		f := newFake(t)
		b, _ := broker.New(testConfig(f.Addr))
		b.Close()
		mustIs(t, b.WaitReady(t.Context()), broker.ErrClosed)
	})
}

func refuseToken(want string) func(fc *fakeConn, req *wire.Request) {
	return func(fc *fakeConn, req *wire.Request) {
		if string(req.AuthToken) != want {
			fc.send(wire.AppendError(nil, req.ReqID, wire.CodeUnauthorized, "unauthorized"))
			fc.Close()
			return
		}
		fc.sendResp(&wire.Response{Type: wire.TypeHelloOK, ReqID: req.ReqID, Version: 1, Role: 1})
	}
}

// ---------------------------------------------------------------- arguments

type argCase struct {
	name              string
	key               string
	wait, lease, work time.Duration
	ok                bool // valid: sent with waitS, leaseS
	waitS, leaseS     uint8
	want              error // for a valid case: the expected outcome (nil: a Ticket)
}

// checkArgs runs the cases: invalid ones must fail with ErrInvalidArgument
// with no byte sent; valid ones must send the rounded values.
func checkArgs(t *testing.T, cases []argCase) {
	f := newFake(t)
	b := allReady(t, f, testConfig(f.Addr))
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			key := c.key
			if key == "" && c.ok {
				key = "k/" + c.name
			}
			before, n := f.bytes.Load(), len(f.Log())
			tk, err := b.Acquire(t.Context(), key, broker.AcquireOptions{Lease: c.lease, Wait: c.wait, Work: c.work})
			if !c.ok {
				mustIs(t, err, broker.ErrInvalidArgument)
				time.Sleep(10 * time.Millisecond)
				if got := f.bytes.Load(); got != before {
					t.Fatalf("%d bytes sent for an invalid argument", got-before)
				}
				return
			}
			if c.want != nil {
				mustIs(t, err, c.want)
			} else if err != nil {
				t.Fatal(err)
			} else {
				defer tk.Release(t.Context())
			}
			r := f.Log()[n]
			if r.WaitS != c.waitS || r.LeaseS != c.leaseS {
				t.Fatalf("sent wait %d lease %d, want %d %d", r.WaitS, r.LeaseS, c.waitS, c.leaseS)
			}
		})
	}
}

func TestArgWait(t *testing.T) {
	checkArgs(t, []argCase{
		{name: "zero is one immediate try", wait: 0, lease: 5 * s, ok: true, waitS: 0, leaseS: 5},
		{name: "255s", wait: 255 * s, lease: 5 * s, ok: true, waitS: 255, leaseS: 5},
		{name: "254.1s rounds to 255", wait: 254*s + 100*time.Millisecond, lease: 5 * s, ok: true, waitS: 255, leaseS: 5},
		{name: "255.001s rejected", key: "k", wait: 255*s + time.Millisecond, lease: 5 * s},
		{name: "256s rejected, not clamped", key: "k", wait: 256 * s, lease: 5 * s},
		{name: "negative rejected", key: "k", wait: -1, lease: 5 * s},
	})
}

func TestArgLease(t *testing.T) {
	checkArgs(t, []argCase{
		{name: "1s", lease: s, ok: true, leaseS: 1},
		{name: "0.3s rounds to 1s", lease: 300 * time.Millisecond, ok: true, leaseS: 1},
		{name: "250s", lease: 250 * s, ok: true, leaseS: 250},
		{name: "zero rejected", key: "k", lease: 0},
		{name: "250.5s rejected", key: "k", lease: 250*s + 500*time.Millisecond},
		{name: "251s rejected, not clamped", key: "k", lease: 251 * s},
		{name: "negative rejected", key: "k", lease: -s},
	})
}

// TestArgLeaseUnset: AcquireOptions without a Lease (its zero value) is
// refused with a message that names the field, before anything is sent;
// a lease is never defaulted.
func TestArgLeaseUnset(t *testing.T) {
	f := newFake(t)
	b := allReady(t, f, testConfig(f.Addr))
	before := f.bytes.Load()
	_, err := b.Acquire(t.Context(), "k", broker.AcquireOptions{Wait: 5 * s, Work: s})
	mustIs(t, err, broker.ErrInvalidArgument)
	if !strings.Contains(err.Error(), "Lease must be set") {
		t.Fatalf("error %q does not say that Lease must be set", err)
	}
	time.Sleep(10 * time.Millisecond)
	if got := f.bytes.Load(); got != before {
		t.Fatalf("%d bytes sent for an unset lease", got-before)
	}
}

// TestArgLeaseAboveMaxPointsToKeepAlive: a lease above 250 s is refused
// (never clamped), and the message says what to do for longer work: a
// short lease kept with KeepAlive. Refresh and KeepAlive say the same for
// their lease.
func TestArgLeaseAboveMaxPointsToKeepAlive(t *testing.T) {
	f := newFakeV3(t)
	b := allReady(t, f, testConfig(f.Addr))
	_, err := b.Acquire(t.Context(), "k", broker.AcquireOptions{Lease: 10 * time.Minute})
	mustIs(t, err, broker.ErrInvalidArgument)
	if !strings.Contains(err.Error(), "Ticket.KeepAlive") {
		t.Fatalf("Acquire's error %q does not point to Ticket.KeepAlive", err)
	}
	tk, err := b.Acquire(t.Context(), "k", broker.AcquireOptions{Lease: 10 * s})
	if err != nil {
		t.Fatal(err)
	}
	defer tk.Release(t.Context())
	err = tk.Refresh(t.Context(), 251*s)
	mustIs(t, err, broker.ErrInvalidArgument)
	if !strings.Contains(err.Error(), "KeepAlive") {
		t.Fatalf("Refresh's error %q does not point to KeepAlive", err)
	}
	_, err = tk.KeepAlive(t.Context(), 251*s)
	mustIs(t, err, broker.ErrInvalidArgument)
	if !strings.Contains(err.Error(), "KeepAlive") {
		t.Fatalf("KeepAlive's error %q does not say what to use", err)
	}
}

// TestAcquireOptionsKeyedOnly: outside package broker an unkeyed
// AcquireOptions literal does not compile (its blank field), so that
// durations in the order of the fields cannot stand for named ones; the
// same literal keyed does. Built with the go command, from testdata.
func TestAcquireOptionsKeyedOnly(t *testing.T) {
	goCmd, err := exec.LookPath("go")
	if err != nil {
		t.Skipf("the go command is not on PATH: %v", err)
	}
	build := func(dir string) (string, error) {
		cmd := exec.CommandContext(t.Context(), goCmd, "build", "-o", os.DevNull, "./"+dir)
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	if out, err := build("testdata/literal/keyed"); err != nil {
		t.Fatalf("the keyed literal does not build: %v\n%s", err, out)
	}
	out, err := build("testdata/literal/unkeyed")
	if err == nil {
		t.Fatal("an unkeyed AcquireOptions literal compiled outside package broker")
	}
	if !strings.Contains(out, "AcquireOptions") {
		t.Fatalf("the unkeyed literal failed to build for another reason: %v\n%s", err, out)
	}
}

func TestArgWorkBudget(t *testing.T) {
	checkArgs(t, []argCase{
		{name: "zero allowed", lease: 5 * s, work: 0, ok: true, leaseS: 5},
		{name: "below lease", lease: 30 * s, work: 29 * s, ok: true, leaseS: 30},
		// Equal to the lease is a valid argument, but the conservative
		// remaining time (0.99 of it) never covers it.
		{name: "equal to lease", lease: 30 * s, work: 30 * s, ok: true, leaseS: 30, want: broker.ErrLeaseTooShort},
		{name: "1.5s with lease 1.2s: both 2s", lease: 1200 * time.Millisecond, work: 1500 * time.Millisecond, ok: true, leaseS: 2, want: broker.ErrLeaseTooShort},
		{name: "above lease rejected", key: "k", lease: 5 * s, work: 6 * s},
		{name: "rounded above rounded lease", key: "k", lease: 5 * s, work: 5*s + time.Nanosecond},
		{name: "above 250s unsupported", key: "k", lease: 250 * s, work: 251 * s},
		{name: "negative rejected", key: "k", lease: 5 * s, work: -1},
	})
}

func TestRoundUpNeverClamp(t *testing.T) {
	checkArgs(t, []argCase{
		{name: "1.2s wait rounds to 2", wait: 1200 * time.Millisecond, lease: 3 * s, ok: true, waitS: 2, leaseS: 3},
		{name: "1ns wait rounds to 1", wait: 1, lease: 3 * s, ok: true, waitS: 1, leaseS: 3},
		{name: "2.000000001s lease rounds to 3", lease: 2*s + 1, ok: true, leaseS: 3},
		{name: "key 255 bytes", key: strings.Repeat("k", 255), lease: s, ok: true, leaseS: 1},
		{name: "empty key", key: "", lease: s},
		{name: "key 256 bytes", key: strings.Repeat("k", 256), lease: s},
		{name: "huge duration", key: "k", lease: time.Duration(1<<63 - 1)},
	})
	t.Run("work budget check uses the rounded value", func(t *testing.T) {
		f := newFake(t)
		b := allReady(t, f, testConfig(f.Addr))
		// lease 2s, work 0.1s rounds to 1s: 1.98s conservative remains, so granted.
		tk, err := b.Acquire(t.Context(), "k", broker.AcquireOptions{Lease: 2 * s, Work: 100 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		tk.Release(t.Context())
		// lease 1s, work 0.1s rounds to 1s > 0.99s remaining: too short.
		_, err = b.Acquire(t.Context(), "k", broker.AcquireOptions{Lease: s, Work: 100 * time.Millisecond})
		mustIs(t, err, broker.ErrLeaseTooShort)
	})
}

// ---------------------------------------------------------------- outcomes of an acquire

func TestGranted(t *testing.T) {
	f := newFake(t)
	b := allReady(t, f, testConfig(f.Addr))
	t.Run("ticket with conservative deadline", func(t *testing.T) {
		before := time.Now()
		tk, err := b.Acquire(t.Context(), "honest:300ms", broker.AcquireOptions{Lease: 30 * s, Wait: 5 * s, Work: 2 * s})
		after := time.Now()
		if err != nil {
			t.Fatal(err)
		}
		defer tk.Release(t.Context())
		if tk.Key() != "honest:300ms" || tk.Token() == 0 {
			t.Fatalf("key %q token %d", tk.Key(), tk.Token())
		}
		span := (300*time.Millisecond + 30*s) * 99 / 100
		if d := tk.Deadline(); d.Before(before.Add(span)) || d.After(after.Add(span)) {
			t.Fatalf("deadline %v not within [%v, %v]", d, before.Add(span), after.Add(span))
		}
		if r := tk.Remaining(); r <= 29*s || r > span {
			t.Fatalf("remaining %v", r)
		}
	})
	t.Run("lease too short: compensating release", func(t *testing.T) {
		n := len(f.Log())
		_, err := b.Acquire(t.Context(), "short", broker.AcquireOptions{Lease: s, Work: s}) // 0.99s < 1s budget
		mustIs(t, err, broker.ErrLeaseTooShort)
		log := f.Log()[n:]
		if len(log) != 2 || log[1].Type != wire.TypeRelease || log[1].Key != "short" {
			t.Fatalf("want ACQUIRE then RELEASE, got %+v", log)
		}
		if !strings.Contains(err.Error(), "confirmed") {
			t.Fatalf("error does not report the release: %v", err)
		}
	})
	t.Run("remaining not positive", func(t *testing.T) {
		// waited_ms cannot make it negative, but a reply later than the
		// lease can: the fake delays 1.1s for a 1s lease.
		_, err := b.Acquire(t.Context(), "delay:1100ms", broker.AcquireOptions{Lease: s, Wait: 5 * s})
		mustIs(t, err, broker.ErrLeaseTooShort)
	})
}

func TestTimedOut(t *testing.T) {
	f := newFake(t)
	b := allReady(t, f, testConfig(f.Addr))
	_, err := b.Acquire(t.Context(), "timeout", broker.AcquireOptions{Lease: 5 * s, Wait: 2 * s})
	mustIs(t, err, broker.ErrTimedOut)
	if errors.Is(err, broker.ErrIndeterminate) {
		t.Fatal("T is definite")
	}
}

func TestBusy(t *testing.T) {
	f := newFake(t)
	b := allReady(t, f, testConfig(f.Addr))
	_, err := b.Acquire(t.Context(), "busy", broker.AcquireOptions{Lease: 5 * s, Wait: 2 * s})
	mustIs(t, err, broker.ErrBusy)
	time.Sleep(20 * time.Millisecond)
	if n := f.Count(wire.TypeAcquire); n != 1 {
		t.Fatalf("B retried internally: %d ACQUIREs", n)
	}
}

func TestIndeterminate(t *testing.T) {
	for _, key := range []string{"close", "malformed", "oversized", "empty", "unknowntype", "unknownid", "wrongtype", "pong"} {
		t.Run("reply lost: "+key, func(t *testing.T) {
			f := newFake(t)
			b := allReady(t, f, testConfig(f.Addr))
			_, err := b.Acquire(t.Context(), key, broker.AcquireOptions{Lease: 5 * s, Wait: 2 * s})
			mustIs(t, err, broker.ErrIndeterminate)
			if errors.Is(err, broker.ErrUnsent) {
				t.Fatal("indeterminate must not be unsent")
			}
			time.Sleep(20 * time.Millisecond)
			if n := f.Count(wire.TypeAcquire); n != 1 {
				t.Fatalf("ACQUIRE resent: %d", n)
			}
			// The session is session-fatal and reopened.
			eventually(t, "reopen", func() bool { return f.hellos.Load() >= 3 })
		})
	}
	t.Run("no reply within wait plus grace", func(t *testing.T) {
		f := newFake(t)
		cfg := testConfig(f.Addr)
		cfg.ReplyGrace = 100 * time.Millisecond
		b := allReady(t, f, cfg)
		_, err := b.Acquire(t.Context(), "never", broker.AcquireOptions{Lease: 5 * s})
		mustIs(t, err, broker.ErrIndeterminate)
		eventually(t, "reopen", func() bool { return f.hellos.Load() >= 3 })
	})
	t.Run("fresh owner per acquire, never resent", func(t *testing.T) {
		f := newFake(t)
		b := allReady(t, f, testConfig(f.Addr))
		for range 5 {
			b.Acquire(t.Context(), "close", broker.AcquireOptions{Lease: 5 * s})
			eventually(t, "ready", func() bool { return b.ReadySessions() > 0 })
		}
		owners := map[[16]byte]int{}
		for _, r := range f.Log() {
			owners[r.Owner]++
		}
		if len(owners) != 5 {
			t.Fatalf("owners %v: want 5 distinct, each once", owners)
		}
		for o, n := range owners {
			if n != 1 || o == ([16]byte{}) {
				t.Fatalf("owner %x used %d times", o, n)
			}
		}
	})
	t.Run("grant then close still a ticket", func(t *testing.T) {
		f := newFake(t)
		b := allReady(t, f, testConfig(f.Addr))
		tk, err := b.Acquire(t.Context(), "grantclose", broker.AcquireOptions{Lease: 5 * s})
		if err != nil {
			t.Fatalf("a G read before the close is a grant: %v", err)
		}
		if err := tk.Release(t.Context()); err != nil {
			t.Fatal(err)
		}
	})
}

// gateConn blocks Write while hold is set, to keep requests in the queue.
type gateConn struct {
	net.Conn
	hold *atomic.Bool
	gate chan struct{}
}

func (g *gateConn) Write(p []byte) (int, error) {
	if g.hold.Load() {
		<-g.gate
	}
	return g.Conn.Write(p)
}

func TestUnsent(t *testing.T) {
	t.Run("cancelled before the call", func(t *testing.T) {
		f := newFake(t)
		b := allReady(t, f, testConfig(f.Addr))
		before := f.bytes.Load()
		ctx, cancel := context.WithCancel(t.Context())
		cancel()
		_, err := b.Acquire(ctx, "k", broker.AcquireOptions{Lease: 5 * s})
		mustIs(t, err, broker.ErrUnsent, context.Canceled)
		time.Sleep(10 * time.Millisecond)
		if f.bytes.Load() != before {
			t.Fatal("bytes sent")
		}
	})
	t.Run("cancelled while queued behind a blocked write", func(t *testing.T) {
		f := newFake(t)
		var hold atomic.Bool
		gate := make(chan struct{})
		cfg := testConfig(f.Addr)
		cfg.Dialer = func(ctx context.Context, network, addr string) (net.Conn, error) {
			var d net.Dialer
			c, err := d.DialContext(ctx, network, addr)
			if err != nil {
				return nil, err
			}
			return &gateConn{Conn: c, hold: &hold, gate: gate}, nil
		}
		b := allReady(t, f, cfg)
		t.Cleanup(func() { hold.Store(false); close(gate) })
		hold.Store(true)
		before := f.bytes.Load()
		errs := make(chan error, 2)
		ctx1, cancel1 := context.WithCancel(t.Context())
		for i := range 2 { // one blocked Write on each session
			go func() {
				_, err := b.Acquire(ctx1, fmt.Sprint("first", i), broker.AcquireOptions{Lease: 5 * s})
				errs <- err
			}()
		}
		time.Sleep(50 * time.Millisecond) // both writers now block in Write
		ctx2, cancel2 := context.WithTimeout(t.Context(), 50*time.Millisecond)
		defer cancel2()
		_, err := b.Acquire(ctx2, "queued", broker.AcquireOptions{Lease: 5 * s})
		mustIs(t, err, broker.ErrUnsent, context.DeadlineExceeded)
		cancel1()
		for range 2 {
			// handed to Write: may have been sent
			mustIs(t, <-errs, broker.ErrIndeterminate, context.Canceled)
		}
		if f.bytes.Load() != before {
			t.Fatal("bytes reached the server")
		}
	})
	t.Run("cancelled while queued on a session that then drops: not moved", func(t *testing.T) {
		// A request still queued when its session drops is unsent and may
		// move to another session, but not once its caller has cancelled:
		// that would put bytes on the wire after the cancel.
		f := newFake(t)
		d := &stallDialer{marker: []byte("stall")}
		cfg := testConfig(f.Addr)
		cfg.Dialer = d.Dial
		b := allReady(t, f, cfg)
		first := make(chan error, 1)
		go func() { // session X: its writer blocks in Write
			_, err := b.Acquire(context.Background(), "stall", broker.AcquireOptions{Lease: 5 * s})
			first <- err
		}()
		eventually(t, "stalled writer", func() bool { return len(d.stalled()) == 1 })
		tk, err := b.Acquire(t.Context(), "k2", broker.AcquireOptions{Lease: 5 * s}) // session Y
		if err != nil {
			t.Fatal(err)
		}
		defer tk.Release(t.Context())
		ctx := newStepCtx()
		third := make(chan error, 1)
		go func() { // session X again: queued behind the stuck Write
			_, err := b.Acquire(ctx, "k3", broker.AcquireOptions{Lease: 5 * s})
			third <- err
		}()
		<-ctx.entered
		d.stalled()[0].Close() // X drops: "k3" was never written
		mustIs(t, <-first, broker.ErrIndeterminate)
		ctx.cancel()
		mustIs(t, <-third, broker.ErrUnsent, context.Canceled)
		time.Sleep(50 * time.Millisecond)
		for _, r := range f.Log() {
			if r.Key == "k3" {
				t.Fatal("a cancelled, unsent ACQUIRE was sent on another session")
			}
		}
	})
	t.Run("no ready session", func(t *testing.T) {
		ln, _ := net.Listen("tcp", "127.0.0.1:0")
		addr := ln.Addr().String()
		ln.Close()
		b, _ := broker.New(testConfig(addr))
		defer b.Close()
		_, err := b.Acquire(t.Context(), "k", broker.AcquireOptions{Lease: 5 * s})
		mustIs(t, err, broker.ErrUnsent)
	})
}

// lateCtx is a context whose Done channel is fetched only after the reply
// has been read, so that Acquire's select sees both the reply and the
// cancellation ready: it must honour the cancel rules whichever it picks.
type lateCtx struct {
	context.Context
	ready     chan struct{}
	done      chan struct{}
	cancelled atomic.Bool
}

func newLateCtx() *lateCtx {
	return &lateCtx{Context: context.Background(), ready: make(chan struct{}), done: make(chan struct{})}
}

func (c *lateCtx) Done() <-chan struct{} { <-c.ready; return c.done }
func (c *lateCtx) Err() error {
	if c.cancelled.Load() {
		return context.Canceled
	}
	return nil
}
func (c *lateCtx) cancel() { c.cancelled.Store(true); close(c.done); close(c.ready) }

func TestCancel(t *testing.T) {
	t.Run("cancel after send closes the session", func(t *testing.T) {
		f := newFake(t)
		b := allReady(t, f, testConfig(f.Addr))
		ctx, cancel := context.WithCancel(t.Context())
		go func() {
			eventually(t, "sent", func() bool { return f.Count(wire.TypeAcquire) == 1 })
			cancel()
		}()
		_, err := b.Acquire(ctx, "never", broker.AcquireOptions{Lease: 10 * s, Wait: 10 * s})
		mustIs(t, err, broker.ErrIndeterminate, context.Canceled)
		eventually(t, "session closed and reopened", func() bool { return f.hellos.Load() == 3 })
	})
	t.Run("grant parsed concurrently with cancel is released", func(t *testing.T) {
		f := newFake(t)
		b := allReady(t, f, testConfig(f.Addr))
		for i := range 10 {
			ctx := newLateCtx()
			f.SetHandle(func(fc *fakeConn, req *wire.Request) {
				f.script(fc, req)
				if req.Type == wire.TypeAcquire {
					f.later(30*time.Millisecond, ctx.cancel)
				}
			})
			tk, err := b.Acquire(ctx, fmt.Sprint("k", i), broker.AcquireOptions{Lease: 5 * s})
			if tk != nil {
				t.Fatal("a Ticket despite the cancellation")
			}
			mustIs(t, err, broker.ErrIndeterminate, context.Canceled)
			tok := f.nextToken.Load()
			eventually(t, "compensating release", func() bool { return f.Released(tok) == 1 })
		}
	})
	t.Run("grant read after the session turned fatal is released", func(t *testing.T) {
		f := newFake(t)
		b := allReady(t, f, testConfig(f.Addr))
		_, err := b.Acquire(t.Context(), "fatalthengrant", broker.AcquireOptions{Lease: 10 * s, Wait: 5 * s})
		mustIs(t, err, broker.ErrIndeterminate)
		tok := f.nextToken.Load()
		eventually(t, "compensating release of the grant read after the fatal frame", func() bool { return f.Released(tok) == 1 })
	})
	t.Run("T or B already read stands", func(t *testing.T) {
		f := newFake(t)
		b := allReady(t, f, testConfig(f.Addr))
		for i := range 10 {
			for _, c := range []struct {
				key  string
				want error
			}{{"timeout", broker.ErrTimedOut}, {"busy", broker.ErrBusy}} {
				ctx := newLateCtx()
				f.SetHandle(func(fc *fakeConn, req *wire.Request) {
					f.script(fc, req)
					if req.Type == wire.TypeAcquire {
						f.later(30*time.Millisecond, ctx.cancel)
					}
				})
				_, err := b.Acquire(ctx, c.key+fmt.Sprint("/", i), broker.AcquireOptions{Lease: 5 * s, Wait: 1 * s})
				mustIs(t, err, c.want)
				if errors.Is(err, broker.ErrIndeterminate) {
					t.Fatal("definite outcome turned indeterminate")
				}
			}
		}
	})
	for _, c := range []struct {
		key  string
		want error
	}{{"notactive", broker.ErrNotActive}, {"error", &broker.ServerError{}}} {
		t.Run("session-fatal "+c.key+" naming the acquire", func(t *testing.T) {
			f := newFake(t)
			b := allReady(t, f, testConfig(f.Addr))
			others := make(chan error, 2)
			for i := range 2 {
				go func() {
					_, err := b.Acquire(t.Context(), fmt.Sprint("never/", i), broker.AcquireOptions{Lease: 10 * s, Wait: 10 * s})
					others <- err
				}()
			}
			eventually(t, "waiting acquires sent", func() bool { return len(f.Log()) == 2 })
			_, err := b.Acquire(t.Context(), c.key, broker.AcquireOptions{Lease: 10 * s, Wait: 10 * s})
			if se, ok := c.want.(*broker.ServerError); ok {
				if !errors.As(err, &se) || se.Code != wire.CodeInternal {
					t.Fatalf("want *ServerError code 6, got %v", err)
				}
			} else {
				mustIs(t, err, c.want)
			}
			if errors.Is(err, broker.ErrIndeterminate) {
				t.Fatal("M/E naming the acquire is definite")
			}
			// The other waiting ACQUIRE on the same session is indeterminate.
			mustIs(t, <-others, broker.ErrIndeterminate)
		})
	}
}

// ---------------------------------------------------------------- release, Close

func TestRelease(t *testing.T) {
	f := newFake(t)
	cfg := testConfig(f.Addr)
	cfg.ReleaseWindow = 300 * time.Millisecond
	b := allReady(t, f, cfg)
	acq := func(t *testing.T, key string) *broker.Ticket {
		tk, err := b.Acquire(t.Context(), key, broker.AcquireOptions{Lease: 30 * s})
		if err != nil {
			t.Fatal(err)
		}
		return tk
	}
	t.Run("R is success, exact token", func(t *testing.T) {
		tk := acq(t, "a")
		if err := tk.Release(t.Context()); err != nil {
			t.Fatal(err)
		}
		if f.Released(tk.Token()) != 1 {
			t.Fatal("RELEASE not sent with the exact token")
		}
	})
	t.Run("N is ErrNotHeld", func(t *testing.T) {
		tk := acq(t, "rel-notheld")
		mustIs(t, tk.Release(t.Context()), broker.ErrNotHeld)
	})
	t.Run("no reply is unconfirmed, not resent on a live session", func(t *testing.T) {
		tk := acq(t, "rel-never")
		err := tk.Release(t.Context())
		mustIs(t, err, broker.ErrReleaseUnconfirmed)
		time.Sleep(50 * time.Millisecond)
		if n := f.Released(tk.Token()); n != 1 {
			t.Fatalf("RELEASE sent %d times on live sessions", n)
		}
	})
	t.Run("resent after its session drops", func(t *testing.T) {
		tk := acq(t, "rel-closeonce")
		if err := tk.Release(t.Context()); err != nil {
			t.Fatal(err)
		}
		if n := f.Released(tk.Token()); n != 2 {
			t.Fatalf("RELEASE sent %d times, want 2", n)
		}
	})
	t.Run("second release returns the first result, sends nothing", func(t *testing.T) {
		tk := acq(t, "rel-notheld/2")
		e1 := tk.Release(t.Context())
		e2 := tk.Release(t.Context())
		mustIs(t, e1, broker.ErrNotHeld)
		mustIs(t, e2, broker.ErrNotHeld)
		if n := f.Released(tk.Token()); n != 1 {
			t.Fatalf("RELEASE sent %d times", n)
		}
	})
	t.Run("cancelled release", func(t *testing.T) {
		tk := acq(t, "rel-never/3")
		ctx, cancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
		defer cancel()
		mustIs(t, tk.Release(ctx), context.DeadlineExceeded, broker.ErrReleaseUnconfirmed)
	})
	t.Run("retry cancelled after an earlier possible send is unconfirmed, not unsent", func(t *testing.T) {
		f2 := newFake(t)
		var refuse atomic.Bool
		f2.Hello = func(fc *fakeConn, req *wire.Request) {
			if refuse.Load() {
				fc.Close()
				return
			}
			fc.sendResp(&wire.Response{Type: wire.TypeHelloOK, ReqID: req.ReqID, Version: 1, Role: 1})
		}
		b2 := allReady(t, f2, testConfig(f2.Addr))
		tk, err := b2.Acquire(t.Context(), "x", broker.AcquireOptions{Lease: 30 * s})
		if err != nil {
			t.Fatal(err)
		}
		f2.SetHandle(func(fc *fakeConn, req *wire.Request) { // the RELEASE arrives, every session drops
			refuse.Store(true)
			f2.DropAll()
		})
		ctx, cancel := context.WithTimeout(t.Context(), 150*time.Millisecond)
		defer cancel()
		err = tk.Release(ctx)
		mustIs(t, err, broker.ErrReleaseUnconfirmed, context.DeadlineExceeded)
		if errors.Is(err, broker.ErrUnsent) {
			t.Fatalf("a RELEASE that reached the server reported as unsent: %v", err)
		}
	})
	t.Run("late reply within the grace is absorbed; silence beyond it closes the session", func(t *testing.T) {
		f2 := newFake(t)
		cfg := testConfig(f2.Addr)
		// The late R (400 ms) is well within the grace even on a stalled
		// machine; the unanswered RELEASE below closes the session after
		// window plus grace, well within eventually's deadline.
		cfg.ReleaseWindow, cfg.ReplyGrace = 200*time.Millisecond, 3*time.Second
		b2 := allReady(t, f2, cfg)
		tk, err := b2.Acquire(t.Context(), "rel-late", broker.AcquireOptions{Lease: 30 * s})
		if err != nil {
			t.Fatal(err)
		}
		// Unconfirmed, unless the goroutine ran so late that the R was also
		// there: a real R is then reported, which is true.
		if err := tk.Release(t.Context()); err != nil {
			mustIs(t, err, broker.ErrReleaseUnconfirmed)
		}
		time.Sleep(500 * time.Millisecond) // the R arrives after the window
		if n := f2.hellos.Load(); n != 2 || b2.ReadySessions() != 2 {
			t.Fatalf("a late R disturbed the session: %d HELLOs", n)
		}
		// A RELEASE never answered: its in-flight entry must not stay
		// forever; after the window plus the grace the session is closed.
		tk, err = b2.Acquire(t.Context(), "rel-never/late", broker.AcquireOptions{Lease: 30 * s})
		if err != nil {
			t.Fatal(err)
		}
		mustIs(t, tk.Release(t.Context()), broker.ErrReleaseUnconfirmed)
		eventually(t, "session with an unanswered RELEASE closed and reopened", func() bool { return f2.hellos.Load() >= 3 })
		if n := f2.Released(tk.Token()); n != 1 {
			t.Fatalf("RELEASE sent %d times", n)
		}
	})
	t.Run("G to a RELEASE is session-fatal, then resent", func(t *testing.T) {
		f2 := newFake(t)
		b2 := allReady(t, f2, testConfig(f2.Addr))
		tk, err := b2.Acquire(t.Context(), "rel-granted", broker.AcquireOptions{Lease: 30 * s})
		if err != nil {
			t.Fatal(err)
		}
		mustIs(t, tk.Release(t.Context()), broker.ErrReleaseUnconfirmed)
		eventually(t, "reopen", func() bool { return f2.hellos.Load() >= 3 })
	})
	t.Run("window is absolute: no session at all", func(t *testing.T) {
		f2 := newFake(t)
		cfg := testConfig(f2.Addr)
		cfg.ReleaseWindow = 200 * time.Millisecond
		b2 := allReady(t, f2, cfg)
		tk, err := b2.Acquire(t.Context(), "x", broker.AcquireOptions{Lease: 30 * s})
		if err != nil {
			t.Fatal(err)
		}
		f2.Close()
		eventually(t, "no session", func() bool { return b2.ReadySessions() == 0 })
		// Nothing was sent in the window: definitely not released, and
		// still held, so Release may be called again.
		err = tk.Release(t.Context())
		mustIs(t, err, broker.ErrUnsent)
		mustIs(t, tk.Release(t.Context()), broker.ErrUnsent)
	})
}

func TestCloseReleases(t *testing.T) {
	t.Run("Close releases outstanding tickets", func(t *testing.T) {
		f := newFake(t)
		b := allReady(t, f, testConfig(f.Addr))
		var toks []uint64
		var tks []*broker.Ticket
		for i := range 20 {
			tk, err := b.Acquire(t.Context(), fmt.Sprint("k", i), broker.AcquireOptions{Lease: 30 * s})
			if err != nil {
				t.Fatal(err)
			}
			toks = append(toks, tk.Token())
			tks = append(tks, tk)
		}
		b.Close()
		for _, tok := range toks {
			if f.Released(tok) != 1 {
				t.Fatalf("token %d not released by Close", tok)
			}
		}
		// Release after Close: the result of Close's release, at once.
		for _, tk := range tks {
			if err := tk.Release(t.Context()); err != nil {
				t.Fatalf("Release after Close released it: %v", err)
			}
		}
	})
	t.Run("Release after Close returns the first result", func(t *testing.T) {
		f := newFake(t)
		b := allReady(t, f, testConfig(f.Addr))
		tk, err := b.Acquire(t.Context(), "k", broker.AcquireOptions{Lease: 30 * s})
		if err != nil {
			t.Fatal(err)
		}
		if err := tk.Release(t.Context()); err != nil {
			t.Fatal(err)
		}
		b.Close()
		if err := tk.Release(t.Context()); err != nil {
			t.Fatal(err)
		}
		if n := f.Released(tk.Token()); n != 1 {
			t.Fatalf("%d RELEASEs", n)
		}
		_, err = b.Acquire(t.Context(), "k", broker.AcquireOptions{Lease: 30 * s})
		mustIs(t, err, broker.ErrClosed)
	})
	t.Run("Close is bounded when releases get no reply", func(t *testing.T) {
		f := newFake(t)
		cfg := testConfig(f.Addr)
		cfg.ReleaseWindow = 200 * time.Millisecond
		b := allReady(t, f, cfg)
		var tks []*broker.Ticket
		for i := range 5 {
			tk, err := b.Acquire(t.Context(), fmt.Sprint("rel-never/", i), broker.AcquireOptions{Lease: 30 * s})
			if err != nil {
				t.Fatal(err)
			}
			tks = append(tks, tk)
		}
		closed := make(chan struct{})
		go func() { b.Close(); close(closed) }()
		select {
		case <-closed:
		case <-time.After(10 * s):
			t.Fatal("Close hung")
		}
		if n := f.Count(wire.TypeRelease); n != 5 {
			t.Fatalf("%d RELEASEs, want 5", n)
		}
		// Unconfirmed at Close: a later Release returns that result promptly.
		mustIs(t, tks[0].Release(t.Context()), broker.ErrReleaseUnconfirmed)
	})
	t.Run("unreleased ticket released by Release after Close returns ErrClosed", func(t *testing.T) {
		f := newFake(t)
		cfg := testConfig(f.Addr)
		cfg.ReleaseWindow = 200 * time.Millisecond
		b := allReady(t, f, cfg)
		tk, err := b.Acquire(t.Context(), "rel-never/x", broker.AcquireOptions{Lease: 30 * s})
		if err != nil {
			t.Fatal(err)
		}
		go b.Close() // Close's release of tk is in progress...
		eventually(t, "close releasing", func() bool { return f.Count(wire.TypeRelease) == 1 })
		err = tk.Release(t.Context()) // ...a Release now must not wait for it
		mustIs(t, err, broker.ErrClosed)
	})
	t.Run("ticket dropped after a cancelled, unsent Release is still released", func(t *testing.T) {
		f := newFake(t)
		var refuse atomic.Bool
		f.Hello = func(fc *fakeConn, req *wire.Request) {
			if refuse.Load() {
				fc.Close()
				return
			}
			fc.sendResp(&wire.Response{Type: wire.TypeHelloOK, ReqID: req.ReqID, Version: 1, Role: 1})
		}
		b := allReady(t, f, testConfig(f.Addr))
		tok := acquireCancelReleaseAndDrop(t, b, func() {
			refuse.Store(true)
			f.DropAll()
			eventually(t, "no session", func() bool { return b.ReadySessions() == 0 })
		})
		refuse.Store(false)
		eventually(t, "sessions back", func() bool { return b.ReadySessions() == 2 })
		eventually(t, "background release", func() bool {
			runtime.GC()
			return f.Released(tok) == 1
		})
	})
	t.Run("dropped ticket released in the background", func(t *testing.T) {
		f := newFake(t)
		b := allReady(t, f, testConfig(f.Addr))
		tok := acquireAndDrop(t, b)
		eventually(t, "background release", func() bool {
			runtime.GC()
			return f.Released(tok) == 1
		})
	})
	t.Run("ticket held across collections, then dropped", func(t *testing.T) {
		// It is promoted (given its finalizer) at the first collection
		// after its grant, and found dropped at a later one.
		f := newFake(t)
		b := allReady(t, f, testConfig(f.Addr))
		tok := acquireHoldAcrossGCAndDrop(t, b)
		eventually(t, "background release", func() bool {
			runtime.GC()
			return f.Released(tok) == 1
		})
	})
	t.Run("released ticket is not released again when dropped", func(t *testing.T) {
		f := newFake(t)
		b := allReady(t, f, testConfig(f.Addr))
		young := acquireReleaseAndDrop(t, b, false)
		promoted := acquireReleaseAndDrop(t, b, true)
		for range 5 {
			runtime.GC()
			time.Sleep(20 * time.Millisecond)
		}
		if n, m := f.Released(young), f.Released(promoted); n != 1 || m != 1 {
			t.Fatalf("RELEASEs sent: %d for the ticket released at once, %d for the one released after collections; want 1 each", n, m)
		}
	})
}

//go:noinline
func acquireHoldAcrossGCAndDrop(t *testing.T, b *broker.Broker) uint64 {
	tk, err := b.Acquire(t.Context(), "held-then-dropped", broker.AcquireOptions{Lease: 30 * s})
	if err != nil {
		t.Fatal(err)
	}
	for range 3 {
		runtime.GC()
	}
	return tk.Token()
}

//go:noinline
func acquireReleaseAndDrop(t *testing.T, b *broker.Broker, afterGC bool) uint64 {
	tk, err := b.Acquire(t.Context(), fmt.Sprint("released-", afterGC), broker.AcquireOptions{Lease: 30 * s})
	if err != nil {
		t.Fatal(err)
	}
	if afterGC {
		for range 3 {
			runtime.GC()
		}
	}
	if err := tk.Release(t.Context()); err != nil {
		t.Fatal(err)
	}
	return tk.Token()
}

//go:noinline
func acquireCancelReleaseAndDrop(t *testing.T, b *broker.Broker, down func()) uint64 {
	tk, err := b.Acquire(t.Context(), "dropped-after-unsent", broker.AcquireOptions{Lease: 30 * s})
	if err != nil {
		t.Fatal(err)
	}
	down()
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	mustIs(t, tk.Release(ctx), broker.ErrUnsent, context.Canceled)
	return tk.Token()
}

//go:noinline
func acquireAndDrop(t *testing.T, b *broker.Broker) uint64 {
	tk, err := b.Acquire(t.Context(), "dropped", broker.AcquireOptions{Lease: 30 * s})
	if err != nil {
		t.Fatal(err)
	}
	return tk.Token()
}

// ---------------------------------------------------------------- token, TLS

func TestToken(t *testing.T) {
	t.Run("sent in HELLO", func(t *testing.T) {
		f := newFake(t)
		f.Hello = refuseToken("s3cret")
		cfg := testConfig(f.Addr)
		cfg.Token = "s3cret"
		b := allReady(t, f, cfg)
		if _, err := b.Acquire(t.Context(), "k", broker.AcquireOptions{Lease: 5 * s}); err != nil {
			t.Fatal(err)
		}
		for _, tok := range f.Tokens() {
			if tok != "s3cret" {
				t.Fatalf("HELLO token %q", tok)
			}
		}
	})
	t.Run("refused token", func(t *testing.T) {
		f := newFake(t)
		f.Hello = refuseToken("s3cret")
		cfg := testConfig(f.Addr)
		cfg.Token = "nope"
		b, _ := broker.New(cfg)
		defer b.Close()
		mustIs(t, b.WaitReady(within(t, 5*s)), broker.ErrUnauthorized)
		// Acquire's outcome is "unsent"; the refusal is in the message.
		_, err := b.Acquire(t.Context(), "k", broker.AcquireOptions{Lease: 5 * s})
		mustIs(t, err, broker.ErrUnsent)
		if !strings.Contains(err.Error(), "unauthorized") {
			t.Fatalf("error does not say why: %v", err)
		}
	})
}

func TestTLSModes(t *testing.T) {
	pki := newPKI(t)
	f := newFakeOn(t, "127.0.0.1:0", pki.ServerTLS)
	try := func(t *testing.T, tc broker.TLSConfig) error {
		cfg := testConfig(f.Addr)
		cfg.TLS = tc
		b, err := broker.New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		defer b.Close()
		ctx, cancel := context.WithTimeout(t.Context(), 2*s)
		defer cancel()
		if err := b.WaitReady(ctx); err != nil {
			return err
		}
		tk, err := b.Acquire(t.Context(), "k", broker.AcquireOptions{Lease: 5 * s})
		if err != nil {
			return err
		}
		return tk.Release(t.Context())
	}
	t.Run("CA file", func(t *testing.T) {
		if err := try(t, broker.TLSConfig{Mode: broker.TLSCAFile, CAFile: pki.CAFile, ServerName: testServerName}); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("CA file, ServerName defaults to the address host", func(t *testing.T) {
		err := try(t, broker.TLSConfig{Mode: broker.TLSCAFile, CAFile: pki.CAFile})
		var he x509.HostnameError
		if !errors.As(err, &he) || he.Host != "127.0.0.1" {
			t.Fatalf("want a hostname mismatch for 127.0.0.1, got %v", err)
		}
	})
	t.Run("system roots refuse the private CA", func(t *testing.T) {
		err := try(t, broker.TLSConfig{Mode: broker.TLSSystemRoots, ServerName: testServerName})
		var ua x509.UnknownAuthorityError
		if !errors.As(err, &ua) {
			t.Fatalf("want an unknown-authority error, got %v", err)
		}
		if !strings.Contains(err.Error(), "TLS handshake") {
			t.Fatalf("unclear error: %v", err)
		}
	})
	t.Run("insecure skip verify", func(t *testing.T) {
		if err := try(t, broker.TLSConfig{Mode: broker.TLSInsecureSkipVerify}); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("off against a TLS server", func(t *testing.T) {
		if err := try(t, broker.TLSConfig{}); err == nil {
			t.Fatal("plain TCP to a TLS server worked")
		}
	})
}
