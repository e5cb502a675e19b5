package broker_test

import (
	"context"
	"crypto/x509"
	"errors"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ticketing-dev/ticketing/broker"
	"github.com/ticketing-dev/ticketing/server"
)

// realServer is an in-process server.Server on a 127.0.0.1 listener.
type realServer struct {
	*server.Server
	Addr string
	done chan error
	once sync.Once
}

// startServer starts a server with cfg (DataDir defaulting to a temp dir)
// on addr ("127.0.0.1:0" for any port). It is closed at the end of the test.
func startServer(t testing.TB, cfg server.Config, addr string) *realServer {
	t.Helper()
	if cfg.DataDir == "" {
		cfg.DataDir = t.TempDir()
	}
	srv, err := server.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	var ln net.Listener
	for i := 0; ; i++ { // the port of a just-closed server may take a moment
		ln, err = net.Listen("tcp", addr)
		if err == nil || i == 50 {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err != nil {
		srv.Close()
		t.Fatal(err)
	}
	rs := &realServer{Server: srv, Addr: ln.Addr().String(), done: make(chan error, 1)}
	go func() { rs.done <- srv.Serve(ln) }()
	t.Cleanup(rs.Stop)
	return rs
}

// Stop closes the server and waits for Serve to return.
func (rs *realServer) Stop() {
	rs.once.Do(func() {
		rs.Close()
		select {
		case <-rs.done:
		case <-time.After(10 * time.Second):
		}
	})
}

// countingDialer counts the bytes written on each connection it dials.
type countingDialer struct {
	mu    sync.Mutex
	conns []*connCount
}

type connCount struct {
	atomic.Int64             // bytes written
	closed       atomic.Bool // closed by the broker
}

type countedConn struct {
	net.Conn
	n *connCount
}

func (c countedConn) Write(p []byte) (int, error) {
	n, err := c.Conn.Write(p)
	c.n.Add(int64(n))
	return n, err
}

func (c countedConn) Close() error {
	c.n.closed.Store(true)
	return c.Conn.Close()
}

// open returns the counts of the connections not closed.
func (d *countingDialer) open() []*connCount {
	d.mu.Lock()
	defer d.mu.Unlock()
	var out []*connCount
	for _, c := range d.conns {
		if !c.closed.Load() {
			out = append(out, c)
		}
	}
	return out
}

func (d *countingDialer) Dial(ctx context.Context, network, addr string) (net.Conn, error) {
	var nd net.Dialer
	c, err := nd.DialContext(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	n := new(connCount)
	d.mu.Lock()
	d.conns = append(d.conns, n)
	d.mu.Unlock()
	return countedConn{c, n}, nil
}

func TestReal_AcquireRelease(t *testing.T) {
	rs := startServer(t, server.Config{}, "127.0.0.1:0")
	b := newBroker(t, testConfig(rs.Addr))
	tk, err := b.Acquire(t.Context(), "order-42", broker.AcquireOptions{Lease: 30 * s, Wait: 5 * s, Work: 2 * s})
	if err != nil {
		t.Fatal(err)
	}
	if tk.Remaining() < 29*s {
		t.Fatalf("remaining %v", tk.Remaining())
	}
	// wait 0 on a held key: T at once.
	_, err = b.Acquire(t.Context(), "order-42", broker.AcquireOptions{Lease: 30 * s})
	mustIs(t, err, broker.ErrTimedOut)
	// A waiter is granted, with a higher token, when the holder releases.
	got := make(chan *broker.Ticket, 1)
	go func() {
		tk2, err := b.Acquire(t.Context(), "order-42", broker.AcquireOptions{Lease: 30 * s, Wait: 5 * s})
		if err != nil {
			t.Error(err)
		}
		got <- tk2
	}()
	eventually(t, "waiter queued", func() bool { return rs.Stats().Waiters == 1 })
	if err := tk.Release(t.Context()); err != nil {
		t.Fatal(err)
	}
	tk2 := <-got
	if tk2 == nil {
		t.FailNow()
	}
	if tk2.Token() <= tk.Token() {
		t.Fatalf("token %d after %d", tk2.Token(), tk.Token())
	}
	if err := tk2.Release(t.Context()); err != nil {
		t.Fatal(err)
	}
	// A second Release returns the first result and sends nothing.
	if err := tk.Release(t.Context()); err != nil {
		t.Fatal(err)
	}
	if st := rs.Stats(); st.Released != 2 || st.NotHeld != 0 {
		t.Fatalf("stats %+v", st)
	}
	tk3, err := b.Acquire(t.Context(), "order-42", broker.AcquireOptions{Lease: 30 * s})
	if err != nil {
		t.Fatal(err)
	}
	tk3.Release(t.Context())
}

// startCounted starts a real server and a broker whose connections are
// counted, and waits for its two sessions.
func startCounted(t *testing.T) (*realServer, *broker.Broker, *countingDialer) {
	t.Helper()
	rs := startServer(t, server.Config{}, "127.0.0.1:0")
	d := &countingDialer{}
	cfg := testConfig(rs.Addr)
	cfg.Dialer = d.Dial
	b := newBroker(t, cfg)
	eventually(t, "two sessions", func() bool { return b.ReadySessions() == 2 && rs.Stats().Sessions == 2 })
	return rs, b, d
}

func TestReal_RoundRobin(t *testing.T) {
	rs, b, d := startCounted(t)
	// The sessions' connections: a server that answers a version-2 HELLO
	// with E(2) closes those, and the broker retries with version 1.
	conns := d.open()
	if len(conns) != 2 {
		t.Fatalf("%d open connections, want 2", len(conns))
	}
	before := []int64{conns[0].Load(), conns[1].Load()}
	for range 10 {
		tk, err := b.Acquire(t.Context(), "rr", broker.AcquireOptions{Lease: 30 * s})
		if err != nil {
			t.Fatal(err)
		}
		if err := tk.Release(t.Context()); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 2 {
		if conns[i].Load() == before[i] {
			t.Fatalf("session %d carried no request", i)
		}
	}
	if st := rs.Stats(); st.Grants != 10 || st.Released != 10 {
		t.Fatalf("stats %+v", st)
	}
}

func TestReal_ReconnectAfterRestart(t *testing.T) {
	dir := t.TempDir()
	rs := startServer(t, server.Config{DataDir: dir}, "127.0.0.1:0")
	addr := rs.Addr
	b := newBroker(t, testConfig(addr))
	tk, err := b.Acquire(t.Context(), "k", broker.AcquireOptions{Lease: 30 * s})
	if err != nil {
		t.Fatal(err)
	}
	first := tk.Token()
	rs.Stop()
	eventually(t, "sessions down", func() bool { return b.ReadySessions() == 0 })
	_, err = b.Acquire(t.Context(), "k", broker.AcquireOptions{Lease: 30 * s})
	mustIs(t, err, broker.ErrUnsent)
	rs2 := startServer(t, server.Config{DataDir: dir}, addr)
	ctx, cancel := context.WithTimeout(t.Context(), 10*s)
	defer cancel()
	if err := b.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}
	eventually(t, "both sessions back", func() bool { return b.ReadySessions() == 2 })
	tk2, err := b.Acquire(t.Context(), "k", broker.AcquireOptions{Lease: 30 * s}) // locks are not persisted
	if err != nil {
		t.Fatal(err)
	}
	if tk2.Token() <= first {
		t.Fatalf("token went back: %d after %d", tk2.Token(), first)
	}
	tk2.Release(t.Context())
	_ = rs2
}

func TestReal_ClusterWithStandby(t *testing.T) {
	active := startServer(t, server.Config{NodeName: "a"}, "127.0.0.1:0")
	standby := startServer(t, server.Config{NodeName: "b", Standby: true, StandbyHint: active.Addr}, "127.0.0.1:0")
	cfg := testConfig(standby.Addr, active.Addr)
	b := newBroker(t, cfg)
	for range 20 {
		tk, err := b.Acquire(t.Context(), "k", broker.AcquireOptions{Lease: 30 * s})
		if err != nil {
			t.Fatal(err)
		}
		if err := tk.Release(t.Context()); err != nil {
			t.Fatal(err)
		}
	}
	if st := standby.Stats(); st.Grants != 0 {
		t.Fatalf("standby granted %d", st.Grants)
	}
	if st := active.Stats(); st.Grants != 20 || st.Released != 20 {
		t.Fatalf("active stats %+v", st)
	}
	if b.ReadySessions() != 1 {
		t.Fatalf("ready sessions %d, want 1", b.ReadySessions())
	}
	ctx, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
	defer cancel()
	// Only the standby: never ready, and the error says why.
	b2, _ := broker.New(testConfig(standby.Addr))
	defer b2.Close()
	err := b2.WaitReady(ctx)
	mustIs(t, err, broker.ErrNotReady, context.DeadlineExceeded)
	if !strings.Contains(err.Error(), "not active") {
		t.Fatalf("error does not say why: %v", err)
	}
}

func TestReal_Token(t *testing.T) {
	rs := startServer(t, server.Config{ClientTokens: []string{"123", "456"}}, "127.0.0.1:0")
	cfg := testConfig(rs.Addr)
	cfg.Token = "456"
	b := newBroker(t, cfg)
	tk, err := b.Acquire(t.Context(), "k", broker.AcquireOptions{Lease: 30 * s})
	if err != nil {
		t.Fatal(err)
	}
	tk.Release(t.Context())

	cfg.Token = "789"
	b2, _ := broker.New(cfg)
	defer b2.Close()
	err = b2.WaitReady(within(t, 5*s)) // refused for good: returns at once
	mustIs(t, err, broker.ErrUnauthorized)
}

// TestReal_TokenRefusalSaysWhy: a server that requires a client token
// refuses a HELLO without one and one with a wrong one; the error says
// which it was and what to do (the URL carries the token), in WaitReady's
// refusal and in the ErrUnsent of an Acquire without a session.
func TestReal_TokenRefusalSaysWhy(t *testing.T) {
	rs := startServer(t, server.Config{ClientTokens: []string{"right"}}, "127.0.0.1:0")
	for _, tc := range []struct {
		url, want, not string
	}{
		{"ticketing://" + rs.Addr, "no token was sent: put it in the URL as ticketing://TOKEN@host", "token sent was refused"},
		{"ticketing://wrong@" + rs.Addr, "the client token sent was refused", "no token was sent"},
	} {
		cfg, err := broker.ParseURL(tc.url)
		if err != nil {
			t.Fatal(err)
		}
		cfg.BackoffMin, cfg.BackoffMax = 10*time.Millisecond, 50*time.Millisecond
		b, err := broker.New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		defer b.Close()
		err = b.WaitReady(within(t, 5*s))
		mustIs(t, err, broker.ErrUnauthorized)
		if msg := err.Error(); !strings.Contains(msg, tc.want) || strings.Contains(msg, tc.not) || strings.Contains(msg, "wrong") {
			t.Errorf("%s: WaitReady: %q, want it to say %q (and not show the token)", tc.url, msg, tc.want)
		}
		_, err = b.Acquire(t.Context(), "k", broker.AcquireOptions{Lease: 30 * s})
		mustIs(t, err, broker.ErrUnsent)
		if !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: Acquire: %q, want it to say %q", tc.url, err, tc.want)
		}
	}
}

func TestReal_TLS(t *testing.T) {
	pki := newPKI(t)
	rs := startServer(t, server.Config{TLS: pki.ServerTLS}, "127.0.0.1:0")
	try := func(tc broker.TLSConfig) error {
		cfg := testConfig(rs.Addr)
		cfg.TLS = tc
		b, err := broker.New(cfg)
		if err != nil {
			return err
		}
		defer b.Close()
		ctx, cancel := context.WithTimeout(t.Context(), 2*s)
		defer cancel()
		if err := b.WaitReady(ctx); err != nil {
			return err
		}
		tk, err := b.Acquire(t.Context(), "k", broker.AcquireOptions{Lease: 30 * s})
		if err != nil {
			return err
		}
		return tk.Release(t.Context())
	}
	if err := try(broker.TLSConfig{Mode: broker.TLSCAFile, CAFile: pki.CAFile, ServerName: testServerName}); err != nil {
		t.Fatalf("CA file: %v", err)
	}
	if err := try(broker.TLSConfig{Mode: broker.TLSInsecureSkipVerify}); err != nil {
		t.Fatalf("skip verify: %v", err)
	}
	err := try(broker.TLSConfig{Mode: broker.TLSSystemRoots, ServerName: testServerName})
	var ua x509.UnknownAuthorityError
	if !errors.As(err, &ua) {
		t.Fatalf("system roots: want unknown authority, got %v", err)
	}
	t.Logf("system roots refuse the private CA: %v", err)
}

// TestReal_V2CancelKeepsSession: against the real server (protocol version
// 2), 40 acquires wait on one key and every other one is cancelled while
// it waits. The cancelled ones return Indeterminate at once; the broker
// sends CANCEL (the server counts 20) and keeps its sessions (no new
// connection is dialled); the other 20 are granted in turn, none of them
// Indeterminate.
func TestReal_V2CancelKeepsSession(t *testing.T) {
	rs, b, d := startCounted(t)
	dials := func() int { d.mu.Lock(); defer d.mu.Unlock(); return len(d.conns) }
	dialled := dials()

	holder, err := b.Acquire(t.Context(), "v2-cancel", broker.AcquireOptions{Lease: 30 * s})
	if err != nil {
		t.Fatal(err)
	}
	const n = 40
	cancels := make([]context.CancelFunc, n)
	errs := make(chan error, n)
	tickets := make(chan *broker.Ticket, n)
	for i := range n {
		ctx, cancel := context.WithCancel(t.Context())
		cancels[i] = cancel
		go func() {
			tk, err := b.Acquire(ctx, "v2-cancel", broker.AcquireOptions{Lease: 30 * s, Wait: 10 * s})
			if err != nil {
				errs <- err
				return
			}
			tickets <- tk
			tk.Release(context.Background())
		}()
	}
	eventually(t, "40 waiters queued", func() bool { return rs.Stats().Waiters == n })
	for i := 0; i < n; i += 2 {
		cancels[i]()
	}
	for range n / 2 {
		select {
		case err := <-errs:
			mustIs(t, err, broker.ErrIndeterminate)
		case <-time.After(30 * time.Second): // an uncancelled one ends at its 10 s wait, ErrTimedOut: caught above
			t.Fatal("a cancelled acquire did not return at once")
		}
	}
	eventually(t, "20 CANCELs at the server", func() bool { return rs.Stats().Cancelled == n/2 })
	if err := holder.Release(t.Context()); err != nil {
		t.Fatal(err)
	}
	for range n / 2 {
		select {
		case <-tickets:
		case err := <-errs:
			t.Fatalf("an uncancelled waiter got %v", err)
		case <-time.After(10 * time.Second):
			t.Fatal("an uncancelled waiter was not granted")
		}
	}
	for _, c := range cancels {
		c()
	}
	if got := dials(); got != dialled || b.ReadySessions() != 2 || rs.Stats().Sessions != 2 {
		t.Fatalf("connections %d (was %d), ready %d, server sessions %d: a session was redialled or closed", got, dialled, b.ReadySessions(), rs.Stats().Sessions)
	}
}

// TestReal_PlainClientTLSServer: a client configured for plain TCP against
// a server that speaks TLS (a URL without ca= or tls=, say) is told so at
// once: WaitReady returns ErrTLSRequired (a refusal for good) well before
// its context ends, and Acquire's ErrUnsent carries the same cause.
// Before, the server closed each connection after its first bytes, which
// the client read as "reading HELLO reply: EOF", retried, and WaitReady
// ended only with its context, with nothing pointing at TLS.
func TestReal_PlainClientTLSServer(t *testing.T) {
	pki := newPKI(t)
	rs := startServer(t, server.Config{TLS: pki.ServerTLS}, "127.0.0.1:0")
	b, err := broker.New(testConfig(rs.Addr))
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	ctx, cancel := context.WithTimeout(t.Context(), 20*s) // a hang guard
	defer cancel()
	err = b.WaitReady(ctx)
	mustIs(t, err, broker.ErrTLSRequired)
	if errors.Is(err, broker.ErrNotReady) || ctx.Err() != nil {
		t.Fatalf("WaitReady waited for its context: %v", err)
	}
	if !strings.Contains(err.Error(), "ca=") {
		t.Errorf("WaitReady: %v, want a hint at the URL's ca=", err)
	}
	_, err = b.Acquire(t.Context(), "k", broker.AcquireOptions{Lease: 5 * s})
	mustIs(t, err, broker.ErrUnsent)
	if errors.Is(err, broker.ErrTLSRequired) || !strings.Contains(err.Error(), "speaks TLS") {
		t.Errorf("Acquire: %v, want ErrUnsent alone, its message naming TLS", err)
	}
}

// TestReal_TLSClientPlainServer: a client configured for TLS (the URL's
// ca= or tls=) against a server that speaks plain TCP is told so at once:
// WaitReady returns ErrServerNotTLS (a refusal for good) well before its
// context ends, naming the cure, and Acquire's ErrUnsent carries the same
// cause in its message. Before, each TLS handshake failed with "tls: first
// record does not look like a TLS handshake" (the server answers the
// ClientHello with a protocol error), was retried as a passing failure,
// and WaitReady waited out its context (here 20 s).
func TestReal_TLSClientPlainServer(t *testing.T) {
	pki := newPKI(t)
	rs := startServer(t, server.Config{}, "127.0.0.1:0")
	for name, tc := range map[string]broker.TLSConfig{
		"ca file":     {Mode: broker.TLSCAFile, CAFile: pki.CAFile, ServerName: testServerName},
		"skip verify": {Mode: broker.TLSInsecureSkipVerify},
	} {
		t.Run(name, func(t *testing.T) {
			cfg := testConfig(rs.Addr)
			cfg.TLS = tc
			b, err := broker.New(cfg)
			if err != nil {
				t.Fatal(err)
			}
			defer b.Close()
			ctx, cancel := context.WithTimeout(t.Context(), 20*s) // a hang guard
			defer cancel()
			err = b.WaitReady(ctx)
			mustIs(t, err, broker.ErrServerNotTLS)
			if errors.Is(err, broker.ErrNotReady) || ctx.Err() != nil {
				t.Fatalf("WaitReady waited for its context: %v", err)
			}
			if !strings.Contains(err.Error(), "does not speak TLS") || !strings.Contains(err.Error(), "tls-cert") {
				t.Errorf("WaitReady: %v, want it to say the server does not speak TLS and how to fix it", err)
			}
			_, err = b.Acquire(t.Context(), "k", broker.AcquireOptions{Lease: 5 * s})
			mustIs(t, err, broker.ErrUnsent)
			if errors.Is(err, broker.ErrServerNotTLS) || !strings.Contains(err.Error(), "does not speak TLS") {
				t.Errorf("Acquire: %v, want ErrUnsent alone, its message naming TLS", err)
			}
		})
	}
}
