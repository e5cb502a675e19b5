package integration_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/ticketing-dev/ticketing/broker"
	"github.com/ticketing-dev/ticketing/integration/harness"
	"github.com/ticketing-dev/ticketing/internal/browsertest"
	"github.com/ticketing-dev/ticketing/internal/proctest"
)

// TestBrowserDeployedClusterConsole walks the console end to end, in
// headless chromium against real processes. On the deployment page of
// 'ticketingd console' it fills the form for a three-node cluster on
// 127.0.0.1 (free ports) with a private CA, peer mutual TLS, an admin
// token and the lock browser, downloads the .tar.gz, unpacks it and
// starts three 'ticketingd serve --config' from it. A broker connects
// with the TICKETING_URL the page showed and holds a lock; the leader's
// console (admin token as a Basic password) shows the three members up
// and the lock, and its lock browser the lock with its token and a second
// broker waiting. Then it kills the leader with SIGKILL: the new leader's
// console marks the old one dead (unreachable) and names itself leader,
// the other survivor's names the new leader. A lock held again on the new
// leader, with a waiter, is expired from the new leader's lock browser
// (click, confirm): the waiter is granted with a higher token, which the
// page shows and the broker gets.
func TestBrowserDeployedClusterConsole(t *testing.T) {
	tab := browsertest.New(t)
	bin := harness.Ticketingd(t)
	url, bundle := deployFromPage(t, tab, bin)

	adminToken := readTrimmed(t, filepath.Join(bundle, "admin-token"))
	var nodes []harness.AttachedNode
	for _, id := range []string{"n1", "n2", "n3"} {
		cfg := readTrimmed(t, filepath.Join(bundle, id, "ticketingd.yaml"))
		nodes = append(nodes, harness.AttachedNode{ID: id, Admin: yamlValue(t, cfg, "admin-listen"),
			Server: harness.StartServer(t, bin, harness.ServerOptions{Config: filepath.Join(bundle, id, "ticketingd.yaml"),
				Listen: yamlValue(t, cfg, "listen"), DataDir: filepath.Join(bundle, id, "data")})})
	}
	c := harness.AttachCluster(nodes, adminToken)
	old := c.WaitConverged(t, hangGuard)

	cfg, err := broker.ParseURL(url)
	if err != nil {
		t.Fatalf("the page's URL: %v", err)
	}
	cfg.Name = "holder-app"
	holder := newBroker(t, cfg)
	cfg.Name = "waiter-app"
	waiter := newBroker(t, cfg)
	ctx, cancel := context.WithTimeout(t.Context(), 4*hangGuard)
	defer cancel()
	tk, err := holder.Acquire(ctx, "console/key", broker.AcquireOptions{Lease: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	// Held to the end: a Ticket the program drops is released by the
	// broker after a garbage collection.
	defer runtime.KeepAlive(tk)
	// A waiter on the old leader: its wait is lost with it.
	firstWait := make(chan error, 1)
	go func() {
		_, err := waiter.Acquire(ctx, "console/key", broker.AcquireOptions{Lease: time.Minute, Wait: 20 * time.Second})
		firstWait <- err
	}()

	auth := map[string]string{"Authorization": browsertest.BasicAuth("operator", adminToken)}
	tabs := map[string]context.Context{}
	for _, n := range c.Nodes {
		tabs[n.ID] = browsertest.NewTab(t, tab)
		browsertest.SetHeaders(t, tabs[n.ID], auth)
		browsertest.Do(t, tabs[n.ID], chromedp.Navigate("http://"+n.Admin+"/"))
	}
	all := leaderIs(old.ID) + fmt.Sprintf(` && document.querySelector('[data-k="held_locks"]').textContent === "1" && document.querySelector('[data-k="last_token"]').textContent.replaceAll(",", "") === %q`,
		fmt.Sprint(tk.Token()))
	for _, n := range c.Nodes {
		all += " && " + memberIs(n.ID, "up")
	}
	browsertest.WaitJS(t, tabs[old.ID], all, describeMembers, hangGuard)
	browsertest.Screenshot(t, tabs[old.ID], "console-cluster.png")

	// The leader's lock browser: the lock, its token, its waiter.
	locks := browsertest.NewTab(t, tab)
	browsertest.SetHeaders(t, locks, auth)
	browsertest.Do(t, locks, chromedp.Navigate("http://"+old.Admin+"/locks"))
	browsertest.WaitJS(t, locks, lockRow("console/key", tk.Token())+` !== null && `+lockRow("console/key", tk.Token())+`.textContent.includes("holder-app (") &&
		`+lockRow("console/key", tk.Token())+`.querySelector("td.waiters").textContent === "1"`, describeLocks, hangGuard)
	browsertest.Do(t, locks, chromedp.Click(chromedp.CSS(`#locks-table tr[data-key="console/key"] button.link`)))
	browsertest.WaitJS(t, locks, `document.querySelectorAll("#queue-list li").length === 1 && document.querySelector("#queue-list li").textContent.startsWith("waiter-app (")`,
		describeLocks, hangGuard)

	old.Kill9()
	nl := c.WaitLeader(t, hangGuard)
	if nl == old {
		t.Fatalf("the killed leader %s is still the leader", old.ID)
	}
	t.Logf("killed leader %s; new leader %s", old.ID, nl.ID)
	browsertest.WaitJS(t, tabs[nl.ID], leaderIs(nl.ID)+" && "+memberIs(old.ID, "unreachable")+" && "+memberIs(nl.ID, "up")+
		` && document.querySelector('#members tr[data-member="`+old.ID+`"]').textContent.includes("dead / unreachable")`,
		describeMembers, hangGuard)
	browsertest.Screenshot(t, tabs[nl.ID], "console-cluster-failover.png")
	for _, n := range c.Nodes {
		if n != nl && n != old {
			browsertest.WaitJS(t, tabs[n.ID], leaderIs(nl.ID), describeMembers, hangGuard)
		}
	}
	t.Logf("the first waiter, on the killed leader: %v", <-firstWait)

	// A lock held again on the new leader, a waiter, and an expire now
	// from the new leader's lock browser.
	again, err := acquireRetrying(ctx, holder, "console/again", 0)
	if err != nil {
		t.Fatal(err)
	}
	defer runtime.KeepAlive(again)
	granted := make(chan *broker.Ticket, 1)
	go func() {
		tk, err := acquireRetrying(ctx, waiter, "console/again", 50*time.Second)
		if err != nil {
			t.Errorf("the waiter: %v", err)
		}
		granted <- tk
	}()
	browsertest.Do(t, locks, chromedp.Navigate("http://"+nl.Admin+"/locks"))
	browsertest.WaitJS(t, locks, lockRow("console/again", again.Token())+` !== null && `+lockRow("console/again", again.Token())+`.querySelector("td.waiters").textContent === "1"`,
		describeLocks, hangGuard)
	browsertest.Do(t, locks, browsertest.Fill("#operator", "integration test"),
		chromedp.Click(chromedp.CSS(`#locks-table tr[data-key="console/again"] button.danger`)),
		chromedp.WaitVisible(chromedp.CSS("#x-confirm")))
	if got := browsertest.Eval[string](t, locks, `document.getElementById("x-token").textContent`); got != fmt.Sprint(again.Token()) {
		t.Errorf("the dialog asks about token %s, want %d", got, again.Token())
	}
	browsertest.Do(t, locks, chromedp.Click(chromedp.CSS("#x-confirm")))
	var next *broker.Ticket
	select {
	case next = <-granted:
	case <-ctx.Done():
		t.Fatal("the waiter was not granted after the expire now")
	}
	if next == nil || next.Token() <= again.Token() {
		t.Fatalf("the waiter's ticket %v, after token %d", next, again.Token())
	}
	browsertest.WaitJS(t, locks, fmt.Sprintf(`document.getElementById("expire-result").textContent.includes("with token %d") && `, next.Token())+
		lockRow("console/again", next.Token())+` !== null && `+lockRow("console/again", next.Token())+`.textContent.includes("waiter-app (")`, describeLocks, hangGuard)
	if !strings.Contains(nl.Log(), `operator \"integration test\"`) {
		t.Errorf("the new leader's log has no expire now naming the operator")
	}
}

// deployFromPage starts 'ticketingd console' (a real process), fills its
// deployment form in tab for a cluster of n1, n2, n3 on 127.0.0.1 (free
// base ports), with a private CA, peer mutual TLS, an admin token and the
// lock browser, previews it, downloads the .tar.gz and unpacks it. It
// returns the TICKETING_URL the page shows (secrets shown) and the
// bundle's directory.
func deployFromPage(t *testing.T, tab context.Context, bin string) (url, bundle string) {
	t.Helper()
	port, err := proctest.FreePort("127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	listen := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	p := harness.StartProcess(t, "ticketingd console", bin, "console", "--listen", listen)
	if _, _, err := p.Stderr.WaitLine(0, func(l string) bool { return strings.Contains(l, "console listening") }, p.Done(), hangGuard); err != nil {
		t.Fatalf("ticketingd console: %v", err)
	}
	var base [3]int // client, Raft, admin: three ports each
	for i := range base {
		if base[i], err = proctest.FreePortRun("127.0.0.1", 3); err != nil {
			t.Fatal(err)
		}
	}
	parent := t.TempDir()
	bundle = filepath.Join(parent, "locks")

	browsertest.Do(t, tab, chromedp.Navigate("http://"+listen+"/deploy"),
		chromedp.Click(chromedp.CSS(`input[name="topology"][value="cluster"]`)),
		chromedp.WaitVisible(chromedp.CSS("#nodes-2-host")),
		browsertest.Fill("#port", strconv.Itoa(base[0])),
		browsertest.Fill("#peer_port", strconv.Itoa(base[1])),
		browsertest.Fill("#admin_port", strconv.Itoa(base[2])),
		browsertest.Fill("#nodes-0-host", "127.0.0.1"),
		browsertest.Fill("#nodes-1-host", "127.0.0.1"),
		browsertest.Fill("#nodes-2-host", "127.0.0.1"),
		chromedp.Click(chromedp.CSS(`input[name="tls"][value="private-ca"]`)),
		chromedp.Click(chromedp.CSS("#console_keys")),
		browsertest.Fill("#dir", bundle))
	if !browsertest.Eval[bool](t, tab, `document.getElementById("peer_tls").checked && document.getElementById("admin_token").checked`) {
		t.Fatal("peer TLS or the admin token is not on by default")
	}
	browsertest.Do(t, tab, chromedp.Click(chromedp.CSS("#plan")))
	browsertest.WaitJS(t, tab, `!document.getElementById("preview").hidden && document.getElementById("url").textContent.includes("•••hidden•••@")`,
		`document.getElementById("form-errors").textContent + document.getElementById("plan-status").textContent`, hangGuard)
	browsertest.Do(t, tab, chromedp.Click(chromedp.CSS("#show-secrets")))
	url = browsertest.Eval[string](t, tab, `document.getElementById("url").textContent`)

	file, name := browsertest.Download(t, tab, t.TempDir(), "#dl-tgz", hangGuard)
	if name != "locks.tar.gz" {
		t.Errorf("the download is named %q, want locks.tar.gz", name)
	}
	if out, err := exec.Command("tar", "-xzf", file, "-C", parent).CombinedOutput(); err != nil {
		t.Fatalf("tar -xzf: %v\n%s", err, out)
	}
	if fi, err := os.Stat(filepath.Join(bundle, "n1", "node-key.pem")); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("n1/node-key.pem unpacked: %v %v", fi, err)
	}
	return url, bundle
}

// acquireRetrying acquires key, waiting at most wait for it, retrying
// while the broker has no session to a serving node (after a failover).
func acquireRetrying(ctx context.Context, b *broker.Broker, key string, wait time.Duration) (*broker.Ticket, error) {
	for {
		tk, err := b.Acquire(ctx, key, broker.AcquireOptions{Lease: time.Minute, Wait: wait})
		if err == nil || ctx.Err() != nil || !errors.Is(err, broker.ErrUnsent) && !errors.Is(err, broker.ErrNotActive) {
			return tk, err
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func readTrimmed(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}

// yamlValue is the quoted or plain value of key in a bundle's config.
func yamlValue(t *testing.T, cfg, key string) string {
	t.Helper()
	for _, l := range strings.Split(cfg, "\n") {
		if v, ok := strings.CutPrefix(l, key+": "); ok {
			v, _, _ = strings.Cut(v, " #")
			return strings.Trim(v, `"`)
		}
	}
	t.Fatalf("no %s in the config", key)
	return ""
}

// What the console's pages show, for WaitJS.
const (
	describeMembers = `[...document.querySelectorAll("#members tbody tr")].map(r => r.textContent.replace(/\s+/g, " ")).join(" | ") +
		"; leader " + document.querySelector('[data-k="cl_leader"]').textContent + "; " + document.getElementById("conn").textContent`
	describeLocks = `[...document.querySelectorAll("#locks-table tbody tr")].map(r => r.textContent.replace(/\s+/g, " ")).join(" | ") +
		"; " + document.getElementById("locks-status").textContent + "; " + document.getElementById("locks-off").textContent +
		"; " + document.getElementById("locks-view").textContent + "; result: " + document.getElementById("expire-result").textContent +
		"; queue (hidden " + document.getElementById("queue").hidden + "): " + document.getElementById("queue").textContent.replace(/\s+/g, " ")`
)

func memberIs(id, health string) string {
	return fmt.Sprintf(`document.querySelector('#members tr[data-member=%q][data-health=%q]') !== null`, id, health)
}

func leaderIs(id string) string {
	return fmt.Sprintf(`document.querySelector('[data-k="cl_leader"]').textContent === %q`, id)
}

func lockRow(key string, token uint64) string {
	return fmt.Sprintf(`document.querySelector('#locks-table tr[data-key=%q][data-token="%d"]')`, key, token)
}
