package server_test

import (
	"errors"
	"fmt"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ticketing-dev/ticketing/internal/wire"
	"github.com/ticketing-dev/ticketing/server"
)

func newServer(t *testing.T, cfg server.Config) (*server.Server, error) {
	t.Helper()
	s, err := server.New(cfg)
	if err == nil {
		t.Cleanup(func() { s.Close() })
	}
	return s, err
}

// TestTokenStoreRestartContinuesAboveCeiling: after a restart (clean or not:
// the file is all that survives) tokens start above the durable ceiling.
func TestTokenStoreRestartContinuesAboveCeiling(t *testing.T) {
	dir := t.TempDir()
	s1, addr := startServer(t, server.Config{DataDir: dir, TokenBlock: 100})
	c := session(t, addr)
	var last uint64
	for i := uint32(0); i < 5; i++ {
		last = c.acquireOK(i, owner(int(i)), 0, 30, "k"+string(rune('a'+i)))
	}
	ceil := s1.Stats().TokenCeiling
	if ceil < last || ceil > last+100 {
		t.Fatalf("ceiling %d, last %d", ceil, last)
	}
	s1.Close()

	s2, addr2 := startServer(t, server.Config{DataDir: dir, TokenBlock: 100})
	c2 := session(t, addr2)
	tok := c2.acquireOK(1, owner(1), 0, 30, "ka")
	if tok <= ceil {
		t.Fatalf("token %d after restart, ceiling was %d", tok, ceil)
	}
	if s2.Stats().HeldLocks != 1 {
		t.Fatal("locks are not persisted: only the new one is held")
	}
}

// TestTokenStoreBlocks: tokens are reserved in blocks; many grants never
// pass the durable ceiling, and the file always covers the last token.
func TestTokenStoreBlocks(t *testing.T) {
	dir := t.TempDir()
	s, addr := startServer(t, server.Config{DataDir: dir, TokenBlock: 4})
	c := session(t, addr)
	for i := uint32(0); i < 50; i++ {
		tok := c.acquireOK(1, owner(int(i)), 0, 30, "k")
		c.send(rel(2, tok, "k"))
		c.expect('R', 2)
		st := s.Stats()
		if tok > st.TokenCeiling {
			t.Fatalf("token %d above ceiling %d", tok, st.TokenCeiling)
		}
		b, err := os.ReadFile(filepath.Join(dir, "tokens.ceiling"))
		if err != nil {
			t.Fatal(err)
		}
		if !strings.HasPrefix(string(b), "ticketing-token-ceiling v1 ") {
			t.Fatalf("file %q", b)
		}
	}
}

func TestTokenStoreCorrupt(t *testing.T) {
	// A valid file, to corrupt in several ways.
	dir := t.TempDir()
	s, err := newServer(t, server.Config{DataDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	s.Close()
	valid, err := os.ReadFile(filepath.Join(dir, "tokens.ceiling"))
	if err != nil {
		t.Fatal(err)
	}
	flip := append([]byte(nil), valid...)
	flip[len("ticketing-token-ceiling v1 ")] ^= 1 // a digit of the ceiling
	tests := map[string][]byte{
		"empty":        {},
		"garbage":      []byte("\x00\x01garbage\xff"),
		"truncated":    valid[:len(valid)-3],
		"no newline":   valid[:len(valid)-1],
		"bad checksum": flip,
		"other format": []byte("ticketing-token-ceiling v9 10 00000000\n"),
	}
	for name, content := range tests {
		t.Run(name, func(t *testing.T) {
			d := t.TempDir()
			path := filepath.Join(d, "tokens.ceiling")
			if err := os.WriteFile(path, content, 0o600); err != nil {
				t.Fatal(err)
			}
			_, err := newServer(t, server.Config{DataDir: d})
			if err == nil || !strings.Contains(err.Error(), path) {
				t.Fatalf("New: %v, want an error naming %s", err, path)
			}
			// The file is left alone for the operator.
			if b, _ := os.ReadFile(path); string(b) != string(content) {
				t.Fatal("corrupt file was overwritten")
			}
		})
	}
}

func TestTokenStoreUnwritable(t *testing.T) {
	file := filepath.Join(t.TempDir(), "a-file")
	if err := os.WriteFile(file, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	for name, dir := range map[string]string{
		"data dir is a file":  file,
		"data dir under file": filepath.Join(file, "sub"),
	} {
		t.Run(name, func(t *testing.T) {
			_, err := newServer(t, server.Config{DataDir: dir})
			if err == nil || !strings.Contains(err.Error(), dir) {
				t.Fatalf("New: %v, want an error naming %s", err, dir)
			}
		})
	}
	t.Run("ceiling path is a directory", func(t *testing.T) {
		d := t.TempDir()
		if err := os.Mkdir(filepath.Join(d, "tokens.ceiling"), 0o700); err != nil {
			t.Fatal(err)
		}
		if _, err := newServer(t, server.Config{DataDir: d}); err == nil {
			t.Fatal("New succeeded")
		}
	})
}

// usedDir runs a server on a fresh dir, grants n tokens, and closes it
// (what survives a kill -9 is the same: the files). It returns the ceiling.
func usedDir(t *testing.T, dir string, n int) uint64 {
	t.Helper()
	s, addr := startServer(t, server.Config{DataDir: dir, TokenBlock: 16})
	c := session(t, addr)
	for i := range n {
		tok := c.acquireOK(1, owner(i), 0, 30, "k")
		c.send(rel(2, tok, "k"))
		c.expect(wire.TypeReleased, 2)
	}
	ceil := s.Stats().TokenCeiling
	s.Close()
	return ceil
}

func firstToken(t *testing.T, cfg server.Config) uint64 {
	t.Helper()
	_, addr := startServer(t, cfg)
	return session(t, addr).acquireOK(1, owner(1), 0, 30, "first")
}

// TestTokenStoreMissingFileInUsedDir: a data dir that has served, whose
// ceiling file is gone (LOCK kept, as after kill -9 and a careless rm),
// continues above the copy of the ceiling that LOCK holds; without that copy
// too it is refused with an error naming the file and the way out, and
// InitialToken makes tokens continue above it.
func TestTokenStoreMissingFileInUsedDir(t *testing.T) {
	d := t.TempDir()
	ceil := usedDir(t, d, 50)
	if err := os.Remove(filepath.Join(d, "tokens.ceiling")); err != nil {
		t.Fatal(err)
	}
	if ents, _ := os.ReadDir(d); len(ents) != 1 || ents[0].Name() != "LOCK" {
		t.Fatalf("data dir holds %v, want only LOCK", ents)
	}
	if tok := firstToken(t, server.Config{DataDir: d}); tok <= ceil {
		t.Fatalf("first token %d after the ceiling file was deleted, ceiling was %d", tok, ceil)
	}

	d = t.TempDir()
	ceil = usedDir(t, d, 50)
	if err := os.Remove(filepath.Join(d, "tokens.ceiling")); err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(d, "LOCK"), nil) // LOCK kept, its copy lost
	_, err := newServer(t, server.Config{DataDir: d})
	if !errors.Is(err, server.ErrCeilingMissing) || !strings.Contains(err.Error(), filepath.Join(d, "tokens.ceiling")) || !strings.Contains(err.Error(), "--initial-token") {
		t.Fatalf("New: %v, want ErrCeilingMissing naming the file and --initial-token", err)
	}
	if tok := firstToken(t, server.Config{DataDir: d, InitialToken: ceil}); tok <= ceil {
		t.Fatalf("first token %d with InitialToken %d", tok, ceil)
	}
}

// TestTokenStoreStaleInitialToken: an InitialToken left in the
// configuration after it served is not trusted over the ceiling's copy in
// LOCK when the ceiling file is lost again: tokens continue above every
// token issued, not above the stale InitialToken.
func TestTokenStoreStaleInitialToken(t *testing.T) {
	d := t.TempDir()
	cfg := server.Config{DataDir: d, InitialToken: 100, TokenBlock: 8}
	s, addr := startServer(t, cfg)
	c := session(t, addr)
	var last uint64
	for i := range 40 {
		last = c.acquireOK(uint32(i+1), owner(i), 0, 30, fmt.Sprintf("k%d", i))
	}
	s.Close()
	if err := os.Remove(filepath.Join(d, "tokens.ceiling")); err != nil {
		t.Fatal(err)
	}
	os.Remove(filepath.Join(d, "tokens.ceiling.tmp"))
	if tok := firstToken(t, cfg); tok <= last {
		t.Fatalf("first token %d, but %d was issued before (InitialToken %d left in place)", tok, last, cfg.InitialToken)
	}
}

// TestTokenStoreLockOnly: a first start that created LOCK and died before
// its first ceiling was durable leaves a directory that is refused too (it
// cannot be told from one whose ceiling was deleted).
func TestTokenStoreLockOnly(t *testing.T) {
	d := t.TempDir()
	if err := os.WriteFile(filepath.Join(d, "LOCK"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := newServer(t, server.Config{DataDir: d}); !errors.Is(err, server.ErrCeilingMissing) {
		t.Fatalf("New: %v, want ErrCeilingMissing", err)
	}
}

// TestTokenStoreFailedFirstStart: a first start that fails before any
// ceiling is durable (here the first reservation fails) leaves the new
// data dir empty, so the next start is not refused as a used one.
func TestTokenStoreFailedFirstStart(t *testing.T) {
	d := t.TempDir()
	restore := server.SetCeilingWriter(func(string, uint64) error { return errors.New("injected: disk full") })
	_, err := newServer(t, server.Config{DataDir: d})
	restore()
	if err == nil || !strings.Contains(err.Error(), "disk full") {
		t.Fatalf("New: %v, want the write error", err)
	}
	if ents, _ := os.ReadDir(d); len(ents) != 0 {
		t.Fatalf("data dir holds %v after a failed first start", ents)
	}
	if tok := firstToken(t, server.Config{DataDir: d}); tok != 1 {
		t.Fatalf("first token %d", tok)
	}
	// A data dir that did not exist does not exist after the failed start.
	nd := filepath.Join(t.TempDir(), "new")
	restore = server.SetCeilingWriter(func(string, uint64) error { return errors.New("injected: disk full") })
	_, err = newServer(t, server.Config{DataDir: nd})
	restore()
	if _, serr := os.Stat(nd); err == nil || !errors.Is(serr, fs.ErrNotExist) {
		t.Fatalf("New: %v; data dir after a failed first start: %v", err, serr)
	}
}

// TestTokenStoreTempFile: a ceiling that survives only as the temporary
// file (a crash between fsync and rename, then the old file lost) is
// recovered; of two valid ceilings the higher wins; an invalid temporary
// file alone is refused.
func TestTokenStoreTempFile(t *testing.T) {
	t.Run("only tmp", func(t *testing.T) {
		d := t.TempDir()
		ceil := usedDir(t, d, 50)
		if err := os.Rename(filepath.Join(d, "tokens.ceiling"), filepath.Join(d, "tokens.ceiling.tmp")); err != nil {
			t.Fatal(err)
		}
		if tok := firstToken(t, server.Config{DataDir: d}); tok <= ceil {
			t.Fatalf("first token %d, ceiling was %d", tok, ceil)
		}
	})
	t.Run("tmp higher", func(t *testing.T) {
		d := t.TempDir()
		usedDir(t, d, 5)
		writeFile(t, filepath.Join(d, "tokens.ceiling.tmp"), server.FormatCeiling(1000))
		if tok := firstToken(t, server.Config{DataDir: d}); tok <= 1000 {
			t.Fatalf("first token %d, tmp ceiling 1000", tok)
		}
	})
	t.Run("tmp lower or partial", func(t *testing.T) {
		for name, content := range map[string][]byte{"lower": server.FormatCeiling(3), "partial": server.FormatCeiling(99999)[:20]} {
			d := t.TempDir()
			ceil := usedDir(t, d, 20)
			writeFile(t, filepath.Join(d, "tokens.ceiling.tmp"), content)
			if tok := firstToken(t, server.Config{DataDir: d}); tok <= ceil {
				t.Fatalf("%s: first token %d, ceiling %d", name, tok, ceil)
			}
		}
	})
	t.Run("only invalid tmp", func(t *testing.T) {
		d := t.TempDir()
		usedDir(t, d, 5)
		os.Remove(filepath.Join(d, "tokens.ceiling"))
		writeFile(t, filepath.Join(d, "LOCK"), []byte("ticketing-token-ceiling v1 9")) // a torn copy
		writeFile(t, filepath.Join(d, "tokens.ceiling.tmp"), []byte("ticketing-token-ceiling v1 12"))
		if _, err := newServer(t, server.Config{DataDir: d}); !errors.Is(err, server.ErrCeilingMissing) {
			t.Fatalf("New: %v, want ErrCeilingMissing", err)
		}
	})
}

// TestTokenStoreInitialToken: tokens continue strictly above InitialToken
// in a fresh dir, and above the stored ceiling when that is higher (never
// backwards).
func TestTokenStoreInitialToken(t *testing.T) {
	if tok := firstToken(t, server.Config{DataDir: t.TempDir(), InitialToken: 5000}); tok != 5001 {
		t.Fatalf("fresh dir, InitialToken 5000: first token %d", tok)
	}
	d := t.TempDir()
	ceil := usedDir(t, d, 40)
	if tok := firstToken(t, server.Config{DataDir: d, InitialToken: 3}); tok <= ceil {
		t.Fatalf("InitialToken 3 below ceiling %d: first token %d", ceil, tok)
	}
}

func writeFile(t *testing.T, path string, b []byte) {
	t.Helper()
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
}

// TestTokenSpaceLimits: tokens never pass MaxToken (2^63-1) and nothing
// wraps: a ceiling at or near the end refuses to start, or serves the last
// tokens and then answers B at once (not a spin, not a hang), with the
// store reporting ErrTokensExhausted.
func TestTokenSpaceLimits(t *testing.T) {
	for name, ceil := range map[string]uint64{
		"one block short": server.MaxToken - 3,
		"at max":          server.MaxToken,
		"above max":       server.MaxToken + 1,
		"near 2^64":       math.MaxUint64 - 2,
		"2^64-1":          math.MaxUint64,
	} {
		t.Run(name, func(t *testing.T) {
			d := t.TempDir()
			writeFile(t, filepath.Join(d, "tokens.ceiling"), server.FormatCeiling(ceil))
			_, err := newServer(t, server.Config{DataDir: d, TokenBlock: 4})
			if !errors.Is(err, server.ErrTokensExhausted) || !strings.Contains(err.Error(), d) {
				t.Fatalf("New: %v, want ErrTokensExhausted naming %s", err, d)
			}
		})
	}
	t.Run("last tokens", func(t *testing.T) {
		d := t.TempDir()
		writeFile(t, filepath.Join(d, "tokens.ceiling"), server.FormatCeiling(server.MaxToken-6))
		s, addr := startServer(t, server.Config{DataDir: d, TokenBlock: 4})
		c := session(t, addr)
		for i := range 6 {
			if tok := c.acquireOK(uint32(10+i), owner(1), 0, 30, string(rune('a'+i))); tok != server.MaxToken-5+uint64(i) {
				t.Fatalf("token %d, want %d", tok, server.MaxToken-5+uint64(i))
			}
		}
		c.send(acq(20, owner(1), 0, 30, "z"))
		c.expect(wire.TypeBusy, 20)
		c.send(ping(21)) // the session stays open
		c.expect(wire.TypePong, 21)
		st := s.Stats()
		if st.LastToken != server.MaxToken || st.TokenCeiling != server.MaxToken || st.TokenUnavailable != 1 {
			t.Fatalf("stats %+v", st)
		}
		if err := s.TokenStoreErr(); !errors.Is(err, server.ErrTokensExhausted) {
			t.Fatalf("TokenStoreErr %v", err)
		}
		// A waiter whose turn comes gets B too.
		w := session(t, addr)
		w.send(acq(2, owner(2), 30, 30, "a"))
		eventually(t, "waiter", func() bool { return s.Stats().Waiters == 1 })
		c.send(rel(22, server.MaxToken-5, "a"))
		c.expect(wire.TypeReleased, 22)
		w.expect(wire.TypeBusy, 2)
		s.Close() // prompt: nothing spins or waits
	})
}

func TestTokenStoreFreshDirCreated(t *testing.T) {
	d := filepath.Join(t.TempDir(), "new", "dir")
	s, err := newServer(t, server.Config{DataDir: d})
	if err != nil {
		t.Fatal(err)
	}
	if st := s.Stats(); st.LastToken != 0 || st.TokenCeiling == 0 {
		t.Fatalf("stats %+v", st)
	}
}

func TestDataDirExclusive(t *testing.T) {
	d := t.TempDir()
	if _, err := newServer(t, server.Config{DataDir: d}); err != nil {
		t.Fatal(err)
	}
	if _, err := newServer(t, server.Config{DataDir: d}); err == nil {
		t.Fatal("two servers share a data dir")
	}
}

func TestConfigValidation(t *testing.T) {
	for name, cfg := range map[string]server.Config{
		"no data dir":             {},
		"negative limit":          {DataDir: t.TempDir(), MaxLocks: -1},
		"long node name":          {DataDir: t.TempDir(), NodeName: strings.Repeat("n", 256)},
		"token block 2^64-1":      {DataDir: t.TempDir(), TokenBlock: math.MaxUint64},
		"token block 2^32+1":      {DataDir: t.TempDir(), TokenBlock: 1<<32 + 1},
		"initial token too large": {DataDir: t.TempDir(), InitialToken: server.MaxToken - 10, TokenBlock: 11},
		"socket buffer 4 KiB":     {DataDir: t.TempDir(), SocketBuffer: 4096},
	} {
		t.Run(name, func(t *testing.T) {
			if _, err := newServer(t, cfg); err == nil {
				t.Fatal("New accepted it")
			}
		})
	}
	// The largest block is accepted.
	if _, err := newServer(t, server.Config{DataDir: t.TempDir(), TokenBlock: server.MaxTokenBlock}); err != nil {
		t.Fatalf("TokenBlock 2^32: %v", err)
	}
	// The smallest socket buffer, and the operating system's own.
	for _, sb := range []int{server.MinSocketBuffer, -1} {
		if _, err := newServer(t, server.Config{DataDir: t.TempDir(), SocketBuffer: sb}); err != nil {
			t.Fatalf("SocketBuffer %d: %v", sb, err)
		}
	}
}
