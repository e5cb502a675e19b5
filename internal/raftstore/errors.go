package raftstore

import "errors"

// ErrLocked is returned by Open when the stores are open in another
// process (or another Open in this one): bbolt holds an exclusive lock on
// raft.db while it is open.
var ErrLocked = errors.New("raftstore: raft state is in use (locked by another process?)")

// ErrLogConflict is returned by Open when raft.db holds log entries that
// the log directory does not: an older ticketingd (which keeps the log in
// raft.db) ran on the directory after this version moved the log out of
// it. The error says what to do.
var ErrLogConflict = errors.New("raftstore: raft.db and log/ hold different raft logs")
