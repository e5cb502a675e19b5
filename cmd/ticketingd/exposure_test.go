package main

import (
	"bufio"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestAdminIdleKeepAliveClosed: the admin server closes a keep-alive
// connection left idle after a request, and refuses oversized headers.
func TestAdminIdleKeepAliveClosed(t *testing.T) {
	p := startInProc(t, "serve", "--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0", "--data-dir", t.TempDir(), "--log-format", "json")
	admin := p.stderr.waitJSON(t, "admin listening", p.done)["addr"].(string)

	c, err := net.Dial("tcp", admin)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	br := bufio.NewReader(c)
	io.WriteString(c, "GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || resp.Close {
		t.Fatalf("status %d, close %v; want 200 on a kept-alive connection", resp.StatusCode, resp.Close)
	}
	// Now idle: the server must close it (the guard is generous).
	start := time.Now()
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := br.ReadByte(); !errors.Is(err, io.EOF) {
		t.Fatalf("idle keep-alive connection: %v after %v, want closed by the server", err, time.Since(start))
	}
	t.Logf("idle keep-alive connection closed after %v", time.Since(start))

	req, _ := http.NewRequest("GET", "http://"+admin+"/healthz", nil)
	req.Header.Set("X-Big", strings.Repeat("a", 64<<10))
	resp, err = http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusRequestHeaderFieldsTooLarge {
		t.Fatalf("64 KiB header: status %d, want 431", resp.StatusCode)
	}
}

// TestServeTLSOnlyAEADSuites: the lock port's TLS refuses TLS 1.1 and, for
// TLS 1.2, anything but ECDHE with an AEAD cipher.
func TestServeTLSOnlyAEADSuites(t *testing.T) {
	dir := t.TempDir()
	if code, _, stderr := runCapture(t, "init", "--dir", dir, "--tls"); code != 0 {
		t.Fatalf("init: %s", stderr)
	}
	caPEM, err := os.ReadFile(filepath.Join(dir, initCACert))
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(caPEM)
	p := startInProc(t, "serve", "--config", filepath.Join(dir, initConfigFile), "--listen", "127.0.0.1:0", "--log-format", "json")
	addr := p.stderr.waitJSON(t, "listening", p.done)["addr"].(string)

	handshake := func(conf *tls.Config) error {
		conf.RootCAs = pool
		conn, err := tls.Dial("tcp", addr, conf)
		if err != nil {
			return err
		}
		return conn.Close()
	}
	cbc := []uint16{
		tls.TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA, tls.TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA,
		tls.TLS_ECDHE_ECDSA_WITH_AES_256_CBC_SHA, tls.TLS_ECDHE_RSA_WITH_AES_256_CBC_SHA,
		tls.TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA256, tls.TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA256,
		tls.TLS_RSA_WITH_AES_128_GCM_SHA256, tls.TLS_RSA_WITH_AES_128_CBC_SHA,
	}
	if err := handshake(&tls.Config{MaxVersion: tls.VersionTLS12, CipherSuites: cbc}); err == nil {
		t.Error("a TLS 1.2 client offering only CBC and RSA-key-exchange suites was accepted")
	}
	if err := handshake(&tls.Config{MinVersion: tls.VersionTLS10, MaxVersion: tls.VersionTLS11}); err == nil {
		t.Error("a TLS 1.1 client was accepted")
	}
	for _, suite := range aeadSuites {
		if err := handshake(&tls.Config{MaxVersion: tls.VersionTLS12, CipherSuites: []uint16{suite}}); err != nil &&
			!strings.Contains(err.Error(), "handshake failure") {
			t.Errorf("TLS 1.2 with %s: %v", tls.CipherSuiteName(suite), err)
		}
	}
	if err := handshake(&tls.Config{MaxVersion: tls.VersionTLS12, CipherSuites: []uint16{tls.TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256, tls.TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256}}); err != nil {
		t.Errorf("TLS 1.2 with AES-GCM: %v", err)
	}
	if err := handshake(&tls.Config{MinVersion: tls.VersionTLS13}); err != nil {
		t.Errorf("TLS 1.3: %v", err)
	}
}

// TestServeWarnsWhenExposed: listening on a non-loopback address without
// client tokens or without TLS logs a warning for each; on loopback it does
// not.
func TestServeWarnsWhenExposed(t *testing.T) {
	const noTokens = "listening on a non-loopback address without client tokens: anyone who can reach it can take and release locks; set --client-tokens-file"
	const noTLS = "listening on a non-loopback address without TLS: client tokens and lock traffic cross the network in clear; set --tls-cert and --tls-key"
	const adminOpen = "admin listening on a non-loopback address: /metrics and /status have no authentication; set --admin-token, restrict it with a firewall or listen on 127.0.0.1"

	p := startInProc(t, "serve", "--listen", "0.0.0.0:0", "--admin-listen", "0.0.0.0:0", "--data-dir", t.TempDir(), "--log-format", "json")
	for _, msg := range []string{noTokens, noTLS, adminOpen} {
		if rec := p.stderr.waitJSON(t, msg, p.done); rec["level"] != "WARN" {
			t.Errorf("%q logged as %v", msg, rec["level"])
		}
	}
	p.stderr.waitJSON(t, "listening", p.done)

	q := startInProc(t, "serve", "--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0", "--data-dir", t.TempDir(), "--log-format", "json")
	q.stderr.waitJSON(t, "listening", q.done)
	if out := q.stderr.String(); strings.Contains(out, "non-loopback") {
		t.Errorf("loopback server warned:\n%s", out)
	}

	// With --admin-token the admin port is authenticated: no warning.
	r := startInProc(t, "serve", "--listen", "127.0.0.1:0", "--admin-listen", "0.0.0.0:0", "--admin-token", "t", "--data-dir", t.TempDir(), "--log-format", "json")
	r.stderr.waitJSON(t, "listening", r.done)
	if out := r.stderr.String(); strings.Contains(out, "non-loopback") {
		t.Errorf("admin listener with a token warned:\n%s", out)
	}
}

// TestServePortInUseLeavesDataDir runs the binary: a port in use (lock or
// admin) is exit 1 with an error naming the flag and the address, and the
// data dir is left as it was: not created if missing, not written if
// empty or used.
func TestServePortInUseLeavesDataDir(t *testing.T) {
	bin := buildBinary(t)
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()

	// A used data dir, as a clean shutdown leaves it.
	used := filepath.Join(t.TempDir(), "used")
	{
		p := startInProc(t, "serve", "--listen", "127.0.0.1:0", "--data-dir", used, "--log-format", "json")
		p.stderr.waitJSON(t, "listening", p.done)
		if code := p.stop(); code != 0 {
			t.Fatalf("first start: exit %d", code)
		}
	}
	snapshot := func(dir string) map[string]string {
		m := map[string]string{}
		entries, err := os.ReadDir(dir)
		if err != nil {
			m["<error>"] = err.Error()
			return m
		}
		for _, e := range entries {
			b, _ := os.ReadFile(filepath.Join(dir, e.Name()))
			m[e.Name()] = string(b)
		}
		return m
	}
	for _, tc := range []struct {
		name, flag string
		args       []string
	}{
		{"lock port", "--listen", []string{"--listen", busy.Addr().String()}},
		{"admin port", "--admin-listen", []string{"--listen", "127.0.0.1:0", "--admin-listen", busy.Addr().String()}},
	} {
		for _, dd := range []string{"missing", "empty", "used"} {
			t.Run(tc.name+"/"+dd, func(t *testing.T) {
				var dir string
				switch dd {
				case "missing":
					dir = filepath.Join(t.TempDir(), "data")
				case "empty":
					dir = t.TempDir()
				case "used":
					dir = used
				}
				before := snapshot(dir)
				sp := startBinary(t, bin, append([]string{"serve", "--data-dir", dir, "--log-format", "json"}, tc.args...)...)
				if code := sp.exitCode(); code != 1 {
					t.Fatalf("exit %d, want 1; stderr:\n%s", code, sp.stderr.String())
				}
				out := sp.stderr.String()
				if !strings.Contains(out, "ticketingd: "+tc.flag+": ") || !strings.Contains(out, busy.Addr().String()) || !strings.Contains(out, "address already in use") {
					t.Errorf("error does not name the flag, address and cause:\n%s", out)
				}
				if dd == "missing" {
					if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
						t.Fatalf("data dir created by a failed start: %v", err)
					}
					return
				}
				if after := snapshot(dir); !equalMaps(before, after) {
					t.Fatalf("data dir changed by a failed start:\nbefore %q\nafter  %q", before, after)
				}
			})
		}
	}
}

func equalMaps(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}
