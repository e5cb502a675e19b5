package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/ticketing-dev/ticketing/adapters/sqlfence"
	"github.com/ticketing-dev/ticketing/broker"
	"github.com/ticketing-dev/ticketing/fence"
)

// Job is a row of the jobs table.
type Job struct {
	ID      int64
	Payload string
}

// Worker claims jobs from the jobs table and processes each under its own
// lock, "job:<id>", writing the result in a transaction fenced with the
// lock's token. Set the fields, then call Run (or RunOnce). Several Workers,
// in one process or many, may share the table; each needs its own Name.
type Worker struct {
	// DB is the MySQL/MariaDB database (go-sql-driver/mysql). Required.
	DB *sql.DB
	// Locks is the process's one broker. Required.
	Locks *broker.Broker
	// Name identifies the worker in jobs.claimed_by and job_results.worker.
	// Required, unique among the workers.
	Name string
	// Process does the job's work and returns its result. It runs under the
	// job's lock, before the fenced transaction that stores the result. If
	// that transaction fails (stale token, lease ran out), the job is done
	// again later by some worker: make any outside effect of Process
	// idempotent, for example keyed by the job id. Required.
	Process func(ctx context.Context, job Job) (result string, err error)
	// Lease is the job's lock lease: longer than Process plus the write
	// take (default 30 s).
	Lease time.Duration
	// ClaimTTL is how long a claim keeps other workers off a job; after it
	// the job is claimed again if it is not done. Longer than Lease
	// (default 2 × Lease).
	ClaimTTL time.Duration
	// Idle is the pause when there is no job or after an error (default 1 s).
	Idle time.Duration
	// Log receives the worker's events (default: discard).
	Log *slog.Logger

	// afterLock, if set, runs right after the lock is granted: tests use it
	// to stall a worker past its lease.
	afterLock func(ctx context.Context, job Job)
}

// errAlreadyDone: the job was found done inside the fenced transaction.
var errAlreadyDone = errors.New("job already done")

// Run processes jobs until ctx is done, then returns nil. Stopping is
// graceful: the job in progress is finished (within its lease), no new one
// is claimed. A failed job is left for another attempt once its claim
// expires.
func (w *Worker) Run(ctx context.Context) error {
	if w.DB == nil || w.Locks == nil || w.Name == "" || w.Process == nil {
		return errors.New("worker: DB, Locks, Name and Process are required")
	}
	for ctx.Err() == nil {
		// The job is not cancelled by ctx, only bounded by its lease.
		jobCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), w.claimTTL())
		did, err := w.RunOnce(jobCtx)
		cancel()
		switch {
		case errors.Is(err, broker.ErrUnsent):
			// Nothing was sent: no session was ready (the lock service
			// restarting, a reconnect in progress). RunOnce handed the job
			// back; retry as soon as a session is ready, not after the
			// claim expires.
			w.log().InfoContext(ctx, "lock service unreachable; job handed back, retrying once a session is ready", "worker", w.Name, "err", err)
			if werr := w.Locks.WaitReady(ctx); werr == nil {
				continue
			}
		case err != nil:
			w.log().WarnContext(ctx, "job left for another attempt", "worker", w.Name, "err", err)
		case did:
			continue // look for the next job at once
		}
		select { // nothing to do, or an error: pause
		case <-ctx.Done():
		case <-time.After(w.idle()):
		}
	}
	return nil
}

// RunOnce claims one job and processes it. It returns false, nil when there
// is no job to claim; true, nil when the job was processed and committed
// (or found already done by another worker); and an error when the job was
// left for another attempt:
//
//   - the lock was not granted (broker.ErrTimedOut: another worker has it;
//     broker.ErrIndeterminate; broker.ErrUnsent: no session to the lock
//     server is ready; ...). When it was definitely not granted to anyone
//     on our behalf (ErrUnsent, ErrBusy, ErrNotActive, ErrClosed), the
//     claim is dropped at once, so that the job does not wait ClaimTTL for
//     its next attempt;
//   - a newer holder of the job's lock wrote first (*fence.StaleError);
//   - the lease ran out before commit (fence.ErrLeaseExpired);
//   - Process or the database failed.
func (w *Worker) RunOnce(ctx context.Context) (bool, error) {
	job, ok, err := w.claim(ctx)
	if err != nil || !ok {
		return false, err
	}
	log := w.log().With("worker", w.Name, "job", job.ID)

	lease := w.lease()
	// wait 0: one immediate try; if another worker holds the lock, leave
	// the job (its claim expires). Work budget: a quarter of the lease.
	ticket, err := w.Locks.Acquire(ctx, fmt.Sprintf("job:%d", job.ID), broker.AcquireOptions{Lease: lease, Work: (lease / 4).Truncate(time.Second)})
	if err != nil {
		if notGranted(err) {
			err = errors.Join(err, w.unclaim(ctx, job.ID))
		}
		return false, fmt.Errorf("job %d: lock: %w", job.ID, err)
	}
	if w.afterLock != nil {
		w.afterLock(ctx, job)
	}

	result, err := w.Process(ctx, job)
	if err != nil {
		if rerr := ticket.Release(ctx); rerr != nil {
			log.WarnContext(ctx, "releasing the lock failed; it ends with its lease", "err", rerr)
		}
		return false, fmt.Errorf("job %d: process: %w", job.ID, err)
	}

	err = sqlfence.Run(ctx, w.DB, fence.MySQL, ticket, func(tx *sql.Tx) error {
		var status string
		if err := tx.QueryRowContext(ctx, "SELECT status FROM ticketing_example_jobs WHERE id = ? FOR UPDATE", job.ID).Scan(&status); err != nil {
			return err
		}
		if status == "done" {
			return errAlreadyDone
		}
		if _, err := tx.ExecContext(ctx,
			"INSERT INTO ticketing_example_job_results (job_id, result, worker, token) VALUES (?, ?, ?, ?)",
			job.ID, result, w.Name, int64(ticket.Token())); err != nil { // sqlfence refuses tokens above MaxInt64
			return err
		}
		_, err := tx.ExecContext(ctx,
			"UPDATE ticketing_example_jobs SET status = 'done', claimed_by = NULL, claimed_until = NULL WHERE id = ?", job.ID)
		return err
	})
	switch {
	case fence.Committed(err):
		if err != nil {
			log.WarnContext(ctx, "job done; releasing the lock failed, it ends with its lease", "err", err)
		}
		log.DebugContext(ctx, "job done", "token", ticket.Token())
		return true, nil
	case errors.Is(err, errAlreadyDone):
		log.InfoContext(ctx, "job was already done by another worker")
		return true, nil
	}
	return false, fmt.Errorf("job %d: %w", job.ID, err)
}

// claim marks the oldest pending, unclaimed job as this worker's for
// ClaimTTL. SKIP LOCKED (MySQL 8, MariaDB 10.6+) lets concurrent workers
// claim different jobs without waiting for each other. The claim only
// spreads the work; correctness comes from the lock and the fence.
func (w *Worker) claim(ctx context.Context) (job Job, ok bool, err error) {
	// READ COMMITTED: InnoDB keeps no locks on the rows that do not match.
	tx, err := w.DB.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelReadCommitted})
	if err != nil {
		return job, false, err
	}
	defer func() {
		if !ok {
			err = errors.Join(err, ignoreDone(tx.Rollback()))
		}
	}()
	err = tx.QueryRowContext(ctx, `
		SELECT id, payload FROM ticketing_example_jobs
		WHERE status = 'pending' AND (claimed_until IS NULL OR claimed_until < NOW(6))
		ORDER BY id LIMIT 1
		FOR UPDATE SKIP LOCKED`).Scan(&job.ID, &job.Payload)
	if errors.Is(err, sql.ErrNoRows) {
		return job, false, nil
	}
	if err != nil {
		return job, false, err
	}
	if _, err := tx.ExecContext(ctx,
		"UPDATE ticketing_example_jobs SET claimed_by = ?, claimed_until = NOW(6) + INTERVAL ? MICROSECOND WHERE id = ?",
		w.Name, w.claimTTL().Microseconds(), job.ID); err != nil {
		return job, false, err
	}
	if err := tx.Commit(); err != nil {
		return job, false, err
	}
	return job, true, nil
}

// notGranted reports whether an Acquire error says that the lock is
// definitely not held for this worker: nothing was sent (ErrUnsent, also
// ErrClosed), or the server refused it (ErrBusy, ErrNotActive). Not
// ErrTimedOut (another worker holds the job's lock: leave the job to the
// claim's expiry) nor ErrIndeterminate (the lock may be held, by nobody,
// until its lease ends, within the claim).
func notGranted(err error) bool {
	return errors.Is(err, broker.ErrUnsent) || errors.Is(err, broker.ErrBusy) ||
		errors.Is(err, broker.ErrNotActive) || errors.Is(err, broker.ErrClosed)
}

// unclaim drops this worker's claim on a pending job, so that any worker
// may claim it again at once.
func (w *Worker) unclaim(ctx context.Context, id int64) error {
	_, err := w.DB.ExecContext(ctx,
		"UPDATE ticketing_example_jobs SET claimed_by = NULL, claimed_until = NULL WHERE id = ? AND claimed_by = ? AND status = 'pending'",
		id, w.Name)
	return err
}

// ignoreDone drops sql.ErrTxDone, which Rollback returns after a failed
// Commit.
func ignoreDone(err error) error {
	if errors.Is(err, sql.ErrTxDone) {
		return nil
	}
	return err
}

func (w *Worker) lease() time.Duration { return orDefault(w.Lease, 30*time.Second) }

func (w *Worker) claimTTL() time.Duration { return orDefault(w.ClaimTTL, 2*w.lease()) }

func (w *Worker) idle() time.Duration { return orDefault(w.Idle, time.Second) }

func (w *Worker) log() *slog.Logger {
	if w.Log == nil {
		return slog.New(slog.DiscardHandler)
	}
	return w.Log
}

func orDefault(d, def time.Duration) time.Duration {
	if d == 0 {
		return def
	}
	return d
}
