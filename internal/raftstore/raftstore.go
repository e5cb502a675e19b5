// Package raftstore opens the durable Raft state of a cluster node: the
// log and stable store, and the snapshots, in one directory.
package raftstore

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"
	raftboltdb "github.com/hashicorp/raft-boltdb/v2"
)

// RetainSnapshots is how many snapshots are kept.
const RetainSnapshots = 2

// Stores are a node's Raft stores.
type Stores struct {
	Log       raft.LogStore
	Stable    raft.StableStore
	Snapshots raft.SnapshotStore

	close func() error
}

// Open opens (or creates, mode 0700) the stores in dir: the log and stable
// store in dir/raft.db, snapshots under dir/snapshots. Every append is
// fsync'd before it returns.
func Open(dir string, logger hclog.Logger) (*Stores, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("raftstore: %w", err)
	}
	db, err := raftboltdb.New(raftboltdb.Options{Path: filepath.Join(dir, "raft.db")})
	if err != nil {
		return nil, fmt.Errorf("raftstore: open %s: %w", filepath.Join(dir, "raft.db"), err)
	}
	snaps, err := raft.NewFileSnapshotStoreWithLogger(dir, RetainSnapshots, logger)
	if err != nil {
		db.Close()
		return nil, fmt.Errorf("raftstore: snapshots in %s: %w", dir, err)
	}
	return &Stores{Log: db, Stable: db, Snapshots: snaps, close: db.Close}, nil
}

// Close closes the stores.
func (s *Stores) Close() error {
	if s.close == nil {
		return errors.New("raftstore: not opened by Open")
	}
	return s.close()
}
