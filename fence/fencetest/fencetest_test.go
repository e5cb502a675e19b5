package fencetest_test

import (
	"errors"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/ticketing-dev/ticketing/fence"
	"github.com/ticketing-dev/ticketing/fence/fencetest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var _ fence.Ticket = (*fencetest.Ticket)(nil)

func TestTicket(t *testing.T) {
	tk := fencetest.NewTicket("k", 3)
	if tk.Key() != "k" || tk.Token() != 3 || tk.Remaining() != time.Minute || tk.Releases() != 0 {
		t.Fatalf("new ticket: %q %d %v %d", tk.Key(), tk.Token(), tk.Remaining(), tk.Releases())
	}
	boom := errors.New("boom")
	tk.SetReleaseError(boom)
	tk.SetRemaining(0)
	if err := tk.Release(t.Context()); err != boom || tk.Releases() != 1 || tk.Remaining() != 0 {
		t.Fatalf("Release: %v, %d", err, tk.Releases())
	}
}
