package fence

import "context"

// Tracer observes the fenced transactions of the adapters' Run (module
// github.com/ticketing-dev/ticketing/otel implements it with
// OpenTelemetry). Give it with WithTracer; without one nothing is traced.
// Its methods are called on Run's goroutine, outside any transaction
// statement, and must be safe for concurrent use.
type Tracer interface {
	// TraceFenceStart is called once the plan is validated, before the
	// transaction begins; the context it returns is the one the
	// transaction then uses (so that a database driver's own spans
	// nest under it).
	TraceFenceStart(ctx context.Context, data TraceFenceStartData) context.Context
	// TraceFenceEnd is called with Run's result, after the ticket's
	// release. A rejected token is an Err matching ErrStale (a
	// *StaleError, maybe inside a *ReleaseError).
	TraceFenceEnd(ctx context.Context, data TraceFenceEndData)
}

// TraceFenceStartData is the validated plan of a fenced transaction.
type TraceFenceStartData struct {
	Resources []string // sorted, deduplicated; do not modify
	Table     string
	Token     uint64
}

// TraceFenceEndData is a fenced transaction's result (nil: committed).
type TraceFenceEndData struct {
	Resources []string // as in TraceFenceStartData
	Table     string
	Token     uint64
	Err       error
}

// WithTracer traces the fenced transaction with tr (nil: none). It is
// used by the adapters' Run, not by Guard or CheckLease.
func WithTracer(tr Tracer) Option {
	return func(s *settings) { s.tracer = tr }
}
