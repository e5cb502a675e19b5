package proctest_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/ticketing-dev/ticketing/internal/proctest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestWaitLine(t *testing.T) {
	b := proctest.NewLogBuffer()
	go func() {
		fmt.Fprint(b, "one\ntw")
		time.Sleep(10 * time.Millisecond)
		fmt.Fprint(b, "o\nthree\n")
	}()
	line, off, err := b.WaitLine(0, func(l string) bool { return strings.HasPrefix(l, "t") }, nil, 10*time.Second)
	if err != nil || line != "two" || off != len("one\ntwo\n") {
		t.Fatalf("WaitLine = %q, %d, %v; want two, 8", line, off, err)
	}
	line, _, err = b.WaitLine(off, func(l string) bool { return strings.HasPrefix(l, "t") }, nil, 10*time.Second)
	if err != nil || line != "three" {
		t.Fatalf("from %d: %q, %v; want three", off, line, err)
	}
}

func TestWaitLineEnds(t *testing.T) {
	b := proctest.NewLogBuffer()
	fmt.Fprint(b, "no\n")
	done := make(chan struct{})
	close(done)
	if _, _, err := b.WaitLine(0, func(l string) bool { return l == "yes" }, done, 10*time.Second); err == nil {
		t.Error("no error after done closed")
	}
	if _, _, err := b.WaitLine(0, func(l string) bool { return l == "yes" }, nil, 10*time.Millisecond); err == nil {
		t.Error("no error after the timeout")
	}
	fmt.Fprint(b, "yes\n") // it came with the exit: found on the last look
	if _, _, err := b.WaitLine(0, func(l string) bool { return l == "yes" }, done, 10*time.Second); err != nil {
		t.Error(err)
	}
}

func TestWaitJSON(t *testing.T) {
	b := proctest.NewLogBuffer()
	fmt.Fprint(b, "not json\n{\"msg\":\"starting\"}\n{\"msg\":\"listening\",\"addr\":\"127.0.0.1:1\"}\n")
	rec, err := b.WaitJSON(0, "listening", nil, 10*time.Second)
	if err != nil || rec["addr"] != "127.0.0.1:1" {
		t.Fatalf("WaitJSON = %v, %v", rec, err)
	}
	if _, err := b.WaitJSON(0, "stopped", nil, 10*time.Millisecond); err == nil || !strings.Contains(err.Error(), "stopped") {
		t.Errorf("missing line: %v", err)
	}
}
