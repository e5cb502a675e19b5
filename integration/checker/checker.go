// Package checker records the operations of the chaos and fault-proxy
// integration tests with explicit times and checks the token-order
// invariants on them.
//
// It complements package harness: harness.History stamps operations with
// its own clock when they are recorded, which suits in-process calls; the
// chaos test's workers are subprocesses whose events arrive later through a
// pipe, so their times must be given explicitly (a worker's own monotonic
// clock, placed on the test's time line via its wall-clock origin). A
// History here takes Ops with their times set by the caller.
//
// # Checks
//
//   - Outcomes: every op of a kind ended in one of the allowed outcomes;
//   - NoTicketOnError: a failed acquire carries no token;
//   - TokensUnique: no token was granted twice (tokens are global);
//   - TokensFollowRealTime: a grant that completed before another was
//     invoked has the smaller token;
//   - LeaseExclusion: per key, a grant with a larger token completed no
//     earlier than the earlier holder's conservative deadline or its
//     release (whichever came first) — no two holders at once;
//   - ReleasedIntervals: per key, the [grant, release] intervals of tickets
//     whose release was confirmed (R) do not overlap, in token order;
//   - WriteLog and LostUpdates: the fenced counter's write log.
//
// Each returns nil or an error listing the violations (up to a limit).
package checker

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ticketing-dev/ticketing/integration/harness"
)

// Op kinds.
const (
	KindAcquire = "acquire"
	KindRelease = "release"
	KindWrite   = "write" // a (fenced) read-modify-write transaction; Release holds the ticket's release outcome
	KindEvent   = "event"
)

// Outcomes used by the tests.
const (
	Granted       = "granted"
	TimedOut      = "timed_out"
	Busy          = "busy"
	Indeterminate = "indeterminate"
	Unsent        = "unsent"
	LeaseTooShort = "lease_too_short"

	Released    = "released"
	NotHeld     = "not_held"
	Unconfirmed = "unconfirmed"

	WriteOK       = "ok"
	Stale         = "stale"
	LeaseExpired  = "lease_expired"
	CommitUnknown = "commit_unknown"

	Other = "error" // anything else: always a failure of Outcomes
)

// Never marks a time that did not happen (no release, no deadline).
const Never = time.Duration(1<<63 - 1)

// Op is one recorded operation. Times are offsets on the test's monotonic
// time line (History.Now).
type Op struct {
	Seq      int           `json:"seq"`
	Process  string        `json:"process"`
	Kind     string        `json:"kind"`
	Key      string        `json:"key,omitempty"`
	Invoke   time.Duration `json:"invoke_ns"`
	Complete time.Duration `json:"complete_ns"`
	Outcome  string        `json:"outcome"`
	Token    uint64        `json:"token,omitzero"`
	// Deadline is a granted ticket's conservative deadline (Never if
	// unknown).
	Deadline time.Duration `json:"deadline_ns,omitzero"`
	// Release is, for KindWrite, the outcome of the ticket's release.
	Release string `json:"release,omitempty"`
	Read    *int64 `json:"read,omitempty"`
	Wrote   *int64 `json:"wrote,omitempty"`
	Err     string `json:"err,omitempty"`
	Note    string `json:"note,omitempty"`
}

// History is a goroutine-safe list of Ops.
type History struct {
	start time.Time
	mu    sync.Mutex
	ops   []Op
}

// NewHistory starts a History whose time line begins now.
func NewHistory() *History { return &History{start: time.Now()} }

// Now is the time since NewHistory, monotonic.
func (h *History) Now() time.Duration { return time.Since(h.start) }

// Start is the wall-clock origin of the time line.
func (h *History) Start() time.Time { return h.start }

// FromWall places a wall-clock UnixNano on the time line (for events of
// other processes on the same machine).
func (h *History) FromWall(unixNano int64) time.Duration {
	return time.Duration(unixNano - h.start.UnixNano())
}

// Add records op (its Seq is assigned) and returns its Seq.
func (h *History) Add(op Op) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	op.Seq = len(h.ops)
	h.ops = append(h.ops, op)
	return op.Seq
}

// Event records an instantaneous event now.
func (h *History) Event(process, what, note string) time.Duration {
	now := h.Now()
	h.Add(Op{Process: process, Kind: KindEvent, Invoke: now, Complete: now, Outcome: what, Note: note})
	return now
}

// Ops returns a copy of the ops in the order they were added.
func (h *History) Ops() []Op {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Clone(h.ops)
}

// Counts returns the number of ops per "kind/outcome" (events by their
// outcome too).
func (h *History) Counts() map[string]int {
	m := map[string]int{}
	for _, op := range h.Ops() {
		m[op.Kind+"/"+op.Outcome]++
	}
	return m
}

// Count returns the number of ops of kind with outcome.
func (h *History) Count(kind, outcome string) int {
	n := 0
	for _, op := range h.Ops() {
		if op.Kind == kind && op.Outcome == outcome {
			n++
		}
	}
	return n
}

// WriteArtifact writes the history as JSON lines (ops sorted by Invoke) to
// harness.ArtifactDir(tb)/name.jsonl and logs the path. Errors are logged.
func (h *History) WriteArtifact(tb testing.TB, name string) string {
	tb.Helper()
	dir := harness.ArtifactDir(tb)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		tb.Logf("checker: artifact dir: %v", err)
		return ""
	}
	ops := h.Ops()
	sort.SliceStable(ops, func(i, j int) bool { return ops[i].Invoke < ops[j].Invoke })
	var b strings.Builder
	enc := json.NewEncoder(&b)
	for _, op := range ops {
		_ = enc.Encode(op)
	}
	path := filepath.Join(dir, name+".jsonl")
	if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
		tb.Logf("checker: writing artifact: %v", err)
		return ""
	}
	tb.Logf("checker: history (%d ops) written to %s", len(ops), path)
	return path
}

// WriteArtifactOnFailure registers a Cleanup that writes the history if
// the test failed.
func (h *History) WriteArtifactOnFailure(tb testing.TB, name string) {
	tb.Cleanup(func() {
		if tb.Failed() {
			h.WriteArtifact(tb, name)
		}
	})
}

const maxViolations = 20

type violations []string

func (v *violations) add(format string, args ...any) { *v = append(*v, fmt.Sprintf(format, args...)) }

func (v violations) err(check string) error {
	if len(v) == 0 {
		return nil
	}
	n := len(v)
	if n > maxViolations {
		v = v[:maxViolations]
	}
	return fmt.Errorf("%s: %d violation(s):\n  %s", check, n, strings.Join(v, "\n  "))
}

func describe(op Op) string {
	return fmt.Sprintf("op %d (%s %s key %q token %d, %v..%v, %s)", op.Seq, op.Process, op.Kind, op.Key, op.Token, op.Invoke, op.Complete, op.Outcome)
}

// Outcomes checks that every op of kind ended in one of allowed.
func Outcomes(ops []Op, kind string, allowed ...string) error {
	var v violations
	for _, op := range ops {
		if op.Kind == kind && !slices.Contains(allowed, op.Outcome) {
			v.add("%s: outcome not in %v (err: %s)", describe(op), allowed, op.Err)
		}
	}
	return v.err("Outcomes(" + kind + ")")
}

// NoTicketOnError checks that every acquire that was not granted carries no
// token (the API returned a nil Ticket with its error), and that every
// release or write uses a token its own process was granted.
func NoTicketOnError(ops []Op) error {
	var v violations
	granted := map[string]map[uint64]bool{}
	for _, op := range ops {
		if op.Kind != KindAcquire {
			continue
		}
		if op.Outcome != Granted {
			if op.Token != 0 {
				v.add("%s: a ticket came with the error %s", describe(op), op.Err)
			}
			continue
		}
		if granted[op.Process] == nil {
			granted[op.Process] = map[uint64]bool{}
		}
		granted[op.Process][op.Token] = true
	}
	for _, op := range ops {
		if (op.Kind == KindRelease || op.Kind == KindWrite) && !granted[op.Process][op.Token] {
			v.add("%s: token not granted to %s", describe(op), op.Process)
		}
	}
	return v.err("NoTicketOnError")
}

func grants(ops []Op) []Op {
	var g []Op
	for _, op := range ops {
		if op.Kind == KindAcquire && op.Outcome == Granted {
			g = append(g, op)
		}
	}
	return g
}

// TokensUnique checks that no token was granted twice, and none is 0.
func TokensUnique(ops []Op) error {
	var v violations
	seen := map[uint64]Op{}
	for _, op := range grants(ops) {
		if op.Token == 0 {
			v.add("%s: token 0", describe(op))
		}
		if prev, dup := seen[op.Token]; dup {
			v.add("token %d granted twice: %s and %s", op.Token, describe(prev), describe(op))
		}
		seen[op.Token] = op
	}
	return v.err("TokensUnique")
}

// TokensFollowRealTime checks that tokens increase with real time across
// all keys: if grant A completed before grant B was invoked, then A's token
// is below B's.
func TokensFollowRealTime(ops []Op) error {
	var v violations
	g := grants(ops)
	byComplete := slices.Clone(g)
	sort.Slice(byComplete, func(i, j int) bool { return byComplete[i].Complete < byComplete[j].Complete })
	byInvoke := slices.Clone(g)
	sort.Slice(byInvoke, func(i, j int) bool { return byInvoke[i].Invoke < byInvoke[j].Invoke })
	var maxOp Op
	j := 0
	for _, b := range byInvoke {
		for j < len(byComplete) && byComplete[j].Complete < b.Invoke {
			if byComplete[j].Token > maxOp.Token {
				maxOp = byComplete[j]
			}
			j++
		}
		if maxOp.Token != 0 && maxOp.Token >= b.Token {
			v.add("%s completed before %s was invoked, but has a token not below it", describe(maxOp), describe(b))
		}
	}
	return v.err("TokensFollowRealTime")
}

// ReleaseStart returns, per token, the earliest time at which the ticket
// may have been released: the invoke time of its release op, or of the
// write op that released it (a lower bound). Tokens never released are
// absent.
func ReleaseStart(ops []Op) map[uint64]time.Duration {
	m := map[uint64]time.Duration{}
	for _, op := range ops {
		if op.Kind == KindRelease || op.Kind == KindWrite {
			if t, ok := m[op.Token]; !ok || op.Invoke < t {
				m[op.Token] = op.Invoke
			}
		}
	}
	return m
}

// LeaseExclusion checks mutual exclusion on each key from the holders'
// point of view: for grants A and B of one key with A's token below B's,
// B completed no earlier than the end of A's holding, min(A's conservative
// deadline, the start of A's release). (The server granted B only after
// A's lease ended, which is no earlier than A's conservative deadline, or
// after A's release was sent.) Grants without a Deadline are skipped as A.
func LeaseExclusion(ops []Op) error {
	var v violations
	rel := ReleaseStart(ops)
	byKey := map[string][]Op{}
	for _, op := range grants(ops) {
		byKey[op.Key] = append(byKey[op.Key], op)
	}
	for _, g := range byKey {
		sort.Slice(g, func(i, j int) bool { return g[i].Token < g[j].Token })
		// Running maximum of the holding ends of the lower tokens.
		var maxEnd time.Duration
		var maxOp Op
		for _, b := range g {
			if maxOp.Token != 0 && b.Complete < maxEnd {
				v.add("%s was granted at %v while %s held the key until %v", describe(b), b.Complete, describe(maxOp), maxEnd)
			}
			end := b.Deadline
			if end == 0 {
				continue
			}
			if r, ok := rel[b.Token]; ok && r < end {
				end = r
			}
			if end > maxEnd {
				maxEnd, maxOp = end, b
			}
		}
	}
	return v.err("LeaseExclusion")
}

// ReleasedIntervals checks, per key, that the tickets whose release was
// confirmed (R) held the key in disjoint intervals ordered as their
// tokens: for such tickets A and B with A's token below B's, A's release
// was invoked no later than B's grant completed (A's server-side release
// came after the former and before B's grant, which came before the
// latter).
func ReleasedIntervals(ops []Op) error {
	var v violations
	confirmed := map[uint64]time.Duration{} // token -> release invoke
	for _, op := range ops {
		if (op.Kind == KindRelease && op.Outcome == Released) || (op.Kind == KindWrite && op.Release == Released) {
			confirmed[op.Token] = op.Invoke
		}
	}
	byKey := map[string][]Op{}
	for _, op := range grants(ops) {
		if _, ok := confirmed[op.Token]; ok {
			byKey[op.Key] = append(byKey[op.Key], op)
		}
	}
	for _, g := range byKey {
		sort.Slice(g, func(i, j int) bool { return g[i].Token < g[j].Token })
		var maxRel time.Duration
		var maxOp Op
		for _, b := range g {
			if maxOp.Token != 0 && maxRel > b.Complete {
				v.add("%s (released R, release invoked %v) overlaps %s (granted %v, released R)", describe(maxOp), maxRel, describe(b), b.Complete)
			}
			if r := confirmed[b.Token]; r > maxRel {
				maxRel, maxOp = r, b
			}
		}
	}
	return v.err("ReleasedIntervals")
}

// LogRow is one row of the chaos test's write log, in id order.
type LogRow struct {
	ID      int64  `json:"id"`
	Process string `json:"process"`
	Token   uint64 `json:"token"`
	Read    int64  `json:"read"`
	Wrote   int64  `json:"wrote"`
}

// WriteLog checks a fenced counter's write log (rows in id order, which is
// commit order: the fence's row lock serialises the transactions): the
// counter equals the number of rows; each row read the value the previous
// row wrote (0 for the first) and wrote one more; the tokens strictly
// increase; the fence's high-water equals the last row's token.
func WriteLog(rows []LogRow, counter int64, highWater uint64) error {
	var v violations
	if counter != int64(len(rows)) {
		v.add("counter is %d but the write log has %d rows", counter, len(rows))
	}
	var prev LogRow
	for i, r := range rows {
		if r.Wrote != r.Read+1 {
			v.add("row %d (%s token %d): read %d, wrote %d", r.ID, r.Process, r.Token, r.Read, r.Wrote)
		}
		if i > 0 && r.Read != prev.Wrote {
			v.add("row %d (%s token %d) read %d, but the previous row %d (%s token %d) wrote %d: lost or interleaved update", r.ID, r.Process, r.Token, r.Read, prev.ID, prev.Process, prev.Token, prev.Wrote)
		}
		if i == 0 && r.Read != 0 {
			v.add("first row %d read %d, not 0", r.ID, r.Read)
		}
		if i > 0 && r.Token <= prev.Token {
			v.add("row %d (%s) has token %d, not above token %d of the earlier row %d (%s): fence let a stale token commit", r.ID, r.Process, r.Token, prev.Token, prev.ID, prev.Process)
		}
		prev = r
	}
	if len(rows) > 0 && highWater != prev.Token {
		v.add("high-water %d is not the last committed token %d", highWater, prev.Token)
	}
	return v.err("WriteLog")
}

// LostUpdates counts the updates a write log shows as lost: rows whose
// written value an earlier row had already written (two writers read the
// same value), and, if larger, how far the counter is below the number of
// rows.
func LostUpdates(rows []LogRow, counter int64) int {
	seen := map[int64]bool{}
	dup := 0
	for _, r := range rows {
		if seen[r.Wrote] {
			dup++
		}
		seen[r.Wrote] = true
	}
	return max(dup, len(rows)-int(counter))
}

// LogMatchesHistory checks the write log against the workers' histories:
// every row was written by a write op of its process with its token that
// ended "ok" or "commit_unknown"; every write op that ended "ok" has its
// row; a write op that ended otherwise (stale, lease expired, error) has
// none.
func LogMatchesHistory(rows []LogRow, ops []Op) error {
	var v violations
	type pk struct {
		p string
		t uint64
	}
	writes := map[pk]Op{}
	for _, op := range ops {
		if op.Kind == KindWrite {
			writes[pk{op.Process, op.Token}] = op
		}
	}
	inLog := map[pk]bool{}
	for _, r := range rows {
		k := pk{r.Process, r.Token}
		if inLog[k] {
			v.add("row %d: token %d of %s logged twice", r.ID, r.Token, r.Process)
		}
		inLog[k] = true
		op, ok := writes[k]
		switch {
		case !ok:
			v.add("row %d: no write of %s with token %d in the history", r.ID, r.Process, r.Token)
		case op.Outcome != WriteOK && op.Outcome != CommitUnknown:
			v.add("row %d committed, but %s", r.ID, describe(op))
		}
	}
	for k, op := range writes {
		if op.Outcome == WriteOK && !inLog[k] {
			v.add("%s: committed per the worker, but not in the write log", describe(op))
		}
	}
	return v.err("LogMatchesHistory")
}
