// Command longjob runs a job longer than any lease, the way such a job
// should hold its lock: a short lease kept alive in the background, work
// that stops at once when the lock may be lost, and one fenced write at
// the end.
//
// A lease is at most 250 s (broker.MaxLease), and a short one is better:
// if the worker dies, the next one waits at most a lease. So the job takes
// a 5 s lease and calls Ticket.KeepAlive, which refreshes it every third
// of a lease and returns a context (held) that is cancelled, with the
// reason in context.Cause(held), as soon as the ticket can no longer be
// sure it holds the lock: do every step of the work under held. At the
// end the result is written with sqlfence.Run, which checks the ticket's
// fencing token against the stored high-water in the same transaction,
// commits, and releases the lock. Then fence.Committed(err) decides
// whether the job is done: a non-nil error can still mean "committed".
//
// It starts a Ticketing lock server in this process and a SQLite database
// in a temporary directory: nothing to install.
//
//	go run ./examples/longjob                       # 20 s of work under a 5 s lease
//	go run ./examples/longjob -lose-lock-after 3    # an operator takes the lock away after step 3
//	go run ./examples/longjob -steps 6 -step 500ms -lease 1s
package main

import (
	"context"
	"database/sql"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/ticketing-dev/ticketing/adapters/sqlfence"
	"github.com/ticketing-dev/ticketing/broker"
	"github.com/ticketing-dev/ticketing/fence"
)

// key is the lock, and the fenced resource: the report the job writes.
const key = "report-2026"

// config is the job's shape (the flags).
type config struct {
	Lease         time.Duration // the lease kept alive; a few seconds
	Steps         int           // how many steps the job has
	Step          time.Duration // how long each step takes
	LoseLockAfter int           // if > 0: after this step, an operator expires the lock
}

func main() {
	var cfg config
	flag.DurationVar(&cfg.Lease, "lease", 5*time.Second, "the lease kept alive (1s..250s; in a cluster or a pair at least 4x the failover time)")
	flag.IntVar(&cfg.Steps, "steps", 20, "the number of steps of the job")
	flag.DurationVar(&cfg.Step, "step", time.Second, "how long one step takes")
	flag.IntVar(&cfg.LoseLockAfter, "lose-lock-after", 0, "after this step an operator expires the lock (0: never), to show the lost-lock signal")
	flag.Parse()

	ctx, cancel := context.WithTimeout(context.Background(), time.Duration(cfg.Steps)*cfg.Step+time.Minute)
	res, err := run(ctx, os.Stdout, cfg)
	cancel()
	if err == nil {
		err = res.check(cfg)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "longjob: FAILED:", err)
		os.Exit(1)
	}
	if res.Lost != nil {
		fmt.Println("OK: the job stopped as soon as its lock was lost, and wrote nothing.")
	} else {
		fmt.Printf("OK: %v of work under a %v lease: one lock, one fencing token, one fenced write.\n", time.Duration(cfg.Steps)*cfg.Step, cfg.Lease)
	}
}

// result is how the job ended.
type result struct {
	Token     uint64
	StepsDone int
	Lost      error   // why the job stopped early: context.Cause of the lost-lock signal (nil: it did not)
	Verdict   verdict // what the fenced write's error meant (when the job was not stopped)
	Report    *report // the row written, if any
	Rows      int     // the rows of the reports table at the end
}

// run runs the job once and tells it on out. Its error is for a failure
// of the demo itself (the server, the database); how the job ended is in
// the result.
func run(ctx context.Context, out io.Writer, cfg config) (res result, err error) {
	d, err := startDemo(ctx) // lock server, broker, SQLite database: see demo.go
	if err != nil {
		return res, err
	}
	defer func() { err = errors.Join(err, d.close()) }()
	say := d.narrator(out)
	say("Job %q: %d steps of %v (%v of work), under a %v lease kept alive.",
		key, cfg.Steps, cfg.Step, time.Duration(cfg.Steps)*cfg.Step, cfg.Lease)

	// Acquire: Lease is required; Wait 5 s if another worker holds it.
	ticket, err := d.broker.Acquire(ctx, key, broker.AcquireOptions{Lease: cfg.Lease, Wait: 5 * time.Second})
	if err != nil {
		return res, fmt.Errorf("acquire: %w", err)
	}
	res.Token = ticket.Token()
	// Whatever happens below, give the lock back. (sqlfence.Run releases
	// it too; a second Release only returns the first one's result.)
	defer ticket.Release(context.Background())

	// KeepAlive refreshes the lease in the background, every third of
	// it. held is cancelled as soon as the lock may be lost: a refresh
	// answered "not held" (the lock was expired or taken), or no refresh
	// confirmed until a third of the lease is left (the lock service
	// unreachable). Stop the work at once then: the signal fires before
	// anyone else can be granted the key.
	held, err := ticket.KeepAlive(ctx, cfg.Lease)
	if err != nil {
		return res, fmt.Errorf("keep-alive: %w", err)
	}
	say("got the lock, fencing token %d; the lease is kept alive in the background", ticket.Token())

	// The work: every step runs under held, so that it stops at once.
	for i := 1; i <= cfg.Steps; i++ {
		if err := step(held, cfg.Step); err != nil {
			// The lost-lock signal. Stop at once, write nothing: another
			// worker may already hold the key. (The fence would refuse a
			// write made with this ticket anyway.)
			res.Lost = context.Cause(held)
			say("LOCK LOST after step %d/%d: %v", res.StepsDone, cfg.Steps, res.Lost)
			say("stopped at once; nothing written. Run the job again with a new ticket.")
			res.Rows, err = d.reports(ctx)
			return res, err
		}
		res.StepsDone = i
		say("step %d/%d done; %v of lease left (token %d)", i, cfg.Steps, ticket.Remaining().Round(100*time.Millisecond), ticket.Token())
		if i == cfg.LoseLockAfter {
			// For the demo: an operator's "expire now" (ticketingd locks
			// expire, or the console) takes the lock away from the job.
			// The next refresh is answered "not held".
			say("operator: expire now of %q (token %d)", key, ticket.Token())
			if err := d.srv.ExpireLock(ctx, key, ticket.Token(), "longjob demo"); err != nil {
				return res, fmt.Errorf("expire now: %w", err)
			}
		}
	}

	// The fenced write: in one transaction, the token is checked against
	// the report's high-water and stored, the report is written, the
	// lease is checked (Remaining, as refreshed), and the transaction
	// commits; then the ticket is released. Under held: a lock lost now
	// rolls the transaction back.
	say("writing the result through the fence (sqlfence.Run)")
	err = sqlfence.Run(held, d.db, fence.SQLite, ticket, func(tx *sql.Tx) error {
		_, err := tx.ExecContext(held,
			"INSERT INTO reports (name, steps, token) VALUES (?, ?, ?)", key, res.StepsDone, int64(ticket.Token()))
		return err
	})
	res.Verdict = settle(say, err)
	if res.Verdict == committed || res.Verdict == committedReleaseFailed {
		r, err := d.readReport(ctx)
		if err != nil {
			return res, err
		}
		res.Report = &r
		say("report: %v", r)
	}
	res.Rows, err = d.reports(ctx)
	return res, err
}

// step is one step of the work: here it only takes time, but it is done
// under ctx (held) as real work should be: pass held to every call
// (queries, HTTP requests) and check it between steps.
func step(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// verdict is what the fenced write's error means for the job.
type verdict int

const (
	committed              verdict = iota + 1 // written and released: done
	committedReleaseFailed                    // written; only the release failed: done, do NOT redo
	commitUnknown                             // maybe written (ErrCommitUnknown, ErrTxEnded): check the data before redoing
	notWritten                                // nothing written: redo with a new ticket
)

func (v verdict) String() string {
	switch v {
	case committed:
		return "committed"
	case committedReleaseFailed:
		return "committed, release failed"
	case commitUnknown:
		return "commit unknown"
	case notWritten:
		return "not written"
	}
	return "none"
}

// settle decides what sqlfence.Run's error means, and says it.
func settle(say sayFunc, err error) verdict {
	switch {
	// Check fence.Committed(err) FIRST, before any retry. A non-nil err
	// can still mean that the transaction committed: the ticket's release
	// failed afterwards (a *fence.ReleaseError with a nil Primary; the
	// lock then lingers until its lease ends). Redoing the job on "err
	// != nil" would write the result twice.
	case fence.Committed(err):
		if err != nil {
			say("COMMITTED, but releasing the lock failed (%v): the job is done, do not run it again; the lock ends with its lease", err)
			return committedReleaseFailed
		}
		say("committed; the lock is released")
		return committed
	case errors.Is(err, fence.ErrCommitUnknown), errors.Is(err, fence.ErrTxEnded):
		// COMMIT got no answer, or the write function ended the
		// transaction itself: what it wrote may be durable.
		say("the write may or may not be durable (%v): check whether the report was written before running the job again", err)
		return commitUnknown
	default:
		// Rolled back: a stale token (*fence.StaleError), a lease that
		// ran out (fence.ErrLeaseExpired), the lock lost (held
		// cancelled), or the write's own error. Nothing was written.
		say("not written (%v): run the job again with a new ticket", err)
		return notWritten
	}
}

// check verifies that the job ended as cfg says it must: all steps done
// and the report written with the job's token, or, when an operator
// expired the lock, stopped by the lost-lock signal (at the next refresh,
// within about a third of the lease) before the end, with nothing
// written.
func (r result) check(cfg config) error {
	if cfg.LoseLockAfter > 0 && cfg.LoseLockAfter < cfg.Steps {
		switch {
		case r.Lost == nil:
			return fmt.Errorf("the job was not stopped after its lock was expired (steps done: %d)", r.StepsDone)
		case !errors.Is(r.Lost, broker.ErrNotHeld):
			return fmt.Errorf("the lost-lock signal's cause is %v, want broker.ErrNotHeld", r.Lost)
		case r.StepsDone >= cfg.Steps:
			return fmt.Errorf("the job ran all %d steps although its lock was expired after step %d", r.StepsDone, cfg.LoseLockAfter)
		case r.Report != nil || r.Rows != 0:
			return fmt.Errorf("a report was written after the lock was lost (%d rows)", r.Rows)
		}
		return nil
	}
	switch {
	case r.Lost != nil:
		return fmt.Errorf("the lock was lost after %d steps: %w", r.StepsDone, r.Lost)
	case r.StepsDone != cfg.Steps:
		return fmt.Errorf("%d of %d steps done", r.StepsDone, cfg.Steps)
	case r.Verdict != committed:
		return fmt.Errorf("the fenced write ended %v", r.Verdict)
	case r.Report == nil || r.Report.Steps != cfg.Steps || r.Report.Token != r.Token || r.Rows != 1:
		return fmt.Errorf("report %v, want %d steps with token %d", r.Report, cfg.Steps, r.Token)
	}
	return nil
}
