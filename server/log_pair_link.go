package server

import (
	"bufio"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"time"

	"github.com/ticketing-dev/ticketing/server/internal/bstar"
)

// The pair's peer link: how two nodes of a hot-standby pair talk.
//
// Each node dials its peer's peer address and keeps that connection (its
// "out" link) to send its own frames: a heartbeat every interval and, while
// it is active and its peer passive, the replication stream. The peer
// answers the stream with acknowledgements on the same connection. Each
// node also accepts its peer's out link (its "in" link; a newer one
// replaces the older). So neither node has to decide who dials.
//
// Frames (integers big-endian): length u32 (of type and body), type u8, body.
//
//	'H' hello      magic "TKPR", version u8 (1), role u8 (1 primary, 2 backup), advertise_len u8, advertise, id_len u8, id
//	'B' heartbeat  state u8 (bstar.State), mark u64, serving u64, flags u8 (bit 0: has state)
//	'S' snapshot   seq u64, ceiling u64, the lock machine's snapshot (lockcore "TKSM")
//	'C' command    seq u64, a lock command (lockcore's encoding)
//	'F' floor      seq u64, floor u64, ceiling u64 (the active's epoch: the counter raised to floor, grants up to ceiling)
//	'K' ack        seq u64: every stream frame up to seq is applied
//
// The dialling node sends 'H' first and the accepting node answers with
// its own 'H'. The accepting node checks the id first: it refuses an empty
// one (the dialler, a node without an id yet, adopts the id of the answer
// and dials again) or another pair's (a node without an id adopts its
// peer's), then a peer that says it has its own role. A dialler whose
// peer answers with its own role stops serving until it is restarted.
// A heartbeat whose mark is beyond what the peer can have reached
// (peerMarkLimit) closes the link. mark is
// 1 + the highest token epoch the node has used or seen, serving 1 + the
// epoch it serves under (0: it does not serve). The stream of one out link
// begins with 'S'; seq numbers then follow one by one.

const (
	pairMagic      = "TKPR"
	pairVersion    = 1
	pairMaxFrame   = 1 << 30 // a snapshot of MaxLocks holdings fits
	pairSmallFrame = 64 << 10
	// pairMaxBuffered bounds the bytes queued on an out link; an active
	// whose passive does not take them stops replicating to it.
	pairMaxBuffered = 256 << 20

	frameHello     = 'H'
	frameHeartbeat = 'B'
	frameSnapshot  = 'S'
	frameCommand   = 'C'
	frameFloor     = 'F'
	frameAck       = 'K'
)

// errPairLink is wrapped by the peer link's protocol errors.
var errPairLink = errors.New("pair link")

// pairRoleByte is a PairRole's number in the hello.
func pairRoleByte(r PairRole) byte {
	if r == PairPrimary {
		return 1
	}
	return 2
}

// appendFrame appends a frame of type typ whose body is the big-endian
// u64s head followed by tail.
func appendFrame(b []byte, typ byte, tail []byte, head ...uint64) []byte {
	b = binary.BigEndian.AppendUint32(b, uint32(1+8*len(head)+len(tail)))
	b = append(b, typ)
	for _, v := range head {
		b = binary.BigEndian.AppendUint64(b, v)
	}
	return append(b, tail...)
}

// readFrame reads one frame of at most limit bytes (type included) into
// *buf (grown as needed and kept for the next frame: the body is valid
// until then).
func readFrame(r *bufio.Reader, limit int, buf *[]byte) (byte, []byte, error) {
	var h [4]byte
	if _, err := io.ReadFull(r, h[:]); err != nil {
		return 0, nil, err
	}
	n := int(binary.BigEndian.Uint32(h[:]))
	if n < 1 || n > limit {
		return 0, nil, fmt.Errorf("%w: frame of %d bytes", errPairLink, n)
	}
	if cap(*buf) < n {
		*buf = make([]byte, n)
	}
	b := (*buf)[:n]
	if _, err := io.ReadFull(r, b); err != nil {
		return 0, nil, err
	}
	if cap(b) > pairSmallFrame && n <= pairSmallFrame {
		*buf = nil // a snapshot's buffer is not kept for the small frames after it
	}
	return b[0], b[1:], nil
}

// pairHello is a node's hello.
type pairHello struct {
	role      byte
	advertise string
	id        string // the pair's identity ("": none yet)
}

func appendHello(b []byte, role byte, advertise, id string) []byte {
	body := append([]byte(pairMagic), pairVersion, role, byte(len(advertise)))
	body = append(append(body, advertise...), byte(len(id)))
	return appendFrame(b, frameHello, append(body, id...))
}

func parseHello(typ byte, b []byte) (pairHello, error) {
	if typ != frameHello || len(b) < 7 || string(b[:4]) != pairMagic {
		return pairHello{}, fmt.Errorf("%w: not a ticketingd pair peer (no hello)", errPairLink)
	}
	if b[4] != pairVersion {
		return pairHello{}, fmt.Errorf("%w: peer link version %d, want %d", errPairLink, b[4], pairVersion)
	}
	n := int(b[6])
	if b[5] != 1 && b[5] != 2 || 7+n >= len(b) || 7+n+1+int(b[7+n]) != len(b) {
		return pairHello{}, fmt.Errorf("%w: malformed hello", errPairLink)
	}
	return pairHello{role: b[5], advertise: string(b[7 : 7+n]), id: string(b[8+n:])}, nil
}

// heartbeat is a peer's heartbeat.
type heartbeat struct {
	state    bstar.State
	mark     uint64
	serving  uint64
	hasState bool
}

// body is the heartbeat frame's body.
func (h heartbeat) body() []byte {
	body := make([]byte, 18)
	body[0] = byte(h.state)
	binary.BigEndian.PutUint64(body[1:], h.mark)
	binary.BigEndian.PutUint64(body[9:], h.serving)
	if h.hasState {
		body[17] = 1
	}
	return body
}

func parseHeartbeat(b []byte) (heartbeat, error) {
	if len(b) != 18 {
		return heartbeat{}, fmt.Errorf("%w: malformed heartbeat", errPairLink)
	}
	return heartbeat{state: bstar.State(b[0]), mark: binary.BigEndian.Uint64(b[1:]),
		serving: binary.BigEndian.Uint64(b[9:]), hasState: b[17]&1 != 0}, nil
}

func u64s(vs ...uint64) []byte {
	b := make([]byte, 0, 8*len(vs))
	for _, v := range vs {
		b = binary.BigEndian.AppendUint64(b, v)
	}
	return b
}

// outLink is a node's out link: the connection it dialled to its peer and
// the writer that drains its queue.
type outLink struct {
	nc    net.Conn
	since int64 // server clock when it was established
	mu    sync.Mutex
	buf   []byte
	wake  chan struct{}
	dead  bool
	once  sync.Once
	done  chan struct{} // closed when the link is closed
}

func newOutLink(nc net.Conn, since int64) *outLink {
	return &outLink{nc: nc, since: since, wake: make(chan struct{}, 1), done: make(chan struct{})}
}

// queue appends a frame (appendFrame's) to the link's queue; false once
// the link is dead or its queue is over pairMaxBuffered.
func (o *outLink) queue(typ byte, tail []byte, head ...uint64) bool {
	o.mu.Lock()
	if o.dead || len(o.buf) > pairMaxBuffered {
		o.mu.Unlock()
		return false
	}
	o.buf = appendFrame(o.buf, typ, tail, head...)
	o.mu.Unlock()
	o.wakeWriter()
	return true
}

func (o *outLink) wakeWriter() {
	select {
	case o.wake <- struct{}{}:
	default:
	}
}

// markDead makes queue refuse every frame from now on and drops the queue.
func (o *outLink) markDead() {
	o.mu.Lock()
	o.dead = true
	o.buf = nil
	o.mu.Unlock()
}

// fail marks the link lost without touching its connection: its writer
// closes it (the log's Propose calls this under the shard mutex).
func (o *outLink) fail() {
	o.markDead()
	o.wakeWriter()
}

// close closes the connection; the writer and the reader end.
func (o *outLink) close() {
	o.once.Do(func() {
		o.markDead()
		o.nc.Close()
		close(o.done)
	})
}

// writeLoop writes the queue until the link is closed or a write fails
// (or takes longer than timeout).
func (o *outLink) writeLoop(timeout time.Duration) {
	defer o.close()
	var spare []byte
	for {
		select {
		case <-o.done:
			return
		case <-o.wake:
		}
		o.mu.Lock()
		b := o.buf
		if o.dead {
			o.mu.Unlock()
			return // (fail: the deferred close closes the connection)
		}
		if len(b) == 0 {
			o.mu.Unlock()
			continue
		}
		o.buf = spare[:0] // the queue's next bytes go to the buffer written last time
		o.mu.Unlock()
		o.nc.SetWriteDeadline(time.Now().Add(timeout))
		if _, err := o.nc.Write(b); err != nil {
			return
		}
		spare = b
	}
}

// dialPeer dials addr (mutual TLS with tlsCfg if not nil) and exchanges
// hellos within timeout.
func dialPeer(addr string, tlsCfg *tls.Config, timeout time.Duration, hello []byte) (net.Conn, *bufio.Reader, pairHello, error) {
	d := net.Dialer{Timeout: timeout}
	nc, err := d.Dial("tcp", addr)
	if err != nil {
		return nil, nil, pairHello{}, err
	}
	if tlsCfg != nil {
		tc := tls.Client(nc, tlsCfg)
		tc.SetDeadline(time.Now().Add(timeout))
		if err := tc.Handshake(); err != nil {
			nc.Close()
			return nil, nil, pairHello{}, err
		}
		nc = tc
	}
	nc.SetDeadline(time.Now().Add(timeout))
	if _, err := nc.Write(hello); err != nil {
		nc.Close()
		return nil, nil, pairHello{}, err
	}
	r := bufio.NewReaderSize(nc, 64<<10)
	var buf []byte
	typ, body, err := readFrame(r, pairSmallFrame, &buf)
	if err != nil {
		nc.Close()
		return nil, nil, pairHello{}, err
	}
	h, err := parseHello(typ, body)
	if err != nil {
		nc.Close()
		return nil, nil, pairHello{}, err
	}
	nc.SetDeadline(time.Time{})
	return nc, r, h, nil
}
