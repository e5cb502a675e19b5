// Package pgxfence fences writes made through pgx v5 (PostgreSQL) with a
// lock ticket's token, in the same transaction as the write. See package
// github.com/ticketing-dev/ticketing/fence for the whole story, the
// errors and the options; this page says what is specific to pgx.
//
// # Run
//
//	err := pgxfence.Run(ctx, pool, ticket, func(tx pgx.Tx) error {
//		_, err := tx.Exec(ctx, "UPDATE accounts SET balance = balance - $1 WHERE id = $2", amount, id)
//		return err
//	})
//	var stale *fence.StaleError
//	switch {
//	case err == nil: // committed and released
//	case errors.As(err, &stale): // a newer holder has written; do not retry with this ticket
//	case errors.Is(err, fence.ErrCommitUnknown): // check the data before retrying
//	case errors.Is(err, fence.ErrTxEnded): // fn committed or rolled back: a bug; check the data
//	}
//
// db is a *pgxpool.Pool, *pgxpool.Conn or *pgx.Conn. A pgx.Tx is refused
// with ErrNestedTx: its Begin makes a savepoint, whose "commit" commits
// nothing, so Run would release the ticket before the outer transaction
// commits (breaking release only after commit). Inside your own transaction use Guard,
// and release the ticket after your commit. Run always releases the
// ticket, exactly once.
//
// The high-water table is created, once at start-up, by
// github.com/ticketing-dev/ticketing/migrations/pgxmigrations on the same
// pool (which it leaves open):
//
//	if err := pgxmigrations.Up(ctx, pool); err != nil { ... }
//
// # The statement
//
// The check-and-bump is one statement per resource, one round trip:
//
//	INSERT INTO ticketing_fence AS f (resource, high_water, updated_at) VALUES ($1, $2, now())
//	ON CONFLICT (resource) DO UPDATE SET high_water = EXCLUDED.high_water, updated_at = EXCLUDED.updated_at
//	WHERE f.high_water < EXCLUDED.high_water
//	RETURNING f.high_water, set_config('ticketing.fence_tx', 'fenced', true)
//
// A row comes back only if the token was accepted. Either way the
// resource's row is locked until the transaction ends, so concurrent
// fenced transactions on it run one after the other and accepted tokens
// increase in commit order. A stale token costs a second statement that
// reads the high-water for the *fence.StaleError.
//
// Run, with a *pgxpool.Pool, *pgxpool.Conn or *pgx.Conn, sends the first
// resource's check-and-bump in the BEGIN's own query (pgx's
// TxOptions.BeginQuery: fn still gets pgx's pgx.Tx), as an EXECUTE of a
// statement prepared once per connection (the statement itself with
// QueryExecModeSimpleProtocol or QueryExecModeExec), with the resource as
// a hex literal and the token as a number. There a rejected token fails
// the statement with the high-water it compared with in the error text
// (SQLSTATE 22P02, a failed cast), which Run returns as the
// *fence.StaleError, without the second statement.
//
// # Isolation
//
// READ COMMITTED, PostgreSQL's default, is right: ON CONFLICT DO UPDATE
// locks and checks the latest committed row version. Under REPEATABLE READ
// or SERIALIZABLE (a transaction you opened with pgx.TxOptions and fenced
// with Guard) a bump committed by another transaction after yours took its
// snapshot fails the upsert with SQLSTATE 40001, for a lower and for a
// higher token alike: returned, not retried; roll back and retry the whole
// transaction. A lower token never passes at any level (see the isolation
// table in package fence).
//
// # Guard
//
// Guard is the check-and-bump alone, for a transaction you manage (for
// instance one opened with pgx.BeginTxFunc and other options). Call it
// before the protected write; then call CheckTx and fence.CheckLease
// right before commit, commit, and release the ticket yourself
// afterwards. Roll back on any error from Guard, CheckTx or CheckLease.
//
// # A function that ends the transaction
//
// The fence holds only while the transaction that ran the check-and-bump
// is open. If fn commits or rolls back (tx.Exec(ctx, "COMMIT"),
// "ROLLBACK", tx.Commit, even followed by a new BEGIN), Run does not
// commit and returns an error matching fence.ErrTxEnded: what fn wrote
// before the end may be durable, what it wrote after ran unfenced. Run
// tells from the connection's transaction status (pgconn's TxStatus,
// free) and, inside a transaction, a transaction-local setting
// (ticketing.fence_tx) that the check-and-bump statement sets with
// set_config(..., true) in its RETURNING clause. Run reads it in the
// COMMIT's own round trip: with a *pgxpool.Pool, *pgxpool.Conn or
// *pgx.Conn it begins the transaction with pgx.TxOptions.CommitQuery set
// to one query that checks and then commits (from a pool it acquires the
// connection itself and gives it back once the transaction is over, so fn
// gets the connection's own pgx.Tx, not a *pgxpool.Tx), in which a failed
// check makes PostgreSQL skip the COMMIT. So a fenced transaction costs
// as many round trips as the same transaction unfenced: the
// check-and-bump rides with the BEGIN, the check with the COMMIT. When that check fails (fn committed and began a new
// transaction), pgx closes the connection, as it does after any failed
// commit query that leaves a transaction open: a pool replaces it; a
// *pgx.Conn of yours must be dialled again, and a *pgxpool.Conn of yours
// stays closed until you release it (the pool then replaces it). With
// another Beginner, and in CheckTx, the check is a SELECT of its own
// before COMMIT.
//
// # Commit failures
//
// A commit error that PostgreSQL itself sent (a deferred constraint, a
// serialization failure) means "rolled back" and is returned wrapped, and
// so does one that pgx raised before sending the COMMIT (pgconn.SafeToRetry:
// a connection still busy with rows fn did not close, or a context done
// already; pgx closes the connection, which rolls back). Any
// other commit error (the connection broke, including FATAL 57P01 after
// pg_terminate_backend, or the context was cancelled during COMMIT with
// pgconn's default context handler, which breaks the connection) matches
// fence.ErrCommitUnknown. With a pgconn.CancelRequestContextWatcherHandler
// a cancellation is the server's "canceling statement" (SQLSTATE 57014),
// sent when it cancelled the check or the COMMIT before it committed: that
// is returned as rolled back.
package pgxfence
