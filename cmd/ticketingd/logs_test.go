package main

import (
	"encoding/json"
	"fmt"
	"log/slog"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ticketing-dev/ticketing/broker"
	"github.com/ticketing-dev/ticketing/internal/proctest"
	"github.com/ticketing-dev/ticketing/server"
)

// jsonRecords decodes the JSON log lines in s (other lines are skipped).
func jsonRecords(s string) []map[string]any {
	var out []map[string]any
	for l := range strings.Lines(s) {
		var m map[string]any
		d := json.NewDecoder(strings.NewReader(l))
		d.UseNumber() // a token above 2^53 (a clock start is near it) stays exact
		if d.Decode(&m) == nil {
			out = append(out, m)
		}
	}
	return out
}

// TestClusterLogsReadable: what an operator reads from a healthy cluster
// of 'init --cluster' run as three 'ticketingd serve' processes at
// --log-level debug, and from a broker given the printed TICKETING_URL.
//
//   - The broker logs no Warn in 3 s of locking (its followers answer M
//     naming the leader: before, two "session open failed ... node not
//     active" lines at start, and "session still down" per follower every
//     10*BackoffMax, 2 s here), and its ready line names the leader's node
//     (init --cluster sets node-name: before, every node was "ticketingd").
//   - At debug the leader logs each HELLO, request and reply with the
//     client's req_id (grants with their token, releases); a follower
//     logs its M with the hint.
//   - With a follower killed, the leader's raft lines about it ("failed
//     to appendEntries to", "failed to heartbeat to", once per attempt
//     before) come at most once per message and peer in 5 s.
func TestClusterLogsReadable(t *testing.T) {
	if runtime.GOOS == "windows" {
		t.Skip("runs the printed export lines with sh")
	}
	bin := buildBinary(t)
	dir, ex, ports := initClusterBundle(t, 1)
	var nodes []*subprocess
	var admins []string
	for i, id := range []string{"n1", "n2", "n3"} {
		nodes = append(nodes, startBinary(t, bin, "serve", "--config", filepath.Join(dir, id, initConfigFile), "--log-format", "json", "--log-level", "debug"))
		admins = append(admins, "127.0.0.1:"+strconv.Itoa(ports[2]+i))
	}
	for _, n := range nodes {
		n.addr(t)
	}
	views := waitCluster(t, admins, "one leader that all three follow", func(v []server.ClusterStatus) bool { return agreedLeader(v, 3) >= 0 })
	lead := agreedLeader(views, 3)
	leaderID := views[lead].NodeID
	leaderClient := "127.0.0.1:" + strconv.Itoa(ports[0]+lead)

	cfg, err := parseURL(t, ex["TICKETING_URL"])
	if err != nil {
		t.Fatal(err)
	}
	logs := proctest.NewLogBuffer()
	cfg.Logger = slog.New(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	cfg.BackoffMax = 200 * time.Millisecond // "still down" would be due every 2 s
	b, err := broker.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	ctx := t.Context()
	if err := b.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}
	var tokens []uint64
	for end := time.Now().Add(3 * time.Second); time.Now().Before(end); {
		tk, err := b.Acquire(ctx, "logs-"+strconv.Itoa(len(tokens)%2), broker.AcquireOptions{Lease: 10 * time.Second, Wait: time.Second})
		if err != nil {
			t.Fatal(err)
		}
		tokens = append(tokens, tk.Token())
		if err := tk.Release(ctx); err != nil {
			t.Fatal(err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	readyNode := ""
	for _, r := range jsonRecords(logs.String()) {
		switch {
		case r["level"] == "WARN" || r["level"] == "ERROR":
			t.Errorf("a healthy cluster made the broker log: %v", r)
		case r["msg"] == "broker: session ready":
			readyNode, _ = r["node"].(string)
		}
	}
	if readyNode != leaderID {
		t.Errorf("the broker's ready line names node %q, want the leader's node-name %q", readyNode, leaderID)
	}

	// The servers' debug lines: the leader's for the last lock, by req_id.
	has := func(n *subprocess, msg string, want map[string]any) bool {
		for _, r := range jsonRecords(n.stderr.String()) {
			if r["msg"] != msg {
				continue
			}
			ok := true
			for k, v := range want {
				if fmt.Sprint(r[k]) != fmt.Sprint(v) {
					ok = false
				}
			}
			if ok {
				return true
			}
		}
		return false
	}
	last := tokens[len(tokens)-1]
	for _, w := range []struct {
		msg  string
		want map[string]any
	}{
		{"HELLO_OK", map[string]any{"role": "leader"}},
		{"request ACQUIRE", map[string]any{"lease_s": 10}},
		{"reply G: granted", map[string]any{"token": last}},
		{"request RELEASE_OWNED", map[string]any{"token": last}},
		{"reply R: released", nil},
	} {
		if !has(nodes[lead], w.msg, w.want) {
			t.Errorf("the leader logged no %q line with %v at debug", w.msg, w.want)
		}
	}
	for _, r := range jsonRecords(nodes[lead].stderr.String()) {
		if m, _ := r["msg"].(string); (strings.HasPrefix(m, "request ") || strings.HasPrefix(m, "reply ")) && (r["req_id"] == nil || r["peer"] == nil) {
			t.Errorf("a request or reply line without req_id and peer: %v", r)
		}
	}
	follower := (lead + 1) % 3
	if !has(nodes[follower], "HELLO answered M: not serving", map[string]any{"hint": leaderClient}) {
		t.Errorf("follower %d logged no M with hint %s at debug", follower, leaderClient)
	}

	// A dead follower: the leader's raft errors about it, rate-limited.
	b.Close()
	from := len(nodes[lead].stderr.String())
	if err := nodes[follower].cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	<-nodes[follower].done
	time.Sleep(5 * time.Second)
	counts := map[string]int{}
	for _, r := range jsonRecords(nodes[lead].stderr.String()[from:]) {
		if r["level"] == "ERROR" {
			counts[r["msg"].(string)]++
		}
	}
	for msg, n := range counts {
		if n > 1 {
			t.Errorf("the leader logged %q %d times in 5 s for one dead peer, want at most once", msg, n)
		}
	}
	t.Logf("leader's ERROR lines in 5 s with a dead follower: %v", counts)
}
