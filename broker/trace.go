package broker

import (
	"context"
	"time"
)

// Tracer observes the broker's calls, for tracing and metrics (module
// github.com/ticketing-dev/ticketing/otel implements it with
// OpenTelemetry). Set it in Config.Tracer; nil, the default, costs one
// nil check per call and no allocation.
//
// Each Start method returns the context that the call then uses (a span's
// context, say); the matching End method is given that context. The
// methods are called on the caller's goroutine (TraceLost on a
// KeepAlive's), never under a lock of the broker, and must be safe for
// concurrent use. They must not call the Broker or the Ticket back, apart
// from the Ticket's read-only methods.
type Tracer interface {
	// TraceAcquireStart is called as Acquire starts, before its arguments
	// are checked; TraceAcquireEnd as it returns.
	TraceAcquireStart(ctx context.Context, data TraceAcquireStartData) context.Context
	TraceAcquireEnd(ctx context.Context, data TraceAcquireEndData)
	// TraceRefreshStart and TraceRefreshEnd bracket every EXTEND attempt:
	// each Ticket.Refresh and each background refresh of a KeepAlive
	// (whose context is the KeepAlive's).
	TraceRefreshStart(ctx context.Context, data TraceRefreshStartData) context.Context
	TraceRefreshEnd(ctx context.Context, data TraceRefreshEndData)
	// TraceReleaseStart and TraceReleaseEnd bracket Ticket.Release
	// (releases made by Close, the drop safety net or a compensating
	// release are not traced).
	TraceReleaseStart(ctx context.Context, data TraceReleaseStartData) context.Context
	TraceReleaseEnd(ctx context.Context, data TraceReleaseEndData)
	// TraceLost is called when a KeepAlive signals that its lock may be
	// lost: its lease came within the margin with no confirmed refresh
	// (ErrLeaseEnding), or a refresh was answered N (ErrNotHeld). ctx is
	// the KeepAlive's context, already cancelled. It is not called for a
	// Release, Close or the caller's cancellation.
	TraceLost(ctx context.Context, data TraceLostData)
}

// TraceAcquireStartData is Acquire's key and options, as given.
type TraceAcquireStartData struct {
	Key               string
	Lease, Wait, Work time.Duration
}

// TraceAcquireEndData is Acquire's outcome: Err nil and the ticket's Token
// and Deadline on a grant.
type TraceAcquireEndData struct {
	Key      string
	Token    uint64
	Deadline time.Time
	Err      error
}

// TraceRefreshStartData is a refresh's ticket and requested lease.
type TraceRefreshStartData struct {
	Key   string
	Token uint64
	Lease time.Duration
}

// TraceRefreshEndData is a refresh's outcome: Deadline is the ticket's
// conservative deadline afterwards.
type TraceRefreshEndData struct {
	Key      string
	Token    uint64
	Deadline time.Time
	Err      error
}

// TraceReleaseStartData is the ticket being released.
type TraceReleaseStartData struct {
	Key   string
	Token uint64
}

// TraceReleaseEndData is Release's outcome.
type TraceReleaseEndData struct {
	Key   string
	Token uint64
	Err   error
}

// TraceLostData is a ticket whose KeepAlive signalled a possible loss, and
// the cause its context carries.
type TraceLostData struct {
	Key   string
	Token uint64
	Cause error
}
