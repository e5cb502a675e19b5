package integration_test

import (
	"fmt"
	"os"
	"testing"

	"go.uber.org/goleak"

	"github.com/ticketing-dev/ticketing/integration/harness"
)

// TestMain removes the binaries built by the harness and, if every test
// passed, checks that no goroutine outlived its test: brokers, pools and
// the harness's subprocess waiters (each ends when its process exits, and
// every process is killed by a Cleanup) must all be gone. If container
// scenarios skipped, it says so in one line, with how to run them (see
// printNotice).
func TestMain(m *testing.M) {
	code := m.Run()
	printNotice(containerSkipNotice())
	harness.RemoveBinaries()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintf(os.Stderr, "goleak: %v\n", err)
			code = 1
		}
	}
	os.Exit(code)
}

// printNotice writes a line for the person running the tests to stderr
// and, when go test would swallow it, also to the terminal (/dev/tty).
// go test ./... buffers a test binary's output and, when the package
// passes, prints only its "ok" line unless -v is given: a line on stderr
// alone would not be seen on a laptop. So without -v, and when stderr is
// not itself a terminal (it is when go test streams, run in the package's
// directory with no package argument), the line also goes to the
// controlling terminal, if there is one; in CI there is none, and the
// line is in the log only with -v or on failure.
func printNotice(line string) {
	if line == "" {
		return
	}
	fmt.Fprint(os.Stderr, line)
	if testing.Verbose() {
		return
	}
	if fi, err := os.Stderr.Stat(); err == nil && fi.Mode()&os.ModeCharDevice != 0 {
		return
	}
	if tty, err := os.OpenFile("/dev/tty", os.O_WRONLY, 0); err == nil {
		fmt.Fprint(tty, line)
		tty.Close()
	}
}
