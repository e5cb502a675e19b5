package migrations

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/pressly/goose/v3/lock"

	"github.com/ticketing-dev/ticketing/fence"
)

// lockKey identifies the migration lock: the Postgres advisory lock key
// and the MySQL lock name. Distinct from goose's default, so the
// application's own goose migrations never wait for ours.
const (
	lockKey   int64 = 0x7469636b65746e67 // "ticketng"
	lockName        = "ticketing_goose_version"
	lockTable       = "ticketing_goose_lock"
	// sqliteStale is when an SQLite lock row left by a crashed process is
	// taken over.
	sqliteStale = 5 * time.Minute
	// pollInterval is how often an SQLite or MySQL lock is re-tried.
	pollInterval = 25 * time.Millisecond
)

func newLocker(d fence.Dialect) lock.SessionLocker {
	switch d {
	case fence.MySQL:
		return mysqlLocker{}
	case fence.SQLite:
		return sqliteLocker{}
	}
	return pgLocker{}
}

// pgLocker takes a session-level advisory lock, waiting in the server (no
// polling); cancelling ctx cancels the wait.
type pgLocker struct{}

func (pgLocker) SessionLock(ctx context.Context, conn *sql.Conn) error {
	if _, err := conn.ExecContext(ctx, "SELECT pg_advisory_lock($1)", lockKey); err != nil {
		return fmt.Errorf("migrations: lock: %w", err)
	}
	return nil
}

func (pgLocker) SessionUnlock(ctx context.Context, conn *sql.Conn) error {
	if _, err := conn.ExecContext(ctx, "SELECT pg_advisory_unlock($1)", lockKey); err != nil {
		return fmt.Errorf("migrations: unlock: %w", err)
	}
	return nil
}

// mysqlLocker takes a named lock with GET_LOCK, which is tied to the
// session and freed if the connection dies. It waits in the server in
// 1-second slices so that ctx is honoured.
type mysqlLocker struct{}

func (mysqlLocker) SessionLock(ctx context.Context, conn *sql.Conn) error {
	for {
		var got sql.NullInt64
		if err := conn.QueryRowContext(ctx, "SELECT GET_LOCK(?, 1)", lockName).Scan(&got); err != nil {
			return fmt.Errorf("migrations: lock: %w", err)
		}
		if got.Valid && got.Int64 == 1 {
			return nil
		}
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("migrations: lock: %w", err)
		}
	}
}

func (mysqlLocker) SessionUnlock(ctx context.Context, conn *sql.Conn) error {
	if _, err := conn.ExecContext(ctx, "SELECT RELEASE_LOCK(?)", lockName); err != nil {
		return fmt.Errorf("migrations: unlock: %w", err)
	}
	return nil
}

// sqliteLocker has no server to wait in: it claims a row in a lock table,
// polling. A row older than sqliteStale (left by a crashed process) is
// taken over. Only SQLite's "busy" and "locked" errors (another
// connection is writing) are retried; any other error, such as the syntax
// error of a database that is not SQLite, is returned at once.
type sqliteLocker struct{}

func (sqliteLocker) SessionLock(ctx context.Context, conn *sql.Conn) error {
	var last error
	for {
		ok, err := sqliteTryLock(ctx, conn)
		if err == nil && ok {
			return nil
		}
		if err != nil {
			if !sqliteBusy(err) {
				return fmt.Errorf("migrations: lock: %w", err)
			}
			last = err
		}
		select {
		case <-ctx.Done():
			if last != nil {
				return fmt.Errorf("migrations: lock: %w (last error: %v)", ctx.Err(), last)
			}
			return fmt.Errorf("migrations: lock: %w", ctx.Err())
		case <-time.After(pollInterval):
		}
	}
}

// sqliteBusy reports whether err is SQLITE_BUSY or SQLITE_LOCKED (primary
// codes 5 and 6), through the driver's Code method (modernc.org/sqlite,
// and the extended codes of others) or the standard message.
func sqliteBusy(err error) bool {
	var c interface{ Code() int }
	if errors.As(err, &c) {
		if code := c.Code() & 0xff; code == 5 || code == 6 {
			return true
		}
	}
	msg := err.Error()
	for _, s := range []string{"SQLITE_BUSY", "SQLITE_LOCKED", "database is locked", "database table is locked"} {
		if strings.Contains(msg, s) {
			return true
		}
	}
	return false
}

func sqliteTryLock(ctx context.Context, conn *sql.Conn) (bool, error) {
	if _, err := conn.ExecContext(ctx, "CREATE TABLE IF NOT EXISTS "+lockTable+
		" (id INTEGER NOT NULL PRIMARY KEY, locked_at INTEGER NOT NULL)"); err != nil {
		return false, err
	}
	now := time.Now()
	res, err := conn.ExecContext(ctx, "INSERT INTO "+lockTable+" (id, locked_at) VALUES (1, ?) "+
		"ON CONFLICT (id) DO UPDATE SET locked_at = excluded.locked_at WHERE locked_at < ?",
		now.UnixMilli(), now.Add(-sqliteStale).UnixMilli())
	if err != nil {
		return false, err
	}
	n, err := res.RowsAffected()
	return n == 1, err
}

func (sqliteLocker) SessionUnlock(ctx context.Context, conn *sql.Conn) error {
	if _, err := conn.ExecContext(ctx, "DELETE FROM "+lockTable+" WHERE id = 1"); err != nil {
		return fmt.Errorf("migrations: unlock: %w", err)
	}
	return nil
}
