package containerdb_test

import (
	"testing"

	"go.uber.org/goleak"

	"github.com/ticketing-dev/ticketing/internal/testdb"
	"github.com/ticketing-dev/ticketing/internal/testdb/containerdb"
	"github.com/ticketing-dev/ticketing/internal/testdb/faketb"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestUnavailable: the image source without its image variable skips the
// test locally and fails it when CI=true, even with a DSN set.
func TestUnavailable(t *testing.T) {
	t.Setenv(testdb.EnvPostgres, "postgres://postgres@127.0.0.1:5432/test?sslmode=disable")
	t.Setenv(testdb.EnvPostgresImage, "")
	run := func() *faketb.TB {
		return faketb.Run(t, func(tb testing.TB) { containerdb.PostgresContainer(tb) })
	}
	t.Setenv("CI", "")
	if f := run(); !f.WasSkipped || f.WasFailed {
		t.Errorf("CI unset: skipped=%v failed=%v (%s), want a skip", f.WasSkipped, f.WasFailed, f.Msg)
	}
	t.Setenv("CI", "true")
	if f := run(); !f.WasFailed {
		t.Errorf("CI=true: skipped=%v failed=%v (%s), want a failure", f.WasSkipped, f.WasFailed, f.Msg)
	}
}
