package main

import (
	"context"
	"fmt"
	"io"
	"strings"

	"github.com/spf13/cobra"

	"github.com/ticketing-dev/ticketing/server"
	"github.com/ticketing-dev/ticketing/server/admin"
)

func newPairCmd(stdout io.Writer) *cobra.Command {
	var o clusterCmdOptions
	cmd := &cobra.Command{
		Use:   "pair status --admin HOST:PORT[,HOST:PORT]",
		Short: "Show a pair's state through its nodes' admin listeners",
		Long: `Show an active/passive pair's state through the admin listeners
(--admin-listen) of its nodes:

  ticketingd pair status --admin A,B    each node's view: role, state, serving, epoch, pair ID,
                                        peer alive, replication; and which node is active

Give both nodes' admin addresses to see both views side by side: the
command asks every --admin node (not only the first that answers) and ends
with which of them is active (or that none is, or that both are). The
admin token is --admin-token, or else the environment variable ` + adminTokenEnv + `.`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			return usagef("missing pair command (status)")
		},
	}
	o.addFlags(cmd, "pair status asks every one of them")
	status := &cobra.Command{
		Use:   "status --admin HOST:PORT[,HOST:PORT]",
		Short: "Print each node's view of the pair (role, state, epoch, pair ID, peer alive, replication) and which node is active",
		Args:  noArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := o.check(); err != nil {
				return err
			}
			return pairStatus(cmd.Context(), &o, stdout)
		},
	}
	cmd.AddCommand(status)
	return cmd
}

// pairNodeView is one --admin node's answer to 'ticketingd pair status'
// (its --json form with several --admin nodes).
type pairNodeView struct {
	Admin  string             `json:"admin"`
	Status *server.PairStatus `json:"status,omitempty"`
	Stats  *server.Stats      `json:"stats,omitempty"`
	Error  string             `json:"error,omitempty"`
}

// pairStatus prints the view of every --admin node, then which is active.
// It fails (exit 1) if none of them answers as a pair node.
func pairStatus(ctx context.Context, o *clusterCmdOptions, stdout io.Writer) error {
	views := make([]pairNodeView, 0, len(o.Admins))
	var lastErr error
	answered := 0
	for _, a := range o.Admins {
		o.Admin = a
		v := pairNodeView{Admin: a}
		var st admin.Status
		err := getStatus(ctx, o, &st)
		switch {
		case err != nil:
		case st.Pair == nil && st.Cluster != nil:
			err = runtimef("the node at %s is not a pair node: it is a cluster node (%s): use 'ticketingd cluster status'", a, st.Cluster.NodeID)
		case st.Pair == nil:
			err = runtimef("the node at %s is not a pair node (role %s)", a, st.Role)
		default:
			v.Status, v.Stats = st.Pair, &st.Stats
			answered++
		}
		if err != nil {
			v.Error, lastErr = err.Error(), err
		}
		views = append(views, v)
	}
	if answered == 0 {
		return lastErr
	}
	if o.JSON {
		if len(views) == 1 {
			return printJSON(stdout, views[0].Status)
		}
		return printJSON(stdout, views)
	}
	for i, v := range views {
		if i > 0 {
			fmt.Fprintln(stdout)
		}
		if v.Status == nil {
			fmt.Fprintf(stdout, "node at %s: no answer: %s\n", v.Admin, v.Error)
			continue
		}
		printPairStatus(stdout, v.Admin, v.Status, v.Stats)
	}
	fmt.Fprintln(stdout)
	fmt.Fprintln(stdout, pairActiveLine(views))
	return nil
}

// printPairStatus writes one node's view of the pair.
func printPairStatus(w io.Writer, adminAddr string, ps *server.PairStatus, st *server.Stats) {
	serving := "not serving clients"
	if ps.Serving {
		serving = fmt.Sprintf("serving clients (token epoch %d)", ps.Epoch)
	}
	fmt.Fprintf(w, "node at %s: %s, %s, %s\n", adminAddr, ps.Role, ps.State, serving)
	fmt.Fprintf(w, "pair %s\n", orUnknown(ps.ID))
	peer := "not alive (no heartbeat within two intervals)"
	if ps.PeerAlive {
		peer = "alive"
	}
	fmt.Fprintf(w, "peer %s: %s, state %s, clients %s; heartbeat every %s\n", ps.Peer, peer, orUnknown(ps.PeerState), orUnknown(ps.PeerAdvertise), ps.Heartbeat)
	switch {
	case ps.Serving && ps.Replicating:
		fmt.Fprintf(w, "replication: streaming to the passive, which acknowledges each command\n")
	case ps.Serving:
		fmt.Fprintf(w, "replication: none (no passive attached): %d commands applied unreplicated\n", ps.Unreplicated)
	case ps.HasState:
		fmt.Fprintf(w, "replication: holds the pair's lock state (from the active)\n")
	default:
		fmt.Fprintf(w, "replication: holds no lock state yet\n")
	}
	fmt.Fprintf(w, "last token %d, token ceiling %d, epoch mark %d, held locks %d", ps.LastToken, ps.TokenCeiling, ps.EpochMark, ps.HeldLocks)
	if st != nil {
		fmt.Fprintf(w, ", sessions %d", st.Sessions)
	}
	fmt.Fprintln(w)
	if ps.DualActives > 0 || ps.DualPassives > 0 {
		fmt.Fprintf(w, "! heartbeats seen with both nodes serving: %d; with neither: %d\n", ps.DualActives, ps.DualPassives)
	}
}

// pairActiveLine says which of the nodes asked is active.
func pairActiveLine(views []pairNodeView) string {
	var active []string
	for _, v := range views {
		if v.Status != nil && v.Status.Serving {
			active = append(active, fmt.Sprintf("%s (%s)", v.Admin, v.Status.Role))
		}
	}
	switch len(active) {
	case 0:
		return "active: none of the nodes asked serves (a start, a failover under way, or the active was not asked: give both nodes' --admin)"
	case 1:
		return "active: the node at " + active[0]
	}
	return "active: BOTH nodes serve (" + strings.Join(active, ", ") + "): split brain; see the operations guide"
}
