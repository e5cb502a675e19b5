package servertest_test

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/ticketing-dev/ticketing/broker"
	"github.com/ticketing-dev/ticketing/server"
	"github.com/ticketing-dev/ticketing/server/servertest"
)

// exampleTB stands in for the *testing.T of a test function, which an
// Example does not have: just what Start uses.
type exampleTB struct {
	testing.TB
	cleanups []func()
}

func (e *exampleTB) Helper()           {}
func (e *exampleTB) Cleanup(f func())  { e.cleanups = append(e.cleanups, f) }
func (e *exampleTB) Fatal(args ...any) { panic(fmt.Sprint(args...)) }
func (e *exampleTB) Error(args ...any) { fmt.Println(args...) }
func (e *exampleTB) TempDir() string {
	dir, err := os.MkdirTemp("", "servertest-example")
	if err != nil {
		panic(err)
	}
	e.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

// done runs the cleanups, last registered first, as the testing package does.
func (e *exampleTB) done() {
	for i := len(e.cleanups) - 1; i >= 0; i-- {
		e.cleanups[i]()
	}
}

func Example() {
	// In a test: srv := servertest.Start(t, server.Config{})
	t := &exampleTB{}
	defer t.done()
	srv := servertest.Start(t, server.Config{})

	b, err := broker.New(broker.Config{Addrs: []string{srv.Addr()}})
	if err != nil {
		panic(err)
	}
	defer b.Close()
	ctx := context.Background()
	if err := b.WaitReady(ctx); err != nil {
		panic(err)
	}
	tk, err := b.Acquire(ctx, "order:42", broker.AcquireOptions{Lease: 10 * time.Second, Wait: time.Second})
	if err != nil {
		panic(err)
	}
	fmt.Println("token", tk.Token(), "held locks", srv.Server().Stats().HeldLocks)
	if err := tk.Release(ctx); err != nil {
		panic(err)
	}
	// Output: token 1 held locks 1
}
