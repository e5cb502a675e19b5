package main

import (
	"context"
	"encoding/binary"
	"hash/fnv"
	"sync"
)

// cmdSize is the size of every proposed command, in both variants.
const cmdSize = 64

// machine is the replicated state: how many commands were applied and a
// hash chain over them, so that two nodes that applied the same commands
// in the same order hold equal machines.
type machine struct {
	mu    sync.Mutex
	count uint64
	hash  uint64
}

// state is a snapshot of a machine.
type state struct {
	Count uint64
	Hash  uint64
}

func (m *machine) apply(cmd []byte) {
	h := fnv.New64a()
	m.mu.Lock()
	defer m.mu.Unlock()
	var b [8]byte
	binary.BigEndian.PutUint64(b[:], m.hash)
	h.Write(b[:])
	h.Write(cmd)
	m.hash = h.Sum64()
	m.count++
}

func (m *machine) state() state {
	m.mu.Lock()
	defer m.mu.Unlock()
	return state{m.count, m.hash}
}

func (m *machine) restore(s state) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.count, m.hash = s.Count, s.Hash
}

// waiters wake the proposer of a command when the leader applies it; a
// command's first 8 bytes are its ID.
type waiters struct {
	mu sync.Mutex
	m  map[uint64]chan struct{}
}

func (w *waiters) add(id uint64) chan struct{} {
	c := make(chan struct{})
	w.mu.Lock()
	if w.m == nil {
		w.m = make(map[uint64]chan struct{})
	}
	w.m[id] = c
	w.mu.Unlock()
	return c
}

func (w *waiters) drop(id uint64) {
	w.mu.Lock()
	delete(w.m, id)
	w.mu.Unlock()
}

func (w *waiters) done(cmd []byte) {
	if len(cmd) < 8 {
		return
	}
	id := binary.BigEndian.Uint64(cmd)
	w.mu.Lock()
	c := w.m[id]
	delete(w.m, id)
	w.mu.Unlock()
	if c != nil {
		close(c)
	}
}

// group is a running 3-node Raft group.
type group interface {
	// Propose proposes cmd (cmdSize bytes, its ID first) on the leader
	// and returns once the leader has applied it.
	Propose(ctx context.Context, cmd []byte) error
	// States returns each node's machine.
	States() []state
	// Close stops every node and closes its log.
	Close() error
}

// command returns a cmdSize command with the ID id.
func command(id uint64) []byte {
	b := make([]byte, cmdSize)
	binary.BigEndian.PutUint64(b, id)
	for i := 8; i < cmdSize; i++ {
		b[i] = byte(id) + byte(i)
	}
	return b
}
