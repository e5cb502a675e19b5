package broker_test

import (
	"crypto/tls"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/ticketing-dev/ticketing/internal/pki"
)

// testPKI is a private CA and a server certificate for DNS name
// "ticketing.test" only (no IP SAN), made in the test.
type testPKI struct {
	CAFile    string
	ServerTLS *tls.Config
}

const testServerName = "ticketing.test"

func newPKI(t testing.TB) *testPKI {
	t.Helper()
	ca, err := pki.NewCA("ticketing test CA", 24*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := ca.Issue(pki.Server, []string{testServerName}, 24*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	caFile := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(caFile, ca.CertPEM(), 0o600); err != nil {
		t.Fatal(err)
	}
	return &testPKI{
		CAFile: caFile,
		ServerTLS: &tls.Config{
			MinVersion:   tls.VersionTLS12,
			Certificates: []tls.Certificate{leaf.TLSCertificate(ca.Cert)},
		},
	}
}
