package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/ticketing-dev/ticketing/server"
	"github.com/ticketing-dev/ticketing/server/admin"
)

// adminTokenEnv is the environment variable 'ticketingd cluster' reads the
// admin token from when --admin-token is not given.
const adminTokenEnv = "TICKETING_ADMIN_TOKEN"

// clusterCmdOptions are the flags of every command that calls a node's
// admin listener: 'ticketingd cluster' and 'ticketingd locks'.
type clusterCmdOptions struct {
	Admins  []string // --admin: the nodes to ask, in order
	Admin   string   // the one being asked
	Token   string
	JSON    bool
	Timeout time.Duration
}

func newClusterCmd(stdout, stderr io.Writer) *cobra.Command {
	var o clusterCmdOptions
	cmd := &cobra.Command{
		Use:   "cluster status|add|remove --admin HOST:PORT",
		Short: "Show or change a cluster's membership through a node's admin listener",
		Long: `Show or change a Raft cluster's membership through the admin listener
(--admin-listen) of one of its nodes:

  ticketingd cluster status --admin HOST:PORT             the node's view: leader, term, indexes, members
                                                          (the leader's: reachable, last contact, lag)
  ticketingd cluster add ID=RAFTADDR --admin HOST:PORT    add a node as a voter (on the leader)
  ticketingd cluster remove ID --admin HOST:PORT          remove a node (on the leader)

add and remove must reach the leader's admin listener; a node that is not
the leader refuses (exit 1) and says which node leads, so that the command
can be repeated there. With several --admin addresses (A,B,C) every
command asks them in turn until one is the leader; if none leads, status
shows the view of the first that answers, with a note that says so (no
leader known, or the leader is not among them). The admin token is --admin-token, or else the environment
variable ` + adminTokenEnv + `.`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			return usagef("missing cluster command (status, add or remove)")
		},
	}
	o.addFlags(cmd, "until one is the leader")

	status := &cobra.Command{
		Use:   "status --admin HOST:PORT",
		Short: "Print the node's view of the cluster: leader, term, indexes, members (on the leader: reachable, last contact, log index, lag)",
		Args:  noArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := o.check(); err != nil {
				return err
			}
			return clusterStatus(cmd.Context(), &o, stdout, stderr)
		},
	}
	add := &cobra.Command{
		Use:   "add ID=RAFTADDR --admin HOST:PORT",
		Short: "Add a node (its --node-id and --raft-advertise address) to the cluster as a voter",
		Long: `Add a node to the cluster as a voter. ID is the new node's --node-id,
RAFTADDR its Raft address (--raft-advertise, default --raft-listen). Start
the new node first, with --cluster and without --peers (a node without Raft
state and without --peers waits to be added), then run this against the
leader's admin listener.`,
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(args) != 1 {
				return usagef("cluster add takes one argument, ID=RAFTADDR; got %d", len(args))
			}
			peers, err := parsePeers("node", args)
			if err != nil {
				return err
			}
			if len(peers) != 1 {
				return usagef("cluster add adds one node: want ID=RAFTADDR, got %q", args[0])
			}
			if err := o.check(); err != nil {
				return err
			}
			return clusterChange(cmd.Context(), &o, stdout, "/cluster/add", admin.ClusterAddRequest{ID: peers[0].ID, Address: peers[0].Address})
		},
	}
	remove := &cobra.Command{
		Use:   "remove ID --admin HOST:PORT",
		Short: "Remove a node from the cluster",
		Long: `Remove a node (by its --node-id) from the cluster's configuration. Run it
against the leader's admin listener.`,
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(args) != 1 {
				return usagef("cluster remove takes one argument, the node ID; got %d", len(args))
			}
			if !validNodeID(args[0]) {
				return usagef("invalid node ID %q: want 1 to %d letters, digits, '.', '_' or '-'", args[0], maxNodeIDLen)
			}
			if err := o.check(); err != nil {
				return err
			}
			return clusterChange(cmd.Context(), &o, stdout, "/cluster/remove", admin.ClusterRemoveRequest{ID: args[0]})
		},
	}
	cmd.AddCommand(status, add, remove)
	return cmd
}

// addFlags adds the admin-calling flags to cmd, for it and its
// subcommands: --admin (several: asked in turn; the changes, until one
// serves: retry says which), --admin-token, --json and --timeout.
func (o *clusterCmdOptions) addFlags(cmd *cobra.Command, retry string) {
	pf := cmd.PersistentFlags()
	pf.StringSliceVar(&o.Admins, "admin", nil, "`HOST:PORT` of a node's admin listener (its --admin-listen); several (comma-separated or repeated): ask them in turn, "+retry)
	pf.StringVar(&o.Token, "admin-token", "", "the node's --admin-token (default $"+adminTokenEnv+")")
	pf.BoolVar(&o.JSON, "json", false, "print the answer as JSON")
	pf.DurationVar(&o.Timeout, "timeout", 30*time.Second, "give up on the admin request after this long")
}

// check validates the common flags and fills in the token from the
// environment.
func (o *clusterCmdOptions) check() error {
	if len(o.Admins) == 0 {
		return usagef("--admin is required: the HOST:PORT of a node's admin listener (its --admin-listen)")
	}
	for i, a := range o.Admins {
		a = strings.TrimSuffix(strings.TrimPrefix(strings.TrimSpace(a), "http://"), "/")
		if err := checkHostPort("--admin", a, hostPortRule{}); err != nil {
			return err
		}
		o.Admins[i] = a
	}
	if o.Token == "" {
		o.Token = os.Getenv(adminTokenEnv)
	}
	if !validAdminToken(o.Token) {
		return usagef("invalid admin token: want printable ASCII without blanks")
	}
	if o.Timeout <= 0 {
		return usagef("invalid --timeout %v: must be > 0", o.Timeout)
	}
	return nil
}

// adminCall makes one request to the admin listener and returns the
// answer's status code and body. A transport failure is a runtime error.
func adminCall(ctx context.Context, o *clusterCmdOptions, method, path string, reqBody any) (int, []byte, error) {
	return adminCallHeader(ctx, o, method, path, reqBody, nil)
}

// adminCallHeader is adminCall with more request headers.
func adminCallHeader(ctx context.Context, o *clusterCmdOptions, method, path string, reqBody any, header http.Header) (int, []byte, error) {
	var body io.Reader
	if reqBody != nil {
		b, err := json.Marshal(reqBody)
		if err != nil {
			return 0, nil, runtimef("encode request: %w", err)
		}
		body = bytes.NewReader(b)
	}
	ctx, cancel := context.WithTimeout(ctx, o.Timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, "http://"+o.Admin+path, body)
	if err != nil {
		return 0, nil, runtimef("admin request: %w", err)
	}
	for k, v := range header {
		req.Header[k] = v
	}
	if reqBody != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if o.Token != "" {
		req.Header.Set("Authorization", "Bearer "+o.Token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, nil, runtimef("admin listener %s: %w", o.Admin, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return 0, nil, runtimef("admin listener %s: read answer: %w", o.Admin, err)
	}
	return resp.StatusCode, b, nil
}

// answerError turns a non-2xx admin answer into a runtime error that says
// what to do: for 409, which node leads.
func answerError(o *clusterCmdOptions, code int, body []byte) error {
	var nl admin.NotLeaderResponse
	if err := json.Unmarshal(body, &nl); err != nil || nl.Error == "" {
		return runtimef("admin listener %s: %s: %s", o.Admin, http.StatusText(code), strings.TrimSpace(string(body)))
	}
	switch {
	case code == http.StatusConflict && nl.Leader != "":
		return runtimef("the node at %s is not the leader; the leader is %s (Raft address %s): repeat the command against %s's admin listener",
			o.Admin, nl.Leader, nl.LeaderAddress, nl.Leader)
	case code == http.StatusConflict:
		return runtimef("the node at %s is not the leader and knows no leader (an election may be running, or a majority of the nodes is down): retry later, or against another node", o.Admin)
	}
	return adminError(o, code, nl.Error)
}

// adminError is the runtime error of a JSON error answer (msg, its
// "error") that is not the endpoint's own: for 401, what to do about the
// token.
func adminError(o *clusterCmdOptions, code int, msg string) error {
	switch {
	case code == http.StatusUnauthorized && o.Token == "":
		return runtimef("admin listener %s: %s (no admin token given: give --admin-token or set %s)", o.Admin, msg, adminTokenEnv)
	case code == http.StatusUnauthorized:
		return runtimef("admin listener %s: %s (the token given by --admin-token or %s is wrong: it must equal the node's --admin-token, as in the admin-token file of ticketingd init --cluster)", o.Admin, msg, adminTokenEnv)
	}
	return runtimef("admin listener %s: %s: %s", o.Admin, http.StatusText(code), msg)
}

// clusterStatus prints the view of the leader among the --admin nodes
// (fromServing), or, if none of them leads, that of the first that
// answers, with a note on stderr that says why.
func clusterStatus(ctx context.Context, o *clusterCmdOptions, stdout, stderr io.Writer) error {
	st, fellBack, err := fromServing(o, func(st *admin.Status) (bool, error) {
		if err := getStatus(ctx, o, st); err != nil {
			return false, err
		}
		if st.Cluster == nil {
			if st.ClusterError != "" {
				return false, runtimef("admin listener %s: no cluster status: %s", o.Admin, st.ClusterError)
			}
			if st.Pair != nil {
				return false, runtimef("the node at %s is not a cluster node: it is a pair node (role %s): use 'ticketingd pair status'", o.Admin, st.Pair.Role)
			}
			return false, runtimef("the node at %s is not a cluster node (role %s)", o.Admin, st.Role)
		}
		return st.Cluster.State == "Leader", nil
	})
	if err != nil {
		return err
	}
	if fellBack && len(o.Admins) > 1 {
		if st.Cluster.Leader == "" {
			fmt.Fprintf(stderr, "note: no leader: none of the --admin nodes leads, and %s knows no leader (an election may be running, or a majority of the nodes is down); this is %s's view\n", o.Admin, o.Admin)
		} else {
			fmt.Fprintf(stderr, "note: the leader, %s, is not among the --admin nodes: this is %s's view; give %s's admin address for the leader's view (reachability, lag)\n", st.Cluster.Leader, o.Admin, st.Cluster.Leader)
		}
	} else if fellBack && st.Cluster.Leader == "" {
		fmt.Fprintf(stderr, "note: no leader: %s knows none (an election may be running, or a majority of the nodes is down); this is its own view\n", o.Admin)
	}
	if o.JSON {
		return printJSON(stdout, st.Cluster)
	}
	printClusterStatus(stdout, st.Cluster, &st.Stats)
	return nil
}

// getStatus reads o.Admin's /status into st.
func getStatus(ctx context.Context, o *clusterCmdOptions, st *admin.Status) error {
	code, body, err := adminCall(ctx, o, http.MethodGet, "/status", nil)
	if err != nil {
		return err
	}
	if code != http.StatusOK {
		return answerError(o, code, body)
	}
	if err := json.Unmarshal(body, st); err != nil {
		return runtimef("admin listener %s: /status: %w", o.Admin, err)
	}
	return nil
}

func printClusterStatus(w io.Writer, cs *server.ClusterStatus, st *server.Stats) {
	serving := "not serving clients"
	if cs.Serving {
		serving = "serving clients"
	}
	fmt.Fprintf(w, "node %s: %s, %s\n", cs.NodeID, cs.State, serving)
	fmt.Fprintf(w, "cluster %s\n", orUnknown(cs.ClusterID))
	if cs.Bootstrap != "" {
		fmt.Fprintf(w, "no Raft state: %s before bootstrapping\n", cs.Bootstrap)
	}
	if cs.Leader == "" {
		fmt.Fprintf(w, "leader: none known\n")
	} else {
		fmt.Fprintf(w, "leader: %s (raft %s, clients %s)\n", cs.Leader, orUnknown(cs.LeaderAddress), orUnknown(cs.LeaderAdvertise))
	}
	fmt.Fprintf(w, "term %d, commit index %d, applied index %d, last log index %d, leader changes seen %d\n",
		cs.Term, cs.CommitIndex, cs.AppliedIndex, cs.LastLogIndex, cs.LeaderChanges)
	if st != nil {
		fmt.Fprintf(w, "sessions %d, held locks %d, last token %d\n", st.Sessions, st.HeldLocks, st.LastToken)
	}
	if cs.SinceLeaderContactMS != nil {
		fmt.Fprintf(w, "last heard from a leader %s ago\n", msDuration(*cs.SinceLeaderContactMS))
	}
	printMembers(w, cs)
}

// printMembers writes the Raft configuration as a table; a member's client
// address is "-" until it has led. On the leader's status the table has
// the leader's view of each member (reachable, last contact, log index,
// lag) and a line for each member the leader cannot reach; elsewhere a
// line says where to ask for it.
func printMembers(w io.Writer, cs *server.ClusterStatus) {
	leaderView := cs.MembersView == "leader"
	var b bytes.Buffer
	tw := tabwriter.NewWriter(&b, 0, 4, 2, ' ', 0)
	if leaderView {
		fmt.Fprintf(tw, "ID\tRAFT ADDRESS\tSUFFRAGE\tCLIENT ADDRESS\tROLE\tREACHABLE\tLAST CONTACT\tLOG INDEX\tLAG\t\n")
	} else {
		fmt.Fprintf(tw, "ID\tRAFT ADDRESS\tSUFFRAGE\tCLIENT ADDRESS\tROLE\t\n")
	}
	var unreachable []server.ClusterMember
	for _, m := range cs.Servers {
		role := "follower"
		if m.Leader {
			role = "leader"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s", m.ID, m.Address, m.Suffrage, orUnknown(m.Advertise), role)
		if leaderView {
			reach, mark := "-", ""
			switch {
			case m.Reachable == nil:
			case m.ID == cs.NodeID:
				reach = "self"
			case *m.Reachable:
				reach = "yes"
			default:
				reach, mark = "NO", "<- UNREACHABLE"
				unreachable = append(unreachable, m)
			}
			fmt.Fprintf(tw, "\t%s\t%s\t%s\t%s\t%s", reach, contactAgo(m), optUint(m.LogIndex), optUint(m.Lag), mark)
		}
		fmt.Fprintf(tw, "\n")
	}
	_ = tw.Flush()
	fmt.Fprintf(w, "\n")
	for line := range strings.Lines(b.String()) {
		fmt.Fprintln(w, strings.TrimRight(line, " \n"))
	}
	for _, m := range unreachable {
		fmt.Fprintf(w, "! the leader cannot reach %s (raft %s): ", m.ID, m.Address)
		if m.SinceContactMS == nil {
			fmt.Fprintf(w, "no reply yet (none since this node leads, or since the member was added)")
		} else {
			fmt.Fprintf(w, "no reply for %s", msDuration(*m.SinceContactMS))
		}
		if m.LastError != "" {
			fmt.Fprintf(w, "; last error: %s", m.LastError)
		}
		fmt.Fprintf(w, "\n")
	}
	if !leaderView && len(cs.Servers) > 0 {
		where := "the leader's admin listener"
		if cs.Leader != "" {
			where = cs.Leader + "'s admin listener"
		}
		fmt.Fprintf(w, "reachability, last contact, log index and lag are the leader's view: run 'ticketingd cluster status' against %s\n", where)
	}
}

// contactAgo is a member's last contact with the leader, for the table.
func contactAgo(m server.ClusterMember) string {
	switch {
	case m.SinceContactMS != nil:
		return msDuration(*m.SinceContactMS) + " ago"
	case m.Reachable != nil && !*m.Reachable:
		return "never"
	}
	return "-"
}

// msDuration writes a number of milliseconds as a short duration.
func msDuration(ms int64) string {
	d := time.Duration(ms) * time.Millisecond
	if d >= time.Second {
		d = d.Round(100 * time.Millisecond)
	}
	return d.String()
}

func optUint(p *uint64) string {
	if p == nil {
		return "-"
	}
	return strconv.FormatUint(*p, 10)
}

func orUnknown(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// clusterChange posts a membership change to the --admin nodes in turn
// until one that is not unreachable and not a follower (409) answers.
// An answer of any other kind ends it: a change whose outcome is unknown
// (504) must not be made twice.
func clusterChange(ctx context.Context, o *clusterCmdOptions, stdout io.Writer, path string, reqBody any) error {
	return o.untilServing(func() (bool, error) { return clusterChangeOn(ctx, o, stdout, path, reqBody) })
}

func clusterChangeOn(ctx context.Context, o *clusterCmdOptions, stdout io.Writer, path string, reqBody any) (retry bool, err error) {
	code, body, err := adminCall(ctx, o, http.MethodPost, path, reqBody)
	if err != nil {
		return ctx.Err() == nil, err
	}
	if code == http.StatusConflict {
		return true, answerError(o, code, body)
	}
	return false, clusterChangeAnswer(o, stdout, path, code, body)
}

func clusterChangeAnswer(o *clusterCmdOptions, stdout io.Writer, path string, code int, body []byte) error {
	var ae admin.ErrorResponse
	if (code == http.StatusNotFound || code == http.StatusMethodNotAllowed) && json.Unmarshal(body, &ae) != nil {
		// The mux's own answer, not the endpoint's.
		return runtimef("the node at %s has no %s endpoint: it is not a cluster node", o.Admin, path)
	}
	if code != http.StatusOK {
		return answerError(o, code, body)
	}
	var resp admin.ClusterChangeResponse
	if err := json.Unmarshal(body, &resp); err != nil {
		return runtimef("admin listener %s: %s: %w", o.Admin, path, err)
	}
	if o.JSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(resp)
	}
	switch path {
	case "/cluster/add":
		fmt.Fprintf(stdout, "added %s (raft %s) as a voter\n", resp.ID, resp.Address)
	default:
		fmt.Fprintf(stdout, "removed %s\n", resp.ID)
	}
	if resp.Cluster != nil {
		fmt.Fprintf(stdout, "configuration now:\n")
		printMembers(stdout, resp.Cluster)
	}
	return nil
}
