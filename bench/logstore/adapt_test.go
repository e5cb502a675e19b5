package logstore

import (
	"errors"

	"github.com/hashicorp/raft"

	productraft "github.com/ticketing-dev/ticketing/internal/raft"
	"github.com/ticketing-dev/ticketing/internal/raftstore"
)

// The product keeps its own copy of hashicorp/raft (package internal/raft,
// the same types), and its log store speaks that copy's types, while
// raft-boltdb and raft-wal speak the upstream module's. The benchmarks run
// on the upstream raft.LogStore, so the product's log store is wrapped in
// productLog: the conversions (raftstore.FromUpstream, ToUpstream) are a
// cost on the product's store only, which keeps the comparison fair or
// conservative for it. internal/crashtest wants the product's LogStore, so
// the upstream stores are wrapped in upstreamLog there. Both StableStore
// interfaces have only primitive-typed methods: their stores satisfy both
// as they are.

// productLog is a log store of the product's raft copy as an upstream
// raft.LogStore.
type productLog struct{ s productraft.LogStore }

func (p productLog) FirstIndex() (uint64, error) { return p.s.FirstIndex() }
func (p productLog) LastIndex() (uint64, error)  { return p.s.LastIndex() }

func (p productLog) GetLog(index uint64, log *raft.Log) error {
	var l productraft.Log
	if err := p.s.GetLog(index, &l); err != nil {
		if errors.Is(err, productraft.ErrLogNotFound) {
			return raft.ErrLogNotFound
		}
		return err
	}
	*log = raftstore.ToUpstream(&l)
	return nil
}

func (p productLog) StoreLog(log *raft.Log) error {
	l := raftstore.FromUpstream(log)
	return p.s.StoreLog(&l)
}

func (p productLog) StoreLogs(logs []*raft.Log) error {
	ls := make([]productraft.Log, len(logs))
	ptrs := make([]*productraft.Log, len(logs))
	for i, l := range logs {
		ls[i] = raftstore.FromUpstream(l)
		ptrs[i] = &ls[i]
	}
	return p.s.StoreLogs(ptrs)
}

func (p productLog) DeleteRange(min, max uint64) error { return p.s.DeleteRange(min, max) }

// upstreamLog is an upstream raft.LogStore (raft-boltdb, raft-wal) as a
// log store of the product's raft copy.
type upstreamLog struct{ s raft.LogStore }

func (u upstreamLog) FirstIndex() (uint64, error) { return u.s.FirstIndex() }
func (u upstreamLog) LastIndex() (uint64, error)  { return u.s.LastIndex() }

func (u upstreamLog) GetLog(index uint64, log *productraft.Log) error {
	var l raft.Log
	if err := u.s.GetLog(index, &l); err != nil {
		if errors.Is(err, raft.ErrLogNotFound) {
			return productraft.ErrLogNotFound
		}
		return err
	}
	*log = raftstore.FromUpstream(&l)
	return nil
}

func (u upstreamLog) StoreLog(log *productraft.Log) error {
	l := raftstore.ToUpstream(log)
	return u.s.StoreLog(&l)
}

func (u upstreamLog) StoreLogs(logs []*productraft.Log) error {
	ls := make([]raft.Log, len(logs))
	ptrs := make([]*raft.Log, len(logs))
	for i, l := range logs {
		ls[i] = raftstore.ToUpstream(l)
		ptrs[i] = &ls[i]
	}
	return u.s.StoreLogs(ptrs)
}

func (u upstreamLog) DeleteRange(min, max uint64) error { return u.s.DeleteRange(min, max) }

// asProductLog returns l as the product's LogStore: the product's own
// store unwrapped, an upstream store wrapped in upstreamLog.
func asProductLog(l raft.LogStore) productraft.LogStore {
	if p, ok := l.(productLog); ok {
		return p.s
	}
	return upstreamLog{l}
}
