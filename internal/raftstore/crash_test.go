package raftstore

import (
	"os"
	"testing"

	boltraft "github.com/hashicorp/raft"

	"github.com/ticketing-dev/ticketing/internal/crashtest"
	"github.com/ticketing-dev/ticketing/internal/raft"
)

// crashChildEnv names the directory a child process of TestCrashKill9
// writes to, with Open's stores. The child's first term comes from
// crashtest.TermEnv (CRASHTEST_TERM; RAFTSTORE_CRASH_TERM before the
// harness moved to internal/crashtest).
const crashChildEnv = "RAFTSTORE_CRASH_CHILD_DIR"

// crashModeEnv is the child's mode: "" (default segments, appends and head
// compactions) or "small" (tiny segments, and tail truncations too).
const crashModeEnv = "RAFTSTORE_CRASH_MODE"

// smallSegmentSize is the segment size of the "small" mode: a rotation
// every one to three appends.
const smallSegmentSize = 32 << 10

// makeLogs returns n entries of term 1 from index first, as raft's leader
// builds them.
func makeLogs(first uint64, n int) []*raft.Log { return crashtest.Entries(first, n, 1) }

// makeBoltLogs is makeLogs in the types raft-boltdb speaks (the upstream
// hashicorp/raft module's), for raft.db's log of an older version.
func makeBoltLogs(first uint64, n int) []*boltraft.Log {
	var out []*boltraft.Log
	for _, l := range makeLogs(first, n) {
		bl := ToUpstream(l)
		out = append(out, &bl)
	}
	return out
}

// payload is the data of entry idx of term 1: crashtest.PayloadSize bytes
// that depend on idx, so a reader can check it.
func payload(idx uint64) []byte { return crashtest.Payload(idx, 1) }

var stableKey = crashtest.StableKey

// crashConfig is the crash test of Open's stores in mode (crashModeEnv).
// The parent reopens them with the default segment size, whatever the mode.
func crashConfig(mode string) crashtest.Config {
	return crashtest.Config{
		ChildEnv: func(dir string) []string {
			return []string{crashChildEnv + "=" + dir, crashModeEnv + "=" + mode}
		},
		Open: func(dir string) (crashtest.Store, error) {
			s, err := Open(dir, nil)
			if err != nil {
				return crashtest.Store{}, err
			}
			return crashtest.Store{Log: s.Log, Stable: s.Stable, Close: s.Close}, nil
		},
		Truncate: mode == "small",
	}
}

// crashChild is a child of TestCrashKill9 (crashtest.Child) on Open's
// stores in dir, with the segments of crashModeEnv's mode.
func crashChild(dir string) int {
	mode := os.Getenv(crashModeEnv)
	if mode == "small" {
		logSegmentSize = smallSegmentSize
	}
	return crashtest.Child(crashConfig(mode), dir)
}

// TestCrashKill9 appends to Open's stores from a child process, kills it
// with SIGKILL mid-stream, reopens them and checks that everything the child
// was told is durable is there; then it appends again on the same
// directory, for several rounds (internal/crashtest). bench/logstore has
// the same test for raft-wal and raft-boltdb.
func TestCrashKill9(t *testing.T) { crashtest.Rounds(t, crashConfig("")) }

// TestCrashKill9SmallSegments is TestCrashKill9 with 32 KiB segments (a
// rotation every one to three appends) and tail truncations followed by
// appends of a new term: no deleted entry may come back.
func TestCrashKill9SmallSegments(t *testing.T) { crashtest.Rounds(t, crashConfig("small")) }
