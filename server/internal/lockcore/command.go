package lockcore

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// Command encoding: the lock commands as a replicated log entry carries
// them (the entry's framing, and its other commands, are the log's):
//
//	Grant  type u8 (1), seq uvarint, key_len u8, key, owner [16], lease_s u8, flags u8
//	Free   type u8 (2), seq uvarint, key_len u8, key, token u64, kind u8, owner [16],
//	       next u8 (0 | 1), [owner [16], lease_s u8, flags u8]
//	Extend type u8 (7), seq uvarint, key_len u8, key, token u64, owner [16], lease_s u8
//
// flags bit 0: the holding may be freed only by RELEASE_OWNED; other bits
// are ignored. next other than 1 is no next. seq names the proposal for
// its proposer; the Machine does not read it. Nodes of earlier versions
// write and read these bytes: they do not change. (Extend is new in
// protocol version 3: a node of an earlier version does not know it, so
// every node of a cluster is upgraded before clients send EXTEND.)
const (
	CmdGrant = 1
	CmdFree  = 2
	// CmdExtend is 7: 3 to 6 are the Raft log's own commands (floor,
	// advertise, stint, cluster ID), in the same entries.
	CmdExtend = 7

	flagOwned = 1
)

// ErrMalformed is the error of a Decoder's short read and of a command
// that does not decode.
var ErrMalformed = errors.New("lockcore: malformed encoding")

// Recipient is a grant's recipient as a command carries it.
type Recipient struct {
	Owner     Owner
	LeaseS    uint8
	OwnedOnly bool
}

// AppendGrant appends a Grant command, numbered seq, of key to to.
func AppendGrant(b []byte, seq uint64, key string, to *Recipient) []byte {
	b = append(b, CmdGrant)
	b = binary.AppendUvarint(b, seq)
	b = append(b, byte(len(key)))
	b = append(b, key...)
	b = append(b, to.Owner[:]...)
	return append(b, to.LeaseS, flagsOf(to.OwnedOnly))
}

// AppendFree appends a Free command, numbered seq, of the holding of key
// by tok (kind FreeRelease, FreeReleaseOwned or FreeExpire; owner is the
// releaser's, which FreeReleaseOwned checks) and, if next is not nil, the
// grant of key to next.
func AppendFree(b []byte, seq uint64, key string, tok uint64, kind uint8, owner *Owner, next *Recipient) []byte {
	b = append(b, CmdFree)
	b = binary.AppendUvarint(b, seq)
	b = append(b, byte(len(key)))
	b = append(b, key...)
	b = binary.BigEndian.AppendUint64(b, tok)
	b = append(b, kind)
	b = append(b, owner[:]...)
	if next == nil {
		return append(b, 0)
	}
	b = append(b, 1)
	b = append(b, next.Owner[:]...)
	return append(b, next.LeaseS, flagsOf(next.OwnedOnly))
}

// AppendExtend appends an Extend command, numbered seq: the holding of
// key by tok, of owner, to get lease_s lease.
func AppendExtend(b []byte, seq uint64, key string, tok uint64, owner *Owner, lease uint8) []byte {
	b = append(b, CmdExtend)
	b = binary.AppendUvarint(b, seq)
	b = append(b, byte(len(key)))
	b = append(b, key...)
	b = binary.BigEndian.AppendUint64(b, tok)
	b = append(b, owner[:]...)
	return append(b, lease)
}

// AppendCommand appends p's command, numbered seq, to b.
func (p *Proposal) AppendCommand(b []byte, seq uint64) []byte {
	if p.extend {
		return AppendExtend(b, seq, p.e.key, p.tok, &p.owner, p.elease)
	}
	var to *Recipient
	if p.hasTo {
		to = &Recipient{Owner: p.to.owner, LeaseS: p.to.lease, OwnedOnly: p.to.ownedOnly}
	}
	if !p.free {
		return AppendGrant(b, seq, p.e.key, to)
	}
	return AppendFree(b, seq, p.e.key, p.tok, p.fkind, &p.owner, to)
}

func flagsOf(ownedOnly bool) byte {
	if ownedOnly {
		return flagOwned
	}
	return 0
}

// ApplyCommand decodes the fields of a command of type typ (CmdGrant or
// CmdFree) from d, whose type and seq the caller has read, and applies it:
//
//   - Grant: Token is the holding's (a new one, from the counter, or the
//     holder's own on its retry); Held: held by another owner; Err
//     ErrTokensExhausted: free, but the counter is at MaxToken.
//   - Free: Freed if the rule (mayFree) let it free the key; then, with a
//     next, the key is granted to it: Token, or Err ErrTokensExhausted.
//   - Extend: Kept if the rule (mayExtend) let it set the lease_s.
//
// A command that does not decode (an error wrapping ErrMalformed) changes
// nothing. Every node applies the same bytes to the same state alike.
func (m *Machine) ApplyCommand(d *Decoder, typ byte) (Result, error) {
	switch typ {
	case CmdGrant:
		key := d.Bytes8()
		var to Recipient
		d.Copy(to.Owner[:])
		lease, flags := d.U8(), d.U8()
		if d.err != nil {
			return Result{}, fmt.Errorf("%w: truncated Grant", ErrMalformed)
		}
		return grantResult(m.Grant(string(key), to.Owner, lease, flags&flagOwned != 0, 0)), nil
	case CmdFree:
		key := d.Bytes8()
		tok := d.U64()
		kind := d.U8()
		var owner, next Owner
		d.Copy(owner[:])
		hasNext := d.U8() == 1
		var lease, flags uint8
		if hasNext {
			d.Copy(next[:])
			lease, flags = d.U8(), d.U8()
		}
		if d.err != nil {
			return Result{}, fmt.Errorf("%w: truncated Free", ErrMalformed)
		}
		if !m.Free(kind, string(key), tok, owner) {
			return Result{}, nil
		}
		if !hasNext {
			return Result{Freed: true}, nil
		}
		r := grantResult(m.Grant(string(key), next, lease, flags&flagOwned != 0, 0))
		r.Freed = true
		return r, nil
	case CmdExtend:
		key := d.Bytes8()
		tok := d.U64()
		var owner Owner
		d.Copy(owner[:])
		lease := d.U8()
		if d.err != nil {
			return Result{}, fmt.Errorf("%w: truncated Extend", ErrMalformed)
		}
		return Result{Kept: m.Extend(string(key), tok, owner, lease)}, nil
	}
	return Result{}, fmt.Errorf("%w: command type %d is not a lock command", ErrMalformed, typ)
}

// grantResult is a Grant command's outcome.
func grantResult(tok uint64, r GrantResult) Result {
	switch r {
	case GrantNew, GrantRetry:
		return Result{Token: tok}
	case GrantHeld:
		return Result{Held: true}
	}
	return Result{Err: ErrTokensExhausted}
}

// Decoder reads the big-endian encodings of commands, log entries and
// snapshots. The first short read sets Err (ErrMalformed), empties the
// rest, and makes every later read return zero, so a caller may read a
// whole record and check Err once.
type Decoder struct {
	b   []byte
	err error
}

// NewDecoder returns a Decoder of b.
func NewDecoder(b []byte) *Decoder { return &Decoder{b: b} }

// Err is ErrMalformed after a short read, else nil.
func (d *Decoder) Err() error { return d.err }

// Len is the number of bytes left.
func (d *Decoder) Len() int { return len(d.b) }

func (d *Decoder) fail() {
	d.err = ErrMalformed
	d.b = nil
}

// Take reads n bytes (a slice of the Decoder's input).
func (d *Decoder) Take(n int) []byte {
	if d.err != nil || n < 0 || len(d.b) < n {
		d.fail()
		return nil
	}
	v := d.b[:n]
	d.b = d.b[n:]
	return v
}

// U8 reads a byte.
func (d *Decoder) U8() uint8 {
	if v := d.Take(1); v != nil {
		return v[0]
	}
	return 0
}

// U32 reads a big-endian uint32.
func (d *Decoder) U32() uint32 {
	if v := d.Take(4); v != nil {
		return binary.BigEndian.Uint32(v)
	}
	return 0
}

// U64 reads a big-endian uint64.
func (d *Decoder) U64() uint64 {
	if v := d.Take(8); v != nil {
		return binary.BigEndian.Uint64(v)
	}
	return 0
}

// Uvarint reads an unsigned varint.
func (d *Decoder) Uvarint() uint64 {
	if d.err != nil {
		return 0
	}
	v, k := binary.Uvarint(d.b)
	if k <= 0 {
		d.fail()
		return 0
	}
	d.b = d.b[k:]
	return v
}

// Bytes8 reads a length u8 and that many bytes.
func (d *Decoder) Bytes8() []byte { return d.Take(int(d.U8())) }

// Copy reads len(dst) bytes into dst.
func (d *Decoder) Copy(dst []byte) { copy(dst, d.Take(len(dst))) }
