package server_test

import (
	"errors"
	"io"
	"net"
	"testing"
	"time"

	"github.com/ticketing-dev/ticketing/server"
)

// rawFrom connects to addr from the IP src (any of 127.0.0.0/8 on Linux).
func rawFrom(t *testing.T, src, addr string) net.Conn {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}, Timeout: 10 * time.Second}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		t.Fatalf("dial %s from %s: %v", addr, src, err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// closedBy reads c until the server closes it, and reports whether it did
// before guard passed.
func closedBy(c net.Conn, guard time.Duration) bool {
	c.SetReadDeadline(time.Now().Add(guard))
	_, err := io.ReadAll(c)
	var ne net.Error
	return !(errors.As(err, &ne) && ne.Timeout())
}

// TestPairPeerListenerCaps: over real sockets, strangers that connect to
// a pair node's peer listener and say nothing hold at most
// MaxPeerConnsPerSource connections from one address and MaxPeerConns over
// all: further connections are closed at once (here well before the hello
// deadline, a minute), and the configured peer (127.0.0.1, the host of
// PairConfig.Peer) still links up in its own slots. The strangers connect
// from 127.0.0.2 to 127.0.0.4.
func TestPairPeerListenerCaps(t *testing.T) {
	pa, ba := pairAddrs(t)
	ln := listen(t)
	cfg := server.Config{DataDir: t.TempDir(), Pair: &server.PairConfig{Role: server.PairPrimary, Peer: ba, Listen: pa,
		Advertise: ln.Addr().String(), Heartbeat: pairHB,
		MaxPeerConns: 4, MaxPeerConnsPerSource: 2, HelloTimeout: time.Minute}}
	s, err := server.New(cfg)
	if err != nil {
		ln.Close()
		t.Fatal(err)
	}
	p := &pairNode{t: t, s: s, addr: ln.Addr().String(), peer: pa, cfg: cfg, done: make(chan error, 1)}
	go func() { p.done <- s.Serve(ln) }()
	t.Cleanup(p.close)

	// Accepted in the order they were made: each check follows the
	// connections that hold the slots.
	for _, src := range []string{"127.0.0.2", "127.0.0.2"} {
		rawFrom(t, src, pa)
	}
	if !closedBy(rawFrom(t, "127.0.0.2", pa), 20*time.Second) {
		t.Fatal("a third silent connection from 127.0.0.2 (per-source limit 2) still open, want closed at accept")
	}
	for _, src := range []string{"127.0.0.3", "127.0.0.3"} {
		rawFrom(t, src, pa)
	}
	if !closedBy(rawFrom(t, "127.0.0.4", pa), 20*time.Second) {
		t.Fatal("a connection from 127.0.0.4 beyond MaxPeerConns (4) still open, want closed at accept")
	}

	// The peer links up while the strangers hold every shared slot: the
	// primary hears its heartbeats on the link it accepted.
	b := startPairNode(t, server.PairBackup, ba, pa, "")
	eventually(t, "the primary hearing its backup", func() bool {
		st := p.status()
		return st.PeerAlive && st.PeerState == "PASSIVE" && b.status().State == "PASSIVE"
	})
}

// TestPairPeerHelloDeadline: a connection to the peer listener that says
// nothing is closed at the hello deadline (two heartbeats by default).
func TestPairPeerHelloDeadline(t *testing.T) {
	pa, ba := pairAddrs(t)
	startPairNode(t, server.PairPrimary, pa, ba, "")
	if !closedBy(rawFrom(t, "127.0.0.2", pa), 30*time.Second) {
		t.Fatal("a silent connection to the peer listener is still open long after the hello deadline")
	}
}
