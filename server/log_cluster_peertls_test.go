package server_test

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/ticketing-dev/ticketing/internal/pki"
	"github.com/ticketing-dev/ticketing/internal/raftnet"
	"github.com/ticketing-dev/ticketing/server"
)

// TestClusterPeerTLSConfig: ClusterConfig.PeerCertificate and PeerRoots
// (standard-library types) are checked by New, which fails on a
// certificate the transport could not use, on one without the other, and
// otherwise secures the Raft port with mutual TLS against PeerRoots: a
// node certificate of the cluster CA gets through the handshake, one of
// another CA does not, nor does a dialler without a certificate.
func TestClusterPeerTLSConfig(t *testing.T) {
	ca, err := pki.NewCA("peer TLS test cluster CA", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	other, err := pki.NewCA("another CA", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	issue := func(ca *pki.CA, kind pki.Kind) tls.Certificate {
		t.Helper()
		kp, err := ca.Issue(kind, []string{"127.0.0.1"}, time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		return kp.TLSCertificate()
	}
	node := issue(ca, pki.Node)
	serverOnly := issue(ca, pki.Server)
	strangerNode := issue(other, pki.Node)
	noKey := node
	noKey.PrivateKey = nil

	raftAddr, clientAddr := freeAddr(t), freeAddr(t)
	config := func(cert *tls.Certificate, roots *x509.CertPool) server.Config {
		return server.Config{DataDir: t.TempDir(), Cluster: &server.ClusterConfig{
			NodeID: "n1", RaftListen: raftAddr, Advertise: clientAddr,
			Peers:           []server.Peer{{ID: "n1", Address: raftAddr}},
			PeerCertificate: cert, PeerRoots: roots,
			HeartbeatTimeout: testHeartbeat, ElectionTimeout: testElection,
		}}
	}
	for _, tc := range []struct {
		name  string
		cert  *tls.Certificate
		roots *x509.CertPool
		want  string
		is    error
	}{
		{"certificate without roots", &node, nil, "server: ClusterConfig.PeerCertificate without PeerRoots", nil},
		{"roots without certificate", nil, ca.Pool(), "server: ClusterConfig.PeerRoots without PeerCertificate", nil},
		{"not a node certificate", &serverOnly, ca.Pool(), "server: ClusterConfig.PeerCertificate: raftnet: peer TLS: own certificate: ", nil},
		{"another CA's certificate", &strangerNode, ca.Pool(), "server: ClusterConfig.PeerCertificate: raftnet: peer TLS: own certificate: x509: ", nil},
		{"no private key", &noKey, ca.Pool(), "server: ClusterConfig.PeerCertificate: raftnet: peer TLS: certificate or key missing", nil},
		{"empty certificate", &tls.Certificate{}, ca.Pool(), "server: ClusterConfig.PeerCertificate: raftnet: peer TLS: certificate or key missing", nil},
	} {
		s, err := server.New(config(tc.cert, tc.roots))
		if err == nil {
			s.Close()
			t.Errorf("%s: New succeeded", tc.name)
			continue
		}
		if !strings.HasPrefix(err.Error(), tc.want) {
			t.Errorf("%s: %v, want %q...", tc.name, err, tc.want)
		}
	}
	// The wrapped error stays reachable.
	if _, err := server.New(config(&serverOnly, ca.Pool())); !errors.Is(err, raftnet.ErrNotNodeCertificate) {
		t.Errorf("a server certificate: %v, want errors.Is raftnet.ErrNotNodeCertificate", err)
	}
	var uae x509.UnknownAuthorityError
	if _, err := server.New(config(&strangerNode, ca.Pool())); !errors.As(err, &uae) {
		t.Errorf("another CA's certificate: %v, want an x509.UnknownAuthorityError", err)
	}

	cfg := config(&node, ca.Pool())
	s, err := server.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	node.PrivateKey = nil // New copied the certificate: no effect
	// handshake dials the Raft port with cert and returns the server's
	// verdict, or nil if none came within wait: a rejection comes at once,
	// so a short wait decides an acceptance (nothing comes: the transport
	// waits for an RPC), and a long one, a hang guard, a rejection.
	handshake := func(cert *tls.Certificate, wait time.Duration) error {
		conf := &tls.Config{RootCAs: ca.Pool(), ServerName: "127.0.0.1", MinVersion: tls.VersionTLS13}
		if cert != nil {
			conf.Certificates = []tls.Certificate{*cert}
		}
		c, err := tls.Dial("tcp", raftAddr, conf)
		if err != nil {
			return err
		}
		defer c.Close()
		// In TLS 1.3 the server checks the client's certificate after the
		// client's handshake is done: its verdict comes with the first read.
		c.SetReadDeadline(time.Now().Add(wait))
		_, err = c.Read(make([]byte, 1))
		var ne interface{ Timeout() bool }
		if errors.As(err, &ne) && ne.Timeout() {
			return nil
		}
		return err
	}
	good := issue(ca, pki.Node)
	if err := handshake(&good, 200*time.Millisecond); err != nil {
		t.Errorf("a node certificate of the cluster CA: %v", err)
	}
	if err := handshake(&strangerNode, 30*time.Second); err == nil {
		t.Errorf("a node certificate of another CA was accepted")
	}
	if err := handshake(nil, 30*time.Second); err == nil {
		t.Errorf("a dialler without a certificate was accepted")
	}
}
