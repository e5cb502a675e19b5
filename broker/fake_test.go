package broker_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ticketing-dev/ticketing/broker"
	"github.com/ticketing-dev/ticketing/internal/wire"
)

// fakeServer is a scripted Ticketing server speaking internal/wire. By
// default it grants every ACQUIRE with a fresh token, answers RELEASE with R
// and PING with PONG; the key of a request selects a scripted behaviour
// (see script), and tests may replace Hello, Handle or AfterHello.
//
// It speaks protocol version 1 only, as servers before version 2 did, unless
// SetVersion(2) or SetVersion(3) says otherwise: a HELLO asking for a
// version above the fake's is answered E(2) by the fake itself (counted in
// versionRefused, not in hellos, and never shown to Hello), C or V on a
// version-1 session get E(1), and X below version 3 too. A version-3
// HELLO_OK carries the identity set by SetCluster (default none). A connection so refused is not one of its sessions:
// accepted, Conns and the fakeConn IDs count only the others.
type fakeServer struct {
	t    testing.TB
	ln   net.Listener
	Addr string

	// Hello answers the HELLO (default: O). It may close the conn.
	Hello func(fc *fakeConn, req *wire.Request)
	// handle answers one request after HELLO (default: script); see SetHandle.
	handle atomic.Pointer[func(fc *fakeConn, req *wire.Request)]
	// AfterHello, if set, takes over the raw byte stream after HELLO_OK.
	AfterHello func(fc *fakeConn, r io.Reader)

	bytes          atomic.Int64 // every byte received, on every conn
	accepted       atomic.Int64
	hellos         atomic.Int64  // HELLOs of a version the fake speaks
	versionRefused atomic.Int64  // HELLOs answered E(2) by the fake
	version        atomic.Uint32 // highest version spoken; 0 means 1
	cluster        atomic.Pointer[string]
	nextToken      atomic.Uint64
	counts         [256]atomic.Int64 // request frames received, by type byte

	mu       sync.Mutex
	all      []*fakeConn // every connection, closed by Close and DropAll
	conns    []*fakeConn // sessions: past the HELLO's version check
	log      []fakeReq   // every ACQUIRE, RELEASE, RELEASE_OWNED and CANCEL, in order
	tokens   []string    // HELLO tokens seen
	closed   bool
	wg       sync.WaitGroup
	released map[uint64]int // token -> RELEASEs and RELEASE_OWNEDs received
}

type fakeReq struct {
	Conn   int
	Type   byte
	ReqID  uint32
	Key    string
	Owner  [16]byte // ACQUIRE and RELEASE_OWNED
	WaitS  uint8
	LeaseS uint8
	Token  uint64
}

type fakeConn struct {
	srv     *fakeServer
	nc      net.Conn
	ID      int
	Version uint8 // the session's, set at HELLO
	wmu     sync.Mutex
	pings   atomic.Int64
	reqs    atomic.Int64

	pmu    sync.Mutex
	parked map[uint32]string // version 2: ACQUIREs waiting for a CANCEL, by req_id: their script word
}

func newFake(t testing.TB) *fakeServer { return newFakeOn(t, "127.0.0.1:0", nil) }

func newFakeOn(t testing.TB, addr string, tlsCfg *tls.Config) *fakeServer {
	t.Helper()
	return newFakeVersion(t, addr, tlsCfg, 1)
}

// newFakeVersion is newFakeOn speaking up to version v from its first
// connection on.
func newFakeVersion(t testing.TB, addr string, tlsCfg *tls.Config, v uint8) *fakeServer {
	t.Helper()
	return newFakeSetup(t, addr, tlsCfg, v, nil)
}

// newFakeSetup is newFakeVersion calling setup, if not nil, before the
// fake accepts its first connection (to set Hello on an address the
// broker is already redialling).
func newFakeSetup(t testing.TB, addr string, tlsCfg *tls.Config, v uint8, setup func(*fakeServer)) *fakeServer {
	t.Helper()
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	if tlsCfg != nil {
		ln = tls.NewListener(ln, tlsCfg)
	}
	f := &fakeServer{t: t, ln: ln, Addr: ln.Addr().String(), released: map[uint64]int{}}
	f.version.Store(uint32(v))
	if setup != nil {
		setup(f)
	}
	f.wg.Add(1)
	go f.acceptLoop()
	t.Cleanup(f.Close)
	return f
}

func (f *fakeServer) Close() {
	f.mu.Lock()
	if f.closed {
		f.mu.Unlock()
		return
	}
	f.closed = true
	f.ln.Close()
	for _, c := range f.all {
		c.nc.Close()
	}
	f.mu.Unlock()
	f.wg.Wait()
}

// Restart closes f and starts a fake speaking up to version v on its
// address: every session drops, and the broker's redials find the new one.
func (f *fakeServer) Restart(v uint8) *fakeServer {
	f.t.Helper()
	f.Close()
	return newFakeVersion(f.t, f.Addr, nil, v)
}

// DropAll closes every open conn (the server stays up).
func (f *fakeServer) DropAll() {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, c := range f.all {
		c.nc.Close()
	}
}

func (f *fakeServer) acceptLoop() {
	defer f.wg.Done()
	for {
		nc, err := f.ln.Accept()
		if err != nil {
			return
		}
		f.mu.Lock()
		if f.closed {
			f.mu.Unlock()
			nc.Close()
			return
		}
		fc := &fakeConn{srv: f, nc: nc, ID: -1}
		f.all = append(f.all, fc)
		f.wg.Add(1)
		f.mu.Unlock()
		go fc.serve()
	}
}

type countingReader struct {
	r io.Reader
	n *atomic.Int64
}

func (c countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n.Add(int64(n))
	return n, err
}

func (fc *fakeConn) serve() {
	f := fc.srv
	defer f.wg.Done()
	defer fc.nc.Close()
	cr := countingReader{fc.nc, &f.bytes}
	fr := wire.NewReader(cr)
	body, err := fr.Next()
	if err != nil {
		return
	}
	var req wire.Request
	err = wire.DecodeRequestVersion(body, &req, uint8(max(1, f.version.Load())))
	if errors.Is(err, wire.ErrUnsupportedVersion) && req.Type == wire.TypeHello {
		f.versionRefused.Add(1)
		fc.send(wire.AppendError(nil, req.ReqID, wire.CodeVersion, "unsupported protocol version"))
		return
	}
	f.mu.Lock()
	fc.ID = len(f.conns)
	f.conns = append(f.conns, fc)
	f.accepted.Add(1)
	f.mu.Unlock()
	if err != nil || req.Type != wire.TypeHello {
		fc.send(wire.AppendError(nil, 0, wire.CodeMalformed, "expected HELLO"))
		return
	}
	fc.Version = req.Version
	f.hellos.Add(1)
	f.mu.Lock()
	f.tokens = append(f.tokens, string(req.AuthToken))
	f.mu.Unlock()
	if f.Hello != nil {
		f.Hello(fc, &req)
	} else {
		fc.sendResp(f.helloOK(&req))
	}
	if f.AfterHello != nil {
		f.AfterHello(fc, cr)
		return
	}
	for {
		body, err := fr.Next()
		if err != nil {
			return
		}
		// Counted by the frame's type byte before decoding: a C or V on a
		// version-1 session counts, and gets E(1).
		f.counts[body[0]].Add(1)
		if err := wire.DecodeRequestVersion(body, &req, fc.Version); err != nil {
			fc.send(wire.AppendError(nil, 0, wire.CodeMalformed, err.Error()))
			return
		}
		if req.Type == wire.TypePing {
			fc.pings.Add(1)
		} else {
			fc.reqs.Add(1)
			f.mu.Lock()
			f.log = append(f.log, fakeReq{Conn: fc.ID, Type: req.Type, ReqID: req.ReqID, Key: string(req.Key),
				Owner: req.Owner, WaitS: req.WaitS, LeaseS: req.LeaseS, Token: req.Token})
			if req.Type == wire.TypeRelease || req.Type == wire.TypeReleaseOwned {
				f.released[req.Token]++
			}
			f.mu.Unlock()
		}
		if h := f.handle.Load(); h != nil {
			(*h)(fc, &req)
		} else {
			f.script(fc, &req)
		}
	}
}

func (fc *fakeConn) send(b []byte) {
	fc.wmu.Lock()
	defer fc.wmu.Unlock()
	fc.nc.Write(b)
}

func (fc *fakeConn) sendResp(r *wire.Response) {
	b, err := wire.AppendResponse(nil, r)
	if err != nil {
		panic(err)
	}
	fc.send(b)
}

func (fc *fakeConn) Close() { fc.nc.Close() }

// later runs f in a goroutine the server waits for.
func (f *fakeServer) later(d time.Duration, fn func()) {
	f.wg.Add(1)
	go func() {
		defer f.wg.Done()
		time.Sleep(d)
		fn()
	}()
}

// script answers by key. For an ACQUIRE the key's first word (before '/')
// selects the behaviour; for a RELEASE or RELEASE_OWNED, a word after
// "rel-" in the key does.
//
//	busy timeout never close closepartial malformed oversized unknowntype
//	unknownid wrongtype pong empty fatalthengrant notactive error grantclose
//	delay:<dur> waited:<ms> (G at once, claiming waited_ms) honest:<dur> (G
//	after dur, waited_ms dur) token0 (G with token 0) (anything else: G)
//	version 2 only: wait (queued until its CANCEL, then T) waitgrant
//	(queued until its CANCEL, then G: granted just before the CANCEL was
//	read) waitdeaf (queued; its CANCEL is ignored). A CANCEL naming
//	nothing queued is ignored, as the protocol says.
//	release: rel-never rel-notheld rel-late (R after 400ms) rel-granted (G)
//	rel-closeonce (else R)
//	extend (version 3): ext-never ext-notheld ext-close ext-late (K after
//	400ms) (else K)
func (f *fakeServer) script(fc *fakeConn, req *wire.Request) {
	id := req.ReqID
	key := string(req.Key)
	switch req.Type {
	case wire.TypePing:
		fc.send(wire.AppendSimple(nil, wire.TypePong, id))
		return
	case wire.TypeCancel:
		fc.pmu.Lock()
		word, ok := fc.parked[id]
		if ok && word != "waitdeaf" {
			delete(fc.parked, id)
		}
		fc.pmu.Unlock()
		switch {
		case !ok || word == "waitdeaf":
		case word == "waitgrant":
			fc.send(wire.AppendGranted(nil, id, f.nextToken.Add(1), 0))
		default:
			fc.send(wire.AppendSimple(nil, wire.TypeTimedOut, id))
		}
		return
	case wire.TypeExtend:
		switch {
		case strings.Contains(key, "ext-never"):
		case strings.Contains(key, "ext-notheld"):
			fc.send(wire.AppendSimple(nil, wire.TypeNotHeld, id))
		case strings.Contains(key, "ext-close"):
			fc.Close()
		case strings.Contains(key, "ext-late"):
			f.later(400*time.Millisecond, func() { fc.send(wire.AppendSimple(nil, wire.TypeKept, id)) })
		default:
			fc.send(wire.AppendSimple(nil, wire.TypeKept, id))
		}
		return
	case wire.TypeRelease, wire.TypeReleaseOwned:
		switch {
		case strings.Contains(key, "rel-never"):
		case strings.Contains(key, "rel-notheld"):
			fc.send(wire.AppendSimple(nil, wire.TypeNotHeld, id))
		case strings.Contains(key, "rel-late"):
			f.later(400*time.Millisecond, func() { fc.send(wire.AppendSimple(nil, wire.TypeReleased, id)) })
		case strings.Contains(key, "rel-granted"):
			fc.send(wire.AppendGranted(nil, id, 7, 0))
		case strings.Contains(key, "rel-closeonce"):
			f.mu.Lock()
			n := f.released[req.Token]
			f.mu.Unlock()
			if n == 1 {
				fc.Close()
				return
			}
			fc.send(wire.AppendSimple(nil, wire.TypeReleased, id))
		default:
			fc.send(wire.AppendSimple(nil, wire.TypeReleased, id))
		}
		return
	}
	word, _, _ := strings.Cut(key, "/")
	grant := func(waited uint32) []byte {
		return wire.AppendGranted(nil, id, f.nextToken.Add(1), waited)
	}
	switch {
	case fc.Version >= 2 && (word == "wait" || word == "waitgrant" || word == "waitdeaf"):
		fc.pmu.Lock()
		if fc.parked == nil {
			fc.parked = map[uint32]string{}
		}
		fc.parked[id] = word
		fc.pmu.Unlock()
	case word == "busy":
		fc.send(wire.AppendSimple(nil, wire.TypeBusy, id))
	case word == "timeout":
		fc.send(wire.AppendSimple(nil, wire.TypeTimedOut, id))
	case word == "never":
	case word == "close":
		fc.Close()
	case word == "malformed":
		fc.send([]byte{0, 0, 0, 6, wire.TypeGranted, 0, 0, 0, byte(id), 1}) // G too short
	case word == "oversized":
		fc.send([]byte{0, 0, 0x07, 0xd0, wire.TypeGranted})
	case word == "unknowntype":
		fc.send(append([]byte{0, 0, 0, 5, 'Z'}, binary.BigEndian.AppendUint32(nil, id)...))
	case word == "unknownid":
		fc.send(wire.AppendSimple(nil, wire.TypeTimedOut, id+1000))
	case word == "wrongtype":
		fc.send(wire.AppendSimple(nil, wire.TypeReleased, id))
	case word == "pong":
		fc.send(wire.AppendSimple(nil, wire.TypePong, id))
	case word == "empty":
		fc.send([]byte{0, 0, 0, 0})
	case word == "fatalthengrant": // an unknown req_id, then the grant, in one write
		b := wire.AppendSimple(nil, wire.TypeTimedOut, id+1000)
		fc.send(append(b, grant(0)...))
	case word == "notactive":
		fc.sendResp(&wire.Response{Type: wire.TypeNotActive, ReqID: id, Hint: []byte("other:5225")})
	case word == "error":
		fc.send(wire.AppendError(nil, id, wire.CodeInternal, "scripted failure"))
	case word == "grantclose":
		fc.send(grant(0))
		fc.Close()
	case strings.HasPrefix(word, "delay:"):
		d, _ := time.ParseDuration(strings.TrimPrefix(word, "delay:"))
		f.later(d, func() { fc.send(grant(0)) })
	case word == "token0":
		fc.send(wire.AppendGranted(nil, id, 0, 0))
	case strings.HasPrefix(word, "honest:"):
		d, _ := time.ParseDuration(strings.TrimPrefix(word, "honest:"))
		f.later(d, func() { fc.send(grant(uint32(d / time.Millisecond))) })
	case strings.HasPrefix(word, "waited:"):
		ms, _ := strconv.Atoi(strings.TrimPrefix(word, "waited:"))
		fc.send(grant(uint32(ms)))
	default:
		fc.send(grant(0))
	}
}

// SetVersion sets the highest protocol version the fake speaks (1, 2 or
// 3), before the broker dials it.
func (f *fakeServer) SetVersion(v uint8) { f.version.Store(uint32(v)) }

// SetCluster sets the group identity of the fake's version-3 HELLO_OK.
func (f *fakeServer) SetCluster(id string) { f.cluster.Store(&id) }

// helloOK is the fake's default answer to req, a HELLO: HELLO_OK of the
// version asked, role 1, node "fake", and on version 3 the identity of
// SetCluster.
func (f *fakeServer) helloOK(req *wire.Request) *wire.Response {
	r := &wire.Response{Type: wire.TypeHelloOK, ReqID: req.ReqID, Version: req.Version, Role: 1, Node: []byte("fake")}
	if id := f.cluster.Load(); id != nil && req.Version >= wire.Version3 {
		r.Cluster = []byte(*id)
	}
	return r
}

// Parked returns how many ACQUIREs wait for a CANCEL on fc.
func (fc *fakeConn) Parked() int {
	fc.pmu.Lock()
	defer fc.pmu.Unlock()
	return len(fc.parked)
}

// IsParked reports whether the ACQUIRE with req_id id waits for a CANCEL
// on fc.
func (fc *fakeConn) IsParked(id uint32) bool {
	fc.pmu.Lock()
	defer fc.pmu.Unlock()
	_, ok := fc.parked[id]
	return ok
}

// SetHandle replaces the request handler (nil: script).
func (f *fakeServer) SetHandle(h func(fc *fakeConn, req *wire.Request)) {
	if h == nil {
		f.handle.Store(nil)
		return
	}
	f.handle.Store(&h)
}

func (f *fakeServer) Log() []fakeReq {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]fakeReq(nil), f.log...)
}

func (f *fakeServer) Conns() []*fakeConn {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]*fakeConn(nil), f.conns...)
}

func (f *fakeServer) Tokens() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.tokens...)
}

func (f *fakeServer) Released(token uint64) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.released[token]
}

func (f *fakeServer) Count(typ byte) int64 { return f.counts[typ].Load() }

// TCPAccepted returns how many TCP connections the fake's listener has
// accepted, sessions or not.
func (f *fakeServer) TCPAccepted() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.all)
}

// eventually polls cond for up to 10 s.
func eventually(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// testConfig is a Config with short timeouts for tests.
func testConfig(addrs ...string) broker.Config {
	return broker.Config{
		Addrs:            addrs,
		DialTimeout:      2 * time.Second,
		BackoffMin:       10 * time.Millisecond,
		BackoffMax:       100 * time.Millisecond,
		KeepAlive:        time.Hour,
		KeepAliveTimeout: time.Hour,
		ReplyGrace:       time.Hour,
		ReleaseWindow:    time.Second,
	}
}

// newBroker starts a broker, waits until every session is ready, and closes
// it at the end of the test.
func newBroker(t testing.TB, cfg broker.Config) *broker.Broker {
	t.Helper()
	b, err := broker.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := b.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}
	return b
}

// neverReady starts a broker on f, which must not become ready: WaitReady
// with a 300 ms deadline must fail with ErrNotReady. It returns the broker
// (closed at the end of the test) and WaitReady's error.
func neverReady(t testing.TB, f *fakeServer) (*broker.Broker, error) {
	t.Helper()
	b, err := broker.New(testConfig(f.Addr))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	ctx, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
	defer cancel()
	err = b.WaitReady(ctx)
	mustIs(t, err, broker.ErrNotReady)
	return b, err
}

// waitSessions waits until the fake has accepted n HELLOs.
func waitHellos(t testing.TB, f *fakeServer, n int64) {
	t.Helper()
	eventually(t, "hellos", func() bool { return f.hellos.Load() >= n })
}

// allReady returns a broker whose two sessions to f are both ready.
func allReady(t testing.TB, f *fakeServer, cfg broker.Config) *broker.Broker {
	t.Helper()
	b := newBroker(t, cfg)
	eventually(t, "two ready sessions", func() bool { return b.ReadySessions() == 2 })
	return b
}

// mustIs checks that err matches every target, and that it matches exactly
// one outcome (see outcomesOf).
func mustIs(t testing.TB, err error, targets ...error) {
	t.Helper()
	for _, target := range targets {
		if !errors.Is(err, target) {
			t.Fatalf("error %v: want errors.Is(%v)", err, target)
		}
	}
	mustOneOutcome(t, err)
}

// outcomeSentinels are the broker's outcome sentinels, by name.
var outcomeSentinels = []struct {
	name string
	err  error
}{
	{"ErrInvalidArgument", broker.ErrInvalidArgument},
	{"ErrInvalidConfig", broker.ErrInvalidConfig},
	{"ErrTimedOut", broker.ErrTimedOut},
	{"ErrBusy", broker.ErrBusy},
	{"ErrIndeterminate", broker.ErrIndeterminate},
	{"ErrUnsent", broker.ErrUnsent},
	{"ErrLeaseTooShort", broker.ErrLeaseTooShort},
	{"ErrNotHeld", broker.ErrNotHeld},
	{"ErrReleaseUnconfirmed", broker.ErrReleaseUnconfirmed},
	{"ErrClosed", broker.ErrClosed},
	{"ErrUnauthorized", broker.ErrUnauthorized},
	{"ErrNotActive", broker.ErrNotActive},
	{"ErrNotReady", broker.ErrNotReady},
	{"ErrCertificate", broker.ErrCertificate},
	{"ErrTLSRequired", broker.ErrTLSRequired},
	{"ErrServerNotTLS", broker.ErrServerNotTLS},
	{"ErrRefreshUnconfirmed", broker.ErrRefreshUnconfirmed},
	{"ErrUnsupported", broker.ErrUnsupported},
	{"ErrLeaseEnding", broker.ErrLeaseEnding},
}

// outcomesOf returns the outcomes err matches: the names of the sentinels
// it matches with errors.Is, and "*ServerError" for a *ServerError other
// than code 3 (code 3 is ErrUnauthorized).
func outcomesOf(err error) []string {
	var out []string
	for _, o := range outcomeSentinels {
		if errors.Is(err, o.err) {
			out = append(out, o.name)
		}
	}
	var se *broker.ServerError
	if errors.As(err, &se) && !errors.Is(err, broker.ErrUnauthorized) {
		out = append(out, "*ServerError")
	}
	return out
}

// mustOneOutcome checks that err matches exactly one outcome.
func mustOneOutcome(t testing.TB, err error) {
	t.Helper()
	if err == nil {
		return
	}
	if got := outcomesOf(err); len(got) != 1 {
		t.Fatalf("error %q matches %d outcomes %v, want exactly one", err, len(got), got)
	}
}

func ctxT(t testing.TB) context.Context { return t.Context() }

// stallDialer dials conns whose Write blocks, for a write carrying marker,
// until the conn is closed: a peer that stopped reading, with a full socket
// buffer.
type stallDialer struct {
	marker []byte
	mu     sync.Mutex
	conns  []*stallConn
}

type stallConn struct {
	net.Conn
	d       *stallDialer
	closed  chan struct{}
	once    sync.Once
	stalled atomic.Bool
}

func (d *stallDialer) Dial(ctx context.Context, network, addr string) (net.Conn, error) {
	var nd net.Dialer
	c, err := nd.DialContext(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	sc := &stallConn{Conn: c, d: d, closed: make(chan struct{})}
	d.mu.Lock()
	d.conns = append(d.conns, sc)
	d.mu.Unlock()
	return sc, nil
}

// stalled returns the conns whose writer is blocked.
func (d *stallDialer) stalled() []*stallConn {
	d.mu.Lock()
	defer d.mu.Unlock()
	var out []*stallConn
	for _, c := range d.conns {
		if c.stalled.Load() {
			out = append(out, c)
		}
	}
	return out
}

func (c *stallConn) Write(p []byte) (int, error) {
	if bytes.Contains(p, c.d.marker) {
		c.stalled.Store(true)
		<-c.closed
		return 0, net.ErrClosed
	}
	return c.Conn.Write(p)
}

func (c *stallConn) Close() error {
	c.once.Do(func() { close(c.closed) })
	return c.Conn.Close()
}

// stepCtx is a context for ordering a cancellation exactly: its first Done
// call signals entered and blocks until cancel, then returns a channel that
// never closes (so that a select prefers any other ready case); later Done
// calls wait a while and return a closed channel.
type stepCtx struct {
	context.Context
	entered   chan struct{}
	ready     chan struct{}
	calls     atomic.Int32
	cancelled atomic.Bool
}

func newStepCtx() *stepCtx {
	return &stepCtx{Context: context.Background(), entered: make(chan struct{}), ready: make(chan struct{})}
}

var closedChan = func() chan struct{} { c := make(chan struct{}); close(c); return c }()

func (c *stepCtx) Done() <-chan struct{} {
	if c.calls.Add(1) == 1 {
		close(c.entered)
		<-c.ready
		return nil
	}
	time.Sleep(200 * time.Millisecond)
	return closedChan
}

func (c *stepCtx) Err() error {
	if c.cancelled.Load() {
		return context.Canceled
	}
	return nil
}

func (c *stepCtx) cancel() { c.cancelled.Store(true); close(c.ready) }
