package admin

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/ticketing-dev/ticketing/server"
	"github.com/ticketing-dev/ticketing/server/admin/console"
)

// doOn is do for a request that arrived on the listener address local.
func doOn(h http.Handler, local, path string, header map[string]string) *httptest.ResponseRecorder {
	req := httptest.NewRequest("GET", path, nil)
	la, _ := net.ResolveTCPAddr("tcp", local)
	req = req.WithContext(context.WithValue(req.Context(), http.LocalAddrContextKey, la))
	req.Host = local
	for k, v := range header {
		req.Header.Set(k, v)
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return rec
}

func basic(user, pass string) string {
	return "Basic " + base64.StdEncoding.EncodeToString([]byte(user+":"+pass))
}

// TestConsoleMounted: the admin handler serves the console at / and its
// JSON; with a token, the console needs it like everything else (as a
// Bearer token or a Basic password, which a browser sends after asking),
// and a 401 challenges Basic so that the browser asks; without a token
// the console answers on a loopback address only.
func TestConsoleMounted(t *testing.T) {
	const token = "c0nsole-t0ken"
	srv, _ := startServer(t, server.Config{DataDir: t.TempDir()})
	h := New(srv, Options{Token: token})
	for _, c := range []struct {
		auth string
		code int
	}{
		{"", 401},
		{basic("", "wrong"), 401},
		{basic("admin", token+"x"), 401},
		{basic("admin", token), 200},
		{basic("", token), 200},
		{"Bearer " + token, 200},
	} {
		for _, path := range []string{"/", "/v1/overview", "/deploy", "/locks", "/assets/console.js", "/assets/deploy.js", "/assets/locks.js"} {
			rec := doOn(h, "192.0.2.1:9225", path, map[string]string{"Authorization": c.auth})
			if rec.Code != c.code {
				t.Errorf("%s with %q: %d, want %d", path, c.auth, rec.Code, c.code)
				continue
			}
			if c.code == 401 {
				if ch := rec.Header().Values("WWW-Authenticate"); len(ch) != 2 || !strings.HasPrefix(ch[1], `Basic realm="ticketingd admin"`) {
					t.Errorf("%s: WWW-Authenticate %q: want a Basic challenge too", path, ch)
				}
				continue
			}
			if rec.Header().Get("Content-Security-Policy") != console.CSP || rec.Header().Get("Cache-Control") != "no-store" {
				t.Errorf("%s: headers %v", path, rec.Header())
			}
		}
	}
	rec := doOn(h, "192.0.2.1:9225", "/v1/overview", map[string]string{"Authorization": "Bearer " + token})
	var o console.Overview
	if err := json.Unmarshal(rec.Body.Bytes(), &o); err != nil || o.Role != "standalone" || o.Planning || o.Version == "" {
		t.Errorf("overview %+v (%v): %s", o, err, rec.Body)
	}

	open := New(srv, Options{})
	if rec := doOn(open, "127.0.0.1:9225", "/", nil); rec.Code != 200 || !strings.Contains(rec.Body.String(), "<h1>Console</h1>") {
		t.Errorf("no token, loopback: %d", rec.Code)
	}
	if rec := doOn(open, "192.0.2.1:9225", "/", nil); rec.Code != 403 {
		t.Errorf("no token, not loopback: %d, want 403", rec.Code)
	}
	if rec := doOn(open, "192.0.2.1:9225", "/status", nil); rec.Code != 200 {
		t.Errorf("no token, not loopback, /status: %d (unchanged: 200)", rec.Code)
	}
	if rec := doOn(New(srv, Options{NoConsole: true}), "127.0.0.1:9225", "/", nil); rec.Code != 404 {
		t.Errorf("NoConsole: / is %d, want 404", rec.Code)
	}
	routed := New(srv, Options{ConsoleRoutes: map[string]http.Handler{
		"GET /v1/example": http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.Write([]byte("example")) }),
	}})
	if rec := doOn(routed, "127.0.0.1:9225", "/v1/example", nil); rec.Code != 200 || rec.Body.String() != "example" || rec.Header().Get("X-Content-Type-Options") != "nosniff" {
		t.Errorf("a console route: %d %q", rec.Code, rec.Body)
	}
}

// TestConsoleCluster: on a cluster node the overview has the members
// and their health as the node sees them.
func TestConsoleCluster(t *testing.T) {
	yes, no := true, false
	f := &fakeNode{status: server.ClusterStatus{NodeID: "n1", State: "Leader", Leader: "n1", MembersView: "leader",
		Servers: []server.ClusterMember{{ID: "n1", Leader: true, Reachable: &yes}, {ID: "n2", Reachable: &no}}}}
	h := newHandler(f, f, nil, Options{})
	rec := doOn(h, "127.0.0.1:9225", "/v1/overview", nil)
	var o console.Overview
	if err := json.Unmarshal(rec.Body.Bytes(), &o); err != nil || o.Cluster == nil {
		t.Fatalf("overview %s (%v)", rec.Body, err)
	}
	if len(o.Cluster.Members) != 2 || o.Cluster.Members[1].Health != console.HealthUnreachable || o.Cluster.Leader != "n1" {
		t.Errorf("members %+v", o.Cluster.Members)
	}
}

// TestDeployBehindToken: the deployment planner, which answers with keys
// and tokens, needs the admin token like the rest of the admin listener,
// and answers no-store; without a token it answers on loopback only.
func TestDeployBehindToken(t *testing.T) {
	const token = "d3ploy-t0ken"
	srv, _ := startServer(t, server.Config{DataDir: t.TempDir()})
	h := New(srv, Options{Token: token})
	const spec = `{"topology":"single","dir":"/srv/t","client_tokens":1,"admin_token":true,"console_keys":true}`
	send := func(h http.Handler, local string, hdr map[string]string) *httptest.ResponseRecorder {
		req := httptest.NewRequest("POST", console.DeployPath, strings.NewReader(spec))
		la, _ := net.ResolveTCPAddr("tcp", local)
		req = req.WithContext(context.WithValue(req.Context(), http.LocalAddrContextKey, la))
		req.Host = local
		req.Header.Set("Content-Type", "application/json")
		for k, v := range hdr {
			req.Header.Set(k, v)
		}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		return rec
	}
	for _, c := range []struct {
		auth string
		code int
	}{{"", 401}, {basic("x", "wrong"), 401}, {"Bearer nope", 401}, {basic("operator", token), 200}, {"Bearer " + token, 200}} {
		rec := send(h, "192.0.2.1:9225", map[string]string{"Authorization": c.auth})
		if rec.Code != c.code {
			t.Errorf("POST %s with %q: %d, want %d: %.200s", console.DeployPath, c.auth, rec.Code, c.code, rec.Body)
		}
		if c.code == 401 && strings.Contains(rec.Body.String(), "BEGIN") {
			t.Errorf("401 with a bundle")
		}
		if c.code == 200 && rec.Header().Get("Cache-Control") != "no-store" {
			t.Errorf("200 without no-store: %v", rec.Header())
		}
	}
	open := New(srv, Options{})
	if rec := send(open, "192.0.2.1:9225", nil); rec.Code != 403 {
		t.Errorf("no token, not loopback: %d, want 403", rec.Code)
	}
	if rec := send(open, "127.0.0.1:9225", nil); rec.Code != 200 {
		t.Errorf("no token, loopback: %d, want 200", rec.Code)
	}
}
