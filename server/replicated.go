package server

// What the two replicated modes share, the Raft cluster (log_cluster*.go)
// and the hot-standby pair (log_pair*.go): the effects only a replicated
// core has (replicated, below); the rule for their IDs and the mutual TLS
// between their nodes (package internal/replica, which both import); the
// group's identity that a version-3 HELLO_OK carries (Server.group, which
// each sets: role.go, groupID). The lock path both run is lockpath.go's,
// as standalone's is.

// replicated is what a replicated mode does with the effects only its
// core has.
type replicated interface {
	proposalLimited()      // an ACQUIRE answered B: Config.MaxPending commands await their apply
	slowCommit(took int64) // a grant answered B: it applied took ns after its proposal
	resync(key string)     // a command did not apply as projected: key's projection from the machine
}
