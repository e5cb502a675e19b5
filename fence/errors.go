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
	ErrNilTicket = errors.New("fence: nil ticket: pass the *broker.Ticket that a successful Acquire returned (a nil one is what Acquire returns with an error: handle that error first)")

	// ErrReleased means the ticket was released before the fenced write
	// could commit: its Release (or the broker's Close) had run, so its
	// lock may already be another's. An adapter's Run releases the ticket
	// when it returns, so a ticket fences one Run: acquire a new ticket
	// for the next write. Returned by CheckLease (so by Run at commit,
	// after a rollback: nothing was written) for a ticket that reports
	// itself released (a Released() bool method, as *broker.Ticket has).
	// The error also matches ErrLeaseExpired, which older code checks for.
	ErrReleased = errors.New("fence: the ticket was already released")

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
// StaleError to look further than an ordinary lag: 2^32 (about 4.3
// billion). Within one installation a rejected token is normally a few
// grants behind the high-water, since one counter serves all keys; a gap
// of 2^32 would take an hour of grants at a million per second while the
// stale holder was stalled. A larger gap has one of two causes, told apart
// by the token epochs (see PairEpochShift and StaleCause): a hot-standby
// pair's deposed side (expected, nothing to repair), or a lock service
// started again with a new token store (a new data dir, a new cluster)
// that starts tokens low (at 1, the protocol's default, or from a clock
// set back), which issues tokens far below what the database has
// accepted: every fenced write is then refused.
const ReinstallGap = 1 << 32

// PairEpochShift is where the token epoch starts in a token of a
// hot-standby pair: epoch e owns the tokens e<<PairEpochShift to
// (e+1)<<PairEpochShift - 1, and a node that starts serving takes an epoch
// above every epoch it has used or seen, so a failover's (or a split
// brain's) new active issues tokens of a higher epoch than the deposed
// side. The fence only reads the token's high bits: for a lock service
// that is not a pair (a standalone server, a cluster) they are just the
// token divided by 2^40.
const PairEpochShift = 40

// MaxPairEpochLag is the largest epoch distance (high-water's epoch minus
// the token's) that StaleError attributes to a deposed pair side. Every
// serving start of a pair node moves its epoch by at most 2, so a ticket
// of a deposed side is a few epochs behind even after many failovers and
// restarts. A lock service reinstalled with tokens starting at 1 against a
// high-water issued from the wall clock (token-start clock: epoch above
// 1500 since 2022) is further behind, and is reported as reinstalled.
const MaxPairEpochLag = 1 << 10

// StaleCause tells why a token was stale, as far as the token and the
// high-water tell (see StaleError.Cause).
type StaleCause int

const (
	// StaleBehind: the token is at most ReinstallGap below the high-water,
	// the ordinary case: a newer holder (a later grant) wrote first.
	StaleBehind StaleCause = iota
	// StaleAlreadyWrote: the token is the high-water, so this very ticket
	// wrote to the resource already (a ticket fences one write per
	// resource).
	StaleAlreadyWrote
	// StaleEarlierEpoch: the token is more than ReinstallGap below the
	// high-water and of an earlier token epoch, at most MaxPairEpochLag
	// behind: the ticket most likely comes from a hot-standby pair's side
	// that lost the active role (a failover, a split brain) and the side
	// serving since has written. Expected; acquire again. Only when the
	// lock service is not a pair, or newly granted tickets are refused as
	// well, is it a reinstall (see StaleFarBelow).
	StaleEarlierEpoch
	// StaleFarBelow: the token is more than ReinstallGap below the
	// high-water, in the same token epoch or more than MaxPairEpochLag
	// epochs below: no failover explains it. The lock service was
	// probably reinstalled or its token store replaced (or restored from a
	// backup, or started from a clock set back), and every fenced write
	// will be refused until it issues tokens above the high-water: restart
	// it with --initial-token at least the high-water.
	StaleFarBelow
)

// String names the cause.
func (c StaleCause) String() string {
	switch c {
	case StaleBehind:
		return "behind"
	case StaleAlreadyWrote:
		return "already-wrote"
	case StaleEarlierEpoch:
		return "earlier-epoch"
	case StaleFarBelow:
		return "far-below"
	}
	return fmt.Sprintf("StaleCause(%d)", int(c))
}

// Cause classifies the rejection from Token and HighWater alone (see the
// StaleCause constants).
func (e *StaleError) Cause() StaleCause {
	switch {
	case e.Token == e.HighWater:
		return StaleAlreadyWrote
	case e.HighWater < e.Token || e.HighWater-e.Token <= ReinstallGap:
		return StaleBehind
	}
	te, he := e.Token>>PairEpochShift, e.HighWater>>PairEpochShift
	if te < he && he-te <= MaxPairEpochLag {
		return StaleEarlierEpoch
	}
	return StaleFarBelow
}

// Error implements error. The message says what Cause found: nothing more
// for an ordinary stale token; that this ticket already wrote when its
// token is the high-water; that a pair's deposed side granted the ticket
// (and when it would instead be a reinstall) for a token of an earlier
// epoch; and that the lock service was probably reinstalled, with how to
// continue, for a token far below in the same epoch or far more epochs
// below.
func (e *StaleError) Error() string {
	msg := fmt.Sprintf("fence: stale token %d for resource %q (high-water %d)", e.Token, e.Resource, e.HighWater)
	switch e.Cause() {
	case StaleAlreadyWrote:
		msg += ": this ticket already wrote to it, its token is the high-water; a ticket fences one write per resource: acquire a new one for the next"
	case StaleEarlierEpoch:
		msg += fmt.Sprintf(": the token is of an earlier token epoch (%d) than the high-water (%d), as when a hot-standby pair's node that lost the active role (a failover or a split brain) granted it and the node serving since has written this resource: expected, nothing to repair; acquire the lock again. "+
			"Only if the lock service is not a pair, or newly granted tickets are refused too, was it reinstalled with tokens below those this database accepted: then restart it (every node) with --initial-token N, N at least %d",
			e.Token>>PairEpochShift, e.HighWater>>PairEpochShift, e.HighWater)
	case StaleFarBelow:
		msg += fmt.Sprintf(": the token is far below the high-water (by more than 2^32, and no failover of a pair explains it), so the lock service was probably reinstalled or its token store replaced, and issues tokens below those this database accepted; every fenced write will be refused until it issues tokens above the high-water. "+
			"To continue, restart the lock service (every node of a cluster or pair) with --initial-token N, N at least the highest high_water in the fence table (here at least %d): its tokens then continue above N. To avoid it next time, run the lock service with --token-start clock (which ticketingd init's configs set): a new installation then starts its tokens above the wall clock in microseconds", e.HighWater)
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
//
// Call it first, before retrying on an error of Run: a commit followed by
// a failed release is an error, and redoing the write then would do it
// twice.
func Committed(err error) bool {
	if err == nil {
		return true
	}
	var re *ReleaseError
	return errors.As(err, &re) && re.Primary == nil
}
