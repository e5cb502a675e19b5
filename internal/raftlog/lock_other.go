//go:build !unix

package raftlog

import "os"

// lockFile does nothing here: on such systems the caller must keep a
// second process away (internal/raftstore holds raft.db's bbolt lock
// first).
func lockFile(*os.File) error { return nil }
