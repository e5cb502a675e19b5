package server

import (
	"bufio"
	"io"
	"net"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ticketing-dev/ticketing/internal/proctest"
	"github.com/ticketing-dev/ticketing/server/internal/bstar"
	"github.com/ticketing-dev/ticketing/server/internal/lockcore"
)

// fakeActive plays an active primary on the peer link of a backup node:
// it dials the backup's peer listener and speaks the link's frames.
type fakeActive struct {
	t  *testing.T
	nc net.Conn
	r  *bufio.Reader
}

func dialFakeActive(t *testing.T, addr string) *fakeActive {
	t.Helper()
	nc, r, h, err := dialPeer(addr, nil, 2*time.Second, appendHello(nil, pairRoleByte(PairPrimary), "127.0.0.1:1", "fake-pair"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nc.Close() })
	if h.role != pairRoleByte(PairBackup) {
		t.Fatalf("hello role %d", h.role)
	}
	return &fakeActive{t: t, nc: nc, r: r}
}

func (f *fakeActive) write(b []byte) {
	f.t.Helper()
	if _, err := f.nc.Write(b); err != nil {
		f.t.Fatal(err)
	}
}

// ack reads the next acknowledgement, waiting at most 2 s (a hang guard).
func (f *fakeActive) ack() (uint64, error) {
	f.nc.SetReadDeadline(time.Now().Add(2 * time.Second))
	var buf []byte
	typ, body, err := readFrame(f.r, pairSmallFrame, &buf)
	if err != nil {
		return 0, err
	}
	if typ != frameAck || len(body) != 8 {
		f.t.Fatalf("frame %q of %d bytes, want an ack", typ, len(body))
	}
	return beUint64(body), nil
}

// TestPairAckAfterHeartbeat: a passive acknowledges a command even when a
// heartbeat was already buffered behind it (one write of both): it must
// not wait for the next command, which may never come while the active
// waits for this acknowledgement to answer its client.
func TestPairAckAfterHeartbeat(t *testing.T) {
	port, err := proctest.FreePort("127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	self := "127.0.0.1:" + strconv.Itoa(port)
	cfg := Config{DataDir: t.TempDir(), Pair: &PairConfig{Role: PairBackup, Listen: self, Peer: "127.0.0.1:1", Advertise: "127.0.0.1:2", Heartbeat: time.Hour}}
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	f := dialFakeActive(t, self)
	hb := heartbeat{state: bstar.Active, mark: 1, serving: 1, hasState: true}
	f.write(appendFrame(nil, frameHeartbeat, hb.body()))
	f.write(appendFrame(nil, frameSnapshot, lockcore.NewMachine().Snapshot(), 5, lockcore.MaxToken))
	if seq, err := f.ack(); err != nil || seq != 5 {
		t.Fatalf("after the snapshot: ack %d, %v; want 5", seq, err)
	}
	cmd := lockcore.AppendGrant(nil, 6, "k", &lockcore.Recipient{Owner: lockcore.Owner{1}, LeaseS: 10})
	both := appendFrame(nil, frameCommand, cmd, 6)
	both = appendFrame(both, frameHeartbeat, hb.body())
	f.write(both)
	if seq, err := f.ack(); err != nil || seq != 6 {
		t.Fatalf("the command followed by a heartbeat in one write: ack %d, %v; want 6", seq, err)
	}
	if st, _ := s.PairStatus(); st.State != "PASSIVE" || st.HeldLocks != 1 {
		t.Fatalf("backup %+v", st)
	}
}

// TestOutLinkFailClosesFromItsWriter: a link the log gives up on (a full
// queue) is closed by its writer goroutine, not by the caller of fail,
// which runs under the shard mutex: fail only marks it (the connection is
// not closed while no writer runs), nothing queued after is written, and
// the writer then closes the connection: the peer reads the end of the
// stream.
func TestOutLinkFailClosesFromItsWriter(t *testing.T) {
	local, peer := net.Pipe()
	defer peer.Close()
	cc := &closeCounter{Conn: local}
	o := newOutLink(cc, 0)

	if !o.queue(frameCommand, []byte("x"), 1) {
		t.Fatal("queue refused a frame on a live link")
	}
	o.fail()
	if n := cc.n.Load(); n != 0 {
		t.Fatalf("fail closed the connection itself (%d Close calls)", n)
	}
	select {
	case <-o.done:
		t.Fatal("fail closed the link itself")
	default:
	}
	if o.queue(frameCommand, []byte("y"), 2) {
		t.Fatal("queue took a frame after fail")
	}

	done := make(chan struct{})
	go func() { o.writeLoop(time.Second); close(done) }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("the writer did not end after fail")
	}
	if n := cc.n.Load(); n != 1 {
		t.Fatalf("%d Close calls after the writer ended, want 1", n)
	}
	select {
	case <-o.done:
	default:
		t.Fatal("the link is not closed after its writer ended")
	}
	peer.SetReadDeadline(time.Now().Add(5 * time.Second))
	if n, err := peer.Read(make([]byte, 64)); err != io.EOF {
		t.Fatalf("peer read %d bytes, %v after fail, want EOF and nothing written", n, err)
	}
}

// closeCounter counts the Close calls of its connection.
type closeCounter struct {
	net.Conn
	n atomic.Int32
}

func (c *closeCounter) Close() error {
	c.n.Add(1)
	return c.Conn.Close()
}
