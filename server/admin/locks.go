package admin

import (
	"context"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/ticketing-dev/ticketing/server"
)

// The lock browser's endpoints (Options.ConsoleKeys): GET /v1/locks, GET
// /v1/locks/{key} and POST /v1/locks/{key}/expire.

// lockNode is the part of *server.Server the lock browser uses.
type lockNode interface {
	Locks(ctx context.Context, q server.LockQuery) (server.LockPage, error)
	Lock(ctx context.Context, key string) (server.LockDetail, error)
	ExpireLock(ctx context.Context, key string, token uint64, by string) error
	ClusterStatus() (server.ClusterStatus, error)
}

// Answers of the lock browser when it cannot be used.
const (
	msgConsoleOff = "the lock browser is off: key names can be sensitive; start ticketingd serve with --console-keys " +
		"(YAML console-keys: true) and --admin-token to turn it on (admin.Options.ConsoleKeys and Token)"
	msgConsoleNoToken = "the lock browser requires an admin token (--admin-token), even on loopback: it is refused without one"
)

// OperatorHeader is the request header that names who asks for an
// expire now, for the log (optional; at most 128 bytes are logged).
const OperatorHeader = "X-Ticketing-Operator"

// expireTimeout bounds an expire now: past it the answer is 504 (the
// expiry may still apply).
const expireTimeout = 10 * time.Second

// addLockRoutes adds the lock browser's routes to mux: the real ones
// with opts.ConsoleKeys and a token, else answers that say why not.
// (ExpireLock logs each expire now, at Warn, with the remote address and
// the operator as its by.)
func addLockRoutes(mux *http.ServeMux, ln lockNode, opts *Options) {
	routes := []string{"GET /v1/locks", "GET /v1/locks/{key}", "POST /v1/locks/{key}/expire"}
	if !opts.ConsoleKeys || ln == nil || opts.Token == "" {
		code, msg := http.StatusNotFound, msgConsoleOff
		if opts.ConsoleKeys && ln != nil {
			code, msg = http.StatusForbidden, msgConsoleNoToken
		}
		for _, r := range routes {
			mux.HandleFunc(r, func(w http.ResponseWriter, _ *http.Request) {
				writeJSON(w, code, ErrorResponse{Error: msg})
			})
		}
		return
	}
	mux.HandleFunc(routes[0], func(w http.ResponseWriter, r *http.Request) {
		q, err := lockQueryOf(r)
		if err != nil {
			writeJSON(w, http.StatusBadRequest, ErrorResponse{Error: err.Error()})
			return
		}
		pg, err := ln.Locks(r.Context(), q)
		if err != nil {
			writeLockError(w, ln, err)
			return
		}
		resp := LocksResponse{View: pg.View, Locks: make([]Lock, len(pg.Locks)), More: pg.More}
		for i := range pg.Locks {
			resp.Locks[i] = lockOf(&pg.Locks[i])
		}
		if pg.More {
			resp.Next, resp.NextB64 = keyText(pg.Next), b64(pg.Next)
		}
		w.Header().Set("Cache-Control", "no-store")
		writeJSON(w, http.StatusOK, resp)
	})
	mux.HandleFunc(routes[1], func(w http.ResponseWriter, r *http.Request) {
		d, err := ln.Lock(r.Context(), r.PathValue("key"))
		if err != nil {
			writeLockError(w, ln, err)
			return
		}
		w.Header().Set("Cache-Control", "no-store")
		writeJSON(w, http.StatusOK, lockDetailOf(&d))
	})
	mux.HandleFunc(routes[2], func(w http.ResponseWriter, r *http.Request) {
		var req ExpireRequest
		if !changeAllowed(w, r, true) || !decodeBody(w, r, &req) {
			return
		}
		if req.Token == 0 {
			writeJSON(w, http.StatusBadRequest, ErrorResponse{Error: `want {"token": N}, the exact token the key is held with (N > 0)`})
			return
		}
		key := r.PathValue("key")
		by := "admin listener, remote " + r.RemoteAddr
		if op := operator(r); op != "" {
			by += ", operator " + strconv.Quote(op)
		}
		ctx, cancel := context.WithTimeout(r.Context(), expireTimeout)
		defer cancel()
		err := ln.ExpireLock(ctx, key, uint64(req.Token), by)
		if err != nil {
			writeLockError(w, ln, err)
			return
		}
		resp := ExpireResponse{Key: keyText(key), KeyB64: b64(key), Token: req.Token, Expired: true}
		if d, err := ln.Lock(r.Context(), key); err == nil {
			l := lockOf(&d.LockInfo)
			resp.Now = &l
		}
		writeJSON(w, http.StatusOK, resp)
	})
}

// LockPath is the path of key's GET /v1/locks/{key} (POST: add
// "/expire"): every byte but ASCII letters, digits, '-' and '_' is
// percent-escaped, so that '/', '%', blanks, "." and "..", and bytes that
// are not UTF-8 stay one path segment, the key.
func LockPath(key string) string {
	var b strings.Builder
	b.WriteString("/v1/locks/")
	for i := 0; i < len(key); i++ {
		c := key[i]
		if 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '-' || c == '_' {
			b.WriteByte(c)
		} else {
			fmt.Fprintf(&b, "%%%02X", c)
		}
	}
	return b.String()
}

// operator is the request's OperatorHeader, cut to 128 bytes and made
// printable.
func operator(r *http.Request) string {
	op := r.Header.Get(OperatorHeader)
	if len(op) > 128 {
		op = op[:128]
	}
	return strings.Map(func(c rune) rune {
		if c < 0x20 || c == 0x7f || c == utf8.RuneError {
			return '?'
		}
		return c
	}, op)
}

// lockQueryOf reads GET /v1/locks's query: prefix or prefix_b64, after
// or after_b64, limit.
func lockQueryOf(r *http.Request) (server.LockQuery, error) {
	v := r.URL.Query()
	var q server.LockQuery
	var err error
	if q.Prefix, err = textOrB64(v.Get("prefix"), v.Get("prefix_b64"), "prefix"); err != nil {
		return q, err
	}
	if q.After, err = textOrB64(v.Get("after"), v.Get("after_b64"), "after"); err != nil {
		return q, err
	}
	if s := v.Get("limit"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 || n > server.MaxLockPage {
			return q, fmt.Errorf("invalid limit %q: want 1 to %d", s, server.MaxLockPage)
		}
		q.Limit = n
	}
	return q, nil
}

func textOrB64(text, enc, name string) (string, error) {
	if enc == "" {
		return text, nil
	}
	if text != "" {
		return "", fmt.Errorf("give %s or %s_b64, not both", name, name)
	}
	b, err := base64.StdEncoding.DecodeString(enc)
	if err != nil {
		return "", fmt.Errorf("invalid %s_b64: %v", name, err)
	}
	return string(b), nil
}

// keyText is a key as JSON text: itself when it is valid UTF-8, else ""
// (the key_b64 field always has its bytes).
func keyText(k string) string {
	if utf8.ValidString(k) {
		return k
	}
	return ""
}

func b64(k string) string { return base64.StdEncoding.EncodeToString([]byte(k)) }

func lockOf(l *server.LockInfo) Lock {
	j := Lock{Key: keyText(l.Key), KeyB64: b64(l.Key), Token: l.Token, TokenText: strconv.FormatUint(l.Token, 10),
		Owner: hex.EncodeToString(l.Owner[:]), LeaseS: l.LeaseS, OwnedOnly: l.OwnedOnly, Waiters: l.Waiters,
		Holder: sessionOf(l.Holder)}
	if !l.LeaseEnd.IsZero() {
		ms, end := l.LeaseLeft.Milliseconds(), l.LeaseEnd.UTC()
		j.LeaseLeftMS, j.LeaseEnd = &ms, &end
	}
	return j
}

func sessionOf(s *server.Session) *Session {
	if s == nil {
		return nil
	}
	return &Session{Name: s.Name, Addr: s.Addr}
}

func lockDetailOf(d *server.LockDetail) LockResponse {
	resp := LockResponse{View: d.View, Lock: lockOf(&d.LockInfo), Queue: make([]Waiter, len(d.Queue))}
	for i, w := range d.Queue {
		resp.Queue[i] = Waiter{Owner: hex.EncodeToString(w.Owner[:]), LeaseS: w.LeaseS, OwnedOnly: w.OwnedOnly,
			WaitedMS: w.Waited.Milliseconds(), WaitLeftMS: w.WaitLeft.Milliseconds(), WaitEnd: w.WaitEnd.UTC(), Session: sessionOf(w.Session)}
	}
	return resp
}

// writeLockError answers a failed lock-browser request: 404 not held, 409
// another token, 400 not a key, 421 on a node that does not serve (with
// the leader or the active), 504 no answer in time, 503 closing, 500
// otherwise.
func writeLockError(w http.ResponseWriter, ln lockNode, err error) {
	var nle *server.NotLeaderError
	var nae *server.NotActiveError
	switch {
	case errors.Is(err, server.ErrLockNotFound):
		writeJSON(w, http.StatusNotFound, ErrorResponse{Error: err.Error()})
	case errors.Is(err, server.ErrLockToken):
		writeJSON(w, http.StatusConflict, ErrorResponse{Error: err.Error()})
	case errors.Is(err, server.ErrBadKey):
		writeJSON(w, http.StatusBadRequest, ErrorResponse{Error: err.Error()})
	case errors.As(err, &nle):
		resp := MisdirectedResponse{Error: err.Error(), Leader: nle.Leader, LeaderAddress: nle.LeaderAddress}
		if cs, err := ln.ClusterStatus(); err == nil && cs.Leader == nle.Leader {
			resp.LeaderAdvertise = cs.LeaderAdvertise
		}
		writeJSON(w, http.StatusMisdirectedRequest, resp)
	case errors.As(err, &nae):
		writeJSON(w, http.StatusMisdirectedRequest, MisdirectedResponse{Error: err.Error(), Active: nae.Active})
	case errors.Is(err, context.DeadlineExceeded):
		writeJSON(w, http.StatusGatewayTimeout, ErrorResponse{Error: err.Error()})
	case errors.Is(err, server.ErrServerClosed):
		writeJSON(w, http.StatusServiceUnavailable, ErrorResponse{Error: err.Error()})
	default:
		writeJSON(w, http.StatusInternalServerError, ErrorResponse{Error: err.Error()})
	}
}
