// Package faultproxy is a TCP proxy for tests that injects network faults
// between a Ticketing client and server, switchable at run time, per
// connection.
//
//	p, err := faultproxy.New("127.0.0.1:5225") // listens on 127.0.0.1:0
//	defer p.Close()
//	b, _ := broker.New(broker.Config{Addrs: []string{p.Addr()}})
//	for _, c := range p.Conns() {
//		c.SetDelay(50 * time.Millisecond)
//	}
//
// # Faults
//
//   - Delay: every chunk read from one side is forwarded to the other no
//     earlier than the delay after it was read (latency, not a throughput
//     limit). Order is kept.
//   - Cut mid-frame: the proxy follows the protocol's framing (u32 BE
//     length prefix) in each direction; Cut(dir, n) forwards the first n
//     bytes of the next frame in that direction and then closes both
//     sockets, so the receiver sees a truncated frame followed by EOF.
//   - Blackhole: bytes are read and dropped in both directions; the sockets
//     stay open, so the peers see silence, not a close.
//   - Reset: both sockets are closed with SO_LINGER 0, which sends RST.
//   - Refuse (a connection's starting fault only): the connection is
//     reset at once and the target is not dialled, as by a host whose
//     port is closed: nothing reaches the target, however long the
//     client retries.
//
// Proxy.SetDefault sets the faults a new connection starts with (for
// instance a blackhole, so dials succeed but HELLO is never answered).
// Proxy.SetClassifier chooses them per connection instead, from the
// client's address (Conn.ClientAddr): a test that knows which process owns
// a source port can cut one peer's links and not another's.
//
// # Concurrency
//
// All methods are safe for concurrent use. Close closes the listener and
// every connection and returns after every goroutine of the proxy exited.
package faultproxy

import (
	"encoding/binary"
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// Direction names one half of a proxied connection.
type Direction int

const (
	// ClientToServer is the half from the dialling client to the target.
	ClientToServer Direction = iota
	// ServerToClient is the half from the target back to the client.
	ServerToClient
)

// String returns "client->server" or "server->client".
func (d Direction) String() string {
	if d == ClientToServer {
		return "client->server"
	}
	return "server->client"
}

// Faults is the fault state a connection starts with (see SetDefault).
type Faults struct {
	// Delay is the latency added to every chunk in both directions.
	Delay time.Duration
	// Blackhole drops everything in both directions.
	Blackhole bool
	// Refuse resets the connection as soon as it is accepted, without
	// dialling the target (the others are then moot).
	Refuse bool
}

// Proxy forwards TCP connections from its listener to one target address.
type Proxy struct {
	target string
	ln     net.Listener

	mu       sync.Mutex
	conns    map[*Conn]struct{}
	def      Faults
	classify func(client net.Addr) Faults
	closed   bool
	accepted atomic.Int64
	nextID   atomic.Int64

	wg sync.WaitGroup
}

// New listens on 127.0.0.1:0 and forwards every accepted connection to
// target. It returns an error only if it cannot listen.
func New(target string) (*Proxy, error) {
	return NewOn("127.0.0.1:0", target)
}

// NewOn is New listening on addr (host:port): for a caller that hands out
// the ports of a test itself, so that the kernel cannot give the proxy a
// port the caller gave to something else a moment ago.
func NewOn(addr, target string) (*Proxy, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	p := &Proxy{target: target, ln: ln, conns: make(map[*Conn]struct{})}
	p.wg.Add(1)
	go p.acceptLoop()
	return p, nil
}

// Addr is the proxy's listening address, host:port.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Accepted is the number of connections accepted so far.
func (p *Proxy) Accepted() int64 { return p.accepted.Load() }

// SetDefault sets the faults of connections accepted from now on.
func (p *Proxy) SetDefault(f Faults) {
	p.mu.Lock()
	p.def = f
	p.mu.Unlock()
}

// SetClassifier makes f choose the faults of every connection accepted
// from now on, from the client's address; while it is set, SetDefault's
// faults are not used. nil removes it. f runs on the accepting goroutine,
// before the target is dialled, and must not call the Proxy.
func (p *Proxy) SetClassifier(f func(client net.Addr) Faults) {
	p.mu.Lock()
	p.classify = f
	p.mu.Unlock()
}

// Conns returns the connections that are still open.
func (p *Proxy) Conns() []*Conn {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]*Conn, 0, len(p.conns))
	for c := range p.conns {
		out = append(out, c)
	}
	return out
}

// Close stops accepting, closes every connection and waits for the
// proxy's goroutines. It is idempotent.
func (p *Proxy) Close() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		p.wg.Wait()
		return nil
	}
	p.closed = true
	conns := make([]*Conn, 0, len(p.conns))
	for c := range p.conns {
		conns = append(conns, c)
	}
	p.mu.Unlock()
	err := p.ln.Close()
	for _, c := range conns {
		c.Close()
	}
	p.wg.Wait()
	return err
}

func (p *Proxy) acceptLoop() {
	defer p.wg.Done()
	for {
		client, err := p.ln.Accept()
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			return
		}
		p.accepted.Add(1)
		p.mu.Lock()
		faults, classify := p.def, p.classify
		p.mu.Unlock()
		if classify != nil {
			faults = classify(client.RemoteAddr())
		}
		if faults.Refuse {
			reset(client)
			continue
		}
		server, err := net.DialTimeout("tcp", p.target, 2*time.Second)
		if err != nil {
			// Target down: the client sees a reset, as it would without
			// the proxy.
			reset(client)
			continue
		}
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			client.Close()
			server.Close()
			return
		}
		c := &Conn{id: p.nextID.Add(1), client: client, server: server, done: make(chan struct{})}
		c.delay.Store(int64(faults.Delay))
		c.blackhole.Store(faults.Blackhole)
		p.conns[c] = struct{}{}
		p.mu.Unlock()
		c.start(&p.wg, func() {
			p.mu.Lock()
			delete(p.conns, c)
			p.mu.Unlock()
		})
	}
}

// Conn is one proxied connection.
type Conn struct {
	id             int64
	client, server net.Conn

	delay     atomic.Int64 // time.Duration
	blackhole atomic.Bool
	cutMu     sync.Mutex
	cut       [2]int // per Direction: bytes of the next frame to forward before closing; 0 = none

	closeOnce sync.Once
	done      chan struct{}
}

// ID identifies the connection within its proxy (1, 2, ...).
func (c *Conn) ID() int64 { return c.id }

// ClientAddr is the address the client connected from (the remote
// address of the accepted socket).
func (c *Conn) ClientAddr() net.Addr { return c.client.RemoteAddr() }

// SetDelay sets the latency added in both directions (0: none).
func (c *Conn) SetDelay(d time.Duration) { c.delay.Store(int64(d)) }

// Blackhole starts (true) or stops (false) dropping everything in both
// directions. Bytes dropped while it was on are gone.
func (c *Conn) Blackhole(on bool) { c.blackhole.Store(on) }

// Cut arranges for the next frame in dir to be forwarded only up to its
// first n bytes (n >= 1; the 4-byte length prefix counts), after which both
// sockets are closed. A frame already partly forwarded is finished first.
func (c *Conn) Cut(dir Direction, n int) {
	if n < 1 {
		n = 1
	}
	c.cutMu.Lock()
	c.cut[dir] = n
	c.cutMu.Unlock()
}

// Reset closes both sockets with RST.
func (c *Conn) Reset() {
	c.closeOnce.Do(func() {
		reset(c.client)
		reset(c.server)
		close(c.done)
	})
}

// Close closes both sockets normally (FIN).
func (c *Conn) Close() {
	c.closeOnce.Do(func() {
		c.client.Close()
		c.server.Close()
		close(c.done)
	})
}

// Done is closed when the connection is closed.
func (c *Conn) Done() <-chan struct{} { return c.done }

func reset(nc net.Conn) {
	if tc, ok := nc.(*net.TCPConn); ok {
		_ = tc.SetLinger(0)
	}
	_ = nc.Close()
}

func (c *Conn) start(wg *sync.WaitGroup, onClose func()) {
	var halves sync.WaitGroup
	halves.Add(2)
	wg.Add(3)
	go func() { defer wg.Done(); defer halves.Done(); c.pump(ClientToServer, c.client, c.server) }()
	go func() { defer wg.Done(); defer halves.Done(); c.pump(ServerToClient, c.server, c.client) }()
	go func() {
		defer wg.Done()
		halves.Wait()
		onClose()
	}()
}

type chunk struct {
	data []byte
	at   time.Time // forward no earlier than this
}

// pump forwards src to dst: a reader goroutine stamps chunks with their
// due time, the writer applies the faults in stream order.
func (c *Conn) pump(dir Direction, src, dst net.Conn) {
	ch := make(chan chunk, 256)
	var rd sync.WaitGroup
	rd.Add(1)
	go func() {
		defer rd.Done()
		defer close(ch)
		for {
			buf := make([]byte, 4096)
			n, err := src.Read(buf)
			if n > 0 {
				select {
				case ch <- chunk{data: buf[:n], at: time.Now().Add(time.Duration(c.delay.Load()))}:
				case <-c.done:
					return
				}
			}
			if err != nil {
				return
			}
		}
	}()
	defer rd.Wait()
	// Any end of this half closes the whole connection (both halves), as a
	// crashed proxy would.
	defer c.Close()

	var fr framer
	cutLeft := 0 // bytes still to forward before a cut; 0: no cut in progress
	for {
		var ck chunk
		var ok bool
		select {
		case ck, ok = <-ch:
		case <-c.done:
			return
		}
		if !ok {
			return
		}
		if d := time.Until(ck.at); d > 0 {
			t := time.NewTimer(d)
			select {
			case <-t.C:
			case <-c.done:
				t.Stop()
				return
			}
		}
		if c.blackhole.Load() && cutLeft == 0 {
			fr.advance(ck.data) // keep framing in step with the stream
			continue
		}
		data := ck.data
		for len(data) > 0 {
			if cutLeft > 0 {
				k := min(cutLeft, len(data))
				if _, err := dst.Write(data[:k]); err != nil {
					return
				}
				cutLeft -= k
				data = data[k:]
				if cutLeft == 0 {
					return // the deferred Close cuts the connection
				}
				continue
			}
			if fr.atStart() {
				c.cutMu.Lock()
				n := c.cut[dir]
				c.cut[dir] = 0
				c.cutMu.Unlock()
				if n > 0 {
					cutLeft = n
					continue
				}
				if _, err := dst.Write(data); err != nil {
					return
				}
				fr.advance(data)
				break
			}
			k := fr.untilStart(len(data))
			if _, err := dst.Write(data[:k]); err != nil {
				return
			}
			fr.advance(data[:k])
			data = data[k:]
		}
	}
}

// framer follows frame boundaries in one direction of the stream.
type framer struct {
	hdr  [4]byte
	hdrN int // header bytes seen of the current frame
	left int // body bytes still to come
}

func (f *framer) atStart() bool { return f.hdrN == 0 && f.left == 0 }

// untilStart is how many of the next avail bytes finish the current frame
// (or all of them if it does not finish within avail).
func (f *framer) untilStart(avail int) int {
	if f.hdrN == 0 && f.left == 0 {
		return 0
	}
	need := f.left
	if f.hdrN > 0 {
		// Header incomplete: the body length is not known yet; take the
		// rest of the header and let advance parse it.
		need = 4 - f.hdrN
	}
	return min(need, avail)
}

func (f *framer) advance(b []byte) {
	for len(b) > 0 {
		if f.left > 0 {
			k := min(f.left, len(b))
			f.left -= k
			b = b[k:]
			continue
		}
		k := copy(f.hdr[f.hdrN:], b)
		f.hdrN += k
		b = b[k:]
		if f.hdrN == 4 {
			f.hdrN = 0
			f.left = int(binary.BigEndian.Uint32(f.hdr[:]))
		}
	}
}
