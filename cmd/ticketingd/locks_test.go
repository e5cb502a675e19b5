package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/ticketing-dev/ticketing/internal/wire"
	"github.com/ticketing-dev/ticketing/server/admin"
)

const locksToken = "l0cks-adm1n"

// serveLocks starts a real 'ticketingd serve' with the lock browser on
// and returns it with its client and admin addresses.
func serveLocks(t *testing.T, extra ...string) (*subprocess, string, string) {
	t.Helper()
	args := append([]string{"serve", "--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0", "--data-dir", t.TempDir(),
		"--admin-token", locksToken, "--log-format", "json"}, extra...)
	sp := startBinary(t, buildBinary(t), args...)
	adminAddr := sp.stderr.waitJSON(t, "admin listening", sp.done)["addr"].(string)
	return sp, sp.addr(t), adminAddr
}

func dialHolder(t *testing.T, addr string) *client {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	c, r, err := dialRaw(conn, "")
	if err != nil || r.Type != wire.TypeHelloOK {
		t.Fatalf("HELLO: %v %v", r.Type, err)
	}
	return c
}

// runLocks runs the real binary's 'ticketingd locks' with stdin.
func runLocks(t *testing.T, stdin string, args ...string) (int, string, string) {
	t.Helper()
	cmd := exec.Command(buildBinary(t), append([]string{"locks"}, args...)...)
	cmd.Stdin = strings.NewReader(stdin)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	if _, ok := err.(*exec.ExitError); err != nil && !ok {
		t.Fatal(err)
	}
	return cmd.ProcessState.ExitCode(), out.String(), errb.String()
}

// TestLocksCommand: 'ticketingd locks list|show|expire' against a real
// 'ticketingd serve --console-keys': a table and --json, pages by prefix
// and cursor (keys with blanks and bytes that are not UTF-8 included),
// one key's waiters, expire with the wrong token, of a key not held,
// refused at the prompt, then confirmed: the waiter is granted a higher
// token, the old holder's RELEASE gets N, and the node logs who asked.
func TestLocksCommand(t *testing.T) {
	sp, addr, adm := serveLocks(t, "--console-keys")
	flags := []string{"--admin", adm, "--admin-token", locksToken}
	holder, waiter := dialHolder(t, addr), dialHolder(t, addr)
	tokens := map[string]uint64{}
	for _, k := range []string{"jobs/a b", "jobs/x", "jobs/\xff", "other"} {
		r, err := holder.acquire(k, 0, 60)
		if err != nil || r.Type != wire.TypeGranted {
			t.Fatalf("acquire %q: %v %v", k, r.Type, err)
		}
		tokens[k] = r.Token
	}
	granted := make(chan wire.Response, 1)
	go func() {
		r, _ := waiter.acquire("jobs/x", 60, 30)
		granted <- r
	}()

	code, out, stderr := runCapture(t, append([]string{"locks", "list", "--prefix", "jobs/", "--limit", "2"}, flags...)...)
	if code != 0 || !strings.Contains(out, "2 held locks on this page (view standalone)") || !strings.Contains(out, "KEY") ||
		!strings.Contains(out, `"jobs/a b"`) || !strings.Contains(out, fmt.Sprint(tokens["jobs/x"])) || !strings.Contains(out, "test@127.0.0.1:") ||
		!strings.Contains(out, "more: the next page is --after jobs/x") || strings.Contains(out, "other") {
		t.Fatalf("locks list: exit %d\n%s%s", code, out, stderr)
	}
	// A key that is not a plain shell word: the next page by --after-b64.
	code, out, stderr = runCapture(t, append([]string{"locks", "list", "--prefix", "jobs/", "--limit", "1"}, flags...)...)
	if code != 0 || !strings.Contains(out, "more: the next page is --after-b64 am9icy9hIGI=") {
		t.Fatalf("locks list --limit 1: exit %d\n%s%s", code, out, stderr)
	}
	code, out, stderr = runCapture(t, append([]string{"locks", "list", "--prefix", "jobs/", "--limit", "1", "--after-b64", "am9icy9hIGI="}, flags...)...)
	if code != 0 || !strings.Contains(out, "jobs/x ") || strings.Contains(out, "jobs/a b") {
		t.Fatalf("locks list --after-b64: exit %d\n%s%s", code, out, stderr)
	}
	code, out, stderr = runCapture(t, append([]string{"locks", "list", "--prefix", "jobs/", "--after", "jobs/x", "--json"}, flags...)...)
	var page admin.LocksResponse
	if code != 0 || json.Unmarshal([]byte(out), &page) != nil || len(page.Locks) != 1 || page.Locks[0].KeyB64 != "am9icy//" || page.More {
		t.Fatalf("locks list --after --json: exit %d\n%s%s", code, out, stderr)
	}

	// The waiter, once it is queued.
	for i := 0; ; i++ {
		code, out, stderr = runCapture(t, append([]string{"locks", "show", "jobs/x"}, flags...)...)
		if code != 0 || i > 100 {
			t.Fatalf("locks show: exit %d\n%s%s", code, out, stderr)
		}
		if strings.Contains(out, "1 waiter:") {
			break
		}
	}
	if !strings.Contains(out, "token "+fmt.Sprint(tokens["jobs/x"])) || !strings.Contains(out, "holder test@"+holder.c.LocalAddr().String()) ||
		!strings.Contains(out, "test@"+waiter.c.LocalAddr().String()) || !strings.Contains(out, "30s") {
		t.Fatalf("locks show:\n%s", out)
	}

	x := tokens["jobs/x"]
	if code, _, stderr := runCapture(t, append([]string{"locks", "expire", "jobs/x", "--token", fmt.Sprint(x + 1), "--yes"}, flags...)...); code != 1 || !strings.Contains(stderr, "another token") {
		t.Fatalf("expire with another token: exit %d: %s", code, stderr)
	}
	if code, _, stderr := runCapture(t, append([]string{"locks", "expire", "jobs/none", "--token", "1", "--yes"}, flags...)...); code != 1 || !strings.Contains(stderr, "not held") {
		t.Fatalf("expire of a key not held: exit %d: %s", code, stderr)
	}
	code, _, stderr = runLocks(t, "n\n", append([]string{"expire", "jobs/x", "--token", fmt.Sprint(x)}, flags...)...)
	if code != 1 || !strings.Contains(stderr, "Expire it now?") || !strings.Contains(stderr, "not confirmed: nothing expired") {
		t.Fatalf("expire answered n: exit %d: %s", code, stderr)
	}
	select {
	case r := <-granted:
		t.Fatalf("the waiter was answered before the expiry: %+v", r)
	default:
	}
	from := len(sp.stderr.String())
	code, out, stderr = runLocks(t, "y\n", append([]string{"expire", "jobs/x", "--token", fmt.Sprint(x), "--operator", "alice"}, flags...)...)
	g := <-granted
	if code != 0 || g.Type != wire.TypeGranted || g.Token <= x || !strings.Contains(out, fmt.Sprintf("expired jobs/x (token %d)", x)) ||
		!strings.Contains(out, fmt.Sprintf("now held by test@%s with token %d", waiter.c.LocalAddr(), g.Token)) {
		t.Fatalf("expire confirmed: exit %d, the waiter %+v (after %d)\n%s%s", code, g, x, out, stderr)
	}
	if r, err := holder.release("jobs/x", x); err != nil || r.Type != wire.TypeNotHeld {
		t.Fatalf("the old holder's RELEASE: %v %v, want N", r.Type, err)
	}
	rec, err := sp.stderr.WaitJSON(from, "admin: expire now of a lock", sp.done, 30*time.Second)
	if err != nil || rec["level"] != "WARN" || !strings.Contains(fmt.Sprint(rec["by"]), `operator "alice"`) || rec["result"] != "expired" {
		t.Errorf("the expire's log line: %v %v", rec, err)
	}
	if strings.Contains(sp.stderr.String(), locksToken) {
		t.Error("the admin token is in the log")
	}
}

// TestLocksCommandOff: without --console-keys the commands say how to
// turn it on; without the token, what to give; --console-keys without
// --admin-token does not start.
func TestLocksCommandOff(t *testing.T) {
	_, _, adm := serveLocks(t)
	code, _, stderr := runCapture(t, "locks", "list", "--admin", adm, "--admin-token", locksToken)
	if code != 1 || !strings.Contains(stderr, "the lock browser is off") || !strings.Contains(stderr, "--console-keys") ||
		!strings.Contains(stderr, "uncomment the line '# console-keys: true'") || !strings.Contains(stderr, "restart the node") {
		t.Errorf("locks list, browser off: exit %d: %s", code, stderr)
	}
	code, _, stderr = runCapture(t, "locks", "show", "k", "--admin", adm)
	if code != 1 || !strings.Contains(stderr, "no admin token given") {
		t.Errorf("locks show without a token: exit %d: %s", code, stderr)
	}
	code, _, stderr = runCapture(t, "serve", "--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0", "--data-dir", t.TempDir(), "--console-keys")
	if code != 2 || !strings.Contains(stderr, "--console-keys needs --admin-listen and --admin-token") {
		t.Errorf("serve --console-keys without --admin-token: exit %d: %s", code, stderr)
	}
	code, _, stderr = runCapture(t, "locks", "expire", "k", "--admin", adm)
	if code != 2 || !strings.Contains(stderr, "--token is required") {
		t.Errorf("locks expire without --token: exit %d: %s", code, stderr)
	}
}
