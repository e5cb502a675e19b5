package lockcore

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// The scripts in testdata/*.txt drive a Core over the in-memory log with a
// fake now, the way etcd raft's interaction tests do. Each block is one
// command line, a "----" line, and the expected output up to a blank line:
// the log's proposals and applies ("log#N ... -> result", "... ..." for one
// in flight, "apply log#N -> result"), then the Core's effects, one a line.
// Lines starting with # are comments. testdata/README.md maps the
// server's lock-semantics tests (removed, or kept end to end) to the
// scripts that test their decisions.
//
// Commands (times are Go durations from 0, or 0; a command without t=
// happens at the last time given):
//
//	config [max-locks=100] [max-waiters=100] [max-key-waiters=100] [max-pending=0]
//	       [max-commit=0] [early-release] [token-wait=0] [log=sync|async]   a new Core and log
//	acquire t= s= req= key= owner= lease= wait= [owned-only] [arrived=]
//	release t= s= req= key= token= [owner=] [owned]
//	expire t= s= req= key= token=   an operator's Expire (answered to s)
//	locks [t=] [prefix=] [after=] [limit=10]   the lock browser's page (Core.Locks)
//	lock [t=] key=              one key's holding and its queue (Core.Lock)
//	cancel [t=] s= req=         CANCEL of a recorded ACQUIRE
//	drop s= req=                Drop of a recorded ACQUIRE (a closing session)
//	kill s=                     the session stops being live
//	tick t=
//	tokens-ready t=             the token store's reservation ended (TokensReady)
//	apply [n=1|all] [t=]        the log applies its oldest commands in flight
//	nexttoken-fails retry|fatal|exhausted   the next grant applied gets no token
//	promote t= [margin=] [holdings=key:owner:token:lease[:owned],...]
//	demote
//	forget key=                 the Machine loses key's holding (a divergence)
//	machine-hold key= owner= [lease=]   the Machine holds key (a divergence)
//	resync [t=] key=            Resync with the Machine's holding of key
//	next                        Next and NextExpiry
//	state                       the Core's keys and counters
//	open                        the requests still awaiting an answer
//
// Every event is checked by the harness (see harness); a broken invariant
// fails the test whatever the expected output says. With -rewrite the
// expected outputs are written back from what the Core did: read the diff.
var rewrite = flag.Bool("rewrite", false, "rewrite the expected outputs of testdata/*.txt")

func TestScripts(t *testing.T) {
	files, err := filepath.Glob("testdata/*.txt")
	if err != nil {
		t.Fatal(err)
	}
	if len(files) == 0 {
		t.Fatal("no scripts in testdata")
	}
	for _, f := range files {
		t.Run(strings.TrimSuffix(filepath.Base(f), ".txt"), func(t *testing.T) { runScript(t, f) })
	}
}

type block struct {
	pre  []string // comments and blank lines before the command
	cmd  string
	line int
	want []string
}

func parseScript(t *testing.T, path string) ([]block, []string) {
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	var bs []block
	var pre []string
	for i := 0; i < len(lines); i++ {
		l := lines[i]
		if strings.TrimSpace(l) == "" || strings.HasPrefix(l, "#") {
			pre = append(pre, l)
			continue
		}
		b := block{pre: pre, cmd: l, line: i + 1}
		pre = nil
		if i+1 >= len(lines) || lines[i+1] != "----" {
			t.Fatalf("%s:%d: %q is not followed by ----", path, i+1, l)
		}
		i += 2
		for ; i < len(lines) && lines[i] != ""; i++ {
			b.want = append(b.want, lines[i])
		}
		bs = append(bs, b)
	}
	return bs, pre
}

func runScript(t *testing.T, path string) {
	bs, trailer := parseScript(t, path)
	var h *harness
	var sb strings.Builder
	for i := range bs {
		b := &bs[i]
		if h == nil && !strings.HasPrefix(b.cmd, "config") {
			h = newHarness(Config{MaxKeyWaiters: 100}, false)
		}
		got, err := runCommand(&h, b.cmd)
		if err != nil {
			t.Fatalf("%s:%d: %s: %v", path, b.line, b.cmd, err)
		}
		for _, e := range h.errs {
			t.Errorf("%s:%d: %s: invariant: %s", path, b.line, b.cmd, e)
		}
		h.errs = nil
		if !*rewrite && strings.Join(got, "\n") != strings.Join(b.want, "\n") {
			t.Errorf("%s:%d: %s\ngot:\n%s\nwant:\n%s", path, b.line, b.cmd, strings.Join(got, "\n"), strings.Join(b.want, "\n"))
		}
		for _, l := range b.pre {
			sb.WriteString(l + "\n")
		}
		sb.WriteString(b.cmd + "\n----\n")
		for _, l := range got {
			sb.WriteString(l + "\n")
		}
		sb.WriteString("\n")
	}
	for _, l := range trailer {
		if strings.TrimSpace(l) != "" {
			sb.WriteString(l + "\n")
		}
	}
	if *rewrite {
		if err := os.WriteFile(path, []byte(strings.TrimRight(sb.String(), "\n")+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

type args struct {
	kv    map[string]string
	flags map[string]bool
	used  map[string]bool
}

func parseArgs(fields []string) *args {
	a := &args{kv: map[string]string{}, flags: map[string]bool{}, used: map[string]bool{}}
	for _, f := range fields {
		if k, v, ok := strings.Cut(f, "="); ok {
			a.kv[k] = v
		} else {
			a.flags[f] = true
		}
	}
	return a
}

func (a *args) has(k string) bool { _, ok := a.kv[k]; return ok }

func (a *args) str(k string) (string, error) {
	a.used[k] = true
	v, ok := a.kv[k]
	if !ok {
		return "", fmt.Errorf("missing %s=", k)
	}
	return v, nil
}

func (a *args) flag(k string) bool {
	a.used[k] = true
	return a.flags[k]
}

func (a *args) uint(k string, def uint64) (uint64, error) {
	a.used[k] = true
	v, ok := a.kv[k]
	if !ok {
		return def, nil
	}
	return strconv.ParseUint(v, 10, 64)
}

func (a *args) dur(k string, def int64) (int64, error) {
	a.used[k] = true
	v, ok := a.kv[k]
	if !ok {
		return def, nil
	}
	if v == "0" {
		return 0, nil
	}
	d, err := time.ParseDuration(v)
	return int64(d), err
}

// done reports the arguments the command did not use.
func (a *args) done() error {
	for k := range a.kv {
		if !a.used[k] {
			return fmt.Errorf("unknown argument %s=", k)
		}
	}
	for k := range a.flags {
		if !a.used[k] {
			return fmt.Errorf("unknown flag %s", k)
		}
	}
	return nil
}

func runCommand(hp **harness, line string) ([]string, error) {
	fields := strings.Fields(line)
	cmd, a := fields[0], parseArgs(fields[1:])
	h := *hp
	if cmd != "config" {
		now, err := a.dur("t", h.now)
		if err != nil {
			return nil, err
		}
		if now < h.now {
			return nil, fmt.Errorf("time goes back from %s to %s", fmtTime(h.now), fmtTime(now))
		}
		h.now = now
		h.out = nil
	}
	sessAndReq := func() (string, uint32, error) {
		s, err := a.str("s")
		if err != nil {
			return "", 0, err
		}
		id, err := a.uint("req", 0)
		if err == nil && !a.has("req") {
			err = fmt.Errorf("missing req=")
		}
		return s, uint32(id), err
	}
	// sessKeyToken reads s=, req=, key= and token=.
	sessKeyToken := func() (s string, id uint32, key string, token uint64, err error) {
		if s, id, err = sessAndReq(); err != nil {
			return
		}
		if key, err = a.str("key"); err != nil {
			return
		}
		token, err = a.uint("token", 0)
		return
	}
	var err error
	switch cmd {
	case "config":
		var cfg Config
		var locks, waiters, keyWaiters, pending uint64
		if locks, err = a.uint("max-locks", 100); err != nil {
			return nil, err
		}
		if waiters, err = a.uint("max-waiters", 100); err != nil {
			return nil, err
		}
		if keyWaiters, err = a.uint("max-key-waiters", 100); err != nil {
			return nil, err
		}
		if pending, err = a.uint("max-pending", 0); err != nil {
			return nil, err
		}
		if cfg.MaxCommit, err = a.dur("max-commit", 0); err != nil {
			return nil, err
		}
		cfg.EarlyRelease = a.flag("early-release")
		if cfg.TokenWait, err = a.dur("token-wait", 0); err != nil {
			return nil, err
		}
		cfg.Capacity = &Capacity{MaxLocks: int64(locks), MaxWaiters: int64(waiters)}
		cfg.MaxKeyWaiters, cfg.MaxPending = int(keyWaiters), int(pending)
		mode := "sync"
		if a.has("log") {
			mode, _ = a.str("log")
		}
		if mode != "sync" && mode != "async" {
			return nil, fmt.Errorf("log=%s", mode)
		}
		h = newHarness(cfg, mode == "async")
		*hp = h
		h.out = nil
	case "acquire":
		s, id, err := sessAndReq()
		if err != nil {
			return nil, err
		}
		key, err := a.str("key")
		if err != nil {
			return nil, err
		}
		owner, err := a.str("owner")
		if err != nil {
			return nil, err
		}
		lease, err := a.uint("lease", 10)
		if err != nil {
			return nil, err
		}
		wait, err := a.uint("wait", 0)
		if err != nil {
			return nil, err
		}
		arrived, err := a.dur("arrived", h.now)
		if err != nil {
			return nil, err
		}
		h.acquire(s, id, key, ownerOfString(owner), uint8(lease), uint8(wait), a.flag("owned-only"), arrived)
	case "release":
		s, id, key, token, err := sessKeyToken()
		if err != nil {
			return nil, err
		}
		var owner Owner
		if a.has("owner") {
			o, _ := a.str("owner")
			owner = ownerOfString(o)
		}
		h.release(s, id, key, token, owner, a.flag("owned"))
	case "extend":
		s, id, key, token, err := sessKeyToken()
		if err != nil {
			return nil, err
		}
		o, err := a.str("owner")
		if err != nil {
			return nil, err
		}
		lease, err := a.uint("lease", 0)
		if err != nil {
			return nil, err
		}
		h.extend(s, id, key, token, ownerOfString(o), uint8(lease))
	case "expire":
		s, id, key, token, err := sessKeyToken()
		if err != nil {
			return nil, err
		}
		h.expire(s, id, key, token)
	case "locks":
		var q LockQuery
		if a.has("prefix") {
			q.Prefix, _ = a.str("prefix")
		}
		if a.has("after") {
			q.After, _ = a.str("after")
		}
		limit, err := a.uint("limit", 10)
		if err != nil {
			return nil, err
		}
		q.Limit = int(limit)
		page, more := fullPage(func(q LockQuery, max int, page []LockInfo) ([]LockInfo, ScanResult) {
			return h.core.Scan(h.now, q, max, page)
		}, q)
		for _, l := range page {
			h.out = append(h.out, fmtLockInfo(&l, h.now))
		}
		h.out = append(h.out, fmt.Sprintf("(%d, more=%v)", len(page), more))
	case "lock":
		key, err := a.str("key")
		if err != nil {
			return nil, err
		}
		d, ok := h.core.Lock(h.now, key)
		if !ok {
			h.out = append(h.out, "not held")
			break
		}
		h.out = append(h.out, fmtLockInfo(&d.LockInfo, h.now))
		for i, w := range d.Queue {
			h.out = append(h.out, fmt.Sprintf("  %d. %s lease=%ds wait-left=%s%s", i+1, fmtWaiter(&w), w.LeaseS,
				time.Duration(w.Deadline-h.now), map[bool]string{true: " owned-only"}[w.OwnedOnly]))
		}
	case "cancel", "drop":
		s, id, err := sessAndReq()
		if err != nil {
			return nil, err
		}
		if cmd == "cancel" {
			h.cancel(s, id)
		} else {
			h.drop(s, id)
		}
	case "kill":
		s, err := a.str("s")
		if err != nil {
			return nil, err
		}
		h.kill(s)
	case "tick":
		h.tick()
	case "tokens-ready":
		h.tokensReady()
	case "apply":
		n := 1
		if a.has("n") {
			v, _ := a.str("n")
			if v == "all" {
				n = -1
			} else if n, err = strconv.Atoi(v); err != nil {
				return nil, err
			}
		}
		if !h.log.async {
			return nil, fmt.Errorf("apply with a sync log")
		}
		h.apply(n)
	case "nexttoken-fails":
		for _, m := range []string{"retry", "fatal", "exhausted"} {
			if a.flag(m) {
				if err := h.log.failNext(m); err != nil {
					return nil, err
				}
			}
		}
	case "promote":
		margin, err := a.dur("margin", 0)
		if err != nil {
			return nil, err
		}
		var hs []Holding
		if a.has("holdings") {
			v, _ := a.str("holdings")
			hs = []Holding{}
			for _, s := range strings.Split(v, ",") {
				p := strings.Split(s, ":")
				if len(p) < 4 || len(p) > 5 || len(p) == 5 && p[4] != "owned" {
					return nil, fmt.Errorf("holding %q: want key:owner:token:lease[:owned]", s)
				}
				tok, err := strconv.ParseUint(p[2], 10, 64)
				if err != nil {
					return nil, err
				}
				lease, err := strconv.ParseUint(p[3], 10, 8)
				if err != nil {
					return nil, err
				}
				hs = append(hs, Holding{Key: p[0], Owner: ownerOfString(p[1]), Token: tok, LeaseS: uint8(lease), OwnedOnly: len(p) == 5})
			}
		} else if len(h.log.flight) > 0 {
			return nil, fmt.Errorf("promote from the Machine's holdings with commands in flight")
		}
		h.promote(hs, margin)
	case "demote":
		h.demote()
	case "forget":
		key, err := a.str("key")
		if err != nil {
			return nil, err
		}
		delete(h.log.held, key)
		h.log.diverged[key] = true
	case "machine-hold":
		key, err := a.str("key")
		if err != nil {
			return nil, err
		}
		owner, err := a.str("owner")
		if err != nil {
			return nil, err
		}
		lease, err := a.uint("lease", 10)
		if err != nil {
			return nil, err
		}
		h.log.last++
		h.log.held[key] = memHolding{owner: ownerOfString(owner), token: h.log.last, lease: uint8(lease)}
		h.log.diverged[key] = true
	case "resync":
		key, err := a.str("key")
		if err != nil {
			return nil, err
		}
		h.resync(key)
	case "next":
		h.out = append(h.out, fmt.Sprintf("next=%s expiry=%s", fmtTime(h.core.Next()), fmtTime(h.core.NextExpiry())))
	case "state":
		h.out = append(h.out, h.state()...)
	case "open":
		if o := h.open(); len(o) > 0 {
			h.out = append(h.out, "open: "+strings.Join(o, " "))
		} else {
			h.out = append(h.out, "open: none")
		}
	default:
		return nil, fmt.Errorf("unknown command %q", cmd)
	}
	if err := a.done(); err != nil {
		return nil, err
	}
	if len(h.out) == 0 {
		return []string{"ok"}, nil
	}
	return h.out, nil
}

// fmtLockInfo is a lock of the browser's view, one line.
func fmtLockInfo(l *LockInfo, now int64) string {
	client := "client=none"
	if l.Client != nil {
		client = fmt.Sprintf("client=%s@%s", l.Client.Name, l.Client.Addr)
	}
	s := fmt.Sprintf("%s token=%d by %s lease=%ds left=%s waiters=%d %s", l.Key, l.Token, ownerString(l.Owner), l.LeaseS,
		time.Duration(l.LeaseEnd-now), l.Waiters, client)
	if l.OwnedOnly {
		s += " owned-only"
	}
	return s
}

func fmtWaiter(w *WaiterInfo) string {
	if w.Client == nil {
		return ownerString(w.Owner) + " client=none"
	}
	return fmt.Sprintf("%s client=%s@%s", ownerString(w.Owner), w.Client.Name, w.Client.Addr)
}
