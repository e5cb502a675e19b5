package raftstore

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

	"github.com/hashicorp/raft"
)

// crashChildEnv names the directory a child process of TestCrashKill9
// writes to, with Open's stores.
const crashChildEnv = "RAFTSTORE_CRASH_CHILD_DIR"

// crashModeEnv is the child's mode: "" (default segments, appends and head
// compactions) or "small" (tiny segments, and tail truncations too).
const crashModeEnv = "RAFTSTORE_CRASH_MODE"

// crashTermEnv is the term of the child's first appends; each tail
// truncation takes the next one.
const crashTermEnv = "RAFTSTORE_CRASH_TERM"

// smallSegmentSize is the segment size of the "small" mode: a rotation
// every one to three appends.
const smallSegmentSize = 32 << 10

// payloadSize is the size of a log entry's data, about a grant command.
const payloadSize = 64

// makeLogs returns n entries of term 1 from index first, as raft's leader
// builds them.
func makeLogs(first uint64, n int) []*raft.Log { return makeTermLogs(first, n, 1) }

func makeTermLogs(first uint64, n int, term uint64) []*raft.Log {
	logs := make([]*raft.Log, n)
	now := time.Now()
	for i := range logs {
		idx := first + uint64(i)
		logs[i] = &raft.Log{Index: idx, Term: term, Type: raft.LogCommand, Data: termPayload(idx, term), AppendedAt: now}
	}
	return logs
}

// payload is the data of entry idx of term 1: payloadSize bytes that
// depend on idx, so a reader can check it.
func payload(idx uint64) []byte { return termPayload(idx, 1) }

// termPayload is the data of entry idx of term: it depends on both.
func termPayload(idx, term uint64) []byte {
	p := make([]byte, payloadSize)
	for i := range p {
		p[i] = byte(idx>>(8*(i%8))) ^ byte(i) ^ byte(term*13)
	}
	return p
}

var stableKey = []byte("CurrentTerm")

// crashChild opens Open's stores in dir and appends batches of 1..300
// entries until it is killed, compacting the head now and then, and in the
// "small" mode truncating the tail too (then appending with a new term).
// Before a StoreLogs it prints "store A B T" (entries A..B of term T),
// after it "log B"; "stable N" once SetUint64(stableKey, N) has returned;
// "first N" once DeleteRange up to N-1 has; "truncating N" before a
// DeleteRange of the entries after N, "trunc N" after it.
func crashChild(dir string) int {
	small := os.Getenv(crashModeEnv) == "small"
	if small {
		logSegmentSize = smallSegmentSize
	}
	term, err := strconv.ParseUint(os.Getenv(crashTermEnv), 10, 64)
	if err != nil {
		fmt.Printf("err %s: %v\n", crashTermEnv, err)
		return 1
	}
	s, err := Open(dir, nil)
	if err != nil {
		fmt.Printf("err open: %v\n", err)
		return 1
	}
	say := func(format string, args ...any) {
		// One write(2) per line, no buffering: what the parent reads was
		// acknowledged before the kill.
		os.Stdout.WriteString(fmt.Sprintf(format, args...) + "\n")
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
		if err := s.Log.StoreLogs(makeTermLogs(last+1, n, term)); err != nil {
			say("err StoreLogs: %v", err)
			return 1
		}
		last += uint64(n)
		say("log %d", last)
		if err := s.Stable.SetUint64(stableKey, last); err != nil {
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
		if small && last-first > 600 && rand.IntN(4) == 0 {
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

// acked is what a child reported before it died, and what the store may
// hold: terms[i] is the term entry i has if the store holds it.
type acked struct {
	log, stable, first uint64
	// log is the LastIndex the store must reach at least.
	terms map[uint64]uint64
	// maxTerm is the highest term the child used.
	maxTerm uint64
	// stableMay are the values stableKey may have: the acknowledged one
	// and those the child may have been setting since.
	stableMay []uint64
	// lines are the child's last lines, for a failure's message.
	lines []string
}

// runAndKill runs a child on dir, starting at term, kills it with SIGKILL
// after it has reported kill entries appended, and updates a with what it
// acknowledged.
func runAndKill(t *testing.T, dir, mode string, term uint64, kill int, a *acked) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), crashChildEnv+"="+dir, crashModeEnv+"="+mode, crashTermEnv+"="+strconv.FormatUint(term, 10))
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
	logs := 0
	sc := bufio.NewScanner(out)
	for sc.Scan() {
		a.lines = append(a.lines, sc.Text())
		if len(a.lines) > 40 {
			a.lines = a.lines[1:]
		}
		f := strings.Fields(sc.Text())
		if len(f) == 0 {
			continue
		}
		if f[0] == "err" {
			t.Fatalf("child: %s", sc.Text())
		}
		var v []uint64
		for _, x := range f[1:] {
			n, err := strconv.ParseUint(x, 10, 64)
			if err != nil {
				t.Fatalf("child: %q: %v", sc.Text(), err)
			}
			v = append(v, n)
		}
		want := map[string]int{"ready": 1, "store": 3, "log": 1, "stable": 1, "first": 1, "truncating": 1, "trunc": 1}
		if n, ok := want[f[0]]; !ok || len(v) != n {
			t.Fatalf("child: unexpected %q", sc.Text())
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
			logs++
		case "stable":
			a.stable = v[0]
			a.stableMay = []uint64{v[0]}
		case "first":
			a.first = v[0]
		case "truncating":
			// The entries after v[0] may be there or not.
			a.log = min(a.log, v[0])
		case "trunc":
			for i := range a.terms {
				if i > v[0] {
					delete(a.terms, i)
				}
			}
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

// checkStore reopens dir and checks that it holds every acknowledged entry,
// with its term and data, that every other entry it holds is one the child
// stored and did not delete, and the acknowledged stable value. minFirst is
// the FirstIndex found after the previous round. It returns FirstIndex, and
// forgets in a the entries the store does not hold.
func checkStore(t *testing.T, dir string, a *acked, minFirst uint64) uint64 {
	t.Helper()
	s, err := Open(dir, nil)
	if err != nil {
		t.Fatalf("reopen after kill: %v", err)
	}
	defer func() {
		if t.Failed() {
			t.Logf("the child's last lines:\n%s", strings.Join(a.lines, "\n"))
		}
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
		if l.Index != i || l.Term != term || l.Type != raft.LogCommand || !bytes.Equal(l.Data, termPayload(i, term)) {
			t.Fatalf("entry %d read back as index %d term %d type %v data %x; want term %d (acknowledged log %d)", i, l.Index, l.Term, l.Type, l.Data, term, a.log)
		}
	}
	v, err := s.Stable.GetUint64(stableKey)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(a.stableMay, v) {
		t.Fatalf("stable %s = %d after kill; acknowledged %d, then maybe %v", stableKey, v, a.stable, a.stableMay[1:])
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

// crashRounds runs rounds of runAndKill and checkStore on one directory.
func crashRounds(t *testing.T, mode string, rounds int) {
	if testing.Short() {
		t.Skip("spawns processes")
	}
	dir := t.TempDir()
	first := uint64(1)
	a := &acked{terms: map[uint64]uint64{}}
	for round := range rounds {
		before := a.log
		runAndKill(t, dir, mode, a.maxTerm+1, 20+rand.IntN(200), a)
		if a.log == 0 || (mode == "" && a.log <= before) {
			t.Fatalf("round %d: the child acknowledged nothing", round)
		}
		first = checkStore(t, dir, a, first)
	}
}

// TestCrashKill9 appends to Open's stores from a child process, kills it
// with SIGKILL mid-stream, reopens them and checks that everything the child
// was told is durable is there; then it appends again on the same
// directory, for several rounds. bench/logstore has the same test for
// raft-wal and raft-boltdb.
func TestCrashKill9(t *testing.T) { crashRounds(t, "", 8) }

// TestCrashKill9SmallSegments is TestCrashKill9 with 32 KiB segments (a
// rotation every one to three appends) and tail truncations followed by
// appends of a new term: no deleted entry may come back.
func TestCrashKill9SmallSegments(t *testing.T) { crashRounds(t, "small", 8) }
