package server_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

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

// TestTokenStoreMissingFileInUsedDir: a data dir with other files but no
// ceiling is not silently restarted at 1.
func TestTokenStoreMissingFileInUsedDir(t *testing.T) {
	d := t.TempDir()
	s, err := newServer(t, server.Config{DataDir: d})
	if err != nil {
		t.Fatal(err)
	}
	s.Close()
	os.WriteFile(filepath.Join(d, "something-else"), nil, 0o600)
	os.Remove(filepath.Join(d, "tokens.ceiling"))
	if _, err := newServer(t, server.Config{DataDir: d}); err == nil {
		t.Fatal("New restarted tokens in a used data dir")
	}
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
		"no data dir":    {},
		"negative limit": {DataDir: t.TempDir(), MaxLocks: -1},
		"long node name": {DataDir: t.TempDir(), NodeName: strings.Repeat("n", 256)},
	} {
		t.Run(name, func(t *testing.T) {
			if _, err := newServer(t, cfg); err == nil {
				t.Fatal("New accepted it")
			}
		})
	}
}
