package admin

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/ticketing-dev/ticketing/internal/wire"
	"github.com/ticketing-dev/ticketing/server"
)

const lockToken = "s3cret"

var authz = map[string]string{"Authorization": "Bearer " + lockToken}

func decode[T any](t *testing.T, body *bytes.Buffer) T {
	t.Helper()
	var v T
	if err := json.Unmarshal(body.Bytes(), &v); err != nil {
		t.Fatalf("decode %s: %v", body, err)
	}
	return v
}

// TestLockBrowserOffOrWithoutToken: off (the default), every route
// answers 404 with JSON saying how to turn it on; on without an admin
// token, 403: the browser always requires the token, on loopback too.
func TestLockBrowserOffOrWithoutToken(t *testing.T) {
	srv, _ := startServer(t, server.Config{DataDir: t.TempDir()})
	off := New(srv, Options{Token: lockToken})
	noToken := New(srv, Options{ConsoleKeys: true})
	for _, rt := range []struct{ method, path string }{{"GET", "/v1/locks"}, {"GET", "/v1/locks/k"}, {"POST", "/v1/locks/k/expire"}} {
		rec := do(off, rt.method, rt.path, map[string]string{"Authorization": "Bearer " + lockToken, "Content-Type": "application/json"}, `{"token":1}`)
		if e := decode[ErrorResponse](t, rec.Body); rec.Code != http.StatusNotFound || !strings.Contains(e.Error, "--console-keys") {
			t.Errorf("off: %s %s: %d %s", rt.method, rt.path, rec.Code, rec.Body)
		}
		rec = do(noToken, rt.method, rt.path, map[string]string{"Host": "127.0.0.1", "Content-Type": "application/json"}, `{"token":1}`)
		if e := decode[ErrorResponse](t, rec.Body); rec.Code != http.StatusForbidden || !strings.Contains(e.Error, "--admin-token") {
			t.Errorf("on, no admin token: %s %s: %d %s", rt.method, rt.path, rec.Code, rec.Body)
		}
	}
}

// TestLockBrowser: with --console-keys and the token: 401 without it or
// with a wrong one; pages by prefix and cursor; keys with '/', '%',
// spaces, dots and bytes that are not UTF-8 round-trip through the path
// and key_b64; the queue in FIFO order with the sessions.
func TestLockBrowser(t *testing.T) {
	srv, addr := startServer(t, server.Config{DataDir: t.TempDir()})
	h := New(srv, Options{Token: lockToken, ConsoleKeys: true})
	for _, hd := range []map[string]string{nil, {"Authorization": "Bearer wrong"}} {
		for _, p := range []string{"/v1/locks", "/v1/locks/k"} {
			if rec := do(h, "GET", p, hd, ""); rec.Code != http.StatusUnauthorized {
				t.Errorf("GET %s with %v: %d, want 401", p, hd, rec.Code)
			}
		}
	}

	keys := []string{"a/b", "a/50%", "a/with space", "a/\xff\x00bin", "a/..", ".", "b"}
	holder := dialWire(t, addr)
	tokens := map[string]uint64{}
	for _, k := range keys {
		r, err := holder.acquire(k, 0, 60)
		if err != nil || r.Type != wire.TypeGranted {
			t.Fatalf("acquire %q: %v %v", k, r.Type, err)
		}
		tokens[k] = r.Token
	}
	// Every key of prefix a/, two at a time, in byte order.
	var got []string
	q := url.Values{"prefix": {"a/"}, "limit": {"2"}}
	for page := 0; ; page++ {
		rec := do(h, "GET", "/v1/locks?"+q.Encode(), authz, "")
		resp := decode[LocksResponse](t, rec.Body)
		if rec.Code != 200 || resp.View != server.ViewStandalone || len(resp.Locks) > 2 || page > 3 || rec.Header().Get("Cache-Control") != "no-store" {
			t.Fatalf("page %d: %d %s", page, rec.Code, rec.Body)
		}
		for _, l := range resp.Locks {
			k, err := base64.StdEncoding.DecodeString(l.KeyB64)
			if err != nil || l.Token != tokens[string(k)] || l.TokenText != fmt.Sprint(l.Token) || l.Holder == nil || l.Holder.Name != "admin-test" ||
				l.LeaseLeftMS == nil || *l.LeaseLeftMS <= 0 || l.LeaseS != 60 {
				t.Fatalf("lock %+v", l)
			}
			if want := string(k); l.Key != want && !(l.Key == "" && want == "a/\xff\x00bin") {
				t.Fatalf("key %q, key_b64 %q", l.Key, k)
			}
			got = append(got, string(k))
		}
		if !resp.More {
			break
		}
		q.Del("after")
		q.Del("after_b64")
		q.Set("after_b64", resp.NextB64)
	}
	if want := []string{"a/..", "a/50%", "a/b", "a/with space", "a/\xff\x00bin"}; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("pages: %q, want %q", got, want)
	}
	if rec := do(h, "GET", "/v1/locks?limit=0", authz, ""); rec.Code != http.StatusBadRequest {
		t.Errorf("limit=0: %d", rec.Code)
	}

	// One key each, by its escaped path.
	for _, k := range keys {
		rec := do(h, "GET", LockPath(k), authz, "")
		resp := decode[LockResponse](t, rec.Body)
		if rec.Code != 200 || resp.KeyB64 != base64.StdEncoding.EncodeToString([]byte(k)) || resp.Token != tokens[k] {
			t.Errorf("GET %s: %d %s", LockPath(k), rec.Code, rec.Body)
		}
	}
	if rec := do(h, "GET", LockPath("a/none"), authz, ""); rec.Code != http.StatusNotFound {
		t.Errorf("a key not held: %d %s", rec.Code, rec.Body)
	}

	// The queue, oldest first, each with its session.
	w1, w2 := dialWire(t, addr), dialWire(t, addr)
	for _, w := range []*wireClient{w1, w2} {
		go w.acquire("b", 30, 10) // (queued: the answer comes later)
		time.Sleep(50 * time.Millisecond)
	}
	var lr LockResponse
	for deadline := time.Now().Add(5 * time.Second); len(lr.Queue) < 2 && time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		lr = decode[LockResponse](t, do(h, "GET", "/v1/locks/b", authz, "").Body)
	}
	if len(lr.Queue) != 2 || lr.Waiters != 2 || lr.Queue[0].Session == nil || lr.Queue[0].Session.Addr != w1.c.LocalAddr().String() ||
		lr.Queue[1].Session.Addr != w2.c.LocalAddr().String() || lr.Queue[0].LeaseS != 10 || lr.Queue[0].WaitLeftMS <= 0 ||
		time.Until(lr.Queue[0].WaitEnd) > 31*time.Second || time.Until(lr.Queue[0].WaitEnd) < 0 {
		t.Fatalf("queue of b: %+v", lr)
	}
}

// TestExpireNow: POST /v1/locks/{key}/expire with the token: 409 for
// another token, 404 for a key not held, 200 when it applies (the waiter
// holds the key with a higher token, and the old holder's RELEASE gets
// N); logged with the remote address and the operator; 415 without a
// JSON body type, 400 without a token.
func TestExpireNow(t *testing.T) {
	var logs bytes.Buffer
	srv, addr := startServer(t, server.Config{DataDir: t.TempDir(), Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	h := New(srv, Options{Token: lockToken, ConsoleKeys: true})
	key := "jobs/nightly report"
	holder, waiter := dialWire(t, addr), dialWire(t, addr)
	r, err := holder.acquire(key, 0, 60)
	if err != nil || r.Type != wire.TypeGranted {
		t.Fatal(r, err)
	}
	granted := make(chan wire.Response, 1)
	go func() {
		g, _ := waiter.acquire(key, 30, 10)
		granted <- g
	}()
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if d, err := srv.Lock(context.Background(), key); err == nil && d.Waiters == 1 || time.Now().After(deadline) {
			break
		}
	}
	hd := map[string]string{"Authorization": "Bearer " + lockToken, "Content-Type": "application/json", OperatorHeader: "alice"}
	path := LockPath(key) + "/expire"
	if rec := do(h, "POST", path, hd, fmt.Sprintf(`{"token": %d}`, r.Token+5)); rec.Code != http.StatusConflict {
		t.Errorf("another token: %d %s", rec.Code, rec.Body)
	}
	if rec := do(h, "POST", LockPath("jobs/none")+"/expire", hd, `{"token": 1}`); rec.Code != http.StatusNotFound {
		t.Errorf("not held: %d %s", rec.Code, rec.Body)
	}
	if rec := do(h, "POST", path, hd, `{}`); rec.Code != http.StatusBadRequest {
		t.Errorf("no token: %d %s", rec.Code, rec.Body)
	}
	if rec := do(h, "POST", path, authz, fmt.Sprintf(`{"token": %d}`, r.Token)); rec.Code != http.StatusUnsupportedMediaType {
		t.Errorf("no JSON content type: %d %s", rec.Code, rec.Body)
	}
	select {
	case g := <-granted:
		t.Fatalf("the waiter answered before the expiry: %+v", g)
	default:
	}
	// The token as text (what a JavaScript page sends).
	rec := do(h, "POST", path, hd, fmt.Sprintf(`{"token": "%d"}`, r.Token))
	resp := decode[ExpireResponse](t, rec.Body)
	if rec.Code != 200 || !resp.Expired || uint64(resp.Token) != r.Token || resp.Key != key {
		t.Fatalf("expire: %d %s", rec.Code, rec.Body)
	}
	g := <-granted
	if g.Type != wire.TypeGranted || g.Token <= r.Token || resp.Now == nil || resp.Now.Token != g.Token {
		t.Fatalf("the waiter: %+v (after %d); the answer's holding %+v", g, r.Token, resp.Now)
	}
	if n, err := holder.do(&wire.Request{Type: wire.TypeRelease, Token: r.Token, Key: []byte(key)}); err != nil || n.Type != wire.TypeNotHeld {
		t.Fatalf("the old holder's RELEASE: %v %v, want N", n.Type, err)
	}
	for _, want := range []string{"level=WARN", "expire now", `operator \"alice\"`, "remote 192.0.2.1:1234", "token=" + fmt.Sprint(r.Token), "result=expired"} {
		if !strings.Contains(logs.String(), want) {
			t.Errorf("the log does not say %q:\n%s", want, logs.String())
		}
	}
	if strings.Contains(logs.String(), lockToken) {
		t.Error("the admin token is in a log")
	}
}

// fakeLocks answers ExpireLock with err (a node that does not serve).
type fakeLocks struct {
	fakeNode
	err error
}

func (f *fakeLocks) Locks(context.Context, server.LockQuery) (server.LockPage, error) {
	return server.LockPage{View: server.ViewFollowerApplied}, nil
}

func (f *fakeLocks) Lock(context.Context, string) (server.LockDetail, error) {
	return server.LockDetail{}, server.ErrLockNotFound
}

func (f *fakeLocks) ExpireLock(context.Context, string, uint64, string) error { return f.err }

// TestExpireNowMisdirected: a follower's and a passive's refusal is 421
// naming the leader (with its client address) or the active.
func TestExpireNowMisdirected(t *testing.T) {
	hd := map[string]string{"Authorization": "Bearer " + lockToken, "Content-Type": "application/json"}
	fl := &fakeLocks{err: &server.NotLeaderError{Leader: "n2", LeaderAddress: "10.0.0.2:7000"}}
	fl.status = server.ClusterStatus{Leader: "n2", LeaderAdvertise: "10.0.0.2:5225"}
	rec := do(newHandler(fl, fl, fl, Options{Token: lockToken, ConsoleKeys: true}), "POST", "/v1/locks/k/expire", hd, `{"token": 3}`)
	m := decode[MisdirectedResponse](t, rec.Body)
	if rec.Code != http.StatusMisdirectedRequest || m.Leader != "n2" || m.LeaderAddress != "10.0.0.2:7000" || m.LeaderAdvertise != "10.0.0.2:5225" || !strings.Contains(m.Error, "n2") {
		t.Errorf("follower: %d %s", rec.Code, rec.Body)
	}
	fp := &fakeLocks{err: &server.NotActiveError{Active: "10.0.0.1:5225"}}
	rec = do(newHandler(fp, nil, fp, Options{Token: lockToken, ConsoleKeys: true}), "POST", "/v1/locks/k/expire", hd, `{"token": 3}`)
	m = decode[MisdirectedResponse](t, rec.Body)
	if rec.Code != http.StatusMisdirectedRequest || m.Active != "10.0.0.1:5225" || !strings.Contains(m.Error, "10.0.0.1:5225") {
		t.Errorf("passive: %d %s", rec.Code, rec.Body)
	}
}
