package main

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
	"strings"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/ticketing-dev/ticketing/server"
)

// adminConfig is what the admin endpoints need besides the server.
type adminConfig struct {
	// token, if not empty, is required as "Authorization: Bearer TOKEN" on
	// every request but GET /healthz (--admin-token).
	token string
	// cluster, non-nil on a cluster node (the server itself), adds a
	// "cluster" object to /status and the endpoints POST /cluster/add and
	// /cluster/remove.
	cluster clusterNode
	log     *slog.Logger // nil: discard
}

// clusterNode is the part of *server.Server the cluster endpoints use.
type clusterNode interface {
	ClusterStatus() (server.ClusterStatus, error)
	AddVoter(ctx context.Context, id, raftAddr string) error
	RemoveServer(ctx context.Context, id string) error
}

// Admin request limits.
const (
	// adminMaxBody is the largest request body the cluster endpoints read.
	adminMaxBody = 4 << 10
	// clusterChangeTimeout bounds a membership change (below
	// adminWriteTimeout, so that the answer still gets out).
	clusterChangeTimeout = 20 * time.Second
)

// statusBody is the JSON of GET /status: the server's Stats, the build
// of the binary and, on a cluster node, its view of the cluster.
type statusBody struct {
	server.Stats
	Build        buildInfo             `json:"build"`
	Cluster      *server.ClusterStatus `json:"cluster,omitempty"`
	ClusterError string                `json:"cluster_error,omitempty"` // why Cluster is missing on a cluster node
}

// clusterAddRequest is the body of POST /cluster/add.
type clusterAddRequest struct {
	ID      string `json:"id"`      // the new node's --node-id
	Address string `json:"address"` // its Raft address (--raft-advertise)
}

// clusterRemoveRequest is the body of POST /cluster/remove.
type clusterRemoveRequest struct {
	ID string `json:"id"`
}

// clusterChangeResponse is the answer to a membership change that was
// committed: the node changed and the configuration after it, as this
// node sees it.
type clusterChangeResponse struct {
	ID      string                `json:"id"`
	Address string                `json:"address,omitempty"`
	Cluster *server.ClusterStatus `json:"cluster,omitempty"`
}

// adminError is the JSON body of the admin error answers but 409.
type adminError struct {
	Error string `json:"error"`
}

// notLeaderBody is the 409 body (this node is not the leader): the
// leader's node ID and Raft address as far as the node knows them, empty
// when it knows no leader.
type notLeaderBody struct {
	Error         string `json:"error"`
	Leader        string `json:"leader"`
	LeaderAddress string `json:"leader_address"`
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
}

// adminHandler serves /metrics, /healthz and /status, and on a cluster node
// POST /cluster/add and /cluster/remove.
func adminHandler(srv *server.Server, reg *prometheus.Registry, shuttingDown *atomic.Bool, ac adminConfig) http.Handler {
	log := ac.log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		if shuttingDown.Load() {
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
		body := statusBody{Stats: srv.Stats(), Build: readBuildInfo()}
		if ac.cluster != nil {
			if cs, err := ac.cluster.ClusterStatus(); err != nil {
				body.ClusterError = err.Error()
			} else {
				body.Cluster = &cs
			}
		}
		writeJSON(w, http.StatusOK, body)
	})
	if cn := ac.cluster; cn != nil {
		mux.HandleFunc("POST /cluster/add", func(w http.ResponseWriter, r *http.Request) {
			var req clusterAddRequest
			if !changeAllowed(w, r, ac.token != "") || !decodeBody(w, r, &req) {
				return
			}
			if !checkNodeID(w, req.ID) {
				return
			}
			if err := checkHostPort("address", req.Address, hostPortRule{}); err != nil {
				writeJSON(w, http.StatusBadRequest, adminError{Error: err.Error() + " (the node's Raft address, its --raft-advertise)"})
				return
			}
			ctx, cancel := context.WithTimeout(r.Context(), clusterChangeTimeout)
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
			var req clusterRemoveRequest
			if !changeAllowed(w, r, ac.token != "") || !decodeBody(w, r, &req) {
				return
			}
			if !checkNodeID(w, req.ID) {
				return
			}
			if cs, err := cn.ClusterStatus(); err == nil && cs.State == "Leader" && !hasMember(cs, req.ID) {
				writeJSON(w, http.StatusNotFound, adminError{Error: fmt.Sprintf("node %q is not in the cluster configuration", req.ID)})
				return
			}
			ctx, cancel := context.WithTimeout(r.Context(), clusterChangeTimeout)
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
	if ac.token == "" {
		return mux
	}
	return requireToken(ac.token, mux)
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

func changeResponse(cn clusterNode, id, addr string) clusterChangeResponse {
	resp := clusterChangeResponse{ID: id, Address: addr}
	if cs, err := cn.ClusterStatus(); err == nil {
		resp.Cluster = &cs
	}
	return resp
}

// changeAllowed guards the membership changes against a web browser on
// the operator's machine that a hostile page makes post to the admin
// port: the body must be declared JSON (a cross-origin request with that
// content type needs a CORS preflight, which the admin server never
// grants), and without an admin token the request must name a loopback
// host (which a page that rebinds its own DNS name to 127.0.0.1 does not).
// It answers 415 or 403 and returns false otherwise.
func changeAllowed(w http.ResponseWriter, r *http.Request, token bool) bool {
	if mt, _, _ := strings.Cut(r.Header.Get("Content-Type"), ";"); !strings.EqualFold(strings.TrimSpace(mt), "application/json") {
		writeJSON(w, http.StatusUnsupportedMediaType, adminError{Error: "want Content-Type: application/json"})
		return false
	}
	if !token {
		host := r.Host
		if h, _, err := net.SplitHostPort(host); err == nil {
			host = h
		}
		if loopbackIP(strings.Trim(host, "[]")) == nil {
			writeJSON(w, http.StatusForbidden, adminError{Error: fmt.Sprintf("Host %q is not a loopback address: without --admin-token, cluster changes are accepted only for 127.0.0.1, ::1 or localhost", r.Host)})
			return false
		}
	}
	return true
}

// decodeBody reads a JSON request body of at most adminMaxBody bytes into
// v, refusing unknown fields; on failure it answers 400 (413 if too large)
// and returns false.
func decodeBody(w http.ResponseWriter, r *http.Request, v any) bool {
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, adminMaxBody))
	dec.DisallowUnknownFields()
	err := dec.Decode(v)
	if err == nil && dec.More() {
		err = errors.New("more than one JSON value")
	}
	if err != nil {
		code := http.StatusBadRequest
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			code = http.StatusRequestEntityTooLarge
		}
		writeJSON(w, code, adminError{Error: "invalid request body: " + err.Error()})
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
		writeJSON(w, http.StatusConflict, notLeaderBody{Error: err.Error(), Leader: nle.Leader, LeaderAddress: nle.LeaderAddress})
	case errors.Is(err, server.ErrNotLeader):
		writeJSON(w, http.StatusConflict, notLeaderBody{Error: err.Error()})
	case errors.Is(err, context.DeadlineExceeded):
		writeJSON(w, http.StatusGatewayTimeout, adminError{Error: err.Error()})
	default:
		writeJSON(w, http.StatusInternalServerError, adminError{Error: err.Error()})
	}
}

// The 401 answers of requireToken: no credentials, credentials that are
// not a Bearer token, and a Bearer token that is not this listener's.
const (
	adminNoToken    = "unauthorized: no admin token was sent; this admin listener requires Authorization: Bearer TOKEN (its --admin-token)"
	adminNotBearer  = "unauthorized: the Authorization header is not \"Bearer TOKEN\"; this admin listener requires Authorization: Bearer TOKEN (its --admin-token)"
	adminWrongToken = "unauthorized: the admin token sent is not this listener's --admin-token"
)

// requireToken lets through GET /healthz, for probes that cannot send
// headers, and any other request only with "Authorization: Bearer TOKEN".
// The comparison is of SHA-256 digests in constant time, so that neither
// the token's bytes nor its length leak through timing. The answer says
// whether no token, no Bearer token, or a wrong token was sent (which
// tells nothing about the right one).
func requireToken(token string, next http.Handler) http.Handler {
	want := sha256.Sum256([]byte(token))
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/healthz" {
			next.ServeHTTP(w, r)
			return
		}
		h := r.Header.Get("Authorization")
		got, ok := bearerToken(h)
		sum := sha256.Sum256([]byte(got))
		if subtle.ConstantTimeCompare(sum[:], want[:]) != 1 || !ok {
			msg := adminWrongToken
			switch {
			case strings.TrimSpace(h) == "":
				msg = adminNoToken
			case !ok:
				msg = adminNotBearer
			}
			w.Header().Set("WWW-Authenticate", `Bearer realm="ticketingd admin"`)
			writeJSON(w, http.StatusUnauthorized, adminError{Error: msg})
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

// checkNodeID reports whether id is a valid node ID, answering 400 if not.
func checkNodeID(w http.ResponseWriter, id string) bool {
	if validNodeID(id) {
		return true
	}
	writeJSON(w, http.StatusBadRequest, adminError{Error: fmt.Sprintf("invalid id %q: want 1 to %d letters, digits, '.', '_' or '-'", id, maxNodeIDLen)})
	return false
}
