package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// TestConnBudgetKeepsFilesForTokens: a real ticketingd under an open-file
// limit of 256, with --token-block 1 (every grant writes and fsyncs the
// token ceiling: a temporary file and the directory, two descriptors),
// flooded with idle connections to the lock port and the admin port from
// 127.0.0.2 to 127.0.0.9 (more than the limit, each source within its
// per-address caps). The connection budget (256 minus the 128 kept for
// files) closes the connections beyond it at accept, so that a client
// whose session was open before the flood keeps acquiring and releasing,
// every grant a new ceiling write, without an E(6), and /healthz from
// 127.0.0.1 answers from the budget's units kept for loopback. Without the
// budget the flood takes every descriptor: the ceiling write fails
// (E(6) "reserving tokens: ... too many open files") and the admin port
// cannot accept /healthz.
func TestConnBudgetKeepsFilesForTokens(t *testing.T) {
	if testing.Short() {
		t.Skip("floods a real process with connections")
	}
	t.Parallel()
	floodUnderBudget(t, nil, "--token-block 1")
}

// TestConnBudgetClusterKeepsCommitting: the same flood, on a single-node
// cluster's lock, admin and Raft ports (plain TCP: no handshake gate on
// the Raft port, only the budget): the leader keeps committing grants and
// releases, and /healthz from 127.0.0.1 answers.
func TestConnBudgetClusterKeepsCommitting(t *testing.T) {
	if testing.Short() {
		t.Skip("floods a real process with connections")
	}
	t.Parallel()
	raft := "127.0.0.1:" + strconv.Itoa(freePort(t, "127.0.0.1"))
	floodUnderBudget(t, []string{raft}, "--cluster --node-id solo --raft-listen "+raft+" --peers solo="+raft)
}

// floodUnderBudget runs ticketingd serve with args under an open-file
// limit of 256, opens a session, floods the lock port, the admin port and
// the further addresses more with idle connections from 127.0.0.2 to
// 127.0.0.9, and checks that the session keeps acquiring and releasing
// and /healthz from 127.0.0.1 answers.
func floodUnderBudget(t *testing.T, more []string, args string) {
	bin := buildBinary(t)
	data := filepath.Join(t.TempDir(), "data")
	sp := startBinary(t, "/bin/sh", "-c", "ulimit -n 256 && exec "+bin+" serve --listen 127.0.0.1:0 --log-format json --node-name n1"+
		" --admin-listen 127.0.0.1:0 --admin-header-timeout 1m --data-dir "+data+" "+args)
	lockAddr := sp.addr(t)
	rec := sp.stderr.waitJSON(t, "listening", sp.done)
	if rec["conn_budget"] != float64(128) || rec["fd_reserve"] != float64(128) {
		t.Fatalf("listening line %v, want conn_budget 128 (256 - fd_reserve 128)", rec)
	}
	adminAddr := sp.stderr.waitJSON(t, "admin listening", sp.done)["addr"].(string)
	if len(more) > 0 {
		sp.stderr.waitJSON(t, "cluster: leading", sp.done)
	}

	// The client's session, before the flood.
	r := dialConf(t, lockAddr)
	r.send(x(t, "000000084800000001010000")) // HELLO req 1, no token, no name
	if f := r.next(); len(f) < 5 || f[4] != 'O' {
		t.Fatalf("HELLO answered %x, want HELLO_OK", f)
	}
	req := uint32(1)
	cycle := func(what string) {
		t.Helper()
		req++
		r.send(acqF(t, req, 1, 0, 30, "k"))
		f, err := r.frame(30 * time.Second) // a hang guard
		if err != nil {
			t.Fatalf("%s: ACQUIRE %d: %v", what, req, err)
		}
		if len(f) < 5 || f[4] != 'G' {
			t.Fatalf("%s: ACQUIRE %d answered %q, want a grant", what, req, f)
		}
		tok, _ := parseG(t, f, req)
		req++
		r.send(relF(t, req, tok, "k"))
		if f, err = r.frame(30 * time.Second); err != nil || string(f) != string(x(t, simpleHex('R', req))) {
			t.Fatalf("%s: RELEASE %d answered %q (%v), want R", what, req, f, err)
		}
	}
	cycle("before the flood")

	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	var held atomic.Int64
	defer func() { cancel(); wg.Wait() }()
	for i := 2; i <= 9; i++ {
		src := fmt.Sprintf("127.0.0.%d", i)
		for _, addr := range append([]string{lockAddr, adminAddr}, more...) {
			for range 40 {
				wg.Add(1)
				go func() { defer wg.Done(); holdIdle(ctx, src, addr, &held) }()
			}
		}
	}

	// The budget is spent: strangers hold every unit but loopback's, and
	// the rest are refused at accept.
	status := func() map[string]any {
		t.Helper()
		cl := &http.Client{Timeout: 30 * time.Second} // a hang guard
		resp, err := cl.Get("http://" + adminAddr + "/status")
		if err != nil {
			t.Fatalf("/status: %v", err)
		}
		defer resp.Body.Close()
		var m map[string]any
		if err := json.NewDecoder(resp.Body).Decode(&m); err != nil {
			t.Fatalf("/status: %v", err)
		}
		return m
	}
	deadline := time.Now().Add(60 * time.Second)
	for {
		s := status()
		if s["conn_budget_refused"].(float64) > 100 && s["conn_budget_in_use"].(float64) >= 96 {
			t.Logf("flood: %d connections held by the flooders; budget in use %v, refused %v", held.Load(), s["conn_budget_in_use"], s["conn_budget_refused"])
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the flood did not spend the budget: /status %v", s)
		}
		time.Sleep(50 * time.Millisecond)
	}
	warn := sp.stderr.waitJSON(t, "connection refused: the server's connections hold every descriptor of their budget (the open-file limit minus fd-reserve, kept for the token store and the Raft log); if these are clients, raise the open-file limit (ulimit -n, systemd LimitNOFILE=)", sp.done)
	if warn["nofile_limit"] != float64(256) || warn["conn_budget"] != float64(128) {
		t.Fatalf("refusal warning %v", warn)
	}

	// Under the flood: every grant writes the ceiling, and /healthz from
	// 127.0.0.1 answers.
	for i := range 40 {
		cycle(fmt.Sprintf("under the flood, cycle %d", i))
		if i%10 == 0 {
			if got := healthz(t, adminAddr); got != "HTTP/1.1 200 OK" {
				t.Fatalf("/healthz from 127.0.0.1 under the flood: %q", got)
			}
		}
	}
	// The flooders' idle connections that outlive the HELLO timeout (5 s:
	// a loaded machine takes that long) are closed with E(1), and only
	// those: no other protocol error, no token store error.
	if s := status(); s["token_store_error"] != nil || !onlyHelloTimeouts(s) {
		t.Fatalf("/status after the flood %v", s)
	}
	if strings.Contains(sp.stderr.String(), "too many open files") {
		t.Fatalf("the server ran out of descriptors:\n%s", sp.stderr.String())
	}
}

// onlyHelloTimeouts reports whether every protocol error in a /status
// answer is E(1), the code a connection that sent no HELLO in time gets.
func onlyHelloTimeouts(s map[string]any) bool {
	by, _ := s["protocol_errors_by_code"].(map[string]any)
	n, _ := s["protocol_errors"].(float64)
	return n == 0 || len(by) == 1 && by["1"] == n
}

// healthz sends GET /healthz from 127.0.0.1 to the admin port and returns
// the answer's status line ("" if the connection closed unanswered).
func healthz(t *testing.T, addr string) string {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)}, Timeout: 30 * time.Second}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		t.Fatalf("/healthz: %v", err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(30 * time.Second)) // a hang guard
	if _, err := io.WriteString(c, "GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"); err != nil {
		return ""
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		t.Fatalf("/healthz from 127.0.0.1: no answer: %v", err)
	}
	return strings.TrimSpace(line)
}

// holdIdle keeps one idle connection from src to addr open until ctx ends:
// it sends nothing, and dials again (after a pause) when the server closes
// it. held counts the connections open.
func holdIdle(ctx context.Context, src, addr string, held *atomic.Int64) {
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}, Timeout: 5 * time.Second}
	buf := make([]byte, 1)
	for ctx.Err() == nil {
		c, err := d.DialContext(ctx, "tcp", addr)
		if err == nil {
			held.Add(1)
			for ctx.Err() == nil {
				c.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
				_, err = c.Read(buf)
				var ne net.Error
				if !errors.As(err, &ne) || !ne.Timeout() {
					break // closed by the server
				}
			}
			held.Add(-1)
			c.Close()
		} else if errors.Is(err, os.ErrDeadlineExceeded) {
			continue
		}
		select {
		case <-ctx.Done():
		case <-time.After(200 * time.Millisecond):
		}
	}
}
