package main

import (
	"context"
	"encoding/binary"
	"errors"
	"io"
	"log"
	"sync"
	"sync/atomic"
	"time"

	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"
)

// etcdNode is one node of the etcd variant.
type etcdNode struct {
	id     uint64
	n      raft.Node
	store  *raft.MemoryStorage
	wal    *wal
	tr     *transport
	m      machine
	w      *waiters
	leader atomic.Bool
	stop   chan struct{}
	done   chan struct{}
	err    error
}

type etcdGroup struct {
	nodes []*etcdNode
	w     waiters
}

// startEtcd starts (or restarts, from the WALs in dirs) the etcd variant:
// node i (Raft ID i+1) keeps its WAL in dirs[i] and listens on addrs[i].
func startEtcd(dirs, addrs []string) (group, error) {
	g := &etcdGroup{}
	peers := map[uint64]string{}
	var rpeers []raft.Peer
	for i, a := range addrs {
		peers[uint64(i+1)] = a
		rpeers = append(rpeers, raft.Peer{ID: uint64(i + 1)})
	}
	for i, dir := range dirs {
		en := &etcdNode{id: uint64(i + 1), w: &g.w, store: raft.NewMemoryStorage(), stop: make(chan struct{}), done: make(chan struct{})}
		w, hs, ents, err := openWAL(dir)
		if err != nil {
			g.Close()
			return nil, err
		}
		en.wal = w
		if err := en.store.Append(ents); err != nil {
			w.close()
			g.Close()
			return nil, err
		}
		if err := en.store.SetHardState(hs); err != nil {
			w.close()
			g.Close()
			return nil, err
		}
		cfg := &raft.Config{
			ID:              en.id,
			ElectionTick:    10, // 100 ms ticks: 1 s
			HeartbeatTick:   1,
			Storage:         en.store,
			MaxSizePerMsg:   1 << 20,
			MaxInflightMsgs: 256,
			CheckQuorum:     true,
			PreVote:         true,
			Logger:          quietLogger(),
		}
		if len(ents) == 0 && raft.IsEmptyHardState(hs) {
			en.n = raft.StartNode(cfg, rpeers)
		} else {
			en.n = raft.RestartNode(cfg)
		}
		en.tr, err = newTransport(addrs[i], peers, en.id, en.n.Step)
		if err != nil {
			en.n.Stop()
			w.close()
			g.Close()
			return nil, err
		}
		g.nodes = append(g.nodes, en)
		go en.run()
	}
	// Node 1 campaigns at once rather than after an election timeout.
	g.nodes[0].n.Campaign(context.Background())
	return g, nil
}

// run is the Ready loop (go.etcd.io/raft README, "Usage"): a leader sends a
// Ready's messages (its MsgApps) first, then persists the Ready's hard
// state and entries (fdatasync) while they travel; a follower persists
// first and then sends (its MsgAppResp acknowledges durable entries).
// Advance, after the fdatasync, is what lets the leader count its own
// append toward the quorum.
func (en *etcdNode) run() {
	defer close(en.done)
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-en.stop:
			return
		case <-tick.C:
			en.n.Tick()
		case rd := <-en.n.Ready():
			if rd.SoftState != nil {
				en.leader.Store(rd.SoftState.RaftState == raft.StateLeader)
			}
			lead := en.leader.Load()
			if lead {
				en.tr.send(rd.Messages)
			}
			if err := en.wal.save(rd.HardState, rd.Entries); err != nil {
				en.err = err
				return
			}
			if err := en.store.Append(rd.Entries); err != nil {
				en.err = err
				return
			}
			if !raft.IsEmptyHardState(rd.HardState) {
				en.store.SetHardState(rd.HardState)
			}
			if !lead {
				en.tr.send(rd.Messages)
			}
			for _, e := range rd.CommittedEntries {
				switch e.GetType() {
				case raftpb.EntryType_EntryNormal:
					if len(e.GetData()) > 0 {
						en.m.apply(e.GetData())
						en.w.done(e.GetData())
					}
				case raftpb.EntryType_EntryConfChange:
					cc := &raftpb.ConfChange{}
					if err := proto.Unmarshal(e.GetData(), cc); err != nil {
						en.err = err
						return
					}
					en.n.ApplyConfChange(cc)
				}
			}
			en.n.Advance()
		}
	}
}

func (g *etcdGroup) Propose(ctx context.Context, cmd []byte) error {
	for {
		for _, en := range g.nodes {
			if !en.leader.Load() {
				continue
			}
			id := binary.BigEndian.Uint64(cmd)
			c := g.w.add(id)
			if err := en.n.Propose(ctx, cmd); err != nil {
				g.w.drop(id)
				if errors.Is(err, raft.ErrProposalDropped) {
					break
				}
				return err
			}
			select {
			case <-c:
				return nil
			case <-ctx.Done():
				g.w.drop(id)
				return ctx.Err()
			}
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(10 * time.Millisecond):
		}
	}
}

func (g *etcdGroup) States() []state {
	var out []state
	for _, en := range g.nodes {
		out = append(out, en.m.state())
	}
	return out
}

func (g *etcdGroup) Close() error {
	var errs []error
	var wg sync.WaitGroup
	for _, en := range g.nodes {
		close(en.stop)
		wg.Add(1)
		go func() {
			defer wg.Done()
			en.tr.close()
		}()
	}
	for _, en := range g.nodes {
		<-en.done
		en.n.Stop()
		errs = append(errs, en.err, en.wal.close())
	}
	wg.Wait()
	return errors.Join(errs...)
}

// quietLogger discards raft's log lines.
func quietLogger() raft.Logger {
	return &raft.DefaultLogger{Logger: log.New(io.Discard, "", 0)}
}
