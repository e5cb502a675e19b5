package server

import (
	"errors"
	"fmt"
	"hash/crc32"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
)

// Token store files in Config.DataDir.
const (
	ceilingFile  = "tokens.ceiling"
	ceilingTemp  = "tokens.ceiling.tmp"
	lockFile     = "LOCK"
	ceilingMagic = "ticketing-token-ceiling v1"
)

// errStoreClosed is returned by next after the store has been closed.
var errStoreClosed = errors.New("server: token store closed")

// tokenStore hands out fencing tokens from an atomic counter that never
// passes a durable ceiling. The ceiling is reserved a block at a time by a
// background goroutine, ahead of need; a grant only waits for the disk when
// the reservation falls behind.
type tokenStore struct {
	dir   string
	block uint64

	last    atomic.Uint64 // last token handed out (or skipped)
	ceiling atomic.Uint64 // durable: no token above it is used
	kicked  atomic.Bool   // a reservation has been requested and not yet done

	mu     sync.Mutex
	cond   *sync.Cond
	err    error // last reservation error; cleared by a successful one
	closed bool

	kick chan struct{}
	done chan struct{}
	lock *os.File
}

// openStore opens or creates the store in dir, reserves the first block
// synchronously (so that an unwritable directory fails here), and starts the
// reserving goroutine.
func openStore(dir string, block uint64) (*tokenStore, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("server: data dir %s: %w", dir, err)
	}
	st, err := os.Stat(dir)
	if err != nil {
		return nil, fmt.Errorf("server: data dir %s: %w", dir, err)
	}
	if !st.IsDir() {
		return nil, fmt.Errorf("server: data dir %s is not a directory", dir)
	}
	lf, err := lockDir(filepath.Join(dir, lockFile))
	if err != nil {
		return nil, err
	}
	t := &tokenStore{dir: dir, block: block, kick: make(chan struct{}, 1), done: make(chan struct{}), lock: lf}
	t.cond = sync.NewCond(&t.mu)
	ceil, err := readCeiling(dir)
	if err != nil {
		unlockDir(lf)
		return nil, err
	}
	t.last.Store(ceil)
	t.ceiling.Store(ceil)
	if err := t.reserve(); err != nil {
		unlockDir(lf)
		return nil, err
	}
	go t.run()
	return t, nil
}

// readCeiling returns the durable ceiling in dir, 0 for a fresh directory.
func readCeiling(dir string) (uint64, error) {
	path := filepath.Join(dir, ceilingFile)
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		// A missing file is a fresh start only if the directory holds nothing
		// else of ours: otherwise someone deleted the ceiling, and starting
		// again at 1 would reissue tokens.
		ents, derr := os.ReadDir(dir)
		if derr != nil {
			return 0, fmt.Errorf("server: data dir %s: %w", dir, derr)
		}
		for _, e := range ents {
			switch e.Name() {
			case lockFile, ceilingTemp:
				continue
			}
			return 0, fmt.Errorf("server: token store %s is missing but data dir %s is not empty (found %q); refusing to restart tokens at 1: restore the file or use an empty directory", path, dir, e.Name())
		}
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("server: token store %s: %w", path, err)
	}
	v, err := parseCeiling(b)
	if err != nil {
		return 0, fmt.Errorf("server: token store %s is corrupt (%v); refusing to start: restore it or, if tokens may restart, remove the data dir", path, err)
	}
	return v, nil
}

// formatCeiling renders the ceiling file: one line,
// "ticketing-token-ceiling v1 <ceiling> <crc32c of what precedes, 8 hex>\n".
func formatCeiling(v uint64) []byte {
	s := ceilingMagic + " " + strconv.FormatUint(v, 10)
	return fmt.Appendf(nil, "%s %08x\n", s, crc32.Checksum([]byte(s), crcTable))
}

var crcTable = crc32.MakeTable(crc32.Castagnoli)

func parseCeiling(b []byte) (uint64, error) {
	s, ok := strings.CutSuffix(string(b), "\n")
	if !ok {
		return 0, errors.New("truncated: no final newline")
	}
	i := strings.LastIndexByte(s, ' ')
	if i < 0 {
		return 0, errors.New("no checksum")
	}
	body, sum := s[:i], s[i+1:]
	want, err := strconv.ParseUint(sum, 16, 32)
	if err != nil || len(sum) != 8 {
		return 0, errors.New("bad checksum field")
	}
	if crc32.Checksum([]byte(body), crcTable) != uint32(want) {
		return 0, errors.New("checksum mismatch")
	}
	num, ok := strings.CutPrefix(body, ceilingMagic+" ")
	if !ok {
		return 0, errors.New("unknown format or version")
	}
	v, err := strconv.ParseUint(num, 10, 64)
	if err != nil {
		return 0, errors.New("bad ceiling number")
	}
	return v, nil
}

// writeCeiling durably replaces the ceiling file: temp file, fsync, rename,
// fsync of the directory.
func writeCeiling(dir string, v uint64) error {
	tmp := filepath.Join(dir, ceilingTemp)
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	if _, err := f.Write(formatCeiling(v)); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp, filepath.Join(dir, ceilingFile)); err != nil {
		return err
	}
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	err = d.Sync()
	if cerr := d.Close(); err == nil {
		err = cerr
	}
	return err
}

// reserve makes the ceiling at least last+block durable.
func (t *tokenStore) reserve() error {
	cur := t.ceiling.Load()
	want := max(cur, t.last.Load()) + t.block
	if cur > t.last.Load()+t.block/2 {
		return nil // already well ahead (a redundant request)
	}
	if err := writeCeiling(t.dir, want); err != nil {
		return fmt.Errorf("server: token store %s: reserving tokens up to %d: %w", filepath.Join(t.dir, ceilingFile), want, err)
	}
	t.ceiling.Store(want)
	return nil
}

func (t *tokenStore) run() {
	defer close(t.done)
	for range t.kick {
		err := t.reserve()
		t.kicked.Store(false)
		t.mu.Lock()
		t.err = err
		t.cond.Broadcast()
		t.mu.Unlock()
	}
}

func (t *tokenStore) wake() {
	if !t.kicked.Swap(true) {
		select {
		case t.kick <- struct{}{}:
		default:
		}
	}
}

// next returns a new token, strictly greater than every token returned
// before (in this process and, through the ceiling, any earlier one).
func (t *tokenStore) next() (uint64, error) {
	v := t.last.Add(1)
	c := t.ceiling.Load()
	if v+t.block/2 > c {
		t.wake()
	}
	if v <= c {
		return v, nil
	}
	// The reservation fell behind: wait for the disk.
	t.mu.Lock()
	defer t.mu.Unlock()
	for t.ceiling.Load() < v {
		if t.closed {
			return 0, errStoreClosed
		}
		if t.err != nil && !t.kicked.Load() {
			err := t.err
			t.err = nil // let the next call try again
			return 0, err
		}
		t.wake()
		t.cond.Wait()
	}
	return v, nil
}

// close stops the reserving goroutine and releases the directory lock.
func (t *tokenStore) close() {
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		return
	}
	t.closed = true
	t.cond.Broadcast()
	t.mu.Unlock()
	close(t.kick)
	<-t.done
	unlockDir(t.lock)
}
