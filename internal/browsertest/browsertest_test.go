package browsertest

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// recTB records how New ended a test: Fatalf or Skipf (both stop the
// goroutine, as testing's do).
type recTB struct {
	testing.TB
	fatal, skip string
}

func (r *recTB) Helper() {}
func (r *recTB) Fatalf(format string, args ...any) {
	r.fatal = fmt.Sprintf(format, args...)
	runtime.Goexit()
}
func (r *recTB) Skipf(format string, args ...any) {
	r.skip = fmt.Sprintf(format, args...)
	runtime.Goexit()
}

func runNew(tb testing.TB) *recTB {
	r := &recTB{TB: tb}
	done := make(chan struct{})
	go func() {
		defer close(done)
		New(r)
	}()
	<-done
	return r
}

// TestNoBrowser: with no browser on PATH, New skips with a message that
// says how to install one, and under CI=true fails instead.
func TestNoBrowser(t *testing.T) {
	t.Setenv("PATH", t.TempDir())
	t.Setenv(BrowserEnv, "")
	if _, err := Find(); !errors.Is(err, ErrNoBrowser) {
		t.Fatalf("Find: %v, want ErrNoBrowser", err)
	}
	t.Setenv("CI", "")
	if r := runNew(t); r.skip == "" || r.fatal != "" || !strings.Contains(r.skip, "apt-get install -y chromium") {
		t.Errorf("without CI: skip %q, fatal %q", r.skip, r.fatal)
	}
	t.Setenv("CI", "true")
	if r := runNew(t); r.fatal == "" || r.skip != "" || !strings.Contains(r.fatal, "CI=true") {
		t.Errorf("under CI=true: skip %q, fatal %q", r.skip, r.fatal)
	}
}

// TestFind: $TICKETING_BROWSER wins; else the first candidate on PATH.
func TestFind(t *testing.T) {
	dir := t.TempDir()
	for _, name := range []string{"google-chrome", "chromium-browser"} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte("#!/bin/sh\n"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	t.Setenv("PATH", dir)
	t.Setenv(BrowserEnv, "")
	if p, err := Find(); err != nil || p != filepath.Join(dir, "chromium-browser") {
		t.Errorf("Find: %q, %v; want chromium-browser (before google-chrome)", p, err)
	}
	t.Setenv(BrowserEnv, filepath.Join(dir, "google-chrome"))
	if p, err := Find(); err != nil || p != filepath.Join(dir, "google-chrome") {
		t.Errorf("Find with $%s: %q, %v", BrowserEnv, p, err)
	}
	t.Setenv(BrowserEnv, filepath.Join(dir, "nope"))
	if _, err := Find(); err == nil {
		t.Error("Find with a missing $TICKETING_BROWSER: no error")
	}
}
