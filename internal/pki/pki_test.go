package pki

import (
	"bytes"
	"crypto/x509"
	"encoding/pem"
	"net"
	"slices"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func newCA(t *testing.T) *CA {
	t.Helper()
	ca, err := NewCA("test CA", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	return ca
}

func TestServerCertVerifiesForEachHost(t *testing.T) {
	ca := newCA(t)
	hosts := []string{"127.0.0.1", "localhost", "::1", "ticketing.test"}
	p, err := ca.Issue(Server, hosts, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if p.Cert.Subject.CommonName != "127.0.0.1" {
		t.Errorf("CN %q", p.Cert.Subject.CommonName)
	}
	for _, h := range hosts {
		_, err := p.Cert.Verify(x509.VerifyOptions{DNSName: h, Roots: ca.Pool(),
			KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}})
		if err != nil {
			t.Errorf("verify %s: %v", h, err)
		}
	}
	if _, err := p.Cert.Verify(x509.VerifyOptions{DNSName: "other.test", Roots: ca.Pool()}); err == nil {
		t.Error("verified for a host not in the certificate")
	}
	if _, err := p.Cert.Verify(x509.VerifyOptions{Roots: ca.Pool(),
		KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err == nil {
		t.Error("server certificate verified for client auth")
	}
	other := newCA(t)
	if _, err := p.Cert.Verify(x509.VerifyOptions{DNSName: "localhost", Roots: other.Pool()}); err == nil {
		t.Error("verified against another CA")
	}
}

func TestSANs(t *testing.T) {
	ca := newCA(t)
	p, err := ca.Issue(Server, []string{"10.0.0.1", "a.test", "::1", "b.test"}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"a.test", "b.test"}; !slices.Equal(p.Cert.DNSNames, want) {
		t.Errorf("DNSNames %q, want %q", p.Cert.DNSNames, want)
	}
	want := []net.IP{net.ParseIP("10.0.0.1"), net.ParseIP("::1")}
	if len(p.Cert.IPAddresses) != len(want) {
		t.Fatalf("IPAddresses %v, want %v", p.Cert.IPAddresses, want)
	}
	for i, ip := range p.Cert.IPAddresses {
		if !ip.Equal(want[i]) {
			t.Errorf("IPAddresses[%d] = %v, want %v", i, ip, want[i])
		}
	}
}

func TestClientCert(t *testing.T) {
	ca := newCA(t)
	p, err := ca.Issue(Client, []string{"client"}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(p.Cert.ExtKeyUsage, []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}) {
		t.Errorf("ExtKeyUsage %v", p.Cert.ExtKeyUsage)
	}
	if _, err := p.Cert.Verify(x509.VerifyOptions{Roots: ca.Pool(),
		KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
		t.Errorf("client certificate does not verify for client auth: %v", err)
	}
}

func TestNodeCert(t *testing.T) {
	ca := newCA(t)
	p, err := ca.Issue(Node, []string{"10.0.0.7", "node7.test"}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	want := []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}
	if !slices.Equal(p.Cert.ExtKeyUsage, want) {
		t.Errorf("ExtKeyUsage %v, want %v", p.Cert.ExtKeyUsage, want)
	}
	for _, usage := range want {
		if _, err := p.Cert.Verify(x509.VerifyOptions{DNSName: "node7.test", Roots: ca.Pool(),
			KeyUsages: []x509.ExtKeyUsage{usage}}); err != nil {
			t.Errorf("node certificate does not verify for %v: %v", usage, err)
		}
	}
	if Node.String() != "node" {
		t.Errorf("Node.String() = %q", Node.String())
	}
}

func TestCAProperties(t *testing.T) {
	ca := newCA(t)
	c := ca.Cert
	if !c.IsCA || !c.MaxPathLenZero || c.KeyUsage&x509.KeyUsageCertSign == 0 {
		t.Errorf("IsCA %v MaxPathLenZero %v KeyUsage %v", c.IsCA, c.MaxPathLenZero, c.KeyUsage)
	}
	if c.Subject.CommonName != "test CA" || !slices.Equal(c.Subject.Organization, []string{Organization}) {
		t.Errorf("subject %v", c.Subject)
	}
	if d := time.Until(c.NotAfter); d > time.Hour || d < 59*time.Minute {
		t.Errorf("NotAfter in %v, want about an hour", d)
	}
}

func TestPEMRoundTrip(t *testing.T) {
	ca := newCA(t)
	keyPEM, err := ca.KeyPEM()
	if err != nil {
		t.Fatal(err)
	}
	certPEM := ca.CertPEM()
	for _, c := range []struct {
		data []byte
		typ  string
	}{{certPEM, "CERTIFICATE"}, {keyPEM, "PRIVATE KEY"}} {
		b, rest := pem.Decode(c.data)
		if b == nil || b.Type != c.typ || len(rest) != 0 {
			t.Fatalf("PEM %q: block %v, %d trailing bytes", c.typ, b, len(rest))
		}
	}
	loaded, err := LoadCA(certPEM, keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	if !loaded.Cert.Equal(ca.Cert) || !loaded.Key.Equal(ca.Key) {
		t.Fatal("CA changed in a PEM round trip")
	}
	// The loaded CA signs certificates that verify against the original.
	p, err := loaded.Issue(Server, []string{"localhost"}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.Cert.Verify(x509.VerifyOptions{DNSName: "localhost", Roots: ca.Pool()}); err != nil {
		t.Fatal(err)
	}
	leafKey, err := p.KeyPEM()
	if err != nil {
		t.Fatal(err)
	}
	k, err := x509.ParsePKCS8PrivateKey(mustDecode(t, leafKey))
	if err != nil {
		t.Fatal(err)
	}
	if !p.Key.Equal(k) {
		t.Fatal("leaf key changed in a PEM round trip")
	}
	if !bytes.Equal(mustDecode(t, p.CertPEM()), p.Cert.Raw) {
		t.Fatal("leaf certificate changed in a PEM round trip")
	}
}

func TestLoadCARejectsLeaf(t *testing.T) {
	ca := newCA(t)
	p, err := ca.Issue(Server, []string{"localhost"}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	keyPEM, _ := p.KeyPEM()
	if _, err := LoadCA(p.CertPEM(), keyPEM); err == nil {
		t.Fatal("LoadCA accepted a server certificate")
	}
}

func TestTLSCertificate(t *testing.T) {
	ca := newCA(t)
	p, err := ca.Issue(Server, []string{"localhost"}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	c := p.TLSCertificate(ca.Cert)
	if len(c.Certificate) != 2 || !bytes.Equal(c.Certificate[0], p.Cert.Raw) ||
		!bytes.Equal(c.Certificate[1], ca.Cert.Raw) || c.Leaf != p.Cert || c.PrivateKey != p.Key {
		t.Fatal("TLSCertificate: wrong chain or key")
	}
	if n := len(p.TLSCertificate().Certificate); n != 1 {
		t.Fatalf("TLSCertificate() chain length %d, want 1", n)
	}
}

func TestIssueErrors(t *testing.T) {
	ca := newCA(t)
	if _, err := ca.Issue(Server, nil, time.Hour); err == nil {
		t.Error("Issue with no hosts succeeded")
	}
	if _, err := ca.Issue(Kind(9), []string{"x"}, time.Hour); err == nil {
		t.Error("Issue with an unknown kind succeeded")
	}
}

func mustDecode(t *testing.T, data []byte) []byte {
	t.Helper()
	b, _ := pem.Decode(data)
	if b == nil {
		t.Fatal("no PEM block")
	}
	return b.Bytes
}
