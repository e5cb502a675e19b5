package server

import (
	"bytes"
	"crypto/tls"
	"io"
	"net"
	"net/netip"
	"runtime"
	"syscall"
	"testing"
	"time"

	"github.com/ticketing-dev/ticketing/internal/connlimit"
	"github.com/ticketing-dev/ticketing/internal/pki"
	"github.com/ticketing-dev/ticketing/internal/wire"
)

// tcpPair returns the two ends of a loopback TCP connection.
func tcpPair(t *testing.T) (server, client *net.TCPConn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	acc := make(chan net.Conn, 1)
	go func() {
		c, _ := ln.Accept()
		acc <- c
	}()
	cl, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	sc := <-acc
	if sc == nil {
		t.Fatal("accept failed")
	}
	t.Cleanup(func() { sc.Close(); cl.Close() })
	return sc.(*net.TCPConn), cl.(*net.TCPConn)
}

// TestWriteTimeoutCountsProgress: a backlog of replies that takes a peer
// reading slowly but steadily several WriteTimeouts to drain is delivered
// whole: the timeout is for a write making no progress, not for the whole
// backlog (which can be OutputBuffer, 1 MiB, at once).
func TestWriteTimeoutCountsProgress(t *testing.T) {
	const wt = 500 * time.Millisecond
	s, err := New(Config{DataDir: t.TempDir(), WriteTimeout: wt, SocketBuffer: 32 << 10})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	sc, cl := tcpPair(t)
	sc.SetWriteBuffer(32 << 10)
	cl.SetReadBuffer(32 << 10)
	c := s.newConn(sc, peerOf(sc.RemoteAddr()))
	c.started = true
	go c.writeLoop()
	defer func() { c.kill(); <-c.writerDone }()

	payload := bytes.Repeat([]byte("0123456789abcdef"), 600<<10/16) // 600 KB, read at ~400 KB/s
	c.mu.Lock()
	c.out = append(c.out, payload...)
	c.mu.Unlock()
	c.signal()

	start := time.Now()
	got := make([]byte, 0, len(payload))
	buf := make([]byte, 8<<10)
	for len(got) < len(payload) {
		cl.SetReadDeadline(time.Now().Add(5 * time.Second))
		n, err := io.ReadFull(cl, buf[:min(len(buf), len(payload)-len(got))])
		got = append(got, buf[:n]...)
		if err != nil {
			t.Fatalf("after %d of %d bytes (%v): %v", len(got), len(payload), time.Since(start), err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if !bytes.Equal(got, payload) {
		t.Fatal("payload corrupted")
	}
	t.Logf("drained in %v with WriteTimeout %v", time.Since(start), wt)
}

func sockBuf(t *testing.T, nc net.Conn, opt int) int {
	t.Helper()
	if tc, ok := nc.(*tls.Conn); ok {
		nc = tc.NetConn()
	}
	rc, err := connlimit.NetConnOf(nc).(*net.TCPConn).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var v int
	var serr error
	rc.Control(func(fd uintptr) { v, serr = syscall.GetsockoptInt(int(fd), syscall.SOL_SOCKET, opt) })
	if serr != nil {
		t.Fatal(serr)
	}
	return v
}

// TestSocketBuffersCapped: every accepted connection, plain or TLS, gets
// SocketBuffer as its kernel send and receive buffer (Linux reports twice
// the value set), instead of autotuned buffers of up to megabytes.
func TestSocketBuffersCapped(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("checks Linux's SO_SNDBUF accounting")
	}
	ca, err := pki.NewCA("test CA", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := ca.Issue(pki.Server, []string{"127.0.0.1"}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		tls  bool
	}{{"plain", false}, {"tls", true}} {
		t.Run(tc.name, func(t *testing.T) {
			const size = 48 << 10
			cfg := Config{DataDir: t.TempDir(), SocketBuffer: size}
			if tc.tls {
				cfg.TLS = &tls.Config{Certificates: []tls.Certificate{leaf.TLSCertificate()}}
			}
			s, err := New(cfg)
			if err != nil {
				t.Fatal(err)
			}
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			done := make(chan error, 1)
			go func() { done <- s.Serve(ln) }()
			defer func() { s.Close(); <-done }()
			var nc net.Conn
			if tc.tls {
				nc, err = tls.Dial("tcp", ln.Addr().String(), &tls.Config{RootCAs: ca.Pool(), ServerName: "127.0.0.1"})
			} else {
				nc, err = net.Dial("tcp", ln.Addr().String())
			}
			if err != nil {
				t.Fatal(err)
			}
			defer nc.Close()
			hello, _ := wire.AppendRequest(nil, &wire.Request{Type: wire.TypeHello, ReqID: 1, Version: wire.Version})
			nc.Write(hello)
			if _, err := wire.NewReader(nc).Next(); err != nil {
				t.Fatal(err)
			}
			s.mu.Lock()
			var sc *conn
			for c := range s.conns {
				sc = c
			}
			s.mu.Unlock()
			if snd, rcv := sockBuf(t, sc.nc, syscall.SO_SNDBUF), sockBuf(t, sc.nc, syscall.SO_RCVBUF); snd != 2*size || rcv != 2*size {
				t.Fatalf("SO_SNDBUF %d, SO_RCVBUF %d; want %d (2 x SocketBuffer)", snd, rcv, 2*size)
			}
		})
	}
}

// TestAuthThrottleBounds: for one address, failures at one instant get
// authFree immediate answers, then a serialised queue of at most
// authMaxQueue, then authMaxWaiting waits beside it, and the rest no answer;
// another address is not affected, and the waits beside the queue are
// given back.
func TestAuthThrottleBounds(t *testing.T) {
	var at authThrottle
	now := time.Now()
	a, b := netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("10.0.0.2")
	var free, queued, beside, refused int
	var held []*authPeer
	for range 1000 {
		w, h, ok := at.failure(a, now)
		switch {
		case !ok:
			refused++
		case h != nil:
			beside++
			held = append(held, h)
			if w != authMaxQueue {
				t.Fatalf("wait beside the queue %v", w)
			}
		case w == 0:
			free++
		default:
			queued++
			if w > authMaxQueue {
				t.Fatalf("queued wait %v", w)
			}
		}
	}
	if free != authFree || queued > 10 || beside != authMaxWaiting || free+queued+beside+refused != 1000 {
		t.Fatalf("free %d queued %d beside %d refused %d", free, queued, beside, refused)
	}
	if w, h, ok := at.failure(b, now); w != 0 || h != nil || !ok {
		t.Fatalf("another address: wait %v held %v ok %v", w, h, ok)
	}
	for _, h := range held {
		at.done(h)
	}
	if _, h, ok := at.failure(a, now); !ok || h == nil {
		t.Fatal("the waits beside the queue were not given back")
	}
}

// TestCloseBeforeHelloDeadline: a connection that Shutdown closes (E(5))
// before its goroutine has set the HELLO deadline is closed at once, not
// after HelloTimeout: setting that deadline must not undo closeWith's wake-up.
func TestCloseBeforeHelloDeadline(t *testing.T) {
	s, err := New(Config{DataDir: t.TempDir(), HelloTimeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	sc, cl := tcpPair(t)
	peer := peerOf(sc.RemoteAddr())
	pt, ok := s.addPending(peer)
	if !ok {
		t.Fatal("addPending refused")
	}
	c := s.newConn(sc, peer)
	c.pendingT = pt
	s.mu.Lock()
	s.conns[c] = struct{}{}
	s.mu.Unlock()
	s.wg.Add(1)
	c.closeWith(wire.AppendError(nil, 0, wire.CodeShuttingDown, "shutting down")) // before serve runs
	done := make(chan struct{})
	go func() { c.serve(); close(done) }()
	cl.SetReadDeadline(time.Now().Add(10 * time.Second)) // a hang guard (HelloTimeout is a minute)
	body, err := wire.NewReader(cl).Next()
	if err != nil {
		t.Fatalf("no E(5) before the guard: %v", err)
	}
	var r wire.Response
	if err := wire.DecodeResponse(body, &r); err != nil || r.Type != wire.TypeError || r.Code != wire.CodeShuttingDown {
		t.Fatalf("got %+v (%v), want E(5)", r, err)
	}
	cl.Close()
	<-done
}
