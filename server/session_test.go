package server_test

import (
	"encoding/binary"
	"errors"
	"testing"
	"time"

	"github.com/ticketing-dev/ticketing/internal/wire"
	"github.com/ticketing-dev/ticketing/server"
)

// helloBody builds a HELLO frame by hand so that tests can break it.
func helloFrame(id uint32, version byte, token string, extra []byte) []byte {
	body := []byte{wire.TypeHello, 0, 0, 0, 0, version, byte(len(token))}
	binary.BigEndian.PutUint32(body[1:], id)
	body = append(body, token...)
	body = append(body, 0) // name_len 0
	body = append(body, extra...)
	return frame(body)
}

func frame(body []byte) []byte {
	return append(binary.BigEndian.AppendUint32(nil, uint32(len(body))), body...)
}

// TestHelloCheckOrder: version byte before exact length before client token
// before session limit, as docs/protocol.md's session rules order the checks.
func TestHelloCheckOrder(t *testing.T) {
	_, addr := startServer(t, server.Config{ClientTokens: []string{"s3cret"}, MaxSessions: 1})
	hold := dial(t, addr)
	hold.hello("s3cret") // fills the session limit

	tests := []struct {
		name  string
		frame []byte
		code  uint16
	}{
		{"bad version, bad length, bad token", helloFrame(7, 4, "nope", []byte{1, 2, 3}), wire.CodeVersion},
		{"bad length, bad token", helloFrame(7, 1, "nope", []byte{1, 2, 3}), wire.CodeMalformed},
		{"bad token, over session limit", helloFrame(7, 1, "nope", nil), wire.CodeUnauthorized},
		{"over session limit", helloFrame(7, 1, "s3cret", nil), wire.CodeTooManySession},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := dial(t, addr)
			c.sendRaw(tt.frame)
			c.expectError(tt.code, 7)
		})
	}
}

func TestHelloTimeout(t *testing.T) {
	_, addr := startServer(t, server.Config{HelloTimeout: 200 * time.Millisecond})
	c := dial(t, addr)
	start := time.Now()
	c.expectError(wire.CodeMalformed, 0)
	if el := time.Since(start); el < 150*time.Millisecond || el > 3*time.Second {
		t.Fatalf("closed after %v, want about 200ms", el)
	}
}

// TestHelloTimeoutPartialFrame: a HELLO trickled in too slowly also times out.
func TestHelloTimeoutPartialFrame(t *testing.T) {
	_, addr := startServer(t, server.Config{HelloTimeout: 200 * time.Millisecond})
	c := dial(t, addr)
	c.sendRaw(helloFrame(1, 1, "", nil)[:6])
	c.expectError(wire.CodeMalformed, 0)
}

// TestHelloTokens: only a configured token opens a session; wrong, shorter,
// longer and empty tokens all get the same E(3). The comparison is over
// SHA-256 digests with crypto/subtle, so its time depends on neither the
// token's length nor which configured token matches.
func TestHelloTokens(t *testing.T) {
	_, addr := startServer(t, server.Config{ClientTokens: []string{"s3cret", "other-token"}})
	for _, tok := range []string{"", "s", "s3cre", "s3cret!", "S3CRET", "s3cret\x00", "other-token-longer", string(make([]byte, 255))} {
		t.Run("reject "+tok, func(t *testing.T) {
			c := dial(t, addr)
			c.send(helloReq(3, tok))
			c.expectError(wire.CodeUnauthorized, 3)
		})
	}
	for _, tok := range []string{"s3cret", "other-token"} {
		c := dial(t, addr)
		c.hello(tok)
	}
}

func TestHelloNoTokensConfiguredAcceptsAny(t *testing.T) {
	_, addr := startServer(t, server.Config{})
	dial(t, addr).hello("whatever")
}

func TestSecondHello(t *testing.T) {
	_, addr := startServer(t, server.Config{})
	c := session(t, addr)
	c.send(helloReq(9, ""))
	c.expectError(wire.CodeMalformed, 9)
}

func TestFirstFrameMustBeHello(t *testing.T) {
	_, addr := startServer(t, server.Config{})
	for name, r := range map[string]wire.Request{
		"ping":    ping(4),
		"acquire": acq(4, owner(1), 0, 10, "k"),
		"release": rel(4, 1, "k"),
	} {
		t.Run(name, func(t *testing.T) {
			c := dial(t, addr)
			c.send(r)
			c.expectError(wire.CodeMalformed, 4)
		})
	}
}

// TestPipeliningOutOfOrder: requests are pipelined; a waiting ACQUIRE is
// answered after later requests (requests are answered out of order).
func TestPipeliningOutOfOrder(t *testing.T) {
	_, addr := startServer(t, server.Config{})
	a := session(t, addr)
	tok := a.acquireOK(2, owner(1), 0, 30, "k")

	b := session(t, addr)
	var batch []byte
	for _, r := range []wire.Request{acq(10, owner(2), 5, 30, "k"), ping(11), acq(12, owner(2), 0, 30, "other"), rel(13, 999, "other"), ping(14)} {
		batch, _ = wire.AppendRequest(batch, &r)
	}
	b.sendRaw(batch) // one write: five pipelined requests
	b.expect(wire.TypePong, 11)
	b.expect(wire.TypeGranted, 12)
	b.expect(wire.TypeNotHeld, 13)
	b.expect(wire.TypePong, 14)
	a.send(rel(3, tok, "k"))
	a.expect(wire.TypeReleased, 3)
	g := b.expect(wire.TypeGranted, 10)
	if g.Token <= tok {
		t.Fatalf("token %d after %d", g.Token, tok)
	}
}

func TestPingWhileWaiting(t *testing.T) {
	_, addr := startServer(t, server.Config{})
	a := session(t, addr)
	a.acquireOK(2, owner(1), 0, 30, "k")
	b := session(t, addr)
	b.send(acq(5, owner(2), 10, 30, "k"))
	for id := uint32(6); id < 10; id++ {
		b.send(ping(id))
		b.expect(wire.TypePong, id)
	}
}

// TestDuplicateInflightReqID: reusing the req_id of a waiting ACQUIRE is E(1).
func TestDuplicateInflightReqID(t *testing.T) {
	_, addr := startServer(t, server.Config{})
	a := session(t, addr)
	a.acquireOK(2, owner(1), 0, 30, "k")
	b := session(t, addr)
	b.send(acq(5, owner(2), 10, 30, "k"))
	b.send(ping(6))
	b.expect(wire.TypePong, 6)
	b.send(ping(5))
	b.expectError(wire.CodeMalformed, 5)
}

// TestReqIDReuseAfterReply: a req_id whose reply has come may be reused.
func TestReqIDReuseAfterReply(t *testing.T) {
	_, addr := startServer(t, server.Config{})
	c := session(t, addr)
	for i := 0; i < 3; i++ {
		c.send(ping(5))
		c.expect(wire.TypePong, 5)
	}
}

// TestSessionCloseDropsWaitsKeepsGrants: a closed session's waiting
// ACQUIREs are dropped, its granted locks stay held until their leases end.
func TestSessionCloseDropsWaitsKeepsGrants(t *testing.T) {
	s, addr := startServer(t, server.Config{})
	a := session(t, addr)
	tokA := a.acquireOK(2, owner(1), 0, 30, "k")

	b := session(t, addr)
	tokB := b.acquireOK(2, owner(2), 0, 30, "b-holds")
	b.send(acq(3, owner(2), 30, 30, "k")) // waits, first in line
	c := session(t, addr)
	c.send(acq(4, owner(3), 30, 30, "k")) // second in line
	eventually(t, "two waiters", func() bool { return s.Stats().Waiters == 2 })

	b.nc.Close()
	eventually(t, "b's wait dropped", func() bool { return s.Stats().Waiters == 1 })

	a.send(rel(5, tokA, "k"))
	a.expect(wire.TypeReleased, 5)
	c.expect(wire.TypeGranted, 4) // c, not the closed b

	// b's grant survived its session: held, and releasable by exact token.
	d := session(t, addr)
	d.send(acq(6, owner(4), 0, 30, "b-holds"))
	d.expect(wire.TypeTimedOut, 6)
	d.send(rel(7, tokB, "b-holds"))
	d.expect(wire.TypeReleased, 7)
}

func TestStandbyAnswersNotActive(t *testing.T) {
	_, addr := startServer(t, server.Config{Standby: true, StandbyHint: "node-b:5225", ClientTokens: []string{"tok"}})
	c := dial(t, addr)
	c.send(helloReq(1, "tok"))
	r := c.expect(wire.TypeNotActive, 1)
	if string(r.Hint) != "node-b:5225" {
		t.Fatalf("hint %q", r.Hint)
	}
	c.expectClosed()

	// A pipelined request after HELLO gets nothing more: the session is over.
	c = dial(t, addr)
	c.send(helloReq(1, "tok"))
	c.send(ping(2))
	c.expect(wire.TypeNotActive, 1)
	c.expectClosed()

	// The token is still checked first.
	c = dial(t, addr)
	c.send(helloReq(1, "wrong"))
	c.expectError(wire.CodeUnauthorized, 1)
}

func TestShutdownSendsE5(t *testing.T) {
	s, err := server.New(server.Config{DataDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	ln := listen(t)
	served := make(chan error, 1)
	go func() { served <- s.Serve(ln) }()
	addr := ln.Addr().String()

	a := session(t, addr)
	a.acquireOK(2, owner(1), 0, 30, "k")
	b := session(t, addr)
	b.send(acq(3, owner(2), 60, 30, "k")) // waiting
	pre := dial(t, addr)                  // no HELLO yet
	eventually(t, "waiter", func() bool { return s.Stats().Waiters == 1 })
	// pre must have been accepted: one still in the listen backlog is
	// closed with the listener, without E(5).
	eventually(t, "pre accepted", func() bool { return s.Stats().Pending == 1 })

	ctx, cancel := shutdownCtx(t)
	defer cancel()
	start := time.Now()
	if err := s.Shutdown(ctx); err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
	if el := time.Since(start); el > 5*time.Second {
		t.Fatalf("Shutdown took %v", el)
	}
	for _, c := range []*client{a, b, pre} {
		c.expectError(wire.CodeShuttingDown, 0)
	}
	if err := <-served; !errors.Is(err, server.ErrServerClosed) {
		t.Fatalf("Serve: %v", err)
	}
	if err := s.Serve(listen(t)); !errors.Is(err, server.ErrServerClosed) {
		t.Fatalf("Serve after Shutdown: %v", err)
	}
	s.Close() // idempotent
}

// TestShutdownContextExpires: a peer that never reads cannot hold Shutdown
// past its context.
func TestShutdownContextExpires(t *testing.T) {
	s, err := server.New(server.Config{DataDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	ln := listen(t)
	go s.Serve(ln)
	addr := ln.Addr().String()
	session(t, addr)
	ctx, cancel := shutdownCtx(t)
	defer cancel()
	ctx2, cancel2 := contextWithTimeout(ctx, time.Nanosecond)
	defer cancel2()
	time.Sleep(time.Millisecond)
	err = s.Shutdown(ctx2)
	if err == nil {
		// It may have finished in time; either is fine, but it must return.
		t.Log("Shutdown finished before its context expired")
	}
}
