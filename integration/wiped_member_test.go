package integration_test

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/ticketing-dev/ticketing/integration/harness"
)

// TestClusterWipedMemberRestartedAlone: three ticketingd nodes with a
// cluster-id written by hand (not made by init, so not bound to their
// peers) grant keys; n1 is killed with SIGKILL, its data directory wiped,
// and it is started again with --peers naming itself alone. It bootstraps
// a one-node configuration whose first entry has the index and term of the
// real one's. Before the member check the real leader's AppendEntries
// matched it and pulled it in as a follower of the old history, and a cut
// of its Raft port later left it leading alone beside the real leader,
// both granting the same tokens. Pass: the wiped node (its /status) never
// follows another node nor lists one in its configuration; it exits
// refusing to go on, its log saying that its data
// directory was wiped and what to do; the two others go on granting
// tokens above every token granted before; and every token of the run's
// history is unique (CheckTokensUnique).
func TestClusterWipedMemberRestartedAlone(t *testing.T) {
	const cid = "my-own-cluster"
	bin := harness.Ticketingd(t)
	c := harness.StartCluster(t, bin, harness.ClusterOptions{Args: []string{"--cluster-id", cid}})
	c.WaitLeader(t, hangGuard)
	h := harness.NewHistory()
	h.WriteArtifactOnFailure(t, "history")
	ctx, cancel := context.WithTimeout(t.Context(), 4*hangGuard)
	defer cancel()

	b := newBroker(t, loadBroker(c.Addrs(), "wiped-member"))
	var last uint64
	for i := range 4 {
		tk, err := acquireRetry(ctx, h, "broker", b, fmt.Sprint("k", i), 0, time.Minute)
		if err != nil {
			t.Fatalf("acquire k%d: %v", i, err)
		}
		last = max(last, tk.Token())
	}
	b.Close()

	n1 := c.Nodes[0]
	h.Event("test", "kill9", n1.ID)
	n1.Kill9()
	if err := os.RemoveAll(n1.DataDir()); err != nil {
		t.Fatal(err)
	}
	h.Event("test", "wiped", n1.ID)
	self := n1.ID + "=" + n1.Proxy.Addr()
	alone := harness.StartServer(t, bin, harness.ServerOptions{
		Listen:  n1.Addr(),
		DataDir: n1.DataDir(),
		Args: []string{"--cluster", "--node-id", n1.ID, "--cluster-id", cid,
			"--raft-listen", n1.RaftListen, "--raft-advertise", n1.Proxy.Addr(),
			"--advertise", n1.Addr(), "--peers", self, "--admin-listen", n1.Admin},
	})
	h.Event("test", "started alone", self)

	// Until it exits, it follows no other node, and its configuration is
	// itself alone. (Pulled in, it followed the cluster's leader, taking
	// its entries after its own index 1; its configuration stayed its own,
	// the only configuration entry being the bootstraps' at index 1.)
	deadline := time.Now().Add(2 * hangGuard)
	for exited := false; !exited; {
		select {
		case <-alone.Process().Done():
			exited = true
			continue
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("the wiped node did not exit refusing within %v; its log:\n%s", 2*hangGuard, alone.Log())
		}
		st, err := n1.Status()
		if err != nil {
			continue // not answering yet, or exiting
		}
		if len(st.Servers) > 1 || st.Leader != "" && st.Leader != n1.ID {
			t.Fatalf("the wiped node, bootstrapped alone, was pulled into the cluster: it follows %q, its configuration is %v (term %d, last log index %d)", st.Leader, st.Servers, st.Term, st.LastLogIndex)
		}
	}
	code, _ := alone.Process().Wait(time.Second)
	if code == 0 {
		t.Errorf("the wiped node exited with status 0")
	}
	for _, want := range []string{"node " + n1.ID + " refuses to go on", "wiped or replaced", "ticketingd cluster remove " + n1.ID} {
		if !strings.Contains(alone.Log(), want) {
			t.Errorf("the wiped node's log lacks %q:\n%s", want, alone.Log())
		}
	}

	b2 := newBroker(t, loadBroker([]string{c.Nodes[1].Addr(), c.Nodes[2].Addr()}, "after"))
	tk, err := acquireRetry(ctx, h, "after", b2, "fresh", 0, time.Minute)
	if err != nil {
		t.Fatalf("acquire on the two others: %v", err)
	}
	if tk.Token() <= last {
		t.Errorf("token %d on the two others after the wiped node's refusal, not above %d", tk.Token(), last)
	}
	if err := harness.CheckTokensUnique(h); err != nil {
		t.Error(err)
	}
}
