package main

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ticketing-dev/ticketing/internal/pki"
	"github.com/ticketing-dev/ticketing/internal/wire"
	"github.com/ticketing-dev/ticketing/server"
)

func httpGet(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func TestServeEndToEnd(t *testing.T) {
	const secret = "s3cret-token-value"
	tokensFile := writeTemp(t, "tokens", "# tokens\n"+secret+"\n", 0o644) // loose on purpose
	dataDir := filepath.Join(t.TempDir(), "data")
	p := startInProc(t, "serve", "--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0", "--data-dir", dataDir,
		"--client-tokens-file", tokensFile, "--node-name", "node-one", "--log-format", "json", "--log-level", "debug")
	addr := p.stderr.waitJSON(t, "listening", p.done)["addr"].(string)
	admin := "http://" + p.stderr.waitJSON(t, "admin listening", p.done)["addr"].(string)
	if w := p.stderr.waitJSON(t, "client tokens file is readable by group or others; chmod 600 it", p.done); w["path"] != tokensFile {
		t.Errorf("warning record %v", w)
	}

	// Wrong token: E(3).
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	_, r, err := dialRaw(conn, "wrong")
	conn.Close()
	if err != nil || r.Type != wire.TypeError || r.Code != wire.CodeUnauthorized {
		t.Fatalf("wrong token: %q code %d err %v", r.Type, r.Code, err)
	}

	conn, err = net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	cl, r, err := dialRaw(conn, secret)
	if err != nil || r.Type != wire.TypeHelloOK || string(r.Node) != "node-one" {
		t.Fatalf("HELLO: %q node %q err %v", r.Type, r.Node, err)
	}
	g, err := cl.acquire("orders/42", 0, 30)
	if err != nil || g.Type != wire.TypeGranted {
		t.Fatalf("acquire: %q %v", g.Type, err)
	}

	if code, body := httpGet(t, admin+"/healthz"); code != 200 || strings.TrimSpace(body) != "ok" {
		t.Errorf("/healthz: %d %q", code, body)
	}
	code, body := httpGet(t, admin+"/status")
	var st server.Stats
	if err := json.Unmarshal([]byte(body), &st); code != 200 || err != nil {
		t.Fatalf("/status: %d %v %s", code, err, body)
	}
	if st.HeldLocks != 1 || st.Sessions != 1 || st.LastToken < g.Token || st.Grants != 1 {
		t.Errorf("/status: %+v", st)
	}
	code, body = httpGet(t, admin+"/metrics")
	for _, m := range []string{"ticketing_held_locks 1", "ticketing_sessions 1", "go_goroutines", "process_resident_memory_bytes"} {
		if code != 200 || !strings.Contains(body, m) {
			t.Errorf("/metrics lacks %q", m)
		}
	}

	if r, err := cl.release("orders/42", g.Token); err != nil || r.Type != wire.TypeReleased {
		t.Fatalf("release: %q %v", r.Type, err)
	}

	// Cancelling run's context is what SIGTERM does: the open session is
	// told E(5) and run returns 0.
	p.cancel()
	body2, err := cl.fr.Next()
	var e wire.Response
	if err == nil {
		err = wire.DecodeResponse(body2, &e)
	}
	if err != nil || e.Type != wire.TypeError || e.Code != wire.CodeShuttingDown {
		t.Errorf("on shutdown the session got %q code %d, err %v", e.Type, e.Code, err)
	}
	if code := p.stop(); code != 0 {
		t.Fatalf("exit %d\n%s", code, p.stderr.String())
	}
	logs := p.stderr.String()
	if !strings.Contains(logs, `"msg":"stopped"`) {
		t.Errorf("no stopped line:\n%s", logs)
	}
	if strings.Contains(logs, secret) {
		t.Errorf("the client token was logged:\n%s", logs)
	}
}

// TestServeTLSFromInit: the deployment 'init --tls' writes serves TLS with
// the token, and with --tls-client-ca requires a client certificate.
func TestServeTLSFromInit(t *testing.T) {
	dir := t.TempDir()
	if code, _, stderr := runCapture(t, "init", "--dir", dir, "--tls"); code != 0 {
		t.Fatalf("init: %s", stderr)
	}
	tokens, _, err := readTokensFile(filepath.Join(dir, initTokensFile))
	if err != nil {
		t.Fatal(err)
	}
	caPEM, err := os.ReadFile(filepath.Join(dir, initCACert))
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(caPEM)
	clientCert := makeClientCert(t, dir)

	p := startInProc(t, "serve", "--config", filepath.Join(dir, initConfigFile), "--listen", "127.0.0.1:0",
		"--log-format", "json", "--tls-client-ca", filepath.Join(dir, initCACert))
	addr := p.stderr.waitJSON(t, "listening", p.done)["addr"].(string)

	hello := func(conf *tls.Config) (wire.Response, error) {
		conn, err := tls.Dial("tcp", addr, conf)
		if err != nil {
			return wire.Response{}, err
		}
		defer conn.Close()
		_, r, err := dialRaw(conn, tokens[0])
		return r, err
	}
	r, err := hello(&tls.Config{RootCAs: pool, Certificates: []tls.Certificate{clientCert}})
	if err != nil || r.Type != wire.TypeHelloOK {
		t.Fatalf("TLS HELLO with client cert: %q %v", r.Type, err)
	}
	if r, err := hello(&tls.Config{RootCAs: pool}); err == nil && r.Type == wire.TypeHelloOK {
		t.Fatal("HELLO without a client certificate was accepted")
	}
	if code := p.stop(); code != 0 {
		t.Fatalf("exit %d", code)
	}
}

// makeClientCert signs a client certificate with the CA that init wrote.
func makeClientCert(t *testing.T, dir string) tls.Certificate {
	t.Helper()
	certPEM, err := os.ReadFile(filepath.Join(dir, initCACert))
	if err != nil {
		t.Fatal(err)
	}
	keyPEM, err := os.ReadFile(filepath.Join(dir, initCAKey))
	if err != nil {
		t.Fatal(err)
	}
	ca, err := pki.LoadCA(certPEM, keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	c, err := ca.Issue(pki.Client, []string{"client"}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	return c.TLSCertificate()
}

func TestServeStandby(t *testing.T) {
	p := startInProc(t, "serve", "--listen", "127.0.0.1:0", "--data-dir", t.TempDir(), "--log-format", "json",
		"--standby", "--standby-hint", "active.example:5225")
	addr := p.stderr.waitJSON(t, "listening", p.done)["addr"].(string)
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_, r, err := dialRaw(conn, "")
	if err != nil || r.Type != wire.TypeNotActive || string(r.Hint) != "active.example:5225" {
		t.Fatalf("standby HELLO: %q hint %q err %v", r.Type, r.Hint, err)
	}
}

func TestServeListenError(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	code, _, stderr := runCapture(t, "serve", "--listen", ln.Addr().String(), "--data-dir", t.TempDir())
	if code != 1 || !strings.Contains(stderr, "--listen") || !strings.Contains(stderr, ln.Addr().String()) {
		t.Errorf("exit %d: %s", code, stderr)
	}
}

// TestServeSIGTERM runs the real binary: SIGTERM shuts it down gracefully
// with exit 0, and a second server on the same data dir continues the
// tokens above the first one's.
func TestServeSIGTERM(t *testing.T) {
	bin := buildBinary(t)
	dataDir := t.TempDir()
	var last uint64
	for i := range 2 {
		sp := startBinary(t, bin, "serve", "--listen", "127.0.0.1:0", "--data-dir", dataDir, "--log-format", "json",
			"--admin-listen", "127.0.0.1:0", "--shutdown-timeout", "5s")
		addr := sp.addr(t)
		conn, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		cl, _, err := dialRaw(conn, "")
		if err != nil {
			t.Fatal(err)
		}
		g, err := cl.acquire("k", 0, 10)
		if err != nil || g.Type != wire.TypeGranted {
			t.Fatalf("acquire: %q %v", g.Type, err)
		}
		if g.Token <= last {
			t.Fatalf("run %d: token %d not above %d", i, g.Token, last)
		}
		last = g.Token
		if err := sp.cmd.Process.Signal(syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		if code := sp.exitCode(); code != 0 {
			t.Fatalf("exit %d after SIGTERM\n%s", code, sp.stderr.String())
		}
		conn.Close()
		for _, msg := range []string{`"msg":"shutting down"`, `"msg":"stopped"`} {
			if !strings.Contains(sp.stderr.String(), msg) {
				t.Errorf("no %s line:\n%s", msg, sp.stderr.String())
			}
		}
	}
}
