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

	"github.com/ticketing-dev/ticketing/internal/raft"

	"github.com/ticketing-dev/ticketing/internal/wire"
	"github.com/ticketing-dev/ticketing/server/internal/lockcore"
)

// The replicated state machine of a cluster node (Raft mode).
//
// Every node applies the committed log to one lockcore.Machine over all
// keys, plus the map of node IDs to client addresses that followers
// give as the NOT_ACTIVE hint. Only the leader proposes. A log entry is a
// batch of commands that the leader's proposer queued while the previous
// entry was being appended (group commit):
//
//	entry   = version u8 (1), stint u64, count uvarint, count × command
//	command = type u8, seq uvarint, fields
//	  Grant     (lockcore's command encoding)
//	  Free      (lockcore's command encoding)
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
// behind the new stint's mirror. Grant and Free are the machine's
// (Machine.ApplyCommand): Grant takes the machine's counter plus one (or
// fails, "exhausted", at MaxToken); Free frees the key if the token still
// holds it — a release (by token, or by token and owner) or an expiry —
// and, with next, grants it at once to the next waiter, so that a
// contended hand-off costs one commit. Floor raises the counter
// (Machine.Raise: a migration from a standalone node,
// Config.InitialToken, or with TokenStartClock a new cluster's first
// leader's ClockStart).
// Advertise records a node's client address.
// ClusterID records the cluster's identity (ClusterConfig.ClusterID, or a
// random one): the first one applied stays, later ones are ignored, so
// that every node that has the state knows the same identity. A leader
// puts it last in its takeover entry while the state has none.
const (
	entryVersion = 1

	cmdGrant     = lockcore.CmdGrant
	cmdFree      = lockcore.CmdFree
	cmdFloor     = 3
	cmdAdvertise = 4
	cmdStint     = 5
	cmdClusterID = 6
	cmdExtend    = lockcore.CmdExtend

	// The kinds of a Free, as log_cluster.go's scheduler names them.
	freeRelease      = lockcore.FreeRelease
	freeReleaseOwned = lockcore.FreeReleaseOwned
	freeExpire       = lockcore.FreeExpire
)

var errEntry = errors.New("server: bad cluster log entry")

// errSnapshot is a cluster snapshot's framing error (its machine part's is
// lockcore.ErrSnapshot).
var errSnapshot = errors.New("server: bad cluster snapshot")

// cmdResult is the outcome of one command.
type cmdResult struct {
	seq uint64
	res lockcore.Result // Grant: its token (0: held, or exhausted); Free: freed, and the next waiter's token
}

// clusterFSM is the raft.BatchingFSM of a node.
type clusterFSM struct {
	mu    sync.Mutex
	sm    *lockcore.Machine
	addrs map[string]string // node ID -> client address
	stint uint64            // the current leader's stint (entries of others are skipped)
	cid   string            // the cluster's identity (cmdClusterID; empty until applied)
	floor uint64            // this node's: the takeover raises the counter to it (not part of the state)
	// clockStart: this node's Config.TokenStart is TokenStartClock; as
	// leader of a new cluster it raises the counter to ClockStart (not
	// part of the state).
	clockStart bool

	applied atomic.Uint64
	last    atomic.Uint64 // sm.Last(), readable without mu
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
	return &clusterFSM{sm: lockcore.NewMachine(), addrs: make(map[string]string)}
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
	last := f.sm.Last()
	f.last.Store(last)
	f.nheld.Store(int64(f.sm.Len()))
	low := f.sawStint && f.floor > last
	f.sawStint = false
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
	d := lockcore.NewDecoder(b)
	if v := d.U8(); v != entryVersion {
		return 0, nil, false, fmt.Errorf("%w: version %d", errEntry, v)
	}
	stint = d.U64()
	n := d.Uvarint()
	if d.Err() != nil || n > uint64(len(b)) {
		return 0, nil, false, fmt.Errorf("%w: header", errEntry)
	}
	if stint != 0 && stint != f.stint {
		return 0, nil, false, nil // a deposed leader's entry: skipped on every node
	}
	res = make([]cmdResult, 0, n)
	for range n {
		typ := d.U8()
		seq := d.Uvarint()
		r := cmdResult{seq: seq}
		var bad error
		switch typ {
		case cmdGrant, cmdFree, cmdExtend:
			r.res, bad = f.sm.ApplyCommand(d, typ)
		case cmdFloor:
			if v := d.U64(); d.Err() == nil {
				f.sm.Raise(v)
			}
		case cmdStint:
			if v := d.U64(); d.Err() == nil {
				f.stint = v
				f.sawStint = true
			}
		case cmdAdvertise:
			id, addr := d.Bytes8(), d.Bytes8()
			if d.Err() == nil {
				f.addrs[string(id)] = string(addr)
				advertised = true
			}
		case cmdClusterID:
			if id := d.Bytes8(); d.Err() == nil && f.cid == "" && len(id) > 0 {
				f.cid = string(id)
				f.sawCID = true
			}
		default:
			bad = errors.New("unknown type")
		}
		if bad == nil {
			bad = d.Err()
		}
		if bad != nil {
			return stint, res, advertised, fmt.Errorf("%w: command %d of type %d: %w", errEntry, len(res), typ, bad)
		}
		res = append(res, r)
	}
	if d.Len() != 0 {
		return stint, res, advertised, fmt.Errorf("%w: trailing bytes", errEntry)
	}
	return stint, res, advertised, nil
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
func (f *clusterFSM) holdingsNow() ([]lockcore.Holding, uint64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.sm.Holdings(), f.sm.Last()
}

// holding returns key's holding in the machine, if it is held.
func (f *clusterFSM) holding(key string) (lockcore.Holding, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.sm.Holding(key)
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
// machine snapshot length u32 and bytes (lockcore.Machine.Snapshot's "TKSM"),
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
	f.last.Store(sm.Last())
	f.nheld.Store(int64(sm.Len()))
	f.mu.Unlock()
	if f.changed != nil {
		f.changed()
	}
	if cid != "" && f.identified != nil {
		f.identified(cid)
	}
	return nil
}

func decodeClusterSnapshot(b []byte) (*lockcore.Machine, map[string]string, uint64, string, error) {
	bad := func(why string) (*lockcore.Machine, map[string]string, uint64, string, error) {
		return nil, nil, 0, "", fmt.Errorf("%w: %s", errSnapshot, why)
	}
	d := lockcore.NewDecoder(b)
	var magic [4]byte
	d.Copy(magic[:])
	if d.Err() != nil || string(magic[:]) != clusterSnapMagic {
		return bad("no header")
	}
	v := d.U8()
	if v != 1 && v != clusterSnapVersion {
		return bad(fmt.Sprintf("version %d", v))
	}
	stint := d.U64()
	n := d.U32()
	if d.Err() != nil || uint64(n) > uint64(d.Len()) {
		return bad("machine length")
	}
	sm, err := lockcore.RestoreMachine(d.Take(int(n)))
	if err != nil {
		return nil, nil, 0, "", err
	}
	cnt := d.Uvarint()
	if d.Err() != nil || cnt > uint64(d.Len()) {
		return bad("address count")
	}
	addrs := make(map[string]string, cnt)
	for range cnt {
		id, addr := d.Bytes8(), d.Bytes8()
		if d.Err() != nil {
			return bad("truncated address")
		}
		addrs[string(id)] = string(addr)
	}
	var cid string
	if v >= 2 {
		id := d.Bytes8()
		if d.Err() != nil {
			return bad("truncated cluster ID")
		}
		cid = string(id)
	}
	if d.Len() != 0 {
		return bad("trailing bytes")
	}
	return sm, addrs, stint, cid, nil
}

// Encoding of commands (the proposer's).

// appendGrant and appendFree are lockcore's encoding (AppendGrant,
// AppendFree) in the FSM tests' terms.

func appendGrant(b []byte, seq uint64, key string, owner *[wire.OwnerLen]byte, lease uint8, ownedOnly bool) []byte {
	return lockcore.AppendGrant(b, seq, key, &lockcore.Recipient{Owner: *owner, LeaseS: lease, OwnedOnly: ownedOnly})
}

func appendFree(b []byte, seq uint64, key string, tok uint64, kind uint8, owner *[wire.OwnerLen]byte, next *lockcore.Recipient) []byte {
	return lockcore.AppendFree(b, seq, key, tok, kind, owner, next)
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
