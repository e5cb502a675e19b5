package broker

import (
	"errors"
	"fmt"

	"github.com/ticketing-dev/ticketing/internal/wire"
)

// Sentinel errors. Every error returned by this package matches at most one
// of the outcome sentinels below with errors.Is (plus, for a cancelled call,
// context.Canceled or context.DeadlineExceeded, and for a server E frame the
// typed *ServerError).
var (
	// ErrInvalidArgument: an argument of Acquire was out of range (after
	// rounding up to whole seconds) or a key was empty or longer than 255
	// bytes. Nothing was sent.
	ErrInvalidArgument = errors.New("broker: invalid argument")

	// ErrInvalidConfig: New was given a configuration it cannot use (no
	// address, an unreadable or invalid CA file, a bad TLS mode, ...).
	ErrInvalidConfig = errors.New("broker: invalid configuration")

	// ErrTimedOut: the server answered T; the wait ran out. Definitely not
	// granted.
	ErrTimedOut = errors.New("broker: timed out waiting for the lock (not granted)")

	// ErrBusy: the server answered B, a capacity rejection. Definitely not
	// granted; never retried internally. Retry, with a new Acquire, after an
	// application backoff.
	ErrBusy = errors.New("broker: server busy (not granted)")

	// ErrIndeterminate: at least one byte of the ACQUIRE may have reached
	// the server, and no final reply came (the session dropped or turned
	// fatal, the reply did not come within wait plus the reply grace, or the
	// call was cancelled after a possible send). The lock may or may not be
	// held by the (discarded) owner; it expires with its lease. Do not enter
	// the critical section.
	ErrIndeterminate = errors.New("broker: acquire outcome indeterminate")

	// ErrUnsent: the request definitely never left the client, because the
	// call was cancelled before any byte was written, or because there was
	// no ready session. Safe to retry.
	ErrUnsent = errors.New("broker: request not sent")

	// ErrLeaseTooShort: the lock was granted, but the conservative remaining
	// lease was not positive or did not cover the work budget. A
	// compensating release was made (see the error text for its result).
	ErrLeaseTooShort = errors.New("broker: granted lease too short for the work budget")

	// ErrNotHeld: the server answered N to a RELEASE: no lock on that key
	// holds that token (it expired, was released, or was never held).
	ErrNotHeld = errors.New("broker: lock not held by this token")

	// ErrReleaseUnconfirmed: no final reply to a RELEASE came within the
	// 5 s release window. The lock may still be held until its lease ends.
	ErrReleaseUnconfirmed = errors.New("broker: release unconfirmed")

	// ErrClosed: the Broker was closed.
	ErrClosed = errors.New("broker: closed")

	// ErrUnauthorized is matched by a *ServerError with code 3: the client
	// token was refused.
	ErrUnauthorized = errors.New("broker: unauthorized")

	// ErrNotActive: the node answered M (it does not serve: passive node or
	// follower). For an ACQUIRE it names, it is a definite "not granted".
	// The error is a *NotActiveError carrying the hint.
	ErrNotActive = errors.New("broker: node not active")
)

// ServerError is a server E frame: session-fatal; for the request it names,
// a definite "not granted" (or "not released"). Code 3 matches
// ErrUnauthorized.
type ServerError struct {
	Code    uint16 // the E code of PROTOCOL.md (1..7)
	Message string // the server's message
}

// Error implements error; it never contains the client token.
func (e *ServerError) Error() string {
	return fmt.Sprintf("broker: server error %d (%s): %s", e.Code, wire.CodeName(e.Code), e.Message)
}

// Is makes errors.Is(err, ErrUnauthorized) true for code 3.
func (e *ServerError) Is(target error) bool {
	return target == ErrUnauthorized && e.Code == wire.CodeUnauthorized
}

// NotActiveError is a server M frame. It matches ErrNotActive.
type NotActiveError struct {
	Hint string // address of the active node, if the server knew it
}

// Error implements error.
func (e *NotActiveError) Error() string {
	if e.Hint == "" {
		return "broker: node not active"
	}
	return "broker: node not active (active node: " + e.Hint + ")"
}

// Is makes errors.Is(err, ErrNotActive) true.
func (e *NotActiveError) Is(target error) bool { return target == ErrNotActive }

// opError joins an outcome sentinel with its cause (a context error, a
// session error, a server error), so that errors.Is matches both.
type opError struct {
	kind  error
	msg   string
	cause error
}

func (e *opError) Error() string {
	s := e.kind.Error()
	if e.msg != "" {
		s += ": " + e.msg
	}
	if e.cause != nil {
		s += ": " + e.cause.Error()
	}
	return s
}

func (e *opError) Unwrap() []error {
	if e.cause == nil {
		return []error{e.kind}
	}
	return []error{e.kind, e.cause}
}

func newErr(kind error, msg string, cause error) error {
	return &opError{kind: kind, msg: msg, cause: cause}
}

// sessionError describes why a session ended.
type sessionError struct {
	addr  string
	msg   string
	cause error
}

func (e *sessionError) Error() string {
	s := "session to " + e.addr + ": " + e.msg
	if e.cause != nil {
		s += ": " + e.cause.Error()
	}
	return s
}

func (e *sessionError) Unwrap() error { return e.cause }
