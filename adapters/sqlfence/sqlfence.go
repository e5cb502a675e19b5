package sqlfence

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"

	"github.com/go-sql-driver/mysql"

	"github.com/ticketing-dev/ticketing/adapters/internal/core"
	"github.com/ticketing-dev/ticketing/fence"
)

// Dialect is fence.Dialect, the module's one dialect type: pass
// fence.Postgres, fence.MySQL or fence.SQLite. The alias and the
// constants below keep code written against sqlfence's names compiling.
type Dialect = fence.Dialect

// The dialects, the same values as fence's.
//
// Deprecated: use fence.Postgres, fence.MySQL and fence.SQLite.
const (
	Postgres = fence.Postgres
	MySQL    = fence.MySQL
	SQLite   = fence.SQLite
)

// ErrDialect is fence.ErrDialect: errors.Is matches either name.
//
// Deprecated: use fence.ErrDialect.
var ErrDialect = fence.ErrDialect

// Beginner starts a transaction. *sql.DB and *sql.Conn satisfy it.
type Beginner interface {
	BeginTx(ctx context.Context, opts *sql.TxOptions) (*sql.Tx, error)
}

// Run fences fn with ticket in one transaction of db, for dialect d: begin,
// check-and-bump of the high-water of every resource (default: the
// ticket's key), fn, lease check, commit; then it releases the ticket, on
// every path (also when fn fails or panics), exactly once.
//
// Before retrying on an error, check fence.Committed(err): an error does
// not always mean that nothing was written. After a commit, a release
// that failed (the lock service unreachable, say) still returns an error,
// a *fence.ReleaseError with a nil Primary, for which Committed is true:
// the write is durable, do not redo it (the lock lingers until its lease
// ends).
//
//	err := sqlfence.Run(ctx, db, fence.Postgres, ticket, fn)
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
//   - an error matching fence.ErrNotMigrated, wrapping the driver error,
//     if the high-water table does not exist: it names the table and says
//     to run migrations.Up(ctx, db, d) (only the fence's own statements
//     are checked: fn's errors come back as they are);
//   - an error matching fence.ErrDialectMismatch, naming d and the
//     database, if d is not the database's dialect: before anything is
//     sent when the Go type of db's driver tells (a *sql.DB or *sql.Conn
//     of pgx, lib/pq, go-sql-driver/mysql or a known SQLite driver; known
//     once per driver type, no round trip), otherwise when the database
//     rejects the fence's statement as not its SQL (wrapping that error);
//   - fence.ErrDialect or a validation error of fence.NewPlan, before anything
//     is sent;
//   - fence.ErrNilTicket for a nil ticket, also a nil *broker.Ticket,
//     before anything is sent (nothing to release);
//   - a *fence.ReleaseError if the release failed: it carries the outcome
//     above as Primary (nil if committed; see fence.Committed). After a
//     stale token, a release answered "not held" (broker.ErrNotHeld) is
//     expected and the *fence.StaleError is returned alone.
//
// If fn panics, Run rolls back, releases the ticket and re-panics.
// The transaction uses the driver's default isolation level (see the
// package documentation). The ticket is released with a context that
// ignores ctx's cancellation. Run is safe for concurrent use if db is.
func Run(ctx context.Context, db Beginner, d Dialect, ticket fence.Ticket, fn func(*sql.Tx) error, opts ...fence.Option) error {
	return core.Run(ctx, driver(db, d), ticket, fn, opts)
}

// Guard performs only the check-and-bump, inside tx, a transaction the
// caller manages, for dialect d. It returns a *fence.StaleError if the
// token is not above the high-water of every resource; then the caller
// must roll back. It returns an error matching fence.ErrNotMigrated if the
// high-water table does not exist, and one matching
// fence.ErrDialectMismatch if the database rejects the statement of d as
// not its SQL (tx's driver is not checked). After a nil return, the high-water rows stay locked until
// tx ends, and the caller must: do the protected write in tx without
// ending it, call CheckTx and fence.CheckLease right before commit (roll
// back if either fails), commit, and only then release the ticket. On
// MySQL and SQLite, Guard leaves a savepoint in tx for CheckTx; do not
// release or roll back to it. It is nested in any savepoint of yours
// that is open when Guard runs: releasing (or rolling back to) that one
// destroys Guard's too, and CheckTx then reports fence.ErrTxEnded
// although the transaction is open; call Guard outside your savepoints. Guard never releases the ticket. After any
// error the transaction must be rolled back. Call Guard once per
// transaction: a second call with the same ticket finds the high-water
// equal to the token and returns a *fence.StaleError. See package fence
// for the outcome at each isolation level.
func Guard(ctx context.Context, tx *sql.Tx, d Dialect, ticket fence.Ticket, opts ...fence.Option) error {
	if tx == nil {
		return errors.New("sqlfence: nil transaction")
	}
	if _, err := statements(d, fence.DefaultTable); err != nil {
		return err
	}
	plan, err := fence.NewPlan(ticket, opts...)
	if err != nil {
		return err
	}
	return guard(ctx, tx, d, plan)
}

type txAdapter struct{ tx *sql.Tx }

func (t txAdapter) Commit(context.Context) error   { return t.tx.Commit() }
func (t txAdapter) Rollback(context.Context) error { return t.tx.Rollback() }

func driver(db Beginner, d Dialect) core.Driver[*sql.Tx] {
	return core.Driver[*sql.Tx]{
		Pkg: "sqlfence",
		Check: func() error {
			if _, err := statements(d, fence.DefaultTable); err != nil {
				return err
			}
			return checkDialect(db, d)
		},
		Begin: func(ctx context.Context) (*sql.Tx, core.Tx, error) {
			if db == nil {
				return nil, nil, errors.New("nil db")
			}
			tx, err := db.BeginTx(ctx, nil)
			if err != nil {
				return nil, nil, err
			}
			return tx, txAdapter{tx}, nil
		},
		Guard: func(ctx context.Context, tx *sql.Tx, plan fence.Plan) error {
			return guard(ctx, tx, d, plan)
		},
		Ended: func(ctx context.Context, tx *sql.Tx) (bool, error) {
			return ended(ctx, tx, d)
		},
		Definite: definite,
	}
}

// rejectedFlag is the insert id the MySQL upsert reports when it rejects
// the token: LAST_INSERT_ID(18446744073709551615), the largest BIGINT
// UNSIGNED, which go-sql-driver/mysql returns as int64 -1.
const (
	rejectedFlagSQL       = "18446744073709551615"
	rejectedFlag    int64 = -1
)

type stmts struct {
	upsert string // check-and-bump
	read   string // locking read of the high-water, after a rejection
	// mark, if not empty, marks the transaction as Guard's after the
	// accepted bumps (PostgreSQL marks it in upsert itself).
	mark string
}

// How ended recognises Guard's transaction. PostgreSQL: a
// transaction-local setting, set by the upsert. MySQL/MariaDB and SQLite:
// a savepoint, which every COMMIT or ROLLBACK (explicit or implicit)
// destroys and a new transaction does not have.
const (
	pgMarkerName  = "ticketing.fence_tx"
	pgMarkerValue = "fenced"
	pgMarkerSQL   = "SELECT coalesce(current_setting('" + pgMarkerName + "', true), '')"
	savepoint     = "ticketing_fence_tx"
)

func statements(d Dialect, table string) (stmts, error) {
	switch d {
	case fence.Postgres:
		return stmts{
			upsert: "INSERT INTO " + table + " AS f (resource, high_water, updated_at) VALUES ($1, $2, now()) " +
				"ON CONFLICT (resource) DO UPDATE SET high_water = EXCLUDED.high_water, updated_at = EXCLUDED.updated_at " +
				"WHERE f.high_water < EXCLUDED.high_water RETURNING f.high_water, set_config('" + pgMarkerName + "', '" + pgMarkerValue + "', true)",
			read: "SELECT high_water FROM " + table + " WHERE resource = $1",
		}, nil
	case fence.MySQL:
		// The token is passed four times (see bump) instead of being
		// read back with VALUES(col), which MySQL deprecates since 8.0.20
		// (warning 1287, "will be removed in a future release"), and
		// instead of a row alias (INSERT ... AS new), which MySQL has
		// since 8.0.19 but MariaDB does not understand at all: plain
		// parameters work on every MySQL and MariaDB version.
		//
		// The assignments run left to right, so updated_at must come
		// first: it compares with the old high_water. In the rejected
		// case the row is left unchanged (0 affected rows) and
		// LAST_INSERT_ID(flag) sets the statement's insert id to
		// rejectedFlag, which does not depend on the clientFoundRows
		// setting and which no AUTO_INCREMENT column hands out (a user
		// table with one would report its new id on an accepted insert).
		return stmts{
			upsert: "INSERT INTO " + table + " (resource, high_water, updated_at) VALUES (?, ?, CURRENT_TIMESTAMP(6)) " +
				"ON DUPLICATE KEY UPDATE " +
				"updated_at = IF(high_water < ?, CURRENT_TIMESTAMP(6), updated_at), " +
				"high_water = IF(high_water < ?, ?, high_water + 0 * LAST_INSERT_ID(" + rejectedFlagSQL + "))",
			// A locking read is a "current read" under REPEATABLE READ: it
			// sees the latest committed value, not the snapshot.
			read: "SELECT high_water FROM " + table + " WHERE resource = ? FOR UPDATE",
			mark: "SAVEPOINT " + savepoint,
		}, nil
	case fence.SQLite:
		return stmts{
			upsert: "INSERT INTO " + table + " AS f (resource, high_water, updated_at) VALUES (?, ?, strftime('%Y-%m-%dT%H:%M:%fZ', 'now')) " +
				"ON CONFLICT (resource) DO UPDATE SET high_water = excluded.high_water, updated_at = excluded.updated_at " +
				"WHERE f.high_water < excluded.high_water RETURNING high_water",
			read: "SELECT high_water FROM " + table + " WHERE resource = ?",
			mark: "SAVEPOINT " + savepoint,
		}, nil
	}
	return stmts{}, fmt.Errorf("%w: %v", fence.ErrDialect, d)
}

func guard(ctx context.Context, tx *sql.Tx, d Dialect, plan fence.Plan) error {
	st, err := statements(d, plan.Table)
	if err != nil {
		return err
	}
	for _, r := range plan.Resources {
		accepted := false
		if plan.Token > 0 { // token 0 is below every high-water: never stored
			accepted, err = bump(ctx, tx, d, st, r, plan.Token)
			if err != nil {
				if ferr := fenceError(err, d, plan.Table); ferr != nil {
					return ferr
				}
				return fmt.Errorf("sqlfence: check-and-bump %q: %w", r, err)
			}
		}
		if accepted {
			continue
		}
		var hw int64
		err := tx.QueryRowContext(ctx, st.read, []byte(r)).Scan(&hw)
		if err != nil && !(plan.Token == 0 && errors.Is(err, sql.ErrNoRows)) {
			if ferr := fenceError(err, d, plan.Table); ferr != nil {
				return ferr
			}
			return fmt.Errorf("sqlfence: read high-water of %q: %w", r, err)
		}
		return &fence.StaleError{Resource: r, Token: uint64(plan.Token), HighWater: uint64(hw)}
	}
	if st.mark != "" {
		if _, err := tx.ExecContext(ctx, st.mark); err != nil {
			return fmt.Errorf("sqlfence: mark the transaction: %w", err)
		}
	}
	return nil
}

// ended reports whether tx is no longer the transaction Guard ran in.
// On MySQL and SQLite it releases Guard's savepoint (RELEASE SAVEPOINT
// fails if a COMMIT or ROLLBACK destroyed it, also when a new transaction
// has begun since); only COMMIT or ROLLBACK may follow.
func ended(ctx context.Context, tx *sql.Tx, d Dialect) (bool, error) {
	if err := ctx.Err(); err != nil {
		// database/sql rolls the transaction back when ctx ends: ErrTxDone
		// would not mean that fn ended it.
		return false, err
	}
	var err error
	switch d {
	case fence.Postgres:
		var m string
		if err = tx.QueryRowContext(ctx, pgMarkerSQL).Scan(&m); err == nil {
			return m != pgMarkerValue, nil
		}
	case fence.MySQL, fence.SQLite:
		if _, err = tx.ExecContext(ctx, "RELEASE SAVEPOINT "+savepoint); err == nil {
			return false, nil
		}
		if noSavepoint(err) {
			return true, nil
		}
	default:
		return false, fmt.Errorf("%w: %v", fence.ErrDialect, d)
	}
	if errors.Is(err, sql.ErrTxDone) && ctx.Err() == nil {
		return true, nil // fn called tx.Commit or tx.Rollback
	}
	return false, err
}

// noSavepoint reports whether err says that Guard's savepoint does not
// exist: MySQL/MariaDB error 1305 (ER_SP_DOES_NOT_EXIST), SQLite's
// SQLITE_ERROR "no such savepoint".
func noSavepoint(err error) bool {
	var myErr *mysql.MySQLError
	if errors.As(err, &myErr) {
		return myErr.Number == 1305
	}
	var liteErr interface{ Code() int }
	return errors.As(err, &liteErr) && liteErr.Code()&0xff == 1 && strings.Contains(err.Error(), "no such savepoint")
}

// CheckTx reports whether tx is still the transaction in which Guard (with
// dialect d) checked and raised the high-water. Call it after the last
// protected write, right before committing a transaction you fenced with
// Guard (with fence.CheckLease): it returns an error matching
// fence.ErrTxEnded if the transaction was committed or rolled back since
// Guard, explicitly or implicitly (then roll back what is open and check
// the data: the writes before the end may be durable, those after it were
// not fenced), nil if it is still open, or the database error if it could
// not tell (roll back). It costs one statement (two on MySQL and SQLite,
// where it releases and sets again the savepoint Guard set) and may be
// called more than once. Run does this itself.
func CheckTx(ctx context.Context, tx *sql.Tx, d Dialect) error {
	if tx == nil {
		return errors.New("sqlfence: nil transaction")
	}
	st, err := statements(d, fence.DefaultTable)
	if err != nil {
		return err
	}
	end, err := ended(ctx, tx, d)
	if err != nil {
		return fmt.Errorf("sqlfence: check the transaction: %w", err)
	}
	if end {
		return core.TxEnded("sqlfence", nil)
	}
	if st.mark != "" {
		if _, err := tx.ExecContext(ctx, st.mark); err != nil {
			return fmt.Errorf("sqlfence: mark the transaction: %w", err)
		}
	}
	return nil
}

func bump(ctx context.Context, tx *sql.Tx, d Dialect, st stmts, r string, token int64) (bool, error) {
	if d != MySQL {
		var hw int64
		dest := []any{&hw}
		if d == Postgres {
			var marker string
			dest = append(dest, &marker)
		}
		err := tx.QueryRowContext(ctx, st.upsert, []byte(r), token).Scan(dest...)
		if errors.Is(err, sql.ErrNoRows) {
			return false, nil
		}
		return err == nil, err
	}
	res, err := tx.ExecContext(ctx, st.upsert, []byte(r), token, token, token, token)
	if err != nil {
		return false, err
	}
	n, err := res.RowsAffected()
	if err != nil {
		return false, err
	}
	id, err := res.LastInsertId()
	if err != nil {
		return false, err
	}
	// 1 = inserted, 2 = updated; 0 = unchanged (rejected). With
	// clientFoundRows=true an unchanged row also counts 1, hence the flag.
	return (n == 1 || n == 2) && id != rejectedFlag, nil
}

// definite reports whether a commit error is an answer from the database
// that means "not committed".
func definite(err error) bool {
	// *pgconn.PgError (pgx stdlib).
	var pgErr interface{ SQLState() string }
	if errors.As(err, &pgErr) {
		c := pgErr.SQLState()
		return !(len(c) >= 2 && c[:2] == "08") && !(len(c) == 5 && c[:4] == "57P0")
	}
	var myErr *mysql.MySQLError
	if errors.As(err, &myErr) {
		switch myErr.Number {
		case 1053, 1927, 2006, 2013: // server shutdown, connection killed, gone away, lost
			return false
		}
		return true
	}
	// *sqlite.Error (modernc.org/sqlite): SQLite runs in-process, its
	// answers are definite; a failed COMMIT is rolled back by Run.
	var liteErr interface{ Code() int }
	return errors.As(err, &liteErr)
}
