package server_test

import (
	"encoding/json"
	"log/slog"
	"strings"
	"testing"

	"github.com/ticketing-dev/ticketing/internal/proctest"
	"github.com/ticketing-dev/ticketing/internal/wire"
	"github.com/ticketing-dev/ticketing/server"
)

// jsonLines decodes the JSON log lines of buf.
func jsonLines(t *testing.T, buf *proctest.LogBuffer) []map[string]any {
	t.Helper()
	var out []map[string]any
	for l := range strings.Lines(buf.String()) {
		var m map[string]any
		if err := json.Unmarshal([]byte(l), &m); err != nil {
			t.Fatalf("log line %q: %v", l, err)
		}
		out = append(out, m)
	}
	return out
}

// hasLine reports whether lines has one with msg whose attributes include
// want (numbers as JSON decodes them, float64).
func hasLine(lines []map[string]any, msg string, want map[string]any) bool {
	for _, l := range lines {
		if l["msg"] != msg {
			continue
		}
		ok := true
		for k, v := range want {
			if l[k] != v {
				ok = false
			}
		}
		if ok {
			return true
		}
	}
	return false
}

// TestDebugLogSession: at Debug a server logs what one needs to follow a
// session: its HELLO, each request and its reply, by the peer and the
// req_id (a grant with its token, a release), a HELLO refused for its
// token (and whether one was sent), and a standby's M with its hint. At
// Info it logs none of these.
func TestDebugLogSession(t *testing.T) {
	var addr string
	run := func(level slog.Level) []map[string]any {
		buf := proctest.NewLogBuffer()
		log := slog.New(slog.NewJSONHandler(buf, &slog.HandlerOptions{Level: level}))
		_, addr = startServer(t, server.Config{Logger: log, ClientTokens: []string{"tok"}})
		c := dial(t, addr)
		c.hello("tok")
		tok := c.acquireOK(7, owner(1), 0, 10, "k1")
		c.send(rel(8, tok, "k1"))
		c.expect(wire.TypeReleased, 8)
		c.send(acq(9, owner(2), 0, 10, "k2"))
		c.expect(wire.TypeGranted, 9)
		c.send(acq(10, owner(3), 0, 10, "k2"))
		c.expect(wire.TypeTimedOut, 10)
		bad := dial(t, addr)
		bad.send(helloReq(3, ""))
		bad.expectError(wire.CodeUnauthorized, 3)

		_, sbAddr := startServer(t, server.Config{Logger: log, Standby: true, StandbyHint: addr})
		sb := dial(t, sbAddr)
		sb.send(helloReq(4, ""))
		sb.expect(wire.TypeNotActive, 4)
		return jsonLines(t, buf)
	}

	lines := run(slog.LevelDebug)
	for _, w := range []struct {
		msg   string
		attrs map[string]any
	}{
		{"HELLO_OK", map[string]any{"req_id": 1.0, "version": 1.0, "name": "test"}},
		{"request ACQUIRE", map[string]any{"req_id": 7.0, "key": "k1", "lease_s": 10.0}},
		{"reply G: granted", map[string]any{"req_id": 7.0, "token": 1.0}},
		{"request RELEASE", map[string]any{"req_id": 8.0, "key": "k1", "token": 1.0}},
		{"reply R: released", map[string]any{"req_id": 8.0}},
		{"reply T: timed out", map[string]any{"req_id": 10.0}},
		{"HELLO refused: unauthorized", map[string]any{"req_id": 3.0, "token_sent": false}},
		{"HELLO answered M: not serving", map[string]any{"req_id": 4.0, "hint": addr}},
	} {
		if !hasLine(lines, w.msg, w.attrs) {
			t.Errorf("at Debug, no %q line with %v", w.msg, w.attrs)
		}
	}
	for _, l := range lines {
		if l["peer"] == nil && strings.HasPrefix(l["msg"].(string), "re") {
			t.Errorf("request or reply line without the peer: %v", l)
		}
	}

	for _, l := range run(slog.LevelInfo) {
		if msg := l["msg"].(string); strings.HasPrefix(msg, "HELLO") || strings.HasPrefix(msg, "request ") || strings.HasPrefix(msg, "reply ") {
			t.Errorf("at Info: %v", l)
		}
	}
}
