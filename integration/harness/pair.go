package harness

import (
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/ticketing-dev/ticketing/integration/faultproxy"
	"github.com/ticketing-dev/ticketing/server"
)

// PairOptions configures StartPair. Every field is optional.
type PairOptions struct {
	// PeerTLS turns on mutual TLS on the peer link (a CA and a node
	// certificate per node, SAN 127.0.0.1, as for a cluster).
	PeerTLS bool
	// Heartbeat is --heartbeat (default: ticketingd's, 1 s).
	Heartbeat time.Duration
	// Args are extra serve arguments of both nodes.
	Args []string
	// ClientProxies puts a fault proxy in front of each node's client
	// address (PairNode.Client), which the node advertises (the hint of
	// its M answers) and Addrs returns: a test can close a node's port to
	// its clients (faultproxy's Refuse) while it restarts.
	ClientProxies bool
}

// Pair is a hot-standby pair of ticketingd subprocesses on 127.0.0.1
// (serve --pair primary|backup) whose peer links go through fault
// proxies: each node's --peer is the proxy in front of the other's
// --peer-listen. Cut and Heal blackhole and restore the peer link both
// ways, leaving the client addresses alone (a split brain when clients
// reach both nodes).
type Pair struct {
	Primary, Backup *PairNode
	http            *http.Client
}

// PairNode is one node of a Pair: a restartable Server (client address
// Addr, data directory DataDir) plus its peer and admin addresses and the
// proxy in front of its peer listener.
type PairNode struct {
	*Server
	Role       string // primary or backup
	PeerListen string // --peer-listen
	Proxy      *faultproxy.Proxy
	Admin      string            // --admin-listen
	Client     *faultproxy.Proxy // in front of Addr (PairOptions.ClientProxies), or nil

	p *Pair
}

// StartPair starts the primary and the backup of bin ("ticketingd"), each
// waited for until it logs "listening" (a passive node listens too: it
// answers HELLO with M). It does not wait for the pair to settle: see
// WaitSettled. tb.Cleanup kills the nodes and closes the proxies.
func StartPair(tb testing.TB, bin string, opts PairOptions) *Pair {
	tb.Helper()
	p := &Pair{http: &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}}
	dir := tb.TempDir()
	port := func() string {
		n, err := FreePort()
		if err != nil {
			tb.Fatalf("harness: free port: %v", err)
		}
		return net.JoinHostPort("127.0.0.1", strconv.Itoa(n))
	}
	nodes := []*PairNode{{Role: "primary"}, {Role: "backup"}}
	for _, n := range nodes {
		n.p, n.PeerListen, n.Admin = p, port(), port()
		px, err := faultproxy.NewOn(port(), n.PeerListen)
		if err != nil {
			tb.Fatalf("harness: proxy: %v", err)
		}
		tb.Cleanup(func() { px.Close() })
		n.Proxy = px
	}
	p.Primary, p.Backup = nodes[0], nodes[1]
	var tlsArgs func(id string) []string
	if opts.PeerTLS {
		tlsArgs = writePeerTLS(tb, filepath.Join(dir, "pki"))
	}
	for i, n := range nodes {
		other := nodes[1-i]
		listen := port()
		advertise := listen
		if opts.ClientProxies {
			px, err := faultproxy.NewOn(port(), listen)
			if err != nil {
				tb.Fatalf("harness: proxy: %v", err)
			}
			tb.Cleanup(func() { px.Close() })
			n.Client, advertise = px, px.Addr()
		}
		args := []string{"--pair", n.Role, "--peer", other.Proxy.Addr(), "--peer-listen", n.PeerListen,
			"--advertise", advertise, "--admin-listen", n.Admin}
		if opts.Heartbeat > 0 {
			args = append(args, "--heartbeat", opts.Heartbeat.String())
		}
		if tlsArgs != nil {
			args = append(args, tlsArgs(n.Role)...)
		}
		args = append(args, opts.Args...)
		n.Server = StartServer(tb, bin, ServerOptions{Listen: listen, DataDir: filepath.Join(dir, n.Role, "data"), Args: args})
	}
	return p
}

// Nodes returns the primary and the backup.
func (p *Pair) Nodes() []*PairNode { return []*PairNode{p.Primary, p.Backup} }

// Servers returns the nodes' processes, the primary's first.
func (p *Pair) Servers() []*Server { return []*Server{p.Primary.Server, p.Backup.Server} }

// Addrs returns the addresses clients are given, the primary's first:
// the nodes' client addresses, or with PairOptions.ClientProxies the
// proxies in front of them.
func (p *Pair) Addrs() []string { return []string{p.Primary.ClientAddr(), p.Backup.ClientAddr()} }

// ClientAddr is the address clients are given for n, which it advertises:
// its client proxy's (PairOptions.ClientProxies), or else Addr.
func (n *PairNode) ClientAddr() string {
	if n.Client != nil {
		return n.Client.Addr()
	}
	return n.Addr()
}

// Other returns the other node of the pair.
func (p *Pair) Other(n *PairNode) *PairNode {
	if n == p.Primary {
		return p.Backup
	}
	return p.Primary
}

// Status returns the node's view of its pair from its admin listener (GET
// /status). It fails if the node does not answer within 2 s.
func (n *PairNode) Status() (server.PairStatus, error) {
	resp, err := n.p.http.Get("http://" + n.Admin + "/status")
	if err != nil {
		return server.PairStatus{}, err
	}
	defer resp.Body.Close()
	var body struct {
		Pair *server.PairStatus `json:"pair"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
		return server.PairStatus{}, fmt.Errorf("harness: %s /status: %w", n.Role, err)
	}
	if body.Pair == nil {
		return server.PairStatus{}, fmt.Errorf("harness: %s /status has no pair object", n.Role)
	}
	return *body.Pair, nil
}

// WaitStatus polls the node's /status (every 20 ms, never a HELLO) until
// cond holds, at most timeout, and returns that status; it fails tb with
// the last status otherwise. A node that does not answer (restarting) is
// polled again.
func (n *PairNode) WaitStatus(tb testing.TB, timeout time.Duration, what string, cond func(server.PairStatus) bool) server.PairStatus {
	tb.Helper()
	deadline := time.Now().Add(timeout)
	for {
		st, err := n.Status()
		if err == nil && cond(st) {
			return st
		}
		if time.Now().After(deadline) {
			tb.Fatalf("harness: the %s: not %s within %v: %+v (%v)", n.Role, what, timeout, st, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// WaitSettled waits, at most timeout, until one node is ACTIVE and
// replicating to the other, PASSIVE and holding the pair's state (without
// sending a HELLO to either: a HELLO to a passive node is a client request
// of its state machine). It returns the active node.
func (p *Pair) WaitSettled(tb testing.TB, timeout time.Duration) *PairNode {
	tb.Helper()
	deadline := time.Now().Add(timeout)
	var last string
	for {
		for _, n := range p.Nodes() {
			a, err1 := n.Status()
			b, err2 := p.Other(n).Status()
			if err1 == nil && err2 == nil && a.State == "ACTIVE" && a.Replicating && b.State == "PASSIVE" && b.HasState {
				return n
			}
			last = fmt.Sprintf("%s: %+v (%v); %s: %+v (%v)", n.Role, a, err1, p.Other(n).Role, b, err2)
		}
		if time.Now().After(deadline) {
			tb.Fatalf("harness: the pair did not settle within %v: %s", timeout, last)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Cut blackholes the peer link both ways, open connections and new ones,
// until Heal: bytes are dropped and the sockets stay open.
func (p *Pair) Cut() {
	for _, n := range p.Nodes() {
		n.Proxy.SetDefault(faultproxy.Faults{Blackhole: true})
		for _, c := range n.Proxy.Conns() {
			c.Blackhole(true)
		}
	}
}

// Heal ends the cut and closes the blackholed connections (their streams
// lost bytes), so that the nodes dial again.
func (p *Pair) Heal() {
	for _, n := range p.Nodes() {
		n.Proxy.SetDefault(faultproxy.Faults{})
		for _, c := range n.Proxy.Conns() {
			c.Close()
		}
	}
}
