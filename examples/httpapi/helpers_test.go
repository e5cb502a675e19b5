package main

// The test helpers of this example, kept in this directory (and only on
// the standard library, pgx and the module's public packages) so that the
// directory can be copied whole, tests included, into a module of one's
// own.

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/pem"
	"math/big"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/ticketing-dev/ticketing/broker"
	"github.com/ticketing-dev/ticketing/server"
	"github.com/ticketing-dev/ticketing/server/servertest"
)

// postgresDSNEnv names the PostgreSQL server the tests use, as a URL whose
// user may create databases, e.g.
// postgres://postgres@127.0.0.1:5432/test?sslmode=disable.
const postgresDSNEnv = "TICKETING_TEST_POSTGRES_DSN"

// skippedNoDSN counts the tests skipped because postgresDSNEnv is not set.
var skippedNoDSN atomic.Int64

// testPostgres returns the URL of a new database of its own on the server
// named by postgresDSNEnv, dropped when the test ends. Without it the test
// is skipped, or fails when CI=true (so that CI cannot skip it silently).
func testPostgres(t *testing.T) string {
	t.Helper()
	base := strings.TrimSpace(os.Getenv(postgresDSNEnv))
	if base == "" {
		if os.Getenv("CI") == "true" {
			t.Fatalf("%s is not set (required when CI=true)", postgresDSNEnv)
		}
		skippedNoDSN.Add(1)
		t.Skipf("%s is not set: skipping (set it to a PostgreSQL URL whose user may create databases)", postgresDSNEnv)
	}
	u, err := url.Parse(base)
	if err != nil || (u.Scheme != "postgres" && u.Scheme != "postgresql") {
		t.Fatalf("%s must be a postgres:// URL", postgresDSNEnv)
	}
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	name := "ticketing_example_test_" + hex.EncodeToString(b)
	adminExec := func(query string) error {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		conn, err := pgx.Connect(ctx, base)
		if err != nil {
			return err
		}
		defer conn.Close(ctx)
		_, err = conn.Exec(ctx, query)
		return err
	}
	if err := adminExec("CREATE DATABASE " + name); err != nil {
		t.Fatalf("CREATE DATABASE %s: %v", name, err)
	}
	t.Cleanup(func() {
		if err := adminExec("DROP DATABASE IF EXISTS " + name + " WITH (FORCE)"); err != nil {
			t.Errorf("DROP DATABASE %s: %v", name, err)
		}
	})
	u.Path = "/" + name
	return u.String()
}

// testToken is the client token of tlsServer, of the form ticketingd init
// writes (base64url).
const testToken = "Zm9vYmFyLWV4YW1wbGUtY2xpZW50LXRva2VuLTQzY2g"

// tlsServer starts an in-process lock server set up as 'ticketingd init
// --tls' sets one up: TLS with a certificate from a private CA for
// localhost and 127.0.0.1, and a client token (testToken). It returns the
// server and the TICKETING_URL a client reaches it with:
// ticketing://TOKEN@127.0.0.1:PORT?ca=DIR/ca.pem.
func tlsServer(t *testing.T) (*servertest.Server, string) {
	t.Helper()
	caPEM, cert := testCertificates(t)
	caFile := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(caFile, caPEM, 0o644); err != nil {
		t.Fatal(err)
	}
	srv := servertest.Start(t, server.Config{
		TLS:          &tls.Config{Certificates: []tls.Certificate{cert}},
		ClientTokens: []string{testToken},
	})
	return srv, "ticketing://" + url.PathEscape(testToken) + "@" + srv.Addr() + "?ca=" + url.QueryEscape(caFile)
}

// testCertificates makes a private CA (returned as PEM) and a server
// certificate it signs for localhost and 127.0.0.1, valid for an hour.
func testCertificates(t *testing.T) (caPEM []byte, leaf tls.Certificate) {
	t.Helper()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	caTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "example test CA"},
		NotBefore: now.Add(-time.Minute), NotAfter: now.Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "localhost"},
		NotBefore: now.Add(-time.Minute), NotAfter: now.Add(time.Hour),
		DNSNames: []string{"localhost"}, IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)},
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, caTmpl, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}),
		tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

// refusedURLs starts a TLS server (as tlsServer) and returns TICKETING_URL
// values that it refuses for good, each with the broker error that the
// program given it must stop with: a wrong client token
// (broker.ErrUnauthorized), and a CA file of another deployment
// (broker.ErrCertificate).
func refusedURLs(t *testing.T) map[string]error {
	t.Helper()
	srv, good := tlsServer(t)
	_, other := tlsServer(t) // another CA's file: the certificate is not trusted
	ca, otherCA := good[strings.Index(good, "?"):], other[strings.Index(other, "?"):]
	return map[string]error{
		"ticketing://wrong@" + srv.Addr() + ca:                  broker.ErrUnauthorized,
		"ticketing://" + testToken + "@" + srv.Addr() + otherCA: broker.ErrCertificate,
	}
}

// laterServer returns an in-process lock server that is not running yet,
// for a server that comes up after its clients: its address is fixed
// (Addr), nothing listens there until srv.Restart(t) starts it, and the
// test's Cleanup shuts it down.
func laterServer(t *testing.T) *servertest.Server {
	t.Helper()
	srv := servertest.Start(t, server.Config{})
	srv.Close()
	return srv
}

// envOf is a getenv function over a map.
func envOf(vars map[string]string) func(string) string {
	return func(key string) string { return vars[key] }
}
