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

	// With AsyncStorageWrites: the append and apply goroutines' queues.
	async   bool
	appendc chan *raftpb.Message
	applyc  chan *raftpb.Message
	wg      sync.WaitGroup
	errMu   sync.Mutex
	aerr    error
}

type etcdGroup struct {
	nodes []*etcdNode
	w     waiters
}

// startEtcd starts (or restarts, from the WALs in dirs) the etcd variant:
// node i (Raft ID i+1) keeps its WAL in dirs[i] and listens on addrs[i].
func startEtcd(dirs, addrs []string) (group, error) { return startEtcdMode(dirs, addrs, false) }

// startEtcdAsync is startEtcd with raft.Config.AsyncStorageWrites: the
// Ready loop hands appends and applies to goroutines of their own and
// never waits for an fdatasync.
func startEtcdAsync(dirs, addrs []string) (group, error) { return startEtcdMode(dirs, addrs, true) }

func startEtcdMode(dirs, addrs []string, async bool) (group, error) {
	g := &etcdGroup{}
	peers := map[uint64]string{}
	var rpeers []raft.Peer
	for i, a := range addrs {
		peers[uint64(i+1)] = a
		rpeers = append(rpeers, raft.Peer{ID: uint64(i + 1)})
	}
	for i, dir := range dirs {
		en := &etcdNode{id: uint64(i + 1), w: &g.w, store: raft.NewMemoryStorage(), stop: make(chan struct{}), done: make(chan struct{}),
			async: async, appendc: make(chan *raftpb.Message, 1024), applyc: make(chan *raftpb.Message, 1024)}
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

			AsyncStorageWrites: async,
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
		if async {
			en.wg.Add(2)
			go en.appendLoop()
			go en.applyLoop()
		}
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
			if en.async {
				// Remote messages go now (a leader's MsgApps before its
				// own append); the append and the apply, with the
				// responses raft attached to them, go to their goroutines.
				var remote []*raftpb.Message
				for _, m := range rd.Messages {
					switch m.GetTo() {
					case raft.LocalAppendThread:
						en.appendc <- m
					case raft.LocalApplyThread:
						en.applyc <- m
					default:
						remote = append(remote, m)
					}
				}
				en.tr.send(remote)
				continue
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
			if err := en.apply(rd.CommittedEntries); err != nil {
				en.err = err
				return
			}
			en.n.Advance()
		}
	}
}

// appendLoop persists each MsgStorageAppend (fdatasync), then delivers
// its responses: to this node (the leader's own acknowledgement) by Step,
// to peers (a follower's MsgAppResp) by the transport.
func (en *etcdNode) appendLoop() {
	defer en.wg.Done()
	for {
		select {
		case <-en.stop:
			return
		case m := <-en.appendc:
			// Every append queued goes in one write and one fdatasync,
			// as the plain loop's Ready batches them.
			ms := []*raftpb.Message{m}
		drain:
			for len(ms) < 256 {
				select {
				case m := <-en.appendc:
					ms = append(ms, m)
				default:
					break drain
				}
			}
			us := make([]update, len(ms))
			for i, m := range ms {
				hs := &raftpb.HardState{}
				if m.Term != nil || m.Vote != nil || m.Commit != nil {
					hs = &raftpb.HardState{Term: m.Term, Vote: m.Vote, Commit: m.Commit}
				}
				us[i] = update{hs, m.GetEntries()}
			}
			err := en.wal.saveAll(us)
			for _, u := range us {
				if err == nil {
					err = en.store.Append(u.ents)
				}
				if err == nil && !raft.IsEmptyHardState(u.hs) {
					err = en.store.SetHardState(u.hs)
				}
			}
			if err != nil {
				en.fail(err)
				return
			}
			for _, m := range ms {
				en.respond(m.GetResponses())
			}
		}
	}
}

// applyLoop applies each MsgStorageApply's entries, then delivers its
// responses.
func (en *etcdNode) applyLoop() {
	defer en.wg.Done()
	for {
		select {
		case <-en.stop:
			return
		case m := <-en.applyc:
			if err := en.apply(m.GetEntries()); err != nil {
				en.fail(err)
				return
			}
			en.respond(m.GetResponses())
		}
	}
}

func (en *etcdNode) respond(msgs []*raftpb.Message) {
	var remote []*raftpb.Message
	for _, r := range msgs {
		if r.GetTo() == en.id {
			if err := en.n.Step(context.Background(), r); err != nil {
				return
			}
			continue
		}
		remote = append(remote, r)
	}
	en.tr.send(remote)
}

func (en *etcdNode) fail(err error) {
	en.errMu.Lock()
	if en.aerr == nil {
		en.aerr = err
	}
	en.errMu.Unlock()
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
		en.wg.Wait()
		en.n.Stop()
		errs = append(errs, en.err, en.aerr, en.wal.close())
	}
	wg.Wait()
	return errors.Join(errs...)
}

func (en *etcdNode) apply(ents []*raftpb.Entry) error {
	for _, e := range ents {
		switch e.GetType() {
		case raftpb.EntryType_EntryNormal:
			if len(e.GetData()) > 0 {
				en.m.apply(e.GetData())
				en.w.done(e.GetData())
			}
		case raftpb.EntryType_EntryConfChange:
			cc := &raftpb.ConfChange{}
			if err := proto.Unmarshal(e.GetData(), cc); err != nil {
				return err
			}
			en.n.ApplyConfChange(cc)
		}
	}
	return nil
}

// quietLogger discards raft's log lines.
func quietLogger() raft.Logger {
	return &raft.DefaultLogger{Logger: log.New(io.Discard, "", 0)}
}
