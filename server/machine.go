package server

import (
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/ticketing-dev/ticketing/internal/wire"
)

// The lock table's state machine.
//
// A machine is the deterministic half of the lock table: the holdings
// (key -> owner, token, lease_s, owned-only flag) and the highest token it
// has applied. It reads no clock, does no I/O, starts no goroutine and has
// no lock of its own: whoever applies commands to it serialises them (a
// shard mutex in standalone mode; the log's apply loop in a replicated
// one). Given the same commands in the same order, two machines end in the
// same state. Leases are not the machine's: when a lease ends is decided
// by the scheduler (locks.go), which then applies Expire naming the token it
// saw; the lease length is kept so that a node that starts serving can
// restart every lease at its full lease_s.
//
// Commands:
//
//	Grant(key, owner, lease_s, owned_only, tok) -> (token, granted | retry | held)
//	Release(key, token, owner, owned)          -> true (R) | false (N)
//	Expire(key, token)                         -> true | false (stale: no-op)
//
// Release and Expire change nothing unless that token still holds the key,
// so a stale or repeated one is harmless. Grant with tok 0 takes last+1 (a
// replicated machine's own counter); standalone passes the token its store
// reserved, which is above every token applied before. Either way last is
// the highest token ever applied, and never goes down.
//
// In standalone mode each of the 256 shards is a machine over its own keys,
// applied directly under the shard mutex: the scheduler's fields (expiry
// lists, waiter queue) live in the same lockState so that a grant costs no
// allocation and no indirect call, but the machine reads and writes only
// the holding fields (key, owner, token, lease, ownedOnly), and the
// decisions (is the key free, may this token free it) are made only here.
// A free entry (token 0) may stay in the map for reuse: it is no holding and
// is not in a snapshot.
type machine struct {
	m    map[string]*lockState
	last uint64 // highest token applied
}

// grantResult is the outcome of a Grant.
type grantResult uint8

const (
	grantNew   grantResult = iota // the key was free: a new holding, a new token
	grantRetry                    // already held by this owner: its token, unchanged (lease not extended)
	grantHeld                     // held by another owner: nothing changed
)

func newMachine() machine { return machine{m: make(map[string]*lockState)} }

// decide is Grant's decision on ls (the key's entry, or nil), without
// applying it: grantNew if the key is free.
func (sm *machine) decide(ls *lockState, owner *[wire.OwnerLen]byte) grantResult {
	switch {
	case ls == nil || ls.token == 0:
		return grantNew
	case ls.owner == *owner:
		return grantRetry
	default:
		return grantHeld
	}
}

// applyGrant makes key, free (decide said grantNew; ls is its entry or
// nil), held by owner with token tok (tok 0: last+1), and returns the
// entry.
func (sm *machine) applyGrant(ls *lockState, key string, owner [wire.OwnerLen]byte, lease uint8, ownedOnly bool, tok uint64) *lockState {
	if tok == 0 {
		tok = sm.last + 1
	}
	if ls == nil {
		ls = &lockState{key: key}
		sm.m[key] = ls
	}
	ls.token, ls.owner, ls.lease, ls.ownedOnly = tok, owner, lease, ownedOnly
	if tok > sm.last {
		sm.last = tok
	}
	return ls
}

// Grant is the whole Grant command: it returns the holding's token and
// what happened.
func (sm *machine) Grant(key string, owner [wire.OwnerLen]byte, lease uint8, ownedOnly bool, tok uint64) (uint64, grantResult) {
	ls := sm.m[key]
	switch r := sm.decide(ls, &owner); r {
	case grantNew:
		return sm.applyGrant(ls, key, owner, lease, ownedOnly, tok).token, r
	default:
		if r == grantRetry {
			return ls.token, r
		}
		return 0, r
	}
}

// mayRelease reports whether a RELEASE (owned false) or RELEASE_OWNED
// (owned true) of token by owner frees ls: that token holds the key, and
// RELEASE_OWNED names the holder, or a plain RELEASE meets a holding that
// does not require RELEASE_OWNED.
func (sm *machine) mayRelease(ls *lockState, token uint64, owner *[wire.OwnerLen]byte, owned bool) bool {
	return ls != nil && ls.token != 0 && ls.token == token && (owned && ls.owner == *owner || !owned && !ls.ownedOnly)
}

// free ends ls's holding (the entry stays, free, for reuse).
func (sm *machine) free(ls *lockState) { ls.token = 0 }

// Release is the Release command: true (R) if it freed the key.
func (sm *machine) Release(key string, token uint64, owner [wire.OwnerLen]byte, owned bool) bool {
	ls := sm.m[key]
	if !sm.mayRelease(ls, token, &owner, owned) {
		return false
	}
	sm.free(ls)
	return true
}

// Expire is the Expire command: it frees key if token still holds it.
func (sm *machine) Expire(key string, token uint64) bool {
	ls := sm.m[key]
	if ls == nil || ls.token == 0 || ls.token != token {
		return false
	}
	sm.free(ls)
	return true
}

// forget deletes ls's entry if it is free (an idle entry past reuse).
func (sm *machine) forget(ls *lockState) {
	if ls.token == 0 && sm.m[ls.key] == ls {
		delete(sm.m, ls.key)
	}
}

// Holding is one held key, as a snapshot carries it.
type holding struct {
	Key       string
	Owner     [wire.OwnerLen]byte
	Token     uint64
	LeaseS    uint8
	OwnedOnly bool
}

// holdings returns the held keys, sorted by key.
func (sm *machine) holdings() []holding {
	var hs []holding
	for k, ls := range sm.m {
		if ls.token != 0 {
			hs = append(hs, holding{Key: k, Owner: ls.owner, Token: ls.token, LeaseS: ls.lease, OwnedOnly: ls.ownedOnly})
		}
	}
	slices.SortFunc(hs, func(a, b holding) int { return strings.Compare(a.Key, b.Key) })
	return hs
}

// Snapshot encoding, version 1 (all integers big-endian):
//
//	magic "TKSM", version u8 (1), last u64, count uvarint,
//	count times: key_len uvarint, key, owner [16], token u64, lease_s u8, flags u8 (bit 0: owned-only)
//
// Holdings are sorted by key, so equal states encode to equal bytes.
const (
	snapMagic   = "TKSM"
	snapVersion = 1
	flagOwned   = 1
)

var errSnapshot = errors.New("server: bad state machine snapshot")

// Snapshot encodes the machine's state.
func (sm *machine) Snapshot() []byte {
	hs := sm.holdings()
	b := append([]byte(snapMagic), snapVersion)
	b = binary.BigEndian.AppendUint64(b, sm.last)
	b = binary.AppendUvarint(b, uint64(len(hs)))
	for _, h := range hs {
		b = binary.AppendUvarint(b, uint64(len(h.Key)))
		b = append(b, h.Key...)
		b = append(b, h.Owner[:]...)
		b = binary.BigEndian.AppendUint64(b, h.Token)
		var f byte
		if h.OwnedOnly {
			f |= flagOwned
		}
		b = append(b, h.LeaseS, f)
	}
	return b
}

// restoreMachine decodes a Snapshot. It checks what a machine guarantees:
// keys and lease_s in the protocol's ranges, no key twice, every token
// nonzero, at most MaxToken and at most last, no token twice.
func restoreMachine(b []byte) (machine, error) {
	bad := func(why string) (machine, error) { return machine{}, fmt.Errorf("%w: %s", errSnapshot, why) }
	if len(b) < len(snapMagic)+1+8 || string(b[:len(snapMagic)]) != snapMagic {
		return bad("no header")
	}
	if v := b[len(snapMagic)]; v != snapVersion {
		return bad(fmt.Sprintf("version %d", v))
	}
	b = b[len(snapMagic)+1:]
	sm := newMachine()
	sm.last = binary.BigEndian.Uint64(b)
	if sm.last > MaxToken {
		return bad("last token above the maximum")
	}
	b = b[8:]
	n, k := binary.Uvarint(b)
	if k <= 0 || n > uint64(len(b)) {
		return bad("count")
	}
	b = b[k:]
	tokens := make(map[uint64]bool, n)
	for range n {
		kl, k := binary.Uvarint(b)
		if k <= 0 || kl < wire.MinKeyLen || kl > wire.MaxKeyLen || uint64(len(b)-k) < kl+wire.OwnerLen+8+2 {
			return bad("truncated or bad key")
		}
		b = b[k:]
		key := string(b[:kl])
		b = b[kl:]
		ls := &lockState{key: key}
		copy(ls.owner[:], b)
		b = b[wire.OwnerLen:]
		ls.token = binary.BigEndian.Uint64(b)
		ls.lease, ls.ownedOnly = b[8], b[9]&flagOwned != 0
		if b[9]&^flagOwned != 0 {
			return bad("unknown flags")
		}
		b = b[10:]
		switch {
		case ls.token == 0 || ls.token > sm.last:
			return bad("token 0 or above last")
		case tokens[ls.token]:
			return bad("token twice")
		case sm.m[key] != nil:
			return bad("key twice")
		case ls.lease < wire.MinLeaseS || ls.lease > wire.MaxLeaseS:
			return bad("lease_s out of range")
		}
		tokens[ls.token] = true
		sm.m[key] = ls
	}
	if len(b) != 0 {
		return bad("trailing bytes")
	}
	return sm, nil
}
