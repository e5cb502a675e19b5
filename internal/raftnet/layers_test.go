package raftnet

import (
	"crypto/tls"
	"errors"
	"net"
	"testing"
	"time"

	"github.com/ticketing-dev/ticketing/internal/pki"
)

// The accepting side has two independent checks of the client certificate:
// crypto/tls's RequireAndVerifyClientCert against the CA pool, and
// verifyConnection's demand for a verified node certificate. The tests in
// raftnet_test pass as long as either holds; these check each alone, over
// a real socket, so that weakening either fails a test.

func TestClientAuthAloneRejectsStrangers(t *testing.T) {
	p, ca, other := layerPeer(t)
	cfg := p.ServerConfig()
	if cfg.ClientAuth != tls.RequireAndVerifyClientCert {
		t.Errorf("ClientAuth %v, want RequireAndVerifyClientCert", cfg.ClientAuth)
	}
	cfg.VerifyConnection = nil
	otherNode := layerCert(t, other, pki.Node, time.Hour)
	expired := layerCert(t, ca, pki.Node, -time.Minute)
	for name, cert := range map[string]*tls.Certificate{"no cert": nil, "another CA": &otherNode, "expired": &expired} {
		if err := serverHandshake(t, cfg, cert); err == nil {
			t.Errorf("%s: handshake accepted without verifyConnection", name)
		}
	}
	good := layerCert(t, ca, pki.Node, time.Hour)
	if err := serverHandshake(t, cfg, &good); err != nil {
		t.Errorf("node certificate rejected: %v", err)
	}
}

func TestVerifyConnectionAloneRejectsStrangers(t *testing.T) {
	p, ca, other := layerPeer(t)
	otherNode := layerCert(t, other, pki.Node, time.Hour)
	client := layerCert(t, ca, pki.Client, time.Hour)
	for _, c := range []struct {
		name string
		auth tls.ClientAuthType
		cert *tls.Certificate
		want error
	}{
		{"no client auth, no cert", tls.NoClientCert, nil, ErrNoPeerCertificate},
		{"any cert, from another CA", tls.RequireAnyClientCert, &otherNode, ErrNoPeerCertificate},
		{"verify if given, no cert", tls.VerifyClientCertIfGiven, nil, ErrNoPeerCertificate},
		{"verify if given, client kind", tls.VerifyClientCertIfGiven, &client, ErrNotNodeCertificate},
		{"required, client kind", tls.RequireAndVerifyClientCert, &client, ErrNotNodeCertificate},
	} {
		cfg := p.ServerConfig()
		cfg.ClientAuth = c.auth
		if err := serverHandshake(t, cfg, c.cert); !errors.Is(err, c.want) {
			t.Errorf("%s: handshake error %v, want %v", c.name, err, c.want)
		}
	}
}

func layerPeer(t *testing.T) (p *PeerTLS, ca, other *pki.CA) {
	t.Helper()
	var err error
	if ca, err = pki.NewCA("cluster", time.Hour); err != nil {
		t.Fatal(err)
	}
	if other, err = pki.NewCA("other", time.Hour); err != nil {
		t.Fatal(err)
	}
	if p, err = NewPeerTLS(layerCert(t, ca, pki.Node, time.Hour), ca.Pool()); err != nil {
		t.Fatal(err)
	}
	return p, ca, other
}

func layerCert(t *testing.T, ca *pki.CA, kind pki.Kind, validFor time.Duration) tls.Certificate {
	t.Helper()
	kp, err := ca.Issue(kind, []string{"127.0.0.1"}, validFor)
	if err != nil {
		t.Fatal(err)
	}
	return kp.TLSCertificate()
}

// serverHandshake runs a server handshake with cfg on a real socket against a
// client presenting cert (none if nil) and returns the server's error.
func serverHandshake(t *testing.T, cfg *tls.Config, cert *tls.Certificate) error {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	done := make(chan struct{})
	go func() {
		defer close(done)
		ccfg := &tls.Config{InsecureSkipVerify: true, MinVersion: tls.VersionTLS13,
			// Send cert whatever CAs the server names, as an attacker would.
			GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
				if cert == nil {
					return &tls.Certificate{}, nil
				}
				return cert, nil
			}}
		c, err := tls.Dial("tcp", ln.Addr().String(), ccfg)
		if err == nil {
			_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
			_, _ = c.Read(make([]byte, 1))
			_ = c.Close()
		}
	}()
	raw, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	_ = raw.SetDeadline(time.Now().Add(5 * time.Second))
	sc := tls.Server(raw, cfg)
	err = sc.Handshake()
	_ = sc.Close()
	<-done
	return err
}
