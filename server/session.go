package server

import (
	"bufio"
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ticketing-dev/ticketing/internal/connlimit"
	"github.com/ticketing-dev/ticketing/internal/wire"
	"github.com/ticketing-dev/ticketing/server/internal/lockcore"
)

const (
	readBufSize       = 16 << 10
	finalFlushTimeout = 2 * time.Second // for the last replies (and E) of a closing session
	lingerTimeout     = time.Second     // reading and discarding after the last reply
	maxSpare          = 64 << 10
	flushEvery        = 32 << 10 // the reader wakes the writer at least this often
)

// conn is one client connection: a reader goroutine that handles requests
// in order, and a writer goroutine that sends batched replies.
//
// Until HELLO succeeds a connection is "pending": only its reader goroutine
// runs, it reads the HELLO frame exactly (no read buffer) and writes its
// own replies; the read buffer, the in-flight map and the writer goroutine
// come with HELLO_OK, so a connection that never sends HELLO costs little.
//
// Replies are appended to out under mu by whichever goroutine produces them
// (the reader, a timer, another session's RELEASE); nothing ever blocks on
// the socket except the writer. If out grows beyond Config.OutputBuffer the
// session is dropped.
type conn struct {
	s      *Server
	nc     net.Conn
	remote string
	peer   netip.Addr // for the per-peer limits
	// pendingT is the connection's count before HELLO (Server.addPending),
	// given back at HELLO_OK or close.
	pendingT connlimit.Ticket
	br       *bufio.Reader
	ver      uint8 // protocol version of the session (from its HELLO; reader only)
	// client is the session's identity for the lock browser (its HELLO's
	// name, remote), set at HELLO_OK before its first request is read;
	// its holdings keep it, and nothing else of the session.
	client *lockcore.Client
	// debug: the logger wrote Debug lines when HELLO succeeded; the
	// session then logs each request and reply (see debugRequest), and
	// otherwise costs this one bool test per request and reply. Set
	// before the session's first request is read, never changed.
	debug bool

	dead      atomic.Bool  // closing: its waiters are no longer live
	nInflight atomic.Int32 // len(inflight), readable without mu
	session   atomic.Bool  // HELLO_OK given (the idle scan looks only at these)
	active    atomic.Bool  // a complete frame, or the last awaited reply queued, since the last idle scan
	idleScans int          // scans without a frame (idle scan only)

	mu       sync.Mutex
	out      []byte
	spare    []byte
	closing  bool              // no more replies; the writer flushes what is queued and finishes
	killed   bool              // close at once, no flush
	started  bool              // the writer goroutine runs (from HELLO_OK on)
	inflight map[uint32]flight // made by the first queued ACQUIRE
	qid      uint64            // its number for a cluster leader's proposer (under cluster.mu; 0: none yet)

	// wmu is held for every write to nc, by the reader (inline flush) or
	// the writer goroutine; whoever holds it takes all of out, so replies
	// keep their order.
	wmu       sync.Mutex
	wdeadline time.Time // last write deadline set (under wmu)

	wake       chan struct{}
	writerDone chan struct{}
}

func (s *Server) newConn(nc net.Conn, peer netip.Addr) *conn {
	return &conn{
		s:          s,
		nc:         nc,
		remote:     nc.RemoteAddr().String(),
		peer:       peer,
		wake:       make(chan struct{}, 1),
		writerDone: make(chan struct{}),
	}
}

// warn logs a warning about the peer, subject to the per-peer log rate
// limit (see logLimiter).
func (c *conn) warn(msg string, args ...any) {
	if c.s.logs.allow(c.peer) {
		c.s.log.Warn(msg, append([]any{"peer", c.remote}, args...)...)
	} else {
		c.s.m.logSuppressed.Add(1)
	}
}

func (c *conn) signal() {
	select {
	case c.wake <- struct{}{}:
	default:
	}
}

// afterAppendLocked enforces the output bound and unlocks mu.
func (c *conn) afterAppendLocked(wake bool) {
	if len(c.out) > c.s.cfg.OutputBuffer {
		c.closing, c.killed = true, true
		c.dead.Store(true)
		c.mu.Unlock()
		c.warn("session dropped: output buffer overflow (peer not reading)", "limit", c.s.cfg.OutputBuffer)
		c.s.m.overflows.Add(1)
		c.closeRaw()
		c.signal()
		return
	}
	c.mu.Unlock()
	if wake {
		c.signal()
	}
}

// replySimple is the reader's direct answer; it wakes the writer itself
// once no further request is buffered.
func (c *conn) replySimple(typ byte, reqID uint32) { c.send(typ, reqID, false, false) }

// replySimpleQueued answers an ACQUIRE recorded in flight, from any
// goroutine.
func (c *conn) replySimpleQueued(typ byte, reqID uint32) { c.send(typ, reqID, true, true) }

// dropInflightLocked forgets a queued ACQUIRE whose reply is being
// queued. When it was the last one the session awaits, the idle clock
// restarts from now (the scan spares sessions with a request in flight).
func (c *conn) dropInflightLocked(reqID uint32) {
	if _, ok := c.inflight[reqID]; ok {
		delete(c.inflight, reqID)
		if c.nInflight.Add(-1) == 0 {
			c.active.Store(true)
		}
	}
}

// flight is an ACQUIRE of the session awaiting its reply from sh's core:
// a waiter (w: queued, or waiting for a token), or without one, its grant
// in flight (a replicated core's).
type flight struct {
	sh *shard
	w  *lockcore.Waiter
}

// addInflight records f as awaiting the reply to reqID. An entry of the
// same req_id can only be its own earlier record (an ACQUIRE that waited
// for a token and is now queued): f takes its place.
func (c *conn) addInflight(reqID uint32, f flight) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.addInflightLocked(reqID, f)
}

func (c *conn) addInflightLocked(reqID uint32, f flight) bool {
	if c.closing {
		return false
	}
	if c.inflight == nil {
		c.inflight = make(map[uint32]flight)
	}
	if _, ok := c.inflight[reqID]; !ok {
		c.nInflight.Add(1)
	}
	c.inflight[reqID] = f
	return true
}

// flightOf returns the record of reqID, if it is in flight.
func (c *conn) flightOf(reqID uint32) (flight, bool) {
	if c.nInflight.Load() == 0 {
		return flight{}, false
	}
	c.mu.Lock()
	f, ok := c.inflight[reqID]
	c.mu.Unlock()
	return f, ok
}

// Live reports whether the session may still be answered (lockcore.Session).
func (c *conn) Live() bool { return !c.dead.Load() }

// send and sendGranted queue a reply from a lock core's effect: queued,
// it answers an ACQUIRE recorded in flight (which is forgotten); wake, it
// comes from another goroutine than the session's reader (which flushes
// its own replies), and the writer is woken.
func (c *conn) send(typ byte, reqID uint32, queued, wake bool) {
	if c.debug {
		c.debugReply(typ, reqID, 0, 0)
	}
	c.mu.Lock()
	if queued {
		c.dropInflightLocked(reqID)
	}
	if c.closing {
		c.mu.Unlock()
		return
	}
	c.out = wire.AppendSimple(c.out, typ, reqID)
	c.afterAppendLocked(wake)
}

func (c *conn) sendGranted(reqID uint32, tok uint64, waited uint32, queued, wake bool) {
	if c.debug {
		c.debugReply(wire.TypeGranted, reqID, tok, waited)
	}
	c.mu.Lock()
	if queued {
		c.dropInflightLocked(reqID)
	}
	if c.closing {
		c.mu.Unlock()
		return
	}
	c.out = wire.AppendGranted(c.out, reqID, tok, waited)
	c.afterAppendLocked(wake)
}

func (c *conn) isInflight(reqID uint32) bool {
	if c.nInflight.Load() == 0 {
		return false
	}
	c.mu.Lock()
	_, ok := c.inflight[reqID]
	c.mu.Unlock()
	return ok
}

// closeWith queues a last frame (nil for none) and makes the session close
// once it has been written.
func (c *conn) closeWith(frame []byte) {
	c.mu.Lock()
	if c.closing {
		c.mu.Unlock()
		return
	}
	c.out = append(c.out, frame...)
	c.closing = true
	c.dead.Store(true)
	started := c.started
	c.mu.Unlock()
	if started {
		c.signal()
	} else {
		// Before HELLO_OK there is no writer: wake the reader, which
		// writes the frame itself (closePending).
		c.nc.SetReadDeadline(aLongTimeAgo)
	}
}

var aLongTimeAgo = time.Unix(1, 0)

// kill closes the connection at once.
func (c *conn) kill() {
	c.mu.Lock()
	c.closing, c.killed = true, true
	c.dead.Store(true)
	c.mu.Unlock()
	c.closeRaw()
	c.signal()
}

// closeRaw closes the connection without a TLS close_notify: tls.Conn's
// Close writes that alert with a 5 s deadline, which a peer that does not
// read (the reason for most drops) makes it wait out; and the caller may
// hold a scheduler lock (an overflow found while queueing a reply under a
// shard mutex, or under the cluster scheduler's on the FSM's goroutine).
func (c *conn) closeRaw() {
	if tc, ok := c.nc.(*tls.Conn); ok {
		tc.NetConn().Close()
		return
	}
	c.nc.Close()
}

func (c *conn) writeLoop() {
	defer close(c.writerDone)
	for range c.wake {
		c.wmu.Lock()
		c.mu.Lock()
		buf := c.out
		c.out, c.spare = c.spare, nil
		closing, killed := c.closing, c.killed
		c.mu.Unlock()
		if killed {
			c.wmu.Unlock()
			return
		}
		if closing {
			c.nc.SetWriteDeadline(time.Now().Add(finalFlushTimeout))
		}
		if len(buf) > 0 {
			if err := c.writeLocked(buf); err != nil {
				c.wmu.Unlock()
				c.kill()
				return
			}
		}
		if closing {
			// Half-close and let the reader drain for a moment, so that the
			// peer reads our last frame instead of a reset.
			if cw, ok := c.nc.(interface{ CloseWrite() error }); ok {
				cw.CloseWrite()
			}
			c.nc.SetReadDeadline(time.Now().Add(lingerTimeout))
			c.wmu.Unlock()
			return
		}
		c.recycle(buf)
		c.wmu.Unlock()
	}
}

// writeLocked writes buf (under wmu) in pieces of at most writeChunk
// bytes, each with a deadline of Config.WriteTimeout (refreshed only when
// an eighth of it has passed, so that it costs nothing per write): a peer
// that reads slowly but steadily is not dropped, one that takes no piece
// within WriteTimeout is.
func (c *conn) writeLocked(buf []byte) error {
	c.mu.Lock()
	closing := c.closing
	c.mu.Unlock()
	st := c.s.cfg.WriteTimeout
	for len(buf) > 0 {
		n := min(len(buf), c.s.writeChunk)
		if !closing {
			if now := time.Now(); c.wdeadline.Sub(now) < st-st/8 {
				c.wdeadline = now.Add(st)
				c.nc.SetWriteDeadline(c.wdeadline)
			}
		}
		if _, err := c.nc.Write(buf[:n]); err != nil {
			if isTimeout(err) && !closing {
				c.warn("session dropped: peer not reading", "write_timeout", st)
				c.s.m.overflows.Add(1)
			}
			return err
		}
		buf = buf[n:]
	}
	return nil
}

func (c *conn) recycle(buf []byte) {
	if cap(buf) > maxSpare || buf == nil {
		return
	}
	c.mu.Lock()
	if c.spare == nil {
		c.spare = buf[:0]
	}
	c.mu.Unlock()
}

// flushInline writes the queued replies from the reader goroutine itself,
// saving a hand-off to the writer; if the writer is busy it is signalled
// instead (it takes everything queued once it is done).
func (c *conn) flushInline() {
	if !c.wmu.TryLock() {
		c.signal()
		return
	}
	c.mu.Lock()
	if c.closing || len(c.out) == 0 {
		c.mu.Unlock()
		c.wmu.Unlock()
		c.signal()
		return
	}
	buf := c.out
	c.out, c.spare = c.spare, nil
	c.mu.Unlock()
	err := c.writeLocked(buf)
	c.recycle(buf)
	c.wmu.Unlock()
	if err != nil {
		c.kill()
	}
}

// serve runs the connection; it is the reader goroutine.
func (c *conn) serve() {
	s := c.s
	defer s.wg.Done()
	if !c.handshakeAndHello() {
		c.closePending()
		s.donePending(c.pendingT)
		s.untrack(c)
		return
	}
	c.readLoop()

	// Stop the writer (it flushes what is queued), then close.
	c.mu.Lock()
	if !c.closing {
		c.closing = true
		c.dead.Store(true)
	}
	c.mu.Unlock()
	c.signal()
	<-c.writerDone
	c.nc.Close()

	// Drop the session's waiting ACQUIREs (queued, or waiting for a
	// token); its grants stay.
	c.mu.Lock()
	fs := make([]flight, 0, len(c.inflight))
	for _, f := range c.inflight {
		fs = append(fs, f)
	}
	clear(c.inflight)
	c.nInflight.Store(0)
	c.mu.Unlock()
	for _, f := range fs {
		s.dropFlight(f)
	}
	s.sessions.Add(-1)
	s.peerSessions.remove(c.peer)
	s.untrack(c)
}

// closePending ends a connection that did not complete HELLO: it writes
// the frame queued for it (an E, or M from a standby), if any, half-closes
// and drains input for a moment so that the peer reads it, then closes.
func (c *conn) closePending() {
	c.mu.Lock()
	buf, killed := c.out, c.killed
	c.out = nil
	c.mu.Unlock()
	if len(buf) > 0 && !killed {
		c.nc.SetWriteDeadline(time.Now().Add(finalFlushTimeout))
		if _, err := c.nc.Write(buf); err == nil {
			if cw, ok := c.nc.(interface{ CloseWrite() error }); ok {
				cw.CloseWrite()
			}
			c.nc.SetReadDeadline(time.Now().Add(lingerTimeout))
			io.Copy(io.Discard, c.nc)
		}
	}
	c.nc.Close()
}

// handshakeAndHello runs the TLS handshake, if any, and reads and checks
// HELLO within HelloTimeout. It returns true once HELLO_OK is queued and
// the writer runs; otherwise the reply (if any) is queued for
// closePending.
func (c *conn) handshakeAndHello() bool {
	s := c.s
	c.nc.SetDeadline(time.Now().Add(s.cfg.HelloTimeout))
	if c.dead.Load() {
		// closeWith (Shutdown's E(5)) came before that deadline and its
		// wake-up was just overwritten: wake ourselves, as it would have.
		c.nc.SetReadDeadline(aLongTimeAgo)
	}
	if tc, ok := c.nc.(*tls.Conn); ok {
		if err := tc.Handshake(); err != nil {
			if !c.dead.Load() {
				c.warn("TLS handshake failed", "err", err)
			}
			c.kill() // nothing can be written on it
			return false
		}
	}
	c.nc.SetWriteDeadline(time.Time{})
	// Unbuffered: the reader reads the length prefix, then exactly the
	// body, and nothing past the HELLO.
	body, err := wire.NewReader(c.nc).Next()
	if err != nil {
		switch {
		case errors.Is(err, wire.ErrFrameSize):
			c.protoError(wire.CodeMalformed, 0, "frame length out of range")
		case isTimeout(err) && !c.dead.Load():
			c.protoError(wire.CodeMalformed, 0, "HELLO timeout")
		}
		return false
	}
	if c.dead.Load() {
		return false
	}
	var req wire.Request
	return c.hello(body, &req)
}

// drain discards input until the peer closes or the linger deadline set by
// the writer (or ours, as a bound) passes.
func (c *conn) drain() {
	c.nc.SetReadDeadline(time.Now().Add(finalFlushTimeout + lingerTimeout))
	r := io.Reader(c.nc)
	if c.br != nil {
		r = c.br
	}
	io.Copy(io.Discard, r)
}

func reqIDOf(body []byte) uint32 {
	id, _ := wire.ReqID(body)
	return id
}

// readLoop reads and handles the requests of a session after HELLO_OK.
func (c *conn) readLoop() {
	s := c.s
	c.br = bufio.NewReaderSize(c.nc, readBufSize)
	fr := wire.NewReader(c.br)
	var req wire.Request
	for {
		body, err := fr.Next()
		if err != nil {
			if errors.Is(err, wire.ErrFrameSize) {
				c.protoError(wire.CodeMalformed, 0, "frame length out of range")
				c.drain()
			}
			return
		}
		if c.dead.Load() {
			c.drain()
			return
		}
		if !c.active.Load() {
			c.active.Store(true)
		}
		if body[0] == wire.TypeHello {
			c.protoError(wire.CodeMalformed, reqIDOf(body), "second HELLO")
			c.drain()
			return
		}
		// By the session's version: on version 1, C and V are unknown
		// types (E(1)).
		if err := wire.DecodeRequestVersion(body, &req, c.ver); err != nil {
			c.protoError(wire.CodeMalformed, reqIDOf(body), err.Error())
			c.drain()
			return
		}
		// A CANCEL names an ACQUIRE in flight: the one req_id allowed.
		if req.Type != wire.TypeCancel && c.isInflight(req.ReqID) {
			c.protoError(wire.CodeMalformed, req.ReqID, "req_id already in flight")
			c.drain()
			return
		}
		if c.debug {
			c.debugRequest(&req)
		}
		switch req.Type {
		case wire.TypeAcquire:
			// The whole frame has been read: the wait starts now.
			arrived := s.now()
			if !keyLenOK(req.Key) || req.LeaseS < wire.MinLeaseS || req.LeaseS > wire.MaxLeaseS {
				c.protoError(wire.CodeInvalidArg, req.ReqID, msgBadAcquire)
				c.drain()
				return
			}
			s.acquire(c, &req, arrived)
		case wire.TypeRelease:
			if !keyLenOK(req.Key) {
				c.protoError(wire.CodeInvalidArg, req.ReqID, msgBadKey)
				c.drain()
				return
			}
			s.release(c, &req, false)
		case wire.TypePing:
			c.replySimple(wire.TypePong, req.ReqID)
		case wire.TypeCancel: // version 2
			s.cancel(c, req.ReqID)
		case wire.TypeReleaseOwned: // version 2
			if !keyLenOK(req.Key) {
				c.protoError(wire.CodeInvalidArg, req.ReqID, msgBadKey)
				c.drain()
				return
			}
			s.release(c, &req, true)
		case wire.TypeExtend: // version 3
			arrived := s.now()
			if !keyLenOK(req.Key) || req.LeaseS < wire.MinLeaseS || req.LeaseS > wire.MaxLeaseS {
				c.protoError(wire.CodeInvalidArg, req.ReqID, msgBadAcquire)
				c.drain()
				return
			}
			s.extend(c, &req, arrived)
		}
		if !c.nextFrameBuffered() {
			c.flushInline()
		}
	}
}

// nextFrameBuffered reports whether a whole next frame is already buffered
// (so the writer need not be woken yet: one write will carry both replies).
func (c *conn) nextFrameBuffered() bool {
	n := c.br.Buffered()
	if n < wire.HeaderLen {
		return false
	}
	c.mu.Lock()
	big := len(c.out) >= flushEvery
	c.mu.Unlock()
	if big {
		return false
	}
	hdr, _ := c.br.Peek(wire.HeaderLen)
	return n >= wire.HeaderLen+int(binary.BigEndian.Uint32(hdr))
}

// helloOKVersionAt is the offset of the version byte in a HELLO_OK frame
// (length prefix, type, req_id).
const helloOKVersionAt = wire.HeaderLen + 5

// hello handles the first frame; it returns false if the session must close.
func (c *conn) hello(body []byte, req *wire.Request) bool {
	s := c.s
	if body[0] != wire.TypeHello {
		c.protoError(wire.CodeMalformed, reqIDOf(body), "first frame must be HELLO")
		return false
	}
	// Versions 1 to 3 (the version byte is checked first, E(2)).
	if err := wire.DecodeRequestVersion(body, req, wire.Version3); err != nil {
		if errors.Is(err, wire.ErrUnsupportedVersion) {
			c.protoError(wire.CodeVersion, req.ReqID, "unsupported protocol version")
		} else {
			c.protoError(wire.CodeMalformed, reqIDOf(body), err.Error())
		}
		return false
	}
	debug := s.log.Enabled(context.Background(), slog.LevelDebug)
	if !s.checkToken(req.AuthToken) {
		if debug {
			s.log.Debug("HELLO refused: unauthorized", "peer", c.remote, "req_id", req.ReqID, "version", req.Version, "name", string(req.Name),
				"token_sent", len(req.AuthToken) > 0)
		}
		return c.authFailed(req.ReqID)
	}
	s.mode.hello()
	rs := s.role.Load()
	if !rs.role.Serving() {
		if debug {
			s.log.Debug("HELLO answered M: not serving", "peer", c.remote, "req_id", req.ReqID, "version", req.Version, "name", string(req.Name),
				"role", rs.role.String(), "hint", string(rs.hint))
		}
		f, _ := wire.AppendResponse(nil, &wire.Response{Type: wire.TypeNotActive, ReqID: req.ReqID, Hint: rs.hint})
		c.closeWith(f)
		return false
	}
	if s.sessions.Add(1) > int64(s.cfg.MaxSessions) {
		s.sessions.Add(-1)
		c.protoError(wire.CodeTooManySession, req.ReqID, "too many sessions")
		return false
	}
	if !s.peerSessions.add(c.peer, s.cfg.MaxSessionsPerPeer) {
		s.sessions.Add(-1)
		s.m.peerLimited.Add(1)
		c.protoError(wire.CodeTooManySession, req.ReqID, "too many sessions from this address")
		return false
	}
	c.mu.Lock()
	if c.closing {
		// Shutdown (E(5)) or a drop came first: no HELLO_OK after it.
		c.mu.Unlock()
		s.sessions.Add(-1)
		s.peerSessions.remove(c.peer)
		return false
	}
	c.started = true
	c.debug = debug
	c.client = &lockcore.Client{Name: string(req.Name), Addr: c.remote}
	c.nc.SetReadDeadline(time.Time{})
	c.ver = req.Version
	start := len(c.out)
	if req.Version >= wire.Version3 {
		c.out = append(c.out, rs.helloOK3...) // with the group's identity
	} else {
		c.out = append(c.out, rs.helloOK...)
	}
	wire.PutReqID(c.out[start:], req.ReqID)
	c.out[start+helloOKVersionAt] = req.Version // HELLO_OK carries the version asked for
	c.mu.Unlock()
	c.active.Store(true)
	c.session.Store(true)
	// No longer pending before the client can read HELLO_OK: a client
	// that has its session never finds itself counted among the
	// connections before HELLO (MaxPendingConns).
	s.donePending(c.pendingT)
	go c.writeLoop()
	c.signal()
	if debug {
		s.log.Debug("HELLO_OK", "peer", c.remote, "req_id", req.ReqID, "version", req.Version, "name", string(req.Name), "role", rs.role.String())
	}
	return true
}

// debugRequest logs a request of a session at Debug (c.debug): its
// req_id, type and fields, which the reply's line (debugReply) names by
// the same peer and req_id. PINGs are left out.
func (c *conn) debugRequest(req *wire.Request) {
	switch req.Type {
	case wire.TypeAcquire:
		c.s.log.Debug("request ACQUIRE", "peer", c.remote, "req_id", req.ReqID, "key", string(req.Key), "wait_s", req.WaitS, "lease_s", req.LeaseS)
	case wire.TypeRelease, wire.TypeReleaseOwned:
		msg := "request RELEASE"
		if req.Type == wire.TypeReleaseOwned {
			msg = "request RELEASE_OWNED"
		}
		c.s.log.Debug(msg, "peer", c.remote, "req_id", req.ReqID, "key", string(req.Key), "token", req.Token)
	case wire.TypeCancel:
		c.s.log.Debug("request CANCEL", "peer", c.remote, "req_id", req.ReqID)
	case wire.TypeExtend:
		c.s.log.Debug("request EXTEND", "peer", c.remote, "req_id", req.ReqID, "key", string(req.Key), "token", req.Token, "lease_s", req.LeaseS)
	}
}

// debugReply logs a reply to a request of a session at Debug (c.debug):
// grants with their token, releases (R, N), T, B. PONGs are left out.
func (c *conn) debugReply(typ byte, reqID uint32, tok uint64, waited uint32) {
	switch typ {
	case wire.TypePong:
	case wire.TypeGranted:
		c.s.log.Debug("reply G: granted", "peer", c.remote, "req_id", reqID, "token", tok, "waited_ms", waited)
	case wire.TypeReleased:
		c.s.log.Debug("reply R: released", "peer", c.remote, "req_id", reqID)
	case wire.TypeNotHeld:
		c.s.log.Debug("reply N: not held", "peer", c.remote, "req_id", reqID)
	case wire.TypeKept:
		c.s.log.Debug("reply K: lease extended", "peer", c.remote, "req_id", reqID)
	case wire.TypeTimedOut:
		c.s.log.Debug("reply T: timed out", "peer", c.remote, "req_id", reqID)
	case wire.TypeBusy:
		c.s.log.Debug("reply B: busy", "peer", c.remote, "req_id", reqID)
	default:
		c.s.log.Debug("reply", "peer", c.remote, "req_id", reqID, "type", string(rune(typ)))
	}
}

// authFailed answers a HELLO with a wrong client token: E(3), after the
// delay the peer's recent failures call for (authThrottle), or no answer
// at all if that delay is too long. It returns false.
func (c *conn) authFailed(reqID uint32) bool {
	s := c.s
	s.m.authFailures.Add(1)
	wait, held, ok := s.auth.failure(c.peer, time.Now())
	if held != nil {
		defer s.auth.done(held)
	}
	if !ok {
		s.m.authThrottled.Add(1)
		c.warn("HELLO closed without a reply: too many client authentication failures from this address")
		return false
	}
	if wait > 0 {
		t := time.NewTimer(wait)
		select {
		case <-t.C:
		case <-s.closingCh:
			t.Stop()
			return false // Shutdown has queued E(5), or Close kills us
		}
	}
	c.protoError(wire.CodeUnauthorized, reqID, "unauthorized")
	return false
}

// checkToken compares the SHA-256 digest of tok with those of every
// configured token in constant time, so that neither which token nor its
// length leaks through timing.
func (s *Server) checkToken(tok []byte) bool {
	if len(s.tokenDigests) == 0 {
		return true
	}
	d := sha256.Sum256(tok)
	ok := 0
	for i := range s.tokenDigests {
		ok |= subtle.ConstantTimeCompare(d[:], s.tokenDigests[i][:])
	}
	return ok == 1
}

// keyLenOK reports whether key has a length the protocol allows (the
// decoder only checks that it fits its one-byte length field).
func keyLenOK(key []byte) bool {
	return len(key) >= wire.MinKeyLen && len(key) <= wire.MaxKeyLen
}

// The messages of E(4), with the codec's limits.
var (
	msgBadKey     = fmt.Sprintf("key_len must be %d..%d", wire.MinKeyLen, wire.MaxKeyLen)
	msgBadAcquire = fmt.Sprintf("key_len must be %d..%d and lease_s %d..%d", wire.MinKeyLen, wire.MaxKeyLen, wire.MinLeaseS, wire.MaxLeaseS)
)

// protoError sends E(code) and closes the session.
func (c *conn) protoError(code uint16, reqID uint32, msg string) {
	c.s.m.protoError(code)
	c.warn("protocol violation", "code", code, "req_id", reqID, "reason", msg)
	c.closeWith(wire.AppendError(nil, reqID, code, msg))
}

func (s *Server) internalError(c *conn, reqID uint32, err error) {
	s.m.protoError(wire.CodeInternal)
	s.log.Error("internal error", "peer", c.remote, "req_id", reqID, "err", err)
	c.closeWith(wire.AppendError(nil, reqID, wire.CodeInternal, "internal error"))
}

func (s *Server) internalErrorQueued(c *conn, reqID uint32, err error) {
	c.mu.Lock()
	c.dropInflightLocked(reqID)
	c.mu.Unlock()
	s.internalError(c, reqID, err)
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}
