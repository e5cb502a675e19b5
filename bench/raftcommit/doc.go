// Command raftcommit measures the commit latency and throughput of a
// 3-node Raft group on 127.0.0.1, each node with its log in its own
// directory, fsync'd (fdatasync) before an append is acknowledged:
//
//   - variant "hashicorp": the product's Raft (internal/raft, hashicorp/raft
//     v1.8.0 whose leader sends a batch while it appends it) over the
//     product's log store (internal/raftstore) and transport
//     (internal/raftnet, plain TCP), configured as server/log_cluster.go
//     configures it: a commit is one fsync on the critical path, the
//     leader's in parallel with the followers'.
//   - variant "hashicorp-serial": the same with
//     raft.Config.SerialLeaderAppend, upstream hashicorp/raft's order: the
//     leader appends a batch (fdatasync) before it sends it, so a commit is
//     two fsyncs in series.
//   - variant "etcd": go.etcd.io/raft/v3 with a minimal WAL (wal.go) and a
//     TCP transport (transport.go). Its leader sends a Ready's MsgApps
//     before it persists that Ready's entries: a commit is one fsync on the
//     critical path, the leader's in parallel with the followers'.
//   - variant "etcdasync": the same with raft.Config.AsyncStorageWrites,
//     appends and applies in goroutines of their own.
//
// The three nodes are three groups of goroutines in one process, talking
// TCP over 127.0.0.1. Rounds alternate the variants; see bench/README.md.
package main
