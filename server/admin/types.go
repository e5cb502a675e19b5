package admin

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/ticketing-dev/ticketing/server"
)

// Status is the JSON of GET /status: the server's Stats (its fields at
// the top level), the build of the binary and, on a cluster node, its
// view of the cluster.
type Status struct {
	server.Stats

	// Build identifies the running binary (Options.Build).
	Build BuildInfo `json:"build"`

	// Cluster is the node's view of the cluster; nil (absent) on a server
	// that is not a cluster node.
	Cluster *server.ClusterStatus `json:"cluster,omitempty"`

	// ClusterError says why Cluster is missing on a cluster node; empty
	// (absent) otherwise.
	ClusterError string `json:"cluster_error,omitempty"`
}

// ClusterAddRequest is the body of POST /cluster/add.
type ClusterAddRequest struct {
	// ID is the new node's server.ClusterConfig.NodeID (ticketingd's
	// --node-id).
	ID string `json:"id"`
	// Address is its Raft address, server.ClusterConfig.RaftAdvertise
	// (--raft-advertise): HOST:PORT with a specific host and a port from 1
	// to 65535.
	Address string `json:"address"`
}

// ClusterRemoveRequest is the body of POST /cluster/remove.
type ClusterRemoveRequest struct {
	// ID is the node to remove (its NodeID).
	ID string `json:"id"`
}

// ClusterChangeResponse is the answer (200) to a membership change that
// was committed: the node changed and the configuration after the change,
// as the answering node sees it.
type ClusterChangeResponse struct {
	// ID is the node added or removed.
	ID string `json:"id"`
	// Address is the Raft address of the node added; empty (absent) for a
	// removal.
	Address string `json:"address,omitempty"`
	// Cluster is the answering node's view after the change.
	Cluster *server.ClusterStatus `json:"cluster,omitempty"`
}

// ErrorResponse is the JSON body of the error answers (4xx, 5xx) but a
// membership change's 409 (NotLeaderResponse), 421 (MisdirectedResponse)
// and the mux's own 404 and 405, which are plain text.
type ErrorResponse struct {
	// Error says what was wrong.
	Error string `json:"error"`
}

// NotLeaderResponse is the body of 409: a membership change was asked of
// a node that is not the leader (server.NotLeaderError).
type NotLeaderResponse struct {
	// Error is the error's text.
	Error string `json:"error"`
	// Leader is the leader's node ID as far as the node knows it; empty
	// when it knows no leader.
	Leader string `json:"leader"`
	// LeaderAddress is the leader's Raft address; empty when unknown.
	LeaderAddress string `json:"leader_address"`
}

// The lock browser's JSON (GET /v1/locks, GET /v1/locks/{key}, POST
// /v1/locks/{key}/expire; Options.ConsoleKeys).
//
// Keys are opaque bytes: key_b64 always has them (standard base64, with
// padding), and key has them as text when they are valid UTF-8 (else it
// is ""). Tokens are JSON numbers up to 2^63-1, beyond what a JavaScript
// number holds exactly (2^53): token_text has the same token as decimal
// text, and an ExpireRequest takes either.

// Lock is a held lock.
type Lock struct {
	Key       string `json:"key"`        // the key as text, if valid UTF-8; else ""
	KeyB64    string `json:"key_b64"`    // the key's bytes, base64
	Token     uint64 `json:"token"`      // the holding's fencing token
	TokenText string `json:"token_text"` // the same, as decimal text
	Owner     string `json:"owner"`      // the holder's owner (16 bytes), hex
	LeaseS    int    `json:"lease_s"`    // the holding's lease_s
	OwnedOnly bool   `json:"owned_only"` // only RELEASE_OWNED may free it
	// LeaseLeftMS is how long until the lease ends, and LeaseEnd when
	// (RFC 3339, the answering node's clock); absent in an applied view
	// (server.ViewFollowerApplied, ViewPassiveApplied).
	LeaseLeftMS *int64     `json:"lease_left_ms,omitempty"`
	LeaseEnd    *time.Time `json:"lease_end,omitempty"`
	Waiters     int        `json:"waiters"` // ACQUIREs queued for the key (0 in an applied view)
	// Holder is the session whose ACQUIRE was granted (kept after it
	// closes); absent when unknown (restored by a takeover, applied view).
	Holder *Session `json:"holder,omitempty"`
}

// Session is a session's identity: the client name of its HELLO (bytes
// that are not UTF-8 show as U+FFFD) and its remote address.
type Session struct {
	Name string `json:"name"`
	Addr string `json:"addr"`
}

// LocksResponse is the answer to GET /v1/locks?prefix=&after=&limit=: a
// page of held locks sorted by key (bytewise). View is where they come
// from (server.LockPage.View). With More, there are locks after the page
// (or may be: a page whose search went through its most keys, 10,000,
// before it was full has fewer locks, maybe none): the next page is
// after=Next (after_b64=NextB64 for a key that is not UTF-8).
type LocksResponse struct {
	View    string `json:"view"`
	Locks   []Lock `json:"locks"`
	More    bool   `json:"more"`
	Next    string `json:"next,omitempty"`
	NextB64 string `json:"next_b64,omitempty"`
}

// Waiter is an ACQUIRE waiting in a key's queue.
type Waiter struct {
	Owner      string    `json:"owner"` // hex
	LeaseS     int       `json:"lease_s"`
	OwnedOnly  bool      `json:"owned_only"`
	WaitedMS   int64     `json:"waited_ms"`         // since its ACQUIRE was read
	WaitLeftMS int64     `json:"wait_left_ms"`      // until its wait_s ends (T then)
	WaitEnd    time.Time `json:"wait_end"`          // when (RFC 3339, the answering node's clock)
	Session    *Session  `json:"session,omitempty"` // absent when unknown
}

// LockResponse is the answer to GET /v1/locks/{key}: the holding and its
// waiters in FIFO order (the order in which they will be granted).
type LockResponse struct {
	View string `json:"view"`
	Lock
	Queue []Waiter `json:"queue"`
}

// ExpireRequest is the body of POST /v1/locks/{key}/expire.
type ExpireRequest struct {
	// Token is the exact token the key is held with (from the browser):
	// a JSON number or its decimal text.
	Token TokenValue `json:"token"`
}

// TokenValue is a fencing token in JSON: it decodes from a number or a
// string of decimal digits, and encodes as a number.
type TokenValue uint64

// UnmarshalJSON decodes a number or a decimal string.
func (t *TokenValue) UnmarshalJSON(b []byte) error {
	s := strings.Trim(string(b), `"`)
	v, err := strconv.ParseUint(s, 10, 63)
	if err != nil {
		return fmt.Errorf("token %s: want a number from 1 to 2^63-1", b)
	}
	*t = TokenValue(v)
	return nil
}

// ExpireResponse is the answer (200) to an expire now that applied: the
// key, the token expired and, if the key is held again (its next waiter
// granted), the new holding.
type ExpireResponse struct {
	Key     string     `json:"key"`
	KeyB64  string     `json:"key_b64"`
	Token   TokenValue `json:"token"`
	Expired bool       `json:"expired"`
	Now     *Lock      `json:"now,omitempty"`
}

// MisdirectedResponse is the body of 421: an expire now asked of a node
// that does not serve. On a cluster node, the leader as it knows it; on a
// pair's passive, the active's client address.
type MisdirectedResponse struct {
	Error           string `json:"error"`
	Leader          string `json:"leader,omitempty"`           // the leader's node ID
	LeaderAddress   string `json:"leader_address,omitempty"`   // its Raft address
	LeaderAdvertise string `json:"leader_advertise,omitempty"` // its client address
	Active          string `json:"active,omitempty"`           // a pair's active (client address)
}
