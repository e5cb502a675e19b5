package main

import (
	"bufio"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"runtime"
	"sync"
	"time"

	"github.com/ticketing-dev/ticketing/internal/wire"
)

// reply is one server answer, delivered to the channel its request named.
type reply struct {
	typ   byte
	token uint64
	at    time.Duration // arrival, on the bench's monotonic clock
	err   error         // the connection failed before the answer came
}

// muxConn is one session shared by many clients, the way the real broker
// does it: requests are pipelined with distinct req_ids, one writer
// goroutine writes whatever frames have queued up in one system call, and one
// reader goroutine dispatches replies by req_id to the channel each request
// named.
type muxConn struct {
	c     net.Conn
	clock *clock

	mu      sync.Mutex
	out     []byte
	pending map[uint32]chan<- reply
	nextID  uint32
	err     error

	wake chan struct{}
	done chan struct{}
	wg   sync.WaitGroup
}

// dialTimeout bounds the TCP connect, and then the TLS handshake and the
// HELLO exchange together.
const dialTimeout = 5 * time.Second

// dialMux connects, says HELLO and starts the reader and writer. With
// tlsConf non-nil the session is TLS: the handshake runs before HELLO,
// within the same deadline, and a tlsConf without ServerName verifies the
// server's certificate against addr's host.
func dialMux(addr, token string, tlsConf *tls.Config, clk *clock) (*muxConn, error) {
	raw, err := net.DialTimeout("tcp", addr, dialTimeout)
	if err != nil {
		return nil, err
	}
	if tc, ok := raw.(*net.TCPConn); ok {
		_ = tc.SetNoDelay(true)
	}
	_ = raw.SetDeadline(time.Now().Add(dialTimeout))
	c := raw
	if tlsConf != nil {
		conf := tlsConf
		if conf.ServerName == "" {
			host, _, err := net.SplitHostPort(addr)
			if err != nil {
				raw.Close()
				return nil, err
			}
			conf = conf.Clone()
			conf.ServerName = host
		}
		tc := tls.Client(raw, conf)
		if err := tc.Handshake(); err != nil {
			raw.Close()
			return nil, &tlsError{err: err}
		}
		c = tc
	}
	hello, _ := wire.AppendRequest(nil, &wire.Request{Type: wire.TypeHello, ReqID: 1, Version: wire.Version,
		AuthToken: []byte(token), Name: []byte("ticketing-bench")})
	if _, err := c.Write(hello); err != nil {
		c.Close()
		return nil, err
	}
	br := bufio.NewReaderSize(c, 64<<10)
	fr := wire.NewReader(br)
	body, err := fr.Next()
	if err != nil {
		c.Close()
		return nil, fmt.Errorf("HELLO: %w", err)
	}
	var r wire.Response
	if err := wire.DecodeResponse(body, &r); err != nil {
		c.Close()
		return nil, fmt.Errorf("HELLO: %w", err)
	}
	switch r.Type {
	case wire.TypeHelloOK:
	case wire.TypeError:
		c.Close()
		return nil, &helloRefusedError{code: r.Code, name: wire.CodeName(r.Code), msg: string(r.Msg)}
	case wire.TypeNotActive:
		c.Close()
		return nil, &notActiveError{hint: string(r.Hint)}
	default:
		c.Close()
		return nil, fmt.Errorf("HELLO: unexpected reply %q", r.Type)
	}
	_ = c.SetDeadline(time.Time{})
	m := &muxConn{
		c:       c,
		clock:   clk,
		pending: make(map[uint32]chan<- reply),
		nextID:  2,
		wake:    make(chan struct{}, 1),
		done:    make(chan struct{}),
	}
	m.wg.Add(2)
	go m.readLoop(fr)
	go m.writeLoop()
	return m, nil
}

// tlsError is a failed TLS handshake.
type tlsError struct{ err error }

func (e *tlsError) Error() string { return "TLS handshake: " + e.err.Error() }
func (e *tlsError) Unwrap() error { return e.err }

// tlsRefused reports whether err is TLS refusing for good: a server
// certificate that does not verify (the wrong CA, a name the certificate
// lacks), or the server's alert rejecting this client (no client
// certificate, or one it does not trust; with TLS 1.3 that alert comes
// only after the handshake, in answer to HELLO). Asking again will not help.
func tlsRefused(err error) bool {
	if _, ok := errors.AsType[*tls.CertificateVerificationError](err); ok {
		return true
	}
	// crypto/tls reports an alert from the peer as a net.OpError with Op
	// "remote error".
	oe, ok := errors.AsType[*net.OpError](err)
	return ok && oe.Op == "remote error"
}

// send queues one request; its reply goes to ch, which must have room.
func (m *muxConn) send(req *wire.Request, ch chan<- reply) error {
	m.mu.Lock()
	if m.err != nil {
		err := m.err
		m.mu.Unlock()
		return err
	}
	id := m.nextID
	for {
		if id == 0 {
			id = 1
		}
		if _, busy := m.pending[id]; !busy {
			break
		}
		id++
	}
	m.nextID = id + 1
	req.ReqID = id
	wasEmpty := len(m.out) == 0
	var err error
	m.out, err = wire.AppendRequest(m.out, req)
	if err != nil {
		m.mu.Unlock()
		return err
	}
	m.pending[id] = ch
	m.mu.Unlock()
	if wasEmpty {
		select {
		case m.wake <- struct{}{}:
		default:
		}
	}
	return nil
}

func (m *muxConn) writeLoop() {
	defer m.wg.Done()
	var buf []byte
	for {
		select {
		case <-m.wake:
		case <-m.done:
			return
		}
		// Let the clients that are runnable now queue their frames too, so
		// that one write carries them all: on a loopback a write costs the
		// sender the receiver's TCP processing as well.
		runtime.Gosched()
		m.mu.Lock()
		buf, m.out = m.out, buf[:0]
		m.mu.Unlock()
		if len(buf) == 0 {
			continue
		}
		if _, err := m.c.Write(buf); err != nil {
			m.fail(err)
			return
		}
	}
}

func (m *muxConn) readLoop(fr *wire.Reader) {
	defer m.wg.Done()
	var r wire.Response
	for {
		body, err := fr.Next()
		if err != nil {
			m.fail(err)
			return
		}
		at := m.clock.now()
		if err := wire.DecodeResponse(body, &r); err != nil {
			m.fail(err)
			return
		}
		if r.Type == wire.TypeError {
			m.fail(fmt.Errorf("server error E(%d) %s: %s", r.Code, wire.CodeName(r.Code), r.Msg))
			return
		}
		if r.Type == wire.TypeNotActive {
			// The node stopped serving (a leader change): M with req_id 0.
			m.fail(fmt.Errorf("node stopped serving (hint %q)", r.Hint))
			return
		}
		m.mu.Lock()
		ch, ok := m.pending[r.ReqID]
		delete(m.pending, r.ReqID)
		m.mu.Unlock()
		if !ok {
			m.fail(fmt.Errorf("unknown response req_id %d", r.ReqID))
			return
		}
		ch <- reply{typ: r.Type, token: r.Token, at: at}
	}
}

var errClosed = errors.New("bench: connection closed")

// fail marks the connection broken and fails every waiting request.
func (m *muxConn) fail(err error) {
	m.mu.Lock()
	if m.err != nil {
		m.mu.Unlock()
		return
	}
	m.err = err
	pending := m.pending
	m.pending = make(map[uint32]chan<- reply)
	m.mu.Unlock()
	close(m.done)
	_ = m.c.Close()
	for _, ch := range pending {
		ch <- reply{err: err}
	}
}

// close shuts the connection and waits for its goroutines.
func (m *muxConn) close() {
	m.fail(errClosed)
	m.wg.Wait()
}

// clock is the bench's monotonic clock: durations since its start.
type clock struct{ start time.Time }

func newClock() *clock                               { return &clock{start: time.Now()} }
func (c *clock) now() time.Duration                  { return time.Since(c.start) }
func (c *clock) since(t time.Duration) time.Duration { return c.now() - t }
