package raftstore

import "errors"

// ErrLocked is returned by Open when the stores are open in another
// process (or another Open in this one): bbolt holds an exclusive lock on
// raft.db while it is open.
var ErrLocked = errors.New("raftstore: raft state is in use (locked by another process?)")
