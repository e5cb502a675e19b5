package main

import (
	"errors"
	"fmt"
	"io/fs"
	mrand "math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/ticketing-dev/ticketing/internal/wire"
)

// TestKill9TokensNeverGoBack is the crash test of the token store: the real
// ticketingd binary is SIGKILLed at a random moment under load, 25 times, on
// one data directory. Every token granted after a restart must be above
// every token granted before it, and no token may ever be seen twice.
//
// CI runs it by name: go test ./cmd/ticketingd -run TestKill9 -count=1
func TestKill9TokensNeverGoBack(t *testing.T) {
	const (
		rounds      = 25
		clients     = 6
		minPerRound = 50 // grants seen before the kill timer is armed
	)
	bin := buildBinary(t)
	dataDir := filepath.Join(t.TempDir(), "data")
	seen := make(map[uint64]int) // token -> round
	var maxBefore uint64         // highest token of all earlier rounds
	total := 0

	for round := range rounds {
		sp := startBinary(t, bin, "serve", "--listen", "127.0.0.1:0", "--data-dir", dataDir,
			"--log-format", "json", "--client-token", "kill9-token",
			// A small block makes the kill land around ceiling reservations.
			"--token-block", "64")
		addr := sp.addr(t)

		var (
			mu      sync.Mutex
			tokens  []uint64
			granted atomic.Int64
			armed   = make(chan struct{})
			armOnce sync.Once
			wg      sync.WaitGroup
		)
		for c := range clients {
			wg.Add(1)
			go func() {
				defer wg.Done()
				got, err := loadClient(addr, round, c, &granted, func() {
					if granted.Load() >= minPerRound {
						armOnce.Do(func() { close(armed) })
					}
				})
				mu.Lock()
				tokens = append(tokens, got...)
				mu.Unlock()
				if err == nil {
					t.Errorf("round %d client %d: load ended without a connection error", round, c)
				}
			}()
		}
		select {
		case <-armed:
		case <-sp.done:
			t.Fatalf("round %d: server exited before load: %v\n%s", round, sp.err, sp.stderr.String())
		}
		time.Sleep(time.Duration(mrand.IntN(50_000)) * time.Microsecond) // a random moment under load
		if err := sp.cmd.Process.Signal(syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		<-sp.done
		wg.Wait()

		if len(tokens) == 0 {
			t.Fatalf("round %d: no tokens granted", round)
		}
		slices.Sort(tokens)
		if tokens[0] <= maxBefore {
			t.Fatalf("round %d: token %d granted after restart is not above %d, the highest before it", round, tokens[0], maxBefore)
		}
		for _, tok := range tokens {
			if r, dup := seen[tok]; dup {
				t.Fatalf("round %d: token %d seen twice (first in round %d)", round, tok, r)
			}
			seen[tok] = round
		}
		t.Logf("round %d: %d tokens in [%d, %d]", round, len(tokens), tokens[0], tokens[len(tokens)-1])
		maxBefore = tokens[len(tokens)-1]
		total += len(tokens)
	}
	t.Logf("%d rounds, %d tokens, all increasing across SIGKILL restarts", rounds, total)
}

// loadClient runs one raw-protocol client until its connection fails: HELLO,
// then ACQUIRE random keys (and sometimes a shared key, with waiting) and
// RELEASE most of what it gets. It returns every granted token.
func loadClient(addr string, round, id int, granted *atomic.Int64, onGrant func()) ([]uint64, error) {
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	cl, r, err := dialRaw(conn, "kill9-token")
	if err != nil {
		return nil, err
	}
	if r.Type != wire.TypeHelloOK {
		return nil, fmt.Errorf("HELLO answered %q", r.Type)
	}
	var tokens []uint64
	rng := mrand.New(mrand.NewPCG(uint64(round), uint64(id)))
	for i := 0; ; i++ {
		key := fmt.Sprintf("k-%d-%d-%d", round, id, rng.IntN(1000))
		var wait uint8
		if i%10 == 0 {
			key, wait = "shared", 1
		}
		r, err := cl.acquire(key, wait, uint8(1+rng.IntN(30)))
		if err != nil {
			return tokens, err
		}
		switch r.Type {
		case wire.TypeGranted:
			tokens = append(tokens, r.Token)
			granted.Add(1)
			onGrant()
			// Keep a quarter of the private keys held until their lease
			// ends; always release the shared one, which others wait for.
			if wait > 0 || rng.IntN(4) != 0 {
				if r, err := cl.release(key, r.Token); err != nil {
					return tokens, err
				} else if r.Type != wire.TypeReleased {
					return tokens, fmt.Errorf("RELEASE answered %q", r.Type)
				}
			}
		case wire.TypeTimedOut, wire.TypeBusy:
		default:
			return tokens, fmt.Errorf("ACQUIRE answered %q", r.Type)
		}
	}
}

// TestServeRefusesBadDataDir: a corrupt token store, or a data dir path that
// is a regular file, makes ticketingd serve exit non-zero with an error
// naming the path, instead of starting tokens again at 1.
func TestServeRefusesBadDataDir(t *testing.T) {
	bin := buildBinary(t)

	// Make a real token store first.
	dataDir := filepath.Join(t.TempDir(), "data")
	sp := startBinary(t, bin, "serve", "--listen", "127.0.0.1:0", "--data-dir", dataDir, "--log-format", "json")
	addr := sp.addr(t)
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	cl, _, err := dialRaw(conn, "")
	if err != nil {
		t.Fatal(err)
	}
	if r, err := cl.acquire("k", 0, 5); err != nil || r.Type != wire.TypeGranted {
		t.Fatalf("acquire: %v %v", r.Type, err)
	}
	conn.Close()
	_ = sp.cmd.Process.Signal(syscall.SIGTERM)
	if code := sp.exitCode(); code != 0 {
		t.Fatalf("SIGTERM: exit %d\n%s", code, sp.stderr.String())
	}
	ents, err := os.ReadDir(dataDir)
	if err != nil || len(ents) == 0 {
		t.Fatalf("data dir after a run: %v %v", ents, err)
	}

	fileAsDir := filepath.Join(t.TempDir(), "plain-file")
	if err := os.WriteFile(fileAsDir, []byte("not a dir"), 0o600); err != nil {
		t.Fatal(err)
	}

	tests := []struct {
		name    string
		prepare func(t *testing.T) string // returns the data dir
		want    string                    // in stderr, besides the path
	}{
		{"garbage in token store", func(t *testing.T) string {
			for _, e := range ents {
				if e.Type().IsRegular() && e.Name() != "LOCK" {
					if err := os.WriteFile(filepath.Join(dataDir, e.Name()), []byte("\x00garbage\xff 12 zz\n"), 0o600); err != nil {
						t.Fatal(err)
					}
				}
			}
			return dataDir
		}, "corrupt"},
		{"truncated token store", func(t *testing.T) string {
			for _, e := range ents {
				if e.Type().IsRegular() && e.Name() != "LOCK" {
					if err := os.Truncate(filepath.Join(dataDir, e.Name()), 0); err != nil {
						t.Fatal(err)
					}
				}
			}
			return dataDir
		}, ""},
		{"data dir is a regular file", func(t *testing.T) string { return fileAsDir }, "not a directory"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dir := tc.prepare(t)
			sp := startBinary(t, bin, "serve", "--listen", "127.0.0.1:0", "--data-dir", dir, "--log-format", "json")
			code := sp.exitCode()
			out := sp.stderr.String()
			if code == 0 {
				t.Fatalf("exit 0 with a bad data dir:\n%s", out)
			}
			if strings.Contains(out, `"msg":"listening"`) {
				t.Fatalf("started serving with a bad data dir:\n%s", out)
			}
			if !strings.Contains(out, dir) || !strings.Contains(out, tc.want) {
				t.Errorf("error does not name %s (and %q):\n%s", dir, tc.want, out)
			}
		})
	}
}

// TestKill9CeilingLost: the real binary grants 50 tokens and is SIGKILLed;
// then the ceiling file is lost. With LOCK left, serve continues above the
// ceiling's copy in LOCK; with LOCK emptied too, serve refuses (exit 1,
// naming the file and --initial-token); with --initial-token N it continues
// above N. A ceiling that survives only as tokens.ceiling.tmp is recovered.
func TestKill9CeilingLost(t *testing.T) {
	bin := buildBinary(t)
	dataDir := filepath.Join(t.TempDir(), "data")
	ceiling := filepath.Join(dataDir, "tokens.ceiling")
	// grant50 runs the server, grants 50 tokens, kills it and returns the
	// highest token and the ceiling file's content.
	grant50 := func(args ...string) (uint64, []byte) {
		t.Helper()
		sp := startBinary(t, bin, append([]string{"serve", "--listen", "127.0.0.1:0", "--data-dir", dataDir, "--log-format", "json", "--token-block", "64"}, args...)...)
		conn, err := net.Dial("tcp", sp.addr(t))
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		cl, _, err := dialRaw(conn, "")
		if err != nil {
			t.Fatal(err)
		}
		var last uint64
		for i := range 50 {
			r, err := cl.acquire(fmt.Sprintf("k%d", i), 0, 30)
			if err != nil || r.Type != wire.TypeGranted || r.Token <= last {
				t.Fatalf("acquire %d: %q token %d (last %d) %v", i, r.Type, r.Token, last, err)
			}
			last = r.Token
		}
		_ = sp.cmd.Process.Signal(syscall.SIGKILL)
		<-sp.done
		b, err := os.ReadFile(ceiling)
		if err != nil {
			t.Fatal(err)
		}
		return last, b
	}

	// removeCeiling deletes the ceiling file and, as a kill may land while
	// the next block is being reserved, leaving a complete
	// tokens.ceiling.tmp that a restart rightly recovers (tested below), the
	// temporary file: only LOCK is kept.
	removeCeiling := func() {
		t.Helper()
		if err := os.Remove(ceiling); err != nil {
			t.Fatal(err)
		}
		if err := os.Remove(ceiling + ".tmp"); err != nil && !errors.Is(err, fs.ErrNotExist) {
			t.Fatal(err)
		}
	}

	last0, _ := grant50()
	removeCeiling()
	// LOCK's copy of the ceiling: the restart continues above it.
	last, _ := grant50()
	if first := last - 49; first <= last0 {
		t.Fatalf("after the ceiling file was deleted: first token %d, %d issued before", first, last0)
	}
	removeCeiling()
	if err := os.WriteFile(filepath.Join(dataDir, "LOCK"), nil, 0o600); err != nil { // its copy lost too
		t.Fatal(err)
	}
	sp := startBinary(t, bin, "serve", "--listen", "127.0.0.1:0", "--data-dir", dataDir, "--log-format", "json")
	if _, err := sp.stderr.WaitJSON(0, "listening", sp.done, 30*time.Second); err == nil {
		t.Fatalf("restart without the ceiling is serving:\n%s", sp.stderr.String())
	}
	code, out := sp.exitCode(), sp.stderr.String()
	if code != 1 || strings.Contains(out, `"msg":"listening"`) || !strings.Contains(out, ceiling) || !strings.Contains(out, "--initial-token") {
		t.Fatalf("restart without the ceiling: exit %d, want 1 with an error naming %s and --initial-token:\n%s", code, ceiling, out)
	}
	t.Logf("refused: %s", out)

	// The operator knows (from the databases) that tokens went up to last.
	last2, kept := grant50("--initial-token", strconv.FormatUint(last, 10))
	if first := last2 - 49; first <= last {
		t.Fatalf("with --initial-token %d: first token %d", last, first)
	}

	// Only the temporary file survives.
	if err := os.Remove(ceiling); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(ceiling+".tmp", kept, 0o600); err != nil {
		t.Fatal(err)
	}
	if last3, _ := grant50(); last3-49 <= last2 {
		t.Fatalf("after recovering the temporary file: first token %d, earlier up to %d", last3-49, last2)
	}
}
