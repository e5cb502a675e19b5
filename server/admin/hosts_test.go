package admin

import (
	"bufio"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ticketing-dev/ticketing/server"
)

// TestForeignHost: without a token, every route of the admin handler
// answers 403 to a Host that is not a name of the server (a page that
// rebinds its DNS name to the server's address), over a real socket;
// IP addresses (a Prometheus scrape or a probe by address, behind NAT
// too), localhost and the allowed names are served; with a token the Host
// is not checked.
func TestForeignHost(t *testing.T) {
	reg := prometheus.NewRegistry()
	srv, _ := startServer(t, server.Config{DataDir: t.TempDir(), Registerer: reg})
	base := Options{Gatherer: reg, Registerer: reg, AllowedHosts: []string{"ops.example", "*.corp.example", "Node1.Example."}}
	addr := serveHandler(t, New(srv, base))

	paths := []string{"/healthz", "/status", "/metrics", "/", "/v1/overview", "/v1/locks", "/nowhere"}
	for _, host := range []string{"evil.example", "evil.example:9225", "127.0.0.1.nip.io:9225", "ops.example.evil.example", "corp.example", "localhost.evil.example"} {
		for _, path := range paths {
			code, body := rawGet(t, addr, host, path)
			var e ErrorResponse
			if code != http.StatusForbidden || json.Unmarshal([]byte(body), &e) != nil || !strings.Contains(e.Error, "is not a name of this server") {
				t.Errorf("GET %s with Host %q: %d %s; want 403 with an ErrorResponse", path, host, code, body)
			}
		}
	}
	_, port, _ := net.SplitHostPort(addr)
	for _, host := range []string{addr, "localhost:" + port, "LOCALHOST.", "[::1]:" + port, "192.0.2.7:9225", "[2001:db8::7]:9225",
		"ops.example", "OPS.example:80", "a.corp.example", "node1.example:9225", ""} {
		for _, path := range []string{"/healthz", "/status", "/metrics"} {
			if code, body := rawGet(t, addr, host, path); code != http.StatusOK {
				t.Errorf("GET %s with Host %q: %d %s; want 200", path, host, code, body)
			}
		}
	}
	// The console keeps its own, stricter rule: loopback names only.
	if code, _ := rawGet(t, addr, "ops.example", "/v1/overview"); code != http.StatusForbidden {
		t.Errorf("console with an allowed name that is not loopback: %d, want 403", code)
	}

	// "*" allows every name.
	anyAddr := serveHandler(t, New(srv, Options{Gatherer: reg, AllowedHosts: []string{"*"}}))
	if code, body := rawGet(t, anyAddr, "evil.example", "/status"); code != http.StatusOK {
		t.Errorf(`AllowedHosts "*": %d %s; want 200`, code, body)
	}

	// With a token the Host is not checked: a rebinding page has no token.
	tokenAddr := serveHandler(t, New(srv, Options{Gatherer: reg, Token: "s3cret"}))
	if code, body := rawGet(t, tokenAddr, "evil.example", "/healthz"); code != http.StatusOK {
		t.Errorf("token, foreign Host, /healthz: %d %s; want 200", code, body)
	}
	if code, _ := rawGet(t, tokenAddr, "evil.example", "/status"); code != http.StatusUnauthorized {
		t.Errorf("token, foreign Host, /status without the token: %d; want 401", code)
	}
}

// serveHandler serves h on a real socket until the test ends and returns
// its address.
func serveHandler(t *testing.T, h http.Handler) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	hs := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = hs.Serve(ln)
	}()
	t.Cleanup(func() {
		hs.Close()
		<-done
	})
	return ln.Addr().String()
}

// rawGet sends GET path with the Host header host ("": an HTTP/1.0
// request without one) and returns the status code and body.
func rawGet(t *testing.T, addr, host, path string) (int, string) {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(30 * time.Second))
	req := "GET " + path + " HTTP/1.0\r\n\r\n"
	if host != "" {
		req = "GET " + path + " HTTP/1.1\r\nHost: " + host + "\r\nConnection: close\r\n\r\n"
	}
	if _, err := io.WriteString(c, req); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("GET %s with Host %q: %v", path, host, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}
