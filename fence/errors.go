package fence

import (
	"errors"
	"fmt"
)

var (
	// ErrStale is matched (errors.Is) by every *StaleError: the ticket's
	// token is not above the resource's stored high-water, so a newer holder
	// has already written. Nothing was committed.
	ErrStale = errors.New("fence: stale token")

	// ErrLeaseExpired means the ticket's conservative remaining time ran out
	// (or fell to the configured commit margin) before commit. The
	// transaction was rolled back, not committed: the lock may already be
	// someone else's.
	ErrLeaseExpired = errors.New("fence: lease expired before commit")

	// ErrCommitUnknown means COMMIT was sent but no answer from the database
	// says what happened (the connection broke, the context was cancelled
	// during commit, ...). The write may or may not be durable; the error
	// wraps the driver's error. Treat it like an indeterminate outcome: check
	// the data before retrying.
	ErrCommitUnknown = errors.New("fence: commit outcome unknown")

	// ErrRelease is matched by every *ReleaseError: releasing the ticket
	// failed after the transaction's outcome was settled.
	ErrRelease = errors.New("fence: releasing the ticket failed")

	// ErrInvalidResource is returned for an empty resource name or one
	// longer than MaxResourceLen bytes. Nothing is sent to the database.
	ErrInvalidResource = errors.New("fence: invalid resource")

	// ErrTokenRange is returned for a token above math.MaxInt64, which the
	// signed BIGINT high-water column cannot hold. The token is never
	// truncated. Nothing is sent to the database.
	ErrTokenRange = errors.New("fence: token out of range")

	// ErrInvalidTable is returned for a table name that is not a safe SQL
	// identifier (optionally schema-qualified).
	ErrInvalidTable = errors.New("fence: invalid table name")

	// ErrNilTicket is returned when the ticket is nil, or a nil pointer
	// (or other nil value) of a type that implements Ticket, such as the
	// nil *broker.Ticket that an ignored Acquire error leaves. Nothing is
	// sent and nothing is released.
	ErrNilTicket = errors.New("fence: nil ticket")

	// ErrTxEnded means the transaction that checked and raised the
	// high-water had already ended when Run was about to commit (or when
	// the caller of Guard checked with the adapter's CheckTx): the
	// business function, or code it called, committed or rolled back,
	// explicitly (COMMIT, ROLLBACK, the driver's Commit or Rollback) or
	// implicitly (MySQL/MariaDB DDL such as TRUNCATE and the other
	// statements that commit implicitly, see docs/fence.md; a deadlock,
	// which rolls back the whole InnoDB transaction; an SQLite error that
	// rolls back).
	//
	// The fence no longer held: what the function wrote before the end
	// may already be durable (together with the high-water bump, after a
	// commit), and what it wrote after the end ran outside the fenced
	// transaction, autocommitted or in a new transaction. Run committed
	// nothing itself, rolled back what was still open, and released the
	// ticket. Check the data before retrying; never end the transaction
	// inside the function.
	ErrTxEnded = errors.New("fence: the transaction ended before commit")

	// ErrNotMigrated means the high-water table does not exist in the
	// database: the migrations were not applied (run migrations.Up, or
	// pgxmigrations.Up with pgx, before the first fenced write), or
	// fence.WithTable names a table that was not created. The error
	// names the table and what to run, and wraps the driver's error
	// (errors.As reaches it). The transaction was rolled back, nothing
	// was written, and the ticket was released.
	ErrNotMigrated = errors.New("fence: the high-water table does not exist (the migrations were not applied)")

	// ErrDialectMismatch means the dialect passed to sqlfence (or to
	// package migrations) is not the database's: fence.SQLite for a
	// MariaDB *sql.DB, say. The error names the dialect passed, the
	// database found and the dialect to pass. Known from the Go type of
	// db's database/sql driver, it is returned before anything is sent;
	// for a driver the module does not know, it is returned when the
	// database rejects the fence's own statement as not its SQL (a syntax
	// error, an unknown function), after a rollback. Either way nothing
	// was written and the ticket was released.
	ErrDialectMismatch = errors.New("fence: the dialect does not match the database")
)

// StaleError reports a rejected token: Token <= HighWater for Resource.
// It matches ErrStale with errors.Is. When several resources are fenced,
// it names the first stale one in sorted order.
type StaleError struct {
	// Resource is the fenced resource name (possibly not valid UTF-8).
	Resource string
	// Token is the rejected fencing token.
	Token uint64
	// HighWater is the stored high-water the token was compared with
	// (read after the rejection; at least Token).
	HighWater uint64
}

// ReinstallGap is how far below the high-water a stale token must be for
// StaleError's message to say that the lock service was probably
// reinstalled: 2^32 (about 4.3 billion). Within one installation a
// rejected token is normally a few grants behind the high-water, since
// one counter serves all keys; a gap of 2^32 would take an hour of grants
// at a million per second while the stale holder was stalled. A lock
// service started again with a new token store (a new data dir, a new
// cluster) that starts tokens low (at 1, the protocol's default, or from
// a clock set back), issues tokens far below what the database has
// accepted: every fenced write is then refused.
const ReinstallGap = 1 << 32

// Error implements error. When HighWater equals Token, the write that
// raised the high-water to it was made with this very token: tokens are
// never issued twice, so this ticket already wrote (a ticket fences one
// transaction per resource), and the message says so. When the token is
// more than ReinstallGap below the high-water, the message also says that
// the lock service was probably reinstalled and how to continue.
func (e *StaleError) Error() string {
	if e.Token == e.HighWater {
		return fmt.Sprintf("fence: stale token %d for resource %q (high-water %d): this ticket already wrote to it, its token is the high-water; a ticket fences one write per resource: acquire a new one for the next", e.Token, e.Resource, e.HighWater)
	}
	msg := fmt.Sprintf("fence: stale token %d for resource %q (high-water %d)", e.Token, e.Resource, e.HighWater)
	if e.HighWater > e.Token && e.HighWater-e.Token > ReinstallGap {
		msg += fmt.Sprintf(": the token is far below the high-water (by more than 2^32), so the lock service was probably reinstalled or its token store replaced, and issues tokens below those this database accepted; every fenced write will be refused until it issues tokens above the high-water. "+
			"To continue, restart the lock service (every node of a cluster) with --initial-token N, N at least the highest high_water in the fence table (here at least %d): its tokens then continue above N. To avoid it next time, run the lock service with --token-start clock (which ticketingd init's configs set): a new installation then starts its tokens above the wall clock in microseconds", e.HighWater)
	}
	return msg
}

// Is makes errors.Is(err, ErrStale) true.
func (e *StaleError) Is(target error) bool { return target == ErrStale }

// ReleaseError reports that the ticket's Release failed after the
// transaction was committed or rolled back. It never hides the primary
// outcome: Primary is nil when the transaction committed (see Committed),
// otherwise it is the error the caller would have received had the release
// succeeded. errors.Is and errors.As see both Primary and Err, and
// errors.Is(err, ErrRelease) is true.
type ReleaseError struct {
	// Primary is the outcome of the fenced transaction; nil means committed.
	Primary error
	// Err is the error returned by Ticket.Release.
	Err error
}

// Error implements error.
func (e *ReleaseError) Error() string {
	if e.Primary == nil {
		return fmt.Sprintf("fence: transaction committed, but releasing the ticket failed: %v", e.Err)
	}
	return fmt.Sprintf("%v (and releasing the ticket failed: %v)", e.Primary, e.Err)
}

// Is makes errors.Is(err, ErrRelease) true.
func (e *ReleaseError) Is(target error) bool { return target == ErrRelease }

// Unwrap returns Primary (if any) and Err.
func (e *ReleaseError) Unwrap() []error {
	if e.Primary == nil {
		return []error{e.Err}
	}
	return []error{e.Primary, e.Err}
}

// Committed reports whether err, as returned by an adapter's Run, still
// means that the transaction committed: err is nil, or it is a
// *ReleaseError with a nil Primary (the write is durable, only the ticket's
// release failed, so the lock lingers until its lease ends).
func Committed(err error) bool {
	if err == nil {
		return true
	}
	var re *ReleaseError
	return errors.As(err, &re) && re.Primary == nil
}
