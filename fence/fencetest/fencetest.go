// Package fencetest provides a fake fence.Ticket for tests and examples, so
// fenced code can be exercised without a lock server.
//
// A *Ticket is safe for concurrent use.
package fencetest

import (
	"context"
	"sync"
	"time"
)

// Ticket is a fake fence.Ticket with a fixed key and token. Its remaining
// lease time and Release result are settable, and it counts Release calls.
type Ticket struct {
	key   string
	token uint64

	mu         sync.Mutex
	remaining  time.Duration
	releaseErr error
	releases   int
}

// NewTicket returns a fake ticket for key and token with a remaining lease
// of one minute and a Release that succeeds.
func NewTicket(key string, token uint64) *Ticket {
	return &Ticket{key: key, token: token, remaining: time.Minute}
}

// Key returns the key given to NewTicket.
func (t *Ticket) Key() string { return t.key }

// Token returns the token given to NewTicket.
func (t *Ticket) Token() uint64 { return t.token }

// Remaining returns the remaining lease time set by SetRemaining (default
// one minute).
func (t *Ticket) Remaining() time.Duration {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.remaining
}

// SetRemaining sets what Remaining returns; zero or less means expired.
func (t *Ticket) SetRemaining(d time.Duration) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.remaining = d
}

// SetReleaseError makes Release return err (nil: succeed).
func (t *Ticket) SetReleaseError(err error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.releaseErr = err
}

// Release counts the call and returns the error set by SetReleaseError.
// It ignores ctx.
func (t *Ticket) Release(ctx context.Context) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.releases++
	return t.releaseErr
}

// Releases returns how many times Release has been called.
func (t *Ticket) Releases() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.releases
}
