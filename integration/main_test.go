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
// every process is killed by a Cleanup) must all be gone.
func TestMain(m *testing.M) {
	code := m.Run()
	harness.RemoveBinaries()
	if code == 0 {
		if err := goleak.Find(
			// database/sql's connection opener of a *sql.DB not yet
			// closed by a driver's background reset; none expected,
			// listed so a failure names something else.
			goleak.IgnoreAnyFunction("database/sql.(*DB).connectionOpener"),
		); err != nil {
			fmt.Fprintf(os.Stderr, "goleak: %v\n", err)
			code = 1
		}
	}
	os.Exit(code)
}
