package raftnet_test

import (
	"bytes"
	"crypto/tls"
	"errors"
	"io"
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/ticketing-dev/ticketing/internal/pki"
	"github.com/ticketing-dev/ticketing/internal/raft"
	"github.com/ticketing-dev/ticketing/internal/raftnet"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// waitFor is how long a test waits for something that must happen (an
// election, a replicated entry); it is a bound on failure, not a measure of
// speed.
const waitFor = 10 * time.Second

// countFSM counts applied entries and remembers their data.
type countFSM struct {
	mu   sync.Mutex
	data []string
}

func (f *countFSM) Apply(l *raft.Log) any {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.data = append(f.data, string(l.Data))
	return nil
}

func (f *countFSM) entries() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.data...)
}

func (f *countFSM) Snapshot() (raft.FSMSnapshot, error) { return nopSnapshot{}, nil }
func (f *countFSM) Restore(rc io.ReadCloser) error      { return rc.Close() }

type nopSnapshot struct{}

func (nopSnapshot) Persist(sink raft.SnapshotSink) error { return sink.Close() }
func (nopSnapshot) Release()                             {}

// logBuf is a concurrency-safe log sink.
type logBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *logBuf) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logBuf) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

type node struct {
	id    raft.ServerID
	r     *raft.Raft
	tr    *raft.NetworkTransport
	fsm   *countFSM
	store *raft.InmemStore
	log   *logBuf
}

func (n *node) addr() raft.ServerAddress { return n.tr.LocalAddr() }

func newCA(t *testing.T) *pki.CA {
	t.Helper()
	ca, err := pki.NewCA("test cluster CA", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	return ca
}

func issue(t *testing.T, ca *pki.CA, kind pki.Kind, validFor time.Duration, hosts ...string) tls.Certificate {
	t.Helper()
	if len(hosts) == 0 {
		hosts = []string{"127.0.0.1"}
	}
	kp, err := ca.Issue(kind, hosts, validFor)
	if err != nil {
		t.Fatal(err)
	}
	return kp.TLSCertificate()
}

func peerTLS(t *testing.T, ca *pki.CA, hosts ...string) *raftnet.PeerTLS {
	t.Helper()
	p, err := raftnet.NewPeerTLS(issue(t, ca, pki.Node, time.Hour, hosts...), ca.Pool())
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func newTransport(t *testing.T, cfg raftnet.Config) *raft.NetworkTransport {
	t.Helper()
	if cfg.BindAddr == "" {
		cfg.BindAddr = "127.0.0.1:0"
	}
	if cfg.Timeout == 0 {
		cfg.Timeout = 2 * time.Second
	}
	tr, err := raftnet.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tr.Close() })
	return tr
}

// startNode starts a raft node over a transport with p (plain TCP if nil);
// tweak, if given, adjusts its raft configuration.
func startNode(t *testing.T, id string, p *raftnet.PeerTLS, tweak ...func(*raft.Config)) *node {
	t.Helper()
	lb := &logBuf{}
	n := &node{id: raft.ServerID(id), fsm: &countFSM{}, store: raft.NewInmemStore(), log: lb}
	n.tr = newTransport(t, raftnet.Config{TLS: p,
		Logger: slog.New(slog.NewTextHandler(lb, &slog.HandlerOptions{Level: slog.LevelWarn}))})
	conf := raft.DefaultConfig()
	conf.LocalID = n.id
	conf.HeartbeatTimeout = 150 * time.Millisecond
	conf.ElectionTimeout = 150 * time.Millisecond
	conf.LeaderLeaseTimeout = 100 * time.Millisecond
	conf.CommitTimeout = 5 * time.Millisecond
	conf.Logger = raftnet.HCLogger(nil)
	for _, f := range tweak {
		f(conf)
	}
	r, err := raft.NewRaft(conf, n.fsm, n.store, n.store, raft.NewInmemSnapshotStore(), n.tr)
	if err != nil {
		t.Fatal(err)
	}
	n.r = r
	t.Cleanup(func() {
		if err := r.Shutdown().Error(); err != nil {
			t.Error(err)
		}
		_ = n.tr.Close()
	})
	return n
}

// bootstrap bootstraps each of nodes with a configuration of members.
func bootstrap(t *testing.T, nodes []*node, members ...*node) {
	t.Helper()
	var cfg raft.Configuration
	for _, n := range members {
		cfg.Servers = append(cfg.Servers, raft.Server{ID: n.id, Address: n.addr()})
	}
	for _, n := range nodes {
		if err := n.r.BootstrapCluster(cfg).Error(); err != nil {
			t.Fatal(err)
		}
	}
}

// cluster starts and bootstraps three TLS nodes with certificates from ca and
// returns them with the leader first.
func cluster(t *testing.T, ca *pki.CA) []*node {
	t.Helper()
	nodes := []*node{startNode(t, "n1", peerTLS(t, ca)), startNode(t, "n2", peerTLS(t, ca)), startNode(t, "n3", peerTLS(t, ca))}
	bootstrap(t, nodes, nodes...)
	leader := waitLeader(t, nodes)
	for i, n := range nodes {
		if n == leader {
			nodes[0], nodes[i] = nodes[i], nodes[0]
		}
	}
	return nodes
}

// waitLeader waits until one node is leader and every node knows it.
func waitLeader(t *testing.T, nodes []*node) *node {
	t.Helper()
	deadline := time.Now().Add(waitFor)
	for time.Now().Before(deadline) {
		var leader *node
		for _, n := range nodes {
			if n.r.State() == raft.Leader {
				leader = n
			}
		}
		agreed := leader != nil
		for _, n := range nodes {
			if addr, _ := n.r.LeaderWithID(); leader != nil && addr != leader.addr() {
				agreed = false
			}
		}
		if agreed {
			return leader
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatal("no leader elected")
	return nil
}

// waitEntry waits until every node's FSM has applied an entry with data.
func waitEntry(t *testing.T, data string, nodes ...*node) {
	t.Helper()
	deadline := time.Now().Add(waitFor)
	for _, n := range nodes {
		for !contains(n.fsm.entries(), data) {
			if time.Now().After(deadline) {
				t.Fatalf("%s did not apply %q: %q", n.id, data, n.fsm.entries())
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
}

func contains(s []string, v string) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

func apply(t *testing.T, leader *node, data string) {
	t.Helper()
	if err := leader.r.Apply([]byte(data), waitFor).Error(); err != nil {
		t.Fatalf("apply %q: %v", data, err)
	}
}

func TestThreeNodesElectAndReplicateOverTLS(t *testing.T) {
	ca := newCA(t)
	nodes := cluster(t, ca)
	apply(t, nodes[0], "one")
	waitEntry(t, "one", nodes...)
	for _, n := range nodes {
		if got := n.fsm.entries(); len(got) != 1 {
			t.Errorf("%s applied %q, want one entry", n.id, got)
		}
		if s := n.log.String(); s != "" {
			t.Errorf("%s logged warnings between legitimate peers:\n%s", n.id, s)
		}
	}
}

// stranger is an attacker's view of the peer port: its own certificate (or
// none), and no check of the node's certificate at all.
type stranger struct {
	name string
	cert *tls.Certificate
}

func (s stranger) tlsConfig() *tls.Config {
	return &tls.Config{MinVersion: tls.VersionTLS12, InsecureSkipVerify: true,
		// Send the certificate whatever CAs the node names (crypto/tls
		// would send none from another CA).
		GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			if s.cert == nil {
				return &tls.Certificate{}, nil
			}
			return s.cert, nil
		}}
}

// strangerStream is a raft.StreamLayer that dials with the stranger's TLS
// configuration; it never accepts.
type strangerStream struct {
	net.Listener
	cfg *tls.Config
}

func (s *strangerStream) Dial(address raft.ServerAddress, timeout time.Duration) (net.Conn, error) {
	return tls.DialWithDialer(&net.Dialer{Timeout: timeout}, "tcp", string(address), s.cfg)
}

// transport returns a raft NetworkTransport that dials as the stranger.
func (s stranger) transport(t *testing.T) *raft.NetworkTransport {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	tr := raft.NewNetworkTransport(&strangerStream{Listener: ln, cfg: s.tlsConfig()}, 1, 2*time.Second, io.Discard)
	t.Cleanup(func() { _ = tr.Close() })
	return tr
}

func (s stranger) header(tr *raft.NetworkTransport) raft.RPCHeader {
	return raft.RPCHeader{ProtocolVersion: raft.ProtocolVersionMax, ID: []byte("stranger"), Addr: []byte(tr.LocalAddr())}
}

// appendEntries sends target, as a leader of term+100, an entry "stranger"
// that follows target's last entry and is committed at once.
func (s stranger) appendEntries(t *testing.T, target *node, term uint64) (raft.AppendEntriesResponse, error) {
	t.Helper()
	tr := s.transport(t)
	last := target.r.LastIndex()
	var prev raft.Log
	if err := target.store.GetLog(last, &prev); err != nil {
		t.Fatal(err)
	}
	ae := &raft.AppendEntriesRequest{RPCHeader: s.header(tr), Term: term + 100,
		PrevLogEntry: last, PrevLogTerm: prev.Term, LeaderCommitIndex: last + 1,
		Entries: []*raft.Log{{Index: last + 1, Term: term + 100, Type: raft.LogCommand, Data: []byte("stranger")}}}
	var resp raft.AppendEntriesResponse
	err := tr.AppendEntries(target.id, target.addr(), ae, &resp)
	return resp, err
}

// requestVote asks target for its vote in term+200.
func (s stranger) requestVote(t *testing.T, target *node, term uint64) (raft.RequestVoteResponse, error) {
	t.Helper()
	tr := s.transport(t)
	rv := &raft.RequestVoteRequest{RPCHeader: s.header(tr), Term: term + 200,
		LastLogIndex: target.r.LastIndex() + 1000, LastLogTerm: term + 200}
	var resp raft.RequestVoteResponse
	err := tr.RequestVote(target.id, target.addr(), rv, &resp)
	return resp, err
}

func strangers(t *testing.T, ca *pki.CA) []stranger {
	other := newCA(t)
	otherNode := issue(t, other, pki.Node, time.Hour)
	expired := issue(t, ca, pki.Node, -time.Minute)
	client := issue(t, ca, pki.Client, time.Hour)
	server := issue(t, ca, pki.Server, time.Hour)
	return []stranger{
		{"node cert from another CA", &otherNode},
		{"no cert", nil},
		{"expired node cert from the cluster CA", &expired},
		{"client-only cert from the cluster CA", &client},
		{"server-only cert from the cluster CA", &server},
	}
}

// TestStrangersCannotDialOrAppend plays, for each kind of stranger, a raw
// TLS dial, then AppendEntries (under a term 100 above the cluster's, with
// an entry the FSM would apply) and RequestVote through raft's own
// NetworkTransport, against a follower and the leader. Every attempt must
// fail and leave no trace in any node's log, term or FSM; the cluster
// must then still replicate.
func TestStrangersCannotDialOrAppend(t *testing.T) {
	ca := newCA(t)
	nodes := cluster(t, ca)
	apply(t, nodes[0], "before")
	waitEntry(t, "before", nodes...)
	term := nodes[0].r.CurrentTerm()

	for _, s := range strangers(t, ca) {
		t.Run(s.name, func(t *testing.T) {
			for _, target := range []*node{nodes[1], nodes[0]} {
				// A raw dial: whatever the client side of the handshake
				// says (TLS 1.3 clients finish before the server has checked
				// their certificate), the node must close the connection
				// with an alert, not wait for data.
				// The alert comes at once; alertWait only bounds a failure.
				const alertWait = 3 * time.Second
				c, err := tls.DialWithDialer(&net.Dialer{Timeout: waitFor}, "tcp", string(target.addr()), s.tlsConfig())
				if err == nil {
					_ = c.SetReadDeadline(time.Now().Add(alertWait))
					_, err = c.Read(make([]byte, 1))
					_ = c.Close()
					var ne net.Error
					if errors.As(err, &ne) && ne.Timeout() {
						t.Errorf("%s: node kept the connection open: it accepted the handshake", target.id)
					} else if err == nil {
						t.Errorf("%s: read on the stranger's connection succeeded", target.id)
					}
				}

				if aer, err := s.appendEntries(t, target, term); err == nil {
					t.Errorf("%s: stranger's AppendEntries succeeded: %+v", target.id, aer)
				}
				if rvr, err := s.requestVote(t, target, term); err == nil {
					t.Errorf("%s: stranger's RequestVote succeeded: %+v", target.id, rvr)
				}
			}
		})
	}

	for _, n := range nodes {
		if got := n.r.CurrentTerm(); got >= term+100 {
			t.Errorf("%s: term %d, the stranger's is %d", n.id, got, term+100)
		}
		for i := uint64(1); i <= n.r.LastIndex(); i++ {
			var l raft.Log
			if err := n.store.GetLog(i, &l); err == nil && string(l.Data) == "stranger" {
				t.Errorf("%s: the stranger's entry is in the log at %d", n.id, i)
			}
		}
		if contains(n.fsm.entries(), "stranger") {
			t.Errorf("%s applied the stranger's entry", n.id)
		}
	}
	if !strings.Contains(nodes[1].log.String(), "peer handshake failed") {
		t.Errorf("follower did not log the failed handshakes:\n%s", nodes[1].log.String())
	}
	for _, n := range nodes {
		if s := n.log.String(); strings.Contains(s, "failed to accept connection") {
			t.Errorf("%s: a failed handshake reached raft's accept loop:\n%s", n.id, s)
		}
	}

	// The cluster still works: it replicates, and takes in a fourth node with
	// a valid certificate.
	leader := waitLeader(t, nodes)
	apply(t, leader, "after")
	waitEntry(t, "after", nodes...)
	n4 := startNode(t, "n4", peerTLS(t, ca))
	if err := leader.r.AddVoter(n4.id, n4.addr(), 0, waitFor).Error(); err != nil {
		t.Fatal(err)
	}
	apply(t, leader, "with n4")
	waitEntry(t, "with n4", append(nodes, n4)...)
}

// TestInsiderAttackWorks is the control for TestStrangersCannotDialOrAppend:
// the same attack with a valid node certificate (a stolen one) gets through,
// so the strangers' failures are the transport's doing, not a malformed
// request's.
func TestInsiderAttackWorks(t *testing.T) {
	ca := newCA(t)
	nodes := cluster(t, ca)
	apply(t, nodes[0], "before")
	waitEntry(t, "before", nodes...)
	term := nodes[0].r.CurrentTerm()
	stolen := issue(t, ca, pki.Node, time.Hour)
	insider := stranger{"stolen node cert", &stolen}
	target := nodes[1]
	if resp, err := insider.appendEntries(t, target, term); err != nil || !resp.Success {
		t.Fatalf("insider's AppendEntries: %+v, %v", resp, err)
	}
	waitEntry(t, "stranger", target)
	if got := target.r.CurrentTerm(); got < term+100 {
		t.Errorf("term %d after the insider's AppendEntries, want at least %d", got, term+100)
	}
	if _, err := insider.requestVote(t, target, term); err != nil {
		t.Errorf("insider's RequestVote: %v", err)
	}
}

// TestStrangerNodeCannotJoin runs full raft nodes with a certificate from
// another CA: one that claims membership in the cluster (its bootstrap
// configuration names the three nodes) campaigns but gets no vote and
// cannot add itself; one that the leader is made to add as a non-voter
// receives no entries, because the leader cannot verify its certificate.
func TestStrangerNodeCannotJoin(t *testing.T) {
	ca, other := newCA(t), newCA(t)
	nodes := cluster(t, ca)
	leader := nodes[0]
	apply(t, leader, "before")
	waitEntry(t, "before", nodes...)

	// Without pre-vote the claimer raises its term at every election, and
	// its RequestVotes, if they arrived, would carry that term.
	claimer := startNode(t, "claimer", peerTLS(t, other), func(c *raft.Config) { c.PreVoteDisabled = true })
	bootstrap(t, []*node{claimer}, append([]*node{claimer}, nodes...)...)
	deadline := time.Now().Add(waitFor)
	for claimer.r.CurrentTerm() < 3 { // it has run at least two elections
		if time.Now().After(deadline) {
			t.Fatal("the claimer did not campaign")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if claimer.r.State() == raft.Leader {
		t.Fatal("the claimer became leader")
	}
	if err := claimer.r.AddVoter("claimer2", "127.0.0.1:1", 0, time.Second).Error(); !errors.Is(err, raft.ErrNotLeader) {
		t.Fatalf("AddVoter on the claimer: %v, want ErrNotLeader", err)
	}

	obs := make(chan raft.Observation, 16)
	leader.r.RegisterObserver(raft.NewObserver(obs, false, func(o *raft.Observation) bool {
		f, ok := o.Data.(raft.FailedHeartbeatObservation)
		return ok && f.PeerID == "joiner"
	}))
	joiner := startNode(t, "joiner", peerTLS(t, other))
	if err := leader.r.AddNonvoter(joiner.id, joiner.addr(), 0, waitFor).Error(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-obs:
	case <-time.After(waitFor):
		t.Fatal("the leader's heartbeats to the joiner did not fail")
	}
	apply(t, leader, "after")
	waitEntry(t, "after", nodes...)
	if got := joiner.r.LastIndex(); got != 0 {
		t.Errorf("the joiner's log reaches index %d, want empty", got)
	}
	if got := joiner.fsm.entries(); len(got) != 0 {
		t.Errorf("the joiner applied %q", got)
	}
	for _, n := range nodes {
		if contains(n.fsm.entries(), "claimer") || n.r.State() == raft.Candidate {
			t.Errorf("%s: disturbed by the claimer", n.id)
		}
	}
	if !strings.Contains(joiner.log.String(), "peer handshake failed") {
		t.Errorf("the joiner did not log the leader's failed handshakes:\n%s", joiner.log.String())
	}
}
