// Package raftstore opens the durable Raft state of a cluster node: the
// log and stable store, and the snapshots, in one directory.
//
// The log and stable store are raft-boltdb v2 (one bbolt file, raft.db),
// chosen over github.com/hashicorp/raft-wal after measuring both on this
// project's machine (ext4 on a virtio disk). The benchmarks and the kill -9
// test that compare them are in bench/logstore, a module of its own so that
// raft-wal stays out of this module's go.mod; its package doc has the
// commands to rerun them. This package's TestCrashKill9 is the same kill -9
// test on Open's stores.
//
//   - Crash safety decided it. TestCrashKill9 (SIGKILL of a writing child,
//     reopen, check every acknowledged entry) passes for bolt, here and in
//     bench/logstore. raft-wal
//     v0.4.1 (the newest that builds with raft v1.8.0's go-metrics v0.7.0)
//     loses no acknowledged entry, but a kill between the append that seals
//     a segment and the asynchronous rotation that records it leaves a log
//     that refuses every later StoreLogs ("segment is sealed") for good: its
//     Open never checks whether the recovered tail is sealed. v0.4.0 also
//     has hashicorp/raft-wal#31 (a tail truncation, which a follower does
//     on a log conflict, leaves a segment that panics raft at restart).
//   - Speed favours raft-wal, but bolt is fast enough: raft-wal makes one
//     fsync per StoreLogs, bolt two (data pages, then the meta page). A
//     StoreLogs of 1 entry took 0.26 ms (bolt) against 0.10 ms (raft-wal),
//     of 256 entries 1.1-1.4 ms against 0.33 ms: about 2.5-3.5x, yet bolt
//     still stores about 200,000 entries/s in 256-entry group commits.
//     Compaction (DeleteRange of 8192 entries) took 2.8-4.2 ms against
//     0.6-1.9 ms. GetLog of a recent entry: 3-8 us for both. Open of a
//     1M-entry log: 0.3 ms against about 120 ms (raft-wal scans its tail
//     segment).
//   - Disk: bolt's file never shrinks: 330 MiB after 1M entries of 64
//     bytes, the same after compacting to 10240 (freed pages are reused).
//     raft-wal preallocates 64 MiB segments and deletes them on compaction
//     (128 MiB, then 64 MiB).
//
// bbolt is v1.4.3 (raft-boltdb v2.3.0 asks for v1.3.5; v1.5.0 builds too
// but also bumps spf13/pflag).
package raftstore

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"
	raftboltdb "github.com/hashicorp/raft-boltdb/v2"
	"github.com/ticketing-dev/ticketing/internal/raftlog"
	"go.etcd.io/bbolt"
)

// RetainSnapshots is how many snapshots are kept.
const RetainSnapshots = 2

// lockTimeout bounds the wait for raft.db's file lock in Open.
const lockTimeout = 2 * time.Second

// logCacheSize is how many recent entries Open's log keeps in memory
// (raft.LogCache): the leader's replication and a follower's conflict
// check read the entries just stored, and this saves them a pread and a
// decode (and an allocation) each.
const logCacheSize = 512

// logSegmentSize is the log's segment size; tests make it small.
var logSegmentSize int64 = raftlog.DefaultSegmentSize

// migrateBatch is how many entries a migration from raft.db copies per
// StoreLogs.
const migrateBatch = 4096

// Stores are a node's Raft stores.
type Stores struct {
	Log       raft.LogStore
	Stable    raft.StableStore
	Snapshots raft.SnapshotStore

	closeOnce sync.Once
	closeErr  error
	close     func() error
}

// Open opens (or creates, mode 0700) the stores in dir: the log in dir/log
// (package raftlog), the stable store in dir/raft.db (raft-boltdb),
// snapshots under dir/snapshots. Every StoreLogs and every stable Set is
// fsync'd before it returns. If another process has the stores open, Open
// fails with ErrLocked after a short wait: raft.db's bbolt lock is taken
// first, and the log directory has its own flock. A nil logger discards.
//
// A directory of an earlier version has its log in raft.db: if dir/log
// does not exist, Open copies the entries into a new log (built in
// dir/log.migrating, fsync'd, renamed to dir/log) and then deletes them
// from raft.db.
func Open(dir string, logger hclog.Logger) (*Stores, error) {
	if logger == nil {
		logger = hclog.NewNullLogger()
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("raftstore: %w", err)
	}
	path := filepath.Join(dir, "raft.db")
	db, err := raftboltdb.New(raftboltdb.Options{
		Path:        path,
		BoltOptions: &bbolt.Options{Timeout: lockTimeout, FreelistType: bbolt.FreelistArrayType},
	})
	if errors.Is(err, bbolt.ErrTimeout) {
		return nil, fmt.Errorf("%w: %s", ErrLocked, path)
	}
	if err != nil {
		return nil, fmt.Errorf("raftstore: open %s: %w", path, err)
	}
	log, err := openLog(dir, db, logger)
	if err != nil {
		db.Close()
		return nil, err
	}
	cached, err := raft.NewLogCache(logCacheSize, log)
	if err != nil {
		log.Close()
		db.Close()
		return nil, fmt.Errorf("raftstore: %w", err)
	}
	snaps, err := raft.NewFileSnapshotStoreWithLogger(dir, RetainSnapshots, logger)
	if err != nil {
		log.Close()
		db.Close()
		return nil, fmt.Errorf("raftstore: snapshots in %s: %w", dir, err)
	}
	return &Stores{Log: cached, Stable: db, Snapshots: snaps, close: func() error {
		return errors.Join(log.Close(), db.Close())
	}}, nil
}

// openLog opens the log in dir/log, moving the entries raft.db holds (a
// directory of an earlier version) into it first.
func openLog(dir string, db *raftboltdb.BoltStore, logger hclog.Logger) (*raftlog.Store, error) {
	logDir := filepath.Join(dir, "log")
	tmpDir := filepath.Join(dir, "log.migrating")
	opts := raftlog.Options{SegmentSize: logSegmentSize, Logger: logger.Named("log")}
	// A migration a crash interrupted: raft.db still has every entry.
	if err := os.RemoveAll(tmpDir); err != nil {
		return nil, fmt.Errorf("raftstore: %w", err)
	}
	boltFirst, err := db.FirstIndex()
	if err != nil {
		return nil, fmt.Errorf("raftstore: raft.db: %w", err)
	}
	boltLast, err := db.LastIndex()
	if err != nil {
		return nil, fmt.Errorf("raftstore: raft.db: %w", err)
	}
	_, err = os.Stat(logDir)
	switch {
	case err == nil:
		if boltLast > 0 {
			// A migration that a crash stopped after the rename: the
			// log has the entries.
			logger.Info("deleting the raft log entries left in raft.db by a migration", "first", boltFirst, "last", boltLast)
		}
	case !errors.Is(err, os.ErrNotExist):
		return nil, fmt.Errorf("raftstore: %w", err)
	case boltLast > 0:
		logger.Info("moving the raft log from raft.db to log/", "first", boltFirst, "last", boltLast)
		if err := migrate(tmpDir, db, boltFirst, boltLast, opts); err != nil {
			return nil, err
		}
		if err := os.Rename(tmpDir, logDir); err != nil {
			return nil, fmt.Errorf("raftstore: %w", err)
		}
		if err := syncDir(dir); err != nil {
			return nil, fmt.Errorf("raftstore: %w", err)
		}
	}
	if boltLast > 0 {
		if err := db.DeleteRange(boltFirst, boltLast); err != nil {
			return nil, fmt.Errorf("raftstore: deleting the log entries from raft.db: %w", err)
		}
	}
	log, err := raftlog.Open(logDir, opts)
	if errors.Is(err, raftlog.ErrLocked) {
		return nil, fmt.Errorf("%w: %s", ErrLocked, logDir)
	}
	if err != nil {
		return nil, fmt.Errorf("raftstore: %w", err)
	}
	return log, nil
}

// migrate copies entries first..last from db into a new log in dir. A
// bolt log may have a gap (raft stores after one on a follower that
// installed a snapshot beyond its log); the entries before it are older
// than the snapshot, and raftlog drops them at a gap anyway, so only the
// run of consecutive entries that ends at last is copied.
func migrate(dir string, db *raftboltdb.BoltStore, first, last uint64, opts raftlog.Options) error {
	var l raft.Log
	start := last
	for start > first {
		err := db.GetLog(start-1, &l)
		if errors.Is(err, raft.ErrLogNotFound) {
			opts.Logger.Info("raft.db's log has a gap: copying only the entries after it", "gap-before", start, "first", first)
			break
		}
		if err != nil {
			return fmt.Errorf("raftstore: migration: raft.db entry %d: %w", start-1, err)
		}
		start--
	}
	first = start
	log, err := raftlog.Open(dir, opts)
	if err != nil {
		return fmt.Errorf("raftstore: migration: %w", err)
	}
	for i := first; i <= last; {
		var batch []*raft.Log
		for ; i <= last && len(batch) < migrateBatch; i++ {
			l := new(raft.Log)
			if err := db.GetLog(i, l); err != nil {
				log.Close()
				return fmt.Errorf("raftstore: migration: raft.db entry %d: %w", i, err)
			}
			batch = append(batch, l)
		}
		if err := log.StoreLogs(batch); err != nil {
			log.Close()
			return fmt.Errorf("raftstore: migration: %w", err)
		}
	}
	if err := log.Close(); err != nil {
		return fmt.Errorf("raftstore: migration: %w", err)
	}
	return nil
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	err = d.Sync()
	if cerr := d.Close(); err == nil {
		err = cerr
	}
	return err
}

// Close closes the stores. It is idempotent: later calls return the first
// call's result.
func (s *Stores) Close() error {
	if s.close == nil {
		return errors.New("raftstore: not opened by Open")
	}
	s.closeOnce.Do(func() { s.closeErr = s.close() })
	return s.closeErr
}
