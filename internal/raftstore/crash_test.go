package raftstore

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
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

// payloadSize is the size of a log entry's data, about a grant command.
const payloadSize = 64

// makeLogs returns n entries from index first, as raft's leader builds them.
func makeLogs(first uint64, n int) []*raft.Log {
	logs := make([]*raft.Log, n)
	now := time.Now()
	for i := range logs {
		idx := first + uint64(i)
		logs[i] = &raft.Log{Index: idx, Term: 1, Type: raft.LogCommand, Data: payload(idx), AppendedAt: now}
	}
	return logs
}

// payload is the data of entry idx: payloadSize bytes that depend on idx, so
// a reader can check it.
func payload(idx uint64) []byte {
	p := make([]byte, payloadSize)
	for i := range p {
		p[i] = byte(idx>>(8*(i%8))) ^ byte(i)
	}
	return p
}

var stableKey = []byte("CurrentTerm")

// crashChild opens Open's stores in dir and appends batches of 1..300
// entries until it is killed, compacting the head now and then. It prints
// "log N" once StoreLogs up to index N has returned, "stable N" once
// SetUint64(stableKey, N) has, "first N" once DeleteRange up to N-1 has.
func crashChild(dir string) int {
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
		if err := s.Log.StoreLogs(makeLogs(last+1, n)); err != nil {
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
	}
}

// acked is what a child reported before it died.
type acked struct{ log, stable, first uint64 }

// runAndKill runs a child on dir, kills it with SIGKILL after it has
// reported kill entries appended, and returns what it acknowledged.
func runAndKill(t *testing.T, dir string, kill int) acked {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), crashChildEnv+"="+dir)
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
	var a acked
	logs := 0
	sc := bufio.NewScanner(out)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) == 0 {
			continue
		}
		if f[0] == "err" {
			t.Fatalf("child: %s", sc.Text())
		}
		if len(f) != 2 {
			t.Fatalf("child: unexpected %q", sc.Text())
		}
		v, err := strconv.ParseUint(f[1], 10, 64)
		if err != nil {
			t.Fatalf("child: %q: %v", sc.Text(), err)
		}
		switch f[0] {
		case "ready":
		case "log":
			a.log = v
			logs++
		case "stable":
			a.stable = v
		case "first":
			a.first = v
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
	return a
}

// checkStore reopens dir and checks that it holds every acknowledged entry,
// with its data, and the acknowledged stable value. minFirst is the
// FirstIndex found after the previous round. It returns FirstIndex.
func checkStore(t *testing.T, dir string, a acked, minFirst uint64) uint64 {
	t.Helper()
	s, err := Open(dir, nil)
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
		if l.Index != i || l.Term != 1 || l.Type != raft.LogCommand || !bytes.Equal(l.Data, payload(i)) {
			t.Fatalf("entry %d read back as index %d term %d type %v data %x", i, l.Index, l.Term, l.Type, l.Data)
		}
	}
	v, err := s.Stable.GetUint64(stableKey)
	if err != nil {
		t.Fatal(err)
	}
	if v < a.stable || v > last {
		t.Fatalf("stable %s = %d after kill; acknowledged %d, LastIndex %d", stableKey, v, a.stable, last)
	}
	t.Logf("acknowledged log %d stable %d first %d; found FirstIndex %d LastIndex %d stable %d",
		a.log, a.stable, a.first, first, last, v)
	return first
}

// TestCrashKill9 appends to Open's stores from a child process, kills it
// with SIGKILL mid-stream, reopens them and checks that everything the child
// was told is durable is there; then it appends again on the same
// directory, for several rounds. bench/logstore has the same test for
// raft-wal, the store Open does not use.
func TestCrashKill9(t *testing.T) {
	if testing.Short() {
		t.Skip("spawns processes")
	}
	dir := t.TempDir()
	first := uint64(1)
	for round := range 8 {
		a := runAndKill(t, dir, 20+rand.IntN(200))
		if a.log == 0 {
			t.Fatalf("round %d: the child acknowledged nothing", round)
		}
		first = checkStore(t, dir, a, first)
	}
}
