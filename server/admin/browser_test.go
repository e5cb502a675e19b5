package admin

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/chromedp/chromedp/kb"

	"github.com/ticketing-dev/ticketing/broker"
	"github.com/ticketing-dev/ticketing/internal/browsertest"
	"github.com/ticketing-dev/ticketing/server"
)

// serveAdmin serves h on 127.0.0.1 (a real listener, as ticketingd's
// admin listener) until the test ends, and returns its base URL.
func serveAdmin(t *testing.T, h http.Handler) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	hs := &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second}
	served := make(chan error, 1)
	go func() { served <- hs.Serve(ln) }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		if err := hs.Shutdown(ctx); err != nil {
			_ = hs.Close() // an event stream the browser kept open
		}
		<-served
	})
	return "http://" + ln.Addr().String()
}

// TestBrowserConsoleLive opens the console of a real in-process server in
// headless chromium, behind an admin token sent as the browser would
// after asking (Basic), and watches its numbers change live as a broker
// takes locks: sessions, held locks, grants, the last token and grants
// per second, with no reload. Then the page on a phone's screen must not
// scroll sideways.
func TestBrowserConsoleLive(t *testing.T) {
	tab := browsertest.New(t)
	const token = "br0wser-t0ken"
	srv, addr := startServer(t, server.Config{DataDir: t.TempDir()})
	base := serveAdmin(t, New(srv, Options{Token: token, Build: &BuildInfo{Version: "v0.0.0-test", GoVersion: "go"}}))

	browsertest.SetHeaders(t, tab, map[string]string{"Authorization": browsertest.BasicAuth("operator", token)})
	browsertest.Do(t, tab, chromedp.Navigate(base+"/"))
	const describe = `[...document.querySelectorAll("dd[data-k]")].map(e => e.dataset.k + "=" + e.textContent).join(", ") + "; " + document.getElementById("conn").textContent`
	browsertest.WaitJS(t, tab, `document.getElementById("conn").textContent === "Live" &&
		document.querySelector('[data-k="role"]').textContent === "standalone" &&
		document.querySelector('[data-k="held_locks"]').textContent === "0"`, describe, 30*time.Second)
	if v := browsertest.Eval[string](t, tab, `document.getElementById("version").textContent`); v != "v0.0.0-test" {
		t.Errorf("version %q", v)
	}

	b, err := broker.New(broker.Config{Addrs: []string{addr}, Name: "browser-test"})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second) // a hang guard
	defer cancel()
	if err := b.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}
	var last uint64
	for i := range 3 {
		tk, err := b.Acquire(ctx, fmt.Sprintf("orders/%d", i), 0, time.Minute, 0)
		if err != nil {
			t.Fatal(err)
		}
		last = tk.Token()
	}
	browsertest.WaitJS(t, tab, fmt.Sprintf(`document.querySelector('[data-k="held_locks"]').textContent === "3" &&
		document.querySelector('[data-k="grants"]').textContent === "3" &&
		document.querySelector('[data-k="sessions"]').textContent !== "0" &&
		document.querySelector('[data-k="last_token"]').textContent === %q &&
		document.querySelector('[data-k="grant_wait"]').textContent.includes(" ms") &&
		Number(document.querySelector('[data-k="grants_per_s"]').textContent) > 0`,
		fmt.Sprintf("%d", last)), describe, 30*time.Second)
	browsertest.Screenshot(t, tab, "console.png")

	// Keyboard only: Tab from the top of the page reaches the skip link,
	// the navigation and then the pause button; Enter presses it. Paused,
	// the page keeps its numbers; resumed, it catches up.
	tabTo(t, tab, "pause", 10)
	browsertest.Do(t, tab, chromedp.KeyEvent(kb.Enter))
	if _, err := b.Acquire(ctx, "orders/paused", 0, time.Minute, 0); err != nil {
		t.Fatal(err)
	}
	browsertest.WaitJS(t, tab, `document.getElementById("conn").textContent === "Paused"`, describe, 10*time.Second)
	time.Sleep(1500 * time.Millisecond) // an event or more arrives meanwhile
	if got := browsertest.Eval[string](t, tab, `document.querySelector('[data-k="held_locks"]').textContent`); got != "3" {
		t.Errorf("paused: held locks %q, want 3 still", got)
	}
	browsertest.Do(t, tab, chromedp.KeyEvent(kb.Enter)) // the button still has the focus
	browsertest.WaitJS(t, tab, `document.querySelector('[data-k="held_locks"]').textContent === "4"`, describe, 30*time.Second)

	// A phone's screen: no sideways scrolling.
	browsertest.Do(t, tab, chromedp.EmulateViewport(390, 844, chromedp.EmulateScale(3), chromedp.EmulateMobile))
	browsertest.WaitJS(t, tab, `document.documentElement.scrollWidth <= window.innerWidth`,
		`document.documentElement.scrollWidth + " > " + window.innerWidth`, 10*time.Second)
	browsertest.Screenshot(t, tab, "console-phone.png")
}

// tabTo presses Tab from the top of the page until the element with the
// id has the focus, at most max times.
func tabTo(t *testing.T, tab context.Context, id string, max int) {
	t.Helper()
	browsertest.Do(t, tab, chromedp.Evaluate[chromedp.Void](`document.activeElement && document.activeElement.blur(); window.focus()`))
	var seen []string
	for range max {
		browsertest.Do(t, tab, chromedp.KeyEvent(kb.Tab))
		got := browsertest.Eval[string](t, tab, `(document.activeElement.id || document.activeElement.tagName) + ":" + document.activeElement.textContent.trim().slice(0, 40)`)
		seen = append(seen, got)
		if strings.HasPrefix(got, id+":") {
			return
		}
	}
	t.Fatalf("%d Tabs did not reach #%s; focus went to %q", max, id, seen)
}

// TestBrowserConsoleAsksForToken: without the admin token the browser
// gets 401 with a Basic challenge, which a browser answers by asking for
// a login (headless, it cannot ask, and the navigation fails with
// ERR_INVALID_AUTH_CREDENTIALS; with a Bearer challenge alone it would
// show the 401 page).
func TestBrowserConsoleAsksForToken(t *testing.T) {
	tab := browsertest.New(t)
	srv, _ := startServer(t, server.Config{DataDir: t.TempDir()})
	base := serveAdmin(t, New(srv, Options{Token: "s3cret"}))
	ctx, cancel := context.WithTimeout(tab, time.Minute)
	defer cancel()
	resp, err := chromedp.RunResponse(ctx, chromedp.Navigate(base+"/"))
	if err == nil || !strings.Contains(err.Error(), "ERR_INVALID_AUTH_CREDENTIALS") {
		t.Fatalf("navigation without the token: response %+v, error %v; want the browser's auth error", resp, err)
	}
}
