package main

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ticketing-dev/ticketing/server"
)

// TestClusterAddedNodeNeverBootstraps: a node written by 'init --cluster
// --add' but started with only itself in --peers must not form and lead a
// cluster of its own (a broker given the URL that init --add prints would
// use both leaders): its config says initial-cluster-state existing, and
// --peers with it is a usage error that says so. Without it the node led a
// one-node cluster.
func TestClusterAddedNodeNeverBootstraps(t *testing.T) {
	dir, _, _ := initClusterBundle(t, 4)
	code, _, stderr := runCapture(t, "init", "--cluster", "--add", "--dir", dir, "--node", "n4=127.0.0.1")
	if code != 0 {
		t.Fatalf("init --cluster --add: exit %d: %s", code, stderr)
	}
	o4, err := parseServe(t, "--config", filepath.Join(dir, "n4", initConfigFile))
	if err != nil {
		t.Fatal(err)
	}
	raft4 := o4.RaftListen
	p := startInProc(t, "serve", "--config", filepath.Join(dir, "n4", initConfigFile), "--peers", "n4="+raft4, "--log-format", "json")
	lead := make(chan error, 1)
	go func() {
		_, err := p.stderr.WaitJSON(0, "cluster: leading", p.done, time.Minute) // a hang guard
		lead <- err
	}()
	select {
	case <-p.done:
	case err := <-lead:
		if err != nil {
			// The waiter also returns when the process exits (which is
			// what should happen): both cases can be ready at once.
			select {
			case <-p.done:
			default:
				t.Fatalf("n4 neither exited nor led: %v", err)
			}
			break
		}
		t.Fatalf("n4, added with init --add and started with --peers n4=%s, leads a cluster of its own:\n%s", raft4, p.stderr.String())
	}
	if p.code != 2 || !strings.Contains(p.stderr.String(), "initial-cluster-state") || !strings.Contains(p.stderr.String(), "must be empty") {
		t.Errorf("n4 with --peers: exit %d:\n%s", p.code, p.stderr.String())
	}
}

// TestClusterWipedNodeExits: a follower of a running cluster from 'init
// --cluster' whose data directory is wiped ("replace the disk and restart
// the service") exits 1 at its restart, naming a peer that has the
// cluster's state and the commands that bring it back, instead of
// bootstrapping again with the peers of its config.
func TestClusterWipedNodeExits(t *testing.T) {
	bin := buildBinary(t)
	dir, _, ports := initClusterBundle(t, 3)
	var nodes []*subprocess
	var admins []string
	for i, id := range []string{"n1", "n2", "n3"} {
		nodes = append(nodes, startBinary(t, bin, "serve", "--config", filepath.Join(dir, id, initConfigFile), "--log-format", "json"))
		admins = append(admins, "127.0.0.1:"+strconv.Itoa(ports[2]+i))
	}
	views := waitCluster(t, admins, "one leader that all three follow", func(v []server.ClusterStatus) bool { return agreedLeader(v, 3) >= 0 })
	f := (agreedLeader(views, 3) + 1) % 3
	id := views[f].NodeID
	_ = nodes[f].cmd.Process.Kill()
	<-nodes[f].done
	data := filepath.Join(dir, id, initDataDir)
	if err := os.RemoveAll(data); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(data, 0o700); err != nil {
		t.Fatal(err)
	}
	again := startBinary(t, bin, "serve", "--config", filepath.Join(dir, id, initConfigFile), "--log-format", "json")
	select {
	case <-again.done:
	case <-time.After(time.Minute): // a hang guard
		t.Fatalf("%s, wiped, still runs:\n%s", id, again.stderr.String())
	}
	out := again.stderr.String()
	if code := again.exitCode(); code != 1 || !strings.Contains(out, "node "+id+" refuses to bootstrap") ||
		!strings.Contains(out, "'ticketingd cluster remove "+id+"'") || !strings.Contains(out, "has the state of cluster "+views[f].ClusterID) {
		t.Errorf("%s, wiped and restarted: exit %d:\n%s", id, code, out)
	}
}
