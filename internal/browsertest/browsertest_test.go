package browsertest

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"go.uber.org/goleak"

	"github.com/ticketing-dev/ticketing/internal/testdb/faketb"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
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
	newTab := func(tb testing.TB) { New(tb) }
	if r := faketb.Run(t, newTab); !r.WasSkipped || !strings.Contains(r.Msg, "apt-get install -y chromium") {
		t.Errorf("without CI: skipped %v, failed %v: %q", r.WasSkipped, r.WasFailed, r.Msg)
	}
	t.Setenv("CI", "true")
	if r := faketb.Run(t, newTab); !r.WasFailed || !strings.Contains(r.Msg, "CI=true") {
		t.Errorf("under CI=true: skipped %v, failed %v: %q", r.WasSkipped, r.WasFailed, r.Msg)
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
