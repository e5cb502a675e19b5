package gormfence

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"gorm.io/gorm"

	"github.com/ticketing-dev/ticketing/adapters/sqlfence"
	"github.com/ticketing-dev/ticketing/fence"
)

// ErrNestedTx is returned (wrapped) by Run when db is already a GORM
// transaction (the result of db.Begin, or the tx of db.Transaction): Run
// would have to commit it, which is the caller's to do. Inside your own
// transaction use Guard and CheckTx, and release the ticket after your
// commit.
var ErrNestedTx = errors.New("gormfence: db is already in a transaction")

// Dialect returns the fence dialect of db's GORM dialector, by its Name:
// "postgres" (gorm.io/driver/postgres), "mysql" (gorm.io/driver/mysql,
// also for MariaDB) and "sqlite" (github.com/glebarez/sqlite,
// gorm.io/driver/sqlite). Any other name, or a nil db, returns an error
// matching fence.ErrDialect.
func Dialect(db *gorm.DB) (fence.Dialect, error) {
	if db == nil || db.Dialector == nil {
		return 0, fmt.Errorf("gormfence: %w: no GORM dialector (nil db?)", fence.ErrDialect)
	}
	switch name := db.Dialector.Name(); name {
	case "postgres":
		return fence.Postgres, nil
	case "mysql":
		return fence.MySQL, nil
	case "sqlite":
		return fence.SQLite, nil
	default:
		return 0, fmt.Errorf("gormfence: %w: GORM dialector %q (the fence knows postgres, mysql and sqlite)", fence.ErrDialect, name)
	}
}

// Run fences fn with ticket in one GORM transaction of db: begin (GORM's
// db.Begin, with db's settings), check-and-bump of the high-water of every
// resource (default: the ticket's key) on that transaction, fn with the
// transaction as a *gorm.DB, lease check, commit; then it releases the
// ticket, on every path (also when fn fails or panics), exactly once.
// Everything fn does through tx is in the fenced transaction; fn must not
// call tx.Commit or tx.Rollback.
//
// The flow, the checks and the outcomes are package sqlfence's (Run
// drives sqlfence.Run on the *sql.Tx under GORM's transaction), with the
// dialect taken from db's dialector (see Dialect): nil if committed and
// released; a *fence.StaleError if the token was not above a stored
// high-water (nothing written); fn's error as is (rolled back); an error
// matching fence.ErrTxEnded if fn ended the transaction;
// fence.ErrLeaseExpired if the lease ran out before commit;
// fence.ErrCommitUnknown if COMMIT got no definite answer;
// fence.ErrNotMigrated if the high-water table does not exist; a
// *fence.ReleaseError if the release failed (fence.Committed tells
// whether the write is durable). An unknown dialector returns an error
// matching fence.ErrDialect, and a db already in a transaction one
// matching ErrNestedTx, before anything is sent; the ticket is released
// then too. If fn panics, Run rolls back, releases the ticket and
// re-panics.
//
//	err := gormfence.Run(ctx, db, ticket, func(tx *gorm.DB) error {
//		return tx.Model(&Account{}).Where("id = ?", id).
//			Update("balance", gorm.Expr("balance - ?", amount)).Error
//	})
//	switch {
//	case fence.Committed(err): // done
//	case errors.Is(err, fence.ErrCommitUnknown), errors.Is(err, fence.ErrTxEnded):
//		// maybe written: check the data first
//	default: // rolled back, nothing written
//	}
func Run(ctx context.Context, db *gorm.DB, ticket fence.Ticket, fn func(tx *gorm.DB) error, opts ...fence.Option) error {
	d, derr := Dialect(db)
	b := &beginner{db: db}
	if derr == nil {
		if _, ok := db.Statement.ConnPool.(gorm.TxCommitter); ok {
			derr = ErrNestedTx
		}
	}
	if derr != nil {
		// sqlfence.Run refuses dialect 0 before anything is sent and
		// releases the ticket, as it does for its own refusals.
		err := sqlfence.Run(ctx, b, 0, ticket, func(*sql.Tx) error { return nil }, opts...)
		var rerr *fence.ReleaseError
		if errors.As(err, &rerr) {
			rerr.Primary = derr
			return rerr
		}
		if errors.Is(err, fence.ErrNilTicket) {
			return err
		}
		return derr
	}
	return sqlfence.Run(ctx, b, d, ticket, func(*sql.Tx) error {
		return fn(b.tx)
	}, opts...)
}

// beginner begins one GORM transaction for sqlfence.Run and keeps it, so
// that fn gets the *gorm.DB whose *sql.Tx the fence checks.
type beginner struct {
	db *gorm.DB
	tx *gorm.DB
}

func (b *beginner) BeginTx(ctx context.Context, opts *sql.TxOptions) (*sql.Tx, error) {
	var tx *gorm.DB
	if opts != nil {
		tx = b.db.WithContext(ctx).Begin(opts)
	} else {
		tx = b.db.WithContext(ctx).Begin()
	}
	if tx.Error != nil {
		return nil, tx.Error
	}
	stx, err := SQLTx(tx)
	if err != nil {
		tx.Rollback()
		return nil, err
	}
	b.tx = tx
	return stx, nil
}

// SQLTx returns the *sql.Tx under tx, a GORM transaction (from db.Begin
// or db.Transaction, also with PrepareStmt), for sqlfence.Guard and
// sqlfence.CheckTx. It returns an error if tx is not in a database/sql
// transaction.
func SQLTx(tx *gorm.DB) (*sql.Tx, error) {
	if tx == nil || tx.Statement == nil {
		return nil, errors.New("gormfence: nil transaction")
	}
	pool := tx.Statement.ConnPool
	if p, ok := pool.(*gorm.PreparedStmtTX); ok {
		pool = p.Tx
	}
	if stx, ok := pool.(*sql.Tx); ok && stx != nil {
		return stx, nil
	}
	return nil, fmt.Errorf("gormfence: not a database/sql transaction: %T", pool)
}

// Guard performs only the check-and-bump inside tx, a GORM transaction the
// caller manages (db.Begin or db.Transaction): sqlfence.Guard on its
// *sql.Tx, for the dialect of tx's dialector. The caller must then do the
// protected write in tx, call CheckTx and fence.CheckLease right before
// commit (roll back if either fails), commit, and only then release the
// ticket. See sqlfence.Guard.
func Guard(ctx context.Context, tx *gorm.DB, ticket fence.Ticket, opts ...fence.Option) error {
	d, err := Dialect(tx)
	if err != nil {
		return err
	}
	stx, err := SQLTx(tx)
	if err != nil {
		return err
	}
	return sqlfence.Guard(ctx, stx, d, ticket, opts...)
}

// CheckTx reports whether tx is still the transaction in which Guard
// checked and raised the high-water: sqlfence.CheckTx on its *sql.Tx.
func CheckTx(ctx context.Context, tx *gorm.DB) error {
	d, err := Dialect(tx)
	if err != nil {
		return err
	}
	stx, err := SQLTx(tx)
	if err != nil {
		return err
	}
	return sqlfence.CheckTx(ctx, stx, d)
}
