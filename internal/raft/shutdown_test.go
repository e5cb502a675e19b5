package raft

import (
	"errors"
	"testing"
	"time"
)

// TestQueuedFutureAnsweredAtShutdown: a proposal still queued on the
// leader's apply channel when raft shuts down is answered with
// ErrRaftShutdown; before, its Error never returned.
func TestQueuedFutureAnsweredAtShutdown(t *testing.T) {
	nodes := gatedCluster(t, false)
	leader := nodes[0]
	next := leader.r.LastIndex() + 1
	leader.store.shut(next)
	first := leader.r.Apply([]byte("first"), 30*time.Second)
	<-leader.store.held // the leader's goroutine is in StoreLogs
	queued := leader.r.Apply([]byte("queued"), 30*time.Second)

	shut := make(chan error, 1)
	go func() { shut <- leader.r.Shutdown().Error() }()
	waitFor(t, "the shutdown begins", func() bool {
		select {
		case <-leader.r.shutdownCh:
			return true
		default:
			return false
		}
	})
	leader.store.open()
	if err := <-shut; err != nil {
		t.Fatal(err)
	}

	for name, f := range map[string]ApplyFuture{"dispatched": first, "queued": queued} {
		done := make(chan error, 1)
		go func() { done <- f.Error() }()
		select {
		case err := <-done:
			if name == "queued" && !errors.Is(err, ErrRaftShutdown) {
				t.Errorf("%s proposal: %v, want ErrRaftShutdown", name, err)
			}
		case <-time.After(time.Minute):
			t.Fatalf("the %s proposal's Error did not return after the shutdown", name)
		}
	}
}
