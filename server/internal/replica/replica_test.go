package replica

import (
	"crypto/tls"
	"crypto/x509"
	"strings"
	"testing"
)

func TestValidID(t *testing.T) {
	for _, id := range []string{"n1", "a.b_c-D9", strings.Repeat("x", MaxIDLen), "...", ".a", "a.."} {
		if !ValidID(id) {
			t.Errorf("ValidID(%q) = false, want true", id)
		}
	}
	for _, id := range []string{"", ".", "..", "a/b", "a b", "é", strings.Repeat("x", MaxIDLen+1)} {
		if ValidID(id) {
			t.Errorf("ValidID(%q) = true, want false", id)
		}
	}
}

// TestPeerTLSBothOrNeither: no TLS without either; one without the other
// is an error naming the setting that is missing and the config.
func TestPeerTLSBothOrNeither(t *testing.T) {
	if p, err := PeerTLS("ClusterConfig", nil, nil); p != nil || err != nil {
		t.Fatalf("neither: %v, %v; want nil, nil", p, err)
	}
	if _, err := PeerTLS("PairConfig", &tls.Certificate{}, nil); err == nil || !strings.Contains(err.Error(), "PairConfig.PeerCertificate without PeerRoots") {
		t.Fatalf("no roots: %v", err)
	}
	if _, err := PeerTLS("ClusterConfig", nil, x509.NewCertPool()); err == nil || !strings.Contains(err.Error(), "ClusterConfig.PeerRoots without PeerCertificate") {
		t.Fatalf("no certificate: %v", err)
	}
}

func TestNewIDIsAValidID(t *testing.T) {
	a, b := NewID(), NewID()
	if len(a) != 32 || !ValidID(a) || a == b {
		t.Fatalf("NewID: %q, %q", a, b)
	}
}

func TestDialableHostPort(t *testing.T) {
	for _, a := range []string{"127.0.0.1:7001", "node-1:7001", "[::1]:7001"} {
		if err := DialableHostPort(a); err != nil {
			t.Errorf("%s: %v", a, err)
		}
	}
	for _, a := range []string{":7001", "0.0.0.0:7001", "[::]:7001", "127.0.0.1"} {
		if err := DialableHostPort(a); err == nil {
			t.Errorf("%s: accepted", a)
		}
	}
}
