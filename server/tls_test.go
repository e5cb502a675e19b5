package server_test

import (
	"crypto/tls"
	"crypto/x509"
	"testing"
	"time"

	"github.com/ticketing-dev/ticketing/internal/pki"
	"github.com/ticketing-dev/ticketing/internal/wire"
	"github.com/ticketing-dev/ticketing/server"
)

// testServerCert returns a server certificate for 127.0.0.1 and a pool holding
// the private CA that signed it.
func testServerCert(t *testing.T) (tls.Certificate, *x509.CertPool) {
	ca, err := pki.NewCA("ticketing test CA", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := ca.Issue(pki.Server, []string{"127.0.0.1"}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	return leaf.TLSCertificate(), ca.Pool()
}

func TestTLSSession(t *testing.T) {
	cert, pool := testServerCert(t)
	_, addr := startServer(t, server.Config{TLS: &tls.Config{Certificates: []tls.Certificate{cert}}, ClientTokens: []string{"tok"}})
	c := dialTLS(t, addr, &tls.Config{RootCAs: pool, ServerName: "127.0.0.1"})
	c.hello("tok")
	tok := c.acquireOK(2, owner(1), 0, 30, "k")
	c.send(ping(3))
	c.expect(wire.TypePong, 3)
	c.send(rel(4, tok, "k"))
	c.expect(wire.TypeReleased, 4)
	c.send(acq(5, owner(1), 0, 0, "k"))
	c.expectError(wire.CodeInvalidArg, 5)
}

// TestTLSHandshakeCountsAgainstHelloTimeout: a plain-TCP peer that never
// completes the handshake is dropped within the HELLO timeout.
func TestTLSHandshakeCountsAgainstHelloTimeout(t *testing.T) {
	cert, _ := testServerCert(t)
	_, addr := startServer(t, server.Config{TLS: &tls.Config{Certificates: []tls.Certificate{cert}}, HelloTimeout: 200 * time.Millisecond})
	c := dial(t, addr)
	start := time.Now()
	c.nc.SetReadDeadline(time.Now().Add(5 * time.Second))
	buf := make([]byte, 10)
	if _, err := c.nc.Read(buf); err == nil {
		t.Log("server sent something on a plain conn")
	}
	if el := time.Since(start); el > 3*time.Second {
		t.Fatalf("not closed after %v", el)
	}
}

func TestTLSPlainClientRejected(t *testing.T) {
	cert, _ := testServerCert(t)
	_, addr := startServer(t, server.Config{TLS: &tls.Config{Certificates: []tls.Certificate{cert}}})
	c := dial(t, addr)
	c.send(helloReq(1, ""))
	if r, err := c.recvErr(3 * time.Second); err == nil && r.Type == wire.TypeHelloOK {
		t.Fatal("plain HELLO accepted by a TLS server")
	}
}
