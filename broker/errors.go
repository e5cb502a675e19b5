package broker

import (
	"context"
	"errors"
	"fmt"

	"github.com/ticketing-dev/ticketing/internal/wire"
)

// Sentinel errors. Every error returned by this package matches exactly one
// outcome: one of the sentinels below with errors.Is, or, for a server E
// frame other than code 3, the typed *ServerError (code 3 matches
// ErrUnauthorized). A cancelled call also matches context.Canceled or
// context.DeadlineExceeded. An error's earlier causes (the session error
// behind an ErrUnsent or ErrIndeterminate, the last attempt behind an
// ErrReleaseUnconfirmed) are in its message; they stay reachable with
// errors.Is and errors.As only when they match no outcome (a dial or TLS
// error, say, or ErrWrongCluster, which is a cause and no outcome), so that
// an error never matches two outcomes.
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
	// no ready session (for a RELEASE: at any time within the release
	// window). Safe to retry; a Ticket whose Release returned it is still
	// held and may be released again.
	ErrUnsent = errors.New("broker: request not sent")

	// ErrLeaseTooShort: the lock was granted, but the conservative remaining
	// lease was not positive or did not cover the work budget. A
	// compensating release was made (see the error text for its result).
	ErrLeaseTooShort = errors.New("broker: granted lease too short for the work budget")

	// ErrNotHeld: the server answered N to a RELEASE or an EXTEND (Refresh):
	// no lock on that key holds that token (and, for a RELEASE_OWNED or an
	// EXTEND, that owner): it expired, was released, or was never held.
	// Refresh and KeepAlive also return it, without sending anything, for
	// a ticket already released (Release ran, or Close, or the drop safety
	// net), and a KeepAlive's lost signal carries it as its cause when a
	// refresh was answered N or Release ran.
	ErrNotHeld = errors.New("broker: lock not held by this token")

	// ErrReleaseUnconfirmed: a RELEASE may have reached the server, and no
	// final reply to it came within the 5 s release window. The lock may
	// still be held until its lease ends. (A RELEASE that was never sent
	// within the window is ErrUnsent instead.)
	ErrReleaseUnconfirmed = errors.New("broker: release unconfirmed")

	// ErrRefreshUnconfirmed: an EXTEND (Ticket.Refresh) may have reached
	// the server, and no final reply to it came (its session dropped or
	// turned fatal, no reply within ReplyGrace, or the call was cancelled
	// after a possible send). The lease may or may not have been
	// extended: the ticket's Deadline is unchanged (never assumed
	// extended), and the lock is still held at least until then. Refresh
	// again to know.
	ErrRefreshUnconfirmed = errors.New("broker: refresh unconfirmed")

	// ErrUnsupported: the request needs a newer protocol version than the
	// one the broker's ready sessions speak: Refresh and KeepAlive need
	// version 3 (EXTEND), and every ready session is to a node that
	// answered HELLO with version 2 or 1 (an older ticketingd). Nothing
	// was sent. Upgrade the servers; the broker asks every node for
	// version 3 again after its session drops (a restart does that).
	ErrUnsupported = errors.New("broker: not supported by the server (protocol version 3 needed)")

	// ErrLeaseEnding is the cause of a KeepAlive's lost signal when the
	// ticket's conservative deadline came within the keep-alive's margin
	// (a third of its lease) with no confirmed refresh: the server could
	// not be reached in time (no session, no reply, a node of an older
	// version). The lock may still be held until Deadline, but can no
	// longer be relied on: stop the work. The last refresh's error is in
	// the message.
	ErrLeaseEnding = errors.New("broker: lease ending without a confirmed refresh")

	// ErrClosed: the Broker was closed.
	ErrClosed = errors.New("broker: closed")

	// ErrUnauthorized is matched by a *ServerError with code 3: the client
	// token was refused. The error's message says whether a token was sent:
	// "no token was sent" (put it in the URL, ticketing://TOKEN@host, or in
	// Config.Token) or "the client token sent was refused" (not one of the
	// server's client tokens).
	ErrUnauthorized = errors.New("broker: unauthorized")

	// ErrNotReady: WaitReady gave up (its ctx ended) with no ready session
	// and without every session having been refused for good. The error
	// also matches ctx's error; its message carries the last session error.
	ErrNotReady = errors.New("broker: no ready session")

	// ErrCertificate: the server's TLS certificate failed verification. It
	// is a refusal for good (see WaitReady); the error also matches the
	// *tls.CertificateVerificationError and the x509 error behind it.
	ErrCertificate = errors.New("broker: server certificate rejected")

	// ErrTLSRequired: the client connects in plain TCP (no ca= or tls= in
	// the URL, TLSConfig.Mode empty or TLSOff) and the server speaks TLS:
	// it closed the connection after the HELLO without an answer, and a
	// TLS handshake with it then succeeded. It is a refusal for good (see
	// WaitReady). Configure TLS: the URL's ca=PATH (the CA file that
	// ticketingd init writes) or tls=system.
	ErrTLSRequired = errors.New("broker: the server requires TLS")

	// ErrServerNotTLS: the client connects with TLS (the URL's ca= or
	// tls=, TLSConfig.Mode other than TLSOff) and the server speaks plain
	// TCP: it answered the TLS handshake with bytes that are not TLS, or
	// closed the connection without a word. It is a refusal for good (see
	// WaitReady). Start the server with TLS (ticketingd serve --tls-cert
	// and --tls-key; ticketingd init configures it), or, on a trusted
	// network only, drop ca= and tls= from the URL.
	ErrServerNotTLS = errors.New("broker: the server does not speak TLS")

	// ErrNotActive: the node answered M (it does not serve: passive node or
	// follower). For an ACQUIRE it names, it is a definite "not granted".
	// The error is a *NotActiveError carrying the hint.
	ErrNotActive = errors.New("broker: node not active")

	// ErrWrongCluster is matched by a *WrongClusterError: a node answered
	// HELLO_OK (version 3) with the identity of another cluster or pair
	// than the broker's (Config.Cluster, the URL's cluster=, or without
	// one the first identity the broker met). It is no outcome of its
	// own but a cause: it stays matchable inside the error that says that
	// no session was usable (Acquire's and Refresh's ErrUnsent, WaitReady's
	// ErrNotReady).
	ErrWrongCluster = errors.New("broker: node of another cluster")

	// ErrNoClusterIdentity is matched, besides ErrWrongCluster, by the
	// *WrongClusterError of a node refused because it carries no cluster
	// identity while the broker is configured with one (Config.Cluster,
	// the URL's cluster=): a standalone server, or a server of protocol
	// version 1 or 2, whose HELLO_OK has no identity field. Such a node
	// cannot be shown to be of the configured cluster or pair. Like
	// ErrWrongCluster, it is a cause, not an outcome.
	ErrNoClusterIdentity = errors.New("broker: node without a cluster identity")
)

// WrongClusterError is the refusal of a node whose version-3 HELLO_OK
// carries another group identity (the ID of a Raft cluster or of a
// hot-standby pair) than the one the broker keeps to, or, with
// Config.Cluster set, no identity at all (Cluster empty: a standalone
// server, or a server of protocol version 1 or 2; it then also matches
// ErrNoClusterIdentity). Such a node is
// never used: its session is closed right after HELLO_OK, nothing is sent
// on it, it is no failover target, and it is redialled only after
// BackoffMax (a refusal for good, see WaitReady). It matches
// ErrWrongCluster.
type WrongClusterError struct {
	Addr    string // the node's address, as in Config.Addrs
	Node    string // the node's name, from its HELLO_OK
	Cluster string // the node's identity; "" for none
	Want    string // the broker's identity
	// Configured says whether Want is Config.Cluster (the URL's
	// cluster=) rather than the first identity the broker met.
	Configured bool
	// Version is the protocol version of the node's HELLO_OK (set for a
	// node without an identity: 3 for a standalone server, 1 or 2 for a
	// server that predates identities).
	Version uint8
}

// Error implements error.
func (e *WrongClusterError) Error() string {
	from := "the first identity this broker met"
	if e.Configured {
		from = "configured: Config.Cluster, the URL's cluster="
	}
	if e.Cluster == "" {
		why := "it is a standalone server (its HELLO_OK carries no cluster identity)"
		if e.Version < 3 {
			why = fmt.Sprintf("it speaks protocol version %d, which carries no cluster identity (a server older than protocol version 3)", e.Version)
		}
		return fmt.Sprintf("broker: node %s (%q) has no cluster identity, so it cannot be shown to belong to cluster %q (%s): %s; not used: check the addresses, upgrade the server, or leave cluster= out of the URL for a standalone server",
			e.Addr, e.Node, e.Want, from, why)
	}
	return fmt.Sprintf("broker: node %s (%q) belongs to cluster %q, not %q (%s): not used; check the addresses (every one must be a node of the same cluster or pair)",
		e.Addr, e.Node, e.Cluster, e.Want, from)
}

// Is makes errors.Is(err, ErrWrongCluster) true, and errors.Is(err,
// ErrNoClusterIdentity) for a node without an identity.
func (e *WrongClusterError) Is(target error) bool {
	return target == ErrWrongCluster || (target == ErrNoClusterIdentity && e.Cluster == "")
}

// ServerError is a server E frame: session-fatal; for the request it names,
// a definite "not granted" (or "not released"). Code 3 matches
// ErrUnauthorized.
type ServerError struct {
	Code    uint16 // the E code of docs/protocol.md (1..7)
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

// outcomes are the sentinels of which every returned error matches exactly
// one (besides *ServerError, see hasOutcome).
var outcomes = [...]error{
	ErrInvalidArgument, ErrInvalidConfig, ErrTimedOut, ErrBusy, ErrIndeterminate,
	ErrUnsent, ErrLeaseTooShort, ErrNotHeld, ErrReleaseUnconfirmed, ErrClosed,
	ErrUnauthorized, ErrNotActive, ErrNotReady, ErrCertificate, ErrTLSRequired, ErrServerNotTLS,
	ErrRefreshUnconfirmed, ErrUnsupported, ErrLeaseEnding,
}

// hasOutcome reports whether err matches an outcome: one of the outcome
// sentinels, or a *ServerError.
func hasOutcome(err error) bool {
	var se *ServerError
	if errors.As(err, &se) {
		return true
	}
	for _, o := range outcomes {
		if errors.Is(err, o) {
			return true
		}
	}
	return false
}

// opError is an outcome sentinel (kind) with, for a cancelled call, the
// context's error (ctx), and the cause that led to it. errors.Is and
// errors.As see kind, ctx and, only if it matches no outcome itself, cause:
// an error matches exactly one outcome (docs/semantics.md). The cause is always in the message.
type opError struct {
	kind   error
	msg    string
	ctx    error
	cause  error
	hidden bool // cause matches an outcome: shown, not unwrapped
}

func (e *opError) Error() string {
	s := e.kind.Error()
	if e.msg != "" {
		s += ": " + e.msg
	}
	if e.ctx != nil {
		s += ": " + e.ctx.Error()
	}
	if e.cause != nil {
		s += ": " + e.cause.Error()
	}
	return s
}

func (e *opError) Unwrap() []error {
	errs := make([]error, 1, 3)
	errs[0] = e.kind
	if e.ctx != nil {
		errs = append(errs, e.ctx)
	}
	if e.cause != nil && !e.hidden {
		errs = append(errs, e.cause)
	}
	return errs
}

// newErr is an outcome kind with a cause. A context error as cause is kept
// matchable (a cancelled call matches its context's error); any other
// cause only if it matches no outcome.
func newErr(kind error, msg string, cause error) error {
	if cause == context.Canceled || cause == context.DeadlineExceeded {
		return &opError{kind: kind, msg: msg, ctx: cause}
	}
	return newCtxErr(kind, msg, nil, cause)
}

// newCtxErr is newErr for a cancelled call: ctxErr (ctx.Err()) stays
// matchable, cause only if it matches no outcome.
//
// A cause matching a context error is not unwrapped either: it is not the
// caller's (a dial timeout, another caller's cancel), and a call that was
// not cancelled must not look cancelled.
func newCtxErr(kind error, msg string, ctxErr, cause error) error {
	e := &opError{kind: kind, msg: msg, ctx: ctxErr, cause: cause}
	e.hidden = cause != nil && (hasOutcome(cause) ||
		errors.Is(cause, context.Canceled) || errors.Is(cause, context.DeadlineExceeded))
	return e
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
