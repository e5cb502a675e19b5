package connlimit

import (
	"net"
	"sync"
)

// Listener is a net.Listener whose Accept returns only the connections its
// gate admits: a connection for which there is no slot is closed at once,
// after Refused (if set) is called with it, and Accept waits for the next.
// An admitted connection holds its slot until it is closed.
type Listener struct {
	net.Listener
	gate    *Gate
	refused func(c net.Conn, why Refusal)
}

// NewListener applies g to ln. refused, if not nil, is called for every
// connection the gate refuses, before it is closed (to log it: see
// Limiter).
func NewListener(ln net.Listener, g *Gate, refused func(c net.Conn, why Refusal)) *Listener {
	return &Listener{Listener: ln, gate: g, refused: refused}
}

// Accept returns the next connection the gate admits, or the listener's
// error.
func (l *Listener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		t, why := l.gate.Enter(RemoteIP(c))
		if why != Admitted {
			if l.refused != nil {
				l.refused(c, why)
			}
			_ = c.Close()
			continue
		}
		return &gatedConn{Conn: c, gate: l.gate, t: t}, nil
	}
}

// gatedConn gives its slot back when it is closed (once).
type gatedConn struct {
	net.Conn
	gate *Gate
	t    Ticket
	once sync.Once
}

func (c *gatedConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() { c.gate.Leave(c.t) })
	return err
}

// CloseWrite half-closes the connection if it can (net/http uses it to
// let a client read an error answer before the connection closes).
func (c *gatedConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}
