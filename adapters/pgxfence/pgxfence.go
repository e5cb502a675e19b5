package pgxfence

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ticketing-dev/ticketing/adapters/internal/core"
	"github.com/ticketing-dev/ticketing/fence"
)

// Beginner starts a transaction: *pgxpool.Pool, *pgxpool.Conn or
// *pgx.Conn. A pgx.Tx satisfies the interface too, but Run refuses it
// with ErrNestedTx.
type Beginner interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}

// ErrNestedTx is returned by Run when db is a pgx.Tx. Its Begin only
// creates a savepoint, and "committing" a savepoint commits nothing: Run
// would release the ticket before the outer transaction commits, while a
// newer holder can already write (release only after commit). Inside a
// transaction you manage, call Guard, commit, and release the ticket
// after the commit. The ticket is released and nothing is sent.
var ErrNestedTx = errors.New("pgxfence: db is a pgx.Tx (a savepoint is not a commit); use Guard in that transaction and release the ticket after its commit")

// Run fences fn with ticket in one transaction of db: begin, check-and-bump
// of the high-water of every resource (default: the ticket's key), fn,
// lease check, commit; then it releases the ticket, on every path (also
// when fn fails or panics), exactly once.
//
// Before retrying on an error, check fence.Committed(err): an error does
// not always mean that nothing was written. After a commit, a release
// that failed (the lock service unreachable, say) still returns an error,
// a *fence.ReleaseError with a nil Primary, for which Committed is true:
// the write is durable, do not redo it (the lock lingers until its lease
// ends).
//
//	err := pgxfence.Run(ctx, pool, ticket, fn)
//	switch {
//	case fence.Committed(err): // nil, or committed and only the release failed: done
//	case errors.Is(err, fence.ErrCommitUnknown), errors.Is(err, fence.ErrTxEnded):
//		// maybe written: check the data first
//	default: // rolled back, nothing written: safe to retry with a new ticket
//	}
//
// Run returns nil if the transaction committed and the ticket was released.
// Otherwise, with the transaction rolled back unless noted:
//   - a *fence.StaleError (errors.Is(err, fence.ErrStale)) if the token was
//     not above a stored high-water;
//   - fn's error, as is;
//   - an error matching fence.ErrTxEnded (and wrapping fn's error, if
//     any) if fn ended the transaction: committed or rolled back it,
//     explicitly or implicitly. Run does not commit then, but what fn
//     wrote before the end may be durable, unfenced: check the data;
//   - an error matching fence.ErrLeaseExpired if the lease ran out before
//     commit, and fence.ErrReleased too if the ticket had already been
//     released (a ticket fences one Run: take a new one for each write);
//   - an error matching fence.ErrCommitUnknown, wrapping the driver error,
//     if COMMIT got no definite answer (the write may be durable);
//   - an error matching fence.ErrNotMigrated, wrapping the *pgconn.PgError
//     (SQLSTATE 42P01), if the high-water table does not exist: it names
//     the table and says to run pgxmigrations.Up(ctx, pool) (only the
//     fence's own statements are checked: fn's errors come back as they
//     are);
//   - validation errors of fence.NewPlan, or ErrNestedTx if db is a
//     pgx.Tx, before anything is sent;
//   - fence.ErrNilTicket for a nil ticket, also a nil *broker.Ticket,
//     before anything is sent (nothing to release);
//   - a *fence.ReleaseError if the release failed: it carries the outcome
//     above as Primary (nil if committed; see fence.Committed). After a
//     stale token, a release answered "not held" (broker.ErrNotHeld) is
//     expected and the *fence.StaleError is returned alone.
//
// If fn panics, Run rolls back, releases the ticket and re-panics.
// The ticket is released with a context that ignores ctx's cancellation.
// Run is safe for concurrent use if db is.
func Run(ctx context.Context, db Beginner, ticket fence.Ticket, fn func(pgx.Tx) error, opts ...fence.Option) error {
	return core.Run(ctx, driver(db), ticket, fn, opts)
}

// Guard performs only the check-and-bump, inside tx, a transaction the
// caller manages. It returns a *fence.StaleError if the token is not above
// the high-water of every resource; then the caller must roll back. It
// returns an error matching fence.ErrNotMigrated if the high-water table
// does not exist. After
// a nil return, the high-water rows stay locked until tx ends, and the
// caller must: do the protected write in tx without ending it, call
// CheckTx and fence.CheckLease right before commit (roll back if either
// fails), commit, and only then release the ticket. Guard never releases the ticket. After any error the transaction
// must be rolled back (Postgres has aborted it anyway). Call Guard once
// per transaction: a second call with the same ticket finds the
// high-water equal to the token and returns a *fence.StaleError. Under
// REPEATABLE READ or SERIALIZABLE, a concurrent committed bump makes Guard
// fail with SQLSTATE 40001.
func Guard(ctx context.Context, tx pgx.Tx, ticket fence.Ticket, opts ...fence.Option) error {
	if tx == nil {
		return errors.New("pgxfence: nil transaction")
	}
	plan, err := fence.NewPlan(ticket, opts...)
	if err != nil {
		return err
	}
	return guard(ctx, tx, plan)
}

type txAdapter struct{ tx pgx.Tx }

func (t txAdapter) Commit(ctx context.Context) error   { return t.tx.Commit(ctx) }
func (t txAdapter) Rollback(ctx context.Context) error { return t.tx.Rollback(ctx) }

// txBeginner is what Run begins its transaction with when it can check
// in the COMMIT's round trip: *pgxpool.Conn and *pgx.Conn, and the
// connection Run acquires from a *pgxpool.Pool.
type txBeginner interface {
	BeginTx(context.Context, pgx.TxOptions) (pgx.Tx, error)
}

// beginner returns the txBeginner for db, and the function that gives
// back a connection Run acquired (nil if none), or tb nil for any other
// Beginner (and for a nil pointer, whose Begin panics as before).
func beginner(ctx context.Context, db Beginner) (tb txBeginner, release func(), err error) {
	switch c := db.(type) {
	case *pgxpool.Pool:
		if c != nil {
			// Run holds the connection itself until the transaction is
			// over, not through a *pgxpool.Tx: that one gives it back to
			// the pool when fn calls tx.Commit or tx.Rollback, and the
			// transaction status read before the commit would then be
			// another caller's (a data race, and a wrong answer).
			pc, err := c.Acquire(ctx)
			if err != nil {
				return nil, nil, err
			}
			return pc.Conn(), pc.Release, nil
		}
	case *pgxpool.Conn:
		if c != nil {
			return c, nil, nil
		}
	case *pgx.Conn:
		if c != nil {
			return c, nil, nil
		}
	}
	return nil, nil, nil
}

// begin starts Run's transaction. For the Beginners whose BeginTx honours
// pgx.TxOptions.CommitQuery (*pgxpool.Pool, *pgxpool.Conn, *pgx.Conn) it
// sets commitCheckedSQL as the commit query and returns a checkedTx: the
// check that fn left the transaction open then rides in the COMMIT's round
// trip. Any other Beginner gets the plain commit, after a check of its own
// round trip (Driver.Ended).
func begin(ctx context.Context, db Beginner) (pgx.Tx, core.Tx, error) {
	if db == nil {
		return nil, nil, errors.New("nil db")
	}
	tb, release, err := beginner(ctx, db)
	if err != nil {
		return nil, nil, err
	}
	if tb == nil {
		tx, err := db.Begin(ctx)
		if err != nil {
			return nil, nil, err
		}
		return tx, txAdapter{tx}, nil
	}
	tx, err := tb.BeginTx(ctx, pgx.TxOptions{CommitQuery: commitCheckedSQL})
	if err != nil {
		if release != nil {
			release()
		}
		return nil, nil, err
	}
	return tx, &checkedTx{tx: tx, release: release}, nil
}

// beginGuard begins Run's transaction and checks and bumps the first
// resource's high-water in the same round trip: the BEGIN and the
// check-and-bump go to the server as one simple-protocol query (pgx's
// TxOptions.BeginQuery), so the fence costs no round trip of its own:
// an EXECUTE of staleSQL prepared once per connection, or staleSQL itself
// where the connection does not prepare statements. The query carries
// the resource and the token as literals (the resource hex-encoded, the
// token a number: nothing of the caller's is spliced in as SQL). A rejected token makes the statement fail with the stored
// high-water in its error (staleSQL), which aborts the transaction: the
// answer is the *fence.StaleError that Guard returns, without Guard's
// second query. The other resources, if any, are checked by Guard's own
// statements. It handles the Beginners that begin uses a checkedTx for,
// and tokens above 0 (token 0 is never stored: Guard only reads).
func beginGuard(ctx context.Context, db Beginner, plan fence.Plan) (pgx.Tx, core.Tx, bool, error) {
	if db == nil || plan.Token <= 0 || len(plan.Resources) == 0 {
		return nil, nil, false, nil
	}
	if _, nested := db.(pgx.Tx); nested {
		return nil, nil, false, nil
	}
	tb, release, err := beginner(ctx, db)
	if err != nil {
		return nil, nil, true, err
	}
	if tb == nil {
		return nil, nil, false, nil
	}
	r := plan.Resources[0]
	conn := connOf(tb)
	args := "decode('" + hex.EncodeToString([]byte(r)) + "', 'hex'), " + strconv.FormatInt(plan.Token, 10)
	literal := "BEGIN; " + staleSQL(plan.Table, args)
	query, prepared := literal, ""
	if mode := conn.Config().DefaultQueryExecMode; mode != pgx.QueryExecModeSimpleProtocol && mode != pgx.QueryExecModeExec {
		// Prepared once per connection (pgx remembers it: later calls
		// send nothing), so the server plans the bump once, not at
		// every call. A failed Prepare (a missing table, say) leaves
		// the literal statement, whose error is then the answer.
		name := preparedName(plan.Table)
		if _, err := conn.Prepare(ctx, name, staleSQL(plan.Table, "$1, $2")); err == nil {
			query, prepared = "BEGIN; EXECUTE "+name+"("+args+")", name
		}
	}
	tx, err := tb.BeginTx(ctx, pgx.TxOptions{BeginQuery: query, CommitQuery: commitCheckedSQL})
	var pgErr *pgconn.PgError
	if prepared != "" && errors.As(err, &pgErr) && pgErr.Code == "26000" && !conn.IsClosed() {
		// The prepared statement is gone (DEALLOCATE or DISCARD sent
		// behind pgx's back): nothing ran but the BEGIN. Forget it, and
		// send the literal statement.
		if _, rerr := conn.Exec(ctx, "ROLLBACK"); rerr == nil {
			_ = conn.Deallocate(ctx, prepared)
			tx, err = tb.BeginTx(ctx, pgx.TxOptions{BeginQuery: literal, CommitQuery: commitCheckedSQL})
		}
	}
	if err != nil {
		if !errors.As(err, &pgErr) || conn.IsClosed() {
			// The connection failed (pgx closed it, which rolls back
			// whatever began): nothing is open.
			if release != nil {
				release()
			}
			return nil, nil, true, err
		}
		// The server answered: the transaction may be open and aborted.
		aborted := &abortedTx{conn: conn, release: release}
		if hw, ok := staleHighWater(pgErr); ok {
			return nil, aborted, true, &fence.StaleError{Resource: r, Token: uint64(plan.Token), HighWater: hw}
		}
		if noTable(err) {
			return nil, aborted, true, notMigrated(plan.Table, err)
		}
		return nil, aborted, true, fmt.Errorf("pgxfence: check-and-bump %q: %w", r, err)
	}
	checked := &checkedTx{tx: tx, release: release}
	if len(plan.Resources) > 1 {
		rest := plan
		rest.Resources = plan.Resources[1:]
		if err := guard(ctx, tx, rest); err != nil {
			return nil, checked, true, err
		}
	}
	return tx, checked, true, nil
}

// connOf returns the *pgx.Conn of a txBeginner.
func connOf(tb txBeginner) *pgx.Conn {
	switch c := tb.(type) {
	case *pgx.Conn:
		return c
	case *pgxpool.Conn:
		return c.Conn()
	}
	return nil
}

// abortedTx is the transaction of a beginGuard whose check-and-bump
// failed: pgx returned no pgx.Tx, and the connection may be in an aborted
// transaction. Rollback ends it and gives back a connection Run acquired.
type abortedTx struct {
	conn    *pgx.Conn
	release func()
}

func (a *abortedTx) Commit(ctx context.Context) error {
	return errors.New("pgxfence: commit of a transaction whose check-and-bump failed")
}

func (a *abortedTx) Rollback(ctx context.Context) error {
	defer func() {
		if a.release != nil {
			a.release()
			a.release = nil
		}
	}()
	if _, err := a.conn.Exec(ctx, "ROLLBACK"); err != nil {
		// As pgx does when a rollback fails: the connection is closed,
		// which rolls back on the server.
		_ = a.conn.Close(ctx)
		return err
	}
	return nil
}

// staleMessage starts the text that staleSQL casts to a number when it
// rejects a token; the stored high-water follows it.
const staleMessage = "ticketing: stale token, high-water "

// staleSQL is beginGuard's check-and-bump for table, with args the
// resource and the token: literals, or $1, $2 to prepare it. It is upsertSQL, but a rejected token fails the statement instead
// of returning no row: the high-water it compared with (the row is
// locked, the latest version) is cast to a number with staleMessage
// before it, and PostgreSQL reports the text it could not cast (SQLSTATE
// 22P02). The CASE is evaluated per row: nothing is folded at planning.
func staleSQL(table, args string) string {
	return "INSERT INTO " + table + " AS f (resource, high_water, updated_at) VALUES (" + args + ", now()) " +
		"ON CONFLICT (resource) DO UPDATE SET high_water = CASE WHEN f.high_water < EXCLUDED.high_water THEN EXCLUDED.high_water " +
		"ELSE CAST('" + staleMessage + "' || f.high_water AS bigint) END, updated_at = EXCLUDED.updated_at " +
		"RETURNING f.high_water, set_config('" + markerName + "', '" + markerValue + "', true)"
}

// preparedName is the name beginGuard prepares staleSQL under for table.
func preparedName(table string) string {
	sum := sha256.Sum256([]byte(staleSQL(table, "$1, $2")))
	return "ticketing_fence_bump_" + hex.EncodeToString(sum[:8])
}

// staleHighWater returns the high-water that staleSQL put in its error,
// if pgErr is that error.
func staleHighWater(pgErr *pgconn.PgError) (uint64, bool) {
	if pgErr.Code != "22P02" {
		return 0, false
	}
	_, after, ok := strings.Cut(pgErr.Message, staleMessage)
	if !ok {
		return 0, false
	}
	end := 0
	for end < len(after) && after[end] >= '0' && after[end] <= '9' {
		end++
	}
	hw, err := strconv.ParseUint(after[:end], 10, 64)
	return hw, err == nil
}

// commitCheckedSQL is the commit query of Run's transaction: it commits
// only in Guard's transaction. The transaction-local marker that the
// check-and-bump set is there, or the cast fails at run time (SQLSTATE
// 22P02, endedMessage in the error) and PostgreSQL skips the COMMIT,
// leaving the transaction aborted; pgx then closes the connection (a pool
// replaces it). The CASE is not folded at planning: current_setting is
// not immutable.
const (
	endedMessage     = "ticketing: not the transaction the fence checked"
	commitCheckedSQL = "SELECT CAST(CASE current_setting('" + markerName + "', true) WHEN '" + markerValue + "' THEN '1' ELSE '" + endedMessage + "' END AS integer); COMMIT"
)

// checkedTx is Run's transaction begun with commitCheckedSQL as its commit
// query. release, if not nil, gives back the pool connection that Run
// acquired for it, once the transaction is over.
type checkedTx struct {
	tx      pgx.Tx
	release func()
}

func (c *checkedTx) status() byte { return c.tx.Conn().PgConn().TxStatus() }

func (c *checkedTx) done() {
	if c.release != nil {
		c.release()
		c.release = nil
	}
}

func (c *checkedTx) EndedLocally() bool { return c.status() == 'I' }

func (c *checkedTx) CommitChecked(ctx context.Context) error {
	defer c.done()
	if c.status() == 'E' {
		// A statement of fn failed and fn returned nil: nothing can
		// commit. The commit query would fail too, and pgx would close
		// the connection; a rollback keeps it, and the answer is the one
		// a plain COMMIT gets.
		if err := c.tx.Rollback(context.WithoutCancel(ctx)); errors.Is(err, pgx.ErrTxClosed) {
			// fn closed the tx itself (tx.Commit or tx.Rollback) and
			// then failed in a transaction of its own: fn's commit may
			// be durable.
			return fmt.Errorf("%w: %w", core.ErrEndedAtCommit, err)
		}
		return pgx.ErrTxCommitRollback
	}
	err := c.tx.Commit(ctx)
	if errors.Is(err, pgx.ErrTxClosed) {
		// fn called tx.Commit or tx.Rollback and then began a
		// transaction of its own on tx.Conn(): nothing was sent, and fn
		// ended Guard's transaction.
		return fmt.Errorf("%w: %w", core.ErrEndedAtCommit, err)
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "22P02" && strings.Contains(pgErr.Message, endedMessage) {
		return fmt.Errorf("%w: %w", core.ErrEndedAtCommit, err)
	}
	return err
}

func (c *checkedTx) Commit(ctx context.Context) error {
	defer c.done()
	return c.tx.Commit(ctx)
}

func (c *checkedTx) Rollback(ctx context.Context) error {
	defer c.done()
	return c.tx.Rollback(ctx)
}

func driver(db Beginner) core.Driver[pgx.Tx] {
	return core.Driver[pgx.Tx]{
		Pkg: "pgxfence",
		Check: func() error {
			if _, nested := db.(pgx.Tx); nested {
				return ErrNestedTx
			}
			return nil
		},
		Begin: func(ctx context.Context) (pgx.Tx, core.Tx, error) {
			return begin(ctx, db)
		},
		BeginGuard: func(ctx context.Context, plan fence.Plan) (pgx.Tx, core.Tx, bool, error) {
			return beginGuard(ctx, db, plan)
		},
		Guard:    guard,
		Ended:    ended,
		Definite: definite,
	}
}

func guard(ctx context.Context, tx pgx.Tx, plan fence.Plan) error {
	upsert := upsertSQL(plan.Table)
	for _, r := range plan.Resources {
		var (
			hw     int64
			marker string
		)
		if plan.Token > 0 { // token 0 is below every high-water: never stored
			err := tx.QueryRow(ctx, upsert, []byte(r), plan.Token).Scan(&hw, &marker)
			if err == nil {
				continue
			}
			if !errors.Is(err, pgx.ErrNoRows) {
				if noTable(err) {
					return notMigrated(plan.Table, err)
				}
				return fmt.Errorf("pgxfence: check-and-bump %q: %w", r, err)
			}
		}
		// Rejected. The row is locked by the upsert; read its value (a new
		// snapshot under READ COMMITTED sees what the upsert compared with;
		// under REPEATABLE READ the upsert would have failed with 40001
		// had the row changed since the snapshot).
		err := tx.QueryRow(ctx, selectSQL(plan.Table), []byte(r)).Scan(&hw)
		if err != nil && !(plan.Token == 0 && errors.Is(err, pgx.ErrNoRows)) {
			if noTable(err) {
				return notMigrated(plan.Table, err)
			}
			return fmt.Errorf("pgxfence: read high-water of %q: %w", r, err)
		}
		return &fence.StaleError{Resource: r, Token: uint64(plan.Token), HighWater: uint64(hw)}
	}
	return nil
}

// noTable reports whether err, the error of one of the fence's own
// statements (which name no table but the high-water table), says that
// the table does not exist: SQLSTATE 42P01, undefined_table.
func noTable(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "42P01"
}

// notMigrated is the fence.ErrNotMigrated error for table, wrapping err.
func notMigrated(table string, err error) error {
	return core.NotMigrated("pgxfence", table,
		"pgxmigrations.Up(ctx, pool) (package github.com/ticketing-dev/ticketing/migrations/pgxmigrations)",
		"migrations.Files(fence.Postgres)", err)
}

// upsertSQL is the check-and-bump statement for table ($1 resource bytea,
// $2 token bigint). It returns a row only when the token was accepted; it
// locks the resource's row until the transaction ends either way. An
// accepted row also sets the transaction-local marker that ended checks:
// set_config(..., true) lasts until the transaction ends (and is undone
// by a rollback to a savepoint taken before it).
func upsertSQL(table string) string {
	return "INSERT INTO " + table + " AS f (resource, high_water, updated_at) VALUES ($1, $2, now()) " +
		"ON CONFLICT (resource) DO UPDATE SET high_water = EXCLUDED.high_water, updated_at = EXCLUDED.updated_at " +
		"WHERE f.high_water < EXCLUDED.high_water RETURNING f.high_water, set_config('" + markerName + "', '" + markerValue + "', true)"
}

// The transaction-local setting that marks a transaction fenced by Guard.
const (
	markerName  = "ticketing.fence_tx"
	markerValue = "fenced"
	markerSQL   = "SELECT coalesce(current_setting('" + markerName + "', true), '')"
)

// ended reports whether tx is no longer the transaction Guard ran in. The
// connection's transaction status answers at no cost when no transaction
// is open ('I': fn committed or rolled back) or when it failed ('E': still
// ours, aborted). In a transaction ('T') it may be a new one that fn
// began after ending Guard's: the transaction-local marker tells, at the
// cost of one round trip.
func ended(ctx context.Context, tx pgx.Tx) (bool, error) {
	if c := tx.Conn(); c != nil && c.PgConn() != nil {
		switch c.PgConn().TxStatus() {
		case 'I':
			return true, nil
		case 'E':
			return false, nil
		}
	}
	var m string
	err := tx.QueryRow(ctx, markerSQL).Scan(&m)
	if errors.Is(err, pgx.ErrTxClosed) {
		return true, nil // fn called tx.Commit or tx.Rollback
	}
	if err != nil {
		return false, err
	}
	return m != markerValue, nil
}

// CheckTx reports whether tx is still the transaction in which Guard
// checked and raised the high-water. Call it after the last protected
// write, right before committing a transaction you fenced with Guard
// (with fence.CheckLease): it returns an error matching fence.ErrTxEnded
// if the transaction was committed or rolled back since Guard (then roll
// back what is open and check the data: the writes before the end may be
// durable, those after it were not fenced), nil if it is still open, or
// the database error if it could not tell (roll back). It costs at most
// one round trip and may be called more than once. Run does this itself.
func CheckTx(ctx context.Context, tx pgx.Tx) error {
	if tx == nil {
		return errors.New("pgxfence: nil transaction")
	}
	end, err := ended(ctx, tx)
	if err != nil {
		return fmt.Errorf("pgxfence: check the transaction: %w", err)
	}
	if end {
		return core.TxEnded("pgxfence", nil)
	}
	return nil
}

func selectSQL(table string) string {
	return "SELECT high_water FROM " + table + " WHERE resource = $1"
}

// definite reports whether a commit error is an answer from the server
// that means "not committed".
func definite(err error) bool {
	if errors.Is(err, pgx.ErrTxCommitRollback) {
		return true
	}
	if pgconn.SafeToRetry(err) {
		// Failed before anything was sent (the connection was busy or
		// closed, the context already done): the COMMIT never reached
		// the server, and pgx closed the connection, which rolls back.
		return true
	}
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		return false
	}
	// Class 08 (connection exception) and 57P0x (the server is going away,
	// e.g. pg_terminate_backend) say nothing certain about the commit.
	switch {
	case len(pgErr.Code) >= 2 && pgErr.Code[:2] == "08":
		return false
	case len(pgErr.Code) == 5 && pgErr.Code[:4] == "57P0":
		return false
	}
	return true
}
