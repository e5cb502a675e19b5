package lockcore

import "github.com/ticketing-dev/ticketing/internal/wire"

// Owner is a lock owner's identity, as ACQUIRE carries it.
type Owner = [wire.OwnerLen]byte

// MaxToken is the highest fencing token ever issued (2^63 - 1).
const MaxToken = 1<<63 - 1

// GrantResult is the outcome of a Grant.
type GrantResult uint8

const (
	// GrantNew: the key was free: a new holding, a new token.
	GrantNew GrantResult = iota
	// GrantRetry: already held by this owner: its token, unchanged (the
	// lease is not extended).
	GrantRetry
	// GrantHeld: held by another owner: nothing changes.
	GrantHeld
)

// Release kinds: how a Free command ends a holding.
const (
	FreeRelease      = 1 // RELEASE: the token must hold the key, and the holding may not require RELEASE_OWNED
	FreeReleaseOwned = 2 // RELEASE_OWNED: the token must hold the key and the owner must be its holder
	FreeExpire       = 3 // the lease ended: the token must still hold the key
)

// decide is the rule of a Grant: a key that is not held (held false, or
// token 0 in a machine) is granted; the holder's own ACQUIRE is a retry.
func decide(held bool, holder, owner *Owner) GrantResult {
	switch {
	case !held:
		return GrantNew
	case *holder == *owner:
		return GrantRetry
	default:
		return GrantHeld
	}
}

// mayFree is the rule of a Free of kind (FreeRelease, FreeReleaseOwned,
// FreeExpire) naming token and owner, on a holding (held, its token, its
// holder, its owned-only flag): the token must be the holding's, and a
// RELEASE_OWNED must name the holder, and a plain RELEASE may not free a
// holding that only RELEASE_OWNED may free.
func mayFree(kind uint8, token uint64, owner *Owner, held bool, hToken uint64, holder *Owner, ownedOnly bool) bool {
	if !held || hToken == 0 || hToken != token {
		return false
	}
	switch kind {
	case FreeRelease:
		return !ownedOnly
	case FreeReleaseOwned:
		return *holder == *owner
	case FreeExpire:
		return true
	}
	return false
}

// mayExtend is the rule of an Extend naming token and owner, on a holding
// (held, its token, its holder): the token must be the holding's and the
// owner its holder (EXTEND needs both, whatever the holding's owned-only
// flag).
func mayExtend(token uint64, owner *Owner, held bool, hToken uint64, holder *Owner) bool {
	return held && hToken != 0 && hToken == token && *holder == *owner
}
