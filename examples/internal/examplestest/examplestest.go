// Package examplestest has the lock servers and helpers that the examples'
// tests share.
package examplestest

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ticketing-dev/ticketing/broker"
	"github.com/ticketing-dev/ticketing/internal/pki"
	"github.com/ticketing-dev/ticketing/server"
	"github.com/ticketing-dev/ticketing/server/servertest"
)

// Token is the client token of TLSServer, of the form ticketingd init
// writes (base64url).
const Token = "Zm9vYmFyLWV4YW1wbGUtY2xpZW50LXRva2VuLTQzY2g"

// TLSServer starts an in-process lock server set up as 'ticketingd init
// --tls' sets one up: TLS with a certificate from a private CA for
// localhost and 127.0.0.1, and a client token (Token). It returns the
// server and the TICKETING_URL a client reaches it with:
// ticketing://TOKEN@127.0.0.1:PORT?ca=DIR/ca.pem.
func TLSServer(t *testing.T) (*servertest.Server, string) {
	t.Helper()
	ca, err := pki.NewCA("examples test CA", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := ca.Issue(pki.Server, []string{"localhost", "127.0.0.1"}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	caFile := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(caFile, ca.CertPEM(), 0o644); err != nil {
		t.Fatal(err)
	}
	srv := servertest.Start(t, server.Config{
		TLS:          &tls.Config{Certificates: []tls.Certificate{leaf.TLSCertificate()}},
		ClientTokens: []string{Token},
	})
	u := "ticketing://" + url.PathEscape(Token) + "@" + srv.Addr() + "?ca=" + url.QueryEscape(caFile)
	return srv, u
}

// RefusedURLs starts a TLS server (as TLSServer) and returns TICKETING_URL
// values that it refuses for good, each with the broker error that a
// program given it must stop with: a wrong client token
// (broker.ErrUnauthorized), and a CA file of another deployment
// (broker.ErrCertificate).
func RefusedURLs(t *testing.T) map[string]error {
	t.Helper()
	srv, good := TLSServer(t)
	_, other := TLSServer(t) // another CA's file: the certificate is not trusted
	ca, otherCA := good[strings.Index(good, "?"):], other[strings.Index(other, "?"):]
	return map[string]error{
		"ticketing://wrong@" + srv.Addr() + ca:              broker.ErrUnauthorized,
		"ticketing://" + Token + "@" + srv.Addr() + otherCA: broker.ErrCertificate,
	}
}

// FreeAddr returns a loopback address on which nothing listens (for now).
func FreeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	if err := ln.Close(); err != nil {
		t.Fatal(err)
	}
	return addr
}

// ServeOn starts a plain lock server on addr (from FreeAddr), for a server
// that comes up after its clients; the test's Cleanup shuts it down.
func ServeOn(t *testing.T, addr string) {
	t.Helper()
	srv, err := server.New(server.Config{DataDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := srv.Shutdown(ctx); err != nil {
			t.Error(err)
		}
		if err := <-served; !errors.Is(err, server.ErrServerClosed) {
			t.Error(err)
		}
	})
}

// Env is a getenv function over a map.
func Env(vars map[string]string) func(string) string {
	return func(key string) string { return vars[key] }
}

// Buffer is a bytes.Buffer safe for concurrent use: a log destination.
type Buffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

// Write implements io.Writer.
func (b *Buffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

// String returns what was written so far.
func (b *Buffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
