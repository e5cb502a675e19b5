package harness

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"

	"github.com/ticketing-dev/ticketing/internal/proctest"
)

// TicketingdPkg is the import path of the server binary.
const TicketingdPkg = "github.com/ticketing-dev/ticketing/cmd/ticketingd"

// ModuleRoot returns the directory holding the module's go.mod, found by
// walking up from the working directory (a test's working directory is its
// package directory).
func ModuleRoot() (string, error) {
	root, err := proctest.ModuleRoot()
	if err != nil {
		return "", fmt.Errorf("harness: %w", err)
	}
	return root, nil
}

// BuildPackage runs 'go build -o out pkg' in the module root. pkg is an
// import path or a path relative to the module root ("./cmd/ticketingd").
// The output of a failed build is in the error.
func BuildPackage(pkg, out string) error {
	root, err := ModuleRoot()
	if err != nil {
		return err
	}
	cmd := exec.Command("go", "build", "-o", out, pkg)
	cmd.Dir = root
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("harness: go build %s: %v\n%s", pkg, err, b)
	}
	return nil
}

// BuildBinaries builds ticketingd into dir and returns its path.
func BuildBinaries(dir string) (ticketingd string, err error) {
	ticketingd = filepath.Join(dir, "ticketingd")
	return ticketingd, BuildPackage(TicketingdPkg, ticketingd)
}

// The process-wide build cache of Binary. A test binary builds each package
// at most once, into binDir, which RemoveBinaries deletes.
var (
	binMu  sync.Mutex
	binDir string
	bins   = map[string]*built{}
)

type built struct {
	once sync.Once
	path string
	err  error
}

// Binary builds pkg (an import path, or relative to the module root) once
// per test process and returns the executable's path; later calls, from
// any test or goroutine, reuse it. A build failure fails tb (every caller
// sees it). Call RemoveBinaries from TestMain after m.Run to delete the
// build directory.
func Binary(tb testing.TB, pkg string) string {
	tb.Helper()
	binMu.Lock()
	if binDir == "" {
		d, err := os.MkdirTemp("", "ticketing-integration-bin-")
		if err != nil {
			binMu.Unlock()
			tb.Fatalf("harness: %v", err)
		}
		binDir = d
	}
	b := bins[pkg]
	if b == nil {
		b = &built{}
		bins[pkg] = b
	}
	dir := binDir
	binMu.Unlock()
	b.once.Do(func() {
		b.path = filepath.Join(dir, fmt.Sprintf("bin%d-%s", len(pkg), filepath.Base(pkg)))
		b.err = BuildPackage(pkg, b.path)
	})
	if b.err != nil {
		tb.Fatal(b.err)
	}
	return b.path
}

// Ticketingd is Binary(tb, TicketingdPkg).
func Ticketingd(tb testing.TB) string {
	tb.Helper()
	return Binary(tb, TicketingdPkg)
}

// RemoveBinaries deletes what Binary built. Call it once, after m.Run.
func RemoveBinaries() {
	binMu.Lock()
	defer binMu.Unlock()
	if binDir != "" {
		_ = os.RemoveAll(binDir)
		binDir = ""
		bins = map[string]*built{}
	}
}
