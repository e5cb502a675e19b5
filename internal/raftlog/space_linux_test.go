//go:build linux

package raftlog

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/ticketing-dev/ticketing/internal/raft"
)

// Every segment used to be preallocated at the
// full segment size, so on a disk with less free space than that the log
// could never start a new segment (a follower with its data dir on a
// 70 MiB tmpfs stayed at the index where its first segment filled, even
// after space was freed, since a second 64 MiB segment never fits beside
// the first), and nothing reported it.

// smallFS mounts a tmpfs of size (mount(8)'s syntax, "70m") on a new
// directory and returns it; it is unmounted when the test ends. It skips
// the test where mounting is not allowed (not root).
func smallFS(t *testing.T, size string) string {
	t.Helper()
	dir := t.TempDir()
	if err := syscall.Mount("tmpfs", dir, "tmpfs", 0, "size="+size+",mode=0700"); err != nil {
		t.Skipf("cannot mount a tmpfs (%v): run as root to test a full disk", err)
	}
	t.Cleanup(func() {
		if err := syscall.Unmount(dir, 0); err != nil {
			t.Errorf("unmount %s: %v", dir, err)
		}
	})
	return dir
}

// fillFS writes path until the file system is full.
func fillFS(t *testing.T, path string) {
	t.Helper()
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	buf := make([]byte, 64<<10)
	for {
		n, err := f.Write(buf)
		if err != nil {
			if !errors.Is(err, syscall.ENOSPC) {
				t.Fatal(err)
			}
			if n == 0 && len(buf) > 1 {
				buf = buf[:len(buf)/2]
				continue
			}
			if n == 0 {
				return
			}
		}
	}
}

// TestSegmentsShrinkOnFullDisk: a log of 64 MiB segments on a 70 MiB
// tmpfs (the follower). When the first segment is full, the
// second is preallocated to what fits; when nothing fits, StoreLogs fails
// and WriteErr says why (ENOSPC); a reopen on the full disk works; once
// space is freed, StoreLogs succeeds again and WriteErr is nil. No entry
// is lost on the way.
func TestSegmentsShrinkOnFullDisk(t *testing.T) {
	fs := smallFS(t, "70m")
	dir := filepath.Join(fs, "log")
	s := open(t, dir, 0) // DefaultSegmentSize: 64 MiB
	defer func() { s.Close() }()
	m := newModel()
	next := uint64(1)
	batch := func() []*raft.Log { // 64 entries of 16 KiB: 1 MiB
		ls := entries(next, next+63, 1, 16<<10)
		return ls
	}
	store := func(ls []*raft.Log) error {
		if err := s.StoreLogs(ls); err != nil {
			return err
		}
		m.store(ls)
		next = m.last + 1
		return nil
	}
	// Through the first segment, and 2 MiB into the next.
	for len(s.segs) < 2 || s.segs[1].n() < 128 {
		if err := store(batch()); err != nil {
			t.Fatalf("StoreLogs from %d (segments: %d, free: %d bytes): %v", next, len(s.segs), free(t, fs), err)
		}
		if err := s.WriteErr(); err != nil {
			t.Fatalf("WriteErr after a StoreLogs that succeeded: %v", err)
		}
	}
	if sz := s.segs[1].size; sz >= DefaultSegmentSize || sz < 2<<20 {
		t.Fatalf("second segment preallocated to %d bytes on a 70 MiB file system", sz)
	}

	// The disk full: appends go on into the preallocated space, then fail.
	filler := filepath.Join(fs, "filler")
	fillFS(t, filler)
	var err error
	for i := 0; i < 100; i++ {
		if err = store(batch()); err != nil {
			break
		}
	}
	if err == nil {
		t.Fatal("StoreLogs succeeded 100 times on a full file system")
	}
	werr := s.WriteErr()
	if werr == nil || !errors.Is(werr, syscall.ENOSPC) || !strings.Contains(werr.Error(), dir) {
		t.Fatalf("WriteErr = %v after StoreLogs failed with %v; want ENOSPC naming %s", werr, err, dir)
	}
	m.check(t, s, "after the failed StoreLogs")

	// A restart on the full disk.
	s = reopen(t, s)
	m.check(t, s, "reopened on the full disk")
	if err := store(batch()); err == nil {
		t.Log("a StoreLogs after the reopen fitted in the tail's preallocation")
	}

	// Space freed: appends work again, and WriteErr clears.
	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 3; i++ {
		if err := store(batch()); err != nil {
			t.Fatalf("StoreLogs after space was freed: %v", err)
		}
	}
	if err := s.WriteErr(); err != nil {
		t.Fatalf("WriteErr after StoreLogs succeeded again: %v", err)
	}
	s = reopen(t, s)
	m.check(t, s, "reopened after space was freed")
}

// free returns the free bytes of the file system holding path.
func free(t *testing.T, path string) int64 {
	var st syscall.Statfs_t
	if err := syscall.Statfs(path, &st); err != nil {
		t.Fatal(err)
	}
	return int64(st.Bavail) * st.Bsize
}

// TestSegmentsShrinkUnderFileSizeLimit: the same fallback without root:
// under RLIMIT_FSIZE (EFBIG) a 64 MiB segment cannot be preallocated, a
// 4 MiB one can.
func TestSegmentsShrinkUnderFileSizeLimit(t *testing.T) {
	dir := t.TempDir()
	s := open(t, dir, 0)
	defer func() { s.Close() }()
	m := newModel()
	withFileSizeLimit(t, 4<<20, func() {
		for i := uint64(0); i < 3; i++ {
			ls := entries(1+i*16, 16+i*16, 1, 64<<10) // 1 MiB
			if err := s.StoreLogs(ls); err != nil {
				t.Fatalf("StoreLogs under a 4 MiB file size limit: %v", err)
			}
			m.store(ls)
		}
	})
	if sz := s.segs[0].size; sz != 4<<20 {
		t.Fatalf("segment preallocated to %d bytes under a 4 MiB file size limit; want 4 MiB", sz)
	}
	if err := s.WriteErr(); err != nil {
		t.Fatalf("WriteErr: %v", err)
	}
	s = reopen(t, s)
	m.check(t, s, "reopened")
}
