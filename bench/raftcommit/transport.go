package main

import (
	"bufio"
	"context"
	"encoding/binary"
	"io"
	"net"
	"sync"
	"time"

	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"
)

// transport carries the etcd variant's messages over TCP: one connection
// per peer and direction, each message [4 length][raftpb.Message]. A
// message that cannot be queued or written is dropped, as Raft allows.
type transport struct {
	ln    net.Listener
	addrs map[uint64]string
	out   map[uint64]chan *raftpb.Message
	step  func(context.Context, *raftpb.Message) error
	stop  chan struct{}
	wg    sync.WaitGroup
	mu    sync.Mutex
	conns map[net.Conn]struct{}
}

func newTransport(addr string, addrs map[uint64]string, self uint64, step func(context.Context, *raftpb.Message) error) (*transport, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	t := &transport{ln: ln, addrs: addrs, out: map[uint64]chan *raftpb.Message{}, step: step, stop: make(chan struct{}), conns: map[net.Conn]struct{}{}}
	for id := range addrs {
		if id == self {
			continue
		}
		c := make(chan *raftpb.Message, 4096)
		t.out[id] = c
		t.wg.Add(1)
		go t.writer(addrs[id], c)
	}
	t.wg.Add(1)
	go t.accept()
	return t, nil
}

func (t *transport) track(c net.Conn) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	select {
	case <-t.stop:
		c.Close()
		return false
	default:
	}
	t.conns[c] = struct{}{}
	return true
}

func (t *transport) untrack(c net.Conn) {
	t.mu.Lock()
	delete(t.conns, c)
	t.mu.Unlock()
	c.Close()
}

func (t *transport) send(msgs []*raftpb.Message) {
	for _, m := range msgs {
		select {
		case t.out[m.GetTo()] <- m:
		default:
		}
	}
}

func (t *transport) writer(addr string, c chan *raftpb.Message) {
	defer t.wg.Done()
	var conn net.Conn
	var w *bufio.Writer
	var buf []byte
	defer func() {
		if conn != nil {
			t.untrack(conn)
		}
	}()
	for {
		var m *raftpb.Message
		select {
		case <-t.stop:
			return
		case m = <-c:
		}
		if conn == nil {
			cn, err := net.DialTimeout("tcp", addr, time.Second)
			if err != nil {
				continue
			}
			if !t.track(cn) {
				return
			}
			conn, w = cn, bufio.NewWriterSize(cn, 64<<10)
		}
		err := func() error {
			for {
				var err error
				buf, err = proto.MarshalOptions{}.MarshalAppend(append(buf[:0], 0, 0, 0, 0), m)
				if err != nil {
					return err
				}
				binary.BigEndian.PutUint32(buf, uint32(len(buf)-4))
				if _, err := w.Write(buf); err != nil {
					return err
				}
				select {
				case m = <-c:
					continue
				default:
				}
				return w.Flush()
			}
		}()
		if err != nil {
			t.untrack(conn)
			conn = nil
		}
	}
}

func (t *transport) accept() {
	defer t.wg.Done()
	for {
		c, err := t.ln.Accept()
		if err != nil {
			return
		}
		if !t.track(c) {
			return
		}
		t.wg.Add(1)
		go t.read(c)
	}
}

func (t *transport) read(c net.Conn) {
	defer t.wg.Done()
	defer t.untrack(c)
	r := bufio.NewReaderSize(c, 64<<10)
	var h [4]byte
	for {
		if _, err := io.ReadFull(r, h[:]); err != nil {
			return
		}
		data := make([]byte, binary.BigEndian.Uint32(h[:]))
		if _, err := io.ReadFull(r, data); err != nil {
			return
		}
		m := &raftpb.Message{}
		if err := proto.Unmarshal(data, m); err != nil {
			return
		}
		if err := t.step(context.Background(), m); err != nil {
			return
		}
	}
}

func (t *transport) close() {
	t.mu.Lock()
	close(t.stop)
	for c := range t.conns {
		c.Close()
	}
	t.mu.Unlock()
	t.ln.Close()
	t.wg.Wait()
}
