package main

import (
	"bufio"
	"encoding/binary"
	"errors"
	"hash/crc32"
	"io"
	"os"
	"path/filepath"

	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"
)

// wal is the etcd variant's log: one file of records, zeros written ahead
// of them (see zeroChunk), each
// [4 length][4 CRC-32C of type+data][1 type][data], type recEntry (a
// raftpb.Entry) or recHard (a raftpb.HardState). An entry at index i
// replaces every earlier-written entry at i or above. Appends are
// fdatasync'd (datasync, the product's primitive) when raft.MustSync says
// so: new entries, or a new term or vote.
type wal struct {
	f      *os.File
	buf    []byte
	prev   *raftpb.HardState
	off    int64 // where the records end
	zeroed int64 // zeros are written up to here
}

// zeroChunk is how much the WAL zeroes ahead of its records at a time, as
// internal/raftlog does: an fdatasync after a write into zeros already
// written flushes the data alone, while one after an append that grows
// the file also commits the file system's journal.
const zeroChunk = 1 << 20

var zeros = make([]byte, zeroChunk)

const (
	recEntry = 1
	recHard  = 2
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// openWAL opens (or creates) dir/wal and returns it with the hard state and
// entries it holds. A torn or damaged tail is cut off.
func openWAL(dir string) (*wal, *raftpb.HardState, []*raftpb.Entry, error) {
	hs := &raftpb.HardState{}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, hs, nil, err
	}
	f, err := os.OpenFile(filepath.Join(dir, "wal"), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, hs, nil, err
	}
	var ents []*raftpb.Entry
	r := bufio.NewReader(f)
	var good int64
	for {
		var h [9]byte
		if _, err := io.ReadFull(r, h[:]); err != nil {
			break
		}
		n := binary.BigEndian.Uint32(h[0:])
		data := make([]byte, n)
		if _, err := io.ReadFull(r, data); err != nil {
			break
		}
		c := crc32.Update(crc32.Checksum(h[8:9], castagnoli), castagnoli, data)
		if c != binary.BigEndian.Uint32(h[4:]) {
			break
		}
		switch h[8] {
		case recEntry:
			e := &raftpb.Entry{}
			if err := proto.Unmarshal(data, e); err != nil {
				f.Close()
				return nil, hs, nil, err
			}
			if len(ents) > 0 && e.GetIndex() <= ents[len(ents)-1].GetIndex() {
				ents = ents[:e.GetIndex()-ents[0].GetIndex()]
			}
			ents = append(ents, e)
		case recHard:
			hs = &raftpb.HardState{}
			if err := proto.Unmarshal(data, hs); err != nil {
				f.Close()
				return nil, hs, nil, err
			}
		default:
			f.Close()
			return nil, hs, nil, errors.New("wal: unknown record type")
		}
		good += int64(9 + n)
	}
	if err := f.Truncate(good); err != nil {
		f.Close()
		return nil, hs, nil, err
	}
	return &wal{f: f, prev: hs, off: good, zeroed: good}, hs, ents, nil
}

func (w *wal) record(typ byte, m proto.Message) error {
	start := len(w.buf)
	w.buf = append(w.buf, make([]byte, 9)...)
	var err error
	w.buf, err = proto.MarshalOptions{}.MarshalAppend(w.buf, m)
	if err != nil {
		return err
	}
	rec := w.buf[start:]
	binary.BigEndian.PutUint32(rec[0:], uint32(len(rec)-9))
	rec[8] = typ
	binary.BigEndian.PutUint32(rec[4:], crc32.Update(crc32.Checksum(rec[8:9], castagnoli), castagnoli, rec[9:]))
	return nil
}

// save appends hs (if not empty) and ents, in one write, and fdatasyncs
// when raft.MustSync says so.
func (w *wal) save(hs *raftpb.HardState, ents []*raftpb.Entry) error {
	return w.saveAll([]update{{hs, ents}})
}

// update is one Ready's (or one MsgStorageAppend's) entries and hard state.
type update struct {
	hs   *raftpb.HardState
	ents []*raftpb.Entry
}

// saveAll appends the updates in order, in one write, with at most one
// fdatasync.
func (w *wal) saveAll(us []update) error {
	w.buf = w.buf[:0]
	sync := false
	for _, u := range us {
		for i := range u.ents {
			if err := w.record(recEntry, u.ents[i]); err != nil {
				return err
			}
		}
		cur := w.prev
		if !raft.IsEmptyHardState(u.hs) {
			if err := w.record(recHard, u.hs); err != nil {
				return err
			}
			cur = u.hs
		}
		sync = sync || raft.MustSync(cur, w.prev, len(u.ents))
		w.prev = cur
	}
	if len(w.buf) == 0 {
		return nil
	}
	if _, err := w.f.WriteAt(w.buf, w.off); err != nil {
		return err
	}
	w.off += int64(len(w.buf))
	if w.off+zeroChunk/2 > w.zeroed {
		// Zeros read as the end of the records (a zero header fails its CRC).
		at := max(w.zeroed, w.off)
		if _, err := w.f.WriteAt(zeros, at); err != nil {
			return err
		}
		w.zeroed = at + zeroChunk
	}
	if sync {
		return datasync(w.f)
	}
	return nil
}

func (w *wal) close() error { return w.f.Close() }
