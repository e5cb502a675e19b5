package main

import (
	"context"
	"encoding/json"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestConsoleLoopback: 'ticketingd console' on a loopback address starts
// without a token, serves the planning page and the deployment page, and
// stops cleanly on cancel (SIGTERM).
func TestConsoleLoopback(t *testing.T) {
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(freePort(t, "127.0.0.1")))
	t.Setenv(adminTokenEnv, "")
	p := startInProc(t, "console", "--listen", addr, "--log-format", "json")
	rec := p.stderr.waitJSON(t, "console listening", p.done)
	if rec["addr"] != addr || rec["admin_token"] != false {
		t.Fatalf("listening line %v", rec)
	}
	code, body := adminDo(t, "GET", "http://"+addr+"/", "", "")
	if code != 200 || !strings.Contains(body, "No server: planning only") || !strings.Contains(body, `href="/deploy"`) {
		t.Fatalf("GET /: %d\n%s", code, body)
	}
	if code, body := adminDo(t, "GET", "http://"+addr+"/deploy", "", ""); code != 200 || !strings.Contains(body, "ticketingd init") {
		t.Fatalf("GET /deploy: %d\n%s", code, body)
	}
	if code, body := adminDo(t, "GET", "http://"+addr+"/v1/overview", "", ""); code != 200 || !strings.Contains(body, `"planning": true`) {
		t.Fatalf("GET /v1/overview: %d\n%s", code, body)
	}
	// The deployment page's planner: a bundle, logged without its secrets.
	code, body = adminDo(t, "POST", "http://"+addr+"/v1/deploy", "", `{"topology":"single","dir":"/srv/t","client_tokens":1,"admin_token":true,"console_keys":true}`)
	var plan struct{ URL, Guide string }
	if err := json.Unmarshal([]byte(body), &plan); code != 200 || err != nil || !strings.HasPrefix(plan.URL, "ticketing://") {
		t.Fatalf("POST /v1/deploy: %d %v\n%.300s", code, err, body)
	}
	p.stderr.waitJSON(t, "console: deploy bundle planned", p.done)
	token := strings.TrimPrefix(plan.URL[:strings.Index(plan.URL, "@")], "ticketing://")
	if strings.Contains(p.stderr.String(), token) || strings.Contains(p.stderr.String(), "PRIVATE") {
		t.Fatalf("the console's log has a secret:\n%s", p.stderr.String())
	}
	if code := p.stop(); code != exitOK {
		t.Fatalf("exit %d\n%s", code, p.stderr.String())
	}
}

// TestConsoleRefusesNonLoopbackWithoutToken: on a wildcard or other
// non-loopback address the console does not start without an admin token
// (exit 2, saying why); with one (the flag or TICKETING_ADMIN_TOKEN) it
// starts and asks for it.
func TestConsoleRefusesNonLoopbackWithoutToken(t *testing.T) {
	t.Setenv(adminTokenEnv, "")
	port := strconv.Itoa(freePort(t, ""))
	var stdout, stderr strings.Builder
	// A console that starts anyway is stopped after a while (and the test
	// fails on its exit 0).
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	code := run(ctx, []string{"console", "--listen", "0.0.0.0:" + port}, &stdout, &stderr)
	if code != exitUsage || !strings.Contains(stderr.String(), "is not a loopback address") || !strings.Contains(stderr.String(), "--admin-token") {
		t.Fatalf("exit %d, stderr:\n%s", code, stderr.String())
	}
	if ip := nonLoopbackIP(); ip != "" {
		stderr.Reset()
		code := run(ctx, []string{"console", "--listen", net.JoinHostPort(ip, port)}, &stdout, &stderr)
		if code != exitUsage || !strings.Contains(stderr.String(), "is not a loopback address") {
			t.Fatalf("on %s: exit %d, stderr:\n%s", ip, code, stderr.String())
		}
	}
	stderr.Reset()
	if code := run(t.Context(), []string{"console", "--admin-token", "has blank"}, &stdout, &stderr); code != exitUsage {
		t.Fatalf("a token with a blank: exit %d\n%s", code, stderr.String())
	}

	const token = "c0nsole-t0ken"
	for _, viaEnv := range []bool{false, true} {
		args := []string{"console", "--listen", "0.0.0.0:" + port, "--log-format", "json"}
		if viaEnv {
			t.Setenv(adminTokenEnv, token)
		} else {
			args = append(args, "--admin-token", token)
		}
		p := startInProc(t, args...)
		rec := p.stderr.waitJSON(t, "console listening", p.done)
		if rec["admin_token"] != true || strings.Contains(p.stderr.String(), token) {
			t.Fatalf("listening line %v (the token must not be logged)\n%s", rec, p.stderr.String())
		}
		url := "http://127.0.0.1:" + port + "/"
		if code, _ := adminDo(t, "GET", url, "", ""); code != 401 {
			t.Fatalf("env %v: without the token: %d, want 401", viaEnv, code)
		}
		if code, body := adminDo(t, "GET", url, "Bearer "+token, ""); code != 200 || !strings.Contains(body, "planning only") {
			t.Fatalf("env %v: with the token: %d", viaEnv, code)
		}
		req, _ := http.NewRequestWithContext(context.Background(), "GET", url, nil)
		req.SetBasicAuth("anyone", token)
		if code, _ := adminDo(t, "GET", url, req.Header.Get("Authorization"), ""); code != 200 {
			t.Fatalf("env %v: with the token as a Basic password: %d", viaEnv, code)
		}
		if code := p.stop(); code != exitOK {
			t.Fatalf("exit %d\n%s", code, p.stderr.String())
		}
	}
}
