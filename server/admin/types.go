package admin

import "github.com/ticketing-dev/ticketing/server"

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

// ErrorResponse is the JSON body of the error answers (4xx, 5xx) but 409
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
