// Package fence guards a database write with a lock's fencing token, in the
// same transaction as the write (SEMANTICS.md rules 18 and 19).
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
// github.com/ticketing-dev/ticketing/migrations.
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
//  4. The lease check: if the ticket's conservative Remaining() is not
//     above the commit margin (WithCommitMargin, default 0), roll back and
//     return ErrLeaseExpired. The lock may belong to someone else by now;
//     committing would still be safe for the fenced resources (a newer
//     holder's token is higher), but other effects of the critical section
//     would not be, so Run does not commit late.
//  5. COMMIT. If COMMIT gets no definite answer (the connection broke), the
//     error matches ErrCommitUnknown: the write may or may not be durable.
//  6. Only then, on every path, release the ticket, exactly once, with a
//     context that ignores the caller's cancellation (the broker bounds
//     releases itself). A release failure is returned as a *ReleaseError
//     that carries the primary outcome, never hides it: use Committed(err)
//     to tell "committed, but the release failed" from a failed
//     transaction.
//
// The row lock taken in step 2 is held until step 5 ends, so two
// transactions on the same resource cannot both pass the check with tokens
// out of order: the accepted tokens of a resource are strictly increasing
// in commit order (rule 19). A resource without a row yet is just as safe:
// two transactions inserting the same new resource meet on its primary
// key, and the second waits for the first to commit or roll back.
//
// # Isolation levels
//
// PostgreSQL: READ COMMITTED (the default) is fine. INSERT ... ON CONFLICT
// DO UPDATE locks the conflicting row and evaluates its WHERE against the
// latest committed version, not the statement's snapshot. Under
// REPEATABLE READ or SERIALIZABLE a concurrent bump makes the upsert fail
// with a serialization error (SQLSTATE 40001), which Run returns; retry
// with a new ticket.
//
// MySQL/MariaDB (InnoDB): REPEATABLE READ (the default) is fine. INSERT ...
// ON DUPLICATE KEY UPDATE is a locking read: it takes an exclusive lock on
// the row and compares with the latest committed value, not the
// transaction's snapshot. After a rejection the high-water is read with
// SELECT ... FOR UPDATE for the same reason.
//
// SQLite: one writer at a time. Open the database with _txlock=immediate
// (modernc.org/sqlite DSN parameter) so that BEGIN takes the writer lock,
// and set a busy timeout (_pragma=busy_timeout(5000)). Run issues the
// upsert as the first statement, so even a deferred transaction becomes a
// writer before it reads anything.
//
// # Fencing a transaction you manage: Guard
//
// When the transaction is not Run's (a framework owns it, or several
// fenced writes share it), call the adapter's Guard inside it, before the
// protected write. Then you must:
//
//   - roll back if Guard returns an error (a *StaleError or a database
//     error);
//   - do the protected write in the same transaction;
//   - call CheckLease right before COMMIT, and roll back if it fails;
//   - commit, and only after commit or rollback release the ticket.
//
// Guard never releases the ticket and never commits.
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
// refused with ErrTokenRange, never truncated.
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
// ErrLeaseExpired, ErrCommitUnknown, ErrRelease / *ReleaseError,
// ErrInvalidResource, ErrTokenRange, ErrInvalidTable, ErrNilTicket; the
// caller's own errors come back unchanged.
package fence
