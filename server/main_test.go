package server_test

import (
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	// One goroutine may outlive a cluster node: cluster.await's wait on a
	// hashicorp/raft future that was still queued when raft shut down,
	// which raft never answers (hashicorp/raft#498). Close does not wait
	// for it (await returns at the node's stop); it holds the future and
	// nothing else.
	goleak.VerifyTestMain(m, goleak.IgnoreTopFunction("github.com/ticketing-dev/ticketing/internal/raft.(*deferError).Error"))
}
