package harness

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ticketing-dev/ticketing/integration/faultproxy"
	"github.com/ticketing-dev/ticketing/internal/pki"
	"github.com/ticketing-dev/ticketing/internal/wire"
	"github.com/ticketing-dev/ticketing/server"
)

// ClusterOptions configures StartCluster. Every field is optional.
type ClusterOptions struct {
	// Nodes is the number of nodes (default 3).
	Nodes int
	// PeerTLS turns on mutual TLS between the nodes: StartCluster makes a
	// cluster CA and a node certificate per node (internal/pki, SAN
	// 127.0.0.1, which covers the proxies the peers dial) and passes
	// --peer-tls-cert, --peer-tls-key and --peer-tls-ca. Without it the
	// Raft links are plain TCP.
	PeerTLS bool
	// Heartbeat and Election are --raft-heartbeat and --raft-election
	// (default: ticketingd's).
	Heartbeat, Election time.Duration
	// Args are extra serve arguments of every node.
	Args []string
}

// Cluster is a Raft cluster of ticketingd subprocesses on 127.0.0.1 whose
// Raft links all go through fault proxies: node i's --raft-advertise (its
// address in the Raft configuration, the one its peers dial) is its
// Proxy's address, and the proxy forwards to its --raft-listen. Cut, Isolate
// and Heal blackhole and restore the links between chosen nodes; which
// node dialled a proxied connection is found from the socket's owner
// (Linux /proc), so a cut between a and b leaves c's links to both intact.
//
// Its methods are safe for concurrent use.
type Cluster struct {
	// Nodes are the nodes, Nodes[i].Index == i.
	Nodes []*ClusterNode
	http  *http.Client
	// adminToken is the nodes' --admin-token, sent by Status.
	adminToken string

	mu        sync.Mutex
	cuts      map[[2]int]bool
	holed     map[*faultproxy.Conn]bool // connections blackholed by a cut
	unknown   int                       // proxied connections of no known node, seen during a cut
	lookupErr error
}

// ClusterNode is one node of a Cluster: a restartable Server (client
// address Addr, data directory DataDir) plus its Raft and admin addresses
// and the proxy in front of its Raft listener.
type ClusterNode struct {
	*Server
	Index      int    // in Cluster.Nodes
	ID         string // --node-id: n1, n2, ...
	RaftListen string // --raft-listen
	Proxy      *faultproxy.Proxy
	Admin      string // --admin-listen, host:port

	c   *Cluster
	mu  sync.Mutex
	pid int // of the current generation, for Cut's owner lookup
}

// StartCluster starts opts.Nodes nodes of bin ("ticketingd") bootstrapped
// together with --peers, each waited for until it logs "listening" (a
// follower listens too: it answers HELLO with M). It does not wait for a
// leader: see WaitLeader. tb.Cleanup kills the nodes and closes the proxies.
func StartCluster(tb testing.TB, bin string, opts ClusterOptions) *Cluster {
	tb.Helper()
	if opts.Nodes == 0 {
		opts.Nodes = 3
	}
	c := &Cluster{
		cuts:  map[[2]int]bool{},
		holed: map[*faultproxy.Conn]bool{},
		// No keep-alive: no idle connection (and goroutine) outlives a call.
		http: &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}},
	}
	dir := tb.TempDir()
	port := func() string {
		p, err := FreePort()
		if err != nil {
			tb.Fatalf("harness: free port: %v", err)
		}
		return net.JoinHostPort("127.0.0.1", strconv.Itoa(p))
	}
	var peers []string
	for i := range opts.Nodes {
		n := &ClusterNode{Index: i, ID: fmt.Sprintf("n%d", i+1), RaftListen: port(), Admin: port(), c: c}
		// The proxy's port comes from FreePort too: a proxy on port 0
		// could get a port just handed out to another node (it happened:
		// an admin port).
		p, err := faultproxy.NewOn(port(), n.RaftListen)
		if err != nil {
			tb.Fatalf("harness: proxy: %v", err)
		}
		tb.Cleanup(func() { p.Close() })
		p.SetClassifier(func(client net.Addr) faultproxy.Faults { return c.classify(client, i) })
		n.Proxy = p
		c.Nodes = append(c.Nodes, n)
		peers = append(peers, n.ID+"="+p.Addr())
	}
	var tlsArgs func(id string) []string
	if opts.PeerTLS {
		tlsArgs = writePeerTLS(tb, filepath.Join(dir, "pki"))
	}
	for _, n := range c.Nodes {
		listen := port()
		args := []string{"--cluster", "--node-id", n.ID,
			"--raft-listen", n.RaftListen, "--raft-advertise", n.Proxy.Addr(),
			"--advertise", listen, "--peers", strings.Join(peers, ","),
			"--admin-listen", n.Admin}
		if opts.Heartbeat > 0 {
			args = append(args, "--raft-heartbeat", opts.Heartbeat.String())
		}
		if opts.Election > 0 {
			args = append(args, "--raft-election", opts.Election.String())
		}
		if tlsArgs != nil {
			args = append(args, tlsArgs(n.ID)...)
		}
		args = append(args, opts.Args...)
		n.Server = StartServer(tb, bin, ServerOptions{
			Listen:  listen,
			DataDir: filepath.Join(dir, n.ID, "data"),
			Args:    args,
		})
		n.setPid()
	}
	return c
}

// AttachedNode is a cluster node started otherwise than by StartCluster
// (from a deployment bundle, say): its --node-id, its process and its
// admin listener.
type AttachedNode struct {
	ID     string
	Server *Server
	Admin  string // host:port
}

// AttachCluster makes a Cluster of nodes started otherwise, for
// WaitLeader, WaitConverged, Status and Node; adminToken is their admin
// listeners' --admin-token ("" for none). Their Raft links have no
// proxies: Cut, Isolate and Heal do not apply (they panic).
func AttachCluster(nodes []AttachedNode, adminToken string) *Cluster {
	c := &Cluster{
		cuts:       map[[2]int]bool{},
		holed:      map[*faultproxy.Conn]bool{},
		http:       &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}},
		adminToken: adminToken,
	}
	for i, n := range nodes {
		cn := &ClusterNode{Server: n.Server, Index: i, ID: n.ID, Admin: n.Admin, c: c}
		cn.setPid()
		c.Nodes = append(c.Nodes, cn)
	}
	return c
}

// writePeerTLS writes a CA under dir and returns the function that issues
// the node certificate of node id (written under dir) and returns its
// flags.
func writePeerTLS(tb testing.TB, dir string) func(id string) []string {
	tb.Helper()
	ca, err := pki.NewCA("ticketing test cluster CA", 24*time.Hour)
	if err != nil {
		tb.Fatalf("harness: cluster CA: %v", err)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		tb.Fatal(err)
	}
	caFile := filepath.Join(dir, "cluster-ca.pem")
	if err := os.WriteFile(caFile, ca.CertPEM(), 0o600); err != nil {
		tb.Fatal(err)
	}
	return func(id string) []string {
		kp, err := ca.Issue(pki.Node, []string{"127.0.0.1"}, 24*time.Hour)
		if err != nil {
			tb.Fatalf("harness: node certificate: %v", err)
		}
		key, err := kp.KeyPEM()
		if err != nil {
			tb.Fatal(err)
		}
		cert, keyFile := filepath.Join(dir, id+".pem"), filepath.Join(dir, id+"-key.pem")
		if err := os.WriteFile(cert, kp.CertPEM(), 0o600); err != nil {
			tb.Fatal(err)
		}
		if err := os.WriteFile(keyFile, key, 0o600); err != nil {
			tb.Fatal(err)
		}
		return []string{"--peer-tls-cert", cert, "--peer-tls-key", keyFile, "--peer-tls-ca", caFile}
	}
}

func (n *ClusterNode) setPid() {
	pid := 0
	if p := n.Server.Process(); p != nil {
		pid = p.Pid()
	}
	n.mu.Lock()
	n.pid = pid
	n.mu.Unlock()
}

// Restart starts a new generation of the node (same addresses, data
// directory and flags; see Server.Restart). Use it rather than
// Server.Restart, so that Cut knows the new process.
func (n *ClusterNode) Restart(tb testing.TB) {
	tb.Helper()
	n.Server.Restart(tb)
	n.setPid()
}

// Pause stops the node with SIGSTOP and returns once every thread of it
// is stopped (Linux: /proc/PID/task/*/stat), so that nothing it answers
// afterwards comes from before the stop; elsewhere, or if that takes more
// than 5 s, right after the signal.
func (n *ClusterNode) Pause() error {
	if err := n.Server.Pause(); err != nil {
		return err
	}
	waitStopped(n.Server.Process().Pid(), 5*time.Second)
	return nil
}

// waitStopped waits until every thread of pid is in state T or t.
func waitStopped(pid int, timeout time.Duration) {
	deadline := time.Now().Add(timeout)
	dir := fmt.Sprintf("/proc/%d/task", pid)
	for time.Now().Before(deadline) {
		ents, err := os.ReadDir(dir)
		if err != nil {
			return
		}
		stopped := true
		for _, e := range ents {
			b, err := os.ReadFile(filepath.Join(dir, e.Name(), "stat"))
			if err != nil {
				continue // exited thread
			}
			// pid (comm) state ...: comm may hold spaces; the state follows the last ')'.
			st := string(b)
			if i := strings.LastIndexByte(st, ')'); i >= 0 && i+2 < len(st) {
				if c := st[i+2]; c != 'T' && c != 't' {
					stopped = false
					break
				}
			}
		}
		if stopped {
			return
		}
		time.Sleep(time.Millisecond)
	}
}

// Addrs returns the nodes' client addresses, in node order (a broker's
// Config.Addrs).
func (c *Cluster) Addrs() []string {
	out := make([]string, len(c.Nodes))
	for i, n := range c.Nodes {
		out[i] = n.Addr()
	}
	return out
}

// Servers returns the nodes' processes, in node order.
func (c *Cluster) Servers() []*Server {
	out := make([]*Server, len(c.Nodes))
	for i, n := range c.Nodes {
		out[i] = n.Server
	}
	return out
}

// Status returns the node's cluster status from its admin listener (GET
// /status). It fails if the node does not answer within 2 s (it is dead or
// stopped).
func (n *ClusterNode) Status() (server.ClusterStatus, error) {
	req, err := http.NewRequest("GET", "http://"+n.Admin+"/status", nil)
	if err != nil {
		return server.ClusterStatus{}, err
	}
	if n.c.adminToken != "" {
		req.Header.Set("Authorization", "Bearer "+n.c.adminToken)
	}
	resp, err := n.c.http.Do(req)
	if err != nil {
		return server.ClusterStatus{}, err
	}
	defer resp.Body.Close()
	var body struct {
		Cluster *server.ClusterStatus `json:"cluster"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
		return server.ClusterStatus{}, fmt.Errorf("harness: %s /status: %w", n.ID, err)
	}
	if body.Cluster == nil {
		return server.ClusterStatus{}, fmt.Errorf("harness: %s /status has no cluster object", n.ID)
	}
	return *body.Cluster, nil
}

// statuses asks every node (concurrently); a node that does not answer has
// a nil entry.
func (c *Cluster) statuses() []*server.ClusterStatus {
	out := make([]*server.ClusterStatus, len(c.Nodes))
	var wg sync.WaitGroup
	for i, n := range c.Nodes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if st, err := n.Status(); err == nil {
				out[i] = &st
			}
		}()
	}
	wg.Wait()
	return out
}

// leader returns the node that serves and that a majority of the nodes
// (itself included) name as leader, or nil.
func (c *Cluster) leader(sts []*server.ClusterStatus) *ClusterNode {
	for i, st := range sts {
		if st == nil || !st.Serving {
			continue
		}
		votes := 0
		for _, o := range sts {
			if o != nil && o.Leader == c.Nodes[i].ID {
				votes++
			}
		}
		if votes > len(c.Nodes)/2 {
			return c.Nodes[i]
		}
	}
	return nil
}

// WaitLeader waits, at most timeout (a hang guard), for a node that serves
// clients and that a majority of the nodes know as the leader, and returns
// it. It fails tb otherwise, with every node's last status.
func (c *Cluster) WaitLeader(tb testing.TB, timeout time.Duration) *ClusterNode {
	tb.Helper()
	deadline := time.Now().Add(timeout)
	for {
		sts := c.statuses()
		if l := c.leader(sts); l != nil {
			return l
		}
		if time.Now().After(deadline) {
			tb.Fatalf("harness: no serving leader known to a majority within %v; statuses:\n%s", timeout, describeStatuses(c, sts))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// WaitConverged waits, at most timeout, until a leader serves (as
// WaitLeader), every node (all must answer) names it as leader, and every
// node has applied the leader's commit index as it was when the wait
// began: a restarted or healed node has caught up. It returns the leader.
func (c *Cluster) WaitConverged(tb testing.TB, timeout time.Duration) *ClusterNode {
	tb.Helper()
	deadline := time.Now().Add(timeout)
	var target uint64
	for {
		sts := c.statuses()
		l := c.leader(sts)
		if l != nil {
			if target == 0 {
				target = sts[l.Index].CommitIndex
			}
			ok := true
			for _, st := range sts {
				ok = ok && st != nil && st.Leader == l.ID && st.AppliedIndex >= target
			}
			if ok {
				return l
			}
		}
		if time.Now().After(deadline) {
			tb.Fatalf("harness: cluster not converged within %v (commit index to reach %d); statuses:\n%s", timeout, target, describeStatuses(c, sts))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func describeStatuses(c *Cluster, sts []*server.ClusterStatus) string {
	var b strings.Builder
	for i, st := range sts {
		if st == nil {
			fmt.Fprintf(&b, "  %s: no answer\n", c.Nodes[i].ID)
			continue
		}
		fmt.Fprintf(&b, "  %s: state %s serving %v leader %q term %d commit %d applied %d last %d\n",
			c.Nodes[i].ID, st.State, st.Serving, st.Leader, st.Term, st.CommitIndex, st.AppliedIndex, st.LastLogIndex)
	}
	return b.String()
}

// Node returns the node with the given ID, or nil.
func (c *Cluster) Node(id string) *ClusterNode {
	for _, n := range c.Nodes {
		if n.ID == id {
			return n
		}
	}
	return nil
}

// Cut blackholes the Raft links between nodes a and b (indexes), both
// ways: the connections either of them dialled to the other's proxy,
// open ones and new ones, until Heal. Bytes are dropped and the sockets
// stay open (a partition, not a refusal).
func (c *Cluster) Cut(a, b int) {
	c.mu.Lock()
	c.cuts[[2]int{min(a, b), max(a, b)}] = true
	c.mu.Unlock()
	for t, n := range c.Nodes {
		for _, pc := range n.Proxy.Conns() {
			f := c.classify(pc.ClientAddr(), t)
			if f.Blackhole {
				pc.Blackhole(true)
				c.mu.Lock()
				c.holed[pc] = true
				c.mu.Unlock()
			}
		}
	}
}

// Isolate cuts every Raft link of node i.
func (c *Cluster) Isolate(i int) {
	for j := range c.Nodes {
		if j != i {
			c.Cut(i, j)
		}
	}
}

// Heal removes every cut and closes the connections that were blackholed
// (their streams lost bytes), so that the nodes redial. It logs how many
// proxied connections during the cuts belonged to no known node (usually
// one its dialler had closed already; it was left open unless its target
// was cut from every other node), and fails tb if the owners could not be
// looked up at all.
func (c *Cluster) Heal(tb testing.TB) {
	tb.Helper()
	c.mu.Lock()
	c.cuts = map[[2]int]bool{}
	holed := c.holed
	c.holed = map[*faultproxy.Conn]bool{}
	unknown, lerr := c.unknown, c.lookupErr
	c.unknown, c.lookupErr = 0, nil
	c.mu.Unlock()
	for pc := range holed {
		pc.Close()
	}
	if unknown > 0 {
		tb.Logf("harness: %d proxied Raft connection(s) during the cut had no known owner (blackholed only if their target was isolated)", unknown)
	}
	if lerr != nil {
		tb.Fatalf("harness: the cut could not tell who dialled: %v", lerr)
	}
}

// classify decides the faults of a connection to node target's proxy from
// client (the dialler's address): blackholed if the dialling node's link to
// target is cut.
func (c *Cluster) classify(client net.Addr, target int) faultproxy.Faults {
	c.mu.Lock()
	involved := false
	for k := range c.cuts {
		involved = involved || k[0] == target || k[1] == target
	}
	c.mu.Unlock()
	if !involved {
		return faultproxy.Faults{}
	}
	pids := make([]int, len(c.Nodes))
	for i, n := range c.Nodes {
		n.mu.Lock()
		pids[i] = n.pid
		n.mu.Unlock()
	}
	ca, _ := client.(*net.TCPAddr)
	pa, _ := net.ResolveTCPAddr("tcp", c.Nodes[target].Proxy.Addr())
	owner := -1
	var err error
	if ca != nil && pa != nil {
		owner, err = socketOwner(ca, pa, pids)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if err != nil && c.lookupErr == nil {
		c.lookupErr = err
	}
	if owner < 0 {
		// Gone already, or not a node's: when target is cut from every
		// other node, nothing may reach it anyway.
		c.unknown++
		isolated := true
		for j := range c.Nodes {
			isolated = isolated && (j == target || c.cuts[[2]int{min(j, target), max(j, target)}])
		}
		return faultproxy.Faults{Blackhole: isolated}
	}
	return faultproxy.Faults{Blackhole: c.cuts[[2]int{min(owner, target), max(owner, target)}]}
}

// HelloReply is what a node answered to a raw HELLO.
type HelloReply struct {
	Type byte   // wire.TypeHelloOK, wire.TypeNotActive, wire.TypeError
	Role uint8  // HELLO_OK's role
	Hint string // NOT_ACTIVE's hint: the serving node's client address
	Code uint16 // ERROR's code
}

// Hello dials addr, sends a protocol HELLO (current version, no client
// token) and returns the reply, waiting at most timeout.
func Hello(addr string, timeout time.Duration) (HelloReply, error) {
	s, r, err := OpenSession(addr, timeout)
	if s != nil {
		s.Close()
	}
	return r, err
}

// Session is a raw protocol connection whose HELLO was answered, opened by
// OpenSession: a client that stays connected and sends nothing more, to
// see what the server sends it unasked (an M or an E with req_id 0).
type Session struct {
	nc net.Conn
	r  *wire.Reader
}

// OpenSession dials addr, sends a protocol HELLO (current version, no
// client token) and returns the session and the reply, waiting at most
// timeout. The session is nil if no reply came; close it.
func OpenSession(addr string, timeout time.Duration) (*Session, HelloReply, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	var d net.Dialer
	nc, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, HelloReply{}, err
	}
	_ = nc.SetDeadline(time.Now().Add(timeout))
	b, err := wire.AppendRequest(nil, &wire.Request{Type: wire.TypeHello, ReqID: 1, Version: wire.Version, Name: []byte("harness")})
	if err == nil {
		_, err = nc.Write(b)
	}
	if err != nil {
		nc.Close()
		return nil, HelloReply{}, err
	}
	s := &Session{nc: nc, r: wire.NewReader(nc)}
	r, err := s.next()
	if err != nil {
		nc.Close()
		return nil, HelloReply{}, err
	}
	_ = nc.SetDeadline(time.Time{})
	return s, r, nil
}

// Next waits at most timeout for the next frame the server sends: HELLO's
// reply types only (M, E, or a HELLO_OK), as a HelloReply.
func (s *Session) Next(timeout time.Duration) (HelloReply, error) {
	_ = s.nc.SetReadDeadline(time.Now().Add(timeout))
	return s.next()
}

func (s *Session) next() (HelloReply, error) {
	body, err := s.r.Next()
	if err != nil {
		return HelloReply{}, err
	}
	var r wire.Response
	if err := wire.DecodeResponse(body, &r); err != nil {
		return HelloReply{}, err
	}
	switch r.Type {
	case wire.TypeHelloOK, wire.TypeNotActive, wire.TypeError:
		return HelloReply{Type: r.Type, Role: r.Role, Hint: string(r.Hint), Code: r.Code}, nil
	}
	return HelloReply{}, fmt.Errorf("harness: the server sent frame type %q", r.Type)
}

// Close closes the connection.
func (s *Session) Close() error { return s.nc.Close() }

// ErrNoHint is returned by WaitHint when the node never answered M with
// the expected hint.
var ErrNoHint = errors.New("harness: no NOT_ACTIVE with the expected hint")

// WaitHint waits, at most timeout, until a HELLO to addr is answered M
// with hint want, and returns the last reply otherwise with ErrNoHint.
func WaitHint(addr, want string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		r, err := Hello(addr, time.Second)
		if err == nil && r.Type == wire.TypeNotActive && r.Hint == want {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%w: %s answered %+v (err %v), want M with hint %s", ErrNoHint, addr, r, err, want)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
