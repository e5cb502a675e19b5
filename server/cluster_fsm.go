package server

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/hashicorp/raft"

	"github.com/ticketing-dev/ticketing/internal/wire"
)

// The replicated state machine of a cluster node (Raft mode).
//
// Every node applies the committed log to one machine (machine.go) over
// all keys, plus the map of node IDs to client addresses that followers
// give as the NOT_ACTIVE hint. Only the leader proposes. A log entry is a
// batch of commands that the leader's proposer queued while the previous
// entry was being appended (group commit):
//
//	entry   = version u8 (1), stint u64, count uvarint, count × command
//	command = type u8, seq uvarint, fields
//	  Grant     key_len u8, key, owner [16], lease_s u8, flags u8
//	  Free      key_len u8, key, token u64, kind u8, owner [16],
//	            next u8 (0 | 1), [owner [16], lease_s u8, flags u8]
//	  Floor     token u64
//	  Advertise id_len u8, id, addr_len u8, addr
//	  Stint     stint u64
//	  ClusterID id_len u8, id
//
// stint and seq name the leader's proposal, so that the leader that
// proposed it can answer its clients when the entry is applied (committed);
// other nodes, and the same node in a later stint, ignore them. Every
// leader starts its stint with an entry of stint 0 holding a Stint command
// (and Floor and Advertise if needed): from its apply on, every node skips
// the entries of any other stint, so that an entry a deposed leader's
// proposer was still sending when it led again cannot change the state
// behind the new stint's mirror. Grant takes
// the machine's counter plus one (or fails, "exhausted", at MaxToken).
// Free frees the key if the token still holds it — a release (by token, or
// by token and owner) or an expiry — and, with next, grants it at once to
// the next waiter, so that a contended hand-off costs one commit. Floor
// raises the counter (a migration from a standalone node,
// Config.InitialToken, or with TokenStartClock a new cluster's first
// leader's ClockStart).
// Advertise records a node's client address.
// ClusterID records the cluster's identity (ClusterConfig.ClusterID, or a
// random one): the first one applied stays, later ones are ignored, so
// that every node that has the state knows the same identity. A leader
// puts it last in its takeover entry while the state has none.
const (
	entryVersion = 1

	cmdGrant     = 1
	cmdFree      = 2
	cmdFloor     = 3
	cmdAdvertise = 4
	cmdStint     = 5
	cmdClusterID = 6

	freeRelease      = 1
	freeReleaseOwned = 2
	freeExpire       = 3
)

var errEntry = errors.New("server: bad cluster log entry")

// cmdResult is the outcome of one command.
type cmdResult struct {
	seq       uint64
	ok        bool   // Grant: granted; Free: freed
	token     uint64 // Grant: the new token; Free: the next waiter's token (0: none granted)
	exhausted bool   // no token left (Grant, or Free's next)
}

// clusterFSM is the raft.BatchingFSM of a node.
type clusterFSM struct {
	mu    sync.Mutex
	sm    machine
	held  int               // holdings in sm
	addrs map[string]string // node ID -> client address
	stint uint64            // the current leader's stint (entries of others are skipped)
	cid   string            // the cluster's identity (cmdClusterID; empty until applied)
	floor uint64            // this node's: the takeover raises the counter to it (not part of the state)
	// clockStart: this node's Config.TokenStart is TokenStartClock; as
	// leader of a new cluster it raises the counter to ClockStart (not
	// part of the state).
	clockStart bool

	applied atomic.Uint64
	last    atomic.Uint64 // sm.last, readable without mu
	nheld   atomic.Int64

	// done is called after an entry of the given stint is applied, with
	// the results of its commands (the leader's scheduler answers its
	// clients); changed after an Advertise is applied.
	done    func(stint uint64, res []cmdResult)
	changed func()
	// lowFloor is called when a leader's takeover entry leaves the counter
	// below this node's floor (that leader did not have it).
	lowFloor func(last uint64)
	sawStint bool // applyEntry saw a Stint command (under mu)
	// identified is called (outside mu) when the cluster ID is first
	// applied or restored from a snapshot.
	identified func(id string)
	sawCID     bool // applyEntry set cid (under mu)
}

func newClusterFSM() *clusterFSM {
	return &clusterFSM{sm: newMachine(), addrs: make(map[string]string)}
}

// Apply applies one log entry.
func (f *clusterFSM) Apply(l *raft.Log) interface{} {
	return f.ApplyBatch([]*raft.Log{l})[0]
}

// ApplyBatch applies committed entries in order.
func (f *clusterFSM) ApplyBatch(logs []*raft.Log) []interface{} {
	out := make([]interface{}, len(logs))
	type done struct {
		stint uint64
		res   []cmdResult
	}
	var dones []done
	advertised := false
	f.mu.Lock()
	for i, l := range logs {
		if l.Type != raft.LogCommand {
			continue
		}
		stint, res, adv, err := f.applyEntry(l.Data)
		if err != nil {
			out[i] = err
			continue
		}
		advertised = advertised || adv
		if stint != 0 && len(res) > 0 {
			dones = append(dones, done{stint, res})
		}
	}
	if n := len(logs); n > 0 {
		f.applied.Store(logs[n-1].Index)
	}
	f.last.Store(f.sm.last)
	f.nheld.Store(int64(f.held))
	low := f.sawStint && f.floor > f.sm.last
	f.sawStint = false
	last := f.sm.last
	cid, sawCID := f.cid, f.sawCID
	f.sawCID = false
	f.mu.Unlock()
	if low && f.lowFloor != nil {
		f.lowFloor(last)
	}
	if sawCID && f.identified != nil {
		f.identified(cid)
	}
	if f.done != nil {
		for _, d := range dones {
			f.done(d.stint, d.res)
		}
	}
	if advertised && f.changed != nil {
		f.changed()
	}
	return out
}

// applyEntry decodes and applies one entry under f.mu. A malformed entry
// (not reached: only this code writes them) is applied up to the bad
// command, identically on every node, and reported.
func (f *clusterFSM) applyEntry(b []byte) (stint uint64, res []cmdResult, advertised bool, err error) {
	d := decoder{b: b}
	if v := d.u8(); v != entryVersion {
		return 0, nil, false, fmt.Errorf("%w: version %d", errEntry, v)
	}
	stint = d.u64()
	n := d.uvarint()
	if d.err != nil || n > uint64(len(b)) {
		return 0, nil, false, fmt.Errorf("%w: header", errEntry)
	}
	if stint != 0 && stint != f.stint {
		return 0, nil, false, nil // a deposed leader's entry: skipped on every node
	}
	res = make([]cmdResult, 0, n)
	for range n {
		typ := d.u8()
		seq := d.uvarint()
		r := cmdResult{seq: seq}
		switch typ {
		case cmdGrant:
			key := d.bytes8()
			var owner [wire.OwnerLen]byte
			d.copy(owner[:])
			lease, flags := d.u8(), d.u8()
			if d.err != nil {
				break
			}
			r.token, r.ok, r.exhausted = f.grant(key, owner, lease, flags&flagOwned != 0)
		case cmdFree:
			key := d.bytes8()
			tok := d.u64()
			kind := d.u8()
			var owner, nextOwner [wire.OwnerLen]byte
			d.copy(owner[:])
			hasNext := d.u8() == 1
			var lease, flags uint8
			if hasNext {
				d.copy(nextOwner[:])
				lease, flags = d.u8(), d.u8()
			}
			if d.err != nil {
				break
			}
			ls := f.sm.m[string(key)]
			switch kind {
			case freeRelease:
				r.ok = f.sm.mayRelease(ls, tok, &owner, false)
			case freeReleaseOwned:
				r.ok = f.sm.mayRelease(ls, tok, &owner, true)
			case freeExpire:
				r.ok = ls != nil && ls.token != 0 && ls.token == tok
			}
			if !r.ok {
				break
			}
			f.sm.free(ls)
			f.held--
			f.sm.forget(ls)
			if hasNext {
				var granted bool
				r.token, granted, r.exhausted = f.grant(key, nextOwner, lease, flags&flagOwned != 0)
				if !granted {
					r.token = 0
				}
			}
		case cmdFloor:
			v := d.u64()
			if d.err == nil && v > f.sm.last && v <= MaxToken {
				f.sm.last = v
			}
		case cmdStint:
			if v := d.u64(); d.err == nil {
				f.stint = v
				f.sawStint = true
			}
		case cmdAdvertise:
			id, addr := d.bytes8(), d.bytes8()
			if d.err == nil {
				f.addrs[string(id)] = string(addr)
				advertised = true
			}
		case cmdClusterID:
			if id := d.bytes8(); d.err == nil && f.cid == "" && len(id) > 0 {
				f.cid = string(id)
				f.sawCID = true
			}
		default:
			d.fail()
		}
		if d.err != nil {
			return stint, res, advertised, fmt.Errorf("%w: command %d of type %d", errEntry, len(res), typ)
		}
		res = append(res, r)
	}
	if len(d.b) != 0 {
		return stint, res, advertised, fmt.Errorf("%w: trailing bytes", errEntry)
	}
	return stint, res, advertised, nil
}

// grant is the Grant command: token, granted, exhausted.
func (f *clusterFSM) grant(key []byte, owner [wire.OwnerLen]byte, lease uint8, ownedOnly bool) (uint64, bool, bool) {
	ls := f.sm.m[string(key)]
	switch f.sm.decide(ls, &owner) {
	case grantNew:
		if f.sm.last >= MaxToken {
			return 0, false, true
		}
		ls = f.sm.applyGrant(ls, string(key), owner, lease, ownedOnly, 0)
		f.held++
		return ls.token, true, false
	case grantRetry:
		return ls.token, true, false
	}
	return 0, false, false
}

// takeoverFloor is the counter a new leader's takeover entry raises the
// counter to (with a Floor command, if above the applied counter): this
// node's floor (Config.InitialToken, or an imported standalone ceiling)
// and, if this node is configured with TokenStartClock and the counter is
// still 0 (a new cluster: no token was ever granted and no floor
// applied), ClockStart. So the first leader's setting decides where a new
// cluster starts. The clock is read by the
// proposing leader only, and reaches every node through the log, so the
// machine stays deterministic; once applied, the counter is no longer 0
// and the clock is never read again for it.
func (f *clusterFSM) takeoverFloor() uint64 {
	fl := f.floor
	if f.clockStart && f.last.Load() == 0 {
		fl = max(fl, ClockStart())
	}
	return fl
}

// holdingsNow returns a copy of the holdings and the last token.
func (f *clusterFSM) holdingsNow() ([]holding, uint64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.sm.holdings(), f.sm.last
}

// addresses returns a copy of the nodes' client addresses.
func (f *clusterFSM) addresses() map[string]string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return maps.Clone(f.addrs)
}

// clusterID returns the cluster's identity, once applied.
func (f *clusterFSM) clusterID() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.cid
}

// advertised returns the client address of node id, if known.
func (f *clusterFSM) advertised(id string) string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.addrs[id]
}

// Cluster snapshot, version 2: magic "TKCL", version u8 (2), stint u64,
// machine snapshot length u32 and bytes (the "TKSM" encoding of machine.go),
// address count uvarint, count × (id_len u8, id, addr_len u8, addr), sorted
// by id, then the cluster ID: id_len u8 (0: none yet), id. Version 1 is
// the same without the cluster ID; it is still read.
const (
	clusterSnapMagic   = "TKCL"
	clusterSnapVersion = 2
)

type fsmSnapshot struct{ b []byte }

func (s fsmSnapshot) Persist(sink raft.SnapshotSink) error {
	if _, err := sink.Write(s.b); err != nil {
		sink.Cancel()
		return err
	}
	return sink.Close()
}

func (s fsmSnapshot) Release() {}

// Snapshot encodes the state (under f.mu: applies wait meanwhile).
func (f *clusterFSM) Snapshot() (raft.FSMSnapshot, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	ms := f.sm.Snapshot()
	b := append([]byte(clusterSnapMagic), clusterSnapVersion)
	b = binary.BigEndian.AppendUint64(b, f.stint)
	b = binary.BigEndian.AppendUint32(b, uint32(len(ms)))
	b = append(b, ms...)
	ids := make([]string, 0, len(f.addrs))
	for id := range f.addrs {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	b = binary.AppendUvarint(b, uint64(len(ids)))
	for _, id := range ids {
		b = append(b, byte(len(id)))
		b = append(b, id...)
		b = append(b, byte(len(f.addrs[id])))
		b = append(b, f.addrs[id]...)
	}
	b = append(b, byte(len(f.cid)))
	b = append(b, f.cid...)
	return fsmSnapshot{b}, nil
}

// Restore replaces the state with a snapshot's.
func (f *clusterFSM) Restore(rc io.ReadCloser) error {
	defer rc.Close()
	b, err := io.ReadAll(rc)
	if err != nil {
		return err
	}
	sm, addrs, stint, cid, err := decodeClusterSnapshot(b)
	if err != nil {
		return err
	}
	f.mu.Lock()
	// The state is the snapshot's alone: this node's floor is not part of
	// it (a leader raises the counter to its floor through the log).
	f.sm, f.addrs, f.stint, f.cid = sm, addrs, stint, cid
	f.held = len(sm.m)
	f.last.Store(f.sm.last)
	f.nheld.Store(int64(f.held))
	f.mu.Unlock()
	if f.changed != nil {
		f.changed()
	}
	if cid != "" && f.identified != nil {
		f.identified(cid)
	}
	return nil
}

func decodeClusterSnapshot(b []byte) (machine, map[string]string, uint64, string, error) {
	bad := func(why string) (machine, map[string]string, uint64, string, error) {
		return machine{}, nil, 0, "", fmt.Errorf("%w: cluster snapshot: %s", errSnapshot, why)
	}
	d := decoder{b: b}
	var magic [4]byte
	d.copy(magic[:])
	if d.err != nil || string(magic[:]) != clusterSnapMagic {
		return bad("no header")
	}
	v := d.u8()
	if v != 1 && v != clusterSnapVersion {
		return bad(fmt.Sprintf("version %d", v))
	}
	stint := d.u64()
	n := d.u32()
	if d.err != nil || uint64(n) > uint64(len(d.b)) {
		return bad("machine length")
	}
	sm, err := restoreMachine(d.b[:n])
	if err != nil {
		return machine{}, nil, 0, "", err
	}
	d.b = d.b[n:]
	cnt := d.uvarint()
	if d.err != nil || cnt > uint64(len(d.b)) {
		return bad("address count")
	}
	addrs := make(map[string]string, cnt)
	for range cnt {
		id, addr := d.bytes8(), d.bytes8()
		if d.err != nil {
			return bad("truncated address")
		}
		addrs[string(id)] = string(addr)
	}
	var cid string
	if v >= 2 {
		id := d.bytes8()
		if d.err != nil {
			return bad("truncated cluster ID")
		}
		cid = string(id)
	}
	if len(d.b) != 0 {
		return bad("trailing bytes")
	}
	return sm, addrs, stint, cid, nil
}

// decoder reads the big-endian encodings above; the first short read sets
// err and makes every later read return zero.
type decoder struct {
	b   []byte
	err error
}

func (d *decoder) fail() {
	if d.err == nil {
		d.err = errEntry
	}
	d.b = nil
}

func (d *decoder) take(n int) []byte {
	if d.err != nil || len(d.b) < n {
		d.fail()
		return nil
	}
	v := d.b[:n]
	d.b = d.b[n:]
	return v
}

func (d *decoder) u8() uint8 {
	if v := d.take(1); v != nil {
		return v[0]
	}
	return 0
}

func (d *decoder) u32() uint32 {
	if v := d.take(4); v != nil {
		return binary.BigEndian.Uint32(v)
	}
	return 0
}

func (d *decoder) u64() uint64 {
	if v := d.take(8); v != nil {
		return binary.BigEndian.Uint64(v)
	}
	return 0
}

func (d *decoder) uvarint() uint64 {
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

func (d *decoder) bytes8() []byte { return d.take(int(d.u8())) }

func (d *decoder) copy(dst []byte) { copy(dst, d.take(len(dst))) }

// Encoding of commands (the proposer's).

func appendGrant(b []byte, seq uint64, key []byte, owner *[wire.OwnerLen]byte, lease uint8, ownedOnly bool) []byte {
	b = append(b, cmdGrant)
	b = binary.AppendUvarint(b, seq)
	b = append(b, byte(len(key)))
	b = append(b, key...)
	b = append(b, owner[:]...)
	return append(b, lease, flagsOf(ownedOnly))
}

func appendFree(b []byte, seq uint64, key string, tok uint64, kind uint8, owner *[wire.OwnerLen]byte, next *waiter) []byte {
	b = append(b, cmdFree)
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
	b = append(b, next.owner[:]...)
	return append(b, next.lease, flagsOf(next.ownedOnly))
}

func appendFloor(b []byte, v uint64) []byte {
	b = append(b, cmdFloor, 0)
	return binary.BigEndian.AppendUint64(b, v)
}

func appendStint(b []byte, v uint64) []byte {
	b = append(b, cmdStint, 0)
	return binary.BigEndian.AppendUint64(b, v)
}

func appendAdvertise(b []byte, id, addr string) []byte {
	b = append(b, cmdAdvertise, 0, byte(len(id)))
	b = append(b, id...)
	b = append(b, byte(len(addr)))
	return append(b, addr...)
}

func appendClusterID(b []byte, id string) []byte {
	b = append(b, cmdClusterID, 0, byte(len(id)))
	return append(b, id...)
}

// entryHeader returns the header of an entry of n commands.
func entryHeader(stint uint64, n int) []byte {
	b := make([]byte, 0, 1+8+binary.MaxVarintLen64)
	b = append(b, entryVersion)
	b = binary.BigEndian.AppendUint64(b, stint)
	return binary.AppendUvarint(b, uint64(n))
}

func flagsOf(ownedOnly bool) byte {
	if ownedOnly {
		return flagOwned
	}
	return 0
}
