package containerdb_test

import (
	"fmt"
	"runtime"
	"testing"

	"go.uber.org/goleak"

	"github.com/ticketing-dev/ticketing/internal/testdb"
	"github.com/ticketing-dev/ticketing/internal/testdb/containerdb"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// fakeTB records how a helper gave up; Skipf and Fatalf end the goroutine
// like the real ones.
type fakeTB struct {
	testing.TB
	skipped, failed bool
	msg             string
}

func (f *fakeTB) Helper() {}
func (f *fakeTB) Skipf(format string, args ...any) {
	f.skipped, f.msg = true, fmt.Sprintf(format, args...)
	runtime.Goexit()
}
func (f *fakeTB) Fatalf(format string, args ...any) {
	f.failed, f.msg = true, fmt.Sprintf(format, args...)
	runtime.Goexit()
}

// TestUnavailable: the image source without its image variable skips the
// test locally and fails it when CI=true, even with a DSN set.
func TestUnavailable(t *testing.T) {
	t.Setenv(testdb.EnvPostgres, "postgres://postgres@127.0.0.1:5432/test?sslmode=disable")
	t.Setenv(testdb.EnvPostgresImage, "")
	run := func() *fakeTB {
		fake := &fakeTB{TB: t}
		done := make(chan struct{})
		go func() {
			defer close(done)
			containerdb.PostgresContainer(fake)
		}()
		<-done
		return fake
	}
	t.Setenv("CI", "")
	if f := run(); !f.skipped || f.failed {
		t.Errorf("CI unset: skipped=%v failed=%v (%s), want a skip", f.skipped, f.failed, f.msg)
	}
	t.Setenv("CI", "true")
	if f := run(); !f.failed {
		t.Errorf("CI=true: skipped=%v failed=%v (%s), want a failure", f.skipped, f.failed, f.msg)
	}
}
