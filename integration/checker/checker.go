// Package checker checks the write log of the chaos test's counter: the
// rows that the counterworker processes' read-modify-write transactions
// appended, in id (= commit) order, against the counter, the fence's
// high-water and the workers' history (a harness.History whose KindFence
// ops are the transactions).
//
//   - WriteLog: no lost or interleaved update, tokens strictly increase,
//     the high-water is the last token;
//   - LostUpdates: how many updates the log shows as lost (the control run
//     without the fence must have some);
//   - LogMatchesHistory: the rows are exactly the transactions the workers
//     saw commit.
//
// The checks of the history itself (tokens, outcomes, real-time order,
// lease exclusion) are package harness's.
package checker

import (
	"github.com/ticketing-dev/ticketing/integration/harness"
)

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
	var v harness.Violations
	if counter != int64(len(rows)) {
		v.Add("counter is %d but the write log has %d rows", counter, len(rows))
	}
	var prev LogRow
	for i, r := range rows {
		if r.Wrote != r.Read+1 {
			v.Add("row %d (%s token %d): read %d, wrote %d", r.ID, r.Process, r.Token, r.Read, r.Wrote)
		}
		if i > 0 && r.Read != prev.Wrote {
			v.Add("row %d (%s token %d) read %d, but the previous row %d (%s token %d) wrote %d: lost or interleaved update", r.ID, r.Process, r.Token, r.Read, prev.ID, prev.Process, prev.Token, prev.Wrote)
		}
		if i == 0 && r.Read != 0 {
			v.Add("first row %d read %d, not 0", r.ID, r.Read)
		}
		if i > 0 && r.Token <= prev.Token {
			v.Add("row %d (%s) has token %d, not above token %d of the earlier row %d (%s): fence let a stale token commit", r.ID, r.Process, r.Token, prev.Token, prev.ID, prev.Process)
		}
		prev = r
	}
	if len(rows) > 0 && highWater != prev.Token {
		v.Add("high-water %d is not the last committed token %d", highWater, prev.Token)
	}
	return v.Err("WriteLog")
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

// LogMatchesHistory checks the write log against the workers' history:
// every row was written by a harness.KindFence op (the read-modify-write
// transaction, fenced or not) of its process with its token that
// ended "ok" or "commit_unknown"; every write op that ended "ok" has its
// row; a write op that ended otherwise (stale, lease expired, error) has
// none.
func LogMatchesHistory(rows []LogRow, h *harness.History) error {
	var v harness.Violations
	type pk struct {
		p string
		t uint64
	}
	writes := map[pk]harness.Op{}
	for _, op := range h.Ops() {
		if op.Kind == harness.KindFence {
			writes[pk{op.Process, op.Token}] = op
		}
	}
	inLog := map[pk]bool{}
	for _, r := range rows {
		k := pk{r.Process, r.Token}
		if inLog[k] {
			v.Add("row %d: token %d of %s logged twice", r.ID, r.Token, r.Process)
		}
		inLog[k] = true
		op, ok := writes[k]
		switch {
		case !ok:
			v.Add("row %d: no write of %s with token %d in the history", r.ID, r.Process, r.Token)
		case op.Outcome != harness.OutcomeOK && op.Outcome != harness.OutcomeCommitUnknown:
			v.Add("row %d committed, but op %d (%s token %d) ended %s: %s", r.ID, op.Seq, op.Process, op.Token, op.Outcome, op.Err)
		}
	}
	for k, op := range writes {
		if op.Outcome == harness.OutcomeOK && !inLog[k] {
			v.Add("op %d (%s token %d): committed per the worker, but not in the write log", op.Seq, op.Process, op.Token)
		}
	}
	return v.Err("LogMatchesHistory")
}
