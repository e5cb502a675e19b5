package main

import (
	"bufio"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
)

// TestAdminSlowHeaderClosed: a client that sends part of a request header
// and then nothing (slowloris) is disconnected after the admin server's
// ReadHeaderTimeout (adminReadHeaderTimeout, 5 s), well before its
// ReadTimeout (10 s), which would otherwise also bound the header. The
// timeout is a constant of serve.go, so this test takes about 5 s; it runs
// in parallel with the rest of the package.
func TestAdminSlowHeaderClosed(t *testing.T) {
	t.Parallel()
	c, start := sendAdminStart(t, "GET /healthz HTTP/1.1\r\nHost: admin\r\nX-Slow: ")
	// Our deadline lies between the header timeout and the read timeout:
	// a server with only ReadTimeout (or none) keeps the connection past it.
	expectClosedBy(t, c, "partial header", start, adminReadHeaderTimeout, adminReadHeaderTimeout+(adminReadTimeout-adminReadHeaderTimeout)*3/4)
}

// sendAdminStart starts a server with an admin listener, connects to it
// and sends the start of a request; it returns the connection and when it
// connected.
func sendAdminStart(t *testing.T, req string) (net.Conn, time.Time) {
	t.Helper()
	s := startConf(t, withAdmin)
	c, err := net.Dial("tcp", strings.TrimPrefix(s.admin, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	start := time.Now()
	if _, err := io.WriteString(c, req); err != nil {
		t.Fatal(err)
	}
	return c, start
}

// expectClosedBy reads c until the server closes it, and fails if it is
// still open at start+guard; want is the timeout expected to close it.
func expectClosedBy(t *testing.T, c net.Conn, what string, start time.Time, want, guard time.Duration) {
	t.Helper()
	c.SetReadDeadline(start.Add(guard))
	b, err := io.ReadAll(c)
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		t.Fatalf("%s: connection still open after %v (read %q), want closed after about %v", what, time.Since(start), b, want)
	}
	t.Logf("%s: connection closed after %v (err %v, read %q)", what, time.Since(start).Round(time.Millisecond), err, b)
}

// TestAdminHeaderCap: request headers over the admin server's cap
// (adminMaxHeaderBytes, 16 KiB, plus the 4 KiB net/http adds as slack) get
// 431; a header well under it is served. net/http's own default is 1 MiB.
func TestAdminHeaderCap(t *testing.T) {
	t.Parallel()
	s := startConf(t, withAdmin)
	tr := &http.Transport{DisableKeepAlives: true}
	defer tr.CloseIdleConnections()
	cl := &http.Client{Transport: tr, Timeout: 10 * time.Second}
	get := func(n int) int {
		t.Helper()
		req, _ := http.NewRequest("GET", s.admin+"/healthz", nil)
		req.Header.Set("X-Big", strings.Repeat("a", n))
		resp, err := cl.Do(req)
		if err != nil {
			t.Fatalf("%d-byte header: %v", n, err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode
	}
	if got := get(adminMaxHeaderBytes / 2); got != http.StatusOK {
		t.Errorf("%d-byte header: status %d, want 200", adminMaxHeaderBytes/2, got)
	}
	big := adminMaxHeaderBytes + 8<<10 // past the cap and net/http's 4 KiB slack
	if got := get(big); got != http.StatusRequestHeaderFieldsTooLarge {
		t.Errorf("%d-byte header: status %d, want 431", big, got)
	}
}

// TestAdminSlowBodyClosed: a client that sends a request header at once and
// then its body a byte at a time (a slow POST) is disconnected after the
// admin server's ReadTimeout (adminReadTimeout, 10 s), which bounds the
// whole request: neither the header timeout (the header is complete) nor
// the idle timeout (a request is in progress) applies to it, and the
// WriteTimeout (30 s) comes much later. About 10 s, in parallel with the
// rest of the package.
func TestAdminSlowBodyClosed(t *testing.T) {
	t.Parallel()
	c, start := sendAdminStart(t, "POST /status HTTP/1.1\r\nHost: admin\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{")
	stop := make(chan struct{})
	trickled := make(chan struct{})
	go func() {
		defer close(trickled)
		for {
			select {
			case <-stop:
				return
			case <-time.After(250 * time.Millisecond):
			}
			if _, err := c.Write([]byte(" ")); err != nil {
				return
			}
		}
	}()
	defer func() { close(stop); <-trickled }()
	// Our deadline lies between the read timeout and the write timeout: a
	// server without ReadTimeout keeps reading the trickle past it.
	expectClosedBy(t, c, "slow body", start, adminReadTimeout, adminReadTimeout+(adminWriteTimeout-adminReadTimeout)/2)
}

// TestAdminConnCaps: over real sockets to a real ticketingd, clients that
// open admin connections and trickle their request headers hold at most
// --admin-max-conns-per-source connections from one address and
// --admin-max-conns over all (further ones are closed at accept,
// unanswered), never the slots of 127.0.0.1; the lock port grants and
// /healthz answers from loopback meanwhile; the trickling connections
// are closed at --admin-header-timeout, and their slots serve again.
// Strangers connect from 127.0.0.2 to 127.0.0.4 (Linux routes all of
// 127.0.0.0/8 to the loopback interface).
func TestAdminConnCaps(t *testing.T) {
	t.Parallel()
	// The header timeout is long against the few steps between the
	// trickling connections' start and the checks that need them open.
	const headerTimeout = 15 * time.Second
	s := startConf(t, withAdmin, "--admin-max-conns=4", "--admin-max-conns-per-source=2",
		"--admin-header-timeout="+headerTimeout.String())
	addr := strings.TrimPrefix(s.admin, "http://")
	dialFrom := func(src string) net.Conn {
		t.Helper()
		d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}, Timeout: 10 * time.Second}
		c, err := d.Dial("tcp", addr)
		if err != nil {
			t.Fatalf("dial from %s: %v", src, err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	trickle := func(src string) net.Conn {
		t.Helper()
		c := dialFrom(src)
		if _, err := io.WriteString(c, "GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: "); err != nil {
			t.Fatal(err)
		}
		return c
	}
	// get sends a whole request on a new connection from src and returns
	// the answer's status line, or "" if the connection closed unanswered.
	get := func(src, path string) string {
		t.Helper()
		c := dialFrom(src)
		c.SetDeadline(time.Now().Add(30 * time.Second))
		if _, err := io.WriteString(c, "GET "+path+" HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"); err != nil {
			return "" // reset by the server already
		}
		line, err := bufio.NewReader(c).ReadString('\n')
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			t.Fatalf("GET %s from %s: no answer and not closed: %v", path, src, err)
		}
		return strings.TrimSpace(line)
	}
	const ok = "HTTP/1.1 200 OK"

	// Connections are accepted in the order they were made, so each check
	// runs after the connections before it hold their slots.
	var held []net.Conn
	held = append(held, trickle("127.0.0.2"), trickle("127.0.0.2"))
	if got := get("127.0.0.2", "/healthz"); got != "" {
		t.Fatalf("a third connection from 127.0.0.2 (per-source limit 2): answered %q, want closed unanswered", got)
	}
	held = append(held, trickle("127.0.0.3"), trickle("127.0.0.3"))
	if got := get("127.0.0.4", "/healthz"); got != "" {
		t.Fatalf("a connection beyond --admin-max-conns from 127.0.0.4: answered %q, want closed unanswered", got)
	}

	// Loopback and the lock port are served meanwhile.
	if got := get("127.0.0.1", "/healthz"); got != ok {
		t.Fatalf("/healthz from 127.0.0.1 with the strangers' slots full: %q, want %q", got, ok)
	}
	if got := get("127.0.0.1", "/status"); got != ok {
		t.Fatalf("/status from 127.0.0.1 with the strangers' slots full: %q, want %q", got, ok)
	}
	r := openConf(t, s.addr)
	r.send(acqF(t, 2, 1, 0, 10, "k"))
	r.expectG(2)

	// The trickling connections are closed at the header timeout (the
	// guard is generous: the point is that they close at all).
	for i, c := range held {
		c.SetReadDeadline(time.Now().Add(headerTimeout + time.Minute))
		if _, err := io.ReadAll(c); err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				t.Fatalf("trickling connection %d still open long after the header timeout", i)
			}
		}
		c.Close()
	}
	// Their slots are free again.
	deadline := time.Now().Add(30 * time.Second)
	for got := get("127.0.0.2", "/healthz"); got != ok; got = get("127.0.0.2", "/healthz") {
		if time.Now().After(deadline) {
			t.Fatalf("/healthz from 127.0.0.2 after the trickling connections closed: %q, want %q", got, ok)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestAdminForeignHost: ticketingd's admin listener without --admin-token
// answers 403 to every path for a Host it does not know (DNS rebinding),
// and serves its IP address (a scrape by address), localhost and the names
// of --admin-allowed-host.
func TestAdminForeignHost(t *testing.T) {
	t.Parallel()
	s := startConf(t, withAdmin, "--admin-allowed-host=ops.example")
	addr := strings.TrimPrefix(s.admin, "http://")
	get := func(host, path string) int {
		t.Helper()
		req, _ := http.NewRequest("GET", s.admin+path, nil)
		req.Host = host
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatalf("GET %s with Host %q: %v", path, host, err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode
	}
	for _, path := range []string{"/healthz", "/status", "/metrics", "/"} {
		if code := get("evil.example:80", path); code != http.StatusForbidden {
			t.Errorf("GET %s with a foreign Host: %d, want 403", path, code)
		}
	}
	for _, host := range []string{addr, "localhost", "ops.example"} {
		for _, path := range []string{"/healthz", "/status", "/metrics"} {
			if code := get(host, path); code != http.StatusOK {
				t.Errorf("GET %s with Host %q: %d, want 200", path, host, code)
			}
		}
	}
}
