package servertest

import (
	"fmt"
	"os"
	"strings"
	"testing"
)

// Notice writes line (a newline is added) for the person running the
// tests, from a TestMain after m.Run: typically why some tests skipped and
// how to run them. It goes to stderr and, when go test would swallow it,
// also to the terminal.
//
// go test ./... buffers a test binary's output and, when the package
// passes, prints only its "ok" line unless -v is given, so a skip's reason
// would never be seen on a laptop. Without -v, and when stderr is not
// itself a terminal, Notice also writes the line to the controlling
// terminal (/dev/tty) if there is one; in CI there is none, and the line
// is in the log with -v or on failure. An empty line writes nothing.
func Notice(line string) {
	line = strings.TrimRight(line, "\n")
	if line == "" {
		return
	}
	fmt.Fprintln(os.Stderr, line)
	if testing.Verbose() {
		return
	}
	if fi, err := os.Stderr.Stat(); err == nil && fi.Mode()&os.ModeCharDevice != 0 {
		return
	}
	if tty, err := os.OpenFile("/dev/tty", os.O_WRONLY, 0); err == nil {
		fmt.Fprintln(tty, line)
		tty.Close()
	}
}
