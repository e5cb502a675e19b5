package console_test

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"math"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ticketing-dev/ticketing/internal/wire"
	"github.com/ticketing-dev/ticketing/server"
	"github.com/ticketing-dev/ticketing/server/admin/console"
)

// fakeNode is a console.Node whose Stats and ClusterStatus the test sets.
type fakeNode struct {
	mu  sync.Mutex
	st  server.Stats
	cs  *server.ClusterStatus
	err error
}

func (f *fakeNode) Stats() server.Stats {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.st
}

func (f *fakeNode) ClusterStatus() (server.ClusterStatus, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.cs == nil {
		return server.ClusterStatus{}, server.ErrNotCluster
	}
	return *f.cs, f.err
}

func (f *fakeNode) set(fn func(*server.Stats)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	fn(&f.st)
}

// get sends a request to h as if it arrived on local (a listener
// address) with the Host header host, and returns the answer.
func get(h http.Handler, method, path, local, host string) *httptest.ResponseRecorder {
	req := httptest.NewRequest(method, path, nil)
	req.Host = host
	// An event stream served by mistake ends with this context instead
	// of hanging the test.
	ctx, cancel := context.WithTimeout(req.Context(), 5*time.Second)
	defer cancel()
	if local != "" {
		la, _ := net.ResolveTCPAddr("tcp", local)
		ctx = context.WithValue(ctx, http.LocalAddrContextKey, la)
	}
	req = req.WithContext(ctx)
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return rec
}

// TestHeadersAndPaths: every answer, pages, assets, JSON, the event
// stream's headers and the 404s and 405s alike, carries the CSP, nosniff
// and no-store; a bad path is 404 (a bad method 405), never 500.
func TestHeadersAndPaths(t *testing.T) {
	for _, planning := range []bool{false, true} {
		opts := console.Options{Version: "v1.2.3", Interval: time.Hour}
		if !planning {
			opts.Node = &fakeNode{}
		}
		h := console.New(opts)
		for _, c := range []struct {
			method, path string
			code         int
			ctype        string
		}{
			{"GET", "/", 200, "text/html; charset=utf-8"},
			{"HEAD", "/", 200, "text/html; charset=utf-8"},
			{"GET", "/deploy", 200, "text/html; charset=utf-8"},
			{"GET", "/assets/console.css", 200, "text/css; charset=utf-8"},
			{"GET", "/assets/console.js", 200, "text/javascript; charset=utf-8"},
			{"GET", "/v1/overview", 200, "application/json"},
			{"GET", "/assets/", 404, ""},
			{"GET", "/assets/index.html", 404, ""},
			{"GET", "/assets/nope.js", 404, ""},
			{"GET", "/assets/../console.go", 307, ""}, // the mux's redirect to the clean path
			{"GET", "/assets/%2e%2e/doc.go", 404, ""},
			{"GET", "/v1/", 404, ""},
			{"GET", "/v1/nope", 404, ""},
			{"GET", "/index.html", 404, ""},
			{"GET", "/deploy/x", 404, ""},
			{"GET", "/%ff", 404, ""},
			{"POST", "/", 405, ""},
			{"DELETE", "/v1/overview", 405, ""},
		} {
			rec := get(h, c.method, c.path, "127.0.0.1:9300", "127.0.0.1:9300")
			what := c.method + " " + c.path
			if planning {
				what += " (planning)"
			}
			if rec.Code != c.code {
				t.Errorf("%s: %d, want %d; body %q", what, rec.Code, c.code, rec.Body.String())
			}
			hd := rec.Header()
			if got := hd.Get("Content-Security-Policy"); got != console.CSP || !strings.Contains(got, "script-src 'self'") || strings.Contains(got, "unsafe-inline") {
				t.Errorf("%s: Content-Security-Policy %q", what, got)
			}
			if got := hd.Get("X-Content-Type-Options"); got != "nosniff" {
				t.Errorf("%s: X-Content-Type-Options %q", what, got)
			}
			if got := hd.Get("Cache-Control"); got != "no-store" {
				t.Errorf("%s: Cache-Control %q", what, got)
			}
			if got := hd.Get("X-Frame-Options"); got != "DENY" {
				t.Errorf("%s: X-Frame-Options %q", what, got)
			}
			if c.ctype != "" && hd.Get("Content-Type") != c.ctype {
				t.Errorf("%s: Content-Type %q, want %q", what, hd.Get("Content-Type"), c.ctype)
			}
		}
	}
}

// TestPageHasNoInlineScriptOrStyle: the CSP allows no inline script or
// style, so the pages must have none (it would silently not run).
func TestPageHasNoInlineScriptOrStyle(t *testing.T) {
	for _, planning := range []bool{false, true} {
		opts := console.Options{}
		if !planning {
			opts.Node = &fakeNode{}
		}
		h := console.New(opts)
		for _, path := range []string{"/", "/deploy"} {
			body := get(h, "GET", path, "127.0.0.1:1", "localhost").Body.String()
			for _, bad := range []string{"<style", " style=", " onclick=", " onload=", "javascript:", "<script>", "http://", "https://"} {
				if strings.Contains(body, bad) {
					t.Errorf("%s (planning %v) contains %q", path, planning, bad)
				}
			}
			if !strings.Contains(body, `<script src="/assets/console.js" defer></script>`) {
				t.Errorf("%s: no console.js", path)
			}
			if !strings.Contains(body, `<meta name="viewport" content="width=device-width, initial-scale=1">`) {
				t.Errorf("%s: no viewport meta", path)
			}
			if !strings.Contains(body, `href="/deploy"`) {
				t.Errorf("%s: no link to the deployment page", path)
			}
		}
	}
}

// TestPlanning: without a node the page says so and links to /deploy;
// the overview is marked planning.
func TestPlanning(t *testing.T) {
	h := console.New(console.Options{Version: "v9"})
	body := get(h, "GET", "/", "127.0.0.1:1", "localhost").Body.String()
	if !strings.Contains(body, "No server: planning only") || !strings.Contains(body, `data-planning="true"`) {
		t.Errorf("planning page:\n%s", body)
	}
	var o console.Overview
	if err := json.Unmarshal(get(h, "GET", "/v1/overview", "127.0.0.1:1", "localhost").Body.Bytes(), &o); err != nil {
		t.Fatal(err)
	}
	if !o.Planning || o.Version != "v9" || o.Cluster != nil {
		t.Errorf("planning overview %+v", o)
	}
	withNode := get(console.New(console.Options{Node: &fakeNode{}}), "GET", "/", "127.0.0.1:1", "localhost").Body.String()
	if strings.Contains(withNode, "planning only") {
		t.Error("a console with a node says planning only")
	}
}

// TestLoopbackOnly: without an admin token (LoopbackOnly) a request that
// arrived on a non-loopback address, or names a non-loopback Host (DNS
// rebinding), gets 403; paths the console does not serve stay 404.
func TestLoopbackOnly(t *testing.T) {
	h := console.New(console.Options{Node: &fakeNode{}, LoopbackOnly: true})
	for _, c := range []struct {
		local, host, path string
		code              int
	}{
		{"127.0.0.1:9225", "127.0.0.1:9225", "/", 200},
		{"127.0.0.1:9225", "localhost:9225", "/v1/overview", 200},
		{"[::1]:9225", "[::1]:9225", "/", 200},
		{"192.0.2.7:9225", "192.0.2.7:9225", "/", 403},
		{"192.0.2.7:9225", "localhost", "/v1/overview", 403},
		{"0.0.0.0:9225", "127.0.0.1", "/deploy", 403},
		{"127.0.0.1:9225", "evil.example:9225", "/", 403},
		{"127.0.0.1:9225", "evil.example:9225", "/v1/events", 403},
		{"", "localhost", "/", 403}, // no local address known
		{"192.0.2.7:9225", "192.0.2.7", "/nope", 404},
	} {
		rec := get(h, "GET", c.path, c.local, c.host)
		if rec.Code != c.code {
			t.Errorf("GET %s on %s, Host %s: %d, want %d", c.path, c.local, c.host, rec.Code, c.code)
		}
		if rec.Code == 403 && !strings.Contains(rec.Body.String(), "--admin-token") {
			t.Errorf("403 body %q does not say what to do", rec.Body.String())
		}
	}
	open := console.New(console.Options{Node: &fakeNode{}})
	if rec := get(open, "GET", "/", "192.0.2.7:9225", "192.0.2.7"); rec.Code != 200 {
		t.Errorf("without LoopbackOnly: %d", rec.Code)
	}
}

// TestOverview: the overview's numbers come from the node's Stats; the
// rate of grants and the percentiles from the difference of two
// samples; the protocol errors by code with their recent counts; a
// cluster's members with their health as this node sees it.
func TestOverview(t *testing.T) {
	bounds := []float64{0.001, 0.01, 0.1}
	node := &fakeNode{}
	node.set(func(st *server.Stats) {
		*st = server.Stats{Role: "leader", Sessions: 3, HeldLocks: 7, Waiters: 2, Grants: 100, LastToken: 120, TokenCeiling: 10120,
			ProtocolErrors: 2, ProtocolErrorsByCode: map[uint16]uint64{wire.CodeInvalidArg: 2},
			GrantWait: server.WaitHistogram{Bounds: bounds, Counts: []uint64{100, 0, 0, 0}, Count: 100, SumS: 0.05}}
	})
	start := time.Date(2026, 12, 2, 10, 0, 0, 0, time.UTC)
	h := console.New(console.Options{Node: node, Started: start, Version: "v1"})

	o := h.Overview(start.Add(10 * time.Second))
	if o.Planning || o.Role != "leader" || o.Sessions != 3 || o.HeldLocks != 7 || o.Waiters != 2 || o.LastToken != 120 || o.TokenCeiling != 10120 || o.UptimeS != 10 {
		t.Fatalf("first overview %+v", o)
	}
	if o.GrantsPerS != nil {
		t.Errorf("first overview: grants/s %v, want null (one sample)", *o.GrantsPerS)
	}
	if o.GrantWait.Count != 100 || o.GrantWait.P50MS == nil || *o.GrantWait.P50MS != 0.5 {
		t.Errorf("first overview (since start): grant wait %+v", o.GrantWait)
	}

	// 2 s later: 50 more grants, all slow (between 10 and 100 ms), and one
	// more protocol error of code 4 and one of code 1.
	node.set(func(st *server.Stats) {
		st.Grants = 150
		st.GrantWait = server.WaitHistogram{Bounds: bounds, Counts: []uint64{100, 0, 50, 0}, Count: 150, SumS: 2.55}
		st.ProtocolErrorsByCode = map[uint16]uint64{wire.CodeInvalidArg: 3, wire.CodeMalformed: 1}
	})
	o = h.Overview(start.Add(12 * time.Second))
	if o.GrantsPerS == nil || *o.GrantsPerS != 25 {
		t.Errorf("grants/s %v, want 25", o.GrantsPerS)
	}
	if w := o.GrantWait; w.Count != 50 || w.WindowS != 2 || w.P50MS == nil || math.Abs(*w.P50MS-55) > 1e-9 || *w.P99MS < 90 {
		t.Errorf("grant wait of the window %+v (p50 %v), want 50 grants, p50 55 ms", w, *w.P50MS)
	}
	want := []console.ErrorCount{
		{Code: wire.CodeMalformed, Name: wire.CodeName(wire.CodeMalformed), Total: 1, Recent: 1},
		{Code: wire.CodeInvalidArg, Name: "invalid argument", Total: 3, Recent: 1},
	}
	if len(o.Errors) != 2 || o.Errors[0] != want[0] || o.Errors[1] != want[1] {
		t.Errorf("errors %+v, want %+v", o.Errors, want)
	}
	// Nobody watched for ten minutes: the samples are stale, and the
	// window starts again (since start at first, then from the first new
	// sample).
	if o := h.Overview(start.Add(10 * time.Minute)); o.GrantWait.WindowS != 600 || o.GrantWait.Count != 150 {
		t.Errorf("after ten idle minutes: window %+v, want since start", o.GrantWait)
	}
	if o := h.Overview(start.Add(10*time.Minute + time.Second)); o.GrantWait.WindowS != 1 || o.GrantWait.Count != 0 {
		t.Errorf("a second later: window %+v, want 1 s and no grants", o.GrantWait)
	}
	if o.Cluster != nil || o.ClusterError != "" || o.Pair != nil {
		t.Errorf("standalone: cluster %+v, %q, pair %+v", o.Cluster, o.ClusterError, o.Pair)
	}
	node.set(func(st *server.Stats) {
		st.Pair = &server.PairStatus{Role: "primary", State: "ACTIVE", Serving: true, PeerState: "PASSIVE", PeerAlive: true, Replicating: true}
	})
	if o = h.Overview(start.Add(10*time.Minute + 1500*time.Millisecond)); o.Pair == nil || o.Pair.State != "ACTIVE" || !o.Pair.Replicating || o.Pair.PeerState != "PASSIVE" {
		t.Errorf("pair %+v", o.Pair)
	}
	node.set(func(st *server.Stats) { st.Pair = nil })

	yes, no := true, false
	ms, idx, lag := int64(12), uint64(40), uint64(2)
	node.mu.Lock()
	node.cs = &server.ClusterStatus{NodeID: "n1", State: "Leader", Leader: "n1", MembersView: "leader", Servers: []server.ClusterMember{
		{ID: "n1", Suffrage: "Voter", Leader: true, Reachable: &yes},
		{ID: "n2", Suffrage: "Voter", Reachable: &yes, SinceContactMS: &ms, LogIndex: &idx, Lag: &lag},
		{ID: "n3", Suffrage: "Voter", Reachable: &no, LastError: "connection refused"},
	}}
	node.mu.Unlock()
	o = h.Overview(start.Add(11 * time.Minute))
	if o.Cluster == nil || len(o.Cluster.Members) != 3 {
		t.Fatalf("cluster %+v", o.Cluster)
	}
	for i, want := range []string{console.HealthUp, console.HealthUp, console.HealthUnreachable} {
		if got := o.Cluster.Members[i].Health; got != want {
			t.Errorf("leader's view: %s health %q, want %q", o.Cluster.Members[i].ID, got, want)
		}
	}
	if m := o.Cluster.Members[1]; *m.LogIndex != 40 || *m.Lag != 2 || *m.SinceContactMS != 12 || m.Self {
		t.Errorf("n2 %+v", m)
	}
	if !o.Cluster.Members[0].Self {
		t.Error("n1 not marked self")
	}

	// A follower's view: itself and the leader it hears are up, the rest
	// unknown (only the leader sees its members).
	node.mu.Lock()
	node.cs = &server.ClusterStatus{NodeID: "n2", State: "Follower", Leader: "n1", MembersView: "only the leader", Servers: []server.ClusterMember{
		{ID: "n1", Suffrage: "Voter", Leader: true}, {ID: "n2", Suffrage: "Voter"}, {ID: "n3", Suffrage: "Voter"},
	}}
	node.mu.Unlock()
	o = h.Overview(start.Add(12 * time.Minute))
	for i, want := range []string{console.HealthUp, console.HealthUp, console.HealthUnknown} {
		if got := o.Cluster.Members[i].Health; got != want {
			t.Errorf("follower's view: %s health %q, want %q", o.Cluster.Members[i].ID, got, want)
		}
	}
}

// eventServer serves h with the timeouts of the http.Server (zero:
// none) and reports each return of its /v1/events handler on the
// returned channel.
func eventServer(t *testing.T, h http.Handler, readTimeout, writeTimeout time.Duration) (*httptest.Server, <-chan struct{}) {
	returned := make(chan struct{}, 4)
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h.ServeHTTP(w, r)
		if r.URL.Path == "/v1/events" {
			returned <- struct{}{}
		}
	}))
	srv.Config.ReadTimeout, srv.Config.WriteTimeout = readTimeout, writeTimeout
	srv.Start()
	t.Cleanup(func() {
		if t.Failed() {
			// A handler that did not return would hold Close forever.
			srv.CloseClientConnections()
			return
		}
		srv.Close()
	})
	return srv, returned
}

// openEvents opens the event stream of srv.
func openEvents(t *testing.T, ctx context.Context, srv *httptest.Server) (*http.Response, *bufio.Reader) {
	t.Helper()
	req, _ := http.NewRequestWithContext(ctx, "GET", srv.URL+"/v1/events", nil)
	tr := &http.Transport{}
	t.Cleanup(tr.CloseIdleConnections)
	resp, err := (&http.Client{Transport: tr}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { resp.Body.Close() })
	if ct := resp.Header.Get("Content-Type"); ct != "text/event-stream" || resp.Header.Get("Cache-Control") != "no-store" {
		t.Fatalf("Content-Type %q, Cache-Control %q", ct, resp.Header.Get("Cache-Control"))
	}
	return resp, bufio.NewReader(resp.Body)
}

// readEvent reads the next event's overview.
func readEvent(br *bufio.Reader) (console.Overview, error) {
	var o console.Overview
	for {
		line, err := br.ReadString('\n')
		if err != nil {
			return o, err
		}
		if data, ok := strings.CutPrefix(line, "data: "); ok {
			return o, json.Unmarshal([]byte(data), &o)
		}
	}
}

// awaitReturn waits for the events handler to return (a hang guard).
func awaitReturn(t *testing.T, returned <-chan struct{}, why string) {
	t.Helper()
	select {
	case <-returned:
	case <-time.After(10 * time.Second):
		t.Fatalf("the events handler did not return %s", why)
	}
}

// TestEventsFlow: the event stream sends an overview at once and one per
// interval, each with the node's state of the moment.
func TestEventsFlow(t *testing.T) {
	node := &fakeNode{}
	srv, returned := eventServer(t, console.New(console.Options{Node: node, Interval: 20 * time.Millisecond}), 0, 0)
	ctx, cancel := context.WithCancel(t.Context())
	_, br := openEvents(t, ctx, srv)
	for i := range 3 {
		node.set(func(st *server.Stats) { st.HeldLocks = i })
		deadline := time.Now().Add(10 * time.Second) // a hang guard
		for {
			o, err := readEvent(br)
			if err != nil {
				t.Fatal(err)
			}
			if o.HeldLocks == i {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("no event with held_locks %d", i)
			}
		}
	}
	cancel()
	awaitReturn(t, returned, "after the client went away")
}

// TestEventsEndWhenClientGoes: the handler of a stream whose next event
// is an hour away returns as soon as its client goes away (goleak in
// TestMain checks that nothing stays behind).
func TestEventsEndWhenClientGoes(t *testing.T) {
	srv, returned := eventServer(t, console.New(console.Options{Node: &fakeNode{}, Interval: time.Hour}), 0, 0)
	ctx, cancel := context.WithCancel(t.Context())
	resp, br := openEvents(t, ctx, srv)
	if _, err := readEvent(br); err != nil {
		t.Fatal(err)
	}
	cancel()
	resp.Body.Close()
	awaitReturn(t, returned, "after the client went away")
}

// TestEventsEndOnShutdown: once ShuttingDown says so, the stream ends.
func TestEventsEndOnShutdown(t *testing.T) {
	var shutting atomic.Bool
	srv, returned := eventServer(t, console.New(console.Options{Node: &fakeNode{}, Interval: 20 * time.Millisecond, ShuttingDown: shutting.Load}), 0, 0)
	_, br := openEvents(t, t.Context(), srv)
	if _, err := readEvent(br); err != nil {
		t.Fatal(err)
	}
	shutting.Store(true)
	awaitReturn(t, returned, "once ShuttingDown said so")
	if _, err := io.Copy(io.Discard, br); err != nil {
		t.Fatalf("stream after shutdown: %v", err)
	}
}

// TestEventsOutliveServerTimeouts: the stream goes on past the
// http.Server's WriteTimeout and ReadTimeout (ticketingd's admin server
// has 30 s and 10 s): each event sets its own write deadline (net/http
// itself clears the read deadline while the handler runs; an expired one
// would cancel the request's context).
func TestEventsOutliveServerTimeouts(t *testing.T) {
	h := console.New(console.Options{Node: &fakeNode{}, Interval: 50 * time.Millisecond})
	srv, returned := eventServer(t, h, 300*time.Millisecond, 200*time.Millisecond)
	ctx, cancel := context.WithCancel(t.Context())
	_, br := openEvents(t, ctx, srv)
	start := time.Now()
	n := 0
	for time.Since(start) < time.Second {
		if _, err := readEvent(br); err != nil {
			t.Fatalf("after %v and %d events: %v", time.Since(start), n, err)
		}
		n++
	}
	cancel()
	awaitReturn(t, returned, "after the client went away")
}
