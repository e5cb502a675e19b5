package admin

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/ticketing-dev/ticketing/internal/httpjson"
	"github.com/ticketing-dev/ticketing/server"
	"github.com/ticketing-dev/ticketing/server/admin/console"
)

// Limits of the cluster endpoints.
const (
	// MaxRequestBody is the largest request body the cluster endpoints
	// read (413 beyond).
	MaxRequestBody = 4 << 10

	// DefaultClusterChangeTimeout is Options.ClusterChangeTimeout's
	// default.
	DefaultClusterChangeTimeout = 20 * time.Second
)

// Options is what the admin handler needs besides the server. The zero
// value serves /healthz and /status without authentication, and no
// /metrics.
type Options struct {
	// Token, if not empty, is required as "Authorization: Bearer TOKEN" on
	// every request but GET /healthz (ticketingd's --admin-token). It
	// should be printable ASCII without blanks, so that it can travel in
	// the header as it is.
	Token string

	// Gatherer is what GET /metrics serves: usually the
	// *prometheus.Registry given to server.Config.Registerer (or
	// prometheus.DefaultGatherer with the DefaultRegisterer). Nil: no
	// /metrics (404).
	Gatherer prometheus.Gatherer

	// Registerer, if non-nil, gets the /metrics handler's own counter,
	// promhttp_metric_handler_errors_total (promhttp.HandlerOpts.Registry);
	// usually the registry that Gatherer reads.
	Registerer prometheus.Registerer

	// ShuttingDown, if non-nil, is asked by every GET /healthz: while it
	// returns true, /healthz answers 503 "shutting down", so that a load
	// balancer stops sending clients before the server stops serving.
	// ticketingd sets it when it starts its graceful shutdown.
	ShuttingDown func() bool

	// Build is /status's "build"; nil: ReadBuildInfo().
	Build *BuildInfo

	// ClusterChangeTimeout bounds a membership change (POST /cluster/add
	// and /cluster/remove): past it the answer is 504. Keep it below the
	// WriteTimeout of the http.Server, so that the answer still gets out.
	// Zero or negative: DefaultClusterChangeTimeout.
	ClusterChangeTimeout time.Duration

	// Logger gets a line per membership change ("admin: cluster add",
	// "admin: cluster remove") with its outcome and the remote address,
	// and the console's line per deployment plan (never a key or a
	// token); nil: discard. (An expire now is logged by the server, at Warn, with
	// the remote address and the X-Ticketing-Operator header.)
	Logger *slog.Logger

	// ConsoleKeys turns the lock browser on (ticketingd's --console-keys):
	// GET /v1/locks, GET /v1/locks/{key} and POST /v1/locks/{key}/expire.
	// Key names can be sensitive: off, those answer 404 saying how to
	// turn it on; on, they require Token, even on loopback (403 without
	// one).
	ConsoleKeys bool

	// NoConsole turns the web console (package console: GET /,
	// /v1/overview, /v1/events, /deploy, /assets/) off: those paths are
	// 404 then.
	NoConsole bool

	// AllowedHosts are the host names, besides localhost, that requests
	// may name in their Host header when Token is empty ("*" for any,
	// "*.example.com" for the names below example.com; case-insensitive,
	// the port not compared). Any other name gets 403 on every path,
	// against DNS rebinding: a web page whose name resolves to this
	// server's address cannot read it through the operator's browser. IP
	// addresses (a scrape or a probe by address) are always allowed.
	// ticketingd gives the hosts of --admin-listen, --listen, --advertise
	// and --raft-advertise, and those of --admin-allowed-host. Unused with
	// a Token, which a rebinding page does not have.
	AllowedHosts []string

	// ConsoleRoutes are further handlers of the console by http.ServeMux
	// pattern (console.Options.Routes), behind the admin token like the
	// rest. (The lock browser's JSON is this handler's own, and the
	// deployment page the console's.)
	ConsoleRoutes map[string]http.Handler
}

// node is the part of *server.Server every admin handler uses.
type node interface {
	Stats() server.Stats
	TokenStoreErr() error
}

// clusterNode is the part of a cluster node's *server.Server the cluster
// endpoints use.
type clusterNode interface {
	ClusterStatus() (server.ClusterStatus, error)
	AddVoter(ctx context.Context, id, raftAddr string) error
	RemoveServer(ctx context.Context, id string) error
}

// New returns the admin handler of srv, which must not be nil: GET
// /healthz, /status and /metrics, and on a cluster node (a server whose
// ClusterStatus does not return server.ErrNotCluster) POST /cluster/add
// and /cluster/remove (see the package documentation). The handler is
// safe for concurrent use; mount it at the root of a mux or an
// http.Server of its own, since its paths are absolute.
func New(srv *server.Server, opts Options) http.Handler {
	if srv == nil {
		panic("admin: New with a nil *server.Server")
	}
	var cn clusterNode
	if _, err := srv.ClusterStatus(); !errors.Is(err, server.ErrNotCluster) {
		cn = srv
	}
	return newHandler(srv, cn, srv, opts)
}

// newHandler is New with the server's parts as interfaces; cn is nil on a
// server that is not a cluster node, ln nil without a lock browser.
func newHandler(srv node, cn clusterNode, ln lockNode, opts Options) http.Handler {
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	build := ReadBuildInfo()
	if opts.Build != nil {
		build = *opts.Build
	}
	changeTimeout := opts.ClusterChangeTimeout
	if changeTimeout <= 0 {
		changeTimeout = DefaultClusterChangeTimeout
	}
	mux := http.NewServeMux()
	if opts.Gatherer != nil {
		mux.Handle("GET /metrics", promhttp.HandlerFor(opts.Gatherer, promhttp.HandlerOpts{Registry: opts.Registerer}))
	}
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		if opts.ShuttingDown != nil && opts.ShuttingDown() {
			w.WriteHeader(http.StatusServiceUnavailable)
			io.WriteString(w, "shutting down\n")
			return
		}
		if err := srv.TokenStoreErr(); err != nil {
			// No new token can be reserved: grants of free keys fail.
			w.WriteHeader(http.StatusServiceUnavailable)
			fmt.Fprintf(w, "token store: %v\n", err)
			return
		}
		io.WriteString(w, "ok\n")
	})
	mux.HandleFunc("GET /status", func(w http.ResponseWriter, r *http.Request) {
		body := Status{Stats: srv.Stats(), Build: build}
		if cn != nil {
			if cs, err := cn.ClusterStatus(); err != nil {
				body.ClusterError = err.Error()
			} else {
				body.Cluster = &cs
			}
		}
		writeJSON(w, http.StatusOK, body)
	})
	if !opts.NoConsole {
		c := console.New(console.Options{
			Node:         consoleNode{srv, cn},
			Version:      build.Version,
			Revision:     build.Revision,
			ShuttingDown: opts.ShuttingDown,
			LoopbackOnly: opts.Token == "",
			Routes:       opts.ConsoleRoutes,
			LockBrowser:  opts.ConsoleKeys && opts.Token != "",
			Logger:       log,
		})
		for _, p := range c.Patterns() {
			mux.Handle(p, c)
		}
	}
	if cn != nil {
		hasToken := opts.Token != ""
		mux.HandleFunc("POST /cluster/add", func(w http.ResponseWriter, r *http.Request) {
			var req ClusterAddRequest
			if !changeAllowed(w, r, hasToken) || !decodeBody(w, r, &req) {
				return
			}
			if !checkNodeID(w, req.ID) {
				return
			}
			if err := checkRaftAddress(req.Address); err != nil {
				writeJSON(w, http.StatusBadRequest, ErrorResponse{Error: err.Error() + " (the node's Raft address, its --raft-advertise)"})
				return
			}
			ctx, cancel := context.WithTimeout(r.Context(), changeTimeout)
			defer cancel()
			err := cn.AddVoter(ctx, req.ID, req.Address)
			log.Info("admin: cluster add", "id", req.ID, "address", req.Address, "remote", r.RemoteAddr, "err", errString(err))
			if err != nil {
				writeChangeError(w, err)
				return
			}
			writeJSON(w, http.StatusOK, changeResponse(cn, req.ID, req.Address))
		})
		mux.HandleFunc("POST /cluster/remove", func(w http.ResponseWriter, r *http.Request) {
			var req ClusterRemoveRequest
			if !changeAllowed(w, r, hasToken) || !decodeBody(w, r, &req) {
				return
			}
			if !checkNodeID(w, req.ID) {
				return
			}
			if cs, err := cn.ClusterStatus(); err == nil && cs.State == "Leader" && !hasMember(cs, req.ID) {
				writeJSON(w, http.StatusNotFound, ErrorResponse{Error: fmt.Sprintf("node %q is not in the cluster configuration", req.ID)})
				return
			}
			ctx, cancel := context.WithTimeout(r.Context(), changeTimeout)
			defer cancel()
			err := cn.RemoveServer(ctx, req.ID)
			log.Info("admin: cluster remove", "id", req.ID, "remote", r.RemoteAddr, "err", errString(err))
			if err != nil {
				writeChangeError(w, err)
				return
			}
			writeJSON(w, http.StatusOK, changeResponse(cn, req.ID, ""))
		})
	}
	addLockRoutes(mux, ln, &opts)
	if opts.Token == "" {
		return newHostCheck(opts.AllowedHosts, mux)
	}
	return RequireToken(opts.Token, mux)
}

// consoleNode is the console's view of the server: its Stats, and its
// ClusterStatus on a cluster node.
type consoleNode struct {
	node
	cn clusterNode
}

func (n consoleNode) ClusterStatus() (server.ClusterStatus, error) {
	if n.cn == nil {
		return server.ClusterStatus{}, server.ErrNotCluster
	}
	return n.cn.ClusterStatus()
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
}

func hasMember(cs server.ClusterStatus, id string) bool {
	for _, m := range cs.Servers {
		if m.ID == id {
			return true
		}
	}
	return false
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

func changeResponse(cn clusterNode, id, addr string) ClusterChangeResponse {
	resp := ClusterChangeResponse{ID: id, Address: addr}
	if cs, err := cn.ClusterStatus(); err == nil {
		resp.Cluster = &cs
	}
	return resp
}

// changeAllowed guards the membership changes against a web browser on
// the operator's machine that a hostile page makes post to the admin
// port: the body must be declared JSON (a cross-origin request with that
// content type needs a CORS preflight, which the admin handler never
// grants), and without an admin token the request must name a loopback
// host (which a page that rebinds its own DNS name to 127.0.0.1 does not).
// It answers 415 or 403 and returns false otherwise.
func changeAllowed(w http.ResponseWriter, r *http.Request, token bool) bool {
	if !httpjson.IsJSON(r) {
		writeJSON(w, http.StatusUnsupportedMediaType, ErrorResponse{Error: "want Content-Type: application/json"})
		return false
	}
	if !token {
		if !console.IsLoopbackHost(r.Host) {
			writeJSON(w, http.StatusForbidden, ErrorResponse{Error: fmt.Sprintf("Host %q is not a loopback address: without --admin-token, cluster changes are accepted only for 127.0.0.1, ::1 or localhost", r.Host)})
			return false
		}
	}
	return true
}

// decodeBody reads a JSON request body of at most MaxRequestBody bytes
// into v, refusing unknown fields; on failure it answers 400 (413 if too
// large) and returns false.
func decodeBody(w http.ResponseWriter, r *http.Request, v any) bool {
	if code, err := httpjson.Decode(w, r, MaxRequestBody, v); err != nil {
		writeJSON(w, code, ErrorResponse{Error: err.Error()})
		return false
	}
	return true
}

// writeChangeError answers a failed membership change: 409 with the leader
// when this node is not the leader, 504 when it did not commit in time,
// 500 otherwise.
func writeChangeError(w http.ResponseWriter, err error) {
	var nle *server.NotLeaderError
	switch {
	case errors.As(err, &nle):
		writeJSON(w, http.StatusConflict, NotLeaderResponse{Error: err.Error(), Leader: nle.Leader, LeaderAddress: nle.LeaderAddress})
	case errors.Is(err, server.ErrNotLeader):
		writeJSON(w, http.StatusConflict, NotLeaderResponse{Error: err.Error()})
	case errors.Is(err, context.DeadlineExceeded):
		writeJSON(w, http.StatusGatewayTimeout, ErrorResponse{Error: err.Error()})
	default:
		writeJSON(w, http.StatusInternalServerError, ErrorResponse{Error: err.Error()})
	}
}

// checkNodeID reports whether id is a valid node ID, answering 400 if not.
func checkNodeID(w http.ResponseWriter, id string) bool {
	if server.ValidNodeID(id) {
		return true
	}
	writeJSON(w, http.StatusBadRequest, ErrorResponse{Error: fmt.Sprintf("invalid id %q: want 1 to %d letters, digits, '.', '_' or '-'", id, server.MaxNodeIDLen)})
	return false
}

// checkRaftAddress validates the address of a node to add: HOST:PORT with
// a port from 1 to 65535 and a host that is not empty nor a wildcard
// address (0.0.0.0, ::), since the other nodes dial it. The texts are
// ticketingd's for an address flag (its checkHostPort).
func checkRaftAddress(addr string) error {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("invalid address %q: want HOST:PORT", addr)
	}
	if p, err := strconv.Atoi(port); err != nil || p < 1 || p > 65535 {
		return fmt.Errorf("invalid address %q: want a port 1..65535", addr)
	}
	if ip := net.ParseIP(host); host == "" || ip != nil && ip.IsUnspecified() {
		return fmt.Errorf("invalid address %q: want a specific host, not a wildcard address", addr)
	}
	return nil
}

// The 401 answers of requireToken: no credentials, credentials that are
// not a Bearer token, and a Bearer token that is not this listener's.
const (
	msgNoToken    = "unauthorized: no admin token was sent; this admin listener requires Authorization: Bearer TOKEN (its --admin-token)"
	msgNotBearer  = "unauthorized: the Authorization header is not \"Bearer TOKEN\"; this admin listener requires Authorization: Bearer TOKEN (its --admin-token)"
	msgWrongToken = "unauthorized: the admin token sent is not this listener's --admin-token"
)

// RequireToken lets through GET /healthz, for probes that cannot send
// headers, and any other request only with "Authorization: Bearer TOKEN"
// or, for a web browser (the console), HTTP Basic authentication with
// TOKEN as the password (any user name). The comparison is of SHA-256
// digests in constant time, so that neither the token's bytes nor its
// length leak through timing. The 401 answer says whether no token, no
// Bearer token, or a wrong token was sent (which tells nothing about the
// right one), and challenges Bearer and Basic, so that a browser asks for
// the token. New uses it when Options.Token is set; ticketingd console
// wraps the console in it.
func RequireToken(token string, next http.Handler) http.Handler {
	want := sha256.Sum256([]byte(token))
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/healthz" {
			next.ServeHTTP(w, r)
			return
		}
		h := r.Header.Get("Authorization")
		got, ok := bearerToken(h)
		if !ok {
			_, got, ok = r.BasicAuth()
		}
		sum := sha256.Sum256([]byte(got))
		if subtle.ConstantTimeCompare(sum[:], want[:]) != 1 || !ok {
			msg := msgWrongToken
			switch {
			case strings.TrimSpace(h) == "":
				msg = msgNoToken
			case !ok:
				msg = msgNotBearer
			}
			w.Header().Set("WWW-Authenticate", `Bearer realm="ticketingd admin"`)
			w.Header().Add("WWW-Authenticate", `Basic realm="ticketingd admin", charset="UTF-8"`)
			writeJSON(w, http.StatusUnauthorized, ErrorResponse{Error: msg})
			return
		}
		next.ServeHTTP(w, r)
	})
}

// bearerToken returns the token of an "Authorization: Bearer TOKEN"
// header value (the scheme is case-insensitive, RFC 6750).
func bearerToken(h string) (string, bool) {
	scheme, tok, ok := strings.Cut(h, " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return "", false
	}
	tok = strings.TrimSpace(tok)
	return tok, tok != ""
}
