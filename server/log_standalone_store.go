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
	"time"

	"github.com/ticketing-dev/ticketing/internal/fsutil"
	"github.com/ticketing-dev/ticketing/server/internal/lockcore"
)

// Token store files in Config.DataDir.
const (
	ceilingFile = "tokens.ceiling"
	ceilingTemp = ceilingFile + ".tmp" // fsutil.ReplaceFile's temporary file
	// ceilingImportedFile marks a ceiling that a cluster node started from
	// as being in the cluster's state (cluster.markCeilingImported).
	ceilingImportedFile = ceilingFile + ".imported"
	lockFile            = "LOCK"
	ceilingMagic        = "ticketing-token-ceiling v1"
)

// MaxToken is the highest fencing token a server ever issues: 2^63-1, so
// that a token fits every signed 64-bit database column and the fence, which
// refuses larger ones. A server whose ceiling would pass it stops granting
// (ErrTokensExhausted) rather than wrap. It is the lock scheduler's
// lockcore.MaxToken: one definition for every mode.
const MaxToken uint64 = lockcore.MaxToken

// MaxClockStart bounds the wall-clock start of a new token store or
// cluster (see ClockStart): 2^60, about 36,000 years of microseconds, so
// that a wildly wrong clock still leaves 7/8 of the token space.
const MaxClockStart uint64 = 1 << 60

// wallMicros is the wall clock in microseconds since 1970 (a variable for
// the tests of the clamping).
var wallMicros = func() int64 { return time.Now().UnixMicro() }

// TokenStart says where a new token store, or a new cluster's counter,
// starts issuing tokens (Config.TokenStart). Persisted state always wins:
// it matters only when the store or cluster is created.
type TokenStart int

const (
	// TokenStartOne (the zero value, the default): tokens start at 1 (or
	// above Config.InitialToken), as the protocol says.
	TokenStartOne TokenStart = iota
	// TokenStartClock: tokens start above the wall clock in microseconds
	// (ClockStart) or Config.InitialToken, whichever is higher, so that a
	// reinstalled or wiped server never issues tokens below those an
	// earlier installation issued. ticketingd init writes it into the
	// configurations it generates.
	TokenStartClock
)

// String returns the name ticketingd uses for s: "one" or "clock".
func (s TokenStart) String() string {
	switch s {
	case TokenStartOne:
		return "one"
	case TokenStartClock:
		return "clock"
	}
	return fmt.Sprintf("TokenStart(%d)", int(s))
}

// ParseTokenStart returns the TokenStart named by s ("one" or "clock").
func ParseTokenStart(s string) (TokenStart, error) {
	switch s {
	case "one":
		return TokenStartOne, nil
	case "clock":
		return TokenStartClock, nil
	}
	return 0, fmt.Errorf("token start %q is neither one nor clock", s)
}

// ClockStart is the value above which a new token store, or a new
// cluster's counter, starts issuing tokens with TokenStartClock when no
// higher floor is given:
// the wall clock in microseconds since 1970 (about 1.8e15 in the late 2020s, far below
// MaxToken, about 9.2e18), clamped to [0, MaxClockStart]. No server issues
// a token per microsecond on average, so a new installation starts above
// every token an earlier one can have issued, without the operator having
// to know it. It is read once, when the store or cluster is created; the
// value is then persisted (in the ceiling, or the cluster's log), and a
// restart continues from the persisted value, never from the clock.
func ClockStart() uint64 {
	us := wallMicros()
	if us < 0 {
		return 0
	}
	return min(uint64(us), MaxClockStart)
}

// MaxTokenBlock is the largest Config.TokenBlock (2^32).
const MaxTokenBlock uint64 = 1 << 32

// ErrTokensExhausted is the error of New when the token space is used up
// (the stored ceiling, or Config.InitialToken, plus one TokenBlock would pass
// MaxToken), and of Server.TokenStoreErr once a running server has reserved
// up to MaxToken: from then on a free key's ACQUIRE gets B. It is the lock
// scheduler's lockcore.ErrTokensExhausted, so errors.Is matches a grant's
// exhausted result in every mode as well.
var ErrTokensExhausted = lockcore.ErrTokensExhausted

// ErrCeilingMissing is the error of New for a data directory that has been
// used but holds no valid token ceiling: starting again from scratch could
// reissue tokens that fenced databases already hold (from 1 by default;
// with TokenStartClock, only if the clock is set back or the directory
// issued more than one token per microsecond on average; but New does not
// guess). Restore the ceiling
// file, or set Config.InitialToken (ticketingd serve --initial-token) to at
// least the highest token ever issued from the directory.
var ErrCeilingMissing = errors.New("server: token ceiling missing from a used data dir")

// errStoreClosed is returned by await after the store has been closed.
var errStoreClosed = errors.New("server: token store closed")

// errAwaitStopped is returned by await once its stop channel is closed
// (the waiting ACQUIRE's session ended).
var errAwaitStopped = errors.New("server: wait for a token stopped: the session ended")

// errTokenStall is what await reports when no reservation ended within its
// bound: the disk is slow or stalled.
var errTokenStall = errors.New("server: token store stalled: no ceiling reservation completed in time")

// writeCeilingFunc writes the ceiling; tests replace it (before New) to
// inject a slow or failing disk.
var writeCeilingFunc = writeCeiling

// tokenStore hands out fencing tokens from an atomic counter that never
// passes a durable ceiling. The ceiling is reserved a block at a time by a
// background goroutine, ahead of need. take never waits: a caller that gets
// no token may wait for the reservation with await, outside any lock.
type tokenStore struct {
	dir   string
	block uint64
	write func(dir string, v uint64) error

	last      atomic.Uint64 // last token handed out; never above ceiling
	ceiling   atomic.Uint64 // durable: no token above it is used
	kicked    atomic.Bool   // a reservation has been requested and not yet done
	exhausted atomic.Bool   // the ceiling is MaxToken and a further block was asked for
	pending   atomic.Int64  // when the running reservation began (Server clock ns + 1); 0: none
	clock     func() int64

	mu      sync.Mutex
	err     error         // last reservation error; cleared by a successful one
	changed chan struct{} // closed (and replaced) when a reservation ends or the store closes

	// reserved, if set, is called after each reservation ends (done or
	// failed), from the reserving goroutine, outside the store's mutex.
	reserved atomic.Pointer[func()]
	closed   bool

	kick chan struct{}
	done chan struct{}
	lock *os.File // LOCK, which also holds a copy of the ceiling

	// recovered: a used directory had no valid ceiling (in tokens.ceiling,
	// its temporary file or LOCK's copy) and tokens continue above
	// Config.InitialToken alone. New logs it as a warning.
	recovered bool
}

// openStore opens or creates the store in dir, reserves the first block
// synchronously (so that an unwritable directory fails here), and starts the
// reserving goroutine. Tokens continue above the stored ceiling or initial,
// whichever is higher; a store without a valid ceiling (a new one, or a
// used one recovered with initial) starts above initial (0: at 1) or, with
// TokenStartClock, above ClockStart if that is higher; the first
// reservation persists that start.
func openStore(dir string, block, initial uint64, ts TokenStart, clock func() int64) (*tokenStore, error) {
	_, serr := os.Stat(dir)
	created := errors.Is(serr, fs.ErrNotExist)
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
	// Whether the directory is fresh (empty) must be decided before lockDir
	// creates LOCK in it.
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("server: data dir %s: %w", dir, err)
	}
	fresh := len(ents) == 0
	lf, err := lockDir(filepath.Join(dir, lockFile))
	if err != nil {
		return nil, err
	}
	if fresh {
		// Another process may have used the directory between ReadDir and
		// the lock: fresh only if LOCK is still all there is.
		if ents, err = os.ReadDir(dir); err != nil || len(ents) != 1 {
			fresh = false
		}
	}
	// A start that fails leaves a fresh directory as it found it (empty),
	// so that the next start is not refused as a used one.
	fail := func(err error) (*tokenStore, error) {
		unlockDir(lf)
		if fresh {
			os.Remove(filepath.Join(dir, ceilingTemp))
			os.Remove(filepath.Join(dir, lockFile))
			if created {
				os.Remove(dir) // only if still empty
			}
		}
		return nil, err
	}
	ceil, found, err := readCeiling(dir, lf, fresh || initial > 0)
	if err != nil {
		return fail(err)
	}
	start := max(ceil, initial)
	if !found && ts == TokenStartClock {
		// A new store (or one whose ceiling is lost, started again with
		// an initial token), set to start above the clock: above every
		// token an earlier installation can have issued. Read once: from
		// now on the ceiling holds it.
		start = max(start, ClockStart())
	}
	if start > MaxToken || MaxToken-start < block {
		return fail(fmt.Errorf("%w: data dir %s: tokens would continue above %d, and a block of %d more passes the maximum token %d; refusing to start, since tokens never wrap or go back",
			ErrTokensExhausted, dir, start, block, MaxToken))
	}
	t := &tokenStore{dir: dir, block: block, write: writeCeilingFunc, clock: clock,
		changed: make(chan struct{}), kick: make(chan struct{}, 1), done: make(chan struct{}), lock: lf}
	t.recovered = !fresh && !found
	t.last.Store(start)
	t.ceiling.Store(start)
	if err := t.reserve(); err != nil {
		return fail(err)
	}
	go t.run()
	return t, nil
}

// readCeiling returns the durable ceiling in dir and whether one was found.
// Three copies count, each only if its checksum holds: tokens.ceiling, a
// temporary file (a crash between writing it and the rename, or a ceiling
// file lost after one), and the copy in LOCK (lock, written before every
// new ceiling, so never below it); the highest wins. Without any valid
// copy it returns 0 if mayStart (the directory was empty before this start,
// or Config.InitialToken is set), and otherwise refuses: a directory that
// holds anything, even LOCK alone, has been used, and starting again from
// scratch could reissue tokens.
func readCeiling(dir string, lock *os.File, mayStart bool) (ceil uint64, found bool, err error) {
	path := filepath.Join(dir, ceilingFile)
	b, err := os.ReadFile(path)
	switch {
	case err == nil:
		v, perr := parseCeiling(b)
		if perr != nil {
			if mayStart {
				break // the operator gave an initial token
			}
			return 0, false, fmt.Errorf("server: token store %s is corrupt (%v); refusing to start: restore it from a backup, or start with --initial-token N (Config.InitialToken), N at least the highest token ever issued from this directory, or, if tokens may restart, remove the data dir", path, perr)
		}
		ceil, found = v, true
	case !errors.Is(err, fs.ErrNotExist):
		return 0, false, fmt.Errorf("server: token store %s: %w", path, err)
	}
	// The temporary file counts only if it was written completely (its
	// checksum holds); a partly written one is what a crash during a
	// reservation leaves, next to the previous ceiling file.
	if tb, terr := os.ReadFile(filepath.Join(dir, ceilingTemp)); terr == nil {
		if v, perr := parseCeiling(tb); perr == nil {
			ceil, found = max(ceil, v), true
		}
	}
	if lock != nil {
		var buf [128]byte
		if n, _ := lock.ReadAt(buf[:], 0); n > 0 {
			if v, perr := parseCeiling(buf[:n]); perr == nil {
				ceil, found = max(ceil, v), true
			}
		}
	}
	if found {
		if ceil > MaxToken {
			return 0, false, fmt.Errorf("%w: token store %s holds ceiling %d, above the maximum token %d; refusing to start", ErrTokensExhausted, path, ceil, MaxToken)
		}
		return ceil, true, nil
	}
	if mayStart {
		return 0, false, nil
	}
	ents, derr := os.ReadDir(dir)
	if derr != nil {
		return 0, false, fmt.Errorf("server: data dir %s: %w", dir, derr)
	}
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	return 0, false, fmt.Errorf("%w: %s is missing but data dir %s has been used (it holds %q); refusing to start tokens again from scratch, which could reissue tokens a fenced database already holds. "+
		"Restore the file from a backup, or start with --initial-token N (Config.InitialToken) where N is at least the highest token ever issued from this directory (the highest token your fenced databases hold, or the last ticketing_token_ceiling you saw): tokens continue above N. "+
		"If this directory never granted a lock (its first start failed), you may instead remove it",
		ErrCeilingMissing, path, dir, names)
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

// writeCeiling durably replaces the ceiling file (fsutil.ReplaceFile: its
// temporary file is ceilingTemp, fsynced, renamed over it, and the
// directory fsynced).
func writeCeiling(dir string, v uint64) error {
	return fsutil.ReplaceFile(filepath.Join(dir, ceilingFile), formatCeiling(v))
}

// writeCopy durably writes the ceiling v into f (LOCK), in the ceiling
// file's format. A crash in the middle leaves a copy whose checksum fails,
// which readCeiling ignores (the ceiling file still holds the previous,
// sufficient, value).
func writeCopy(f *os.File, v uint64) error {
	b := formatCeiling(v)
	if _, err := f.WriteAt(b, 0); err != nil {
		return err
	}
	if err := f.Truncate(int64(len(b))); err != nil {
		return err
	}
	return f.Sync()
}

// reserve makes the ceiling at least last+block durable, capped at
// MaxToken.
func (t *tokenStore) reserve() error {
	cur := t.ceiling.Load()
	if cur-t.last.Load() > t.block/2 { // last <= cur always
		return nil // already well ahead (a redundant request)
	}
	if cur >= MaxToken {
		t.exhausted.Store(true)
		return fmt.Errorf("%w: the ceiling in %s is the maximum token %d", ErrTokensExhausted, filepath.Join(t.dir, ceilingFile), MaxToken)
	}
	want := cur + min(t.block, MaxToken-cur) // no wrap: cur < MaxToken
	// The copy in LOCK first: it is then never below the ceiling file, so
	// that recovering from it (tokens.ceiling deleted) cannot go back.
	if err := writeCopy(t.lock, want); err != nil {
		return fmt.Errorf("server: token store %s: reserving tokens up to %d: copy in %s: %w", filepath.Join(t.dir, ceilingFile), want, lockFile, err)
	}
	if err := t.write(t.dir, want); err != nil {
		return fmt.Errorf("server: token store %s: reserving tokens up to %d: %w", filepath.Join(t.dir, ceilingFile), want, err)
	}
	t.ceiling.Store(want)
	return nil
}

func (t *tokenStore) run() {
	defer close(t.done)
	for range t.kick {
		t.pending.Store(t.clock() + 1)
		err := t.reserve()
		t.pending.Store(0)
		t.kicked.Store(false)
		t.mu.Lock()
		t.err = err
		close(t.changed)
		t.changed = make(chan struct{})
		t.mu.Unlock()
		if f := t.reserved.Load(); f != nil {
			(*f)()
		}
	}
}

func (t *tokenStore) wake() {
	if t.exhausted.Load() {
		return // nothing left to reserve
	}
	if !t.kicked.Swap(true) {
		select {
		case t.kick <- struct{}{}:
		default:
		}
	}
}

// take returns a new token, strictly greater than every token returned
// before (in this process and, through the ceiling, any earlier one), or
// false if none is available below the durable ceiling right now. It never
// waits: it is called under shard mutexes.
func (t *tokenStore) take() (uint64, bool) {
	for {
		v := t.last.Load()
		c := t.ceiling.Load()
		if v >= c {
			t.wake()
			return 0, false
		}
		if c-v <= t.block/2+1 {
			t.wake() // reserve the next block ahead of need
		}
		if t.last.CompareAndSwap(v, v+1) {
			return v + 1, true
		}
	}
}

// await waits, up to d, for a token to be available (nil) or for the
// reservation that would make one available to end. It returns the
// reservation's error, ErrTokensExhausted, errTokenStall after d,
// errAwaitStopped once stop is closed, or errStoreClosed. It must not be
// called under a shard mutex.
func (t *tokenStore) await(d time.Duration, stop <-chan struct{}) error {
	t.mu.Lock()
	ch, closed := t.changed, t.closed
	t.mu.Unlock()
	if closed {
		return errStoreClosed
	}
	if t.last.Load() < t.ceiling.Load() {
		return nil // a reservation ended since take
	}
	if t.exhausted.Load() {
		return ErrTokensExhausted
	}
	t.wake()
	tm := time.NewTimer(d)
	defer tm.Stop()
	select {
	case <-ch:
	case <-tm.C:
		return errTokenStall
	case <-stop:
		return errAwaitStopped
	}
	t.mu.Lock()
	err := t.err
	if t.closed {
		err = errStoreClosed
	}
	t.mu.Unlock()
	if err != nil && t.last.Load() < t.ceiling.Load() {
		err = nil // an earlier reservation succeeded meanwhile
	}
	return err
}

// failed returns the last reservation's error, if it failed.
func (t *tokenStore) failed() error {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.err
}

// health returns nil while the store can reserve: not exhausted, the last
// reservation did not fail, and none has been running for longer than
// stall (server clock ns).
func (t *tokenStore) health(stall time.Duration) error {
	if t.exhausted.Load() {
		return fmt.Errorf("%w: the ceiling is the maximum token %d", ErrTokensExhausted, MaxToken)
	}
	if err := t.failed(); err != nil {
		return err
	}
	if p := t.pending.Load(); p != 0 {
		if d := time.Duration(t.clock() + 1 - p); d > stall {
			return fmt.Errorf("%w: a reservation has been running for %v", errTokenStall, d.Round(time.Millisecond))
		}
	}
	return nil
}

// closeWait bounds how long close waits for a reservation in progress (a
// stalled disk must not stall Shutdown).
var closeWait = time.Second

// close stops the reserving goroutine and releases the directory lock. If a
// reservation is still in progress after closeWait, close returns and the
// lock is released only when it ends: no other store may open the directory
// while a ceiling write of this one could still land.
func (t *tokenStore) close() {
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		return
	}
	t.closed = true
	close(t.changed)
	t.changed = make(chan struct{})
	t.mu.Unlock()
	close(t.kick)
	tm := time.NewTimer(closeWait)
	defer tm.Stop()
	select {
	case <-t.done:
		unlockDir(t.lock)
	case <-tm.C:
		go func() {
			<-t.done
			unlockDir(t.lock)
		}()
	}
}
