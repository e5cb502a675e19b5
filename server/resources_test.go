package server_test

import (
	"bytes"
	"errors"
	"io"
	"log/slog"
	"net"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ticketing-dev/ticketing/broker"
	"github.com/ticketing-dev/ticketing/internal/wire"
	"github.com/ticketing-dev/ticketing/server"
)

// dialFrom dials addr from the loopback address local (127.0.0.x), so that a
// test can play several peer addresses.
func dialFrom(t testing.TB, local, addr string) *client {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(local)}}
	nc, err := d.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	return wrap(t, nc)
}

// TestIdleTimeoutDropsStalledSession: a session that sends HELLO and then
// part of a frame is dropped with E(1) "idle timeout" once IdleTimeout has
// passed without a complete frame; a session that sends a PING more often
// than that stays, and the freed slot is usable.
func TestIdleTimeoutDropsStalledSession(t *testing.T) {
	const idle = 300 * time.Millisecond
	s, addr := startServer(t, server.Config{IdleTimeout: idle, MaxSessions: 2})
	stalled := session(t, addr)
	stalled.sendRaw([]byte{0, 0, 0}) // part of a length prefix, then nothing
	kept := session(t, addr)

	start := time.Now()
	done := make(chan wire.Response, 1)
	go func() {
		r, _ := stalled.recvErr(10 * time.Second)
		done <- r
	}()
	var r wire.Response
	for id := uint32(1); ; id++ {
		select {
		case r = <-done:
		case <-time.After(idle / 3):
			kept.send(ping(id))
			kept.expect(wire.TypePong, id)
			continue
		}
		break
	}
	if r.Type != wire.TypeError || r.Code != wire.CodeMalformed || r.ReqID != 0 || string(r.Msg) != "idle timeout" {
		t.Fatalf("stalled session got %s, want E(1) req 0 \"idle timeout\"", show(r))
	}
	if el := time.Since(start); el < idle {
		t.Fatalf("dropped after %v, before the idle timeout %v", el, idle)
	}
	stalled.expectClosed()
	// The pinging session is still there, and the slot is free again.
	kept.send(ping(1000))
	kept.expect(wire.TypePong, 1000)
	eventually(t, "one session", func() bool { return s.Stats().Sessions == 1 })
	session(t, addr)
}

// TestIdleTimeoutSparesWaitingSession: a raw-frame client that sends
// nothing while its ACQUIRE waits (1 s, over twice the idle timeout) is not
// dropped: it gets its G (the key frees while it waits) or its T (the wait
// runs out), even with a partly sent frame behind the ACQUIRE. From that
// reply on, the idle clock runs again: with no further frame the session is
// dropped with E(1) "idle timeout" an idle timeout after the reply.
func TestIdleTimeoutSparesWaitingSession(t *testing.T) {
	const idle = 400 * time.Millisecond
	_, addr := startServer(t, server.Config{IdleTimeout: idle})
	holder := session(t, addr)
	holder.acquireOK(1, owner(1), 0, 1, "frees") // lease 1 s: granted to a waiter
	holder.acquireOK(2, owner(1), 0, 3, "stays") // lease 3 s: the waiter gets T
	holder.nc.Close()                            // its grants stay

	type result struct {
		reply, last wire.Response
		sinceReply  time.Duration
		err         error
	}
	wait := func(c *client) <-chan result {
		ch := make(chan result, 1)
		go func() {
			var res result
			if res.reply, res.err = c.recvErr(5 * time.Second); res.err != nil {
				ch <- res
				return
			}
			at := time.Now()
			res.last, res.err = c.recvErr(5 * time.Second)
			res.sinceReply = time.Since(at)
			ch <- res
		}()
		return ch
	}
	g := session(t, addr)
	g.send(acq(10, owner(2), 3, 1, "frees"))
	gRes := wait(g)
	tm := session(t, addr)
	tm.send(acq(20, owner(3), 1, 1, "stays"))
	tm.sendRaw([]byte{0, 0, 0}) // part of a length prefix, then nothing
	tRes := wait(tm)

	for _, w := range []struct {
		name  string
		ch    <-chan result
		typ   byte
		reqID uint32
	}{{"granted", gRes, wire.TypeGranted, 10}, {"timed out", tRes, wire.TypeTimedOut, 20}} {
		res := <-w.ch
		if res.err != nil && res.reply.Type == 0 {
			t.Fatalf("%s waiter: %v", w.name, res.err)
		}
		if res.reply.Type != w.typ || res.reply.ReqID != w.reqID {
			t.Fatalf("%s waiter got %s, want %c req %d", w.name, show(res.reply), w.typ, w.reqID)
		}
		if res.err != nil {
			t.Fatalf("%s waiter, after its reply: %v, want E(1) \"idle timeout\"", w.name, res.err)
		}
		if r := res.last; r.Type != wire.TypeError || r.Code != wire.CodeMalformed || r.ReqID != 0 || string(r.Msg) != "idle timeout" {
			t.Fatalf("%s waiter, after its reply, got %s, want E(1) req 0 \"idle timeout\"", w.name, show(r))
		}
		t.Logf("%s waiter: %s, then E(1) \"idle timeout\" %v after it", w.name, show(res.reply), res.sinceReply)
		// Both times are taken by the client; a tenth of the timeout
		// allows for it reading the reply late.
		if res.sinceReply < idle-idle/10 {
			t.Fatalf("%s waiter dropped %v after its reply, before the idle timeout %v", w.name, res.sinceReply, idle)
		}
	}
	g.expectClosed()
	tm.expectClosed()
}

// TestIdleTimeoutKeepsBrokerSessions: the broker's keepalive PINGs keep
// its session open through several idle timeouts (scaled down: PINGs every
// 100 ms, timeout 300 ms, as the defaults are 10 s and 30 s), also while an
// ACQUIRE waits.
func TestIdleTimeoutKeepsBrokerSessions(t *testing.T) {
	if server.DefaultIdleTimeout < 3*broker.DefaultKeepAlive {
		t.Fatalf("DefaultIdleTimeout %v is below three broker keepalive intervals (%v)", server.DefaultIdleTimeout, broker.DefaultKeepAlive)
	}
	s, addr := startServer(t, server.Config{IdleTimeout: 300 * time.Millisecond})
	b, err := broker.New(broker.Config{Addrs: []string{addr}, KeepAlive: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if err := b.WaitReady(t.Context()); err != nil {
		t.Fatal(err)
	}
	held, err := b.Acquire(t.Context(), "k", broker.AcquireOptions{Lease: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	// Waits 2 s (over six idle timeouts) for k, then gets T.
	if _, err := b.Acquire(t.Context(), "k", broker.AcquireOptions{Lease: 10 * time.Second, Wait: 1500 * time.Millisecond}); !errors.Is(err, broker.ErrTimedOut) {
		t.Fatalf("Acquire on a held key: %v, want ErrTimedOut", err)
	}
	if err := held.Release(t.Context()); err != nil {
		t.Fatal(err)
	}
	if st := s.Stats(); st.ProtocolErrors != 0 {
		t.Fatalf("stats %+v: the broker's session was dropped", st)
	}
}

// TestMaxSessionsPerPeer: past MaxSessionsPerPeer sessions from one address
// HELLO gets E(7); other addresses still get sessions, and a closed session
// frees its address's slot.
func TestMaxSessionsPerPeer(t *testing.T) {
	s, addr := startServer(t, server.Config{MaxSessions: 10, MaxSessionsPerPeer: 2})
	a := dialFrom(t, "127.0.0.1", addr)
	a.hello("")
	b := dialFrom(t, "127.0.0.1", addr)
	b.hello("")
	c := dialFrom(t, "127.0.0.1", addr)
	c.send(helloReq(7, ""))
	c.expectError(wire.CodeTooManySession, 7)
	for _, ip := range []string{"127.0.0.2", "127.0.0.2", "127.0.0.3"} {
		dialFrom(t, ip, addr).hello("")
	}
	a.nc.Close()
	eventually(t, "a's slot", func() bool { return s.Stats().Sessions == 4 })
	dialFrom(t, "127.0.0.1", addr).hello("")
}

// TestMaxSessionsPerPeerDefault: by default one address gets a quarter of
// MaxSessions (here 400 / 4 = 100).
func TestMaxSessionsPerPeerDefault(t *testing.T) {
	_, addr := startServer(t, server.Config{MaxSessions: 400})
	for range 100 {
		session(t, addr)
	}
	c := dial(t, addr)
	c.send(helloReq(1, ""))
	c.expectError(wire.CodeTooManySession, 1)
	dialFrom(t, "127.0.0.2", addr).hello("")
}

// TestPendingConnsCapped: connections that have not sent HELLO are limited
// by MaxPendingConns: one beyond is closed at once without a reply, and the
// sessions and the slot freed by a HELLO are unaffected.
func TestPendingConnsCapped(t *testing.T) {
	s, addr := startServer(t, server.Config{MaxPendingConns: 3})
	live := session(t, addr)
	var idle []*client
	for range 3 {
		idle = append(idle, dial(t, addr))
	}
	eventually(t, "3 pending", func() bool { return s.Stats().Pending == 3 })
	extra := dial(t, addr)
	if _, err := extra.recvErr(5 * time.Second); !errors.Is(err, io.EOF) && !isReset(err) {
		t.Fatalf("connection beyond MaxPendingConns: %v, want closed", err)
	}
	live.send(ping(2))
	live.expect(wire.TypePong, 2)
	idle[0].hello("")
	eventually(t, "2 pending", func() bool { return s.Stats().Pending == 2 })
	session(t, addr)
}

// TestPendingConnsPerPeer: one address may hold a quarter of
// MaxPendingConns (at least 64) before HELLO, so that it cannot keep other
// addresses from connecting.
func TestPendingConnsPerPeer(t *testing.T) {
	s, addr := startServer(t, server.Config{MaxPendingConns: 300})
	for range 75 {
		dial(t, addr)
	}
	eventually(t, "75 pending", func() bool { return s.Stats().Pending == 75 })
	extra := dialFrom(t, "127.0.0.1", addr)
	if _, err := extra.recvErr(5 * time.Second); !errors.Is(err, io.EOF) && !isReset(err) {
		t.Fatalf("connection beyond the per-address share: %v, want closed", err)
	}
	dialFrom(t, "127.0.0.2", addr).hello("")
}

// TestPendingConnsCostOneGoroutine: a connection before HELLO runs only its
// reader goroutine; the writer starts with HELLO_OK.
func TestPendingConnsCostOneGoroutine(t *testing.T) {
	s, addr := startServer(t, server.Config{})
	const n = 100
	before := runtime.NumGoroutine()
	for range n {
		dial(t, addr)
	}
	eventually(t, "pending", func() bool { return s.Stats().Pending == n })
	if d := runtime.NumGoroutine() - before; d > n+n/4 {
		t.Fatalf("%d pending connections run %d goroutines, want about one each", n, d)
	}
}

// TestWriteTimeoutDefaultDropsNonReader: with the default settings a
// session that stops reading while replies are pending is dropped within a
// few seconds (it used to take 10 s, the while the kernel buffered megabytes).
func TestWriteTimeoutDefaultDropsNonReader(t *testing.T) {
	s, addr := startServer(t, server.Config{})
	nc, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	nc.(*net.TCPConn).SetReadBuffer(4 << 10)
	c := wrap(t, nc)
	c.hello("")
	// 40,000 PONGs (360 KB): more than the socket buffers hold, less than
	// the output buffer (1 MiB), so only the write timeout can drop it.
	var batch []byte
	for i := range uint32(40_000) {
		r := ping(i + 10)
		batch, _ = wire.AppendRequest(batch, &r)
	}
	start := time.Now()
	c.sendRaw(batch)
	for s.Stats().Sessions != 0 {
		if time.Since(start) > 8*time.Second {
			t.Fatal("a session that does not read was not dropped within 8 s")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestWriteTimeoutSlowReaderKept: a peer that reads slowly but steadily is
// not dropped although draining its replies takes several WriteTimeouts:
// the timeout is for no progress, not for the whole backlog.
func TestWriteTimeoutSlowReaderKept(t *testing.T) {
	const wt = 500 * time.Millisecond
	_, addr := startServer(t, server.Config{WriteTimeout: wt, SocketBuffer: 32 << 10})
	nc, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	nc.(*net.TCPConn).SetReadBuffer(32 << 10)
	c := wrap(t, nc)
	c.hello("")
	const n = 60_000 // 540 KB of PONGs, read at about 400 KB/s
	var batch []byte
	for i := range uint32(n) {
		r := ping(i + 10)
		batch, _ = wire.AppendRequest(batch, &r)
	}
	go func() { nc.Write(batch) }()
	start := time.Now()
	buf := make([]byte, 8<<10)
	got := 0
	for got < n*9 {
		nc.SetReadDeadline(time.Now().Add(5 * time.Second))
		k, err := io.ReadFull(nc, buf[:min(len(buf), n*9-got)])
		got += k
		if err != nil {
			t.Fatalf("after %d of %d bytes (%v): %v", got, n*9, time.Since(start), err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Logf("drained in %v", time.Since(start))
}

// syncBuffer is a log destination for tests.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *syncBuffer) count(s string) int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return strings.Count(b.b.String(), s)
}

// helloFrom dials from local, sends HELLO with tok and returns the reply,
// or an error if the connection closed without one.
func helloFrom(local, addr, tok string) (wire.Response, error) {
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(local)}}
	nc, err := d.Dial("tcp", addr)
	if err != nil {
		return wire.Response{}, err
	}
	defer nc.Close()
	b, _ := wire.AppendRequest(nil, &wire.Request{Type: wire.TypeHello, ReqID: 1, Version: wire.Version, AuthToken: []byte(tok)})
	if _, err := nc.Write(b); err != nil {
		return wire.Response{}, err
	}
	nc.SetReadDeadline(time.Now().Add(10 * time.Second))
	body, err := wire.NewReader(nc).Next()
	if err != nil {
		return wire.Response{}, err
	}
	var r wire.Response
	err = wire.DecodeResponse(body, &r)
	return r, err
}

// TestAuthFailureFloodThrottled: a peer that floods HELLOs with a wrong
// token from many connections at once gets few E(3) (the rest are
// delayed), its HELLOs with the right token still succeed at once, another
// address's failure is answered E(3), and the log stays short.
func TestAuthFailureFloodThrottled(t *testing.T) {
	logs := &syncBuffer{}
	s, addr := startServer(t, server.Config{ClientTokens: []string{"right"}, Logger: slog.New(slog.NewJSONHandler(logs, nil))})
	var e3, closed atomic.Int64
	var stop atomic.Bool
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for !stop.Load() {
				r, err := helloFrom("127.0.0.1", addr, "wrong")
				switch {
				case err == nil && r.Type == wire.TypeError && r.Code == wire.CodeUnauthorized:
					e3.Add(1)
				case err != nil:
					closed.Add(1)
				default:
					t.Errorf("wrong token got %s", show(r))
					return
				}
			}
		}()
	}
	time.Sleep(time.Second)
	if r, err := helloFrom("127.0.0.1", addr, "right"); err != nil || r.Type != wire.TypeHelloOK {
		t.Errorf("right token from the flooding address during the flood: %s, %v", show(r), err)
	}
	if r, err := helloFrom("127.0.0.2", addr, "nope"); err != nil || r.Type != wire.TypeError || r.Code != wire.CodeUnauthorized {
		t.Errorf("wrong token from another address during the flood: %s, %v; want E(3)", show(r), err)
	}
	time.Sleep(500 * time.Millisecond)
	stop.Store(true)
	wg.Wait()
	// ~1.5 s of flood: 20 free failures, then delays doubling from 10 ms
	// to 500 ms, answers serialised (about 6 within 1 s); the rest wait 1 s
	// beside the queue (one per flooder at a time, so at most 2 x 8).
	if n := e3.Load(); n > 60 {
		t.Errorf("flooding peer got %d E(3) in 1.5 s (and %d closes), want at most 60", n, closed.Load())
	}
	if n := logs.count(`"protocol violation"`); n > 2 {
		t.Errorf("%d protocol violation lines logged over the flood, want at most 2", n)
	}
	t.Logf("E(3) %d, closed unanswered %d, stats %+v", e3.Load(), closed.Load(), s.Stats())
}

// TestPeerLogLinesRateLimited: over a flood of protocol violations from
// many addresses, a bounded number of lines is logged in full and the rest
// is summed up, with counts per peer, in one line.
func TestPeerLogLinesRateLimited(t *testing.T) {
	logs := &syncBuffer{}
	s, err := server.New(server.Config{DataDir: t.TempDir(), ClientTokens: []string{"right"}, Logger: slog.New(slog.NewJSONHandler(logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	ln := listen(t)
	done := make(chan error, 1)
	go func() { done <- s.Serve(ln) }()
	addr := ln.Addr().String()
	const peers, each = 50, 5 // within the free failures of each address
	for p := range peers {
		for range each {
			ip := net.IPv4(127, 0, 1, byte(p+1)).String()
			if r, err := helloFrom(ip, addr, "wrong"); err != nil || r.Code != wire.CodeUnauthorized {
				t.Fatalf("HELLO from %s: %s %v", ip, show(r), err)
			}
		}
	}
	full := logs.count(`"protocol violation"`)
	s.Close() // writes the summary
	<-done
	if full > 20 {
		t.Errorf("%d of %d violations logged in full, want at most 20", full, peers*each)
	}
	if n := logs.count(`"log lines about peers suppressed (rate limit)"`); n != 1 {
		t.Fatalf("%d summary lines, want 1; log:\n%s", n, logs.b.String())
	}
	if !strings.Contains(logs.b.String(), `"suppressed":`+strconv.Itoa(peers*each-full)) {
		t.Errorf("summary does not count %d suppressed lines:\n%s", peers*each-full, logs.b.String())
	}
	if !strings.Contains(logs.b.String(), "127.0.1.21=5") {
		t.Errorf("summary has no per-peer count:\n%s", logs.b.String())
	}
}

// TestConnBudget: Config.ConnBudget caps the connections of every
// listener together: on the lock port, sessions and connections before
// HELLO take its units but the last one (kept for loopback on a
// BudgetListener); one beyond is closed at once and counted; a
// BudgetListener's connection from 127.0.0.1 takes the kept unit; a closed
// connection gives its unit back.
func TestConnBudget(t *testing.T) {
	s, addr := startServer(t, server.Config{ConnBudget: 4})
	live := session(t, addr)
	idle := dial(t, addr)
	idle2 := dial(t, addr)
	eventually(t, "3 units in use", func() bool { return s.Stats().ConnBudgetInUse == 3 })
	extra := dial(t, addr)
	if _, err := extra.recvErr(5 * time.Second); !errors.Is(err, io.EOF) && !isReset(err) {
		t.Fatalf("connection beyond the budget: %v, want closed", err)
	}
	if st := s.Stats(); st.ConnBudget != 4 || st.ConnBudgetRefused != 1 {
		t.Fatalf("stats: budget %d refused %d, want 4 and 1", st.ConnBudget, st.ConnBudgetRefused)
	}
	live.send(ping(2))
	live.expect(wire.TypePong, 2)

	// Another listener, sharing the budget: loopback takes the kept unit.
	raw, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ln := s.BudgetListener(raw, "test")
	defer ln.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, err := ln.Accept()
		if err == nil {
			accepted <- c
		}
		close(accepted)
	}()
	dialFrom(t, "127.0.0.1", raw.Addr().String())
	other := <-accepted
	if other == nil {
		t.Fatal("loopback refused the kept unit")
	}
	defer other.Close()
	if n := s.Stats().ConnBudgetInUse; n != 4 {
		t.Fatalf("units in use %d, want 4", n)
	}

	// Units given back: the strangers' share counts the kept unit in use.
	idle.nc.Close()
	idle2.nc.Close()
	eventually(t, "two units given back", func() bool { return s.Stats().ConnBudgetInUse == 2 })
	session(t, addr)
}
