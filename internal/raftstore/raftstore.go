// Package raftstore opens the durable Raft state of a cluster node in one
// directory: the log in dir/log (package internal/raftlog), the stable
// store in dir/raft.db (raft-boltdb v2, bbolt), the snapshots in
// dir/snapshots.
//
// The log is on the commit path twice per commit (hashicorp/raft stores the
// leader's entries before it replicates them, and each follower stores them
// before it acks), so its StoreLogs latency bounds a cluster's throughput.
// internal/raftlog makes one fdatasync per StoreLogs into preallocated
// segment files; raft-boltdb, the log store before it, makes two (data
// pages, then the meta page) plus page and freelist work. StoreLogs on this
// project's machine (ext4 on a virtio disk; bench/logstore's
// BenchmarkStoreLogs, bolt and raftlog alternating, three rounds of 200
// calls, the range of the three):
//
//	entries per StoreLogs     1              64             256
//	raft-boltdb            0.26-0.29 ms   0.54-0.58 ms   1.13-1.33 ms
//	raftlog                0.09-0.10 ms   0.16-0.26 ms   0.23-0.26 ms
//
// about 2.7x, 2.2-3.5x and 5x faster. Since then raftlog writes zeros
// ahead of its records (internal/raftlog's zero.go), so that on ext4 an
// fdatasync no longer also writes the inode for the conversion of
// preallocated extents; the same benchmark, the store before and after
// alternating, three rounds of 500 calls:
//
//	entries per StoreLogs     1              16             64             256
//	before                 0.09-0.12 ms   0.15-0.18 ms   0.22-0.25 ms   0.28-0.33 ms
//	after                  0.11-0.13 ms   0.11-0.15 ms   0.14-0.18 ms   0.20-0.26 ms
//
// (a batch within one 4 KiB block converted no extent before either). One run each of the others (8192
// entries and 1M entries of 64 bytes of data): compaction (DeleteRange of
// 8192 entries) 0.76 ms against 2.5 ms; GetLog among the last 1000 entries
// 0.34 us against 2.4 us (half of them hit the LogCache); Open of a
// 1M-entry log 87 ms against 0.4 ms (raftlog reads and checks every
// record; raft's log is usually about 20,000 entries, a few ms); disk 128
// MiB for 1M entries, 64 MiB after compaction to 10240 (bolt: 330 MiB,
// never shrinking).
//
// The stable store (the current term and vote) stays in raft.db: raft
// writes it only on elections, so its two fsyncs do not matter.
//
// Open wraps the log in a raft.LogCache of the 512 latest entries: the
// leader's replication and a follower's conflict check read the entries
// just stored.
//
// github.com/hashicorp/raft-wal (one fsync per append too) was measured
// and rejected: v0.4.1 (the newest that builds with raft v1.8.0's
// go-metrics v0.7.0) loses no acknowledged entry under kill -9, but a kill
// between the append that seals a segment and the asynchronous rotation
// that records it leaves a log that refuses every later StoreLogs
// ("segment is sealed") for good; v0.4.0 also has hashicorp/raft-wal#31 (a
// tail truncation leaves a segment that panics raft at restart).
// bench/logstore, a module of its own so that raft-wal stays out of this
// module's go.mod, has the benchmarks and kill -9 tests of the three stores.
// This package's TestCrashKill9 (and TestCrashKill9SmallSegments, with
// tiny segments and tail truncations) kill a child writing through Open's
// stores and check every acknowledged entry after the reopen (the harness,
// internal/crashtest, is bench/logstore's too). A kill -9
// leaves the page cache to the kernel, so these tests cover a process
// crash; a power loss (writes of the last append reaching the disk in any
// order, partly) is covered only by raftlog's unit tests, which forge torn
// tails.
//
// A directory of a version before raftlog has its log in raft.db: Open
// moves it (see Open). raft.db never shrinks (bbolt reuses freed pages), so
// it keeps the size the old log gave it.
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
	boltraft "github.com/hashicorp/raft"
	raftboltdb "github.com/hashicorp/raft-boltdb/v2"
	"go.etcd.io/bbolt"

	"github.com/ticketing-dev/ticketing/internal/fsutil"
	"github.com/ticketing-dev/ticketing/internal/raft"
	"github.com/ticketing-dev/ticketing/internal/raftlog"
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
	log       *raftlog.Store
}

// LogErr returns nil while the log can be written, and otherwise why not
// (raftlog.Store.WriteErr: the last append failed, e.g. the disk is full,
// until one succeeds). Raft keeps running when a follower's append
// fails, so this is how the node learns that it can neither follow nor
// lead.
func (s *Stores) LogErr() error {
	return s.log.WriteErr()
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
	return &Stores{Log: cached, Stable: db, Snapshots: snaps, log: log, close: func() error {
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
			// A migration that a crash stopped after the rename leaves
			// the same entries in both (log/ ends where raft.db does, with
			// the same term). Anything else was written to raft.db after
			// the migration, by an older ticketingd: those entries were
			// acknowledged, and neither store alone has the node's log.
			if err := checkLeftover(logDir, db, boltFirst, boltLast, opts); err != nil {
				return nil, err
			}
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
		if err := fsutil.SyncDir(dir); err != nil {
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

// checkLeftover returns nil if raft.db's entries first..last are what an
// interrupted migration left: the log in logDir ends at last, with the
// same term. Otherwise it returns ErrLogConflict.
func checkLeftover(logDir string, db *raftboltdb.BoltStore, first, last uint64, opts raftlog.Options) error {
	var ll raft.Log
	bl, err := boltLog(db, last)
	if err != nil {
		return fmt.Errorf("raftstore: raft.db entry %d: %w", last, err)
	}
	log, err := raftlog.Open(logDir, opts)
	if errors.Is(err, raftlog.ErrLocked) {
		return fmt.Errorf("%w: %s", ErrLocked, logDir)
	}
	if err != nil {
		return fmt.Errorf("raftstore: %w", err)
	}
	defer log.Close()
	logLast, err := log.LastIndex()
	if err != nil {
		return fmt.Errorf("raftstore: %w", err)
	}
	if logLast == last {
		if err := log.GetLog(last, &ll); err == nil && ll.Term == bl.Term {
			return nil
		}
	}
	return fmt.Errorf("%w: %s holds raft log entries %d..%d (term %d at %d) that %s does not end with (it ends at %d): "+
		"an older ticketingd, which keeps the log in raft.db, ran on this data directory after this version moved the log to log/. "+
		"Both hold entries this node acknowledged, so neither can be used alone: remove the node from the cluster (ticketingd cluster remove), "+
		"delete %s, and add it again (it then copies the log from the leader)",
		ErrLogConflict, filepath.Join(filepath.Dir(logDir), "raft.db"), first, last, bl.Term, last, logDir, logLast, filepath.Dir(logDir))
}

// boltLog reads entry i of raft.db's log, as the product's raft.Log.
func boltLog(db *raftboltdb.BoltStore, i uint64) (*raft.Log, error) {
	var bl boltraft.Log
	if err := db.GetLog(i, &bl); err != nil {
		return nil, err
	}
	l := FromUpstream(&bl)
	return &l, nil
}

// FromUpstream returns l, an entry in the types of the upstream
// hashicorp/raft module (which raft-boltdb speaks), as the product's
// raft.Log (package internal/raft, a copy of that module: the same
// fields). Data and Extensions are shared, not copied.
func FromUpstream(l *boltraft.Log) raft.Log {
	return raft.Log{Index: l.Index, Term: l.Term, Type: raft.LogType(l.Type), Data: l.Data, Extensions: l.Extensions, AppendedAt: l.AppendedAt}
}

// ToUpstream is FromUpstream's reverse.
func ToUpstream(l *raft.Log) boltraft.Log {
	return boltraft.Log{Index: l.Index, Term: l.Term, Type: boltraft.LogType(l.Type), Data: l.Data, Extensions: l.Extensions, AppendedAt: l.AppendedAt}
}

// migrate copies entries first..last from db into a new log in dir. A
// bolt log may have a gap (raft stores after one on a follower that
// installed a snapshot beyond its log); the entries before it are older
// than the snapshot, and raftlog drops them at a gap anyway, so only the
// run of consecutive entries that ends at last is copied.
func migrate(dir string, db *raftboltdb.BoltStore, first, last uint64, opts raftlog.Options) error {
	start := last
	for start > first {
		_, err := boltLog(db, start-1)
		if errors.Is(err, boltraft.ErrLogNotFound) {
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
			l, err := boltLog(db, i)
			if err != nil {
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

// Close closes the stores. It is idempotent: later calls return the first
// call's result.
func (s *Stores) Close() error {
	if s.close == nil {
		return errors.New("raftstore: not opened by Open")
	}
	s.closeOnce.Do(func() { s.closeErr = s.close() })
	return s.closeErr
}
