package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net/http"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ticketing-dev/ticketing/adapters/pgxfence"
	"github.com/ticketing-dev/ticketing/broker"
	"github.com/ticketing-dev/ticketing/fence"
)

// API serves the order endpoints. Its exported fields are its dependencies
// and settings; set them, then call Handler. It is safe for concurrent use.
type API struct {
	// DB is the application's database. Required.
	DB *pgxpool.Pool
	// Locks is the application's one broker. Required.
	Locks *broker.Broker
	// Log receives request failures (default: discard).
	Log *slog.Logger
	// LockWait is how long a request waits for its order's lock while
	// another request holds it (default 5 s).
	LockWait time.Duration
	// Lease is how long a lock is held at most; longer than a payment
	// takes (default 10 s).
	Lease time.Duration

	// afterLock, if set, runs right after the lock is granted: tests use it
	// to stall a request past its lease.
	afterLock func(ctx context.Context)
}

// Handler returns the routes:
//
//	POST /orders/{id}/pay   charge the order, exactly once
//	GET  /orders/{id}       the order and its payment, if any
func (a *API) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /orders/{id}/pay", a.pay)
	mux.HandleFunc("GET /orders/{id}", a.get)
	return mux
}

// Errors of the handlers' own; the broker's and the fence's are mapped in
// httpError.
var (
	errBadID       = errors.New("order id must be a positive integer")
	errNotFound    = errors.New("no such order")
	errAlreadyPaid = errors.New("order is already paid")
)

// Order is an orders row with its payment, as returned to clients.
type Order struct {
	ID          int64    `json:"id"`
	Status      string   `json:"status"` // "pending" or "paid"
	AmountCents int64    `json:"amount_cents"`
	Payment     *Payment `json:"payment,omitempty"`
}

// Payment is a payments row.
type Payment struct {
	ID        int64     `json:"id"`
	Token     int64     `json:"fencing_token"` // the lock token it was written with
	CreatedAt time.Time `json:"created_at"`
}

// pay charges an order exactly once: under the order's lock, in one
// transaction fenced with the lock's token, it re-checks the order, inserts
// the payment and marks the order paid; the lock is released after commit.
func (a *API) pay(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context() // cancelled if the client goes away
	id, err := orderID(r)
	if err != nil {
		a.fail(w, r, err)
		return
	}
	// A cheap check without the lock, so that unknown orders and repeated
	// requests for a paid order never take a lock.
	if o, err := a.order(ctx, a.DB, id); err != nil {
		a.fail(w, r, err)
		return
	} else if o.Status == "paid" {
		a.fail(w, r, errAlreadyPaid)
		return
	}

	lease := orDefault(a.Lease, 10*time.Second)
	wait := orDefault(a.LockWait, 5*time.Second)
	// The lock wait is bounded by Acquire's wait, which the lock server
	// enforces: at its end the answer is ErrTimedOut, a definite "not
	// granted". The request's context is not the right bound, and the
	// Acquire gets a context of its own, not cancelled when the client goes
	// away, that outlives the wait by a margin:
	//   - net/http gives the request's context no deadline: it ends only
	//     when the client hangs up or the server shuts down;
	//   - ending it while the ACQUIRE may be on the wire is a cancellation
	//     after a possible send: the result is ErrIndeterminate, and the
	//     lock may still be granted (to nobody), keeping this order locked
	//     until the lease runs out, so that the client's retry waits the
	//     whole lease. With a protocol version 1 server the broker must
	//     also close the session, and every other request waiting for a
	//     lock on that session becomes indeterminate: one impatient client
	//     fails unrelated customers.
	// After the grant, the request's context is used again: a cancelled
	// transaction rolls back and releases the lock.
	lockCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), wait+lockMargin)
	// Work budget: the lock is not worth having with less than a quarter of
	// the lease left (whole seconds: the broker rounds up).
	ticket, err := a.acquire(lockCtx, fmt.Sprintf("order:%d", id), broker.AcquireOptions{Lease: lease, Wait: wait, Work: (lease / 4).Truncate(time.Second)})
	cancel()
	if err != nil {
		a.fail(w, r, err)
		return
	}
	if a.afterLock != nil {
		a.afterLock(ctx)
	}

	var o Order
	err = pgxfence.Run(ctx, a.DB, ticket, func(tx pgx.Tx) error {
		// The check that counts: inside the fenced transaction, which holds
		// the order's fence row lock until commit.
		o, err = a.order(ctx, tx, id)
		if err != nil {
			return err
		}
		if o.Status == "paid" {
			return errAlreadyPaid
		}
		o.Payment = &Payment{Token: int64(ticket.Token())} // pgxfence refuses tokens above MaxInt64
		if err := tx.QueryRow(ctx,
			"INSERT INTO ticketing_example_payments (order_id, amount_cents, token) VALUES ($1, $2, $3) RETURNING id, created_at",
			id, o.AmountCents, o.Payment.Token).Scan(&o.Payment.ID, &o.Payment.CreatedAt); err != nil {
			return err
		}
		o.Status = "paid"
		_, err := tx.Exec(ctx, "UPDATE ticketing_example_orders SET status = 'paid' WHERE id = $1", id)
		return err
	})
	if !fence.Committed(err) {
		a.fail(w, r, err)
		return
	}
	if err != nil { // committed; only the release failed: the lock ends with its lease
		a.log().WarnContext(ctx, "payment committed, lock release failed", "order", id, "err", err)
	}
	a.writeJSON(w, r, http.StatusOK, o)
}

// lockMargin is how long the Acquire's context outlives its wait, for the
// server's answer to arrive.
const lockMargin = 2 * time.Second

// unsentRetry bounds the wait for a ready session after broker.ErrUnsent.
const unsentRetry = time.Second

// acquire is Locks.Acquire, retried soon after broker.ErrUnsent: nothing
// was sent (no session was ready: a reconnect in progress, the lock service
// restarting), so trying again is always safe. It waits up to unsentRetry
// for a ready session and retries with what is left of the wait; if no
// session comes, the client gets 503 with Retry-After: 1.
func (a *API) acquire(ctx context.Context, key string, opts broker.AcquireOptions) (*broker.Ticket, error) {
	start, wait := time.Now(), opts.Wait
	for {
		opts.Wait = max(0, wait-time.Since(start)).Truncate(time.Second)
		ticket, err := a.Locks.Acquire(ctx, key, opts)
		if !errors.Is(err, broker.ErrUnsent) || ctx.Err() != nil {
			return ticket, err
		}
		rctx, cancel := context.WithTimeout(ctx, unsentRetry)
		rerr := a.Locks.WaitReady(rctx)
		cancel()
		if rerr != nil {
			return nil, err
		}
	}
}

// get returns an order and its payment.
func (a *API) get(w http.ResponseWriter, r *http.Request) {
	id, err := orderID(r)
	if err != nil {
		a.fail(w, r, err)
		return
	}
	o, err := a.order(r.Context(), a.DB, id)
	if err != nil {
		a.fail(w, r, err)
		return
	}
	a.writeJSON(w, r, http.StatusOK, o)
}

// querier is what order needs: a pool or a transaction.
type querier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

func (a *API) order(ctx context.Context, q querier, id int64) (Order, error) {
	o := Order{ID: id}
	var pid, ptok *int64
	var pat *time.Time
	err := q.QueryRow(ctx, `
		SELECT o.status, o.amount_cents, p.id, p.token, p.created_at
		FROM ticketing_example_orders o LEFT JOIN ticketing_example_payments p ON p.order_id = o.id
		WHERE o.id = $1`, id).Scan(&o.Status, &o.AmountCents, &pid, &ptok, &pat)
	if errors.Is(err, pgx.ErrNoRows) {
		return o, errNotFound
	}
	if err != nil {
		return o, err
	}
	if pid != nil {
		o.Payment = &Payment{ID: *pid, Token: *ptok, CreatedAt: *pat}
	}
	return o, nil
}

func orderID(r *http.Request) (int64, error) {
	id, err := strconv.ParseInt(r.PathValue("id"), 10, 64)
	if err != nil || id <= 0 {
		return 0, errBadID
	}
	return id, nil
}

// httpError maps an error to a status, a stable code for clients, a
// message, and a Retry-After (0: none).
func (a *API) httpError(err error) (status int, code, msg string, retryAfter time.Duration) {
	var stale *fence.StaleError
	switch {
	case errors.Is(err, errBadID):
		return http.StatusBadRequest, "invalid_id", err.Error(), 0
	case errors.Is(err, errNotFound):
		return http.StatusNotFound, "not_found", err.Error(), 0
	case errors.Is(err, errAlreadyPaid):
		return http.StatusConflict, "already_paid", "order is already paid; not charged again", 0

	// Definite outcomes of the lock and the fence: nothing was charged.
	case errors.As(err, &stale):
		return http.StatusConflict, "stale_lock", "this request lost the order's lock (a newer holder wrote first); not charged", 0
	case errors.Is(err, broker.ErrTimedOut):
		return http.StatusConflict, "lock_timeout", "another request is working on this order; not charged", 0
	case errors.Is(err, broker.ErrBusy):
		return http.StatusConflict, "lock_busy", "the lock service is at capacity; not charged", 0

	// Nothing was charged, but the request can be retried as is. An
	// indeterminate acquire may hold the lock until its lease ends.
	case errors.Is(err, broker.ErrIndeterminate):
		return http.StatusServiceUnavailable, "lock_indeterminate", "lost contact with the lock service; not charged", orDefault(a.Lease, 10*time.Second)
	case errors.Is(err, broker.ErrUnsent), errors.Is(err, broker.ErrNotActive), errors.Is(err, broker.ErrClosed):
		return http.StatusServiceUnavailable, "lock_unavailable", "the lock service is unavailable; not charged", time.Second
	case errors.Is(err, broker.ErrLeaseTooShort), errors.Is(err, fence.ErrLeaseExpired):
		return http.StatusServiceUnavailable, "lease_expired", "the lock's lease ran out before commit; not charged", time.Second
	// The commit may or may not have happened; paying again is safe: it is
	// refused with already_paid if it did.
	case errors.Is(err, fence.ErrCommitUnknown):
		return http.StatusServiceUnavailable, "commit_unknown", "the database did not confirm the payment; retry to find out", time.Second
	case errors.Is(err, context.Canceled):
		return http.StatusServiceUnavailable, "canceled", "request canceled", 0
	}
	return http.StatusInternalServerError, "internal", "internal error", 0
}

// fail writes err as {"error": "...", "code": "..."}. Unexpected errors
// are logged, and not shown to the client.
func (a *API) fail(w http.ResponseWriter, r *http.Request, err error) {
	status, code, msg, retry := a.httpError(err)
	if status == http.StatusInternalServerError || errors.Is(err, broker.ErrIndeterminate) || errors.Is(err, fence.ErrCommitUnknown) {
		a.log().ErrorContext(r.Context(), "request failed", "method", r.Method, "path", r.URL.Path, "code", code, "err", err)
	}
	if retry > 0 {
		w.Header().Set("Retry-After", strconv.Itoa(int(math.Ceil(retry.Seconds()))))
	}
	a.writeJSON(w, r, status, map[string]string{"error": msg, "code": code})
}

func (a *API) writeJSON(w http.ResponseWriter, r *http.Request, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	if err := json.NewEncoder(w).Encode(v); err != nil { // the client has gone
		a.log().DebugContext(r.Context(), "writing the response failed", "err", err)
	}
}

func (a *API) log() *slog.Logger {
	if a.Log == nil {
		return slog.New(slog.DiscardHandler)
	}
	return a.Log
}

// orDefault returns d, or def if d is zero.
func orDefault(d, def time.Duration) time.Duration {
	if d == 0 {
		return def
	}
	return d
}
