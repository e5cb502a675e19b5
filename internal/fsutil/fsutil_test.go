package fsutil

import (
	"os"
	"path/filepath"
	"testing"
)

func TestSyncDir(t *testing.T) {
	dir := t.TempDir()
	if err := SyncDir(dir); err != nil {
		t.Fatal(err)
	}
	if err := SyncDir(filepath.Join(dir, "missing")); !os.IsNotExist(err) {
		t.Fatalf("SyncDir of a missing directory: %v, want a not-exist error", err)
	}
}

// WriteFileSync creates the file with mode 0600, replaces what a longer
// earlier write left, and fails in a missing directory.
func TestWriteFileSync(t *testing.T) {
	path := filepath.Join(t.TempDir(), "f.tmp")
	if err := WriteFileSync(path, []byte("a longer first content")); err != nil {
		t.Fatal(err)
	}
	if err := WriteFileSync(path, []byte("second")); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(path)
	if err != nil || string(b) != "second" {
		t.Fatalf("content %q, %v; want %q", b, err, "second")
	}
	if fi, err := os.Stat(path); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("mode %v, %v; want 0600", fi.Mode().Perm(), err)
	}
	if err := WriteFileSync(filepath.Join(filepath.Dir(path), "missing", "f"), nil); !os.IsNotExist(err) {
		t.Fatalf("in a missing directory: %v, want a not-exist error", err)
	}
}

// TestReplaceFile: the file holds the new data, whole, and no temporary
// file is left.
func TestReplaceFile(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "f")
	for _, data := range []string{"one", "two, longer"} {
		if err := ReplaceFile(path, []byte(data)); err != nil {
			t.Fatal(err)
		}
		if b, err := os.ReadFile(path); err != nil || string(b) != data {
			t.Fatalf("after ReplaceFile(%q): %q, %v", data, b, err)
		}
	}
	if _, err := os.Stat(path + ".tmp"); !os.IsNotExist(err) {
		t.Fatalf("temporary file left: %v", err)
	}
}
