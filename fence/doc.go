// Package fence guards a database write with a lock's fencing token, in the
// same transaction as the write: the token is rejected unless it is above
// the resource's stored high-water, the high-water is raised, the write is
// made and committed, and only then is the ticket released (release only
// after commit); the check holds a row lock until commit, so a resource's
// accepted tokens increase in commit order.
//
// A lock ticket can outlive its holder's belief in it: a process pauses (GC,
// swap, a slow network), its lease runs out, another process acquires the
// lock and writes, and then the first one wakes up and writes too. The
// fencing token stops that: every grant carries a larger token, and the
// database keeps, per resource, the highest token that ever wrote (the
// high-water). A write is accepted only if its token is above the
// high-water, and the check, the bump and the write commit or roll back
// together.
//
// This package is driver-agnostic: the Ticket interface it needs (which
// *broker.Ticket satisfies, and fencetest.Ticket fakes), the errors, the
// options, and Plan, the validated form of a fenced write. The database
// work is done by the adapters:
//
//   - github.com/ticketing-dev/ticketing/adapters/pgxfence for pgx v5
//     (*pgxpool.Pool, *pgx.Conn);
//   - github.com/ticketing-dev/ticketing/adapters/sqlfence for database/sql
//     with PostgreSQL (pgx stdlib), MySQL/MariaDB (go-sql-driver/mysql) and
//     SQLite (modernc.org/sqlite).
//
// The high-water table is created by package
// github.com/ticketing-dev/ticketing/migrations (for a pgx pool:
// migrations/pgxmigrations). Dialect names the database for sqlfence and
// migrations alike: one type, fence.Postgres, fence.MySQL, fence.SQLite.
//
// # The transaction
//
// An adapter's Run does, in order:
//
//  1. BEGIN.
//  2. The check-and-bump: for each resource, in sorted order, one upsert
//     statement that takes the resource row's lock and raises high_water to
//     the token only if high_water < token. If it does not (token <=
//     high_water), the token is stale: roll back, release the ticket, and
//     return a *StaleError (errors.Is(err, ErrStale)).
//  3. The caller's function, with the transaction: the business write. An
//     error rolls back, releases, and is returned as is. A panic rolls
//     back, releases, and is re-raised.
//  4. The transaction check: the transaction must still be the one that
//     took the row locks in step 2. If fn ended it (COMMIT, ROLLBACK,
//     the driver's Commit, a MySQL statement that commits implicitly
//     such as TRUNCATE or CREATE TABLE, a deadlock that rolled it back),
//     the fence no longer held: roll back what is open, release, and
//     return an error matching ErrTxEnded (wrapping fn's error if fn
//     returned one). What fn wrote before the end may be durable. The
//     adapters tell by the connection's transaction status and a
//     transaction-local setting (PostgreSQL) or a savepoint that every
//     commit or rollback destroys (MySQL/MariaDB, SQLite).
//  5. The lease check: if the ticket's conservative Remaining() is not
//     above the commit margin (WithCommitMargin, default 0), roll back and
//     return ErrLeaseExpired. The lock may belong to someone else by now;
//     committing would still be safe for the fenced resources (a newer
//     holder's token is higher), but other effects of the critical section
//     would not be, so Run does not commit late. Remaining is read here,
//     at commit: a ticket whose lease was refreshed meanwhile (the
//     broker's Ticket.Refresh or KeepAlive) is checked against its
//     refreshed deadline, the margin included.
//  6. COMMIT. If COMMIT gets no definite answer (the connection broke, or
//     with pgx the context ended while COMMIT was in flight), the error
//     matches ErrCommitUnknown: the write may or may not be durable.
//     (database/sql never sends COMMIT once the context has ended, and
//     rolls back instead; that rare case is also reported as
//     ErrCommitUnknown, which is conservative.)
//  7. Only then, on every path, release the ticket, exactly once, with a
//     context that ignores the caller's cancellation (the broker bounds
//     releases itself). After a stale token or an expired lease the
//     release's "not held" (broker.ErrNotHeld: the lease was over) is
//     expected, and the *StaleError (or the ErrLeaseExpired) is returned
//     alone. Any other release failure is
//     returned as a *ReleaseError
//     that carries the primary outcome, never hides it: use Committed(err)
//     to tell "committed, but the release failed" from a failed
//     transaction. "Every path" includes a panic anywhere in Run (fn,
//     the driver's BEGIN or COMMIT, the ticket's methods): an open
//     transaction is rolled back, the ticket released, and the panic
//     goes on.
//
// The row lock taken in step 2 is held until step 6 ends, so two
// transactions on the same resource cannot both pass the check with tokens
// out of order: the accepted tokens of a resource are strictly increasing
// in commit order. A resource without a row yet is just as safe:
// two transactions inserting the same new resource meet on its primary
// key, and the second waits for the first to commit or roll back.
//
// # Isolation levels
//
// Commit-order fencing (a resource's accepted tokens increase in commit
// order) holds at every isolation level below: either the check sees
// the latest committed high-water, or the database fails the statement
// with an error that Run (or Guard) returns; a lower token never passes.
// "Waits" means the second transaction blocks on the first one's row (or
// writer) lock until it commits or rolls back. Verified by
// TestIsolationLevels and TestSQLiteDeferred in adapters/internal/conformance.
//
//	Database           Level                             Lower token, after a          Higher token
//	                                                     concurrent bump committed
//	PostgreSQL         READ COMMITTED (default)          waits, *StaleError            waits, accepted
//	PostgreSQL         REPEATABLE READ, SERIALIZABLE     waits, SQLSTATE 40001 [1]     waits, SQLSTATE 40001 [1]
//	MySQL/MariaDB      READ UNCOMMITTED, READ COMMITTED, waits, *StaleError [2]        waits, accepted
//	(InnoDB)           REPEATABLE READ (default),
//	                   SERIALIZABLE
//	SQLite             _txlock=immediate                 BEGIN waits, *StaleError      BEGIN waits, accepted
//	SQLite             deferred, Guard first (= Run)     waits, *StaleError            waits, accepted
//	SQLite             deferred, a read before Guard     SQLITE_BUSY_SNAPSHOT (517)    the same error [3]
//
// [1] PostgreSQL: INSERT ... ON CONFLICT DO UPDATE locks the conflicting
// row and, under READ COMMITTED, checks its latest committed version.
// Under REPEATABLE READ or SERIALIZABLE, a row that another transaction
// updated or inserted after this transaction's snapshot fails the upsert
// with "could not serialize access due to concurrent update" (40001): the
// caller's transaction is aborted; retry it from BEGIN (with a new ticket
// if the token was stale). Without a concurrent bump these levels work
// like READ COMMITTED.
//
// [2] MySQL/MariaDB: INSERT ... ON DUPLICATE KEY UPDATE is a locking
// read at every level: an exclusive lock on the row and the latest
// committed value, never the transaction's snapshot. After a rejection
// the high-water is read with SELECT ... FOR UPDATE, a current read too,
// so the *StaleError shows the committed high-water.
//
// [3] SQLite: one writer at a time. A deferred transaction that read
// before its first write holds a read snapshot; if another writer
// committed since, SQLite cannot upgrade it and fails the upsert at once
// with SQLITE_BUSY_SNAPSHOT in WAL mode (SQLITE_BUSY in rollback-journal
// mode), whatever the token. Roll back and retry. Open the database with
// _txlock=immediate (modernc.org/sqlite DSN parameter), so that BEGIN takes
// the writer lock, and a busy timeout (_pragma=busy_timeout(5000)). Run
// issues the upsert as its first statement, so even a deferred
// transaction becomes a writer before it reads anything.
//
// # Fencing a transaction you manage: Guard
//
// When the transaction is not Run's (a framework owns it, or several
// fenced writes share it), call the adapter's Guard inside it, before the
// protected write. Then you must:
//
//   - roll back if Guard returns an error (a *StaleError or a database
//     error);
//   - do the protected write in the same transaction, and never commit
//     or roll back in between (explicitly or implicitly);
//   - call the adapter's CheckTx and CheckLease right before COMMIT, and
//     roll back if either fails (CheckTx returns ErrTxEnded if the
//     transaction is no longer the one Guard ran in);
//   - commit, and only after commit or rollback release the ticket.
//
// Guard never releases the ticket and never commits.
//
// Call Guard once per transaction and ticket. A second call with the same
// ticket in the same transaction finds the high-water it just raised,
// equal to the token, and reports a *StaleError (HighWater == Token): rule
// 18 rejects token <= high-water, and the database cannot tell "raised by
// this transaction" from "raised by a committed one" without extra state.
// To fence several resources use WithResources in one call. Likewise a
// ticket fences one committed transaction per resource: a second Run with
// the same ticket on the same resource is stale.
//
// Do not hand Run a transaction as its database: pgxfence.Run refuses a
// pgx.Tx (pgxfence.ErrNestedTx), whose Begin only makes a savepoint, so
// Run's "commit" would commit nothing and the ticket would be released
// before the real commit. Use Guard in that transaction instead.
//
// # Resources, tokens and the table
//
// The resource is the ticket's key unless WithResource or WithResources
// says otherwise. Resource names are stored as bytes (BYTEA, VARBINARY(255),
// BLOB): 1 to MaxResourceLen (255) bytes, any bytes, UTF-8 or not, compared
// exactly (no collation, case or padding folding). An empty or longer name
// is refused with ErrInvalidResource before anything is sent.
//
// Tokens are stored in a signed BIGINT: a token above math.MaxInt64 is
// refused with ErrTokenRange, never truncated. Tokens are at least 1 (a
// new Ticketing server starts them at 1, or with --token-start clock,
// which ticketingd init's configs set, above the wall clock in
// microseconds, about 1.8e15): a resource without a row has the implicit
// high-water 0,
// so token 0 (a zero-value or fake ticket) is always stale, and is never
// stored. A *StaleError whose token is more than ReinstallGap (2^32)
// below the high-water is classified by StaleError.Cause from the token
// epochs (the high bits, from PairEpochShift, where a hot-standby pair
// puts the epoch each serving start takes): a token of an earlier epoch,
// at most MaxPairEpochLag behind, is a deposed pair side's (a failover or
// a split brain; expected, acquire again), and the message says so; a
// token as far below in the same epoch, or further epochs below, means
// the lock service was probably reinstalled with tokens below those the
// database accepted, and the message says how to continue above the
// high-water (--initial-token) and to avoid it next time (--token-start
// clock).
//
// WithTable names another high-water table (a plain identifier, optionally
// schema-qualified, validated, not quoted). You create that table
// yourself, with the columns of the migrations (resource, high_water,
// updated_at) and resource as its primary key.
//
// # Errors
//
// Every error of this package and the adapters starts with the package
// name. Branch with errors.Is and errors.As: ErrStale / *StaleError,
// ErrTxEnded, ErrLeaseExpired (ErrReleased, a case of it: the ticket was
// already released), ErrCommitUnknown, ErrRelease /
// *ReleaseError, ErrInvalidResource, ErrTokenRange, ErrInvalidTable,
// ErrNilTicket (also for a nil *broker.Ticket inside the Ticket
// interface: see NilTicket), ErrNotMigrated (the high-water table does
// not exist: run the migrations), ErrDialectMismatch (sqlfence's dialect
// is not the database's), ErrDialect; each outcome matches one of them only. The
// caller's own errors come back unchanged (wrapped only in ErrTxEnded,
// when fn ended the transaction and then failed).
package fence
