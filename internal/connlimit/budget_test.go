package connlimit

import (
	"errors"
	"io"
	"net"
	"net/netip"
	"sync/atomic"
	"testing"
	"time"
)

func TestBudgetTake(t *testing.T) {
	b := NewBudget(3, 1, nil)
	if !b.Take(false) || !b.Take(false) {
		t.Fatal("the first two units refused")
	}
	if b.Take(false) {
		t.Fatal("a stranger took the preferred unit")
	}
	if !b.Take(true) {
		t.Fatal("a preferred source was refused its unit")
	}
	if b.Take(true) {
		t.Fatal("a unit beyond the budget")
	}
	if got := b.Refused(); got != 2 {
		t.Fatalf("refused %d, want 2", got)
	}
	b.Give()
	if b.InUse() != 2 || b.Take(false) || !b.Take(true) {
		t.Fatalf("after a unit was given back: in use %d, want 2, then only a preferred source admitted", b.InUse())
	}
	var nilB *Budget
	if !nilB.Take(false) || nilB.InUse() != 0 {
		t.Fatal("a nil budget refused")
	}
}

// TestBudgetListener: over real sockets, two listeners share one budget: a
// connection beyond it, on either, is closed at once (Accept never returns
// it) and warned about, a preferred source still gets the preferred unit,
// and a closed connection gives its unit back (once).
func TestBudgetListener(t *testing.T) {
	var warned atomic.Int32
	b := NewBudget(3, 1, func(string, net.Addr, int) { warned.Add(1) })
	never := func(netip.Addr) bool { return false }
	always := func(netip.Addr) bool { return true }
	type lnChan struct {
		ln       net.Listener
		accepted chan net.Conn
	}
	start := func(pref func(netip.Addr) bool) lnChan {
		raw, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		l := lnChan{b.Listener(raw, "test", pref), make(chan net.Conn, 10)}
		go func() {
			defer close(l.accepted)
			for {
				c, err := l.ln.Accept()
				if err != nil {
					return
				}
				l.accepted <- c
			}
		}()
		t.Cleanup(func() {
			l.ln.Close()
			for c := range l.accepted {
				c.Close()
			}
		})
		return l
	}
	strangers, locals := start(never), start(always)
	dial := func(l lnChan) net.Conn {
		t.Helper()
		c, err := net.Dial("tcp", l.ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	dial(strangers)
	s1 := <-strangers.accepted
	dial(strangers)
	<-strangers.accepted
	// Beyond the strangers' share: closed at once.
	c := dial(strangers)
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := c.Read(make([]byte, 1)); !errors.Is(err, io.EOF) && !isReset(err) {
		t.Fatalf("connection beyond the budget: read error %v, want it closed", err)
	}
	if warned.Load() != 1 || b.Refused() != 1 {
		t.Fatalf("warned %d times, refused %d; want 1, 1", warned.Load(), b.Refused())
	}
	// The preferred unit, on the other listener.
	dial(locals)
	<-locals.accepted
	if b.InUse() != 3 {
		t.Fatalf("in use %d, want 3", b.InUse())
	}
	c = dial(locals)
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := c.Read(make([]byte, 1)); !errors.Is(err, io.EOF) && !isReset(err) {
		t.Fatalf("preferred connection beyond the budget: read error %v, want it closed", err)
	}
	s1.Close()
	s1.Close() // gives back once
	if b.InUse() != 2 {
		t.Fatalf("after a close: in use %d, want 2", b.InUse())
	}
	dial(locals) // the unit given back
	s := <-locals.accepted
	if NetConnOf(s) == s {
		t.Fatal("NetConnOf did not unwrap")
	}
	if _, ok := NetConnOf(s).(*net.TCPConn); !ok {
		t.Fatalf("NetConnOf gave %T, want *net.TCPConn", NetConnOf(s))
	}
}

func TestLoopbackHostPort(t *testing.T) {
	for addr, want := range map[string]bool{
		"127.0.0.1:7000":  true,
		"127.0.0.9:7000":  true,
		"[::1]:7000":      true,
		"localhost:7000":  true,
		"LocalHost.:7000": true,
		"10.0.0.5:7000":   false,
		"[::]:7000":       false,
		"0.0.0.0:7000":    false,
		"db.internal:1":   false,
		"127.0.0.1":       false, // no port
		"":                false,
	} {
		if got := LoopbackHostPort(addr); got != want {
			t.Errorf("LoopbackHostPort(%q) = %v, want %v", addr, got, want)
		}
	}
}
