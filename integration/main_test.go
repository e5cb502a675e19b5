package integration_test

import (
	"fmt"
	"os"
	"testing"

	"go.uber.org/goleak"

	"github.com/ticketing-dev/ticketing/integration/harness"
	"github.com/ticketing-dev/ticketing/server/servertest"
)

// TestMain removes the binaries built by the harness and, if every test
// passed, checks that no goroutine outlived its test: brokers, pools and
// the harness's subprocess waiters (each ends when its process exits, and
// every process is killed by a Cleanup) must all be gone. If container
// scenarios skipped, it says so in one line, with how to run them (see
// servertest.Notice).
func TestMain(m *testing.M) {
	code := m.Run()
	servertest.Notice(containerSkipNotice())
	harness.RemoveBinaries()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintf(os.Stderr, "goleak: %v\n", err)
			code = 1
		}
	}
	os.Exit(code)
}
