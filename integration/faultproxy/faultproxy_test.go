package faultproxy_test

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"os"
	"testing"
	"time"

	"github.com/ticketing-dev/ticketing/integration/faultproxy"
)

// echo serves a TCP echo on 127.0.0.1 until the test ends.
func echo(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	t.Cleanup(func() { ln.Close(); <-done })
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { defer c.Close(); _, _ = io.Copy(c, c) }()
		}
	}()
	return ln.Addr().String()
}

func frame(body string) []byte {
	b := binary.BigEndian.AppendUint32(nil, uint32(len(body)))
	return append(b, body...)
}

func dial(t *testing.T, p *faultproxy.Proxy) (net.Conn, *faultproxy.Conn) {
	t.Helper()
	c, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	for range 200 {
		if cs := p.Conns(); len(cs) == 1 {
			return c, cs[0]
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Fatal("the proxy has no connection")
	return nil, nil
}

func newProxy(t *testing.T) *faultproxy.Proxy {
	t.Helper()
	p, err := faultproxy.New(echo(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

func TestForwardAndCutMidFrame(t *testing.T) {
	for _, dir := range []faultproxy.Direction{faultproxy.ClientToServer, faultproxy.ServerToClient} {
		t.Run(dir.String(), func(t *testing.T) {
			p := newProxy(t)
			c, pc := dial(t, p)
			f1 := frame("Phello")
			if _, err := c.Write(f1); err != nil {
				t.Fatal(err)
			}
			got := make([]byte, len(f1))
			if _, err := io.ReadFull(c, got); err != nil || !bytes.Equal(got, f1) {
				t.Fatalf("echo: %x, %v", got, err)
			}
			pc.Cut(dir, 6)
			f2 := frame("Aabcdefgh")
			if _, err := c.Write(f2); err != nil {
				t.Fatal(err)
			}
			_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
			rest, err := io.ReadAll(c)
			if err != nil && !errors.Is(err, net.ErrClosed) {
				var ne net.Error
				if errors.As(err, &ne) && ne.Timeout() {
					t.Fatalf("no close after the cut; got %x", rest)
				}
			}
			// Cut client->server: the server saw 6 bytes, echoed them (or
			// not, if the close won); never more. Cut server->client: we
			// see exactly 6.
			if len(rest) > 6 || (dir == faultproxy.ServerToClient && len(rest) != 6) {
				t.Fatalf("after a cut at 6 bytes, read %x", rest)
			}
			if !bytes.Equal(rest, f2[:len(rest)]) {
				t.Fatalf("read %x, not a prefix of %x", rest, f2)
			}
		})
	}
}

func TestBlackholeDelayReset(t *testing.T) {
	p := newProxy(t)
	c, pc := dial(t, p)

	pc.Blackhole(true)
	if _, err := c.Write(frame("Pdropped")); err != nil {
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
	if n, err := c.Read(make([]byte, 64)); n != 0 || err == nil {
		t.Fatalf("blackhole: read %d bytes, err %v", n, err)
	}
	pc.Blackhole(false)

	pc.SetDelay(100 * time.Millisecond)
	start := time.Now()
	f := frame("Pdelayed")
	if _, err := c.Write(f); err != nil {
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	got := make([]byte, len(f))
	if _, err := io.ReadFull(c, got); err != nil || !bytes.Equal(got, f) {
		t.Fatalf("delayed echo: %x, %v", got, err)
	}
	if el := time.Since(start); el < 200*time.Millisecond {
		t.Errorf("round trip through 100 ms each way took %v", el)
	}

	pc.Reset()
	_, err := c.Read(make([]byte, 1))
	if err == nil {
		t.Fatal("read after reset: no error")
	}
	t.Logf("after reset: %v", err)
}

func TestDefaultBlackholeForNewConns(t *testing.T) {
	p := newProxy(t)
	p.SetDefault(faultproxy.Faults{Blackhole: true})
	c, _ := dial(t, p)
	if _, err := c.Write(frame("Phello")); err != nil {
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
	if n, _ := c.Read(make([]byte, 64)); n != 0 {
		t.Fatalf("read %d bytes through a blackholed new connection", n)
	}
}

// TestDefaultRefuse: a proxy that refuses new connections resets them
// without dialling the target (its listener sees no connection), and
// forwards again once the default is cleared.
func TestDefaultRefuse(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	accepted := make(chan net.Conn, 4)
	done := make(chan struct{})
	t.Cleanup(func() { ln.Close(); <-done })
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			accepted <- c
		}
	}()
	p, err := faultproxy.New(ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	p.SetDefault(faultproxy.Faults{Refuse: true})
	// The reset may come before the dial returns, or at the first read.
	if c, err := net.Dial("tcp", p.Addr()); err == nil {
		_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
		n, err := c.Read(make([]byte, 8))
		c.Close()
		if n != 0 || err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatalf("read through a refusing proxy: %d bytes, %v; want a reset", n, err)
		}
	}
	select {
	case tc := <-accepted:
		tc.Close()
		t.Fatal("a refused connection reached the target")
	default:
	}
	p.SetDefault(faultproxy.Faults{})
	c2, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	select {
	case tc := <-accepted:
		tc.Close()
	case <-time.After(10 * time.Second):
		t.Fatal("no connection reached the target after the refusal was lifted")
	}
}

// TestClassifierChoosesByClientAddr: the classifier sees the address each
// client dialled from (the one Conn.ClientAddr reports) and its faults
// apply to that connection only; it wins over SetDefault, and removing it
// brings SetDefault back.
func TestClassifierChoosesByClientAddr(t *testing.T) {
	p := newProxy(t)
	p.SetDefault(faultproxy.Faults{Blackhole: true})
	cut := make(chan string, 1) // the client address to blackhole
	seen := make(chan string, 4)
	p.SetClassifier(func(client net.Addr) faultproxy.Faults {
		seen <- client.String()
		select {
		case a := <-cut:
			return faultproxy.Faults{Blackhole: client.String() == a}
		default:
			return faultproxy.Faults{}
		}
	})
	roundTrip := func(c net.Conn) bool {
		t.Helper()
		f := frame("Pping")
		if _, err := c.Write(f); err != nil {
			t.Fatal(err)
		}
		_ = c.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
		got := make([]byte, len(f))
		_, err := io.ReadFull(c, got)
		return err == nil && bytes.Equal(got, f)
	}

	// A free connection: forwarded despite the blackhole default.
	c1, pc1 := dial(t, p)
	if a := <-seen; a != c1.LocalAddr().String() || pc1.ClientAddr().String() != a {
		t.Fatalf("classifier saw %s, proxy conn says %s, client is %s", a, pc1.ClientAddr(), c1.LocalAddr())
	}
	if !roundTrip(c1) {
		t.Fatal("classified free: no echo")
	}

	// The next client, picked by its address: blackholed; the first still
	// forwards.
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)}}
	ln, err := net.Listen("tcp", "127.0.0.1:0") // reserve a source port
	if err != nil {
		t.Fatal(err)
	}
	src := ln.Addr().(*net.TCPAddr)
	ln.Close()
	d.LocalAddr = src
	cut <- src.String()
	c2, err := d.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	if a := <-seen; a != src.String() {
		t.Fatalf("classifier saw %s, want %s", a, src)
	}
	if roundTrip(c2) {
		t.Fatal("classified blackholed: echoed")
	}
	if !roundTrip(c1) {
		t.Fatal("the other connection stopped forwarding")
	}

	// Without a classifier, the default applies again.
	p.SetClassifier(nil)
	c3, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c3.Close()
	if roundTrip(c3) {
		t.Fatal("default blackhole not applied after SetClassifier(nil)")
	}
}
