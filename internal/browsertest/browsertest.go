// Package browsertest runs a real web browser for tests: Debian's
// chromium (or another Chromium-family browser), headless, driven through
// github.com/chromedp/chromedp.
//
//	tab := browsertest.New(t)            // skips (fails under CI=true) without a browser
//	browsertest.Do(t, tab, chromedp.Navigate(url))
//	browsertest.WaitJS(t, tab, `document.title === "Console · Ticketing"`, 30*time.Second)
//	browsertest.Screenshot(t, tab, "console.png") // only with TICKETING_SCREENSHOTS=1
//
// The browser is found by Find: $TICKETING_BROWSER, else chromium,
// chromium-browser, google-chrome or google-chrome-stable on PATH. Without
// one, New skips the test with a message saying how to install one; under
// CI=true (as .ci/run sets, which installs chromium) it fails instead, so
// that CI never passes by skipping the browser tests. As root (a
// container, CI) the browser runs with --no-sandbox, which Chromium
// requires there.
package browsertest

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/chromedp/cdproto/browser"
	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/chromedp"

	"github.com/ticketing-dev/ticketing/internal/proctest"
)

// BrowserEnv names a browser binary to use instead of searching PATH.
const BrowserEnv = "TICKETING_BROWSER"

// ScreenshotsEnv, set to 1, makes Screenshot write its files; otherwise
// it does nothing, so that test runs (CI) do not rewrite committed
// screenshots.
const ScreenshotsEnv = "TICKETING_SCREENSHOTS"

// ScreenshotDir is where Screenshot writes, relative to the module root.
const ScreenshotDir = "docs/screenshots"

// candidates are the browser names Find looks for on PATH, in order.
var candidates = []string{"chromium", "chromium-browser", "google-chrome", "google-chrome-stable"}

// ErrNoBrowser is returned by Find when no browser is found.
var ErrNoBrowser = errors.New("browsertest: no Chromium-family browser found (chromium, chromium-browser, google-chrome, google-chrome-stable on PATH, or $" + BrowserEnv + "); install one: apt-get install -y chromium")

// Find returns the path of the browser to run: $TICKETING_BROWSER if set
// (it must exist), else the first of chromium, chromium-browser,
// google-chrome and google-chrome-stable on PATH; ErrNoBrowser if none.
func Find() (string, error) {
	if p := os.Getenv(BrowserEnv); p != "" {
		path, err := exec.LookPath(p)
		if err != nil {
			return "", fmt.Errorf("browsertest: $%s=%q: %w", BrowserEnv, p, err)
		}
		return path, nil
	}
	for _, name := range candidates {
		if path, err := exec.LookPath(name); err == nil {
			return path, nil
		}
	}
	return "", ErrNoBrowser
}

// onCI reports whether the tests run in CI (CI=true), where a missing
// browser is a failure.
func onCI() bool { return os.Getenv("CI") == "true" }

// New starts a headless browser for the test and returns the context of
// its first tab, for chromedp.Run and the helpers here. The test's
// Cleanup closes the browser and waits for it to exit. Without a browser
// New skips the test, or fails it under CI=true.
func New(tb testing.TB) context.Context {
	tb.Helper()
	path, err := Find()
	if err != nil {
		if onCI() {
			tb.Fatalf("%v (CI=true: the browser tests must run; .ci/run installs chromium)", err)
		}
		tb.Skipf("%v: skipping the browser test", err)
	}
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(path),
		chromedp.WindowSize(1280, 900),
		chromedp.UserDataDir(tb.TempDir()),
		chromedp.Flag("disable-gpu", true),
	)
	if os.Geteuid() == 0 {
		opts = append(opts, chromedp.NoSandbox) // Chromium refuses to run as root with its sandbox
	}
	allocCtx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	// chromedp logs from its own goroutines, which may outlive the test's
	// logging: done stops them from calling tb.Logf after it ended.
	var done atomic.Bool
	logf := func(format string, args ...any) {
		if !done.Load() {
			tb.Logf("chromedp: "+format, args...)
		}
	}
	ctx, cancel := chromedp.NewContext(allocCtx, chromedp.WithErrorf(logf))
	tb.Cleanup(func() {
		cctx, ccancel := context.WithTimeout(ctx, 10*time.Second)
		_ = chromedp.Cancel(cctx) // closes the browser gracefully
		ccancel()
		cancel()
		cancelAlloc() // waits for the browser process
		done.Store(true)
	})
	// Start the browser now, with no deadline (a deadline on the first
	// run would bound the browser's life).
	if err := chromedp.Do(ctx); err != nil {
		tb.Fatalf("browsertest: starting %s: %v", path, err)
	}
	return ctx
}

// NewTab opens another tab of the browser of ctx (a context from New);
// the test's Cleanup closes it.
func NewTab(tb testing.TB, ctx context.Context) context.Context {
	tb.Helper()
	tab, cancel := chromedp.NewContext(ctx)
	tb.Cleanup(cancel)
	if err := chromedp.Do(tab); err != nil {
		tb.Fatalf("browsertest: new tab: %v", err)
	}
	return tab
}

// Do runs the actions in the tab, each step bounded by a minute (a hang
// guard), and fails the test on an error.
func Do(tb testing.TB, tab context.Context, steps ...chromedp.Action[chromedp.Void]) {
	tb.Helper()
	ctx, cancel := context.WithTimeout(tab, time.Minute)
	defer cancel()
	if err := chromedp.Do(ctx, steps...); err != nil {
		tb.Fatalf("browsertest: %v", err)
	}
}

// Eval evaluates a JavaScript expression in the tab and returns its value.
func Eval[T any](tb testing.TB, tab context.Context, expr string) T {
	tb.Helper()
	ctx, cancel := context.WithTimeout(tab, time.Minute)
	defer cancel()
	v, err := chromedp.Run(ctx, chromedp.Evaluate[T](expr))
	if err != nil {
		tb.Fatalf("browsertest: evaluating %s: %v", expr, err)
	}
	return v
}

// WaitJS waits until the JavaScript expression is truthy in the tab,
// checking every 100 ms (requestAnimationFrame, chromedp's default, does
// not run in a background tab), and fails the test with the expression
// and the value of describe (a JavaScript expression that tells what the
// page shows, "" for none) if that takes longer than timeout (a hang
// guard, not a speed assertion).
func WaitJS(tb testing.TB, tab context.Context, expr, describe string, timeout time.Duration) {
	tb.Helper()
	ctx, cancel := context.WithTimeout(tab, timeout+5*time.Second)
	defer cancel()
	_, err := chromedp.Run(ctx, chromedp.Poll[chromedp.Void](expr,
		chromedp.WithPollingInterval(100*time.Millisecond), chromedp.WithPollingTimeout(timeout)))
	if err == nil {
		return
	}
	msg := fmt.Sprintf("browsertest: waiting %v for %s: %v", timeout, expr, err)
	if describe != "" {
		dctx, dcancel := context.WithTimeout(tab, 10*time.Second)
		defer dcancel()
		if s, derr := chromedp.Run(dctx, chromedp.Evaluate[string](describe)); derr == nil {
			msg += "\nthe page shows: " + s
		}
	}
	tb.Fatal(msg)
}

// SetHeaders makes the tab send these headers with every request
// (Network.setExtraHTTPHeaders): an Authorization header, say.
func SetHeaders(tb testing.TB, tab context.Context, headers map[string]string) {
	tb.Helper()
	h := network.Headers{}
	for k, v := range headers {
		h[k] = v
	}
	ctx, cancel := context.WithTimeout(tab, time.Minute)
	defer cancel()
	if _, err := chromedp.Call(ctx, network.Enable, network.EnableParams{}); err != nil {
		tb.Fatalf("browsertest: Network.enable: %v", err)
	}
	if _, err := chromedp.Call(ctx, network.SetExtraHTTPHeaders, network.SetExtraHTTPHeadersParams{Headers: h}); err != nil {
		tb.Fatalf("browsertest: Network.setExtraHTTPHeaders: %v", err)
	}
}

// Fill replaces the value of the input that the CSS selector sel names
// by typing text into it (key events, as a user types), after emptying it
// (chromedp.Clear empties only an input whose value is its value
// attribute's).
func Fill(sel, text string) chromedp.Action[chromedp.Void] {
	return chromedp.Func(func(ctx context.Context, _ *chromedp.Target) error {
		return chromedp.Do(ctx, chromedp.WaitVisible(chromedp.CSS(sel)),
			chromedp.Evaluate[chromedp.Void](fmt.Sprintf(`document.querySelector(%q).value = ""`, sel)),
			chromedp.SendKeys(chromedp.CSS(sel), text))
	})
}

// Download clicks the element that the CSS selector sel names (a button
// or link that downloads a file, a blob: URL included), waits at most
// timeout (a hang guard) for the browser to save the file into dir, and
// returns the saved file's path and the name the page suggested for it.
func Download(tb testing.TB, tab context.Context, dir, sel string, timeout time.Duration) (path, suggested string) {
	tb.Helper()
	ctx, cancel := context.WithTimeout(tab, timeout)
	defer cancel()
	names := make(chan string, 1)
	done := make(chan *browser.EventDownloadProgress, 1)
	if err := chromedp.Listen(ctx, func(ev any) {
		switch ev := ev.(type) {
		case *browser.EventDownloadWillBegin:
			select {
			case names <- ev.SuggestedFilename:
			default:
			}
		case *browser.EventDownloadProgress:
			if ev.State == browser.DownloadProgressStateCompleted || ev.State == browser.DownloadProgressStateCanceled {
				select {
				case done <- ev:
				default:
				}
			}
		}
	}); err != nil {
		tb.Fatalf("browsertest: %v", err)
	}
	yes := true
	if err := chromedp.Do(ctx, chromedp.Func(func(ctx context.Context, _ *chromedp.Target) error {
		_, err := chromedp.Call(ctx, browser.SetDownloadBehavior, browser.SetDownloadBehaviorParams{
			Behavior: browser.SetDownloadBehaviorBehaviorAllowAndName, DownloadPath: dir, EventsEnabled: &yes})
		return err
	}), chromedp.Click(chromedp.CSS(sel))); err != nil {
		tb.Fatalf("browsertest: download with %s: %v", sel, err)
	}
	select {
	case ev := <-done:
		if ev.State != browser.DownloadProgressStateCompleted {
			tb.Fatalf("browsertest: download with %s: %s", sel, ev.State)
		}
		select {
		case suggested = <-names:
		default:
		}
		return filepath.Join(dir, ev.GUID), suggested
	case <-ctx.Done():
		tb.Fatalf("browsertest: download with %s: not saved within %v", sel, timeout)
		return "", ""
	}
}

// BasicAuth is the Authorization header value of HTTP Basic
// authentication.
func BasicAuth(user, password string) string {
	return "Basic " + base64.StdEncoding.EncodeToString([]byte(user+":"+password))
}

// Screenshot writes a full-page PNG of the tab to ScreenshotDir/name in
// the module, if $TICKETING_SCREENSHOTS is 1; otherwise it does nothing.
func Screenshot(tb testing.TB, tab context.Context, name string) {
	tb.Helper()
	if os.Getenv(ScreenshotsEnv) != "1" {
		return
	}
	ctx, cancel := context.WithTimeout(tab, time.Minute)
	defer cancel()
	png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	if err != nil {
		tb.Fatalf("browsertest: screenshot: %v", err)
	}
	root, err := proctest.ModuleRoot()
	if err != nil {
		tb.Fatal(err)
	}
	dir := filepath.Join(root, ScreenshotDir)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		tb.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, name), png, 0o644); err != nil {
		tb.Fatal(err)
	}
	tb.Logf("browsertest: wrote %s", filepath.Join(ScreenshotDir, name))
}
