//go:build linux

package raftlog

import (
	"strings"
	"syscall"
	"testing"

	"github.com/ticketing-dev/ticketing/internal/raft"
)

// withFileSizeLimit runs f with RLIMIT_FSIZE at limit bytes: a write that
// would go past it fails with EFBIG (the Go runtime ignores SIGXFSZ), a
// real write error without a fault-injection hook in the package.
func withFileSizeLimit(t *testing.T, limit uint64, f func()) {
	t.Helper()
	var old syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_FSIZE, &old); err != nil {
		t.Skip(err)
	}
	lim := old
	lim.Cur = limit
	if err := syscall.Setrlimit(syscall.RLIMIT_FSIZE, &lim); err != nil {
		t.Skip(err)
	}
	defer func() {
		if err := syscall.Setrlimit(syscall.RLIMIT_FSIZE, &old); err != nil {
			t.Fatal(err)
		}
	}()
	f()
}

// TestFailedFirstWriteThenOtherIndex: on an empty log, StoreLogs(N) writes
// the meta file (N), creates segment N and fails to write (here EFBIG; an
// EIO or ENOSPC on a batch larger than the preallocation do the same). The
// undo succeeds, so the Store is not broken, but the empty segment N stays
// the tail while the log is empty (first == 0). A later StoreLogs from
// another index M (raft, e.g. after installing a snapshot on the empty
// follower, or a new leader sending from elsewhere) is accepted and written
// into segment N as if it were N: GetLog(M) then panics (index out of
// range) or reads the wrong record, and after a reopen the acknowledged
// entries are gone (record of index M where N belongs: cut as torn; or
// below the meta file's N).
func TestFailedFirstWriteThenOtherIndex(t *testing.T) {
	for _, tc := range []struct {
		name string
		next uint64
	}{{"higher", 20}, {"lower", 3}} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			s := open(t, dir, 4096)
			defer s.Close()
			// The limit is the process's: well above any other file the
			// test binary writes meanwhile (go test's testlog.txt).
			withFileSizeLimit(t, 32<<20, func() {
				// One entry bigger than the limit: the pwrite fails.
				err := s.StoreLogs([]*raft.Log{entry(10, 1, 33<<20)})
				if err == nil {
					t.Fatal("StoreLogs past RLIMIT_FSIZE succeeded")
				}
				// The error names the segment as it is named on disk,
				// not the .tmp name it was created under.
				if strings.Contains(err.Error(), ".tmp") || !strings.Contains(err.Error(), segName(10)) {
					t.Errorf("StoreLogs error %q: want it to name %s, without .tmp", err, segName(10))
				}
			})
			if s.broken != nil {
				t.Fatalf("store broken after a failed write that was undone: %v", s.broken)
			}
			ls := entries(tc.next, tc.next+4, 2, 50)
			if err := s.StoreLogs(ls); err != nil {
				// Refusing is acceptable; storing and then losing is not.
				t.Logf("StoreLogs from %d refused: %v", tc.next, err)
				return
			}
			m := newModel()
			m.store(ls)
			// After a restart first, as a kill -9 right after the ack would.
			s2 := reopen(t, s)
			m.check(t, s2, "acknowledged, reopened")
			s = s2
			func() {
				defer func() {
					if r := recover(); r != nil {
						t.Fatalf("GetLog after an acknowledged StoreLogs(%d..): panic %v", tc.next, r)
					}
				}()
				m.check(t, s, "acknowledged")
			}()
		})
	}
}
