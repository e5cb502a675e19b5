package server_test

import (
	"testing"

	"github.com/ticketing-dev/ticketing/internal/wire"
	"github.com/ticketing-dev/ticketing/server"
)

func TestSmoke(t *testing.T) {
	_, addr := startServer(t, server.Config{})
	c := session(t, addr)
	tok := c.acquireOK(2, owner(1), 0, 30, "k")
	if tok != 1 {
		t.Fatalf("first token %d", tok)
	}
	c.send(ping(3))
	c.expect(wire.TypePong, 3)
	c.send(rel(4, tok, "k"))
	c.expect(wire.TypeReleased, 4)
	c.send(rel(5, tok, "k"))
	c.expect(wire.TypeNotHeld, 5)
}
