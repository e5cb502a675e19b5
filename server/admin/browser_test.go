package admin

import (
	"archive/zip"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"runtime"
	"slices"
	"strings"
	"sync"
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
		tk, err := b.Acquire(ctx, fmt.Sprintf("orders/%d", i), broker.AcquireOptions{Lease: time.Minute})
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
	if _, err := b.Acquire(ctx, "orders/paused", broker.AcquireOptions{Lease: time.Minute}); err != nil {
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

// TestBrowserDeployPage fills the deployment form in headless chromium,
// typing and clicking: a cluster with a node's host missing and a
// relative directory gets its messages beside those fields and a summary
// on top in the page's order, each going as its field is edited; the
// token-start select shows its options whole. Put right, it previews every file with the secrets masked until "Show
// secrets", and the .zip button downloads that same bundle, whose client
// tokens hold the token of the URL shown. An edit after the preview says
// the downloads no longer match. On a phone's screen the page does not
// scroll sideways.
func TestBrowserDeployPage(t *testing.T) {
	tab := browsertest.New(t)
	const token = "d3ploy-br0wser"
	srv, _ := startServer(t, server.Config{DataDir: t.TempDir()})
	base := serveAdmin(t, New(srv, Options{Token: token}))
	browsertest.SetHeaders(t, tab, map[string]string{"Authorization": browsertest.BasicAuth("operator", token)})
	browsertest.Do(t, tab, chromedp.Navigate(base+"/deploy"),
		chromedp.Click(chromedp.CSS(`input[name="topology"][value="cluster"]`)),
		chromedp.WaitVisible(chromedp.CSS("#nodes-2-host")),
		browsertest.Fill("#nodes-0-host", "127.0.0.1"),
		browsertest.Fill("#nodes-1-host", "127.0.0.1"),
		browsertest.Fill("#dir", "srv/locks"),
		chromedp.Click(chromedp.CSS("#plan")))
	const describe = `[...document.querySelectorAll("p.err")].filter(p => p.textContent).map(p => p.dataset.errorFor + ": " + p.textContent).join(" | ") +
		"; summary " + document.getElementById("form-errors").textContent.replace(/\s+/g, " ") + "; status " + document.getElementById("plan-status").textContent + "; dir " + document.getElementById("dir").value`
	errIs := func(field, text string) string {
		return fmt.Sprintf(`document.querySelector('p.err[data-error-for=%q]').textContent.includes(%q)`, field, text)
	}
	browsertest.WaitJS(t, tab, errIs("nodes[2].host", "DNS name or an IP address")+" && "+errIs("dir", "want an absolute path")+
		` && !document.getElementById("form-errors").hidden && document.getElementById("nodes-2-host").getAttribute("aria-invalid") === "true"`+
		` && document.getElementById("nodes-2-host").getAttribute("aria-describedby") !== null && document.getElementById("preview").hidden`,
		describe, 30*time.Second)
	browsertest.Screenshot(t, tab, "deploy-form.png")
	// The summary reads in the page's order: node 3's host, then the
	// directory (the answer lists them by name, the other way round).
	if got := browsertest.Eval[string](t, tab, `[...document.querySelectorAll("#form-errors li")].map(li => li.textContent.split(":")[0]).join(" | ")`); got != "Node 3, Host | Directory the bundle is unpacked at" {
		t.Errorf("summary in the order %q, want the page's", got)
	}
	// The select shows its longest option whole: text, padding and arrow
	// fit in its box.
	const fits = `(() => { const s = document.getElementById("token_start"), cs = getComputedStyle(s), m = document.createElement("span");
		m.style.font = cs.font; m.style.whiteSpace = "pre"; m.style.position = "absolute"; document.body.append(m);
		let w = 0; for (const o of s.options) { m.textContent = o.text; w = Math.max(w, m.getBoundingClientRect().width); } m.remove();
		return Math.ceil(w) + parseFloat(cs.paddingLeft) + parseFloat(cs.paddingRight) + 20 + " <= " + s.clientWidth; })()`
	if got := browsertest.Eval[string](t, tab, fits); !fitsIn(got) {
		t.Errorf("the token-start select cuts its option text: %s", got)
	}
	// Editing a field marked wrong takes its message and its summary
	// line away; the other problem stays, the summary with it.
	browsertest.Do(t, tab, browsertest.Fill("#nodes-2-host", "127.0.0"))
	browsertest.WaitJS(t, tab, `!document.querySelector('p.err[data-error-for="nodes[2].host"]').textContent && document.getElementById("nodes-2-host").getAttribute("aria-invalid") === null`+
		` && document.querySelectorAll("#form-errors li").length === 1 && !document.getElementById("form-errors").hidden && `+errIs("dir", "want an absolute path"),
		describe, 10*time.Second)
	browsertest.Do(t, tab, browsertest.Fill("#dir", "/srv"))
	browsertest.WaitJS(t, tab, `document.getElementById("form-errors").hidden && document.querySelectorAll("p.err:not(:empty)").length === 0`, describe, 10*time.Second)

	browsertest.Do(t, tab,
		browsertest.Fill("#nodes-2-host", "127.0.0.1"),
		browsertest.Fill("#client_tokens", "2"),
		chromedp.Click(chromedp.CSS("#console_keys")),
		browsertest.Fill("#dir", "/srv/locks-test"),
		chromedp.KeyEvent(kb.Enter)) // from the keyboard: Enter in a field submits the form
	browsertest.WaitJS(t, tab, `!document.getElementById("preview").hidden && document.getElementById("form-errors").hidden &&
		document.getElementById("url").textContent.startsWith("ticketing://•••hidden•••@127.0.0.1:5225,127.0.0.1:5226,127.0.0.1:5227?ca=/srv/locks-test/ca.pem") &&
		document.querySelector('#files details[data-path="n1/ticketingd.yaml"]') !== null`, describe, 30*time.Second)
	if errs := browsertest.Eval[int](t, tab, `document.querySelectorAll("p.err:not(:empty)").length`); errs != 0 {
		t.Errorf("%d field messages left after a good preview", errs)
	}
	// Masked: a key file, a config's admin token; shown on demand.
	keyText := `document.querySelector('#files details[data-path="n2/node-key.pem"] pre').textContent`
	cfgText := `document.querySelector('#files details[data-path="n2/ticketingd.yaml"] pre').textContent`
	if k, c := browsertest.Eval[string](t, tab, keyText), browsertest.Eval[string](t, tab, cfgText); strings.Contains(k, "PRIVATE KEY") ||
		!strings.Contains(k, "•••hidden•••") || !strings.Contains(c, `admin-token: "•••hidden•••"`) || !strings.Contains(c, "console-keys: true") {
		t.Errorf("masked preview: key %q, config:\n%s", k, c)
	}
	browsertest.Do(t, tab, chromedp.Click(chromedp.CSS(`#files details[data-path="n1/ticketingd.yaml"] summary`)))
	browsertest.Screenshot(t, tab, "deploy-preview.png")
	browsertest.Do(t, tab, chromedp.Click(chromedp.CSS("#show-secrets")))
	url := browsertest.Eval[string](t, tab, `document.getElementById("url").textContent`)
	if k := browsertest.Eval[string](t, tab, keyText); strings.Contains(url, "hidden") || !strings.Contains(k, "BEGIN EC PRIVATE KEY") && !strings.Contains(k, "BEGIN PRIVATE KEY") {
		t.Errorf("shown: URL %q, key %q", url, k)
	}
	clientToken := strings.TrimPrefix(url[:strings.Index(url, "@")], "ticketing://")

	file, name := browsertest.Download(t, tab, t.TempDir(), "#dl-zip", time.Minute)
	if name != "locks-test.zip" {
		t.Errorf("suggested name %q", name)
	}
	zr, err := zip.OpenReader(file)
	if err != nil {
		t.Fatal(err)
	}
	defer zr.Close()
	found := map[string]bool{}
	for _, f := range zr.File {
		found[f.Name] = true
		if f.Name == "locks-test/client-tokens" {
			rc, err := f.Open()
			if err != nil {
				t.Fatal(err)
			}
			data, _ := io.ReadAll(rc)
			rc.Close()
			if !strings.Contains(string(data), "\n"+clientToken+"\n") || f.Mode().Perm() != 0o600 {
				t.Errorf("the downloaded client-tokens (mode %v) lack the token of the URL shown", f.Mode())
			}
		}
	}
	if n := browsertest.Eval[int](t, tab, `document.querySelectorAll("#files details").length`); !found["locks-test/n3/ticketingd.yaml"] || len(zr.File) < n {
		t.Errorf("zip of %d entries (%v), preview of %d files", len(zr.File), found, n)
	}

	browsertest.Do(t, tab, browsertest.Fill("#nodes-0-client_port", "6000"))
	browsertest.WaitJS(t, tab, `!document.getElementById("stale").hidden`, describe, 10*time.Second)

	// Kubernetes manifests: the namespace and image fields show with the
	// box; the preview lists k8s/, the Secret masked.
	browsertest.Do(t, tab, chromedp.Click(chromedp.CSS("#kubernetes")))
	browsertest.WaitJS(t, tab, `!document.querySelector('[data-show="kube"]').hidden`, describe, 10*time.Second)
	browsertest.Do(t, tab, browsertest.Fill(`#kubernetes\.namespace`, "locks"),
		browsertest.Fill(`#kubernetes\.image`, "registry.example/ticketingd:1"),
		chromedp.Click(chromedp.CSS("#plan")))
	browsertest.WaitJS(t, tab, `document.querySelector('#files details[data-path="k8s/statefulset.yaml"]') !== null`, describe, 30*time.Second)
	if sts, sec := browsertest.Eval[string](t, tab, `document.querySelector('#files details[data-path="k8s/statefulset.yaml"] pre').textContent`),
		browsertest.Eval[string](t, tab, `document.querySelector('#files details[data-path="k8s/secret.yaml"] pre').textContent`); !strings.Contains(sts, "image: registry.example/ticketingd:1") ||
		!strings.Contains(sts, "$(POD_NAME).ticketing-peers.locks.svc.cluster.local") || strings.Contains(sec, "PRIVATE KEY") {
		t.Errorf("Kubernetes preview: statefulset.yaml\n%s\nsecret.yaml\n%s", sts, sec)
	}

	browsertest.Do(t, tab, chromedp.EmulateViewport(390, 844, chromedp.EmulateScale(3), chromedp.EmulateMobile))
	browsertest.WaitJS(t, tab, `document.documentElement.scrollWidth <= window.innerWidth`,
		`document.documentElement.scrollWidth + " > " + window.innerWidth`, 10*time.Second)
}

// fitsIn reports whether "A <= B" (numbers) holds.
func fitsIn(s string) bool {
	var a, b float64
	if _, err := fmt.Sscanf(s, "%g <= %g", &a, &b); err != nil {
		return false
	}
	return a <= b
}

// TestBrowserLockBrowser: the Locks page of a node with the lock browser
// shows a broker's locks with their tokens and holders, filters them by
// key prefix, shows a key's waiter, and expires the lock after a
// confirmation (sending the exact token and the operator's name): the
// waiter is granted with a higher token, which the page and the waiting
// broker both see. It reads on a phone's screen. Without console-keys
// the page says the browser is off.
func TestBrowserLockBrowser(t *testing.T) {
	tab := browsertest.New(t)
	const token = "l0cks-br0wser"
	var logs strings.Builder
	var mu sync.Mutex
	srv, addr := startServer(t, server.Config{DataDir: t.TempDir(), Logger: slog.New(slog.NewTextHandler(lockedWriter{&mu, &logs}, nil))})
	base := serveAdmin(t, New(srv, Options{Token: token, ConsoleKeys: true}))
	browsertest.SetHeaders(t, tab, map[string]string{"Authorization": browsertest.BasicAuth("operator", token)})

	ctx, cancel := context.WithTimeout(t.Context(), time.Minute) // a hang guard
	defer cancel()
	newBroker := func(name string) *broker.Broker {
		b, err := broker.New(broker.Config{Addrs: []string{addr}, Name: name})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { b.Close() })
		if err := b.WaitReady(ctx); err != nil {
			t.Fatal(err)
		}
		return b
	}
	holder, waiter := newBroker("holder-app"), newBroker("waiter-app")
	held, err := holder.Acquire(ctx, "orders/42", broker.AcquireOptions{Lease: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	nightly, err := holder.Acquire(ctx, "jobs/nightly", broker.AcquireOptions{Lease: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	// Held to the end: a Ticket the program drops is released by the
	// broker after a garbage collection.
	defer runtime.KeepAlive(nightly)
	defer runtime.KeepAlive(held)
	granted := make(chan *broker.Ticket, 1)
	go func() {
		tk, err := waiter.Acquire(ctx, "orders/42", broker.AcquireOptions{Lease: time.Minute, Wait: 50 * time.Second})
		if err != nil {
			t.Errorf("the waiter: %v", err)
		}
		granted <- tk
	}()

	browsertest.Do(t, tab, chromedp.Navigate(base+"/locks"))
	const describe = `[...document.querySelectorAll("#locks-table tbody tr")].map(r => r.textContent.replace(/\s+/g, " ")).join(" | ") +
		"; " + document.getElementById("locks-status").textContent + "; off: " + document.getElementById("locks-off").textContent +
		"; queue: " + document.getElementById("queue").textContent.replace(/\s+/g, " ") + "; result: " + document.getElementById("expire-result").textContent`
	row := fmt.Sprintf(`document.querySelector('#locks-table tr[data-key="orders/42"][data-token="%d"]')`, held.Token())
	browsertest.WaitJS(t, tab, row+` !== null && `+row+`.textContent.includes("holder-app (") && `+row+`.querySelector("td.waiters").textContent === "1" &&
		document.querySelector('#locks-table tr[data-key="jobs/nightly"]') !== null`, describe, 30*time.Second)

	browsertest.Do(t, tab, browsertest.Fill("#prefix", "orders/"), chromedp.Click(chromedp.CSS(`#locks-filter button`)))
	browsertest.WaitJS(t, tab, `document.querySelector('#locks-table tr[data-key="jobs/nightly"]') === null && `+row+` !== null`, describe, 30*time.Second)
	browsertest.Do(t, tab, chromedp.Click(chromedp.CSS(`#locks-table tr[data-key="orders/42"] button.link`)))
	browsertest.WaitJS(t, tab, `!document.getElementById("queue").hidden && document.querySelectorAll("#queue-list li").length === 1 &&
		document.querySelector("#queue-list li").textContent.startsWith("waiter-app (")`, describe, 30*time.Second)
	browsertest.Screenshot(t, tab, "locks.png")

	// Expire now: the dialog first, from the keyboard (Enter on the
	// button; Esc closes it) or the mouse; Cancel leaves the lock as it is.
	browsertest.Do(t, tab, browsertest.Fill("#operator", "alice on call"),
		chromedp.Focus(chromedp.CSS(`#locks-table tr[data-key="orders/42"] button.danger`)))
	// A refresh (every 2 s) keeps the focus where it was.
	browsertest.Do(t, tab, chromedp.Evaluate[chromedp.Void](`window.seenStatus = document.getElementById("locks-status").textContent`))
	browsertest.WaitJS(t, tab, `document.getElementById("locks-status").textContent !== window.seenStatus`, describe, 10*time.Second)
	browsertest.WaitJS(t, tab, `document.activeElement === document.querySelector('#locks-table tr[data-key="orders/42"] button.danger')`,
		`document.activeElement.outerHTML`, 5*time.Second)
	browsertest.Do(t, tab, chromedp.KeyEvent(kb.Enter))
	browsertest.WaitJS(t, tab, `document.getElementById("expire-dialog").open && document.activeElement.id === "x-cancel"`, describe, 10*time.Second)
	browsertest.Do(t, tab, chromedp.KeyEvent(kb.Escape))
	browsertest.WaitJS(t, tab, `!document.getElementById("expire-dialog").open`, describe, 10*time.Second)
	browsertest.Do(t, tab, chromedp.Click(chromedp.CSS(`#locks-table tr[data-key="orders/42"] button.danger`)))
	browsertest.WaitJS(t, tab, fmt.Sprintf(`document.getElementById("expire-dialog").open && document.getElementById("x-token").textContent === "%d"`, held.Token()), describe, 10*time.Second)
	browsertest.Screenshot(t, tab, "locks-expire.png")
	browsertest.Do(t, tab, chromedp.Click(chromedp.CSS("#x-cancel")))
	browsertest.WaitJS(t, tab, `!document.getElementById("expire-dialog").open`, describe, 10*time.Second)
	select {
	case <-granted:
		t.Fatal("granted after Cancel")
	case <-time.After(500 * time.Millisecond):
	}
	browsertest.Do(t, tab, chromedp.Click(chromedp.CSS(`#locks-table tr[data-key="orders/42"] button.danger`)),
		chromedp.WaitVisible(chromedp.CSS("#x-confirm")), chromedp.Click(chromedp.CSS("#x-confirm")))
	var tk *broker.Ticket
	select {
	case tk = <-granted:
	case <-ctx.Done():
		t.Fatal("the waiter was not granted")
	}
	if tk == nil || tk.Token() <= held.Token() {
		t.Fatalf("the waiter's ticket %v after %d", tk, held.Token())
	}
	browsertest.WaitJS(t, tab, fmt.Sprintf(`document.getElementById("expire-result").textContent.includes("with token %d") &&
		document.querySelector('#locks-table tr[data-key="orders/42"][data-token="%d"]') !== null &&
		document.querySelector('#locks-table tr[data-key="orders/42"]').textContent.includes("waiter-app (")`, tk.Token(), tk.Token()), describe, 30*time.Second)
	mu.Lock()
	if !strings.Contains(logs.String(), `operator \"alice on call\"`) {
		t.Errorf("the server's log has no line naming the operator:\n%s", logs.String())
	}
	mu.Unlock()

	// An expire of a token that changed meanwhile: 409, said as such.
	browsertest.Do(t, tab, chromedp.Click(chromedp.CSS(`#locks-table tr[data-key="orders/42"] button.danger`)),
		chromedp.WaitVisible(chromedp.CSS("#x-confirm")))
	if err := tk.Release(ctx); err != nil {
		t.Fatal(err)
	}
	again, err := holder.Acquire(ctx, "orders/42", broker.AcquireOptions{Lease: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	defer runtime.KeepAlive(again)
	browsertest.Do(t, tab, chromedp.Click(chromedp.CSS("#x-confirm")))
	browsertest.WaitJS(t, tab, `document.getElementById("expire-result").textContent.includes("held with another token")`, describe, 30*time.Second)

	// A phone's screen: the page does not scroll sideways (the table
	// scrolls in its box).
	browsertest.Do(t, tab, chromedp.EmulateViewport(390, 844, chromedp.EmulateScale(3), chromedp.EmulateMobile))
	browsertest.WaitJS(t, tab, `document.documentElement.scrollWidth <= window.innerWidth`,
		`document.documentElement.scrollWidth + " > " + window.innerWidth`, 10*time.Second)
	browsertest.Do(t, tab, chromedp.EmulateViewport(1280, 900))

	// Off: the page says so.
	offBase := serveAdmin(t, New(srv, Options{Token: token}))
	browsertest.Do(t, tab, chromedp.Navigate(offBase+"/locks"))
	browsertest.WaitJS(t, tab, `!document.getElementById("locks-off").hidden && document.getElementById("locks-off").textContent.includes("--console-keys") &&
		document.querySelector('nav a[href="/locks"]') === null`, describe, 30*time.Second)
}

// lockedWriter serializes writes to w, for a logger read by the test.
type lockedWriter struct {
	mu *sync.Mutex
	w  io.Writer
}

func (l lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// shortPages is a node whose first page of locks ran out of keys to search
// before it found a held lock (none, more, next "idle/09999"); the page
// after it has one lock.
type shortPages struct {
	fakeLocks
	mu     sync.Mutex
	afters []string
}

func (f *shortPages) Locks(_ context.Context, q server.LockQuery) (server.LockPage, error) {
	f.mu.Lock()
	f.afters = append(f.afters, q.After)
	f.mu.Unlock()
	if q.After == "" {
		return server.LockPage{View: server.ViewStandalone, More: true, Next: "idle/09999"}, nil
	}
	return server.LockPage{View: server.ViewStandalone, Locks: []server.LockInfo{{Key: "idle/10000", Token: 7, LeaseS: 60,
		LeaseLeft: time.Minute, LeaseEnd: time.Now().Add(time.Minute)}}}, nil
}

// TestBrowserLockBrowserShortPage: a page with no lock but more (its
// search ran out of keys) says so, not "No lock is held", and Next page
// asks for the page after the key the search stopped at.
func TestBrowserLockBrowserShortPage(t *testing.T) {
	tab := browsertest.New(t)
	const token = "sh0rt-page"
	fs := &shortPages{}
	base := serveAdmin(t, newHandler(fs, fs, fs, Options{Token: token, ConsoleKeys: true}))
	browsertest.SetHeaders(t, tab, map[string]string{"Authorization": browsertest.BasicAuth("operator", token)})
	browsertest.Do(t, tab, chromedp.Navigate(base+"/locks"))
	const describe = `document.getElementById("locks-none").textContent + "; next disabled: " + document.getElementById("next-page").disabled +
		"; rows: " + [...document.querySelectorAll("#locks-table tbody tr")].map(r => r.dataset.key).join(" ")`
	browsertest.WaitJS(t, tab, `!document.getElementById("locks-none").hidden && document.getElementById("locks-none").textContent.startsWith("No held lock among the keys searched") &&
		!document.getElementById("next-page").disabled`, describe, 30*time.Second)
	browsertest.Do(t, tab, chromedp.Click(chromedp.CSS(`#next-page`)))
	browsertest.WaitJS(t, tab, `document.querySelector('#locks-table tr[data-key="idle/10000"]') !== null && document.getElementById("locks-none").hidden`, describe, 30*time.Second)
	fs.mu.Lock()
	defer fs.mu.Unlock()
	if !slices.Contains(fs.afters, "idle/09999") {
		t.Fatalf("the pages asked for: after %q, want one after idle/09999", fs.afters)
	}
}
