package lockcore

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"sort"
	"strings"
)

// memLog is an in-memory replicated log for tests: a Proposer that is also
// the Machine the log's commands apply to. It uses only lockcore's exported
// API: it decodes each proposal's command bytes (Proposal.AppendCommand) and
// applies them to its own holdings table with its own rules, so that it
// cross-checks the Core rather than repeating it.
//
// Sync (async false), Propose applies the command at once and returns its
// result, as a standalone server's token store does. Async, Propose only
// appends it to the log; Step applies the oldest command in flight and
// returns it and its result, which the driver hands to Core.Applied (a Raft
// leader's apply loop).
//
// Every apply is checked: a Grant must find its key free and a Free must
// find its key held by its token (and, for a RELEASE, by a holding a plain
// RELEASE may free; for a RELEASE_OWNED, by its owner). Applying in log
// order, a Core whose projection is right never proposes anything else.
// What fails is recorded in violations, and the Machine answers as a real
// one would (Held, or not Freed).
type memLog struct {
	async bool
	seq   uint64
	last  uint64 // the highest token issued
	held  map[string]memHolding
	// flight is the commands proposed and not yet applied, oldest first.
	flight []memEntry
	// noToken are the results the next grants applied get instead of a
	// token (a token store that has to wait, has failed, or is exhausted).
	noToken []Result
	// diverged keys were changed behind the Core's back (forget): a command
	// on them that does not apply as projected is not a violation.
	diverged   map[string]bool
	violations []string
	trace      []string
	// name gives the session of a Proposal.By for the trace.
	name func(by uint64) string
}

type memHolding struct {
	owner Owner
	token uint64
	lease uint8
	owned bool
}

type memEntry struct {
	p   *Proposal
	cmd memCmd
}

// memCmd is a decoded command (the layout in effect.go).
type memCmd struct {
	seq    uint64
	free   bool
	extend bool // an Extend: token, owner (the holder), lease
	key    string
	token  uint64 // Free: the token it ends
	kind   uint8  // Free: FreeRelease, FreeReleaseOwned, FreeExpire
	owner  Owner  // Free: the releaser's owner
	// The grant: of a Grant, or of a Free's next waiter (next).
	next      bool
	to        Owner
	lease     uint8
	ownedOnly bool
}

// Errors of the token store a test makes fail (nexttoken-fails).
var (
	errTokenRetry     = errors.New("token reservation in progress")
	errTokenFatal     = errors.New("token store failed")
	errTokenExhausted = errors.New("tokens exhausted")
)

func newMemLog(async bool) *memLog {
	return &memLog{async: async, held: make(map[string]memHolding), diverged: make(map[string]bool)}
}

func (l *memLog) violate(format string, args ...any) {
	l.violations = append(l.violations, fmt.Sprintf(format, args...))
}

// Propose implements Proposer.
func (l *memLog) Propose(p *Proposal) bool {
	r, ok := l.propose(p)
	if ok {
		p.SetResult(r)
	}
	return ok
}

func (l *memLog) propose(p *Proposal) (Result, bool) {
	l.seq++
	b := p.AppendCommand(nil, l.seq)
	cmd, err := decodeCmd(b)
	if err != nil {
		l.violate("propose: %v (% x)", err, b)
	}
	if cmd.seq != l.seq || cmd.key != p.Key() || cmd.free != p.IsFree() || cmd.extend != p.IsExtend() ||
		(!cmd.free && !cmd.extend || cmd.next) != p.Grants() {
		l.violate("propose #%d: command %+v does not match the proposal (key %q free %v grants %v)",
			l.seq, cmd, p.Key(), p.IsFree(), p.Grants())
	}
	if p.Expiry() && (!cmd.free || cmd.kind != FreeExpire) {
		l.violate("propose #%d: an expiry that is not a Free of kind expire", l.seq)
	}
	by := "nobody"
	if p.By() != 0 {
		by = fmt.Sprint(p.By())
		if l.name != nil {
			by = l.name(p.By())
		}
	}
	if !l.async {
		r := l.apply(cmd)
		l.trace = append(l.trace, fmt.Sprintf("log#%d %s (by %s) -> %s", cmd.seq, cmd, by, resultString(cmd, r)))
		return r, true
	}
	l.flight = append(l.flight, memEntry{p, cmd})
	l.trace = append(l.trace, fmt.Sprintf("log#%d %s (by %s) ...", cmd.seq, cmd, by))
	return Result{}, false
}

// Step applies the oldest command in flight (async) and returns its
// proposal and result, for Core.Applied.
func (l *memLog) Step() (*Proposal, Result, bool) {
	if len(l.flight) == 0 {
		return nil, Result{}, false
	}
	m := l.flight[0]
	l.flight = l.flight[1:]
	r := l.apply(m.cmd)
	l.trace = append(l.trace, fmt.Sprintf("apply log#%d -> %s", m.cmd.seq, resultString(m.cmd, r)))
	return m.p, r, true
}

func (l *memLog) apply(c memCmd) Result {
	h, held := l.held[c.key]
	if c.extend {
		if !held || h.token != c.token || h.owner != c.owner {
			if !l.diverged[c.key] {
				l.violate("log#%d: Extend of %q token %d by %s, which does not hold it (held %v: %+v)", c.seq, c.key, c.token, ownerString(c.owner), held, h)
			}
			return Result{}
		}
		h.lease = c.lease
		l.held[c.key] = h
		return Result{Kept: true}
	}
	if !c.free {
		if held {
			if !l.diverged[c.key] {
				l.violate("log#%d: Grant of %q, held by %s with token %d", c.seq, c.key, ownerString(h.owner), h.token)
			}
			return Result{Held: true}
		}
		return l.grant(c)
	}
	ok := held && h.token == c.token
	switch c.kind {
	case FreeRelease:
		ok = ok && !h.owned
	case FreeReleaseOwned:
		ok = ok && h.owner == c.owner
	case FreeExpire:
	default:
		l.violate("log#%d: Free of unknown kind %d", c.seq, c.kind)
		ok = false
	}
	if !ok {
		if !l.diverged[c.key] {
			l.violate("log#%d: Free of %q token %d (kind %d), which does not hold it (held %v: %+v)", c.seq, c.key, c.token, c.kind, held, h)
		}
		return Result{}
	}
	delete(l.held, c.key)
	r := Result{Freed: true}
	if c.next {
		r = l.grant(c)
		r.Freed = true
	}
	return r
}

func (l *memLog) grant(c memCmd) Result {
	if len(l.noToken) > 0 {
		r := l.noToken[0]
		l.noToken = l.noToken[1:]
		return r
	}
	l.last++
	l.held[c.key] = memHolding{owner: c.to, token: l.last, lease: c.lease, owned: c.ownedOnly}
	return Result{Token: l.last}
}

// failNext makes the next grant applied get no token: mode retry, fatal or
// exhausted.
func (l *memLog) failNext(mode string) error {
	switch mode {
	case "retry":
		l.noToken = append(l.noToken, Result{Retry: true, Err: errTokenRetry})
	case "fatal":
		l.noToken = append(l.noToken, Result{Fatal: true, Err: errTokenFatal})
	case "exhausted":
		l.noToken = append(l.noToken, Result{Err: errTokenExhausted})
	default:
		return fmt.Errorf("unknown token failure %q", mode)
	}
	return nil
}

// restore sets the Machine's holdings to hs (what a new leader applied).
func (l *memLog) restore(hs []Holding) {
	clear(l.held)
	for _, h := range hs {
		l.held[h.Key] = memHolding{owner: h.Owner, token: h.Token, lease: h.LeaseS, owned: h.OwnedOnly}
		l.last = max(l.last, h.Token)
	}
}

// holdings returns the Machine's holdings, sorted by key.
func (l *memLog) holdings() []Holding {
	hs := make([]Holding, 0, len(l.held))
	for k, h := range l.held {
		hs = append(hs, Holding{Key: k, Owner: h.owner, Token: h.token, LeaseS: h.lease, OwnedOnly: h.owned})
	}
	sort.Slice(hs, func(i, j int) bool { return hs[i].Key < hs[j].Key })
	return hs
}

// inFlight reports whether a command on key is in flight.
func (l *memLog) inFlight(key string) bool {
	for _, m := range l.flight {
		if m.cmd.key == key {
			return true
		}
	}
	return false
}

func (l *memLog) takeTrace() []string {
	t := l.trace
	l.trace = nil
	return t
}

func decodeCmd(b []byte) (memCmd, error) {
	var c memCmd
	if len(b) < 1 {
		return c, errors.New("empty command")
	}
	typ := b[0]
	seq, n := binary.Uvarint(b[1:])
	if n <= 0 {
		return c, errors.New("bad seq")
	}
	c.seq = seq
	b = b[1+n:]
	if len(b) < 1 || len(b) < 1+int(b[0]) {
		return c, errors.New("short key")
	}
	c.key, b = string(b[1:1+int(b[0])]), b[1+int(b[0]):]
	grantee := func(b []byte) ([]byte, error) {
		if len(b) < len(c.to)+2 {
			return nil, errors.New("short grant")
		}
		copy(c.to[:], b)
		b = b[len(c.to):]
		c.lease, c.ownedOnly = b[0], b[1]&flagOwned != 0
		if b[1]&^flagOwned != 0 {
			return nil, fmt.Errorf("unknown flags %#x", b[1])
		}
		return b[2:], nil
	}
	var err error
	switch typ {
	case CmdGrant:
		c.next = true
		b, err = grantee(b)
	case CmdFree:
		c.free = true
		if len(b) < 8+1+len(c.owner)+1 {
			return c, errors.New("short free")
		}
		c.token, c.kind = binary.BigEndian.Uint64(b), b[8]
		copy(c.owner[:], b[9:])
		b = b[9+len(c.owner):]
		switch b[0] {
		case 0:
			b = b[1:]
		case 1:
			c.next = true
			b, err = grantee(b[1:])
		default:
			return c, fmt.Errorf("bad next flag %d", b[0])
		}
	case CmdExtend:
		c.extend = true
		if len(b) < 8+len(c.owner)+1 {
			return c, errors.New("short extend")
		}
		c.token = binary.BigEndian.Uint64(b)
		copy(c.owner[:], b[8:])
		c.lease = b[8+len(c.owner)]
		b = b[8+len(c.owner)+1:]
	default:
		return c, fmt.Errorf("unknown command type %d", typ)
	}
	if err == nil && len(b) != 0 {
		err = fmt.Errorf("%d bytes after the command", len(b))
	}
	return c, err
}

func (c memCmd) String() string {
	var sb strings.Builder
	grant := func() {
		fmt.Fprintf(&sb, "%s lease=%ds", ownerString(c.to), c.lease)
		if c.ownedOnly {
			sb.WriteString(" owned-only")
		}
	}
	if c.extend {
		fmt.Fprintf(&sb, "extend %s token=%d by %s lease=%ds", c.key, c.token, ownerString(c.owner), c.lease)
		return sb.String()
	}
	if !c.free {
		fmt.Fprintf(&sb, "grant %s ", c.key)
		grant()
		return sb.String()
	}
	fmt.Fprintf(&sb, "free %s token=%d ", c.key, c.token)
	switch c.kind {
	case FreeRelease:
		sb.WriteString("release")
	case FreeReleaseOwned:
		fmt.Fprintf(&sb, "release-owned by %s", ownerString(c.owner))
	case FreeExpire:
		sb.WriteString("expire")
	default:
		fmt.Fprintf(&sb, "kind=%d", c.kind)
	}
	if c.next {
		sb.WriteString(" next=")
		grant()
	}
	return sb.String()
}

func resultString(c memCmd, r Result) string {
	if c.extend {
		if r.Kept {
			return "kept"
		}
		return "not kept"
	}
	var parts []string
	if c.free {
		if r.Freed {
			parts = append(parts, "freed")
		} else {
			parts = append(parts, "not freed")
		}
	}
	if !c.free || c.next && r.Freed {
		switch {
		case r.Token != 0:
			parts = append(parts, fmt.Sprintf("token=%d", r.Token))
		case r.Held:
			parts = append(parts, "held")
		case r.Retry:
			parts = append(parts, fmt.Sprintf("no token (retry: %v)", r.Err))
		case r.Fatal:
			parts = append(parts, fmt.Sprintf("no token (fatal: %v)", r.Err))
		default:
			parts = append(parts, fmt.Sprintf("no token (%v)", r.Err))
		}
	}
	return strings.Join(parts, " ")
}

func ownerOfString(s string) Owner {
	var o Owner
	copy(o[:], s)
	return o
}

func ownerString(o Owner) string {
	return string(bytes.TrimRight(o[:], "\x00"))
}
