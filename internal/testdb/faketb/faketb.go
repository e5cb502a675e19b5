// Package faketb is a testing.TB that records how a helper of package
// testdb (or containerdb) gave up, for the tests of those packages.
package faketb

import (
	"fmt"
	"runtime"
	"testing"
)

// TB records how a helper gave up; Skipf and Fatalf end the goroutine
// like the real ones.
type TB struct {
	testing.TB
	WasSkipped, WasFailed bool
	Msg                   string
}

func (f *TB) Helper() {}

func (f *TB) Skipf(format string, args ...any) {
	f.WasSkipped, f.Msg = true, fmt.Sprintf(format, args...)
	runtime.Goexit()
}

func (f *TB) Fatalf(format string, args ...any) {
	f.WasFailed, f.Msg = true, fmt.Sprintf(format, args...)
	runtime.Goexit()
}

// Run calls f with a TB around t in a goroutine of its own (which Skipf
// and Fatalf end), waits for it, and returns the TB.
func Run(t testing.TB, f func(testing.TB)) *TB {
	fake := &TB{TB: t}
	done := make(chan struct{})
	go func() {
		defer close(done)
		f(fake)
	}()
	<-done
	return fake
}
