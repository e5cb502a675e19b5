package admin

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ticketing-dev/ticketing/internal/wire"
	"github.com/ticketing-dev/ticketing/server"
)

// TestHealthzWhileShuttingDown: /healthz answers 200 "ok" until
// Options.ShuttingDown says so, then 503; an unknown path is 404.
func TestHealthzWhileShuttingDown(t *testing.T) {
	srv, _ := startServer(t, server.Config{DataDir: t.TempDir()})
	var down atomic.Bool
	h := New(srv, Options{ShuttingDown: down.Load})
	if rec := do(h, "GET", "/healthz", nil, ""); rec.Code != 200 || rec.Body.String() != "ok\n" || rec.Header().Get("Content-Type") != "text/plain; charset=utf-8" {
		t.Errorf("serving: %d %q %q", rec.Code, rec.Body, rec.Header().Get("Content-Type"))
	}
	down.Store(true)
	if rec := do(h, "GET", "/healthz", nil, ""); rec.Code != 503 || rec.Body.String() != "shutting down\n" {
		t.Errorf("shutting down: %d %q", rec.Code, rec.Body)
	}
	if rec := do(h, "GET", "/nope", nil, ""); rec.Code != 404 {
		t.Errorf("/nope: %d", rec.Code)
	}
}

// TestTokenStoreHealth: /healthz answers 503 while the token store cannot
// reserve (here: the ceiling's temporary file cannot be created), and 200
// again once it can; /status never shows last_token above token_ceiling,
// even after grants failed for want of a token.
func TestTokenStoreHealth(t *testing.T) {
	dir := t.TempDir()
	srv, addr := startServer(t, server.Config{DataDir: dir, TokenBlock: 4})
	h := New(srv, Options{})
	if rec := do(h, "GET", "/healthz", nil, ""); rec.Code != 200 {
		t.Fatalf("healthy store: %d %q", rec.Code, rec.Body)
	}

	tmp := filepath.Join(dir, "tokens.ceiling.tmp")
	if err := os.Mkdir(tmp, 0o700); err != nil { // every reservation fails
		t.Fatal(err)
	}
	cl := dialWire(t, addr)
	var last uint64
	for i := range 4 { // the first block of four; the reservation of the next fails
		r, err := cl.acquire(fmt.Sprintf("k%d", i), 0, 30)
		if err != nil || r.Type != wire.TypeGranted {
			t.Fatalf("acquire %d: %q %v", i, r.Type, err)
		}
		last = r.Token
	}
	for range 3 { // no token: these fail (E(6): the disk failed)
		if r, err := dialWire(t, addr).acquire("more", 0, 30); err == nil && r.Type == wire.TypeGranted {
			t.Fatalf("granted token %d with a failing store", r.Token)
		}
	}
	rec := do(h, "GET", "/healthz", nil, "")
	if rec.Code != 503 || !strings.HasPrefix(rec.Body.String(), "token store: ") {
		t.Errorf("failing store: /healthz %d %q, want 503 naming the token store", rec.Code, rec.Body)
	}
	var st Status
	if err := json.Unmarshal(do(h, "GET", "/status", nil, "").Body.Bytes(), &st); err != nil {
		t.Fatal(err)
	}
	if st.LastToken > st.TokenCeiling || st.LastToken != last {
		t.Errorf("/status last_token %d, token_ceiling %d: want last %d, never above the ceiling", st.LastToken, st.TokenCeiling, last)
	}
	if st.TokenStoreError == "" {
		t.Errorf("/status has no token_store_error while the store fails")
	}

	if err := os.Remove(tmp); err != nil { // the disk recovers
		t.Fatal(err)
	}
	if r, err := dialWire(t, addr).acquire("after", 0, 30); err != nil || r.Type != wire.TypeGranted || r.Token <= last {
		t.Fatalf("after recovery: %q token %d %v", r.Type, r.Token, err)
	}
	if rec := do(h, "GET", "/healthz", nil, ""); rec.Code != 200 {
		t.Errorf("recovered store: /healthz %d %q", rec.Code, rec.Body)
	}
}

// TestStandalone: a standalone server's /status is its Stats and the
// build, with no cluster object; it has no cluster endpoints; /metrics is
// served only with a Gatherer.
func TestStandalone(t *testing.T) {
	reg := prometheus.NewRegistry()
	srv, _ := startServer(t, server.Config{DataDir: t.TempDir(), Registerer: reg})
	modified := true
	build := BuildInfo{Version: "v1.2.3", Path: "example.com/m", Revision: "abc", Modified: &modified, GoVersion: "go1.x"}

	h := New(srv, Options{Gatherer: reg, Registerer: reg, Build: &build})
	rec := do(h, "GET", "/status", nil, "")
	if rec.Code != 200 || rec.Header().Get("Content-Type") != "application/json" {
		t.Fatalf("/status: %d %q %s", rec.Code, rec.Header().Get("Content-Type"), rec.Body)
	}
	var raw map[string]any
	if err := json.Unmarshal(rec.Body.Bytes(), &raw); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"sessions", "held_locks", "last_token", "token_ceiling", "role", "build"} {
		if _, ok := raw[k]; !ok {
			t.Errorf("/status lacks %q: %s", k, rec.Body)
		}
	}
	for _, k := range []string{"cluster", "cluster_error"} {
		if _, ok := raw[k]; ok {
			t.Errorf("standalone /status has %q: %s", k, rec.Body)
		}
	}
	if !strings.Contains(rec.Body.String(), "\n  \"sessions\": 0,\n") {
		t.Errorf("/status is not indented by two spaces: %s", rec.Body)
	}
	var st Status
	if err := json.Unmarshal(rec.Body.Bytes(), &st); err != nil {
		t.Fatal(err)
	}
	if st.Role != "standalone" || st.Build.Version != "v1.2.3" || st.Build.Path != "example.com/m" || st.Build.Modified == nil || !*st.Build.Modified {
		t.Errorf("/status: %+v", st)
	}

	for _, path := range []string{"/cluster/add", "/cluster/remove"} {
		if rec := do(h, "POST", path, map[string]string{"Content-Type": "application/json"}, `{"id":"n2"}`); rec.Code != 404 {
			t.Errorf("standalone POST %s: %d, want 404", path, rec.Code)
		}
	}

	rec = do(h, "GET", "/metrics", nil, "")
	if rec.Code != 200 || !strings.Contains(rec.Body.String(), "ticketing_sessions") || !strings.Contains(rec.Body.String(), "promhttp_metric_handler_errors_total") {
		t.Errorf("/metrics: %d\n%s", rec.Code, rec.Body)
	}
	if rec := do(New(srv, Options{}), "GET", "/metrics", nil, ""); rec.Code != 404 {
		t.Errorf("/metrics without a Gatherer: %d, want 404", rec.Code)
	}
	// Without Build: the binary's own.
	if err := json.Unmarshal(do(New(srv, Options{}), "GET", "/status", nil, "").Body.Bytes(), &st); err != nil || st.Build != ReadBuildInfo() || st.Build.GoVersion != runtime.Version() {
		t.Errorf("/status build without Options.Build: %+v %v, want %+v", st.Build, err, ReadBuildInfo())
	}
}

// TestToken: with a token, every request but GET /healthz needs it as a
// Bearer credential; the 401 says whether no token, no Bearer token or a
// wrong token was sent.
func TestToken(t *testing.T) {
	const token = "adm1n-t0ken"
	reg := prometheus.NewRegistry()
	srv, _ := startServer(t, server.Config{DataDir: t.TempDir(), Registerer: reg})
	h := New(srv, Options{Token: token, Gatherer: reg, Registerer: reg})
	for _, tc := range []struct {
		method, path, auth string
		code               int
		want               string // the body's error, or a part of the body
	}{
		{"GET", "/healthz", "", 200, "ok\n"},
		{"GET", "/healthz", "Bearer wrong", 200, "ok\n"},
		{"GET", "/status", "", 401, msgNoToken},
		{"GET", "/status", "  ", 401, msgNoToken},
		{"GET", "/status", "Bearer wrong", 401, msgWrongToken},
		{"GET", "/status", "Bearer " + token + "x", 401, msgWrongToken},
		{"GET", "/status", "Bearer " + token[:len(token)-1], 401, msgWrongToken},
		{"GET", "/status", "Bearer ", 401, msgNotBearer},
		{"GET", "/status", "Basic " + token, 401, msgNotBearer},
		{"GET", "/status", token, 401, msgNotBearer},
		{"GET", "/status", "Bearer " + token, 200, `"role": "standalone"`},
		{"GET", "/status", "bearer " + token, 200, `"role": "standalone"`},
		{"GET", "/status", "BEARER  " + token + " ", 200, `"role": "standalone"`},
		{"GET", "/metrics", "", 401, msgNoToken},
		{"GET", "/metrics", "Bearer " + token, 200, "ticketing_sessions"},
		{"POST", "/cluster/add", "", 401, msgNoToken},
		{"POST", "/cluster/add", "Bearer " + token, 404, "404 page not found"}, // standalone
	} {
		var hdr map[string]string
		if tc.auth != "" {
			hdr = map[string]string{"Authorization": tc.auth}
		}
		rec := do(h, tc.method, tc.path, hdr, "")
		if rec.Code != tc.code {
			t.Errorf("%s %s with %q: %d %q, want %d", tc.method, tc.path, tc.auth, rec.Code, rec.Body, tc.code)
			continue
		}
		if tc.code != 401 {
			if !strings.Contains(rec.Body.String(), tc.want) {
				t.Errorf("%s %s with %q: %q, want %q in it", tc.method, tc.path, tc.auth, rec.Body, tc.want)
			}
			continue
		}
		var e ErrorResponse
		if err := json.Unmarshal(rec.Body.Bytes(), &e); err != nil || e.Error != tc.want {
			t.Errorf("%s %s with %q: %q (%v), want error %q", tc.method, tc.path, tc.auth, rec.Body, err, tc.want)
		}
		if got := rec.Header().Get("WWW-Authenticate"); got != `Bearer realm="ticketingd admin"` {
			t.Errorf("%s %s with %q: WWW-Authenticate %q", tc.method, tc.path, tc.auth, got)
		}
	}
}

// fakeNode is a server for newHandler: its Stats, its token store's
// health, and a cluster node's methods with canned answers.
type fakeNode struct {
	mu        sync.Mutex
	status    server.ClusterStatus
	statusErr error
	changeErr error    // AddVoter's and RemoveServer's
	calls     []string // "add ID ADDR", "remove ID"
	deadline  time.Duration
}

func (f *fakeNode) Stats() server.Stats  { return server.Stats{Role: "leader"} }
func (f *fakeNode) TokenStoreErr() error { return nil }

func (f *fakeNode) ClusterStatus() (server.ClusterStatus, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.status, f.statusErr
}

func (f *fakeNode) change(ctx context.Context, call string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, call)
	if d, ok := ctx.Deadline(); ok {
		f.deadline = time.Until(d)
	}
	return f.changeErr
}

func (f *fakeNode) AddVoter(ctx context.Context, id, raftAddr string) error {
	return f.change(ctx, "add "+id+" "+raftAddr)
}

func (f *fakeNode) RemoveServer(ctx context.Context, id string) error {
	return f.change(ctx, "remove "+id)
}

// TestClusterStatus: a cluster node's /status has its ClusterStatus, or
// the error that kept it from having one.
func TestClusterStatus(t *testing.T) {
	fn := &fakeNode{status: server.ClusterStatus{NodeID: "n1", State: "Leader", ClusterID: "c1"}}
	h := newHandler(fn, fn, nil, Options{})
	var st Status
	if err := json.Unmarshal(do(h, "GET", "/status", nil, "").Body.Bytes(), &st); err != nil || st.Cluster == nil || st.Cluster.NodeID != "n1" || st.Cluster.ClusterID != "c1" || st.ClusterError != "" || st.Role != "leader" {
		t.Errorf("/status: %+v %v", st, err)
	}
	fn.statusErr = errors.New("no raft")
	st = Status{}
	if err := json.Unmarshal(do(h, "GET", "/status", nil, "").Body.Bytes(), &st); err != nil || st.Cluster != nil || st.ClusterError != "no raft" {
		t.Errorf("/status with a failing ClusterStatus: %+v %v", st, err)
	}
}

// TestClusterChanges: the cluster endpoints check what they are given (the
// content type, a loopback Host without a token, the body, the node) before
// they ask the server, and map its errors to 409, 504 and 500.
func TestClusterChanges(t *testing.T) {
	var logs bytes.Buffer
	fn := &fakeNode{status: server.ClusterStatus{NodeID: "n1", State: "Leader", Servers: []server.ClusterMember{{ID: "n1"}, {ID: "n2"}}}}
	h := newHandler(fn, fn, nil, Options{ClusterChangeTimeout: time.Hour, Logger: slog.New(slog.NewTextHandler(&logs, nil)),
		AllowedHosts: []string{"admin.example"}})
	jsonCT := map[string]string{"Content-Type": "application/json", "Host": "127.0.0.1:9225"}
	for _, tc := range []struct {
		name, path string
		header     map[string]string
		body       string
		code       int
		want       string // the body's error
	}{
		{"form post", "/cluster/remove", map[string]string{"Content-Type": "text/plain"}, `{"id":"n2"}`, 415, "want Content-Type: application/json"},
		{"no content type", "/cluster/add", nil, `{"id":"n3","address":"10.0.0.3:7001"}`, 415, "want Content-Type: application/json"},
		{"rebound host", "/cluster/remove", map[string]string{"Content-Type": "application/json", "Host": "evil.example:80"}, `{"id":"n2"}`, 403,
			`Host "evil.example:80" is not a name of this server: without --admin-token the admin listener answers only for an IP address, localhost, the hosts of its listen and advertise addresses, and the names of --admin-allowed-host`},
		{"allowed host, not loopback", "/cluster/remove", map[string]string{"Content-Type": "application/json", "Host": "admin.example:80"}, `{"id":"n2"}`, 403,
			`Host "admin.example:80" is not a loopback address: without --admin-token, cluster changes are accepted only for 127.0.0.1, ::1 or localhost`},
		{"public IP host", "/cluster/add", map[string]string{"Content-Type": "application/json", "Host": "192.0.2.1:9225"}, `{"id":"n3","address":"10.0.0.3:7001"}`, 403,
			`Host "192.0.2.1:9225" is not a loopback address: without --admin-token, cluster changes are accepted only for 127.0.0.1, ::1 or localhost`},
		{"not a member", "/cluster/remove", map[string]string{"Content-Type": "application/json; charset=utf-8", "Host": "localhost"}, `{"id":"nobody"}`, 404, `node "nobody" is not in the cluster configuration`},
		{"bad json", "/cluster/add", jsonCT, `{"id":`, 400, "invalid request body: unexpected EOF"},
		{"unknown field", "/cluster/add", jsonCT, `{"id":"n3","addr":"127.0.0.1:1"}`, 400, `invalid request body: json: unknown field "addr"`},
		{"two values", "/cluster/add", jsonCT, `{"id":"n3","address":"127.0.0.1:1"} {}`, 400, "invalid request body: more than one JSON value"},
		{"bad id", "/cluster/add", jsonCT, `{"id":"n/3","address":"127.0.0.1:1"}`, 400, `invalid id "n/3": want 1 to 64 letters, digits, '.', '_' or '-'`},
		{"bad remove id", "/cluster/remove", jsonCT, `{"id":""}`, 400, `invalid id "": want 1 to 64 letters, digits, '.', '_' or '-'`},
		{"no port", "/cluster/add", jsonCT, `{"id":"n3","address":"10.0.0.3"}`, 400, `invalid address "10.0.0.3": want HOST:PORT (the node's Raft address, its --raft-advertise)`},
		{"port 0", "/cluster/add", jsonCT, `{"id":"n3","address":"10.0.0.3:0"}`, 400, `invalid address "10.0.0.3:0": want a port 1..65535 (the node's Raft address, its --raft-advertise)`},
		{"wildcard address", "/cluster/add", jsonCT, `{"id":"n3","address":"0.0.0.0:7001"}`, 400, `invalid address "0.0.0.0:7001": want a specific host, not a wildcard address (the node's Raft address, its --raft-advertise)`},
		{"empty host", "/cluster/add", jsonCT, `{"id":"n3","address":":7001"}`, 400, `invalid address ":7001": want a specific host, not a wildcard address (the node's Raft address, its --raft-advertise)`},
	} {
		rec := do(h, "POST", tc.path, tc.header, tc.body)
		var e ErrorResponse
		if err := json.Unmarshal(rec.Body.Bytes(), &e); rec.Code != tc.code || err != nil || e.Error != tc.want {
			t.Errorf("%s: %d %s; want %d with error %q", tc.name, rec.Code, rec.Body, tc.code, tc.want)
		}
	}
	rec := do(h, "POST", "/cluster/add", jsonCT, `{"id":"`+strings.Repeat("n", 5000)+`"}`)
	if rec.Code != 413 || !strings.Contains(rec.Body.String(), "invalid request body: http: request body too large") {
		t.Errorf("too large: %d %s", rec.Code, rec.Body)
	}
	if rec := do(h, "GET", "/cluster/add", nil, ""); rec.Code != 405 {
		t.Errorf("GET /cluster/add: %d, want 405", rec.Code)
	}
	if len(fn.calls) != 0 {
		t.Fatalf("refused requests reached the server: %q", fn.calls)
	}

	// Accepted: for 127.0.0.1, [::1] and localhost. (httptest's default
	// Host is example.com: name one.)
	for _, host := range []string{"127.0.0.1:9225", "[::1]:9225", "localhost", "LOCALHOST.:9225", "127.0.0.2"} {
		rec := do(h, "POST", "/cluster/add", map[string]string{"Content-Type": "application/json", "Host": host}, `{"id":"n3","address":"10.0.0.3:7001"}`)
		var resp ClusterChangeResponse
		if err := json.Unmarshal(rec.Body.Bytes(), &resp); rec.Code != 200 || err != nil || resp.ID != "n3" || resp.Address != "10.0.0.3:7001" || resp.Cluster == nil || resp.Cluster.NodeID != "n1" {
			t.Errorf("add with Host %s: %d %s", host, rec.Code, rec.Body)
		}
	}
	if fn.deadline <= DefaultClusterChangeTimeout {
		t.Errorf("the change's context ends in %v: want Options.ClusterChangeTimeout (an hour)", fn.deadline)
	}
	rec = do(h, "POST", "/cluster/remove", map[string]string{"Content-Type": "application/json", "Host": "localhost"}, `{"id":"n2"}`)
	var resp map[string]any
	if err := json.Unmarshal(rec.Body.Bytes(), &resp); rec.Code != 200 || err != nil || resp["id"] != "n2" || resp["address"] != nil || resp["cluster"] == nil {
		t.Errorf("remove: %d %s", rec.Code, rec.Body)
	}
	if want := "remove n2"; fn.calls[len(fn.calls)-1] != want {
		t.Errorf("last call %q, want %q", fn.calls[len(fn.calls)-1], want)
	}
	if !strings.Contains(logs.String(), `msg="admin: cluster add" id=n3 address=10.0.0.3:7001 remote=192.0.2.1:1234 err=""`) ||
		!strings.Contains(logs.String(), `msg="admin: cluster remove" id=n2 remote=192.0.2.1:1234 err=""`) {
		t.Errorf("log lines:\n%s", logs.String())
	}

	// With a token, the Host need not be a loopback address.
	ht := newHandler(fn, fn, nil, Options{Token: "t"})
	if rec := do(ht, "POST", "/cluster/remove", map[string]string{"Content-Type": "application/json", "Host": "admin.example:9225", "Authorization": "Bearer t"}, `{"id":"n2"}`); rec.Code != 200 {
		t.Errorf("remove with a token and a remote Host: %d %s", rec.Code, rec.Body)
	}

	// On a follower, the membership check is the leader's: the change is
	// asked for, and refused with the leader.
	fn.status.State = "Follower"
	for _, tc := range []struct {
		err  error
		code int
		want string
	}{
		{&server.NotLeaderError{Leader: "n2", LeaderAddress: "10.0.0.2:7001"}, 409, `{"error":"server: not the cluster leader (the leader is n2 at 10.0.0.2:7001)","leader":"n2","leader_address":"10.0.0.2:7001"}`},
		{fmt.Errorf("wrapped: %w", &server.NotLeaderError{}), 409, `{"error":"wrapped: server: not the cluster leader (no leader known)","leader":"","leader_address":""}`},
		{fmt.Errorf("raft: %w", server.ErrNotLeader), 409, `{"error":"raft: server: not the cluster leader","leader":"","leader_address":""}`},
		{fmt.Errorf("add: %w", context.DeadlineExceeded), 504, `{"error":"add: context deadline exceeded"}`},
		{errors.New("disk on fire"), 500, `{"error":"disk on fire"}`},
	} {
		fn.changeErr = tc.err
		rec := do(h, "POST", "/cluster/remove", map[string]string{"Content-Type": "application/json", "Host": "localhost"}, `{"id":"nobody"}`)
		var compact bytes.Buffer
		if err := json.Compact(&compact, rec.Body.Bytes()); rec.Code != tc.code || err != nil || compact.String() != tc.want {
			t.Errorf("change error %v: %d %s, want %d %s", tc.err, rec.Code, rec.Body, tc.code, tc.want)
		}
	}
}

// TestNewBuildInfo: the go command's stamp maps to BuildInfo's fields.
func TestNewBuildInfo(t *testing.T) {
	bi := &debug.BuildInfo{
		Main: debug.Module{Path: "example.com/m", Version: "v1.2.3"},
		Settings: []debug.BuildSetting{
			{Key: "vcs.revision", Value: "abc"}, {Key: "vcs.time", Value: "2026-01-02T03:04:05Z"}, {Key: "vcs.modified", Value: "true"}, {Key: "-race", Value: "true"},
		},
	}
	got := NewBuildInfo(bi)
	if got.Version != "v1.2.3" || got.Path != "example.com/m" || got.Revision != "abc" || got.RevisionTime != "2026-01-02T03:04:05Z" ||
		got.Modified == nil || !*got.Modified || got.GoVersion != runtime.Version() {
		t.Errorf("NewBuildInfo: %+v", got)
	}
	b, err := json.Marshal(got)
	if want := `{"version":"v1.2.3","module":"example.com/m","revision":"abc","revision_time":"2026-01-02T03:04:05Z","modified":true,"go_version":"` + runtime.Version() + `"}`; err != nil || string(b) != want {
		t.Errorf("JSON %s %v, want %s", b, err, want)
	}
	got = NewBuildInfo(nil)
	if got.Version != DevelVersion || got.Path != "" || got.Revision != "" || got.Modified != nil || got.GoVersion != runtime.Version() {
		t.Errorf("NewBuildInfo(nil): %+v", got)
	}
	b, err = json.Marshal(got)
	if want := `{"version":"(devel)","module":"","revision":"","modified":null,"go_version":"` + runtime.Version() + `"}`; err != nil || string(b) != want {
		t.Errorf("JSON %s %v, want %s", b, err, want)
	}
}
