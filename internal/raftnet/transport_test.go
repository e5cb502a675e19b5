package raftnet_test

import (
	"crypto/tls"
	"errors"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/ticketing-dev/ticketing/internal/pki"
	"github.com/ticketing-dev/ticketing/internal/raft"
	"github.com/ticketing-dev/ticketing/internal/raftnet"
)

// respond answers every AppendEntries that reaches tr with success, until
// the test ends.
func respond(t *testing.T, tr *raft.NetworkTransport) {
	t.Helper()
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case rpc := <-tr.Consumer():
				if _, ok := rpc.Command.(*raft.AppendEntriesRequest); ok {
					rpc.Respond(&raft.AppendEntriesResponse{Success: true}, nil)
				} else {
					rpc.Respond(nil, errors.New("unsupported"))
				}
			case <-done:
				return
			}
		}
	}()
	t.Cleanup(func() { close(done); wg.Wait() })
}

// ping sends an AppendEntries from one transport to another.
func ping(from, to *raft.NetworkTransport) error {
	req := &raft.AppendEntriesRequest{RPCHeader: raft.RPCHeader{ProtocolVersion: raft.ProtocolVersionMax,
		ID: []byte("pinger"), Addr: []byte(from.LocalAddr())}, Term: 1}
	var resp raft.AppendEntriesResponse
	if err := from.AppendEntries("target", to.LocalAddr(), req, &resp); err != nil {
		return err
	}
	if !resp.Success {
		return errors.New("no success")
	}
	return nil
}

func captured(lb *logBuf) *slog.Logger {
	return slog.New(slog.NewTextHandler(lb, &slog.HandlerOptions{Level: slog.LevelWarn}))
}

// stall opens a TCP connection to tr and sends nothing.
func stall(t *testing.T, tr *raft.NetworkTransport) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", string(tr.LocalAddr()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// closedByPeer reports whether the peer closed c (read fails other than by
// the deadline, which only bounds a failure).
func closedByPeer(c net.Conn, wait time.Duration) bool {
	_ = c.SetReadDeadline(time.Now().Add(wait))
	_, err := c.Read(make([]byte, 1))
	var ne net.Error
	return err != nil && !(errors.As(err, &ne) && ne.Timeout())
}

func TestStalledHandshakeDoesNotBlockPeers(t *testing.T) {
	ca := newCA(t)
	a := newTransport(t, raftnet.Config{TLS: peerTLS(t, ca), HandshakeTimeout: time.Minute})
	respond(t, a)
	b := newTransport(t, raftnet.Config{TLS: peerTLS(t, ca)})
	c := stall(t, a)
	if err := ping(b, a); err != nil {
		t.Fatalf("a peer could not connect while a stranger stalls a handshake: %v", err)
	}
	if closedByPeer(c, 50*time.Millisecond) {
		t.Fatal("the stalled connection was closed before its handshake timeout")
	}
}

func TestHandshakeTimeoutClosesStalledConn(t *testing.T) {
	ca := newCA(t)
	lb := &logBuf{}
	a := newTransport(t, raftnet.Config{TLS: peerTLS(t, ca), HandshakeTimeout: 100 * time.Millisecond, Logger: captured(lb)})
	c := stall(t, a)
	if !closedByPeer(c, waitFor) {
		t.Fatal("the stalled connection was not closed")
	}
	deadline := time.Now().Add(waitFor)
	for !strings.Contains(lb.String(), "peer handshake failed") {
		if time.Now().After(deadline) {
			t.Fatalf("no log line for the timed-out handshake: %q", lb.String())
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestMaxHandshakes(t *testing.T) {
	ca := newCA(t)
	lb := &logBuf{}
	a := newTransport(t, raftnet.Config{TLS: peerTLS(t, ca), HandshakeTimeout: time.Minute, MaxHandshakes: 1, Logger: captured(lb)})
	respond(t, a)
	first := stall(t, a)
	second := stall(t, a)
	if !closedByPeer(second, waitFor) {
		t.Fatal("a connection beyond MaxHandshakes was not refused")
	}
	if !strings.Contains(lb.String(), "too many handshakes in progress") {
		t.Errorf("no log line for the refused connection: %q", lb.String())
	}
	_ = first.Close() // frees the slot, once the node sees the close
	b := newTransport(t, raftnet.Config{TLS: peerTLS(t, ca)})
	deadline := time.Now().Add(waitFor)
	for err := ping(b, a); err != nil; err = ping(b, a) {
		if time.Now().After(deadline) {
			t.Fatalf("the slot was not freed: %v", err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestDialVerifiesPeerAddress(t *testing.T) {
	ca := newCA(t)
	// a's certificate names another host than the address b dials.
	a := newTransport(t, raftnet.Config{TLS: peerTLS(t, ca, "10.255.0.1", "localhost")})
	respond(t, a)
	b := newTransport(t, raftnet.Config{TLS: peerTLS(t, ca)})
	err := ping(b, a)
	if err == nil || !strings.Contains(err.Error(), "certificate is valid for 10.255.0.1") {
		t.Fatalf("dial to an address the certificate does not name: %v", err)
	}
	// The same peer under a name its certificate does hold.
	_, port, _ := net.SplitHostPort(string(a.LocalAddr()))
	req := &raft.AppendEntriesRequest{RPCHeader: raft.RPCHeader{ProtocolVersion: raft.ProtocolVersionMax}, Term: 1}
	var resp raft.AppendEntriesResponse
	if err := b.AppendEntries("a", raft.ServerAddress(net.JoinHostPort("localhost", port)), req, &resp); err != nil {
		t.Fatalf("dial by a DNS name in the certificate: %v", err)
	}
}

// TestCloseClosesPeerConns checks that Close cuts an authenticated inbound
// connection (raft's own transport leaves those to the peer).
func TestCloseClosesPeerConns(t *testing.T) {
	ca := newCA(t)
	a, err := raftnet.New(raftnet.Config{BindAddr: "127.0.0.1:0", TLS: peerTLS(t, ca)})
	if err != nil {
		t.Fatal(err)
	}
	kp, err := ca.Issue(pki.Node, []string{"127.0.0.1"}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	c, err := tls.Dial("tcp", string(a.LocalAddr()), &tls.Config{MinVersion: tls.VersionTLS13,
		RootCAs: ca.Pool(), Certificates: []tls.Certificate{kp.TLSCertificate()}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if closedByPeer(c, 50*time.Millisecond) {
		t.Fatal("the node refused a valid peer")
	}
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	if !closedByPeer(c, waitFor) {
		t.Fatal("the peer connection survived Close")
	}
	if err := a.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
}

func writeFile(t *testing.T, dir, name string, data ...[]byte) string {
	t.Helper()
	p := filepath.Join(dir, name)
	var all []byte
	for _, d := range data {
		all = append(all, d...)
	}
	if err := os.WriteFile(p, all, 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// writeNode writes a node certificate from ca and its key to dir and returns
// their paths.
func writeNode(t *testing.T, dir, name string, ca *pki.CA, kind pki.Kind, validFor time.Duration) (cert, key string) {
	t.Helper()
	kp, err := ca.Issue(kind, []string{"127.0.0.1"}, validFor)
	if err != nil {
		t.Fatal(err)
	}
	keyPEM, err := kp.KeyPEM()
	if err != nil {
		t.Fatal(err)
	}
	return writeFile(t, dir, name+".crt", kp.CertPEM()), writeFile(t, dir, name+".key", keyPEM)
}

// TestLoadPeerTLSAndRotation loads PEM files and plays the middle of a CA
// rotation: nodes trusting both CAs talk whichever CA signed their
// certificates, and a node still trusting only the old CA neither accepts
// nor reaches a node with a certificate from the new one.
func TestLoadPeerTLSAndRotation(t *testing.T) {
	dir := t.TempDir()
	oldCA, newCA := newCA(t), newCA(t)
	both := writeFile(t, dir, "both.pem", oldCA.CertPEM(), newCA.CertPEM())
	onlyOld := writeFile(t, dir, "old.pem", oldCA.CertPEM())
	load := func(name string, ca *pki.CA, caFile string) *raft.NetworkTransport {
		cert, key := writeNode(t, dir, name, ca, pki.Node, time.Hour)
		p, err := raftnet.LoadPeerTLS(cert, key, caFile)
		if err != nil {
			t.Fatal(err)
		}
		tr := newTransport(t, raftnet.Config{TLS: p})
		respond(t, tr)
		return tr
	}
	a := load("a", oldCA, both)
	b := load("b", newCA, both)
	c := load("c", oldCA, onlyOld)
	for _, p := range []struct {
		name     string
		from, to *raft.NetworkTransport
		ok       bool
	}{
		{"old cert to new cert, both trusted", a, b, true},
		{"new cert to old cert, both trusted", b, a, true},
		{"old-only trust to new cert", c, b, false},
		{"new cert to old-only trust", b, c, false},
		{"old-only trust to old cert", c, a, true},
	} {
		if err := ping(p.from, p.to); (err == nil) != p.ok {
			t.Errorf("%s: ping error %v, want success %v", p.name, err, p.ok)
		}
	}
}

func TestLoadPeerTLSErrors(t *testing.T) {
	dir := t.TempDir()
	ca, other := newCA(t), newCA(t)
	caFile := writeFile(t, dir, "ca.pem", ca.CertPEM())
	nodeCert, nodeKey := writeNode(t, dir, "node", ca, pki.Node, time.Hour)
	clientCert, clientKey := writeNode(t, dir, "client", ca, pki.Client, time.Hour)
	expiredCert, expiredKey := writeNode(t, dir, "expired", ca, pki.Node, -time.Minute)
	otherCert, otherKey := writeNode(t, dir, "other", other, pki.Node, time.Hour)
	for _, c := range []struct {
		name            string
		cert, key, ca   string
		want            error
		wantMsgContains string
	}{
		{"client certificate", clientCert, clientKey, caFile, raftnet.ErrNotNodeCertificate, ""},
		{"expired certificate", expiredCert, expiredKey, caFile, nil, "expired"},
		{"certificate from another CA", otherCert, otherKey, caFile, nil, "unknown authority"},
		{"CA file without certificates", nodeCert, nodeKey, writeFile(t, dir, "empty.pem", []byte("nothing")), nil, "no certificate in CA file"},
		{"missing CA file", nodeCert, nodeKey, filepath.Join(dir, "missing.pem"), nil, "read CA file"},
		{"key of another certificate", nodeCert, clientKey, caFile, nil, "load key pair"},
	} {
		_, err := raftnet.LoadPeerTLS(c.cert, c.key, c.ca)
		if err == nil || (c.want != nil && !errors.Is(err, c.want)) || !strings.Contains(err.Error(), c.wantMsgContains) {
			t.Errorf("%s: %v", c.name, err)
		}
	}
	if _, err := raftnet.LoadPeerTLS(nodeCert, nodeKey, caFile); err != nil {
		t.Errorf("valid files: %v", err)
	}
}

func TestPlainTCPWarnsAndWorks(t *testing.T) {
	lb := &logBuf{}
	a := newTransport(t, raftnet.Config{Logger: captured(lb)})
	respond(t, a)
	b := newTransport(t, raftnet.Config{})
	if !strings.Contains(lb.String(), "raft peer transport without TLS") {
		t.Errorf("no warning: %q", lb.String())
	}
	if err := ping(b, a); err != nil {
		t.Fatal(err)
	}
}

func TestNewErrors(t *testing.T) {
	for _, c := range []struct {
		name string
		cfg  raftnet.Config
		want error
	}{
		{"unspecified advertise", raftnet.Config{BindAddr: "127.0.0.1:0", Advertise: &net.TCPAddr{IP: net.IPv4zero, Port: 1}}, raftnet.ErrAdvertise},
		{"unspecified listener, no advertise", raftnet.Config{BindAddr: "0.0.0.0:0"}, raftnet.ErrAdvertise},
		{"non-TCP advertise", raftnet.Config{BindAddr: "127.0.0.1:0", Advertise: &net.UnixAddr{Name: "x", Net: "unix"}}, raftnet.ErrAdvertise},
		{"no bind address", raftnet.Config{}, nil},
		{"negative timeout", raftnet.Config{BindAddr: "127.0.0.1:0", Timeout: -1}, nil},
	} {
		tr, err := raftnet.New(c.cfg)
		if err == nil {
			_ = tr.Close()
		}
		if err == nil || (c.want != nil && !errors.Is(err, c.want)) {
			t.Errorf("%s: %v, want %v", c.name, err, c.want)
		}
	}
	adv := &net.TCPAddr{IP: net.ParseIP("10.1.2.3"), Port: 7947}
	tr, err := raftnet.New(raftnet.Config{BindAddr: "0.0.0.0:0", Advertise: adv})
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	if tr.LocalAddr() != "10.1.2.3:7947" {
		t.Errorf("LocalAddr %q, want the advertised address", tr.LocalAddr())
	}
}

func TestHCLogger(t *testing.T) {
	lb := &logBuf{}
	l := raftnet.HCLogger(slog.New(slog.NewTextHandler(lb, &slog.HandlerOptions{Level: slog.LevelInfo})))
	if l.IsDebug() || !l.IsInfo() || !l.IsError() {
		t.Errorf("levels: debug %v info %v error %v", l.IsDebug(), l.IsInfo(), l.IsError())
	}
	l.Debug("hidden")
	l.Named("raft").Named("net").With("k", "v").Warn("shown", "peer", "n2")
	l.StandardLogger(nil).Print("from std")
	l.Info("initial configuration", "servers", hclog.Fmt("%+v", []struct{ ID string }{{"n1"}}))
	got := lb.String()
	for _, want := range []string{"level=WARN msg=shown logger=raft.net k=v peer=n2", "msg=\"from std\"", "servers=[{ID:n1}]"} {
		if !strings.Contains(got, want) {
			t.Errorf("log %q lacks %q", got, want)
		}
	}
	if strings.Contains(got, "hidden") {
		t.Errorf("debug line written: %q", got)
	}
	raftnet.HCLogger(nil).Error("discarded")
}
