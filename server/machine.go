package server

import (
	"github.com/ticketing-dev/ticketing/internal/wire"
	"github.com/ticketing-dev/ticketing/server/internal/lockcore"
)

// The standalone shards' holdings, until locks.go runs on a lockcore.Core.
//
// The lock table's state machine is lockcore.Machine (a cluster's, applied
// by cluster_fsm.go). In standalone mode each of the 256 shards keeps its
// keys' holdings itself, applied directly under the shard mutex: the
// holding fields (key, owner, token, lease, ownedOnly) live in the same
// lockState as the scheduler's (expiry lists, waiter queue), so that a
// grant costs no allocation and no indirect call. machine is that shard
// state's holding half: it writes only the holding fields, and its
// decisions (is the key free, may this RELEASE free it) are lockcore's
// rules. A free entry (token 0) may stay in the map for reuse: it is no
// holding.
type machine struct {
	m map[string]*lockState
}

// grantResult is the outcome of a Grant.
type grantResult = lockcore.GrantResult

const (
	grantNew   = lockcore.GrantNew   // the key was free: a new holding, a new token
	grantRetry = lockcore.GrantRetry // already held by this owner: its token, unchanged (lease not extended)
)

// decide is Grant's decision on ls (the key's entry, or nil), without
// applying it: grantNew if the key is free.
func (sm *machine) decide(ls *lockState, owner *[wire.OwnerLen]byte) grantResult {
	if ls == nil || ls.token == 0 {
		return lockcore.Decide(false, owner, owner)
	}
	return lockcore.Decide(true, &ls.owner, owner)
}

// applyGrant makes key, free (decide said grantNew; ls is its entry or
// nil), held by owner with token tok (the token store's), and returns the
// entry.
func (sm *machine) applyGrant(ls *lockState, key string, owner [wire.OwnerLen]byte, lease uint8, ownedOnly bool, tok uint64) *lockState {
	if ls == nil {
		ls = &lockState{key: key}
		sm.m[key] = ls
	}
	ls.token, ls.owner, ls.lease, ls.ownedOnly = tok, owner, lease, ownedOnly
	return ls
}

// mayRelease reports whether a RELEASE (owned false) or RELEASE_OWNED
// (owned true) of token by owner frees ls (lockcore's rule).
func (sm *machine) mayRelease(ls *lockState, token uint64, owner *[wire.OwnerLen]byte, owned bool) bool {
	if ls == nil {
		return false
	}
	kind := uint8(lockcore.FreeRelease)
	if owned {
		kind = lockcore.FreeReleaseOwned
	}
	return lockcore.MayFree(kind, token, owner, ls.token != 0, ls.token, &ls.owner, ls.ownedOnly)
}

// free ends ls's holding (the entry stays, free, for reuse).
func (sm *machine) free(ls *lockState) { ls.token = 0 }

// forget deletes ls's entry if it is free (an idle entry past reuse).
func (sm *machine) forget(ls *lockState) {
	if ls.token == 0 && sm.m[ls.key] == ls {
		delete(sm.m, ls.key)
	}
}
