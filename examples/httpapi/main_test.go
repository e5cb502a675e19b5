package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/goleak"

	"github.com/ticketing-dev/ticketing/broker"
	"github.com/ticketing-dev/ticketing/server"
	"github.com/ticketing-dev/ticketing/server/servertest"
)

// TestMain runs the tests, says in one line how many skipped for want of
// a database and how to run them (go test ./... would otherwise print only
// "ok"), and checks that no goroutine outlived them.
func TestMain(m *testing.M) {
	code := m.Run()
	if n := skippedNoDSN.Load(); n > 0 {
		servertest.Notice(fmt.Sprintf("httpapi: %d test(s) skipped: %s is not set (%s); go test -v lists them", n, postgresDSNEnv, "a PostgreSQL URL whose user may create databases, e.g. postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"))
	}
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintf(os.Stderr, "goleak: %v\n", err)
			code = 1
		}
	}
	os.Exit(code)
}

// lockServer starts an in-process Ticketing server.
func lockServer(t *testing.T) *servertest.Server {
	t.Helper()
	return servertest.Start(t, server.Config{})
}

func newBroker(t *testing.T, addr string, wait bool) *broker.Broker {
	t.Helper()
	b, err := broker.New(broker.Config{Addrs: []string{addr}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := b.Close(); err != nil {
			t.Error(err)
		}
	})
	if wait {
		if err := b.WaitReady(t.Context()); err != nil {
			t.Fatal(err)
		}
	}
	return b
}

// fixture is a database with the schema, a lock server, and an API.
type fixture struct {
	pool *pgxpool.Pool
	srv  *servertest.Server // lock server
	addr string             // its address
	api  *API
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	pool, err := pgxpool.New(t.Context(), testPostgres(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	if err := setUp(t.Context(), pool); err != nil {
		t.Fatal(err)
	}
	f := &fixture{pool: pool, srv: lockServer(t)}
	f.addr = f.srv.Addr()
	f.api = &API{DB: pool, Locks: newBroker(t, f.addr, true), Log: testLogger(t)}
	return f
}

// serve runs api on an httptest server and returns its URL.
func serve(t *testing.T, api *API) string {
	t.Helper()
	ts := httptest.NewServer(api.Handler())
	t.Cleanup(ts.Close)
	return ts.URL
}

type reply struct {
	status     int
	retryAfter string
	code       string // of an error
	order      Order  // of a 200
}

func post(t *testing.T, url string) reply {
	return do(t, http.MethodPost, url)
}

func do(t *testing.T, method, url string) reply {
	return doCtx(t.Context(), t, method, url)
}

func doCtx(ctx context.Context, t *testing.T, method, url string) reply {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, method, url, nil)
	if err != nil {
		t.Error(err)
		return reply{}
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Error(err)
		return reply{}
	}
	defer resp.Body.Close()
	r := reply{status: resp.StatusCode, retryAfter: resp.Header.Get("Retry-After")}
	if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
		t.Errorf("%s %s: Content-Type %q", method, url, ct)
	}
	if r.status == http.StatusOK {
		err = json.NewDecoder(resp.Body).Decode(&r.order)
	} else {
		var e struct{ Error, Code string }
		err = json.NewDecoder(resp.Body).Decode(&e)
		if err == nil && (e.Error == "" || e.Code == "") {
			t.Errorf("%s %s: %d with error %+v, want both fields", method, url, r.status, e)
		}
		r.code = e.Code
	}
	if err != nil {
		t.Errorf("%s %s: decoding the body: %v", method, url, err)
	}
	return r
}

// charges returns how many payments the order has, and the order's status.
func (f *fixture) charges(t *testing.T, id int64) (n int, status string) {
	t.Helper()
	err := f.pool.QueryRow(t.Context(),
		"SELECT (SELECT count(*) FROM ticketing_example_payments WHERE order_id = $1), status FROM ticketing_example_orders WHERE id = $1", id).Scan(&n, &status)
	if err != nil {
		t.Fatal(err)
	}
	return n, status
}

func TestPay(t *testing.T) {
	f := newFixture(t)
	url := serve(t, f.api)

	first := post(t, url+"/orders/1/pay")
	if first.status != http.StatusOK || first.order.Status != "paid" || first.order.Payment == nil ||
		first.order.AmountCents != 1999 || first.order.Payment.Token < 1 {
		t.Fatalf("first pay: %+v", first)
	}
	if again := post(t, url+"/orders/1/pay"); again.status != http.StatusConflict || again.code != "already_paid" {
		t.Errorf("second pay: %+v, want 409 already_paid", again)
	}
	if n, status := f.charges(t, 1); n != 1 || status != "paid" {
		t.Errorf("order 1: %d charges, status %s", n, status)
	}
	if got := do(t, http.MethodGet, url+"/orders/1"); got.status != http.StatusOK || got.order.Payment == nil ||
		got.order.Payment.ID != first.order.Payment.ID {
		t.Errorf("GET: %+v", got)
	}

	for _, tc := range []struct {
		name, path string
		status     int
		code       string
	}{
		{"not a number", "/orders/abc/pay", http.StatusBadRequest, "invalid_id"},
		{"zero", "/orders/0/pay", http.StatusBadRequest, "invalid_id"},
		{"negative", "/orders/-3/pay", http.StatusBadRequest, "invalid_id"},
		{"too large", "/orders/99999999999999999999/pay", http.StatusBadRequest, "invalid_id"},
		{"unknown", "/orders/404/pay", http.StatusNotFound, "not_found"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := post(t, url+tc.path); got.status != tc.status || got.code != tc.code {
				t.Errorf("%+v, want %d %s", got, tc.status, tc.code)
			}
		})
	}
}

// TestPayConcurrently: 20 requests for one order at once charge it once;
// every other request is told it is already paid.
func TestPayConcurrently(t *testing.T) {
	f := newFixture(t)
	url := serve(t, f.api)
	const n = 20
	replies := make([]reply, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { replies[i] = post(t, url+"/orders/2/pay") })
	}
	wg.Wait()
	ok := 0
	for _, r := range replies {
		switch {
		case r.status == http.StatusOK:
			ok++
		case r.status == http.StatusConflict && r.code == "already_paid":
		default:
			t.Errorf("reply %+v, want 200 or 409 already_paid", r)
		}
	}
	if charges, status := f.charges(t, 2); ok != 1 || charges != 1 || status != "paid" {
		t.Errorf("%d OK replies, %d charges, status %s; want exactly one", ok, charges, status)
	}
}

// TestStaleHighWater: a newer lock holder has already written for the
// order (its high-water is above any token this server will hand out
// soon): the request is refused as stale and nothing is charged.
func TestStaleHighWater(t *testing.T) {
	f := newFixture(t)
	url := serve(t, f.api)
	if _, err := f.pool.Exec(t.Context(),
		"INSERT INTO ticketing_fence (resource, high_water, updated_at) VALUES ($1, $2, now())",
		[]byte("order:3"), int64(1)<<62); err != nil { // above the clock start (at most 2^60)
		t.Fatal(err)
	}
	if got := post(t, url+"/orders/3/pay"); got.status != http.StatusConflict || got.code != "stale_lock" {
		t.Errorf("%+v, want 409 stale_lock", got)
	}
	if n, status := f.charges(t, 3); n != 0 || status != "pending" {
		t.Errorf("order 3: %d charges, status %s; want none", n, status)
	}
}

// TestStalledReplica: replica A gets the order's lock and stalls past its
// 1 s lease; replica B gets the lock when A's lease ends and charges the
// order; A wakes up and is refused as stale. One charge.
func TestStalledReplica(t *testing.T) {
	f := newFixture(t)
	bPaid := make(chan struct{})
	aLocked := make(chan struct{})
	a := &API{DB: f.pool, Locks: f.api.Locks, Log: f.api.Log, Lease: time.Second,
		afterLock: func(context.Context) {
			close(aLocked)
			<-bPaid // stalls until B has paid, long after its lease
		}}
	b := &API{DB: f.pool, Locks: newBroker(t, f.addr, true), Log: f.api.Log, Lease: time.Second}
	urlA, urlB := serve(t, a), serve(t, b)

	aReply := make(chan reply, 1)
	go func() { aReply <- post(t, urlA+"/orders/3/pay") }()
	select {
	case <-aLocked:
	case r := <-aReply:
		t.Fatalf("A replied %+v before getting the lock", r)
	}
	rb := post(t, urlB+"/orders/3/pay") // waits in the lock server's queue until A's lease ends
	close(bPaid)
	ra := <-aReply
	if rb.status != http.StatusOK {
		t.Errorf("B: %+v, want 200", rb)
	}
	if ra.status != http.StatusConflict || ra.code != "stale_lock" {
		t.Errorf("A: %+v, want 409 stale_lock", ra)
	}
	if n, status := f.charges(t, 3); n != 1 || status != "paid" {
		t.Errorf("order 3: %d charges, status %s; want one", n, status)
	}
}

// TestLockServerDown: with no session to the lock server, a payment is
// refused at once with 503 and Retry-After, and nothing is charged.
func TestLockServerDown(t *testing.T) {
	f := newFixture(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	down := ln.Addr().String()
	if err := ln.Close(); err != nil { // nothing listens there now
		t.Fatal(err)
	}
	api := &API{DB: f.pool, Locks: newBroker(t, down, false), Log: f.api.Log}
	got := post(t, serve(t, api)+"/orders/1/pay")
	if got.status != http.StatusServiceUnavailable || got.code != "lock_unavailable" || got.retryAfter == "" {
		t.Errorf("%+v, want 503 lock_unavailable with Retry-After", got)
	}
	if n, _ := f.charges(t, 1); n != 0 {
		t.Errorf("%d charges, want none", n)
	}
}

// testLogger logs to t.
func testLogger(t *testing.T) *slog.Logger {
	return slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelDebug}))
}

// TestClientHangsUp: a client hangs up while its request waits for a lock.
// Its Acquire has its own context (see pay), so the hang-up cancels
// nothing on the broker: the six requests waiting for other orders on the
// same broker are all paid. (With the request's context as the Acquire's,
// the cancellation closed the broker's session to a version-1 server and
// turned the waiters on it indeterminate: 503 lock_indeterminate.)
func TestClientHangsUp(t *testing.T) {
	f := newFixture(t)
	const first, n = 10, 7 // orders 10..16; 10's client hangs up
	for id := first; id < first+n; id++ {
		if _, err := f.pool.Exec(t.Context(), "INSERT INTO ticketing_example_orders (id, amount_cents) VALUES ($1, 100)", id); err != nil {
			t.Fatal(err)
		}
	}
	// Another replica holds every order's lock for now.
	other := newBroker(t, f.addr, true)
	held := make([]*broker.Ticket, 0, n)
	for id := first; id < first+n; id++ {
		tk, err := other.Acquire(t.Context(), fmt.Sprintf("order:%d", id), broker.AcquireOptions{Lease: 30 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, tk)
	}

	hungUp := make(chan struct{}) // the hung-up request's handler returned
	h := f.api.Handler()
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h.ServeHTTP(w, r)
		if r.URL.Path == fmt.Sprintf("/orders/%d/pay", first) {
			close(hungUp)
		}
	}))
	t.Cleanup(ts.Close)

	clientCtx, hangUp := context.WithCancel(t.Context())
	go func() {
		req, _ := http.NewRequestWithContext(clientCtx, http.MethodPost, fmt.Sprintf("%s/orders/%d/pay", ts.URL, first), nil)
		if resp, err := http.DefaultClient.Do(req); err == nil {
			resp.Body.Close()
		}
	}()
	replies := make([]reply, n-1)
	var wg sync.WaitGroup
	for i := range n - 1 {
		wg.Go(func() { replies[i] = post(t, fmt.Sprintf("%s/orders/%d/pay", ts.URL, first+1+i)) })
	}
	for f.srv.Server().Stats().Waiters < n { // every request waits in the lock server's queue
		time.Sleep(5 * time.Millisecond)
	}
	hangUp()
	select { // long enough for a cancellation to close a session
	case <-hungUp:
	case <-time.After(500 * time.Millisecond):
	}
	for _, tk := range held {
		if err := tk.Release(t.Context()); err != nil {
			t.Fatal(err)
		}
	}
	wg.Wait()
	<-hungUp
	failed := 0
	for i, r := range replies {
		if r.status != http.StatusOK {
			failed++
			t.Errorf("order %d: %+v, want 200", first+1+i, r)
		}
	}
	t.Logf("%d of %d requests for other orders failed after one client hung up", failed, n-1)
}

// startRun runs the program (run) with env in the background and returns
// its HTTP address, and stop, which ends it and returns its error.
func startRun(t *testing.T, env map[string]string) (addr string, stop func() error) {
	ctx, cancel := context.WithCancel(t.Context())
	addrC := make(chan string, 1)
	done := make(chan error, 1)
	go func() { done <- run(ctx, testLogger(t), envOf(env), func(a string) { addrC <- a }) }()
	stop = func() error {
		cancel()
		return <-done
	}
	select {
	case addr = <-addrC:
	case err := <-done:
		t.Fatalf("run: %v", err)
	}
	return "http://" + addr, stop
}

// TestRunTLS: the program reaches a lock server set up as ticketingd init
// --tls sets one up (TLS with a private CA, a client token) with nothing
// but TICKETING_URL, and charges an order.
func TestRunTLS(t *testing.T) {
	_, lockURL := tlsServer(t)
	url, stop := startRun(t, map[string]string{
		"DATABASE_URL":  testPostgres(t),
		"TICKETING_URL": lockURL,
		"LISTEN_ADDR":   "127.0.0.1:0",
	})
	if got := post(t, url+"/orders/1/pay"); got.status != http.StatusOK || got.order.Status != "paid" {
		t.Errorf("pay: %+v, want 200 paid", got)
	}
	if got := post(t, url+"/orders/1/pay"); got.status != http.StatusConflict || got.code != "already_paid" {
		t.Errorf("pay again: %+v, want 409 already_paid", got)
	}
	if err := stop(); err != nil {
		t.Error(err)
	}
}

// TestRunRefused: a wrong token or a CA file that does not hold the
// server's CA stops the program at start (a refusal for good), instead of
// serving 503s.
func TestRunRefused(t *testing.T) {
	for url, want := range refusedURLs(t) {
		t.Run(want.Error(), func(t *testing.T) {
			ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second) // fails, not hangs, if run does not stop
			defer cancel()
			err := run(ctx, testLogger(t), envOf(map[string]string{
				"DATABASE_URL": testPostgres(t), "TICKETING_URL": url, "LISTEN_ADDR": "127.0.0.1:0",
			}), nil)
			if !errors.Is(err, want) {
				t.Errorf("run: %v, want %v", err, want)
			}
		})
	}
}

// TestUnsentRetriedSoon: a payment that finds no ready session (the lock
// server just (re)starting) waits for one, briefly, and retries: 200, not
// 503. The broker's first dial has failed; it redials 150-300 ms later,
// after the request's Acquire has met no session.
func TestUnsentRetriedSoon(t *testing.T) {
	f := newFixture(t)
	later := laterServer(t)
	addr := later.Addr()
	locks, err := broker.New(broker.Config{Addrs: []string{addr}, BackoffMin: 300 * time.Millisecond, BackoffMax: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := locks.Close(); err != nil {
			t.Error(err)
		}
	})
	for { // until the first dial has been refused
		ctx, cancel := context.WithTimeout(t.Context(), 10*time.Millisecond)
		err := locks.WaitReady(ctx)
		cancel()
		if err == nil {
			t.Fatal("ready without a server")
		}
		if strings.Contains(err.Error(), "refused") {
			break
		}
	}
	api := &API{DB: f.pool, Locks: locks, Log: f.api.Log}
	url := serve(t, api)
	later.Restart(t)
	if got := post(t, url+"/orders/1/pay"); got.status != http.StatusOK {
		t.Errorf("%+v, want 200", got)
	}
}

// TestSetUpIncompatibleTable: a table of the example's name that is not
// the example's (another application's, an older layout) makes setUp
// fail, naming the table and the missing columns, instead of being kept
// silently (CREATE TABLE IF NOT EXISTS) and failing later on a column.
func TestSetUpIncompatibleTable(t *testing.T) {
	pool, err := pgxpool.New(t.Context(), testPostgres(t))
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	if _, err := pool.Exec(t.Context(), "CREATE TABLE ticketing_example_orders (id BIGINT PRIMARY KEY, total_cents BIGINT)"); err != nil {
		t.Fatal(err)
	}
	err = setUp(t.Context(), pool)
	if err == nil || !strings.Contains(err.Error(), "a table ticketing_example_orders already exists without the column(s) amount_cents, status") {
		t.Fatalf("setUp: %v, want a clear refusal of the existing table", err)
	}
	if err := setUp(t.Context(), pool); err == nil {
		t.Fatal("setUp succeeded on a second try")
	}
}

// TestLockConfig: TICKETING_URL is the one setting, the token included; a
// TICKETING_TOKEN in the environment (which earlier versions of
// ticketingd init printed) is not read.
func TestLockConfig(t *testing.T) {
	cfg, err := lockConfig(envOf(nil), "httpapi")
	if err != nil || len(cfg.Addrs) != 1 || cfg.Addrs[0] != "127.0.0.1:5225" || cfg.Token != "" || cfg.Name != "httpapi" {
		t.Errorf("default: %+v, %v", cfg, err)
	}
	cfg, err = lockConfig(envOf(map[string]string{"TICKETING_URL": "ticketing://tok@a?ca=/etc/ticketing/ca.pem", "TICKETING_TOKEN": "other"}), "httpapi")
	if err != nil || cfg.Token != "tok" || cfg.TLS.Mode != broker.TLSCAFile {
		t.Errorf("URL with a token and TICKETING_TOKEN: token %q, %+v, %v; want the URL's, TICKETING_TOKEN unread", cfg.Token, cfg.TLS, err)
	}
	cfg, err = lockConfig(envOf(map[string]string{"TICKETING_URL": "ticketing://a", "TICKETING_TOKEN": "other"}), "httpapi")
	if err != nil || cfg.Token != "" {
		t.Errorf("URL without a token and TICKETING_TOKEN: token %q, %v; want none, TICKETING_TOKEN unread", cfg.Token, err)
	}
}
