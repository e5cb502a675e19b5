package raftstore

import (
	"errors"
	"path/filepath"
	"testing"

	raftboltdb "github.com/hashicorp/raft-boltdb/v2"
)

// TestOpenAfterDowngradeKeepsBoltEntries: a node runs this version (its log
// moves to dir/log), is downgraded to a version before raftlog
// (docs/operations.md: "Downgrades are safe while the data directory format
// stays v1"), which finds no entries in raft.db and stores (and
// acknowledges) what the leader sends it there, and is then upgraded
// again. Open sees dir/log and entries in raft.db, takes them for what a
// migration interrupted after its rename left, and deletes them: the node
// silently goes back to its old log and loses entries it acknowledged (a
// Raft safety violation: a committed grant can be lost with one more node
// failure). Open must keep the newer entries (or refuse to start), not
// delete them.
func TestOpenAfterDowngradeKeepsBoltEntries(t *testing.T) {
	dir := t.TempDir()
	s, err := Open(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Log.StoreLogs(makeLogs(1, 100)); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}

	// The older binary: its log store is raft.db.
	db, err := raftboltdb.New(raftboltdb.Options{Path: filepath.Join(dir, "raft.db")})
	if err != nil {
		t.Fatal(err)
	}
	if last, _ := db.LastIndex(); last != 0 {
		t.Fatalf("raft.db log ends at %d after the migration, want empty", last)
	}
	for i := uint64(1); i <= 300; i += 100 {
		if err := db.StoreLogs(makeBoltLogs(i, 100)); err != nil {
			t.Fatal(err)
		}
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}

	// Upgraded again: Open refuses, and deletes nothing.
	s, err = Open(dir, nil)
	if errors.Is(err, ErrLogConflict) {
		db, err := raftboltdb.New(raftboltdb.Options{Path: filepath.Join(dir, "raft.db")})
		if err != nil {
			t.Fatal(err)
		}
		defer db.Close()
		if last, _ := db.LastIndex(); last != 300 {
			t.Errorf("raft.db log ends at %d after the refused Open, want 300", last)
		}
		return
	}
	if err != nil {
		t.Fatalf("Open: %v, want ErrLogConflict", err)
	}
	defer s.Close()
	last, err := s.Log.LastIndex()
	if err != nil {
		t.Fatal(err)
	}
	if last != 300 {
		t.Errorf("log ends at %d after the re-upgrade; the node had acknowledged 1..300", last)
	}
	if _, boltLast := boltLogsOpen(t, s); boltLast == 0 && last != 300 {
		t.Errorf("and raft.db's entries 1..300 were deleted")
	}
}

// boltLogsOpen is raft.db's log range through the open Stores.
func boltLogsOpen(t *testing.T, s *Stores) (uint64, uint64) {
	t.Helper()
	return logRange(t, s.Stable.(*raftboltdb.BoltStore))
}
