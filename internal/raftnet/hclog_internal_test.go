package raftnet

import (
	"encoding/json"
	"errors"
	"log/slog"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/ticketing-dev/ticketing/internal/raft"

	"github.com/ticketing-dev/ticketing/internal/proctest"
)

// TestHCLoggerRateLimit: what a new leader with one dead peer logs, once
// per attempt, 59 lines in 15 s (one every 250 ms, two kinds), comes out
// as one line per message and peer per RepeatEvery, the next one with the
// count of the lines it stands for; another peer and other messages are
// not held back by it, and a derived logger (Named, With) shares the
// limit.
func TestHCLoggerRateLimit(t *testing.T) {
	buf := proctest.NewLogBuffer()
	now := time.Unix(1000, 0)
	root := newHCAdapter(slog.New(slog.NewJSONHandler(buf, nil)), "", nil, newRepeatLimiter(func() time.Time { return now }))
	lg := root.Named("raft")
	dead := raft.Server{Suffrage: raft.Voter, ID: "n3", Address: "127.0.0.1:7227"}
	errDial := errors.New("dial tcp 127.0.0.1:7227: connect: connection refused")
	for i := range 59 {
		if i%2 == 0 {
			lg.Error("failed to appendEntries to", "peer", dead, "error", errDial)
		} else {
			lg.With("x", 1).Error("failed to heartbeat to", "peer", dead.Address, "backoff time", time.Second, "error", errDial)
		}
		now = now.Add(250 * time.Millisecond)
	}
	lg.Error("failed to appendEntries to", "peer", raft.Server{ID: "n2", Address: "127.0.0.1:7226"}, "error", errDial)
	lg.Error("failed to get log", "index", 7, "error", errDial)
	lg.Error("failed to get log", "index", 8, "error", errDial)

	count := func() map[string][]map[string]any {
		got := map[string][]map[string]any{}
		for l := range strings.Lines(buf.String()) {
			var m map[string]any
			if err := json.Unmarshal([]byte(l), &m); err != nil {
				t.Fatal(err)
			}
			key := m["msg"].(string)
			switch p := m["peer"].(type) {
			case string:
				key += " " + p
			case map[string]any: // a raft.Server
				key += " " + p["ID"].(string)
			}
			got[key] = append(got[key], m)
		}
		return got
	}
	got := count()
	for key, want := range map[string]int{
		"failed to appendEntries to n3":         1,
		"failed to heartbeat to 127.0.0.1:7227": 1,
		"failed to appendEntries to n2":         1,
		"failed to get log":                     2,
	} {
		if len(got[key]) != want {
			t.Errorf("%q: %d lines, want %d", key, len(got[key]), want)
		}
	}
	if n := len(strings.Split(strings.TrimSpace(buf.String()), "\n")); n != 5 {
		t.Errorf("%d lines in all, want 5", n)
	}

	// RepeatEvery after the first line: the next one carries the count.
	now = now.Add(RepeatEvery)
	lg.Error("failed to appendEntries to", "peer", dead, "error", errDial)
	got = count()
	lines := got["failed to appendEntries to n3"]
	if len(lines) != 2 || lines[0]["suppressed"] != 0.0 || lines[1]["suppressed"] != 29.0 {
		var sup []any
		for _, l := range lines {
			sup = append(sup, l["suppressed"])
		}
		t.Errorf("appendEntries lines for the dead peer: %d, suppressed %v; want 2, suppressed [0 29]", len(lines), sup)
	}
}

// TestHCLoggerRoutineLevels: the lines raft writes at Warn or Error in
// routine cases come out lower (a node's first election, with no leader
// known yet, at Info; its own connections closed as it shuts down, at
// Debug); the same messages in the cases that deserve a look keep their
// level, and so do other warnings.
func TestHCLoggerRoutineLevels(t *testing.T) {
	buf := proctest.NewLogBuffer()
	lg := newHCAdapter(slog.New(slog.NewJSONHandler(buf, &slog.HandlerOptions{Level: levelTrace})), "", nil, newRepeatLimiter(time.Now)).Named("raft")
	closedErr := &net.OpError{Op: "read", Net: "tcp", Err: net.ErrClosed}
	// What raft passes: raft.ServerAddress and raft.ServerID values.
	lg.Warn("heartbeat timeout reached, starting election", "last-leader-addr", raft.ServerAddress(""), "last-leader-id", raft.ServerID(""))
	lg.Warn("heartbeat timeout reached, starting election", "last-leader-addr", raft.ServerAddress("127.0.0.1:7226"), "last-leader-id", raft.ServerID("n2"))
	lg.Error("failed to decode incoming command", "error", closedErr)
	lg.Error("failed to flush response", "error", closedErr)
	lg.Error("failed to decode incoming command", "error", errors.New("msgpack decode error [pos 3]: invalid"))
	lg.Warn("failed to contact quorum of nodes, stepping down")
	lg.Error("failed to appendEntries to", "peer", raft.Server{ID: "n3"}, "error", closedErr)

	want := []struct{ msg, level string }{
		{"heartbeat timeout reached, starting election", "INFO"},
		{"heartbeat timeout reached, starting election", "WARN"},
		{"failed to decode incoming command", "DEBUG"},
		{"failed to flush response", "DEBUG"},
		{"failed to decode incoming command", "ERROR"},
		{"failed to contact quorum of nodes, stepping down", "WARN"},
		{"failed to appendEntries to", "ERROR"},
	}
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	if len(lines) != len(want) {
		t.Fatalf("%d lines, want %d:\n%s", len(lines), len(want), buf.String())
	}
	for i, l := range lines {
		var m map[string]any
		if err := json.Unmarshal([]byte(l), &m); err != nil {
			t.Fatal(err)
		}
		if m["msg"] != want[i].msg || m["level"] != want[i].level {
			t.Errorf("line %d: %v at %v, want %q at %s", i, m["msg"], m["level"], want[i].msg, want[i].level)
		}
	}
}
