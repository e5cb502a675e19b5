package server_test

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"testing"
	"time"

	"github.com/ticketing-dev/ticketing/internal/wire"
	"github.com/ticketing-dev/ticketing/server"
)

// startServer runs a server on a loopback listener until the test ends.
func startServer(t testing.TB, cfg server.Config) (*server.Server, string) {
	t.Helper()
	if cfg.DataDir == "" {
		cfg.DataDir = t.TempDir()
	}
	s, err := server.New(cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- s.Serve(ln) }()
	t.Cleanup(func() {
		s.Close()
		if err := <-done; !errors.Is(err, server.ErrServerClosed) {
			t.Errorf("Serve returned %v, want ErrServerClosed", err)
		}
	})
	return s, ln.Addr().String()
}

// client is a raw protocol client for tests.
type client struct {
	t  testing.TB
	nc net.Conn
	br *bufio.Reader
	fr *wire.Reader
}

func dial(t testing.TB, addr string) *client {
	t.Helper()
	nc, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	return wrap(t, nc)
}

func dialTLS(t testing.TB, addr string, cfg *tls.Config) *client {
	t.Helper()
	nc, err := tls.Dial("tcp", addr, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return wrap(t, nc)
}

func wrap(t testing.TB, nc net.Conn) *client {
	c := &client{t: t, nc: nc, br: bufio.NewReader(nc)}
	c.fr = wire.NewReader(c.br)
	t.Cleanup(func() { nc.Close() })
	return c
}

func (c *client) send(r wire.Request) {
	c.t.Helper()
	b, err := wire.AppendRequest(nil, &r)
	if err != nil {
		c.t.Fatalf("encode: %v", err)
	}
	c.sendRaw(b)
}

func (c *client) sendRaw(b []byte) {
	c.t.Helper()
	if _, err := c.nc.Write(b); err != nil {
		c.t.Fatalf("write: %v", err)
	}
}

// recvErr reads one response within d.
func (c *client) recvErr(d time.Duration) (wire.Response, error) {
	c.nc.SetReadDeadline(time.Now().Add(d))
	body, err := c.fr.Next()
	if err != nil {
		return wire.Response{}, err
	}
	var r wire.Response
	if err := wire.DecodeResponse(body, &r); err != nil {
		return wire.Response{}, err
	}
	// Copy the aliased fields.
	r.Node = append([]byte(nil), r.Node...)
	r.Hint = append([]byte(nil), r.Hint...)
	r.Msg = append([]byte(nil), r.Msg...)
	return r, nil
}

func (c *client) recv() wire.Response {
	c.t.Helper()
	r, err := c.recvErr(5 * time.Second)
	if err != nil {
		c.t.Fatalf("recv: %v", err)
	}
	return r
}

// expect reads one response and checks its type and req_id.
func (c *client) expect(typ byte, reqID uint32) wire.Response {
	c.t.Helper()
	r := c.recv()
	if r.Type != typ || r.ReqID != reqID {
		c.t.Fatalf("got %s, want %c req %d", show(r), typ, reqID)
	}
	return r
}

// expectError reads an E with the given code and req_id and then EOF.
func (c *client) expectError(code uint16, reqID uint32) {
	c.t.Helper()
	r := c.recv()
	if r.Type != wire.TypeError || r.Code != code || r.ReqID != reqID {
		c.t.Fatalf("got %s, want E(%d) req %d", show(r), code, reqID)
	}
	c.expectClosed()
}

func (c *client) expectClosed() {
	c.t.Helper()
	_, err := c.recvErr(5 * time.Second)
	if !errors.Is(err, io.EOF) && !errors.Is(err, net.ErrClosed) && !isReset(err) {
		c.t.Fatalf("after a fatal reply: %v, want the session closed", err)
	}
}

func isReset(err error) bool {
	var ne *net.OpError
	return errors.As(err, &ne) && !ne.Timeout()
}

func (c *client) expectNothing(d time.Duration) {
	c.t.Helper()
	r, err := c.recvErr(d)
	if err == nil {
		c.t.Fatalf("unexpected %s", show(r))
	}
	var ne net.Error
	if !errors.As(err, &ne) || !ne.Timeout() {
		c.t.Fatalf("unexpected error %v", err)
	}
}

func show(r wire.Response) string {
	switch r.Type {
	case wire.TypeGranted:
		return fmt.Sprintf("G req %d token %d waited %d", r.ReqID, r.Token, r.WaitedMS)
	case wire.TypeError:
		return fmt.Sprintf("E(%d) req %d %q", r.Code, r.ReqID, r.Msg)
	case wire.TypeNotActive:
		return fmt.Sprintf("M req %d hint %q", r.ReqID, r.Hint)
	}
	return fmt.Sprintf("%c req %d", r.Type, r.ReqID)
}

func helloReq(id uint32, token string) wire.Request {
	return wire.Request{Type: wire.TypeHello, ReqID: id, Version: wire.Version, AuthToken: []byte(token), Name: []byte("test")}
}

// session dials and completes HELLO.
func session(t testing.TB, addr string) *client {
	t.Helper()
	c := dial(t, addr)
	c.hello("")
	return c
}

func (c *client) hello(token string) {
	c.t.Helper()
	c.send(helloReq(1, token))
	r := c.expect(wire.TypeHelloOK, 1)
	if r.Version != 1 || r.Role != wire.RoleStandalone {
		c.t.Fatalf("HELLO_OK %+v", r)
	}
}

func owner(n int) [16]byte {
	var o [16]byte
	o[0], o[1], o[15] = byte(n>>8), byte(n), 0xAA
	return o
}

func acq(id uint32, own [16]byte, waitS, leaseS uint8, key string) wire.Request {
	return wire.Request{Type: wire.TypeAcquire, ReqID: id, Owner: own, WaitS: waitS, LeaseS: leaseS, Key: []byte(key)}
}

func rel(id uint32, tok uint64, key string) wire.Request {
	return wire.Request{Type: wire.TypeRelease, ReqID: id, Token: tok, Key: []byte(key)}
}

func ping(id uint32) wire.Request { return wire.Request{Type: wire.TypePing, ReqID: id} }

// acquireOK sends an ACQUIRE and expects G; it returns the token.
func (c *client) acquireOK(id uint32, own [16]byte, waitS, leaseS uint8, key string) uint64 {
	c.t.Helper()
	c.send(acq(id, own, waitS, leaseS, key))
	return c.expect(wire.TypeGranted, id).Token
}

// eventually polls cond for up to 5 s.
func eventually(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func shutdownCtx(t testing.TB) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), 10*time.Second)
}

func listen(t testing.TB) net.Listener {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return ln
}

func contextWithTimeout(ctx context.Context, d time.Duration) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, d)
}
