package raftstore

import (
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"testing"

	raftboltdb "github.com/hashicorp/raft-boltdb/v2"
	"github.com/ticketing-dev/ticketing/internal/raft"
	"github.com/ticketing-dev/ticketing/internal/raftlog"
)

func TestOpenReopen(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "raft")
	s, err := Open(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	if has, err := raft.HasExistingState(s.Log, s.Stable, s.Snapshots); err != nil || has {
		t.Fatalf("new stores: HasExistingState = %v, %v", has, err)
	}
	if err := s.Log.StoreLogs(makeLogs(1, 100)); err != nil {
		t.Fatal(err)
	}
	if err := s.Stable.SetUint64(stableKey, 7); err != nil {
		t.Fatal(err)
	}
	sink, err := s.Snapshots.Create(raft.SnapshotVersionMax, 90, 1, raft.Configuration{}, 1, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := sink.Write([]byte("state")); err != nil {
		t.Fatal(err)
	}
	if err := sink.Close(); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if fi, err := os.Stat(dir); err != nil || fi.Mode().Perm() != 0o700 {
		t.Fatalf("dir: %v, %v; want mode 0700", fi, err)
	}
	// The log is in dir/log, not in raft.db.
	if segs, err := filepath.Glob(filepath.Join(dir, "log", "*.seg")); err != nil || len(segs) != 1 {
		t.Fatalf("log segments %v, %v; want one", segs, err)
	}
	if first, last := boltLogs(t, dir); first != 0 || last != 0 {
		t.Fatalf("raft.db holds entries %d..%d", first, last)
	}

	s, err = Open(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if has, err := raft.HasExistingState(s.Log, s.Stable, s.Snapshots); err != nil || !has {
		t.Fatalf("reopened: HasExistingState = %v, %v", has, err)
	}
	var l raft.Log
	if err := s.Log.GetLog(100, &l); err != nil || !bytes.Equal(l.Data, payload(100)) {
		t.Fatalf("GetLog(100) = %x, %v", l.Data, err)
	}
	if v, err := s.Stable.GetUint64(stableKey); err != nil || v != 7 {
		t.Fatalf("GetUint64 = %d, %v; want 7", v, err)
	}
	metas, err := s.Snapshots.List()
	if err != nil || len(metas) != 1 || metas[0].Index != 90 {
		t.Fatalf("snapshots: %+v, %v", metas, err)
	}
	_, rc, err := s.Snapshots.Open(metas[0].ID)
	if err != nil {
		t.Fatal(err)
	}
	data, err := io.ReadAll(rc)
	rc.Close()
	if err != nil || string(data) != "state" {
		t.Fatalf("snapshot data %q, %v", data, err)
	}
}

func TestOpenLocked(t *testing.T) {
	dir := t.TempDir()
	s, err := Open(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Open(dir, nil); !errors.Is(err, ErrLocked) {
		s.Close()
		t.Fatalf("second Open = %v; want ErrLocked", err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s, err = Open(dir, nil)
	if err != nil {
		t.Fatalf("Open after Close: %v", err)
	}
	s.Close()
}

func TestCloseNotOpened(t *testing.T) {
	if err := new(Stores).Close(); err == nil {
		t.Fatal("Close of a zero Stores: nil error")
	}
}

// boltWithLogs creates dir/raft.db as the previous version did (the log
// and the stable store in bbolt), holding the entries of the ranges and
// stableKey = 7.
func boltWithLogs(t *testing.T, dir string, ranges ...[2]uint64) {
	t.Helper()
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	db, err := raftboltdb.New(raftboltdb.Options{Path: filepath.Join(dir, "raft.db")})
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range ranges {
		for i := r[0]; i <= r[1]; i += 1000 {
			if err := db.StoreLogs(makeBoltLogs(i, int(min(r[1]-i+1, 1000)))); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := db.SetUint64(stableKey, 7); err != nil {
		t.Fatal(err)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
}

// boltLogs returns raft.db's FirstIndex and LastIndex.
func boltLogs(t *testing.T, dir string) (uint64, uint64) {
	t.Helper()
	db, err := raftboltdb.New(raftboltdb.Options{Path: filepath.Join(dir, "raft.db")})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	return logRange(t, db)
}

// logRange is db's FirstIndex and LastIndex.
func logRange(t *testing.T, db *raftboltdb.BoltStore) (uint64, uint64) {
	t.Helper()
	first, err := db.FirstIndex()
	if err != nil {
		t.Fatal(err)
	}
	last, err := db.LastIndex()
	if err != nil {
		t.Fatal(err)
	}
	return first, last
}

// checkLog checks that s's log holds exactly first..last of makeLogs.
func checkLog(t *testing.T, s *Stores, first, last uint64) {
	t.Helper()
	gotFirst, err1 := s.Log.FirstIndex()
	gotLast, err2 := s.Log.LastIndex()
	if err1 != nil || err2 != nil || gotFirst != first || gotLast != last {
		t.Fatalf("log [%d, %d] (%v, %v); want [%d, %d]", gotFirst, gotLast, err1, err2, first, last)
	}
	var l raft.Log
	for i := first; i <= last; i++ {
		if err := s.Log.GetLog(i, &l); err != nil || l.Index != i || !bytes.Equal(l.Data, payload(i)) {
			t.Fatalf("GetLog(%d) = index %d data %x, %v", i, l.Index, l.Data, err)
		}
	}
}

func TestOpenMigratesBoltLog(t *testing.T) {
	tests := []struct {
		name        string
		ranges      [][2]uint64
		first, last uint64
		prepare     func(t *testing.T, dir string)
	}{
		{"contiguous", [][2]uint64{{1, 5000}}, 1, 5000, nil},
		{"compacted head", [][2]uint64{{4001, 9000}}, 4001, 9000, nil},
		// Entries stored after a gap (a snapshot install on a follower):
		// those before it are older than the snapshot.
		{"gap", [][2]uint64{{1, 100}, {200, 300}}, 200, 300, nil},
		{"interrupted before the rename", [][2]uint64{{1, 3000}}, 1, 3000, func(t *testing.T, dir string) {
			tmp := filepath.Join(dir, "log.migrating")
			if err := os.MkdirAll(tmp, 0o700); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(tmp, "00000000000000000001.seg"), []byte("partial"), 0o600); err != nil {
				t.Fatal(err)
			}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			boltWithLogs(t, dir, tt.ranges...)
			if tt.prepare != nil {
				tt.prepare(t, dir)
			}
			s, err := Open(dir, nil)
			if err != nil {
				t.Fatal(err)
			}
			checkLog(t, s, tt.first, tt.last)
			if v, err := s.Stable.GetUint64(stableKey); err != nil || v != 7 {
				t.Fatalf("stable value %d, %v after the migration", v, err)
			}
			if err := s.Log.StoreLogs(makeLogs(tt.last+1, 10)); err != nil {
				t.Fatal(err)
			}
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
			if first, last := boltLogs(t, dir); first != 0 || last != 0 {
				t.Fatalf("raft.db still holds entries %d..%d", first, last)
			}
			if _, err := os.Stat(filepath.Join(dir, "log.migrating")); !errors.Is(err, os.ErrNotExist) {
				t.Fatalf("log.migrating left: %v", err)
			}
			s, err = Open(dir, nil)
			if err != nil {
				t.Fatal(err)
			}
			checkLog(t, s, tt.first, tt.last+10)
			s.Close()
		})
	}
}

// TestOpenMigrationInterruptedAfterRename: dir/log has the entries and
// raft.db still has them too (a crash before their deletion).
func TestOpenMigrationInterruptedAfterRename(t *testing.T) {
	dir := t.TempDir()
	boltWithLogs(t, dir, [2]uint64{1, 2000})
	log, err := raftlog.Open(filepath.Join(dir, "log"), raftlog.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := log.StoreLogs(makeLogs(1, 2000)); err != nil {
		t.Fatal(err)
	}
	if err := log.Close(); err != nil {
		t.Fatal(err)
	}
	s, err := Open(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	checkLog(t, s, 1, 2000)
	s.Close()
	if first, last := boltLogs(t, dir); first != 0 || last != 0 {
		t.Fatalf("raft.db still holds entries %d..%d", first, last)
	}
}
