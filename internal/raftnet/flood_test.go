package raftnet_test

import (
	"errors"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ticketing-dev/ticketing/internal/raft"

	"github.com/ticketing-dev/ticketing/internal/raftnet"
)

// The tests below give each transport and each stranger a loopback address
// of its own (127.0.0.x), as hosts on a network have: the handshake slots
// are allotted by source address. The strangers' connections stall their
// handshakes for the whole test (HandshakeTimeout is a minute), so that
// whatever slot they hold stays held: a peer that gets through does so
// while they hold every slot they can.

// loopback returns "ip:0" after checking that the host can listen on ip
// (every 127.0.0.0/8 address is local on Linux; other systems may have
// only 127.0.0.1).
func loopback(t *testing.T, ip string) string {
	t.Helper()
	ln, err := net.Listen("tcp", ip+":0")
	if err != nil {
		t.Skipf("no loopback address %s: %v", ip, err)
	}
	_ = ln.Close()
	return ip + ":0"
}

// idleFlood opens n TCP connections to target, from the sources in turn,
// and sends nothing on them. It returns once every connection is
// established (queued at the target's listener, before any later one).
func idleFlood(t *testing.T, target raft.ServerAddress, sources []string, n int) []net.Conn {
	t.Helper()
	conns := make([]net.Conn, 0, n)
	for i := range n {
		d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(sources[i%len(sources)])}, Timeout: waitFor}
		c, err := d.Dial("tcp", string(target))
		if err != nil {
			t.Fatalf("stranger's connection %d: %v", i, err)
		}
		conns = append(conns, c)
	}
	t.Cleanup(func() {
		for _, c := range conns {
			_ = c.Close()
		}
	})
	return conns
}

// stillOpen counts the connections that the node has not closed. The node
// refuses a connection at once, so by the time it has accepted a later one
// (a peer's ping) the refused ones have ended; deadline only bounds the
// reads of those left open.
func stillOpen(conns []net.Conn) int {
	deadline := time.Now().Add(200 * time.Millisecond)
	var wg sync.WaitGroup
	var mu sync.Mutex
	var open int
	for _, c := range conns {
		wg.Go(func() {
			_ = c.SetReadDeadline(deadline)
			_, err := c.Read(make([]byte, 1))
			if ne, ok := errors.AsType[net.Error](err); ok && ne.Timeout() {
				mu.Lock()
				open++
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	return open
}

func strangerIPs(first, n int) []string {
	ips := make([]string, n)
	for i := range n {
		ips[i] = net.IPv4(127, 0, 0, byte(first+i)).String()
	}
	return ips
}

// TestFloodFromOneSourceLeavesRoom floods a node with 100 stalled
// connections from one address, more than every handshake slot: the
// address gets MaxHandshakesPerSource of them, and a peer from another
// address gets through at once.
func TestFloodFromOneSourceLeavesRoom(t *testing.T) {
	ca := newCA(t)
	a := newTransport(t, raftnet.Config{BindAddr: loopback(t, "127.0.0.21"), TLS: peerTLS(t, ca, "127.0.0.21"),
		HandshakeTimeout: time.Minute})
	respond(t, a)
	b := newTransport(t, raftnet.Config{BindAddr: loopback(t, "127.0.0.22"), TLS: peerTLS(t, ca, "127.0.0.22")})
	flood := idleFlood(t, a.LocalAddr(), strangerIPs(140, 1), 100)
	if err := ping(b, a); err != nil {
		t.Fatalf("a peer could not connect while one stranger stalls 100 handshakes: %v", err)
	}
	if open := stillOpen(flood); open != 8 {
		t.Errorf("the stranger holds %d handshakes, want MaxHandshakesPerSource (8)", open)
	}
}

// TestMembersKeepSlotsUnderFlood floods a node with 80 stalled connections
// from 40 addresses, 2 from each: they take every shared slot (64), so a
// peer that is not a member is refused, but a member has slots of its own
// and gets through.
func TestMembersKeepSlotsUnderFlood(t *testing.T) {
	ca := newCA(t)
	b := newTransport(t, raftnet.Config{BindAddr: loopback(t, "127.0.0.32"), TLS: peerTLS(t, ca, "127.0.0.32")})
	lb := &logBuf{}
	a := newTransport(t, raftnet.Config{BindAddr: loopback(t, "127.0.0.31"), TLS: peerTLS(t, ca, "127.0.0.31"),
		HandshakeTimeout: time.Minute, Logger: captured(lb),
		Members: func() []raft.ServerAddress { return []raft.ServerAddress{"127.0.0.31:7225", b.LocalAddr()} }})
	respond(t, a)
	c := newTransport(t, raftnet.Config{BindAddr: loopback(t, "127.0.0.33"), TLS: peerTLS(t, ca, "127.0.0.33")})
	flood := idleFlood(t, a.LocalAddr(), strangerIPs(140, 40), 80)
	if err := ping(c, a); err == nil {
		t.Fatal("a non-member got through: the flood did not take the shared slots")
	}
	if err := ping(b, a); err != nil {
		t.Fatalf("a member could not connect while strangers hold every shared slot: %v", err)
	}
	if open := stillOpen(flood); open != 64 {
		t.Errorf("the strangers hold %d handshakes, want MaxHandshakes (64)", open)
	}
	log := lb.String()
	if !strings.Contains(log, "too many handshakes in progress from non-members") {
		t.Errorf("no log line for the refused strangers: %q", log)
	}
	if strings.Contains(log, "member's address") {
		t.Errorf("a member's connection was refused or failed: %q", log)
	}
}

// TestMembersChange follows the member list: an address that joins it gets
// slots of its own within the refresh interval, and one that leaves it
// loses them.
func TestMembersChange(t *testing.T) {
	ca := newCA(t)
	var mu sync.Mutex
	var members []raft.ServerAddress
	set := func(m ...raft.ServerAddress) {
		mu.Lock()
		defer mu.Unlock()
		members = m
	}
	a := newTransport(t, raftnet.Config{BindAddr: loopback(t, "127.0.0.41"), TLS: peerTLS(t, ca, "127.0.0.41"),
		HandshakeTimeout: time.Minute, MaxHandshakes: 4,
		Members: func() []raft.ServerAddress {
			mu.Lock()
			defer mu.Unlock()
			return append([]raft.ServerAddress(nil), members...)
		}})
	respond(t, a)
	idleFlood(t, a.LocalAddr(), strangerIPs(180, 4), 8)
	// Each peer transport dials once: raft pools the connection it made,
	// and a ping over it needs no handshake.
	peer := func() *raft.NetworkTransport {
		return newTransport(t, raftnet.Config{BindAddr: loopback(t, "127.0.0.42"), TLS: peerTLS(t, ca, "127.0.0.42")})
	}
	b := peer()
	if err := ping(b, a); err == nil {
		t.Fatal("a non-member got through: the flood did not take the shared slots")
	}
	set(b.LocalAddr()) // the port does not matter, only the IP
	deadline := time.Now().Add(waitFor)
	for err := ping(b, a); err != nil; err = ping(b, a) {
		if time.Now().After(deadline) {
			t.Fatalf("a new member still gets no slot: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	set()
	deadline = time.Now().Add(waitFor)
	for ping(peer(), a) == nil {
		if time.Now().After(deadline) {
			t.Fatal("a removed member keeps its slots")
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestDialFromListenAddress checks that a transport listening on a specific
// IP dials from it: peers tell members apart by source address.
func TestDialFromListenAddress(t *testing.T) {
	ca := newCA(t)
	ln, err := net.Listen("tcp", loopback(t, "127.0.0.51"))
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	b := newTransport(t, raftnet.Config{BindAddr: loopback(t, "127.0.0.52"), TLS: peerTLS(t, ca, "127.0.0.52"), Timeout: 200 * time.Millisecond})
	from := make(chan net.Addr, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			from <- nil
			return
		}
		from <- c.RemoteAddr()
		_ = c.Close()
	}()
	var resp raft.AppendEntriesResponse
	_ = b.AppendEntries("x", raft.ServerAddress(ln.Addr().String()), &raft.AppendEntriesRequest{}, &resp)
	if got := <-from; got == nil || got.(*net.TCPAddr).IP.String() != "127.0.0.52" {
		t.Fatalf("connection from %v, want from 127.0.0.52", got)
	}
}

// TestMemberNames resolves a member given by name ("localhost"): a flood
// from other addresses does not take its slots.
func TestMemberNames(t *testing.T) {
	ca := newCA(t)
	a := newTransport(t, raftnet.Config{BindAddr: loopback(t, "127.0.0.1"), TLS: peerTLS(t, ca, "127.0.0.1"),
		HandshakeTimeout: time.Minute, MaxHandshakes: 2,
		Members: func() []raft.ServerAddress { return []raft.ServerAddress{"localhost:7225"} }})
	respond(t, a)
	idleFlood(t, a.LocalAddr(), strangerIPs(190, 2), 2)
	b := newTransport(t, raftnet.Config{BindAddr: "127.0.0.1:0", TLS: peerTLS(t, ca, "127.0.0.1")})
	if err := ping(b, a); err != nil {
		t.Fatalf("the member named localhost could not connect: %v", err)
	}
}
