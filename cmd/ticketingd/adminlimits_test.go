package main

import (
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
