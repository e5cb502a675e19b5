// Package crashtest is the kill -9 crash test of a Raft log store and
// stable store, shared by internal/raftstore (raftstore.Open's stores) and
// bench/logstore (raft-boltdb, raft-wal, raftstore.Open's stores).
//
// A test runs the test binary itself as a child: its TestMain sees the
// variables that [Config].ChildEnv returns, and calls [Child]. The child
// opens the stores and appends batches of 1..300 entries until it is
// killed, compacting the head now and then, and, with [Config].Truncate,
// truncating the tail too (then appending with a new term, as a follower
// whose log conflicts with its leader's). It reports each step on its
// standard output, one write(2) a line, once the store has returned: what
// the parent reads was acknowledged before the kill. [Rounds] kills the
// child with SIGKILL mid-stream, reopens the stores and checks that every
// acknowledged entry is there with its term and data, that no entry is
// there that the child never stored or had deleted, that FirstIndex
// honours the acknowledged compactions, and that the stable value is the
// acknowledged one or one the child was setting; then it runs a new child
// on the same directory, for several rounds.
//
// The package is not a _test package so that both modules can import it;
// only tests may import it (TestOnlyTestsImport checks the tree).
package crashtest

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ticketing-dev/ticketing/internal/raft"
)

// TermEnv names the environment variable that gives a child the term of
// its first appends; each tail truncation takes the next one. [Rounds]
// sets it (one more than the highest term used so far). It replaces
// internal/raftstore's RAFTSTORE_CRASH_TERM.
const TermEnv = "CRASHTEST_TERM"

// PayloadSize is the size of an entry's data, about a grant command.
const PayloadSize = 64

// StableKey is the stable store key that the child sets to its last index
// after each append: raft's own key for the current term.
var StableKey = []byte("CurrentTerm")

// Store is an open log store and stable store, and what closes them.
type Store struct {
	// Log is the log store under test.
	Log raft.LogStore
	// Stable is the stable store under test.
	Stable raft.StableStore
	// Close closes both.
	Close func() error
}

// Config is one crash test: a kind of store, and what its child does.
type Config struct {
	// ChildEnv returns the variables (NAME=VALUE) that, added to the test
	// binary's environment, make it a child on the stores in dir: its
	// TestMain calls [Child] with the same Config.
	ChildEnv func(dir string) []string
	// Open opens the stores in dir: in the child to write, in the parent
	// to check them after a kill.
	Open func(dir string) (Store, error)
	// Truncate makes the child truncate the tail too (the last 1..500
	// entries, when it holds more than 600, one append in four), then
	// append with the next term. Leave it false for a store that cannot
	// truncate its tail, or that should be tested as before truncations
	// came in.
	Truncate bool
	// Rounds is the number of kills on one directory; 0 means 8.
	Rounds int
}

// Entries returns n entries of term from index first, as raft's leader
// builds them, with [Payload] as their data.
func Entries(first uint64, n int, term uint64) []*raft.Log {
	logs := make([]*raft.Log, n)
	now := time.Now()
	for i := range logs {
		idx := first + uint64(i)
		logs[i] = &raft.Log{Index: idx, Term: term, Type: raft.LogCommand, Data: Payload(idx, term), AppendedAt: now}
	}
	return logs
}

// Payload is the data of entry idx of term: [PayloadSize] bytes that
// depend on both, so that a reader can check them.
func Payload(idx, term uint64) []byte {
	p := make([]byte, PayloadSize)
	for i := range p {
		p[i] = byte(idx>>(8*(i%8))) ^ byte(i) ^ byte(term*13)
	}
	return p
}

// Child is the child process: it opens c's stores in dir and appends
// batches of 1..300 entries until it is killed, compacting the head now
// and then, and with c.Truncate truncating the tail too (then appending
// with a new term). Its first term comes from [TermEnv]. Before a
// StoreLogs it prints "store A B T" (entries A..B of term T), after it
// "log B"; "stable N" once SetUint64(StableKey, N) has returned; "first N"
// once DeleteRange up to N-1 has; "truncating N" before a DeleteRange of
// the entries after N, "trunc N" after it; "err ..." when something fails.
// It returns the process's exit code, only after a failure.
func Child(c Config, dir string) int {
	say := func(format string, args ...any) {
		// One write(2) per line, no buffering: what the parent reads was
		// acknowledged before the kill.
		os.Stdout.WriteString(fmt.Sprintf(format, args...) + "\n")
	}
	term, err := strconv.ParseUint(os.Getenv(TermEnv), 10, 64)
	if err != nil {
		say("err %s: %v", TermEnv, err)
		return 1
	}
	s, err := c.Open(dir)
	if err != nil {
		say("err open: %v", err)
		return 1
	}
	last, err := s.Log.LastIndex()
	if err != nil {
		say("err LastIndex: %v", err)
		return 1
	}
	first, err := s.Log.FirstIndex()
	if err != nil {
		say("err FirstIndex: %v", err)
		return 1
	}
	say("ready %d", last)
	for {
		n := 1 + rand.IntN(300)
		say("store %d %d %d", last+1, last+uint64(n), term)
		if err := s.Log.StoreLogs(Entries(last+1, n, term)); err != nil {
			say("err StoreLogs: %v", err)
			return 1
		}
		last += uint64(n)
		say("log %d", last)
		if err := s.Stable.SetUint64(StableKey, last); err != nil {
			say("err SetUint64: %v", err)
			return 1
		}
		say("stable %d", last)
		if last-first > 6000 && rand.IntN(10) == 0 {
			upTo := last - 2000
			if err := s.Log.DeleteRange(first, upTo); err != nil {
				say("err DeleteRange: %v", err)
				return 1
			}
			first = upTo + 1
			say("first %d", first)
		}
		if c.Truncate && last-first > 600 && rand.IntN(4) == 0 {
			// A follower's log conflict: the last 1..500 entries go.
			keep := last - 1 - uint64(rand.IntN(500))
			say("truncating %d", keep)
			if err := s.Log.DeleteRange(keep+1, last); err != nil {
				say("err DeleteRange: %v", err)
				return 1
			}
			last = keep
			term++
			say("trunc %d", keep)
		}
	}
}

// acked is what the children reported before they died, and what the
// store may hold: terms[i] is the term entry i has if the store holds it.
type acked struct {
	// log is the LastIndex the store must reach at least.
	log, stable, first uint64
	terms              map[uint64]uint64
	// maxTerm is the highest term a child used.
	maxTerm uint64
	// stableMay are the values StableKey may have: the acknowledged one
	// and those the child may have been setting since.
	stableMay []uint64
	// truncating says that the current round's child began a tail
	// truncation: the store's LastIndex may then go back.
	truncating bool
	// compactions and truncations count the acknowledged head compactions
	// and tail truncations of all rounds.
	compactions, truncations int
	// lines are the children's last lines, for a failure's message.
	lines []string
}

// lineArgs is the number of numbers each line of a child has.
var lineArgs = map[string]int{"ready": 1, "store": 3, "log": 1, "stable": 1, "first": 1, "truncating": 1, "trunc": 1}

// line takes in a line of a child. It returns whether the line was a
// "log" line.
func (a *acked) line(text string) (bool, error) {
	a.lines = append(a.lines, text)
	if len(a.lines) > 40 {
		a.lines = a.lines[1:]
	}
	f := strings.Fields(text)
	if len(f) == 0 {
		return false, nil
	}
	if f[0] == "err" {
		return false, errors.New(text)
	}
	var v []uint64
	for _, x := range f[1:] {
		n, err := strconv.ParseUint(x, 10, 64)
		if err != nil {
			return false, fmt.Errorf("%q: %v", text, err)
		}
		v = append(v, n)
	}
	if n, ok := lineArgs[f[0]]; !ok || len(v) != n {
		return false, fmt.Errorf("unexpected %q", text)
	}
	switch f[0] {
	case "store":
		for i := v[0]; i <= v[1]; i++ {
			a.terms[i] = v[2]
		}
		a.maxTerm = max(a.maxTerm, v[2])
	case "log":
		a.log = v[0]
		a.stableMay = append(a.stableMay, v[0])
		return true, nil
	case "stable":
		a.stable = v[0]
		a.stableMay = []uint64{v[0]}
	case "first":
		a.first = v[0]
		a.compactions++
	case "truncating":
		// The entries after v[0] may be there or not.
		a.log = min(a.log, v[0])
		a.truncating = true
	case "trunc":
		for i := range a.terms {
			if i > v[0] {
				delete(a.terms, i)
			}
		}
		a.truncations++
	}
	return false, nil
}

// runAndKill runs a child of c on dir, starting at term, kills it with
// SIGKILL after it has reported kill appends, and updates a with what it
// acknowledged.
func runAndKill(t testing.TB, c Config, dir string, term uint64, kill int, a *acked) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(append(os.Environ(), c.ChildEnv(dir)...), TermEnv+"="+strconv.FormatUint(term, 10))
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	// The child is killed on every path; a hang fails the test run's
	// -timeout rather than this test waiting forever.
	killed := false
	defer func() {
		if !killed {
			cmd.Process.Kill()
		}
	}()
	a.truncating = false
	logs := 0
	sc := bufio.NewScanner(out)
	for sc.Scan() {
		isLog, err := a.line(sc.Text())
		if err != nil {
			t.Fatalf("child: %v", err)
		}
		if isLog {
			logs++
		}
		if logs == kill && !killed {
			// Mid-stream: the child is in its next StoreLogs, SetUint64
			// or DeleteRange. Keep reading: lines written before the
			// kill are still in the pipe.
			if err := cmd.Process.Kill(); err != nil {
				t.Fatal(err)
			}
			killed = true
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	err = cmd.Wait()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
		t.Fatalf("child ended with %v (want SIGKILL); stderr:\n%s", err, stderr.String())
	}
}

// checkStore reopens c's stores in dir and checks that they hold every
// acknowledged entry, with its term and data, that every other entry they
// hold is one the child stored and did not delete, and the acknowledged
// stable value (or one the child may have been setting). minFirst is the
// FirstIndex found after the previous round. It returns FirstIndex, and
// forgets in a the entries the store does not hold.
func checkStore(t testing.TB, c Config, dir string, a *acked, minFirst uint64) uint64 {
	t.Helper()
	s, err := c.Open(dir)
	if err != nil {
		t.Fatalf("reopen after kill: %v", err)
	}
	defer func() {
		if err := s.Close(); err != nil {
			t.Error(err)
		}
	}()
	first, err := s.Log.FirstIndex()
	if err != nil {
		t.Fatal(err)
	}
	last, err := s.Log.LastIndex()
	if err != nil {
		t.Fatal(err)
	}
	if last < a.log {
		t.Fatalf("LastIndex = %d after kill; StoreLogs up to %d had returned", last, a.log)
	}
	if first < max(a.first, minFirst) || first > a.log {
		t.Fatalf("FirstIndex = %d after kill; acknowledged first %d (before: %d), last %d", first, a.first, minFirst, a.log)
	}
	var l raft.Log
	for i := first; i <= last; i++ {
		if err := s.Log.GetLog(i, &l); err != nil {
			t.Fatalf("GetLog(%d) with FirstIndex %d, LastIndex %d: %v", i, first, last, err)
		}
		term, ok := a.terms[i]
		if !ok {
			t.Fatalf("entry %d (term %d) found, LastIndex %d: the child never stored it, or deleted it (acknowledged log %d)", i, l.Term, last, a.log)
		}
		if l.Index != i || l.Term != term || l.Type != raft.LogCommand || !bytes.Equal(l.Data, Payload(i, term)) {
			t.Fatalf("entry %d read back as index %d term %d type %v data %x; want term %d (acknowledged log %d)", i, l.Index, l.Term, l.Type, l.Data, term, a.log)
		}
	}
	v, err := s.Stable.GetUint64(StableKey)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(a.stableMay, v) {
		t.Fatalf("stable %s = %d after kill; acknowledged %d, then maybe %v", StableKey, v, a.stable, a.stableMay[1:])
	}
	t.Logf("acknowledged log %d stable %d first %d; found FirstIndex %d LastIndex %d stable %d",
		a.log, a.stable, a.first, first, last, v)
	for i := range a.terms {
		if i > last {
			delete(a.terms, i)
		}
	}
	a.log = last
	return first
}

// Rounds runs c's crash test on a new directory: c.Rounds times (8 if 0)
// a child appends, is killed with SIGKILL mid-stream, and the stores are
// reopened and checked. Every round's child must acknowledge some entries,
// and more than the previous round's when it began no tail truncation.
// Over all rounds the children must have compacted the head, and with
// c.Truncate truncated the tail, at least once. A failure's message ends
// with the children's last 40 lines. It skips in -short mode.
func Rounds(t *testing.T, c Config) {
	t.Helper()
	if testing.Short() {
		t.Skip("spawns processes")
	}
	rounds := c.Rounds
	if rounds == 0 {
		rounds = 8
	}
	dir := t.TempDir()
	first := uint64(1)
	a := &acked{terms: map[uint64]uint64{}}
	defer func() {
		if t.Failed() {
			t.Logf("the child's last lines:\n%s", strings.Join(a.lines, "\n"))
		}
	}()
	for round := range rounds {
		before := a.log
		runAndKill(t, c, dir, a.maxTerm+1, 20+rand.IntN(200), a)
		if a.log == 0 || (!a.truncating && a.log <= before) {
			t.Fatalf("round %d: the child acknowledged nothing (LastIndex before: %d, acknowledged: %d)", round, before, a.log)
		}
		first = checkStore(t, c, dir, a, first)
	}
	t.Logf("%d rounds: %d head compactions, %d tail truncations acknowledged", rounds, a.compactions, a.truncations)
	if a.compactions == 0 {
		t.Errorf("no head compaction in %d rounds", rounds)
	}
	if c.Truncate && a.truncations == 0 {
		t.Errorf("no tail truncation in %d rounds", rounds)
	}
}
