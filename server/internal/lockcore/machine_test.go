package lockcore_test

import (
	"bytes"
	"encoding/hex"
	"errors"
	"math/rand/v2"
	"reflect"
	"testing"

	"github.com/ticketing-dev/ticketing/internal/wire"
	"github.com/ticketing-dev/ticketing/server/internal/lockcore"
)

var ownA, ownB = lockcore.Owner{1}, lockcore.Owner{2}

// A machine in each state a key can be in, for the table tests.
func machineIn(t *testing.T, state string) *lockcore.Machine {
	t.Helper()
	sm := lockcore.NewMachine()
	switch state {
	case "absent":
	case "free": // held once, released
		sm.Grant("k", ownA, 30, false, 0)
		sm.Free(lockcore.FreeRelease, "k", 1, ownA)
	case "held": // by ownA, token 1, plain
		sm.Grant("k", ownA, 30, false, 0)
	case "owned": // by ownA, token 1, RELEASE_OWNED only
		sm.Grant("k", ownA, 30, true, 0)
	case "max": // free, the counter at MaxToken
		sm.Raise(lockcore.MaxToken)
	default:
		t.Fatal(state)
	}
	return sm
}

func TestMachineGrant(t *testing.T) {
	for _, tc := range []struct {
		state   string
		owner   lockcore.Owner
		tok     uint64 // the caller's token (0: the machine's counter)
		wantTok uint64
		want    lockcore.GrantResult
	}{
		{"absent", ownA, 0, 1, lockcore.GrantNew},
		{"absent", ownA, 7, 7, lockcore.GrantNew},
		{"free", ownB, 0, 2, lockcore.GrantNew},
		{"free", ownB, 9, 9, lockcore.GrantNew},
		{"held", ownA, 0, 1, lockcore.GrantRetry},
		{"held", ownA, 5, 1, lockcore.GrantRetry}, // the caller's token is not used
		{"held", ownB, 0, 0, lockcore.GrantHeld},
		{"owned", ownA, 0, 1, lockcore.GrantRetry},
		{"owned", ownB, 0, 0, lockcore.GrantHeld},
		{"max", ownA, 0, 0, lockcore.GrantExhausted}, // no token left: the key stays free
	} {
		sm := machineIn(t, tc.state)
		before, last := sm.Snapshot(), sm.Last()
		tok, r := sm.Grant("k", tc.owner, 10, false, tc.tok)
		if tok != tc.wantTok || r != tc.want {
			t.Errorf("%s: Grant by %v tok %d = %d, %v; want %d, %v", tc.state, tc.owner[0], tc.tok, tok, r, tc.wantTok, tc.want)
		}
		if r != lockcore.GrantNew && (!bytes.Equal(sm.Snapshot(), before) || sm.Last() != last) {
			t.Errorf("%s: a Grant that granted nothing changed the state", tc.state)
		}
		if r == lockcore.GrantNew {
			h := sm.Holdings()
			if len(h) != 1 || h[0].Key != "k" || h[0].Owner != tc.owner || h[0].Token != tok || h[0].LeaseS != 10 || sm.Last() != tok || sm.Len() != 1 {
				t.Errorf("%s: after Grant: %+v, last %d", tc.state, h, sm.Last())
			}
			if one, ok := sm.Holding("k"); !ok || one != h[0] {
				t.Errorf("%s: Holding(k) = %+v, %v; Holdings %+v", tc.state, one, ok, h)
			}
		}
	}
}

func TestMachineFree(t *testing.T) {
	for _, tc := range []struct {
		state string
		kind  uint8
		token uint64
		owner lockcore.Owner
		want  bool
	}{
		{"absent", lockcore.FreeRelease, 1, ownA, false},
		{"absent", lockcore.FreeReleaseOwned, 1, ownA, false},
		{"absent", lockcore.FreeExpire, 1, ownA, false},
		{"free", lockcore.FreeRelease, 1, ownA, false}, // a stale token: already released
		{"free", lockcore.FreeReleaseOwned, 1, ownA, false},
		{"free", lockcore.FreeExpire, 1, ownA, false},
		{"held", lockcore.FreeRelease, 1, ownB, true}, // a plain RELEASE: the token is the proof
		{"held", lockcore.FreeRelease, 2, ownA, false},
		{"held", lockcore.FreeReleaseOwned, 1, ownA, true},
		{"held", lockcore.FreeReleaseOwned, 1, ownB, false}, // RELEASE_OWNED names the holder
		{"held", lockcore.FreeExpire, 1, ownA, true},
		{"held", lockcore.FreeExpire, 2, ownA, false}, // a stale expiry
		{"held", 0, 1, ownA, false},                   // no such kind
		{"held", 4, 1, ownA, false},
		{"owned", lockcore.FreeRelease, 1, ownA, false}, // only RELEASE_OWNED frees it
		{"owned", lockcore.FreeReleaseOwned, 1, ownA, true},
		{"owned", lockcore.FreeReleaseOwned, 1, ownB, false},
		{"owned", lockcore.FreeReleaseOwned, 2, ownA, false},
		{"owned", lockcore.FreeExpire, 1, ownA, true},
	} {
		sm := machineIn(t, tc.state)
		before := sm.Snapshot()
		got := sm.Free(tc.kind, "k", tc.token, tc.owner)
		if got != tc.want {
			t.Errorf("%s: Free(%d, %d, %v) = %v, want %v", tc.state, tc.kind, tc.token, tc.owner[0], got, tc.want)
		}
		if !got && !bytes.Equal(sm.Snapshot(), before) {
			t.Errorf("%s: Free(%d) that failed changed the state", tc.state, tc.kind)
		}
		if got {
			if _, held := sm.Holding("k"); held || len(sm.Holdings()) != 0 || sm.Len() != 0 || sm.Last() != 1 {
				t.Errorf("%s: Free(%d): still held, or last changed", tc.state, tc.kind)
			}
			// Idempotent: the same command again is a no-op, and so is an
			// expiry of the same (now stale) token.
			if sm.Free(tc.kind, "k", tc.token, tc.owner) || sm.Free(lockcore.FreeExpire, "k", tc.token, tc.owner) {
				t.Errorf("%s: Free(%d) applied twice", tc.state, tc.kind)
			}
		}
	}
}

func TestMachineRaise(t *testing.T) {
	sm := lockcore.NewMachine()
	if !sm.Raise(100) || sm.Last() != 100 || sm.Raise(50) || sm.Raise(100) || sm.Last() != 100 {
		t.Fatalf("Raise: last %d", sm.Last())
	}
	if sm.Raise(lockcore.MaxToken+1) || sm.Last() != 100 {
		t.Fatalf("Raise above MaxToken: last %d", sm.Last())
	}
	if tok, r := sm.Grant("a", ownA, 5, false, 0); tok != 101 || r != lockcore.GrantNew {
		t.Fatalf("Grant after Raise: %d, %v", tok, r)
	}
	if !sm.Raise(lockcore.MaxToken) || sm.Last() != lockcore.MaxToken {
		t.Fatalf("Raise to MaxToken: last %d", sm.Last())
	}
}

// TestMachineCeiling: a pair node's epoch range ends at the ceiling: a
// Grant of a free key past it takes no token (GrantExhausted, and the
// command's ErrTokensExhausted), the holder's retry still gets its token,
// and a Free still frees.
func TestMachineCeiling(t *testing.T) {
	sm := lockcore.NewMachine()
	sm.Raise(10)
	sm.SetCeiling(11)
	if sm.Ceiling() != 11 {
		t.Fatalf("Ceiling %d", sm.Ceiling())
	}
	if tok, r := sm.Grant("a", ownA, 5, false, 0); tok != 11 || r != lockcore.GrantNew {
		t.Fatalf("last token of the range: %d, %v", tok, r)
	}
	if tok, r := sm.Grant("b", ownB, 5, false, 0); tok != 0 || r != lockcore.GrantExhausted {
		t.Fatalf("past the ceiling: %d, %v", tok, r)
	}
	if tok, r := sm.Grant("a", ownA, 5, false, 0); tok != 11 || r != lockcore.GrantRetry {
		t.Fatalf("holder's retry at the ceiling: %d, %v", tok, r)
	}
	res, err := sm.ApplyCommand(lockcore.NewDecoder(lockcore.AppendGrant(nil, 1, "c", &lockcore.Recipient{Owner: ownA, LeaseS: 5})[2:]), lockcore.CmdGrant)
	if err != nil || !errors.Is(res.Err, lockcore.ErrTokensExhausted) {
		t.Fatalf("Grant command past the ceiling: %+v, %v", res, err)
	}
	if !sm.Free(lockcore.FreeRelease, "a", 11, lockcore.Owner{}) {
		t.Fatal("Free at the ceiling")
	}
	sm.SetCeiling(lockcore.MaxToken + 1)
	if sm.Ceiling() != lockcore.MaxToken {
		t.Fatalf("a ceiling above MaxToken is MaxToken: %d", sm.Ceiling())
	}
	if tok, _ := sm.Grant("b", ownB, 5, false, 0); tok != 12 {
		t.Fatalf("after the ceiling is lifted: %d", tok)
	}
}

func TestMachineSnapshotRoundTrip(t *testing.T) {
	sm := lockcore.NewMachine()
	sm.Grant("a", ownA, 1, false, 0)
	sm.Grant("b", ownB, 250, true, 10)
	sm.Grant("c", ownA, 30, false, 0)
	sm.Free(lockcore.FreeRelease, "c", 11, ownA) // freed: not in the snapshot
	sm.Grant(string(bytes.Repeat([]byte{0xff}, wire.MaxKeyLen)), ownB, 5, false, 0)
	b := sm.Snapshot()
	got, err := lockcore.RestoreMachine(b)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got.Holdings(), sm.Holdings()) || got.Last() != sm.Last() || got.Last() != 12 || got.Len() != 3 {
		t.Fatalf("restored %+v last %d; want %+v last %d", got.Holdings(), got.Last(), sm.Holdings(), sm.Last())
	}
	if !bytes.Equal(got.Snapshot(), b) {
		t.Fatal("a restored machine encodes differently")
	}
	// The restored machine goes on from the same state.
	if tok, r := got.Grant("c", ownB, 3, false, 0); tok != 13 || r != lockcore.GrantNew {
		t.Fatalf("Grant after restore: %d, %v", tok, r)
	}
	if !got.Free(lockcore.FreeReleaseOwned, "b", 10, ownB) || got.Free(lockcore.FreeRelease, "a", 2, ownA) {
		t.Fatal("Release after restore")
	}

	empty := lockcore.NewMachine()
	if e, err := lockcore.RestoreMachine(empty.Snapshot()); err != nil || e.Len() != 0 || e.Last() != 0 {
		t.Fatalf("empty round trip: %v %v", e, err)
	}
}

// The snapshot bytes are the ones nodes of earlier versions write and
// read (this one was made by the machine before it moved to lockcore).
func TestMachineSnapshotEncoding(t *testing.T) {
	sm := lockcore.NewMachine()
	a, b := lockcore.Owner{1, 2, 3}, lockcore.Owner{0xaa, 15: 0xbb}
	sm.Grant("alpha", a, 30, false, 0)
	sm.Grant("b", b, 250, true, 0)
	sm.Grant("zz", a, 1, false, 300)
	sm.Free(lockcore.FreeRelease, "zz", 300, a)
	sm.Grant("k", b, 7, true, 0)
	const want = "544b534d01000000000000012d0305616c7068610102030000000000000000000000000000000000000000011e000162aa0000000000000000000000000000bb0000000000000002fa01016baa0000000000000000000000000000bb000000000000012d0701"
	if got := hex.EncodeToString(sm.Snapshot()); got != want {
		t.Fatalf("snapshot\n%s, want\n%s", got, want)
	}
	w, _ := hex.DecodeString(want)
	r, err := lockcore.RestoreMachine(w)
	if err != nil || !reflect.DeepEqual(r.Holdings(), sm.Holdings()) || r.Last() != 301 {
		t.Fatalf("restore of the earlier version's bytes: %v", err)
	}
}

func TestMachineRestoreRejects(t *testing.T) {
	sm := lockcore.NewMachine()
	sm.Grant("a", ownA, 30, false, 0)
	sm.Grant("b", ownB, 30, true, 0)
	good := sm.Snapshot()
	corrupt := func(f func(b []byte) []byte) []byte { return f(bytes.Clone(good)) }
	// Layout: header 5, last 8, count 1, then per entry key_len 1, key 1, owner 16, token 8, lease 1, flags 1.
	entry := 5 + 8 + 1
	tokenAt := entry + 1 + 1 + 16
	for name, b := range map[string][]byte{
		"empty":         nil,
		"magic":         corrupt(func(b []byte) []byte { b[0] = 'X'; return b }),
		"version":       corrupt(func(b []byte) []byte { b[4] = 2; return b }),
		"truncated":     good[:len(good)-1],
		"trailing":      append(bytes.Clone(good), 0),
		"count":         corrupt(func(b []byte) []byte { b[13] = 3; return b }),
		"token 0":       corrupt(func(b []byte) []byte { copy(b[tokenAt:], make([]byte, 8)); return b }),
		"above last":    corrupt(func(b []byte) []byte { b[tokenAt+7] = 9; return b }),
		"token twice":   corrupt(func(b []byte) []byte { b[tokenAt+7] = 2; return b }),
		"lease 0":       corrupt(func(b []byte) []byte { b[tokenAt+8] = 0; return b }),
		"lease 251":     corrupt(func(b []byte) []byte { b[tokenAt+8] = wire.MaxLeaseS + 1; return b }),
		"flags":         corrupt(func(b []byte) []byte { b[tokenAt+9] = 2; return b }),
		"key twice":     corrupt(func(b []byte) []byte { b[len(b)-1-1-8-16-1] = 'a'; return b }),
		"key length 0":  corrupt(func(b []byte) []byte { b[entry] = 0; return b }),
		"last too high": corrupt(func(b []byte) []byte { b[5] = 0x80; return b }),
	} {
		if m, err := lockcore.RestoreMachine(b); !errors.Is(err, lockcore.ErrSnapshot) || m != nil {
			t.Errorf("%s: restore = %v, %v; want nil, ErrSnapshot", name, m, err)
		}
	}
}

// The command encoding is the one nodes of earlier versions write and
// read (these bytes were made by the encoder before it moved to lockcore).
func TestCommandEncoding(t *testing.T) {
	a, b := lockcore.Owner{1, 2, 3}, lockcore.Owner{0xaa, 15: 0xbb}
	for name, tc := range map[string]struct {
		got  []byte
		want string
	}{
		"grant": {lockcore.AppendGrant(nil, 300, "alpha", &lockcore.Recipient{Owner: a, LeaseS: 30, OwnedOnly: true}),
			"01ac0205616c706861010203000000000000000000000000001e01"},
		"free": {lockcore.AppendFree(nil, 1, "k", 0x0102030405060708, lockcore.FreeReleaseOwned, &a, nil),
			"0201016b0102030405060708020102030000000000000000000000000000"},
		"free with next": {lockcore.AppendFree(nil, 2, "k", 9, lockcore.FreeExpire, &a, &lockcore.Recipient{Owner: b, LeaseS: 20, OwnedOnly: true}),
			"0202016b0000000000000009030102030000000000000000000000000001aa0000000000000000000000000000bb1401"},
	} {
		if got := hex.EncodeToString(tc.got); got != tc.want {
			t.Errorf("%s: %s, want %s", name, got, tc.want)
		}
	}
}

// apply decodes and applies the commands in b (as an entry carries them:
// type, seq, fields) and returns their results.
func apply(t *testing.T, sm *lockcore.Machine, b []byte) []lockcore.Result {
	t.Helper()
	d := lockcore.NewDecoder(b)
	var res []lockcore.Result
	for d.Len() > 0 {
		typ := d.U8()
		d.Uvarint()
		r, err := sm.ApplyCommand(d, typ)
		if err != nil {
			t.Fatalf("command %d: %v", len(res), err)
		}
		res = append(res, r)
	}
	return res
}

func grant(b []byte, key string, o lockcore.Owner, lease uint8, owned bool) []byte {
	return lockcore.AppendGrant(b, 1, key, &lockcore.Recipient{Owner: o, LeaseS: lease, OwnedOnly: owned})
}

func free(b []byte, key string, tok uint64, kind uint8, o lockcore.Owner, next *lockcore.Recipient) []byte {
	return lockcore.AppendFree(b, 1, key, tok, kind, &o, next)
}

func TestMachineApplyCommand(t *testing.T) {
	sm := lockcore.NewMachine()
	// Three grants of one key: a new holding, the holder's retry, another
	// owner's (held).
	res := apply(t, sm, grant(grant(grant(nil, "a", ownA, 10, false), "a", ownA, 10, false), "a", ownB, 10, false))
	if want := []lockcore.Result{{Token: 1}, {Token: 1}, {Held: true}}; !reflect.DeepEqual(res, want) {
		t.Fatalf("grants: %+v, want %+v", res, want)
	}
	// A release by the wrong token, by the right one with a hand-off to
	// the next owner, then an expiry of the old token (stale: no-op).
	cmds := free(nil, "a", 9, lockcore.FreeRelease, ownA, nil)
	cmds = free(cmds, "a", 1, lockcore.FreeRelease, ownA, &lockcore.Recipient{Owner: ownB, LeaseS: 20, OwnedOnly: true})
	cmds = free(cmds, "a", 1, lockcore.FreeExpire, ownA, nil)
	res = apply(t, sm, cmds)
	if want := []lockcore.Result{{}, {Freed: true, Token: 2}, {}}; !reflect.DeepEqual(res, want) {
		t.Fatalf("frees: %+v, want %+v", res, want)
	}
	h, held := sm.Holding("a")
	if !held || h.Token != 2 || h.Owner != ownB || h.LeaseS != 20 || !h.OwnedOnly || sm.Len() != 1 {
		t.Fatalf("after the hand-off: %+v held %d", h, sm.Len())
	}
	// RELEASE_OWNED only: a plain release of the owned-only holding is
	// refused; by owner and token it frees.
	res = apply(t, sm, free(free(nil, "a", 2, lockcore.FreeRelease, ownB, nil), "a", 2, lockcore.FreeReleaseOwned, ownB, nil))
	if _, held := sm.Holding("a"); res[0].Freed || !res[1].Freed || sm.Len() != 0 || held {
		t.Fatalf("owned release: %+v held %d", res, sm.Len())
	}
	// next other than 1 is no next (as nodes of earlier versions read it).
	sm.Grant("d", ownA, 5, false, 0)
	odd := free(nil, "d", 3, lockcore.FreeRelease, ownA, nil)
	odd[len(odd)-1] = 2
	if res = apply(t, sm, odd); res[0] != (lockcore.Result{Freed: true}) || sm.Len() != 0 {
		t.Fatalf("next byte 2: %+v, %d held", res, sm.Len())
	}
	// The counter stops at MaxToken: exhausted, the key stays free; a
	// hand-off frees the key and grants nothing.
	sm.Grant("c", ownA, 5, false, 0)
	sm.Raise(lockcore.MaxToken)
	res = apply(t, sm, free(grant(nil, "b", ownA, 10, false), "c", 4, lockcore.FreeExpire, ownA, &lockcore.Recipient{Owner: ownB, LeaseS: 1}))
	if len(res) != 2 || res[0].Token != 0 || !errors.Is(res[0].Err, lockcore.ErrTokensExhausted) ||
		!res[1].Freed || res[1].Token != 0 || !errors.Is(res[1].Err, lockcore.ErrTokensExhausted) || sm.Len() != 0 {
		t.Fatalf("at MaxToken: %+v, %d held", res, sm.Len())
	}
}

// A command that does not decode changes nothing and says so.
func TestMachineApplyCommandMalformed(t *testing.T) {
	g := grant(nil, "a", ownA, 10, false)
	f := free(nil, "a", 1, lockcore.FreeRelease, ownA, nil)
	fn := free(nil, "a", 1, lockcore.FreeRelease, ownA, &lockcore.Recipient{Owner: ownB, LeaseS: 3})
	for name, b := range map[string][]byte{
		"truncated grant":          g[:len(g)-1],
		"grant without key":        g[:2],
		"truncated free":           f[:len(f)-1],
		"truncated free with next": fn[:len(fn)-1],
		"unknown type":             {3, 1, 0, 0, 0, 0, 0, 0, 0, 9},
		"no type":                  {0, 1},
	} {
		sm := lockcore.NewMachine()
		sm.Grant("a", ownA, 10, false, 0)
		before := sm.Snapshot()
		d := lockcore.NewDecoder(b)
		typ := d.U8()
		d.Uvarint()
		if r, err := sm.ApplyCommand(d, typ); !errors.Is(err, lockcore.ErrMalformed) || r != (lockcore.Result{}) {
			t.Errorf("%s: %+v, %v; want ErrMalformed", name, r, err)
		}
		if !bytes.Equal(sm.Snapshot(), before) {
			t.Errorf("%s: the state changed", name)
		}
	}
}

func TestDecoder(t *testing.T) {
	d := lockcore.NewDecoder([]byte{7, 0, 0, 0, 9, 0, 0, 0, 0, 0, 0, 1, 2, 0xac, 0x02, 2, 'h', 'i', 1, 2, 3})
	if d.U8() != 7 || d.U32() != 9 || d.U64() != 1<<8+2 || d.Uvarint() != 300 || string(d.Bytes8()) != "hi" || d.Err() != nil || d.Len() != 3 {
		t.Fatal("reads")
	}
	var two [2]byte
	if d.Copy(two[:]); two != [2]byte{1, 2} || d.Err() != nil {
		t.Fatal("copy")
	}
	// A short read: zero from then on, and Err.
	if d.U64() != 0 || !errors.Is(d.Err(), lockcore.ErrMalformed) || d.Len() != 0 || d.U8() != 0 || d.Take(0) != nil {
		t.Fatal("short read")
	}
	if d := lockcore.NewDecoder([]byte{0x80}); d.Uvarint() != 0 || d.Err() == nil {
		t.Fatal("bad varint")
	}
}

// TestMachineModel applies random command sequences to a machine and to a
// plain model of the contract, and compares every answer, the state, and a
// snapshot/restore taken at random points. A twin machine gets the same
// commands encoded and through ApplyCommand, and stays in the same state
// (equal snapshots): the log's path and the direct one are one machine.
func TestMachineModel(t *testing.T) {
	type hold struct {
		owner     lockcore.Owner
		token     uint64
		lease     uint8
		ownedOnly bool
	}
	keys := []string{"a", "b", "c"}
	owners := []lockcore.Owner{ownA, ownB, {3}}
	rng := rand.New(rand.NewPCG(1, 2))
	for seq := range 300 {
		sm, tw := lockcore.NewMachine(), lockcore.NewMachine()
		model := map[string]hold{}
		var last uint64
		for step := range 60 {
			key, owner := keys[rng.IntN(len(keys))], owners[rng.IntN(len(owners))]
			h, held := model[key]
			// A token near the current one, often the holder's.
			tok := uint64(rng.IntN(int(last) + 2))
			if held && rng.IntN(2) == 0 {
				tok = h.token
			}
			var twin lockcore.Result
			var want lockcore.Result
			switch rng.IntN(5) {
			case 0, 1: // Grant, from the machine's counter or a caller's higher token
				var given uint64
				if rng.IntN(2) == 0 {
					given = last + 1 + uint64(rng.IntN(3))
				}
				lease, owned := uint8(1+rng.IntN(wire.MaxLeaseS)), rng.IntN(2) == 0
				gotTok, r := sm.Grant(key, owner, lease, owned, given)
				if given != 0 {
					tw.Grant(key, owner, lease, owned, given) // not a command: its tokens are the counter's
				} else {
					twin = apply(t, tw, grant(nil, key, owner, lease, owned))[0]
				}
				var wantTok uint64
				var wantR lockcore.GrantResult
				switch {
				case !held:
					wantTok, wantR = given, lockcore.GrantNew
					if given == 0 {
						wantTok = last + 1
					}
					last = wantTok
					model[key] = hold{owner, wantTok, lease, owned}
					want.Token = wantTok
				case h.owner == owner:
					wantTok, wantR = h.token, lockcore.GrantRetry
					want.Token = wantTok
				default:
					wantR = lockcore.GrantHeld
					want.Held = true
				}
				if gotTok != wantTok || r != wantR {
					t.Fatalf("seq %d step %d: Grant = %d %v, want %d %v", seq, step, gotTok, r, wantTok, wantR)
				}
				if given != 0 {
					twin = want
				}
			case 2, 3: // Release, plain or owned
				owned := rng.IntN(2) == 0
				kind := uint8(lockcore.FreeRelease)
				if owned {
					kind = lockcore.FreeReleaseOwned
				}
				want.Freed = held && h.token == tok && (owned && h.owner == owner || !owned && !h.ownedOnly)
				if want.Freed {
					delete(model, key)
				}
				if got := sm.Free(kind, key, tok, owner); got != want.Freed {
					t.Fatalf("seq %d step %d: Free(%d) = %v, want %v", seq, step, kind, got, want.Freed)
				}
				twin = apply(t, tw, free(nil, key, tok, kind, owner, nil))[0]
			case 4:
				want.Freed = held && h.token == tok
				if want.Freed {
					delete(model, key)
				}
				if got := sm.Free(lockcore.FreeExpire, key, tok, owner); got != want.Freed {
					t.Fatalf("seq %d step %d: expiry = %v, want %v", seq, step, got, want.Freed)
				}
				twin = apply(t, tw, free(nil, key, tok, lockcore.FreeExpire, owner, nil))[0]
			}
			if twin != want {
				t.Fatalf("seq %d step %d: the command's result %+v, want %+v", seq, step, twin, want)
			}
			hs := sm.Holdings()
			if len(hs) != len(model) || sm.Len() != len(model) || sm.Last() != last {
				t.Fatalf("seq %d step %d: %d holdings last %d, model %d last %d", seq, step, len(hs), sm.Last(), len(model), last)
			}
			for _, x := range hs {
				if m := model[x.Key]; m != (hold{x.Owner, x.Token, x.LeaseS, x.OwnedOnly}) {
					t.Fatalf("seq %d step %d: %q is %+v, model %+v", seq, step, x.Key, x, m)
				}
			}
			if !bytes.Equal(sm.Snapshot(), tw.Snapshot()) {
				t.Fatalf("seq %d step %d: the twin's state differs", seq, step)
			}
			if rng.IntN(10) == 0 {
				r, err := lockcore.RestoreMachine(sm.Snapshot())
				if err != nil {
					t.Fatalf("seq %d step %d: %v", seq, step, err)
				}
				sm = r // go on from the restored machine
			}
		}
	}
}

// TestMachineExtend: the Extend command needs the holding's exact token
// and owner; it sets the holding's lease_s (a takeover restarts the lease
// at it) and nothing else; a truncated one changes nothing.
func TestMachineExtend(t *testing.T) {
	sm := lockcore.NewMachine()
	tok, _ := sm.Grant("k", ownA, 10, true, 0)
	for _, tc := range []struct {
		name  string
		key   string
		token uint64
		owner lockcore.Owner
	}{
		{"another owner", "k", tok, ownB},
		{"another token", "k", tok + 1, ownA},
		{"another key", "j", tok, ownA},
	} {
		if sm.Extend(tc.key, tc.token, tc.owner, 30) {
			t.Errorf("%s: extended", tc.name)
		}
	}
	if h, _ := sm.Holding("k"); h.LeaseS != 10 {
		t.Fatalf("after refused extends: %+v", h)
	}
	cmd := lockcore.AppendExtend(nil, 9, "k", tok, &ownA, 30)
	d := lockcore.NewDecoder(cmd[1:])
	d.Uvarint()
	res, err := sm.ApplyCommand(d, cmd[0])
	if err != nil || !res.Kept {
		t.Fatalf("Extend command: %+v, %v", res, err)
	}
	if h, _ := sm.Holding("k"); h.LeaseS != 30 || h.Token != tok || h.Owner != ownA || !h.OwnedOnly || sm.Last() != tok {
		t.Fatalf("after the extend: %+v, last %d", h, sm.Last())
	}
	for n := 2; n < len(cmd); n++ {
		d := lockcore.NewDecoder(cmd[2:n])
		if _, err := sm.ApplyCommand(d, lockcore.CmdExtend); !errors.Is(err, lockcore.ErrMalformed) {
			t.Fatalf("truncated to %d bytes: %v", n, err)
		}
	}
	if sm.Free(lockcore.FreeReleaseOwned, "k", tok, ownA); sm.Extend("k", tok, ownA, 30) {
		t.Fatal("extended after the release")
	}
}
