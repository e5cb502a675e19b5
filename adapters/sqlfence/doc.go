// Package sqlfence fences writes made through database/sql with a lock
// ticket's token, in the same transaction as the write, for PostgreSQL
// (github.com/jackc/pgx/v5/stdlib), MySQL/MariaDB
// (github.com/go-sql-driver/mysql) and SQLite (modernc.org/sqlite, no cgo).
// See package github.com/ticketing-dev/ticketing/fence for the whole
// story, the errors and the options; this page says what is specific to
// database/sql and to each database.
//
// # Run and the dialect
//
// The dialect is an explicit argument, never guessed from the driver: a
// fence.Dialect (fence.Postgres, fence.MySQL, fence.SQLite), the same
// value that migrations.Up takes to create the table:
//
//	err := sqlfence.Run(ctx, db, fence.MySQL, ticket, func(tx *sql.Tx) error {
//		_, err := tx.ExecContext(ctx, "UPDATE accounts SET balance = balance - ? WHERE id = ?", amount, id)
//		return err
//	})
//
// db is a *sql.DB or a *sql.Conn (anything with BeginTx; a *sql.Conn
// begins and commits a real transaction). The transaction uses the
// driver's default isolation level. Run always releases the
// ticket, exactly once; see fence for every outcome.
//
// # PostgreSQL
//
// One statement per resource: INSERT ... ON CONFLICT (resource) DO UPDATE
// ... WHERE high_water < EXCLUDED.high_water RETURNING high_water,
// set_config('ticketing.fence_tx', 'fenced', true); the same as package
// pgxfence. READ COMMITTED is right: the upsert locks the row
// and compares with its latest committed version. Under REPEATABLE READ or
// SERIALIZABLE (sql.TxOptions with Guard, or default_transaction_isolation)
// a concurrent committed bump fails with SQLSTATE 40001 instead.
//
// # MySQL and MariaDB
//
// One statement per resource, the token passed as four parameters:
//
//	INSERT INTO ticketing_fence (resource, high_water, updated_at) VALUES (?, ?, CURRENT_TIMESTAMP(6))
//	ON DUPLICATE KEY UPDATE
//	  updated_at = IF(high_water < ?, CURRENT_TIMESTAMP(6), updated_at),
//	  high_water = IF(high_water < ?, ?, high_water + 0 * LAST_INSERT_ID(18446744073709551615))
//
// At every isolation level (READ UNCOMMITTED to SERIALIZABLE, InnoDB's
// default REPEATABLE READ included) this is right: INSERT ... ON
// DUPLICATE KEY UPDATE is a locking read, which takes an exclusive lock
// on the row and sees the latest committed value, not the transaction's
// snapshot. A new resource is inserted; a concurrent inserter of the same
// resource waits on the primary key. The outcome is read from the result:
// affected rows 1 (inserted) or 2 (raised) mean accepted, 0 (unchanged)
// means stale. Because clientFoundRows=true in the DSN makes an unchanged
// row count 1 too, the rejecting branch also sets the statement's insert
// id to a flag, the largest BIGINT UNSIGNED (no AUTO_INCREMENT column of
// a custom table hands it out), so the outcome is right with either
// setting. An accepted bump leaves LAST_INSERT_ID() as your own
// statements set it; a rejection sets it to the flag, on a transaction
// you roll back anyway. After a rejection the high-water is read with
// SELECT ... FOR UPDATE (a current read, not the snapshot).
//
// The statement uses neither VALUES(col), deprecated since MySQL 8.0.20
// (warning 1287, announced for removal), nor the row alias INSERT ... AS
// new, which MySQL 8.0.19+ has and MariaDB does not: IF() and plain
// parameters are in every MySQL and MariaDB version (the suite runs on
// MariaDB 10.11; MySQL 8.4/9.x were not at hand). It works under any
// sql_mode (tested with ANSI, ANSI_QUOTES, TRADITIONAL, STRICT_ALL_TABLES,
// NO_BACKSLASH_ESCAPES, PAD_CHAR_TO_FULL_LENGTH, with and without
// interpolateParams). Resource names are VARBINARY: compared byte for
// byte, "a", "a " and "A" are three resources.
//
// A deadlock (error 1213) or lock wait timeout (1205) between your
// business statements is returned, never retried.
//
// Use interpolateParams=true in the DSN to save the prepare round trips
// go-sql-driver/mysql otherwise spends on every statement with arguments.
//
// # SQLite
//
// SQLite has one writer at a time: the writer lock serialises fenced
// transactions. Open the database with these DSN parameters of
// modernc.org/sqlite:
//
//	file:app.db?_txlock=immediate&_pragma=busy_timeout(5000)
//
// _txlock=immediate makes BEGIN take the writer lock (BEGIN IMMEDIATE), so
// a transaction never has to upgrade a read lock (which fails at once with
// SQLITE_BUSY instead of waiting), and the busy timeout lets writers queue
// instead of failing. Run issues the upsert (INSERT ... ON CONFLICT ... DO
// UPDATE ... WHERE ... RETURNING, SQLite 3.35+) as the first statement, so
// even without _txlock=immediate its transaction starts as a writer; with
// Guard in your own transaction, the parameter matters more: a deferred
// transaction that read something before Guard, while another writer
// committed, fails at once with SQLITE_BUSY_SNAPSHOT (517) in WAL mode or
// SQLITE_BUSY otherwise; roll back and retry. WAL mode
// (_pragma=journal_mode(WAL)) lets readers go on during a fenced write.
// SQLite's busy handler polls with growing sleeps and is not fair, so with
// many concurrent writers one can starve past the busy timeout; cap the
// pool (db.SetMaxOpenConns(4), say) so that writers queue in database/sql.
//
// # Guard
//
// Guard is the check-and-bump alone, inside a *sql.Tx you manage (for
// instance with other sql.TxOptions). Call it before the protected write;
// then call CheckTx and fence.CheckLease right before tx.Commit, commit,
// and release the ticket yourself afterwards. Roll back on any error from
// Guard, CheckTx or CheckLease.
//
// # A function that ends the transaction
//
// The fence holds only while the transaction that ran the check-and-bump
// is open. If fn ends it, Run does not commit and returns an error
// matching fence.ErrTxEnded: what fn wrote before the end may be
// durable, what it wrote after ran unfenced (autocommitted, or in a new
// transaction that Run rolls back). Ways to end it: COMMIT or ROLLBACK
// through tx.ExecContext, tx.Commit or tx.Rollback, on MySQL/MariaDB
// every statement that commits implicitly (DDL such as TRUNCATE, CREATE,
// ALTER, DROP, RENAME; LOCK TABLES; BEGIN or START TRANSACTION; account
// statements; ANALYZE/OPTIMIZE/REPAIR/CHECK TABLE; the full list is in
// docs/fence.md) and a deadlock (which rolls back the whole transaction),
// on SQLite the errors after which it rolls back by itself. Run tells
// with one statement before COMMIT: on PostgreSQL it reads a
// transaction-local setting that the upsert sets (set_config(...,
// true)); on MySQL/MariaDB and SQLite, Guard sets a savepoint
// (SAVEPOINT ticketing_fence_tx, one more statement), and Run releases
// it (RELEASE SAVEPOINT fails once a commit or rollback has destroyed it,
// also in a new transaction).
//
// # Commit failures
//
// A commit error that the database itself returned (a *pgconn.PgError
// other than a connection class, a *mysql.MySQLError other than a lost or
// killed connection, any SQLite error) means the transaction did not
// commit; it is returned wrapped. Any other commit error, such as
// driver.ErrBadConn or mysql.ErrInvalidConn after the connection broke,
// matches fence.ErrCommitUnknown.
package sqlfence
