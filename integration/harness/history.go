package harness

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ticketing-dev/ticketing/broker"
	"github.com/ticketing-dev/ticketing/fence"
)

// Operation kinds used by the helpers and checkers. Tests may use others.
const (
	KindAcquire = "acquire"
	KindRelease = "release"
	KindFence   = "fence"   // a fenced database transaction
	KindRefresh = "refresh" // a Ticket.Refresh (see Refresh); the checkers ignore it
	KindEvent   = "event"   // a fault or a marker (kill, restart, pause, ...)
)

// Outcomes, as given by Outcome. "ok" is success; KindEvent ops use free
// text.
const (
	OutcomeOK                 = "ok"
	OutcomeUnsent             = "unsent"
	OutcomeIndeterminate      = "indeterminate"
	OutcomeTimedOut           = "timed_out"
	OutcomeBusy               = "busy"
	OutcomeLeaseTooShort      = "lease_too_short"
	OutcomeNotHeld            = "not_held"
	OutcomeReleaseUnconfirmed = "release_unconfirmed"
	OutcomeClosed             = "closed"
	OutcomeUnauthorized       = "unauthorized"
	OutcomeNotActive          = "not_active"
	OutcomeInvalid            = "invalid_argument"
	OutcomeStale              = "stale"
	OutcomeLeaseExpired       = "lease_expired"
	OutcomeCommitUnknown      = "commit_unknown"
	OutcomeReleaseFailed      = "committed_release_failed"
	OutcomeCanceled           = "canceled"
	OutcomeError              = "error" // anything else
)

// Outcome classifies an error of the broker or of a fenced Run. The broker
// and fence outcome sentinels are checked before context errors, so a
// cancelled Acquire is "unsent" or "indeterminate".
func Outcome(err error) string {
	switch {
	case err == nil:
		return OutcomeOK
	case errors.Is(err, broker.ErrUnsent):
		return OutcomeUnsent
	case errors.Is(err, broker.ErrIndeterminate):
		return OutcomeIndeterminate
	case errors.Is(err, broker.ErrTimedOut):
		return OutcomeTimedOut
	case errors.Is(err, broker.ErrBusy):
		return OutcomeBusy
	case errors.Is(err, broker.ErrLeaseTooShort):
		return OutcomeLeaseTooShort
	case errors.Is(err, broker.ErrNotHeld) && !errors.Is(err, fence.ErrRelease):
		return OutcomeNotHeld
	case errors.Is(err, broker.ErrReleaseUnconfirmed) && !errors.Is(err, fence.ErrRelease):
		return OutcomeReleaseUnconfirmed
	case errors.Is(err, broker.ErrClosed):
		return OutcomeClosed
	case errors.Is(err, broker.ErrUnauthorized):
		return OutcomeUnauthorized
	case errors.Is(err, broker.ErrNotActive):
		return OutcomeNotActive
	case errors.Is(err, broker.ErrInvalidArgument):
		return OutcomeInvalid
	case errors.Is(err, fence.ErrStale):
		return OutcomeStale
	case errors.Is(err, fence.ErrLeaseExpired):
		return OutcomeLeaseExpired
	case errors.Is(err, fence.ErrCommitUnknown):
		return OutcomeCommitUnknown
	case fence.Committed(err):
		return OutcomeReleaseFailed
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return OutcomeCanceled
	}
	return OutcomeError
}

// Op is one recorded operation. Times are monotonic offsets from the
// History's start.
type Op struct {
	Seq      int           `json:"seq"`
	Process  string        `json:"process"`        // worker, goroutine or process id
	Kind     string        `json:"kind"`           // KindAcquire, KindRelease, KindFence, KindEvent, ...
	Key      string        `json:"key,omitempty"`  // key or resource
	Invoke   time.Duration `json:"invoke_ns"`      // when the call began
	Complete time.Duration `json:"complete_ns"`    // when it returned; -1 while pending
	Outcome  string        `json:"outcome"`        // see Outcome; "" while pending
	Token    uint64        `json:"token,omitzero"` // granted, released or fenced token
	// Deadline is a granted ticket's conservative deadline on the
	// History's time line; 0 if unknown.
	Deadline time.Duration `json:"deadline_ns,omitzero"`
	// Release is, for a KindFence op, the outcome of the ticket's release
	// (see Outcome).
	Release string `json:"release,omitempty"`
	// Read and Wrote are the values a read-modify-write transaction read
	// and wrote, if it got that far.
	Read  *int64 `json:"read,omitempty"`
	Wrote *int64 `json:"wrote,omitempty"`
	Err   string `json:"err,omitempty"`  // the error text
	Note  string `json:"note,omitempty"` // free text (event details, high-water, ...)
}

// Pending reports whether the op has not completed.
func (o Op) Pending() bool { return o.Complete < 0 }

// History is a goroutine-safe log of operations, for checking after a run
// and for writing out as an artifact when a test fails.
type History struct {
	start time.Time
	mu    sync.Mutex
	ops   []Op
}

// NewHistory returns an empty History whose clock starts now.
func NewHistory() *History { return &History{start: time.Now()} }

// Now returns the History's monotonic clock: the time since NewHistory.
func (h *History) Now() time.Duration { return time.Since(h.start) }

// Start returns the wall-clock origin of the History's time line.
func (h *History) Start() time.Time { return h.start }

// At places t (a time of this process, with its monotonic reading) on the
// History's time line.
func (h *History) At(t time.Time) time.Duration { return t.Sub(h.start) }

// FromWall places a wall-clock time, as UnixNano, on the History's time
// line (for times reported by other processes on the same machine).
func (h *History) FromWall(unixNano int64) time.Duration {
	return time.Duration(unixNano - h.start.UnixNano())
}

// Record adds a completed op with the times, outcome and token the caller
// set (for operations timed elsewhere: a worker subprocess reporting
// later, say), assigns its Seq and returns it.
func (h *History) Record(op Op) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	op.Seq = len(h.ops)
	h.ops = append(h.ops, op)
	return op.Seq
}

// SetDeadline records the conservative deadline of the ticket granted by
// op i.
func (h *History) SetDeadline(i int, deadline time.Time) {
	d := h.At(deadline)
	h.mu.Lock()
	defer h.mu.Unlock()
	h.ops[i].Deadline = d
}

// Invoke records the start of an operation and returns its index for
// Complete.
func (h *History) Invoke(process, kind, key string) int {
	now := h.Now()
	h.mu.Lock()
	defer h.mu.Unlock()
	h.ops = append(h.ops, Op{Seq: len(h.ops), Process: process, Kind: kind, Key: key, Invoke: now, Complete: -1})
	return len(h.ops) - 1
}

// Complete records the end of operation i: Outcome(err), token (0 if
// none), err's text, and an optional note.
func (h *History) Complete(i int, token uint64, err error, note string) {
	now := h.Now()
	h.mu.Lock()
	defer h.mu.Unlock()
	op := &h.ops[i]
	op.Complete, op.Outcome, op.Token, op.Note = now, Outcome(err), token, note
	if err != nil {
		op.Err = err.Error()
	}
}

// CompleteOutcome is Complete with an explicit outcome (for instance one
// reported by a worker subprocess).
func (h *History) CompleteOutcome(i int, outcome string, token uint64, errText, note string) {
	now := h.Now()
	h.mu.Lock()
	defer h.mu.Unlock()
	op := &h.ops[i]
	op.Complete, op.Outcome, op.Token, op.Err, op.Note = now, outcome, token, errText, note
}

// Event records an instantaneous event (a fault, a restart, a marker) and
// returns its time.
func (h *History) Event(process, what, note string) time.Duration {
	now := h.Now()
	h.mu.Lock()
	defer h.mu.Unlock()
	h.ops = append(h.ops, Op{Seq: len(h.ops), Process: process, Kind: KindEvent, Invoke: now, Complete: now, Outcome: what, Note: note})
	return now
}

// Ops returns a copy of the operations, in invocation order.
func (h *History) Ops() []Op {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]Op(nil), h.ops...)
}

// Filter returns the operations for which keep is true.
func (h *History) Filter(keep func(Op) bool) []Op {
	var out []Op
	for _, op := range h.Ops() {
		if keep(op) {
			out = append(out, op)
		}
	}
	return out
}

// Count returns the number of completed ops of kind with outcome.
func (h *History) Count(kind, outcome string) int {
	n := 0
	for _, op := range h.Ops() {
		if op.Kind == kind && op.Outcome == outcome && !op.Pending() {
			n++
		}
	}
	return n
}

// Counts returns the number of completed ops per "kind/outcome".
func (h *History) Counts() map[string]int {
	m := map[string]int{}
	for _, op := range h.Ops() {
		if op.Kind != KindEvent && !op.Pending() {
			m[op.Kind+"/"+op.Outcome]++
		}
	}
	return m
}

// ArtifactDir returns the directory for tb's artifacts: $TICKETING_TEST_ARTIFACTS
// or, when unset, os.TempDir()/ticketing-artifacts, plus tb.Name() made
// safe as a path. It is not removed after the test.
func ArtifactDir(tb testing.TB) string {
	base := os.Getenv("TICKETING_TEST_ARTIFACTS")
	if base == "" {
		base = filepath.Join(os.TempDir(), "ticketing-artifacts")
	}
	return filepath.Join(base, unsafePath.ReplaceAllString(tb.Name(), "_"))
}

var unsafePath = regexp.MustCompile(`[^A-Za-z0-9._-]+`)

// WriteArtifact writes the history as JSON lines (one Op per line, sorted
// by Invoke) to ArtifactDir(tb)/name.jsonl, logs the path and returns it.
// Errors are logged, not fatal (it is meant for failure paths).
func (h *History) WriteArtifact(tb testing.TB, name string) string {
	tb.Helper()
	dir := ArtifactDir(tb)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		tb.Logf("harness: artifact dir: %v", err)
		return ""
	}
	ops := h.Ops()
	sort.SliceStable(ops, func(i, j int) bool { return ops[i].Invoke < ops[j].Invoke })
	var b strings.Builder
	enc := json.NewEncoder(&b)
	for _, op := range ops {
		_ = enc.Encode(op)
	}
	path := filepath.Join(dir, unsafePath.ReplaceAllString(name, "_")+".jsonl")
	if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
		tb.Logf("harness: writing artifact: %v", err)
		return ""
	}
	tb.Logf("harness: history (%d ops) written to %s", len(ops), path)
	return path
}

// WriteArtifactOnFailure registers a Cleanup that writes the history with
// WriteArtifact if the test failed. Register it after the things that
// produce ops (Cleanups run last-registered first).
func (h *History) WriteArtifactOnFailure(tb testing.TB, name string) {
	tb.Cleanup(func() {
		if tb.Failed() {
			h.WriteArtifact(tb, name)
		}
	})
}

// Checkers. Each returns nil or an error describing every violation it
// found (up to a limit), naming the ops by Seq.

const maxViolations = 20

// Violations collects what a checker found; Err reports it. Checkers of
// other packages (the chaos test's write log) use it to report alike.
type Violations []string

// Add appends a violation, formatted as by fmt.Sprintf.
func (v *Violations) Add(format string, args ...any) {
	*v = append(*v, fmt.Sprintf(format, args...))
}

func describe(op Op) string {
	return fmt.Sprintf("op %d (%s %s key %q token %d, %v..%v, %s)", op.Seq, op.Process, op.Kind, op.Key, op.Token, op.Invoke, op.Complete, op.Outcome)
}

// Err returns nil if there is no violation, or an error naming check, how
// many violations there are, and the first 20.
func (v Violations) Err(check string) error {
	if len(v) == 0 {
		return nil
	}
	n := len(v)
	if n > maxViolations {
		v = v[:maxViolations]
	}
	return fmt.Errorf("%s: %d violation(s):\n  %s", check, n, strings.Join(v, "\n  "))
}

// CheckTokensUnique: no token was granted twice. A grant is a KindAcquire
// op with outcome "ok"; tokens are unique across all keys (the server's
// counter is global), and 0 is never a valid token.
func CheckTokensUnique(h *History) error {
	var v Violations
	seen := map[uint64]Op{}
	for _, op := range h.Ops() {
		if op.Kind != KindAcquire || op.Outcome != OutcomeOK {
			continue
		}
		if op.Token == 0 {
			v.Add("op %d (%s): granted token 0", op.Seq, op.Process)
			continue
		}
		if prev, dup := seen[op.Token]; dup {
			v.Add("token %d granted twice: op %d (%s, key %q) and op %d (%s, key %q)",
				op.Token, prev.Seq, prev.Process, prev.Key, op.Seq, op.Process, op.Key)
		}
		seen[op.Token] = op
	}
	return v.Err("CheckTokensUnique")
}

// CheckNoTicketAfterIndeterminate: a failed acquire (any outcome but "ok")
// carries no token (the broker returned no Ticket with its error), and no
// release or fenced write uses a token (0 included) that no earlier
// successful acquire of the same process granted. Together: a caller that
// got Indeterminate (or Unsent, ...) never entered the critical section.
func CheckNoTicketAfterIndeterminate(h *History) error {
	var v Violations
	granted := map[string]map[uint64]bool{}
	for _, op := range h.Ops() {
		if op.Pending() {
			continue
		}
		switch op.Kind {
		case KindAcquire:
			if op.Outcome != OutcomeOK {
				if op.Token != 0 {
					v.Add("op %d (%s): acquire outcome %q but a ticket with token %d", op.Seq, op.Process, op.Outcome, op.Token)
				}
				continue
			}
			if granted[op.Process] == nil {
				granted[op.Process] = map[uint64]bool{}
			}
			granted[op.Process][op.Token] = true
		case KindRelease, KindFence:
			if !granted[op.Process][op.Token] {
				v.Add("op %d (%s): %s with token %d that no successful acquire of %s granted", op.Seq, op.Process, op.Kind, op.Token, op.Process)
			}
		}
	}
	return v.Err("CheckNoTicketAfterIndeterminate")
}

// CheckTokensIncreaseAcross: every grant invoked at or after `after` has a
// token above every grant completed at or before `before` (History times).
// Use it for a restart: before = when the old server was dead (Kill9
// returned), after = when the new one was listening; a grant completed
// before the kill came from an old generation, one invoked after the
// restart from the new one.
func CheckTokensIncreaseAcross(h *History, before, after time.Duration) error {
	var v Violations
	var maxBefore uint64
	var maxOp Op
	ops := h.Ops()
	for _, op := range ops {
		if op.Kind == KindAcquire && op.Outcome == OutcomeOK && !op.Pending() && op.Complete <= before && op.Token > maxBefore {
			maxBefore, maxOp = op.Token, op
		}
	}
	for _, op := range ops {
		if op.Kind == KindAcquire && op.Outcome == OutcomeOK && op.Invoke >= after && op.Token <= maxBefore {
			v.Add("op %d (%s, invoked %v): token %d not above token %d of op %d (%s, completed %v)",
				op.Seq, op.Process, op.Invoke, op.Token, maxBefore, maxOp.Seq, maxOp.Process, maxOp.Complete)
		}
	}
	return v.Err(fmt.Sprintf("CheckTokensIncreaseAcross(%v, %v)", before, after))
}

// CheckOutcomes: every completed op selected by sel has one of the allowed
// outcomes.
func CheckOutcomes(h *History, sel func(Op) bool, allowed ...string) error {
	var v Violations
	for _, op := range h.Ops() {
		if op.Pending() || !sel(op) {
			continue
		}
		ok := false
		for _, a := range allowed {
			ok = ok || op.Outcome == a
		}
		if !ok {
			v.Add("op %d (%s %s key %q, %v..%v): outcome %q (%s) not in %v",
				op.Seq, op.Process, op.Kind, op.Key, op.Invoke, op.Complete, op.Outcome, op.Err, allowed)
		}
	}
	return v.Err("CheckOutcomes")
}

// OfKind selects the completed ops of the given kinds.
func OfKind(kinds ...string) func(Op) bool {
	return func(op Op) bool { return !op.Pending() && slices.Contains(kinds, op.Kind) }
}

// Within selects the ops of the given kinds (all kinds but KindEvent if
// none) invoked at or after from and completed at or before to.
func Within(from, to time.Duration, kinds ...string) func(Op) bool {
	return func(op Op) bool {
		if op.Kind == KindEvent || op.Invoke < from || op.Complete > to || op.Pending() {
			return false
		}
		if len(kinds) == 0 {
			return true
		}
		for _, k := range kinds {
			if op.Kind == k {
				return true
			}
		}
		return false
	}
}

// CheckFencedIncreasing: per resource, the tokens of the committed fenced
// writes (KindFence ops with outcome "ok" or "committed_release_failed"),
// in completion order, strictly increase. Writes that overlap in time are
// not ordered by their completion, so only pairs where one completed
// before the other was invoked are compared. It is a sanity check of the
// fence from the client side; the database's rows are the real witness.
func CheckFencedIncreasing(h *History) error {
	var v Violations
	by := map[string][]Op{}
	for _, op := range h.Ops() {
		if op.Kind == KindFence && (op.Outcome == OutcomeOK || op.Outcome == OutcomeReleaseFailed) {
			by[op.Key] = append(by[op.Key], op)
		}
	}
	for key, ops := range by {
		sort.Slice(ops, func(i, j int) bool { return ops[i].Complete < ops[j].Complete })
		for i, a := range ops {
			for _, b := range ops[i+1:] {
				if a.Complete < b.Invoke && b.Token <= a.Token {
					v.Add("resource %q: op %d committed token %d after op %d committed token %d", key, b.Seq, b.Token, a.Seq, a.Token)
				}
			}
		}
	}
	return v.Err("CheckFencedIncreasing")
}

// Real-time checkers, for histories whose times are those of the calls
// (Invoke and Complete bracket the server's action) and whose grants carry
// their Deadline.

// grants returns the completed successful acquires.
func grants(ops []Op) []Op {
	var g []Op
	for _, op := range ops {
		if op.Kind == KindAcquire && op.Outcome == OutcomeOK && !op.Pending() {
			g = append(g, op)
		}
	}
	return g
}

// CheckTokensFollowRealTime: tokens increase with real time across all
// keys: if grant A completed before grant B was invoked, then A's token is
// below B's.
func CheckTokensFollowRealTime(h *History) error {
	var v Violations
	g := grants(h.Ops())
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
			v.Add("%s completed before %s was invoked, but has a token not below it", describe(maxOp), describe(b))
		}
	}
	return v.Err("CheckTokensFollowRealTime")
}

// ReleaseStart returns, per token, the earliest time at which the ticket
// may have been released: the invoke time of its release op, or of the
// fenced op that released it (a lower bound). Tokens never released are
// absent.
func ReleaseStart(ops []Op) map[uint64]time.Duration {
	m := map[uint64]time.Duration{}
	for _, op := range ops {
		if op.Kind == KindRelease || op.Kind == KindFence {
			if t, ok := m[op.Token]; !ok || op.Invoke < t {
				m[op.Token] = op.Invoke
			}
		}
	}
	return m
}

// CheckLeaseExclusion: mutual exclusion on each key from the holders'
// point of view: for grants A and B of one key with A's token below B's,
// B completed no earlier than the end of A's holding, min(A's conservative
// deadline, the start of A's release). (The server granted B only after
// A's lease ended, which is no earlier than A's conservative deadline, or
// after A's release was sent.) Grants without a Deadline are skipped as A.
func CheckLeaseExclusion(h *History) error {
	var v Violations
	ops := h.Ops()
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
				v.Add("%s was granted at %v while %s held the key until %v", describe(b), b.Complete, describe(maxOp), maxEnd)
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
	return v.Err("CheckLeaseExclusion")
}

// CheckReleasedIntervals: per key, the tickets whose release was confirmed
// (R: a KindRelease op, or the Release of a KindFence op, with outcome
// "ok") held the key in disjoint intervals ordered as their tokens: for
// such tickets A and B with A's token below B's, A's release was invoked no
// later than B's grant completed (A's server-side release came after the
// former and before B's grant, which came before the latter).
func CheckReleasedIntervals(h *History) error {
	var v Violations
	ops := h.Ops()
	confirmed := map[uint64]time.Duration{} // token -> release invoke
	for _, op := range ops {
		if (op.Kind == KindRelease && op.Outcome == OutcomeOK) || (op.Kind == KindFence && op.Release == OutcomeOK) {
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
				v.Add("%s (released R, release invoked %v) overlaps %s (granted %v, released R)", describe(maxOp), maxRel, describe(b), b.Complete)
			}
			if r := confirmed[b.Token]; r > maxRel {
				maxRel, maxOp = r, b
			}
		}
	}
	return v.Err("CheckReleasedIntervals")
}
