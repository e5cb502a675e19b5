package main

import (
	"bytes"
	"io"
	"net/http"
	"strings"
	"testing"
)

// adminDo makes one admin request with an optional Authorization header
// value and returns the status code and body.
func adminDo(t *testing.T, method, url, auth, body string) (int, string) {
	t.Helper()
	var rd io.Reader
	if body != "" {
		rd = bytes.NewReader([]byte(body))
	}
	req, err := http.NewRequestWithContext(t.Context(), method, url, rd)
	if err != nil {
		t.Fatal(err)
	}
	if auth != "" {
		req.Header.Set("Authorization", auth)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// TestAdminToken: with --admin-token, every admin request but GET /healthz
// needs the token as a Bearer credential; a standalone node has no
// cluster endpoints; the token is not logged.
func TestAdminToken(t *testing.T) {
	const token = "adm1n-t0ken"
	p := startInProc(t, "serve", "--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0", "--data-dir", t.TempDir(),
		"--admin-token", token, "--log-format", "json")
	admin := "http://" + p.stderr.waitJSON(t, "admin listening", p.done)["addr"].(string)
	p.stderr.waitJSON(t, "listening", p.done)

	for _, tc := range []struct {
		method, path, auth string
		code               int
		want               string // in the body
	}{
		{"GET", "/healthz", "", 200, "ok"},
		{"GET", "/healthz", "Bearer wrong", 200, "ok"},
		{"GET", "/status", "", 401, "Authorization: Bearer"},
		{"GET", "/status", "Bearer wrong", 401, "unauthorized"},
		{"GET", "/status", "Bearer " + token + "x", 401, "unauthorized"},
		{"GET", "/status", "Basic " + token, 401, "unauthorized"},
		{"GET", "/status", token, 401, "unauthorized"},
		{"GET", "/status", "Bearer " + token, 200, `"role": "standalone"`},
		{"GET", "/status", "bearer " + token, 200, `"role": "standalone"`},
		{"GET", "/metrics", "", 401, "unauthorized"},
		{"GET", "/metrics", "Bearer " + token, 200, "ticketing_sessions"},
		{"POST", "/cluster/add", "", 401, "unauthorized"},
		{"POST", "/cluster/add", "Bearer " + token, 404, ""}, // standalone: no such endpoint
		{"POST", "/cluster/remove", "Bearer " + token, 404, ""},
	} {
		code, body := adminDo(t, tc.method, admin+tc.path, tc.auth, "")
		if code != tc.code || !strings.Contains(body, tc.want) {
			t.Errorf("%s %s with %q: %d %q, want %d with %q", tc.method, tc.path, tc.auth, code, body, tc.code, tc.want)
		}
	}
	// A standalone /status has no cluster object.
	if _, body := adminDo(t, "GET", admin+"/status", "Bearer "+token, ""); strings.Contains(body, "cluster") {
		t.Errorf("standalone /status mentions a cluster: %s", body)
	}
	// ticketingd cluster against it: no token, the wrong one, then a
	// standalone node.
	if code, _, stderr := runCapture(t, "cluster", "status", "--admin", strings.TrimPrefix(admin, "http://")); code != 1 || !strings.Contains(stderr, "give --admin-token or set TICKETING_ADMIN_TOKEN") {
		t.Errorf("cluster status without token: exit %d: %s", code, stderr)
	}
	t.Setenv(adminTokenEnv, token)
	if code, _, stderr := runCapture(t, "cluster", "status", "--admin", strings.TrimPrefix(admin, "http://")); code != 1 || !strings.Contains(stderr, "is not a cluster node (role standalone)") {
		t.Errorf("cluster status of a standalone node: exit %d: %s", code, stderr)
	}
	if code, _, stderr := runCapture(t, "cluster", "remove", "n2", "--admin", admin); code != 1 || !strings.Contains(stderr, "has no /cluster/remove endpoint: it is not a cluster node") {
		t.Errorf("cluster remove on a standalone node: exit %d: %s", code, stderr)
	}
	if code := p.stop(); code != 0 {
		t.Fatalf("exit %d\n%s", code, p.stderr.String())
	}
	if strings.Contains(p.stderr.String(), token) {
		t.Errorf("the admin token was logged:\n%s", p.stderr.String())
	}
}
