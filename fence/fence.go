package fence

import (
	"context"
	"fmt"
	"math"
	"reflect"
	"regexp"
	"slices"
	"time"
)

// DefaultTable is the high-water table created by package migrations.
const DefaultTable = "ticketing_fence"

// MaxResourceLen is the longest resource name, in bytes (the broker's key
// limit). Resource names are stored as bytes, so any byte string works,
// including non-UTF-8.
const MaxResourceLen = 255

// Ticket is what fencing needs from a lock ticket. *broker.Ticket satisfies
// it; package fencetest has a fake for tests.
type Ticket interface {
	// Key is the locked key; the default resource name.
	Key() string
	// Token is the fencing token, increasing with every grant.
	Token() uint64
	// Remaining is the conservative time left on the lease. It is read
	// at commit, so a lease refreshed meanwhile counts.
	Remaining() time.Duration
	// Release gives the lock back.
	Release(ctx context.Context) error
}

// releasedTicket is a Ticket that knows whether it was released, as
// *broker.Ticket does (Released). The fence refuses such a ticket with
// ErrReleased rather than with the negative remaining time a release
// leaves.
type releasedTicket interface {
	Released() bool
}

// Option configures a fenced transaction. Options are applied in order.
type Option func(*settings)

type settings struct {
	resources []string
	table     string
	margin    time.Duration
	tracer    Tracer
}

// WithResource fences the named resource instead of the ticket's key.
// It replaces earlier WithResource/WithResources options.
func WithResource(name string) Option {
	return func(s *settings) { s.resources = []string{name} }
}

// WithResources fences several resources in one transaction. They are
// bumped in sorted (bytewise) order, duplicates removed, so two
// transactions fencing overlapping sets never deadlock on the high-water
// rows. Every resource must accept the token. It replaces earlier
// WithResource/WithResources options.
func WithResources(names ...string) Option {
	return func(s *settings) { s.resources = append(make([]string, 0, len(names)), names...) }
}

// WithTable uses a high-water table other than DefaultTable. The name must
// be a plain SQL identifier ([A-Za-z_][A-Za-z0-9_]*, at most 63 bytes),
// optionally schema-qualified ("schema.table"); it is not quoted. The user
// creates such a table (same columns as the migrations create); package
// migrations only manages DefaultTable.
func WithTable(name string) Option {
	return func(s *settings) { s.table = name }
}

// WithCommitMargin requires more than d of the ticket's conservative
// remaining time right before commit (default 0: any positive remaining
// time). Use it to leave room for the commit itself.
func WithCommitMargin(d time.Duration) Option {
	return func(s *settings) { s.margin = d }
}

// Plan is a validated fenced write: what an adapter needs to issue the
// check-and-bump. Adapters build it with NewPlan; users rarely need it.
type Plan struct {
	// Resources are the resource names, validated, sorted and deduplicated.
	Resources []string
	// Table is the validated high-water table name.
	Table string
	// Token is the ticket's token as stored (a signed BIGINT). Token 0 is
	// allowed here but is stale everywhere: the implicit high-water of a
	// resource without a row is 0, and adapters never store it.
	Token int64
	// CommitMargin is the remaining lease time required at commit.
	CommitMargin time.Duration
	// Tracer is WithTracer's, nil without it.
	Tracer Tracer
}

var identRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]{0,62}(\.[A-Za-z_][A-Za-z0-9_]{0,62})?$`)

// NewPlan validates the ticket and options. It returns ErrNilTicket,
// ErrInvalidResource, ErrTokenRange or ErrInvalidTable (wrapped with
// details) and never touches a database.
func NewPlan(t Ticket, opts ...Option) (Plan, error) {
	if NilTicket(t) {
		return Plan{}, ErrNilTicket
	}
	s := settings{table: DefaultTable}
	for _, o := range opts {
		if o != nil {
			o(&s)
		}
	}
	if s.resources == nil {
		s.resources = []string{t.Key()}
	}
	if len(s.resources) == 0 {
		return Plan{}, fmt.Errorf("%w: no resource given", ErrInvalidResource)
	}
	for _, r := range s.resources {
		if r == "" {
			return Plan{}, fmt.Errorf("%w: empty resource name", ErrInvalidResource)
		}
		if len(r) > MaxResourceLen {
			return Plan{}, fmt.Errorf("%w: resource name is %d bytes, the limit is %d", ErrInvalidResource, len(r), MaxResourceLen)
		}
	}
	if !identRE.MatchString(s.table) {
		return Plan{}, fmt.Errorf("%w: %q", ErrInvalidTable, s.table)
	}
	tok := t.Token()
	if tok > math.MaxInt64 {
		return Plan{}, fmt.Errorf("%w: %d is above %d", ErrTokenRange, tok, int64(math.MaxInt64))
	}
	rs := slices.Clone(s.resources)
	slices.Sort(rs)
	return Plan{
		Resources:    slices.Compact(rs),
		Table:        s.table,
		Token:        int64(tok),
		CommitMargin: s.margin,
		Tracer:       s.tracer,
	}, nil
}

// NilTicket reports whether t is nil, or a Ticket interface holding a nil
// pointer, map, slice, channel or function, such as the nil *broker.Ticket
// that Acquire returns with an error. Such a ticket cannot be used (its
// methods would panic) and cannot be released; NewPlan, CheckLease and the
// adapters' Run and Guard return ErrNilTicket for it.
func NilTicket(t Ticket) bool {
	if t == nil {
		return true
	}
	switch v := reflect.ValueOf(t); v.Kind() {
	case reflect.Pointer, reflect.Map, reflect.Slice, reflect.Chan, reflect.Func, reflect.Interface, reflect.UnsafePointer:
		return v.IsNil()
	}
	return false
}

// CheckLease returns an error matching ErrLeaseExpired if the ticket's
// conservative remaining time is not above the commit margin (see
// WithCommitMargin), and one matching ErrReleased too if the ticket was
// released (a ticket with a Released method that reports true, such as
// a *broker.Ticket after its Release). Call it right before committing a
// transaction you fenced with an adapter's Guard; Run calls it for you.
func CheckLease(t Ticket, opts ...Option) error {
	if NilTicket(t) {
		return ErrNilTicket
	}
	if r, ok := t.(releasedTicket); ok && r.Released() {
		return fmt.Errorf("%w: its lock may already be another's; an adapter's Run releases its ticket when it returns, so take a new ticket from Acquire for each fenced write (%w)", ErrReleased, ErrLeaseExpired)
	}
	var s settings
	for _, o := range opts {
		if o != nil {
			o(&s)
		}
	}
	if rem := t.Remaining(); rem <= s.margin {
		return fmt.Errorf("%w: %v remaining, margin %v", ErrLeaseExpired, rem, s.margin)
	}
	return nil
}
