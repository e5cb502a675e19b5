package bstar

import (
	"errors"
	"math"
	"testing"
	"time"
)

var (
	states = []State{Primary, Backup, Active, Passive}
	events = []Event{PeerPrimary, PeerBackup, PeerActive, PeerPassive, ClientRequest}
)

// timing is the (now, peerExpiry) a row is stepped with.
type timing struct {
	name        string
	now, expiry int64
}

var (
	peerAlive   = timing{"peer alive", 1000, 2000}
	peerExpired = timing{"peer expiry reached", 2000, 2000}
	peerSilent  = timing{"peer silent", 3000, 2000}
	neverHeard  = timing{"no heartbeat yet", 3000, 0}
	timings     = []timing{peerAlive, peerExpired, peerSilent, neverHeard}
)

// TestStepTable steps every (state, event) pair, each under every timing
// unless the row names its timings (only PASSIVE + CLIENT_REQUEST depends
// on the peer's expiry), and checks that every pair and timing is covered
// by exactly one row. The comments cite the Guide's Ruby port of
// bstarsrv.c (Guide 004); "no entry" means the Guide's $fsm_states has no
// row for the pair, so run_fsm returns without a change (Guide lines
// 103-104) and a client request is answered.
func TestStepTable(t *testing.T) {
	type want struct {
		next       State
		transition bool
		serve      bool
		err        error
	}
	rows := []struct {
		s    State
		e    Event
		at   []timing // nil: every timing, with the same outcome
		want want
	}{
		// PRIMARY
		{Primary, PeerPrimary, nil, want{next: Primary}},                  // no entry (two primaries: not detected by the Guide's example)
		{Primary, PeerBackup, nil, want{next: Active, transition: true}},  // the Ruby port
		{Primary, PeerActive, nil, want{next: Passive, transition: true}}, // the Ruby port
		{Primary, PeerPassive, nil, want{next: Primary}},                  // no entry: the peer goes active first
		{Primary, ClientRequest, nil, want{next: Primary, serve: true}},   // no entry: served, a primary serves before the backup appears
		// BACKUP
		{Backup, PeerPrimary, nil, want{next: Backup}},                   // no entry: the primary goes active first
		{Backup, PeerBackup, nil, want{next: Backup}},                    // no entry (two backups: not detected by the Guide's example)
		{Backup, PeerActive, nil, want{next: Passive, transition: true}}, // the Ruby port
		{Backup, PeerPassive, nil, want{next: Backup}},                   // no entry: the peer goes active first
		{Backup, ClientRequest, nil, want{next: Backup}},                 // the Ruby port: refused even with the peer silent: a backup does not serve
		// ACTIVE
		{Active, PeerPrimary, nil, want{next: Active}},                     // no entry: the peer restarts, goes passive
		{Active, PeerBackup, nil, want{next: Active}},                      // no entry: the peer restarts, goes passive
		{Active, PeerActive, nil, want{next: Active, err: ErrDualActives}}, // the Ruby port: dual actives (the Guide's example aborts)
		{Active, PeerPassive, nil, want{next: Active}},                     // no entry: steady state
		{Active, ClientRequest, nil, want{next: Active, serve: true}},      // no entry: served
		// PASSIVE
		{Passive, PeerPrimary, nil, want{next: Active, transition: true}},      // the Ruby port: the peer restarted
		{Passive, PeerBackup, nil, want{next: Active, transition: true}},       // the Ruby port: the peer restarted
		{Passive, PeerActive, nil, want{next: Passive}},                        // no entry: steady state
		{Passive, PeerPassive, nil, want{next: Passive, err: ErrDualPassives}}, // the Ruby port: dual passives (the Guide's example aborts)
		// the Ruby port: a passive takes over on a client request
		// only once the peer went silent (bstarsrv.c: now >= peer_expiry);
		// before, the request is refused.
		{Passive, ClientRequest, []timing{peerAlive}, want{next: Passive}},
		{Passive, ClientRequest, []timing{peerExpired, peerSilent}, want{next: Active, transition: true, serve: true}},
		// the Ruby port asserts peer_expiry > 0: refused as invalid.
		{Passive, ClientRequest, []timing{neverHeard}, want{next: Passive, err: ErrInvalid}},
	}
	type cell struct {
		s  State
		e  Event
		tm string
	}
	covered := map[cell]int{}
	for _, r := range rows {
		at := r.at
		if at == nil {
			at = timings
		}
		for _, tm := range at {
			covered[cell{r.s, r.e, tm.name}]++
			out := Step(r.s, r.e, tm.now, tm.expiry)
			name := r.s.String() + "+" + r.e.String() + " (" + tm.name + ")"
			if out.Next != r.want.next || out.Transition != r.want.transition || out.Serve != r.want.serve {
				t.Errorf("%s: next %v transition %v serve %v, want %v %v %v", name,
					out.Next, out.Transition, out.Serve, r.want.next, r.want.transition, r.want.serve)
			}
			if r.want.err == nil && out.Err != nil || r.want.err != nil && !errors.Is(out.Err, r.want.err) {
				t.Errorf("%s: err %v, want %v", name, out.Err, r.want.err)
			}
			if out.Reason == "" {
				t.Errorf("%s: no reason for the log line", name)
			}
		}
	}
	for _, s := range states {
		for _, e := range events {
			for _, tm := range timings {
				if n := covered[cell{s, e, tm.name}]; n != 1 {
					t.Errorf("%v+%v (%s): %d rows, want 1", s, e, tm.name, n)
				}
			}
		}
	}
}

// TestStepPeerEventsNeverServe: Serve belongs to client requests only.
func TestStepPeerEventsNeverServe(t *testing.T) {
	for _, s := range states {
		for _, e := range events[:4] {
			for _, tm := range timings {
				if out := Step(s, e, tm.now, tm.expiry); out.Serve {
					t.Errorf("%v+%v: Serve set for a peer event", s, e)
				}
			}
		}
	}
}

func TestStepInvalid(t *testing.T) {
	cases := []struct {
		s State
		e Event
	}{
		{0, ClientRequest}, {5, ClientRequest}, {0, PeerActive}, {255, PeerBackup},
		{Active, 0}, {Active, 6}, {Passive, 0}, {Primary, 255},
	}
	for _, c := range cases {
		out := Step(c.s, c.e, 3000, 2000)
		if !errors.Is(out.Err, ErrInvalid) || out.Next != c.s || out.Serve || out.Transition || out.Reason == "" {
			t.Errorf("Step(%v, %v) = %+v, want ErrInvalid, state unchanged, not served", c.s, c.e, out)
		}
	}
}

// TestWireNumbers: the numbers are the Guide's (lines 45-54), and a
// heartbeat's state is the peer event's number (lines 175, 186).
func TestWireNumbers(t *testing.T) {
	for i, s := range states {
		if uint8(s) != uint8(i+1) || !s.Valid() {
			t.Errorf("%v is %d, want %d", s, s, i+1)
		}
		if e := PeerEvent(s); uint8(e) != uint8(s) || !e.Peer() {
			t.Errorf("PeerEvent(%v) = %v", s, e)
		}
	}
	for i, e := range events {
		if uint8(e) != uint8(i+1) || !e.Valid() {
			t.Errorf("%v is %d, want %d", e, e, i+1)
		}
	}
	if ClientRequest.Peer() || Event(0).Peer() || Event(6).Valid() || State(0).Valid() || State(5).Valid() {
		t.Error("Peer or Valid accepts a value out of range")
	}
	if e := PeerEvent(0); e.Valid() {
		t.Errorf("PeerEvent(0) = %v, want an invalid event", e)
	}
	if e := PeerEvent(5); e.Valid() {
		t.Errorf("PeerEvent(5) = %v, want an invalid event", e)
	}
	names := map[string]string{
		Primary.String(): "PRIMARY", Backup.String(): "BACKUP", Active.String(): "ACTIVE", Passive.String(): "PASSIVE",
		State(9).String():    "State(9)",
		PeerPrimary.String(): "PEER_PRIMARY", PeerBackup.String(): "PEER_BACKUP", PeerActive.String(): "PEER_ACTIVE",
		PeerPassive.String(): "PEER_PASSIVE", ClientRequest.String(): "CLIENT_REQUEST", Event(0).String(): "Event(0)",
	}
	for got, want := range names {
		if got != want {
			t.Errorf("String() = %q, want %q", got, want)
		}
	}
	if len(names) != 11 {
		t.Errorf("two values share a name: %v", names)
	}
}

// TestExpiry: the peer is dead DeadAfter (2) heartbeats after its last one
// .
func TestExpiry(t *testing.T) {
	cases := []struct {
		last      int64
		heartbeat time.Duration
		want      int64
	}{
		{0, time.Second, 2_000_000_000},
		{5, 1, 7},
		{1_000, 250 * time.Millisecond, 500_001_000},
		{-10, 5, 0},
		{math.MaxInt64 - 3, 1, math.MaxInt64 - 1},
		{math.MaxInt64 - 1, 1, math.MaxInt64},           // saturates
		{math.MaxInt64 - 1, time.Second, math.MaxInt64}, // saturates
		{0, math.MaxInt64 / 2, math.MaxInt64 - 1},       // 2 × (MaxInt64/2)
		{0, math.MaxInt64/2 + 1, math.MaxInt64},         // 2 × heartbeat overflows
		{7, 0, math.MaxInt64},                           // never dead
		{7, -time.Second, math.MaxInt64},                // never dead
	}
	for _, c := range cases {
		if got := Expiry(c.last, c.heartbeat); got != c.want {
			t.Errorf("Expiry(%d, %d) = %d, want %d", c.last, c.heartbeat, got, c.want)
		}
	}
}

func TestNew(t *testing.T) {
	for _, s := range []State{Primary, Backup} {
		m, err := New(s, time.Second)
		if err != nil || m != (Machine{State: s, Heartbeat: time.Second}) {
			t.Errorf("New(%v) = %+v, %v", s, m, err)
		}
	}
	for _, s := range []State{0, Active, Passive, 5} {
		if _, err := New(s, time.Second); !errors.Is(err, ErrInvalid) {
			t.Errorf("New(%v): err %v, want ErrInvalid", s, err)
		}
	}
	for _, hb := range []time.Duration{0, -1} {
		if _, err := New(Primary, hb); !errors.Is(err, ErrInvalid) {
			t.Errorf("New(Primary, %v): err %v, want ErrInvalid", hb, err)
		}
	}
}

// TestHandleExpiry: a heartbeat refreshes the peer expiry unless its
// outcome is an error; a client request never does.
func TestHandleExpiry(t *testing.T) {
	const hb = time.Second
	cases := []struct {
		name    string
		m       Machine
		e       Event
		refresh bool
	}{
		{"ignored heartbeat", Machine{Active, 5, hb}, PeerPassive, true},
		{"heartbeat that moves", Machine{Primary, 0, hb}, PeerBackup, true},
		{"heartbeat that moves from passive", Machine{Passive, 5, hb}, PeerPrimary, true},
		{"dual actives", Machine{Active, 5, hb}, PeerActive, false},
		{"dual passives", Machine{Passive, 5, hb}, PeerPassive, false},
		{"invalid event", Machine{Active, 5, hb}, 0, false},
		{"invalid state", Machine{0, 5, hb}, PeerActive, false},
		{"client served", Machine{Active, 5, hb}, ClientRequest, false},
		{"client refused", Machine{Backup, 5, hb}, ClientRequest, false},
		{"failover", Machine{Passive, 5, hb}, ClientRequest, false},
	}
	const now = 100
	for _, c := range cases {
		m, out := c.m.Handle(c.e, now)
		want := c.m.PeerExpiry
		if c.refresh {
			want = Expiry(now, hb)
		}
		if m.PeerExpiry != want || m.State != out.Next || m.Heartbeat != hb {
			t.Errorf("%s: %+v after %+v, want expiry %d and state %v", c.name, m, out, want, out.Next)
		}
		if again := Step(c.m.State, c.e, now, c.m.PeerExpiry); again.Next != out.Next || again.Serve != out.Serve || again.Reason != out.Reason {
			t.Errorf("%s: Handle's outcome %+v differs from Step's %+v", c.name, out, again)
		}
	}
}

// pair is two Machines and a peer link that is up or cut; time is in
// nanoseconds, and nothing here reads a clock.
type pair struct {
	t    *testing.T
	p, b Machine
	now  int64
}

const hb = time.Second

func newPair(t *testing.T) *pair {
	t.Helper()
	p, err := New(Primary, hb)
	if err != nil {
		t.Fatal(err)
	}
	b, err := New(Backup, hb)
	if err != nil {
		t.Fatal(err)
	}
	return &pair{t: t, p: p, b: b, now: 1}
}

// beat advances one heartbeat interval and delivers each node's state, as
// it was before the round, to the other (the heartbeats cross), and
// returns the outcomes at the primary and at the backup.
func (x *pair) beat() (atP, atB Outcome) {
	x.now += int64(hb)
	ps, bs := x.p.State, x.b.State
	x.p, atP = x.p.Handle(PeerEvent(bs), x.now)
	x.b, atB = x.b.Handle(PeerEvent(ps), x.now)
	return atP, atB
}

// beats runs n rounds that must raise no error.
func (x *pair) beats(n int) {
	x.t.Helper()
	for range n {
		if a, b := x.beat(); a.Err != nil || b.Err != nil {
			x.t.Fatalf("heartbeat: %v, %v", a.Err, b.Err)
		}
	}
}

// hello is a client's HELLO to m at the pair's now.
func (x *pair) hello(m *Machine) Outcome {
	var out Outcome
	*m, out = m.Handle(ClientRequest, x.now)
	return out
}

func (x *pair) want(p, b State) {
	x.t.Helper()
	if x.p.State != p || x.b.State != b {
		x.t.Fatalf("primary %v backup %v, want %v %v", x.p.State, x.b.State, p, b)
	}
}

func TestPairStartTogether(t *testing.T) {
	x := newPair(t)
	x.beats(1) // the primary hears BACKUP; the backup hears PRIMARY and waits
	x.want(Active, Backup)
	x.beats(1) // the backup hears ACTIVE
	x.want(Active, Passive)
	if !x.hello(&x.p).Serve || x.hello(&x.b).Serve {
		t.Fatal("the active must serve and the passive refuse while the peer is alive")
	}
	x.beats(5)
	x.want(Active, Passive)
}

func TestPairPrimaryServesAloneBackupDoesNot(t *testing.T) {
	x := newPair(t)
	for range 3 {
		x.now += int64(10 * hb) // no peer link: no heartbeat at all
		if out := x.hello(&x.p); !out.Serve || out.Transition {
			t.Fatalf("primary alone: %+v, want served as PRIMARY", out)
		}
		if out := x.hello(&x.b); out.Serve || out.Transition || out.Err != nil {
			t.Fatalf("backup alone: %+v, want refused", out)
		}
	}
	x.want(Primary, Backup)
	x.beats(2)
	x.want(Active, Passive)
}

func TestPairFailoverAndOldPrimaryComesBackPassive(t *testing.T) {
	x := newPair(t)
	x.beats(2)
	lastBeat := x.now
	// The primary dies: no more heartbeats. A client that lost it comes
	// to the backup one nanosecond before the expiry, then at it.
	x.now = Expiry(lastBeat, hb) - 1
	if out := x.hello(&x.b); out.Serve || out.Transition {
		t.Fatalf("before the expiry: %+v, want refused", out)
	}
	x.now++
	if out := x.hello(&x.b); !out.Serve || !out.Transition || out.Next != Active {
		t.Fatalf("at the expiry: %+v, want failover", out)
	}
	// The old primary restarts as PRIMARY: it hears ACTIVE and goes
	// passive; the backup hears PRIMARY and stays active.
	x.p, _ = New(Primary, hb)
	x.beats(1)
	x.want(Passive, Active)
	if x.hello(&x.p).Serve || !x.hello(&x.b).Serve {
		t.Fatal("the old primary must refuse and the backup serve")
	}
	x.beats(3)
	x.want(Passive, Active)
}

func TestPairPassiveRestarts(t *testing.T) {
	x := newPair(t)
	x.beats(2)
	x.b, _ = New(Backup, hb) // the passive restarts
	x.beats(1)
	x.want(Active, Passive)
	// And the active restarting makes the passive active at once (Guide
	// lines 87-88), without a client.
	x.p, _ = New(Primary, hb)
	x.beats(1) // the backup hears PRIMARY and goes active
	x.want(Primary, Active)
	x.beats(1) // the primary hears ACTIVE and goes passive
	x.want(Passive, Active)
}

// TestPairCutLinkWithoutClientsAtBackup: a cut peer link alone, with every
// client still reaching the primary, never makes the backup active: the
// client is the witness.
func TestPairCutLinkWithoutClientsAtBackup(t *testing.T) {
	x := newPair(t)
	x.beats(2)
	for range 10 {
		x.now += int64(10 * hb) // the link is cut: no heartbeats
		if !x.hello(&x.p).Serve {
			t.Fatal("the primary must keep serving")
		}
	}
	x.want(Active, Passive)
	// The link heals: the backup hears ACTIVE again, and its peer counts as
	// alive: a stray client request is refused.
	x.beats(1)
	if out := x.hello(&x.b); out.Serve {
		t.Fatalf("passive after the link healed: %+v, want refused", out)
	}
	x.want(Active, Passive)
}

// TestPairSplitBrainDualActives: a cut link and a client at the backup
// make both active; when the link heals both see dual actives, stay
// active (the epoch rule decides, later) and do not refresh the expiry.
func TestPairSplitBrainDualActives(t *testing.T) {
	x := newPair(t)
	x.beats(2)
	x.now += int64(3 * hb)
	if !x.hello(&x.b).Serve || !x.hello(&x.p).Serve {
		t.Fatal("both sides of the split must serve")
	}
	x.want(Active, Active)
	before := [2]int64{x.p.PeerExpiry, x.b.PeerExpiry}
	atP, atB := x.beat()
	if !errors.Is(atP.Err, ErrDualActives) || !errors.Is(atB.Err, ErrDualActives) {
		t.Fatalf("after the heal: %v, %v, want dual actives", atP.Err, atB.Err)
	}
	x.want(Active, Active)
	if [2]int64{x.p.PeerExpiry, x.b.PeerExpiry} != before {
		t.Fatal("a fatal heartbeat refreshed the peer expiry")
	}
}

// TestPairDualPassivesRecover: dual passives are reported on both sides
// and, the expiry not being refreshed, the first client request after it
// makes one node active; the other then stays passive.
func TestPairDualPassivesRecover(t *testing.T) {
	x := newPair(t)
	x.p = Machine{Passive, Expiry(x.now, hb), hb}
	x.b = Machine{Passive, Expiry(x.now, hb), hb}
	atP, atB := x.beat()
	if !errors.Is(atP.Err, ErrDualPassives) || !errors.Is(atB.Err, ErrDualPassives) {
		t.Fatalf("%v, %v, want dual passives", atP.Err, atB.Err)
	}
	x.beat()
	if out := x.hello(&x.b); !out.Serve || out.Next != Active {
		t.Fatalf("client after the stale expiry: %+v, want failover", out)
	}
	x.beats(3)
	x.want(Passive, Active)
}
