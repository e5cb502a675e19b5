package server

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/ticketing-dev/ticketing/internal/fsutil"
	"github.com/ticketing-dev/ticketing/server/internal/lockcore"
	"github.com/ticketing-dev/ticketing/server/internal/replica"
)

// Tokens of a hot-standby pair: an epoch in the high bits.
//
// A pair node issues tokens only while it serves, each from the range of
// the epoch it took when it started serving: epoch e owns the tokens
// e<<epochShift .. (e+1)<<epochShift - 1 (the machine's ceiling). The
// primary takes even epochs, the backup odd ones, so the two nodes' ranges
// are disjoint: no token is ever issued twice, even while both serve (a
// split brain). A node that starts serving takes the smallest epoch of its
// parity above every epoch it has used or seen (its own, its peer's from
// the heartbeats, the epoch of the highest token it has applied), and
// fsyncs it before it serves. So every token a newly serving node issues
// is above every token any earlier serving node can still issue, and the
// database fence rejects the deposed side's writes once the new side has
// written. The epoch file (pair.epoch) holds one number, mark: 1 + the
// highest epoch used or seen (0: none).
//
// An epoch's range holds 2^40 tokens (about 1.1e12: 63 days of grants at
// 200k/s without a failover or restart); a node that exhausts it answers
// B until it serves again under a new epoch. It cannot move to its next
// epoch by itself: while the link is cut, that could put its tokens above
// those of a peer that took over meanwhile. Epochs end at MaxToken >>
// epochShift, so tokens stay below 2^63.

const (
	epochShift    = 40
	maxEpoch      = lockcore.MaxToken >> epochShift
	pairEpochFile = "pair.epoch"
	epochMagic    = "TKEP"
)

// errEpochCorrupt: pair.epoch exists but does not hold a valid mark.
var errEpochCorrupt = errors.New("pair.epoch is corrupt")

// epochBase is the first token of epoch e's range (0 for epoch 0: the
// first token issued is base+1, so a new pair's primary starts at 1 as
// the protocol says).
func epochBase(e uint64) uint64 { return e << epochShift }

// epochCeil is the last token of epoch e's range.
func epochCeil(e uint64) uint64 { return min(epochBase(e+1)-1, lockcore.MaxToken) }

// nextEpoch returns the epoch a node of parity (0 primary, 1 backup) takes
// when it starts serving: the smallest of its parity at or above lo, where
// lo is above every mark given (marks are 1 + an epoch, 0 for none) and at
// least the epoch of floor (the configured token floor).
func nextEpoch(parity uint64, floor uint64, marks ...uint64) (uint64, error) {
	lo := floor >> epochShift
	for _, m := range marks {
		lo = max(lo, m)
	}
	if lo%2 != parity {
		lo++
	}
	if lo > maxEpoch {
		return 0, fmt.Errorf("server: pair: no epoch left (every epoch up to %d is used): %w", maxEpoch, ErrTokensExhausted)
	}
	return lo, nil
}

// markOfToken is the mark of the epoch of token t (0 for no token).
func markOfToken(t uint64) uint64 {
	if t == 0 {
		return 0
	}
	return t>>epochShift + 1
}

// epochStore is pair.epoch: the durable mark. Encoding: magic "TKEP",
// mark u64, crc32 (IEEE) of the 12 bytes before it.
type epochStore struct {
	dir  string
	mark uint64
	// fresh: the file did not exist (a new data dir).
	fresh bool
}

// openEpochStore reads dir's pair.epoch. A missing file is a fresh store
// (mark 0); a corrupt one is an error: the node cannot know which epochs
// it used.
func openEpochStore(dir string) (*epochStore, error) {
	es := &epochStore{dir: dir}
	b, err := os.ReadFile(filepath.Join(dir, pairEpochFile))
	switch {
	case errors.Is(err, fs.ErrNotExist):
		es.fresh = true
		return es, nil
	case err != nil:
		return nil, fmt.Errorf("server: pair: %w", err)
	}
	if len(b) != 16 || string(b[:4]) != epochMagic || crc32.ChecksumIEEE(b[:12]) != binary.BigEndian.Uint32(b[12:]) {
		return nil, fmt.Errorf("server: pair: %s: %w: the node cannot tell which token epochs it used; move the file away and start it with initial-token at least the highest token the pair issued", filepath.Join(dir, pairEpochFile), errEpochCorrupt)
	}
	es.mark = binary.BigEndian.Uint64(b[4:12])
	return es, nil
}

// raise durably records mark, if it is above the stored one: a new file,
// fsync'd, renamed over the old one, and the directory fsync'd.
func (es *epochStore) raise(mark uint64) error {
	if mark <= es.mark && !es.fresh {
		return nil
	}
	b := make([]byte, 0, 16)
	b = append(b, epochMagic...)
	b = binary.BigEndian.AppendUint64(b, max(mark, es.mark))
	b = binary.BigEndian.AppendUint32(b, crc32.ChecksumIEEE(b))
	path := filepath.Join(es.dir, pairEpochFile)
	if err := fsutil.ReplaceFile(path, b); err != nil {
		return fmt.Errorf("server: pair: write %s: %w", path, err)
	}
	es.mark, es.fresh = max(mark, es.mark), false
	return nil
}

// pairIDFile holds a pair node's identity (PairConfig.ID).
const pairIDFile = "pair.id"

// errPairID: the data dir belongs to another pair than the configured one.
var errPairID = errors.New("server: pair: the data dir belongs to another pair")

// loadPairID returns the pair's identity for a node of pc on dir: the
// configured one (recorded if the dir has none), else the recorded one,
// else for a primary a new one (recorded); a backup without either has
// none until it meets its primary (pair.adoptID).
func loadPairID(dir string, pc PairConfig) (string, error) {
	b, err := os.ReadFile(filepath.Join(dir, pairIDFile))
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return "", fmt.Errorf("server: pair: %w", err)
	}
	stored := strings.TrimSpace(string(b))
	if err == nil && !replica.ValidID(stored) {
		return "", fmt.Errorf("server: pair: %s holds no valid pair ID", filepath.Join(dir, pairIDFile))
	}
	switch {
	case pc.ID != "" && stored != "" && pc.ID != stored:
		return "", fmt.Errorf("%w: %s records pair ID %q, the configuration gives %q", errPairID, filepath.Join(dir, pairIDFile), stored, pc.ID)
	case stored != "":
		return stored, nil
	case pc.ID != "":
		return pc.ID, storePairID(dir, pc.ID)
	case pc.Role == PairPrimary:
		id := replica.NewID()
		return id, storePairID(dir, id)
	}
	return "", nil
}

// storePairID durably records id in dir.
func storePairID(dir, id string) error {
	path := filepath.Join(dir, pairIDFile)
	if err := fsutil.ReplaceFile(path, []byte(id+"\n")); err != nil {
		return fmt.Errorf("server: pair: write %s: %w", path, err)
	}
	return nil
}
