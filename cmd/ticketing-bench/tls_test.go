package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ticketing-dev/ticketing/internal/pki"
	"github.com/ticketing-dev/ticketing/server"
)

// testPKI is a CA, its PEM file, and helpers to issue certificates from it.
type testPKI struct {
	ca     *pki.CA
	caFile string
}

func newTestPKI(t *testing.T) *testPKI {
	t.Helper()
	ca, err := pki.NewCA("ticketing-bench test CA", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	f := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(f, ca.CertPEM(), 0o644); err != nil {
		t.Fatal(err)
	}
	return &testPKI{ca: ca, caFile: f}
}

// serverTLS is a server config presenting a certificate for hosts.
func (p *testPKI) serverTLS(t *testing.T, hosts ...string) *tls.Config {
	t.Helper()
	leaf, err := p.ca.Issue(pki.Server, hosts, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	return &tls.Config{Certificates: []tls.Certificate{leaf.TLSCertificate()}, MinVersion: tls.VersionTLS12}
}

// clientFiles writes a client certificate and its key; it returns their paths.
func (p *testPKI) clientFiles(t *testing.T) (cert, key string) {
	t.Helper()
	leaf, err := p.ca.Issue(pki.Client, []string{"ticketing-bench"}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	keyPEM, err := leaf.KeyPEM()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	cert, key = filepath.Join(dir, "client.pem"), filepath.Join(dir, "client-key.pem")
	if err := os.WriteFile(cert, leaf.CertPEM(), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(key, keyPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	return cert, key
}

func runCode(t *testing.T, args ...string) (int, string) {
	t.Helper()
	var out, errb bytes.Buffer
	code := run(t.Context(), args, &out, &errb)
	return code, errb.String()
}

// A TLS server (client token too, as a bundle of 'init' has) is driven
// with --tls-ca, one node or a cluster of them; the same server refuses
// the plain-TCP client, so the run was TLS.
func TestBenchTLS(t *testing.T) {
	p := newTestPKI(t)
	serving := startNode(t, server.Config{TLS: p.serverTLS(t, "127.0.0.1"), ClientTokens: []string{"tok"}})
	r := runJSON(t, "--addr", serving.addr(), "--token", "tok", "--tls-ca", p.caFile, "--duration", "300ms", "--warmup", "0", "--clients", "4")
	if !r.TLS || r.InProcess || r.Cycles == 0 || r.Addr != serving.addr() {
		t.Fatalf("result: %+v", r)
	}
	if st := serving.srv.Stats(); st.Grants < r.Cycles {
		t.Errorf("server stats %+v after %d cycles", st, r.Cycles)
	}

	// A cluster: the standby answers HELLO over TLS with its hint.
	standbyCfg := standby(serving.addr(), "tok")
	standbyCfg.TLS = p.serverTLS(t, "127.0.0.1")
	other := startNode(t, standbyCfg)
	var out, errb bytes.Buffer
	args := []string{"--addr", other.addr() + "," + serving.addr(), "--token", "tok", "--tls-ca", p.caFile,
		"--mode", "contended", "--duration", "300ms", "--warmup", "0", "--clients", "4", "--conns", "4"}
	if code := run(t.Context(), args, &out, &errb); code != 0 {
		t.Fatalf("cluster: exit %d: %s", code, errb.String())
	}
	if want := serving.addr() + " (the serving node of " + other.addr() + "," + serving.addr() + ") over TLS"; !strings.Contains(out.String(), want) {
		t.Errorf("output lacks %q:\n%s", want, out.String())
	}
	if n := other.ln.n.Load(); n != 1 {
		t.Errorf("the standby was dialled %d times, want 1", n)
	}

	// Without --tls-ca the client speaks plain TCP, which the server does not.
	code, stderr := runCode(t, "--addr", serving.addr(), "--token", "tok", "--duration", "100ms", "--warmup", "0", "--clients", "1")
	if code != 1 || !strings.Contains(stderr, "HELLO") {
		t.Errorf("plain client against the TLS server: exit %d: %s", code, stderr)
	}
}

// A CA that did not sign the server's certificate, or a name the
// certificate lacks, fails the handshake with a message that says so; with
// several addresses the search ends at once, however long --find-wait is.
func TestBenchTLSVerifyFails(t *testing.T) {
	p, wrong := newTestPKI(t), newTestPKI(t)
	a := startNode(t, func() server.Config {
		c := standby("", "tok")
		c.TLS = p.serverTLS(t, "127.0.0.1")
		return c
	}())
	b := startNode(t, server.Config{TLS: p.serverTLS(t, "127.0.0.1"), ClientTokens: []string{"tok"}})

	code, stderr := runCode(t, "--addr", b.addr(), "--token", "tok", "--tls-ca", wrong.caFile, "--duration", "100ms")
	if code != 1 || !strings.Contains(stderr, "TLS handshake") || !strings.Contains(stderr, "certificate signed by unknown authority") {
		t.Errorf("wrong CA: exit %d: %s", code, stderr)
	}
	before := b.ln.n.Load()
	code, stderr = runCode(t, "--addr", a.addr()+","+b.addr(), "--token", "tok", "--tls-ca", wrong.caFile, "--find-wait", "1m", "--duration", "100ms")
	if code != 1 || !strings.Contains(stderr, "connect to "+a.addr()) || !strings.Contains(stderr, "certificate signed by unknown authority") {
		t.Errorf("wrong CA, cluster: exit %d: %s", code, stderr)
	}
	if n := b.ln.n.Load() - before; n != 0 {
		t.Errorf("went on to the next node (%d connections) after the certificate failed", n)
	}

	named := startNode(t, server.Config{TLS: p.serverTLS(t, "ticketing.test"), ClientTokens: []string{"tok"}})
	code, stderr = runCode(t, "--addr", named.addr(), "--token", "tok", "--tls-ca", p.caFile, "--duration", "100ms")
	if code != 1 || !strings.Contains(stderr, "127.0.0.1") || !strings.Contains(stderr, "failed to verify certificate") {
		t.Errorf("name not in the certificate: exit %d: %s", code, stderr)
	}
	r := runJSON(t, "--addr", named.addr(), "--token", "tok", "--tls-ca", p.caFile, "--tls-server-name", "ticketing.test",
		"--duration", "100ms", "--warmup", "0", "--clients", "2")
	if !r.TLS || r.Cycles == 0 {
		t.Errorf("--tls-server-name: %+v", r)
	}
}

// A server that requires client certificates (serve --tls-client-ca)
// accepts --tls-cert/--tls-key, and refuses a client without one, which
// ends the search for the serving node at once.
func TestBenchTLSClientCert(t *testing.T) {
	p, clients := newTestPKI(t), newTestPKI(t)
	mtls := func(c server.Config) server.Config {
		c.TLS = p.serverTLS(t, "127.0.0.1")
		c.TLS.ClientCAs = clients.ca.Pool()
		c.TLS.ClientAuth = tls.RequireAndVerifyClientCert
		return c
	}
	serving := startNode(t, mtls(server.Config{ClientTokens: []string{"tok"}}))
	other := startNode(t, mtls(standby(serving.addr(), "tok")))
	cert, key := clients.clientFiles(t)
	r := runJSON(t, "--addr", other.addr()+","+serving.addr(), "--token", "tok", "--tls-ca", p.caFile, "--tls-cert", cert, "--tls-key", key,
		"--duration", "300ms", "--warmup", "0", "--clients", "4")
	if !r.TLS || r.Cycles == 0 || r.Addr != serving.addr() {
		t.Fatalf("result: %+v", r)
	}

	before := serving.ln.n.Load()
	code, stderr := runCode(t, "--addr", other.addr()+","+serving.addr(), "--token", "tok", "--tls-ca", p.caFile, "--find-wait", "1m", "--duration", "100ms")
	if code != 1 || !strings.Contains(stderr, "connect to "+other.addr()) || !strings.Contains(stderr, "certificate required") {
		t.Errorf("no client certificate: exit %d: %s", code, stderr)
	}
	if n := serving.ln.n.Load() - before; n != 0 {
		t.Errorf("went on to the next node (%d connections) after the TLS alert", n)
	}
}

// The --tls-* flags are checked, and their files read, before anything
// is dialled: each mistake is a usage error (exit 2) that names it.
func TestBenchTLSUsage(t *testing.T) {
	p := newTestPKI(t)
	n := startNode(t, server.Config{})
	cert, key := p.clientFiles(t)
	notPEM := filepath.Join(t.TempDir(), "not.pem")
	if err := os.WriteFile(notPEM, []byte("not a certificate\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	missing := filepath.Join(t.TempDir(), "missing.pem")
	addr := []string{"--addr", n.addr()}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{slices.Concat(addr, []string{"--tls-ca", p.caFile, "--tls-cert", cert}), "--tls-cert and --tls-key must be given together"},
		{slices.Concat(addr, []string{"--tls-ca", p.caFile, "--tls-key", key}), "--tls-cert and --tls-key must be given together"},
		{slices.Concat(addr, []string{"--tls-cert", cert, "--tls-key", key}), "--tls-cert needs --tls-ca"},
		{slices.Concat(addr, []string{"--tls-server-name", "x"}), "--tls-server-name needs --tls-ca"},
		{[]string{"--tls-ca", p.caFile}, "--tls-ca needs --addr"},
		{slices.Concat(addr, []string{"--tls-ca", missing}), "--tls-ca: open " + missing},
		{slices.Concat(addr, []string{"--tls-ca", notPEM}), "--tls-ca " + notPEM + ": no PEM certificates found"},
		{slices.Concat(addr, []string{"--tls-ca", p.caFile, "--tls-cert", notPEM, "--tls-key", key}), "--tls-cert " + notPEM},
		{slices.Concat(addr, []string{"--tls-ca", p.caFile, "--tls-cert", cert, "--tls-key", missing}), "--tls-key " + missing},
	} {
		var out, errb bytes.Buffer
		code := run(context.Background(), tc.args, &out, &errb)
		if code != 2 || !strings.Contains(errb.String(), tc.want) {
			t.Errorf("%v: exit %d, %q; want exit 2 and %q", tc.args, code, errb.String(), tc.want)
		}
	}
	if got := n.ln.n.Load(); got != 0 {
		t.Errorf("the server was dialled %d times", got)
	}

	var out, errb bytes.Buffer
	if code := run(context.Background(), []string{"--help"}, &out, &errb); code != 0 {
		t.Fatalf("--help: exit %d", code)
	}
	for _, f := range []string{"-tls-ca file", "-tls-server-name name", "-tls-cert file", "-tls-key file"} {
		if !strings.Contains(errb.String(), f) {
			t.Errorf("--help lacks %q:\n%s", f, errb.String())
		}
	}
}
