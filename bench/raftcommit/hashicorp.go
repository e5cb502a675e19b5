package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"time"

	"github.com/ticketing-dev/ticketing/internal/raft"
	"github.com/ticketing-dev/ticketing/internal/raftnet"
	"github.com/ticketing-dev/ticketing/internal/raftstore"
)

// hashiNode is one node of the hashicorp variant.
type hashiNode struct {
	r     *raft.Raft
	st    *raftstore.Stores
	trans *raft.NetworkTransport
	fsm   *hashiFSM
}

type hashiFSM struct {
	m machine
	w *waiters
}

func (f *hashiFSM) Apply(l *raft.Log) any {
	if l.Type == raft.LogCommand {
		f.m.apply(l.Data)
		f.w.done(l.Data)
	}
	return nil
}

func (f *hashiFSM) Snapshot() (raft.FSMSnapshot, error) { return snap(f.m.state()), nil }

func (f *hashiFSM) Restore(rc io.ReadCloser) error {
	defer rc.Close()
	var s state
	if err := json.NewDecoder(rc).Decode(&s); err != nil {
		return err
	}
	f.m.restore(s)
	return nil
}

type snap state

func (s snap) Persist(sink raft.SnapshotSink) error {
	if err := json.NewEncoder(sink).Encode(state(s)); err != nil {
		sink.Cancel()
		return err
	}
	return sink.Close()
}

func (snap) Release() {}

type hashiGroup struct {
	nodes []*hashiNode
	w     waiters
}

// startHashi starts (or restarts, from the state in dirs) the hashicorp
// variant: node i keeps its stores in dirs[i] and listens on addrs[i].
// The stores, transport and raft.Config are those of server/log_cluster.go
// (raftstore.Open, raftnet.New without TLS, its timeouts and batching).
// serial sets raft.Config.SerialLeaderAppend (the leader stores a batch
// before it sends it, as upstream hashicorp/raft does).
func startHashi(dirs, addrs []string, serial bool) (group, error) {
	g := &hashiGroup{}
	var conf raft.Configuration
	for i := range dirs {
		conf.Servers = append(conf.Servers, raft.Server{Suffrage: raft.Voter, ID: raft.ServerID(fmt.Sprint("n", i)), Address: raft.ServerAddress(addrs[i])})
	}
	for i, dir := range dirs {
		n := &hashiNode{fsm: &hashiFSM{w: &g.w}}
		g.nodes = append(g.nodes, n)
		st, err := raftstore.Open(dir, nil)
		if err != nil {
			g.Close()
			return nil, err
		}
		n.st = st
		adv, err := net.ResolveTCPAddr("tcp", addrs[i])
		if err != nil {
			g.Close()
			return nil, err
		}
		n.trans, err = raftnet.New(raftnet.Config{BindAddr: addrs[i], Advertise: adv})
		if err != nil {
			g.Close()
			return nil, err
		}
		rc := raft.DefaultConfig()
		rc.LocalID = conf.Servers[i].ID
		rc.HeartbeatTimeout = 500 * time.Millisecond // server.DefaultRaftHeartbeat
		rc.ElectionTimeout = 500 * time.Millisecond  // server.DefaultRaftElection
		rc.LeaderLeaseTimeout = rc.HeartbeatTimeout
		rc.CommitTimeout = 5 * time.Millisecond
		rc.BatchApplyCh = true
		rc.MaxAppendEntries = 256
		rc.NoLegacyTelemetry = true
		rc.SerialLeaderAppend = serial
		rc.LogLevel = "error"
		has, err := raft.HasExistingState(st.Log, st.Stable, st.Snapshots)
		if err != nil {
			g.Close()
			return nil, err
		}
		if !has {
			if err := raft.BootstrapCluster(rc, st.Log, st.Stable, st.Snapshots, n.trans, conf); err != nil {
				g.Close()
				return nil, err
			}
		}
		n.r, err = raft.NewRaft(rc, n.fsm, st.Log, st.Stable, st.Snapshots, n.trans)
		if err != nil {
			g.Close()
			return nil, err
		}
	}
	return g, nil
}

func (g *hashiGroup) leader(ctx context.Context) (*raft.Raft, error) {
	for {
		for _, n := range g.nodes {
			if n.r.State() == raft.Leader {
				return n.r, nil
			}
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(10 * time.Millisecond):
		}
	}
}

func (g *hashiGroup) Propose(ctx context.Context, cmd []byte) error {
	r, err := g.leader(ctx)
	if err != nil {
		return err
	}
	// The FSM's Apply has run on the leader when the future resolves.
	return r.Apply(cmd, 0).Error()
}

func (g *hashiGroup) States() []state {
	var out []state
	for _, n := range g.nodes {
		out = append(out, n.fsm.m.state())
	}
	return out
}

func (g *hashiGroup) Close() error {
	var errs []error
	for _, n := range g.nodes {
		if n.r != nil {
			errs = append(errs, n.r.Shutdown().Error())
		}
		if n.trans != nil {
			errs = append(errs, n.trans.Close())
		}
		if n.st != nil {
			errs = append(errs, n.st.Close())
		}
	}
	return errors.Join(errs...)
}
