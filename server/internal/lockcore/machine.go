package lockcore

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/google/btree"

	"github.com/ticketing-dev/ticketing/internal/wire"
)

// Machine is the lock table's replicated state: the holdings (key ->
// owner, token, lease_s, owned-only flag) and the highest token applied.
//
// It reads no clock, does no I/O, starts no goroutine and has no lock of
// its own: whoever applies commands to it serialises them (the log's apply
// loop). Given the same commands in the same order, two machines end in the
// same state. Leases are not the machine's: when a lease ends is decided
// by the scheduler (the Core), which then applies a Free of kind
// FreeExpire naming the token it saw; the lease length is kept so that a
// node that starts serving can restart every lease at its full lease_s.
//
// Commands (each decided by the rules of rules.go, nowhere else):
//
//	Grant(key, owner, lease_s, owned_only, tok) -> (token, GrantNew | GrantRetry | GrantHeld | GrantExhausted)
//	Free(kind, key, token, owner)               -> freed (R) | not (N, or a stale expiry: no-op)
//	Extend(key, token, owner, lease_s)          -> kept (K) | not (N): the holding's lease_s becomes lease_s
//	Raise(v)                                    -> the counter raised to v (the log's Floor command)
//
// A Free changes nothing unless that token still holds the key, so a
// stale or repeated one is harmless. Grant with tok 0 takes last+1 (the
// machine's own counter, up to MaxToken); a caller may pass a token it
// reserved, above every token applied before. Either way Last is the
// highest token ever applied, and never goes down.
type Machine struct {
	h map[string]holding
	// idx orders h's keys, for the lock browser (Scan).
	idx  *btree.BTreeG[string]
	last uint64
	// ceil: Grant with tok 0 takes no token above it (0: MaxToken). A
	// hot-standby pair's node sets it to the end of its epoch's range; it
	// is not in the snapshot (the pair's stream carries it).
	ceil uint64
}

// holding is a held key's record (the map's key is the key).
type holding struct {
	owner     Owner
	token     uint64
	lease     uint8
	ownedOnly bool
}

// GrantExhausted: the key was free, but no token is left (tok 0 and the
// counter at MaxToken): nothing changes.
const GrantExhausted = GrantHeld + 1

// ErrTokensExhausted is a Grant command's Result.Err when the counter is
// at MaxToken (or at the ceiling, SetCeiling).
var ErrTokensExhausted = errors.New("fencing token space exhausted")

// NewMachine returns an empty Machine: nothing held, counter 0.
func NewMachine() *Machine { return &Machine{h: make(map[string]holding), idx: newKeyIndex()} }

// Grant is the Grant command: it returns the holding's token and what
// happened (decide's rule; see Machine).
func (m *Machine) Grant(key string, owner Owner, lease uint8, ownedOnly bool, tok uint64) (uint64, GrantResult) {
	h, held := m.h[key]
	switch r := decide(held, &h.owner, &owner); r {
	case GrantRetry:
		return h.token, r
	case GrantHeld:
		return 0, r
	}
	if tok == 0 {
		if m.last >= m.Ceiling() {
			return 0, GrantExhausted
		}
		tok = m.last + 1
	}
	m.h[key] = holding{owner: owner, token: tok, lease: lease, ownedOnly: ownedOnly}
	m.idx.ReplaceOrInsert(key) // (not held before: decide's GrantNew)
	m.last = max(m.last, tok)
	return tok, GrantNew
}

// Free is the Free command of kind (FreeRelease, FreeReleaseOwned,
// FreeExpire) naming token and, for FreeReleaseOwned, owner: it reports
// whether it freed key (mayFree's rule).
func (m *Machine) Free(kind uint8, key string, token uint64, owner Owner) bool {
	h, held := m.h[key]
	if !mayFree(kind, token, &owner, held, h.token, &h.owner, h.ownedOnly) {
		return false
	}
	delete(m.h, key)
	m.idx.Delete(key)
	return true
}

// Extend is the Extend command: if token holds key and owner is its
// holder (mayExtend's rule), the holding's lease_s becomes lease and it
// reports true; otherwise nothing changes. (When the lease ends is the
// Core's: the machine keeps lease_s for a takeover's restart, and the
// Core sends the lease_s whose end is the latest; see Core.Extend.)
func (m *Machine) Extend(key string, token uint64, owner Owner, lease uint8) bool {
	h, held := m.h[key]
	if !mayExtend(token, &owner, held, h.token, &h.owner) {
		return false
	}
	h.lease = lease
	m.h[key] = h
	return true
}

// Raise is the Floor command: it raises the counter to v, if v is above it
// and at most MaxToken, and reports whether it did.
func (m *Machine) Raise(v uint64) bool {
	if v <= m.last || v > MaxToken {
		return false
	}
	m.last = v
	return true
}

// SetCeiling makes Grant with tok 0 take no token above c (0 or above
// MaxToken: MaxToken): past it a Grant of a free key is GrantExhausted.
func (m *Machine) SetCeiling(c uint64) {
	if c > MaxToken {
		c = 0
	}
	m.ceil = c
}

// Ceiling is the highest token Grant with tok 0 takes (SetCeiling).
func (m *Machine) Ceiling() uint64 {
	if m.ceil == 0 {
		return MaxToken
	}
	return m.ceil
}

// Last is the highest token applied (the counter).
func (m *Machine) Last() uint64 { return m.last }

// Len is the number of held keys.
func (m *Machine) Len() int { return len(m.h) }

// Holding returns key's holding, if it is held.
func (m *Machine) Holding(key string) (Holding, bool) {
	h, ok := m.h[key]
	if !ok {
		return Holding{}, false
	}
	return Holding{Key: key, Owner: h.owner, Token: h.token, LeaseS: h.lease, OwnedOnly: h.ownedOnly}, true
}

// Holdings returns the held keys, sorted by key (the index's order).
func (m *Machine) Holdings() []Holding {
	hs := make([]Holding, 0, len(m.h))
	m.idx.Ascend(func(k string) bool {
		h := m.h[k]
		hs = append(hs, Holding{Key: k, Owner: h.owner, Token: h.token, LeaseS: h.lease, OwnedOnly: h.ownedOnly})
		return true
	})
	return hs
}

// Snapshot encoding, version 1 (all integers big-endian):
//
//	magic "TKSM", version u8 (1), last u64, count uvarint,
//	count times: key_len uvarint, key, owner [16], token u64, lease_s u8, flags u8 (bit 0: owned-only)
//
// Holdings are sorted by key, so equal states encode to equal bytes. Nodes
// of earlier versions write and read these bytes: they do not change.
const (
	snapMagic   = "TKSM"
	snapVersion = 1
)

// ErrSnapshot is the error (wrapped, with the reason) of RestoreMachine
// given bytes that are not a valid snapshot.
var ErrSnapshot = errors.New("lockcore: bad state machine snapshot")

// Snapshot encodes the machine's state.
func (m *Machine) Snapshot() []byte {
	hs := m.Holdings()
	b := append([]byte(snapMagic), snapVersion)
	b = binary.BigEndian.AppendUint64(b, m.last)
	b = binary.AppendUvarint(b, uint64(len(hs)))
	for _, h := range hs {
		b = binary.AppendUvarint(b, uint64(len(h.Key)))
		b = append(b, h.Key...)
		b = append(b, h.Owner[:]...)
		b = binary.BigEndian.AppendUint64(b, h.Token)
		b = append(b, h.LeaseS, flagsOf(h.OwnedOnly))
	}
	return b
}

// RestoreMachine decodes a Snapshot. It checks what a machine guarantees:
// keys and lease_s in the protocol's ranges, no key twice, every token
// nonzero, at most MaxToken and at most last, no token twice.
func RestoreMachine(b []byte) (*Machine, error) {
	bad := func(why string) (*Machine, error) { return nil, fmt.Errorf("%w: %s", ErrSnapshot, why) }
	if len(b) < len(snapMagic)+1+8 || string(b[:len(snapMagic)]) != snapMagic {
		return bad("no header")
	}
	if v := b[len(snapMagic)]; v != snapVersion {
		return bad(fmt.Sprintf("version %d", v))
	}
	b = b[len(snapMagic)+1:]
	m := NewMachine()
	m.last = binary.BigEndian.Uint64(b)
	if m.last > MaxToken {
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
		var h holding
		copy(h.owner[:], b)
		b = b[wire.OwnerLen:]
		h.token = binary.BigEndian.Uint64(b)
		h.lease, h.ownedOnly = b[8], b[9]&flagOwned != 0
		if b[9]&^flagOwned != 0 {
			return bad("unknown flags")
		}
		b = b[10:]
		_, twice := m.h[key]
		switch {
		case h.token == 0 || h.token > m.last:
			return bad("token 0 or above last")
		case tokens[h.token]:
			return bad("token twice")
		case twice:
			return bad("key twice")
		case h.lease < wire.MinLeaseS || h.lease > wire.MaxLeaseS:
			return bad("lease_s out of range")
		}
		tokens[h.token] = true
		m.h[key] = h
		m.idx.ReplaceOrInsert(key)
	}
	if len(b) != 0 {
		return bad("trailing bytes")
	}
	return m, nil
}
