package integration_test

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ticketing-dev/ticketing/broker"
	"github.com/ticketing-dev/ticketing/integration/harness"
	"github.com/ticketing-dev/ticketing/server"
)

// TestPairIdentityTwoPairs: a broker given the client addresses of two
// hot-standby pairs (ticketingd serve --pair, --pair-id pair-a and
// pair-b; both count tokens alike, so the same tokens exist in both) with
// cluster=pair-a in its URL uses only pair A (protocol version 3: HELLO_OK
// carries the pair's identity).
//
// Pair B's addresses come first in the URL (a broker that kept to the
// first identity met would take B). The broker holds one key for the
// whole run and does 20 rounds of: the held key, with wait 0, must be
// answered "timed out" (pair B would grant it); another key is granted
// and released. Pass: every held-key try is "timed out"; pair B's nodes
// apply no new token and hold no lock (their /status); pair A's active
// applied at least the 21 grants; Broker.Cluster is pair-a; the broker
// logs at Error that pair B's active belongs to another cluster and is not
// used; and the history passes CheckTokensUnique,
// CheckNoTicketAfterIndeterminate, CheckTokensFollowRealTime,
// CheckLeaseExclusion and CheckReleasedIntervals.
func TestPairIdentityTwoPairs(t *testing.T) {
	const rounds = 20
	pa := startPair(t, harness.PairOptions{Heartbeat: pairHB, Args: []string{"--pair-id", "pair-a"}})
	pb := startPair(t, harness.PairOptions{Heartbeat: pairHB, Args: []string{"--pair-id", "pair-b"}})
	stA, stB := pairStatuses(t, pa), pairStatuses(t, pb)

	u, err := broker.ParseURL("ticketing://" + strings.Join(append(pb.Addrs(), pa.Addrs()...), ",") + "?cluster=pair-a")
	if err != nil {
		t.Fatal(err)
	}
	cfg := loadBroker(u.Addrs, "two-pairs")
	cfg.Cluster = u.Cluster
	logs := &errorLines{}
	cfg.Logger = slog.New(logs)
	b, err := broker.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	ctx, cancel := context.WithTimeout(t.Context(), 3*hangGuard)
	defer cancel()
	{
		rctx, rcancel := context.WithTimeout(ctx, hangGuard)
		err := b.WaitReady(rctx)
		rcancel()
		if err != nil {
			t.Fatalf("WaitReady: %v", err)
		}
	}
	h := harness.NewHistory()
	h.WriteArtifactOnFailure(t, "history")

	hold, err := acquireRetry(ctx, h, "broker", b, "held", 0, 30*time.Second)
	if err != nil {
		t.Fatalf("acquire held: %v", err)
	}
	for i := range rounds {
		if _, err := harness.Acquire(ctx, h, "broker", b, "held", broker.AcquireOptions{Lease: 30 * time.Second}); !errorIsTimedOut(err) {
			t.Errorf("round %d: the held key: %v, want timed out (held on pair A)", i, err)
		}
		tk, err := acquireRetry(ctx, h, "broker", b, fmt.Sprint("k", i), 0, 30*time.Second)
		if err != nil {
			t.Fatalf("round %d: acquire: %v", i, err)
		}
		if err := harness.Release(ctx, h, "broker", tk); err != nil {
			t.Errorf("round %d: release: %v", i, err)
		}
	}
	if err := harness.Release(ctx, h, "broker", hold); err != nil {
		t.Errorf("release held: %v", err)
	}

	if got := b.Cluster(); got != "pair-a" {
		t.Errorf("Cluster() = %q, want pair-a", got)
	}
	endA, endB := pairStatuses(t, pa), pairStatuses(t, pb)
	for i, n := range pb.Nodes() {
		if endB[i].LastToken != stB[i].LastToken || endB[i].HeldLocks != 0 {
			t.Errorf("pair B's %s applied tokens up to %d (from %d) and holds %d locks: the broker used pair B",
				n.Role, endB[i].LastToken, stB[i].LastToken, endB[i].HeldLocks)
		}
	}
	if d := endA[0].LastToken - stA[0].LastToken; d < rounds+1 {
		t.Errorf("pair A's primary applied %d new tokens, want at least %d", d, rounds+1)
	}
	deadline := time.Now().Add(hangGuard)
	for !logs.has("broker: node belongs to another cluster; not used", pb.Primary.Addr(), "pair-b", "pair-a") {
		if time.Now().After(deadline) {
			t.Errorf("no Error line refusing pair B's active %s; Error lines: %v", pb.Primary.Addr(), logs.all())
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Logf("pair A's primary: last token %d, then %d; pair B's: %d, then %d; outcomes %v; broker Error lines: %v",
		stA[0].LastToken, endA[0].LastToken, stB[0].LastToken, endB[0].LastToken, h.Counts(), logs.all())
	for _, err := range []error{
		harness.CheckTokensUnique(h),
		harness.CheckNoTicketAfterIndeterminate(h),
		harness.CheckTokensFollowRealTime(h),
		harness.CheckLeaseExclusion(h),
		harness.CheckReleasedIntervals(h),
	} {
		if err != nil {
			t.Error(err)
		}
	}
}

func errorIsTimedOut(err error) bool { return harness.Outcome(err) == harness.OutcomeTimedOut }

// pairStatuses returns the /status of the pair's primary and backup.
func pairStatuses(t *testing.T, p *harness.Pair) []server.PairStatus {
	t.Helper()
	var out []server.PairStatus
	for _, n := range p.Nodes() {
		st, err := n.Status()
		if err != nil {
			t.Fatalf("the %s's /status: %v", n.Role, err)
		}
		out = append(out, st)
	}
	return out
}

// errorLines records a broker's log records at Error: the message and
// the attributes addr, cluster and want.
type errorLines struct {
	mu    sync.Mutex
	lines []string
}

func (e *errorLines) Enabled(_ context.Context, l slog.Level) bool { return l >= slog.LevelError }

func (e *errorLines) Handle(_ context.Context, r slog.Record) error {
	attrs := map[string]string{}
	r.Attrs(func(a slog.Attr) bool {
		attrs[a.Key] = a.Value.String()
		return true
	})
	e.mu.Lock()
	e.lines = append(e.lines, fmt.Sprintf("%s addr=%s cluster=%s want=%s", r.Message, attrs["addr"], attrs["cluster"], attrs["want"]))
	e.mu.Unlock()
	return nil
}

func (e *errorLines) WithAttrs([]slog.Attr) slog.Handler { return e }
func (e *errorLines) WithGroup(string) slog.Handler      { return e }

func (e *errorLines) has(msg, addr, cluster, want string) bool {
	line := fmt.Sprintf("%s addr=%s cluster=%s want=%s", msg, addr, cluster, want)
	for _, l := range e.all() {
		if l == line {
			return true
		}
	}
	return false
}

func (e *errorLines) all() []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]string(nil), e.lines...)
}
