package raftstore

import (
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"testing"

	"github.com/hashicorp/raft"
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
