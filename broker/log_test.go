package broker_test

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ticketing-dev/ticketing/broker"
)

// What the broker logs about its sessions (Config.Logger): a session
// becoming ready at Info, a drop once at Warn, failed redials bounded.

// logLine is one record of a captureHandler.
type logLine struct {
	level slog.Level
	msg   string
	attrs map[string]slog.Value
}

func (l logLine) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s %q", l.level, l.msg)
	for k, v := range l.attrs {
		fmt.Fprintf(&b, " %s=%v", k, v)
	}
	return b.String()
}

func (l logLine) int(key string) int64 {
	v, ok := l.attrs[key]
	if !ok {
		return -1
	}
	if v.Kind() == slog.KindUint64 {
		return int64(v.Uint64())
	}
	return v.Int64()
}

// captureHandler keeps every record, at every level.
type captureHandler struct {
	mu    sync.Mutex
	lines []logLine
}

func (h *captureHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h *captureHandler) WithAttrs([]slog.Attr) slog.Handler       { return h }
func (h *captureHandler) WithGroup(string) slog.Handler            { return h }

func (h *captureHandler) Handle(_ context.Context, r slog.Record) error {
	l := logLine{level: r.Level, msg: r.Message, attrs: map[string]slog.Value{}}
	r.Attrs(func(a slog.Attr) bool {
		l.attrs[a.Key] = a.Value.Resolve()
		return true
	})
	h.mu.Lock()
	h.lines = append(h.lines, l)
	h.mu.Unlock()
	return nil
}

// since returns the lines from index i on at level min or above.
func (h *captureHandler) since(i int, min slog.Level) []logLine {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []logLine
	for _, l := range h.lines[i:] {
		if l.level >= min {
			out = append(out, l)
		}
	}
	return out
}

func (h *captureHandler) len() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.lines)
}

// count returns the lines from i on with message msg.
func (h *captureHandler) count(i int, msg string) int {
	n := 0
	for _, l := range h.since(i, slog.LevelDebug) {
		if l.msg == msg {
			n++
		}
	}
	return n
}

const (
	msgReady     = "broker: session ready"
	msgDropped   = "broker: session dropped"
	msgFailed    = "broker: session open failed"
	msgStillDown = "broker: session still down"
	msgFallback  = "broker: node does not speak protocol version 2; using version 1"
	msgFallback3 = "broker: node does not speak protocol version 3; using version 2"
)

func TestLog_RestartLogsOneDropAndOneReconnectPerSession(t *testing.T) {
	for _, v := range []uint8{3, 2, 1} {
		t.Run(fmt.Sprintf("version-%d node", v), func(t *testing.T) { testLogRestart(t, v) })
	}
}

// testLogRestart: on a node of version 2 or 1, each step of the fallback
// (3 to 2, 2 to 1) is logged at Info the first time only (after the
// restart, the E(2)s of each reconnect are no news).
func testLogRestart(t *testing.T, v uint8) {
	f := newFakeVersion(t, "127.0.0.1:0", nil, v)
	addr := f.Addr
	h := &captureHandler{}
	cfg := testConfig(addr)
	cfg.Logger = slog.New(h)
	allReady(t, f, cfg)
	eventually(t, "two ready lines", func() bool { return h.count(0, msgReady) == 2 })
	fallbacks := 0
	for _, l := range h.since(0, slog.LevelInfo) {
		if (l.msg == msgFallback3 && v <= 2 || l.msg == msgFallback && v == 1) && l.level == slog.LevelInfo {
			fallbacks++
			continue
		}
		if l.msg != msgReady || l.level != slog.LevelInfo {
			t.Fatalf("at start: %v, want only Info %q", l, msgReady)
		}
		if l.attrs["addr"].String() != addr || l.attrs["node"].String() != "fake" || l.int("version") != int64(v) {
			t.Fatalf("ready line without the address, the node name or the version: %v", l)
		}
		if _, ok := l.attrs["down_for"]; ok {
			t.Fatalf("first ready line with down_for: %v", l)
		}
	}
	if want := 3 - int(v); fallbacks != want {
		t.Fatalf("%d fallback lines at start, want %d", fallbacks, want)
	}

	// The server restarts: its listener closes with every session, and
	// a new one comes up on the same address.
	mark := h.len()
	f.Restart(v)
	eventually(t, "two reconnect lines", func() bool { return h.count(mark, msgReady) == 2 })
	got := h.since(mark, slog.LevelInfo)
	sessions := map[string]bool{}
	var drops, readies int
	for _, l := range got {
		switch {
		case l.msg == msgDropped && l.level == slog.LevelWarn:
			drops++
			if l.attrs["err"].String() == "" || l.attrs["addr"].String() != addr {
				t.Fatalf("drop line without its cause or address: %v", l)
			}
			sessions["drop"+l.attrs["session"].String()] = true
		case l.msg == msgReady && l.level == slog.LevelInfo:
			readies++
			if l.attrs["node"].String() != "fake" || l.int("version") != int64(v) || l.int("attempts") < 1 {
				t.Fatalf("reconnect line without the node name, version or attempts: %v", l)
			}
			if d, ok := l.attrs["down_for"]; !ok || d.Duration() <= 0 {
				t.Fatalf("reconnect line without how long it was down: %v", l)
			}
			sessions["ready"+l.attrs["session"].String()] = true
		default:
			t.Fatalf("unexpected line at Info or above after a restart: %v", l)
		}
	}
	if drops != 2 || readies != 2 || len(sessions) != 4 {
		t.Fatalf("%d drop lines and %d reconnect lines (%v), want one of each per session", drops, readies, sessions)
	}
}

func TestLog_LongOutageIsBounded(t *testing.T) {
	addr := downAddr(t)
	h := &captureHandler{}
	cfg := testConfig(addr)
	cfg.BackoffMin, cfg.BackoffMax = time.Millisecond, 10*time.Millisecond
	cfg.Logger = slog.New(h)
	start := time.Now()
	b, err := broker.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	const redials = 100
	// Every failed open is logged at Debug, or instead at Warn.
	eventually(t, "many redials", func() bool { return h.count(0, msgFailed)+h.count(0, msgStillDown) >= 2*redials })
	f := newFakeOn(t, addr, nil)
	eventually(t, "both sessions ready", func() bool { return h.count(0, msgReady) == 2 })
	elapsed := time.Since(start)
	interval := 10 * cfg.BackoffMax    // the broker's stillDownFactor*BackoffMax
	bound := 2 + int(elapsed/interval) // per session: the first failure, the summaries, the ready line
	perSession := map[string][]logLine{}
	for _, l := range h.since(0, slog.LevelInfo) {
		if _, ok := l.attrs["session"]; !ok && (l.msg == msgFallback || l.msg == msgFallback3) {
			continue // the fake speaks version 1: one line per step for the node
		}
		perSession[l.attrs["session"].String()] = append(perSession[l.attrs["session"].String()], l)
	}
	if len(perSession) != 2 {
		t.Fatalf("lines of %d sessions, want 2", len(perSession))
	}
	for s, lines := range perSession {
		t.Logf("session %s: %d lines at Info or above in %v (bound %d), for %d failed opens", s, len(lines), elapsed.Round(time.Millisecond), bound, lines[len(lines)-1].int("attempts")-1)
		if len(lines) > bound {
			t.Fatalf("session %s: %d lines, want at most %d: %v", s, len(lines), bound, lines)
		}
		first, last := lines[0], lines[len(lines)-1]
		if first.msg != msgFailed || first.level != slog.LevelWarn || first.attrs["err"].String() == "" || first.int("attempts") != 1 {
			t.Fatalf("first line %v, want the first failure at Warn with its error", first)
		}
		if last.msg != msgReady || last.int("attempts") < redials/2 {
			t.Fatalf("last line %v, want the ready line with the attempts", last)
		}
		for _, l := range lines[1 : len(lines)-1] {
			if l.msg != msgStillDown || l.int("attempts") < 2 || l.attrs["down_for"].Duration() < interval {
				t.Fatalf("line %v, want a summary with the attempts and how long", l)
			}
		}
	}
	_ = f
}

// TestLog_HealthyClusterNoWarn: a broker given the three nodes of a
// healthy cluster, whose followers answer HELLO with M naming the leader,
// logs no Warn: not at start ("session open failed ... node not active"),
// and not while the followers keep answering M ("session still down",
// due every 10*BackoffMax: 1 s here, and the test runs past 2 s). At
// Debug it logs what one needs to follow the sessions: the M answers with
// their hint, and each ACQUIRE's and RELEASE's reply with its req_id, key
// and token.
func TestLog_HealthyClusterNoWarn(t *testing.T) {
	c := newCluster(t)
	h := &captureHandler{}
	cfg := testConfig(c.nodes[0].Addr, c.nodes[1].Addr, c.nodes[2].Addr)
	cfg.Logger = slog.New(h)
	b := newBroker(t, cfg)
	deadline := time.Now().Add(2500 * time.Millisecond)
	for i := 0; time.Now().Before(deadline); i++ {
		key := fmt.Sprintf("k%d", i%3)
		tk, err := b.Acquire(t.Context(), key, broker.AcquireOptions{Lease: 10 * time.Second, Wait: time.Second})
		if err != nil {
			t.Fatal(err)
		}
		if err := tk.Release(t.Context()); err != nil {
			t.Fatal(err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	for _, l := range h.since(0, slog.LevelWarn) {
		t.Errorf("a healthy cluster made the broker log: %v", l)
	}
	var m, acq, rel int
	for _, l := range h.since(0, slog.LevelDebug) {
		switch l.msg {
		case "broker: HELLO answered M: node not active":
			if l.attrs["hint"].String() == c.nodes[1].Addr {
				m++
			}
		case "broker: ACQUIRE reply":
			if l.attrs["reply"].String() == "G" && l.int("req_id") > 0 && l.int("token") > 0 && l.attrs["node"].String() == "n1" {
				acq++
			}
		case "broker: RELEASE reply":
			if l.attrs["reply"].String() == "R" && l.int("req_id") > 0 && l.int("token") > 0 {
				rel++
			}
		}
	}
	if m == 0 || acq == 0 || rel == 0 {
		t.Errorf("at Debug: %d M answers naming the leader, %d ACQUIRE replies (G, req_id, token, node), %d RELEASE replies (R, req_id, token); want each", m, acq, rel)
	}
}
