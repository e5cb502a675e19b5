package server

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"reflect"
	"testing"

	"github.com/ticketing-dev/ticketing/internal/wire"
)

var ownA, ownB = [wire.OwnerLen]byte{1}, [wire.OwnerLen]byte{2}

// A machine in each state a key can be in, for the table tests.
func machineIn(t *testing.T, state string) *machine {
	t.Helper()
	sm := newMachine()
	switch state {
	case "absent":
	case "free": // an idle entry: held once, released
		sm.Grant("k", ownA, 30, false, 0)
		sm.Release("k", 1, ownA, false)
	case "held": // by ownA, token 1, plain
		sm.Grant("k", ownA, 30, false, 0)
	case "owned": // by ownA, token 1, RELEASE_OWNED only
		sm.Grant("k", ownA, 30, true, 0)
	default:
		t.Fatal(state)
	}
	return &sm
}

func TestMachineGrant(t *testing.T) {
	for _, tc := range []struct {
		state   string
		owner   [wire.OwnerLen]byte
		tok     uint64 // the caller's token (0: the machine's counter)
		wantTok uint64
		want    grantResult
	}{
		{"absent", ownA, 0, 1, grantNew},
		{"absent", ownA, 7, 7, grantNew},
		{"free", ownB, 0, 2, grantNew},
		{"free", ownB, 9, 9, grantNew},
		{"held", ownA, 0, 1, grantRetry},
		{"held", ownA, 5, 1, grantRetry}, // the caller's token is not used
		{"held", ownB, 0, 0, grantHeld},
		{"owned", ownA, 0, 1, grantRetry},
		{"owned", ownB, 0, 0, grantHeld},
	} {
		sm := machineIn(t, tc.state)
		before := sm.Snapshot()
		tok, r := sm.Grant("k", tc.owner, 10, false, tc.tok)
		if tok != tc.wantTok || r != tc.want {
			t.Errorf("%s: Grant by %v tok %d = %d, %v; want %d, %v", tc.state, tc.owner[0], tc.tok, tok, r, tc.wantTok, tc.want)
		}
		if r != grantNew && !bytes.Equal(sm.Snapshot(), before) {
			t.Errorf("%s: a Grant that granted nothing changed the state", tc.state)
		}
		if r == grantNew {
			h := sm.holdings()
			if len(h) != 1 || h[0].Owner != tc.owner || h[0].Token != tok || h[0].LeaseS != 10 || sm.last != tok {
				t.Errorf("%s: after Grant: %+v, last %d", tc.state, h, sm.last)
			}
		}
	}
}

func TestMachineReleaseExpire(t *testing.T) {
	for _, tc := range []struct {
		state string
		cmd   string // rel, owned, expire
		token uint64
		owner [wire.OwnerLen]byte
		want  bool
	}{
		{"absent", "rel", 1, ownA, false},
		{"absent", "owned", 1, ownA, false},
		{"absent", "expire", 1, ownA, false},
		{"free", "rel", 1, ownA, false}, // a stale token: already released
		{"free", "owned", 1, ownA, false},
		{"free", "expire", 1, ownA, false},
		{"held", "rel", 1, ownB, true}, // a plain RELEASE: the token is the proof
		{"held", "rel", 2, ownA, false},
		{"held", "owned", 1, ownA, true},
		{"held", "owned", 1, ownB, false}, // RELEASE_OWNED names the holder
		{"held", "expire", 1, ownA, true},
		{"held", "expire", 2, ownA, false}, // a stale expiry
		{"owned", "rel", 1, ownA, false},   // only RELEASE_OWNED frees it
		{"owned", "owned", 1, ownA, true},
		{"owned", "owned", 1, ownB, false},
		{"owned", "owned", 2, ownA, false},
		{"owned", "expire", 1, ownA, true},
	} {
		sm := machineIn(t, tc.state)
		before := sm.Snapshot()
		var got bool
		switch tc.cmd {
		case "rel":
			got = sm.Release("k", tc.token, tc.owner, false)
		case "owned":
			got = sm.Release("k", tc.token, tc.owner, true)
		case "expire":
			got = sm.Expire("k", tc.token)
		}
		if got != tc.want {
			t.Errorf("%s: %s(%d, %v) = %v, want %v", tc.state, tc.cmd, tc.token, tc.owner[0], got, tc.want)
		}
		if !got && !bytes.Equal(sm.Snapshot(), before) {
			t.Errorf("%s: %s that failed changed the state", tc.state, tc.cmd)
		}
		if got {
			if len(sm.holdings()) != 0 || sm.last != 1 {
				t.Errorf("%s: %s: still held, or last changed", tc.state, tc.cmd)
			}
			// Idempotent: the same command again is a no-op, and so is an
			// Expire of the same (now stale) token.
			if sm.Release("k", tc.token, tc.owner, tc.cmd == "owned") || sm.Expire("k", tc.token) {
				t.Errorf("%s: %s applied twice", tc.state, tc.cmd)
			}
		}
	}
}

func TestMachineSnapshotRoundTrip(t *testing.T) {
	sm := newMachine()
	sm.Grant("a", ownA, 1, false, 0)
	sm.Grant("b", ownB, 250, true, 10)
	sm.Grant("c", ownA, 30, false, 0)
	sm.Release("c", 11, ownA, false) // a free entry: not in the snapshot
	sm.Grant(string(bytes.Repeat([]byte{0xff}, wire.MaxKeyLen)), ownB, 5, false, 0)
	b := sm.Snapshot()
	got, err := restoreMachine(b)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got.holdings(), sm.holdings()) || got.last != sm.last || got.last != 12 {
		t.Fatalf("restored %+v last %d; want %+v last %d", got.holdings(), got.last, sm.holdings(), sm.last)
	}
	if !bytes.Equal(got.Snapshot(), b) {
		t.Fatal("a restored machine encodes differently")
	}
	// The restored machine goes on from the same state.
	if tok, r := got.Grant("c", ownB, 3, false, 0); tok != 13 || r != grantNew {
		t.Fatalf("Grant after restore: %d, %v", tok, r)
	}
	if !got.Release("b", 10, ownB, true) || got.Release("a", 2, ownA, false) {
		t.Fatal("Release after restore")
	}

	empty := newMachine()
	if e, err := restoreMachine(empty.Snapshot()); err != nil || len(e.m) != 0 || e.last != 0 {
		t.Fatalf("empty round trip: %v %v", e, err)
	}
}

func TestMachineRestoreRejects(t *testing.T) {
	sm := newMachine()
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
		if _, err := restoreMachine(b); !errors.Is(err, errSnapshot) {
			t.Errorf("%s: restore = %v, want errSnapshot", name, err)
		}
	}
}

// TestMachineModel applies random command sequences to a machine and to a
// plain model of the contract, and compares every answer, the state, and a
// snapshot/restore taken at random points.
func TestMachineModel(t *testing.T) {
	type hold struct {
		owner     [wire.OwnerLen]byte
		token     uint64
		lease     uint8
		ownedOnly bool
	}
	keys := []string{"a", "b", "c"}
	owners := [][wire.OwnerLen]byte{ownA, ownB, {3}}
	rng := rand.New(rand.NewPCG(1, 2))
	for seq := range 300 {
		sm := newMachine()
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
			switch rng.IntN(5) {
			case 0, 1: // Grant, from the machine's counter or a caller's higher token
				var given uint64
				if rng.IntN(2) == 0 {
					given = last + 1 + uint64(rng.IntN(3))
				}
				lease, owned := uint8(1+rng.IntN(wire.MaxLeaseS)), rng.IntN(2) == 0
				gotTok, r := sm.Grant(key, owner, lease, owned, given)
				var wantTok uint64
				var want grantResult
				switch {
				case !held:
					wantTok, want = given, grantNew
					if given == 0 {
						wantTok = last + 1
					}
					last = wantTok
					model[key] = hold{owner, wantTok, lease, owned}
				case h.owner == owner:
					wantTok, want = h.token, grantRetry
				default:
					want = grantHeld
				}
				if gotTok != wantTok || r != want {
					t.Fatalf("seq %d step %d: Grant = %d %v, want %d %v", seq, step, gotTok, r, wantTok, want)
				}
			case 2, 3: // Release, plain or owned
				owned := rng.IntN(2) == 0
				want := held && h.token == tok && (owned && h.owner == owner || !owned && !h.ownedOnly)
				if want {
					delete(model, key)
				}
				if got := sm.Release(key, tok, owner, owned); got != want {
					t.Fatalf("seq %d step %d: Release = %v, want %v", seq, step, got, want)
				}
			case 4:
				want := held && h.token == tok
				if want {
					delete(model, key)
				}
				if got := sm.Expire(key, tok); got != want {
					t.Fatalf("seq %d step %d: Expire = %v, want %v", seq, step, got, want)
				}
			}
			hs := sm.holdings()
			if len(hs) != len(model) || sm.last != last {
				t.Fatalf("seq %d step %d: %d holdings last %d, model %d last %d", seq, step, len(hs), sm.last, len(model), last)
			}
			for _, x := range hs {
				if m := model[x.Key]; m != (hold{x.Owner, x.Token, x.LeaseS, x.OwnedOnly}) {
					t.Fatalf("seq %d step %d: %q is %+v, model %+v", seq, step, x.Key, x, m)
				}
			}
			if rng.IntN(10) == 0 {
				r, err := restoreMachine(sm.Snapshot())
				if err != nil {
					t.Fatalf("seq %d step %d: %v", seq, step, err)
				}
				sm = r // go on from the restored machine
			}
		}
	}
}
