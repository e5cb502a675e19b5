package harness

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/ticketing-dev/ticketing/internal/proctest"
)

// LogBuffer is a goroutine-safe buffer that lets a reader wait for a line.
// It is the io.Writer given to a subprocess's stderr or stdout. (It wraps
// the buffer of internal/proctest, which cmd/ticketingd's tests share, so
// that no exported name of this package has an internal type.)
type LogBuffer struct{ b *proctest.LogBuffer }

// NewLogBuffer returns an empty LogBuffer.
func NewLogBuffer() *LogBuffer { return &LogBuffer{proctest.NewLogBuffer()} }

// Write appends p and wakes the waiters.
func (b *LogBuffer) Write(p []byte) (int, error) { return b.b.Write(p) }

// String returns everything written so far.
func (b *LogBuffer) String() string { return b.b.String() }

// WaitLine waits until a complete line (ended by '\n') at or after byte
// offset from satisfies match, and returns it and the offset just past it.
// It returns an error if done closes first (after one last look) or after
// timeout.
func (b *LogBuffer) WaitLine(from int, match func(line string) bool, done <-chan struct{}, timeout time.Duration) (string, int, error) {
	return b.b.WaitLine(from, match, done, timeout)
}

// WaitJSON waits for a JSON log line whose "msg" is msg (at or after byte
// offset from, as WaitLine) and returns it decoded.
func (b *LogBuffer) WaitJSON(from int, msg string, done <-chan struct{}, timeout time.Duration) (map[string]any, error) {
	return b.b.WaitJSON(from, msg, done, timeout)
}

// Process is a running subprocess whose stdout and stderr are captured.
// Its methods are safe for concurrent use. StartProcess registers a
// Cleanup that kills it (SIGKILL, after SIGCONT in case it was stopped) and
// waits for it, and, if the test failed, logs its output.
type Process struct {
	Name   string
	cmd    *exec.Cmd
	Stdout *LogBuffer
	Stderr *LogBuffer
	done   chan struct{}
	err    error // Wait's result, set before done closes
	outOff int   // read position of ReadJSON, guarded by outMu
	outMu  sync.Mutex
}

// StartProcess starts bin with args. name labels its output in failure
// logs.
func StartProcess(tb testing.TB, name, bin string, args ...string) *Process {
	tb.Helper()
	p, err := startProcess(name, bin, args, nil)
	if err != nil {
		tb.Fatalf("harness: start %s: %v", name, err)
	}
	tb.Cleanup(func() {
		p.Kill9()
		if tb.Failed() {
			tb.Logf("--- %s stdout:\n%s\n--- %s stderr:\n%s", name, p.Stdout.String(), name, p.Stderr.String())
		}
	})
	return p
}

func startProcess(name, bin string, args []string, stderr io.Writer) (*Process, error) {
	p := &Process{Name: name, cmd: exec.Command(bin, args...), Stdout: NewLogBuffer(), Stderr: NewLogBuffer(), done: make(chan struct{})}
	p.cmd.Stdout = p.Stdout
	p.cmd.Stderr = p.Stderr
	if stderr != nil {
		// stderr first: a line a waiter finds in p.Stderr (WaitLine) is
		// then in stderr too (a server's Log, read right after it started).
		p.cmd.Stderr = io.MultiWriter(stderr, p.Stderr)
	}
	if err := p.cmd.Start(); err != nil {
		return nil, err
	}
	go func() {
		p.err = p.cmd.Wait()
		close(p.done)
	}()
	return p, nil
}

// Pid returns the process id.
func (p *Process) Pid() int { return p.cmd.Process.Pid }

// Done is closed when the process has exited and its output is collected.
func (p *Process) Done() <-chan struct{} { return p.done }

// Signal sends sig; an exited process is not an error.
func (p *Process) Signal(sig syscall.Signal) error {
	select {
	case <-p.done:
		return nil
	default:
	}
	if err := p.cmd.Process.Signal(sig); err != nil && !strings.Contains(err.Error(), "process already finished") {
		return err
	}
	return nil
}

// Stop sends SIGSTOP: the process is frozen (its sockets stay open).
func (p *Process) Stop() error { return p.Signal(syscall.SIGSTOP) }

// Cont sends SIGCONT.
func (p *Process) Cont() error { return p.Signal(syscall.SIGCONT) }

// Kill9 sends SIGKILL and waits for the exit. Idempotent.
func (p *Process) Kill9() {
	_ = p.Signal(syscall.SIGKILL)
	<-p.done
}

// Wait waits for the exit, at most timeout, and returns the exit code (-1
// if killed by a signal) and Wait's error. After timeout it kills the
// process and returns an error.
func (p *Process) Wait(timeout time.Duration) (int, error) {
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-p.done:
		return p.cmd.ProcessState.ExitCode(), p.err
	case <-t.C:
		p.Kill9()
		return -1, fmt.Errorf("harness: %s did not exit within %v (killed)", p.Name, timeout)
	}
}

// ReadJSON waits (at most timeout) for the next stdout line that is a JSON
// object and decodes it into v. Non-JSON lines are skipped. Successive
// calls read successive lines.
func (p *Process) ReadJSON(v any, timeout time.Duration) error {
	p.outMu.Lock()
	defer p.outMu.Unlock()
	line, off, err := p.Stdout.WaitLine(p.outOff, func(l string) bool {
		return strings.HasPrefix(strings.TrimSpace(l), "{")
	}, p.done, timeout)
	p.outOff = off
	if err != nil {
		return fmt.Errorf("%w; stdout:\n%s\nstderr:\n%s", err, p.Stdout.String(), p.Stderr.String())
	}
	return json.Unmarshal([]byte(line), v)
}

// Lines returns the complete lines of a buffer's text.
func Lines(s string) []string {
	var out []string
	sc := bufio.NewScanner(strings.NewReader(s))
	sc.Buffer(make([]byte, 0, 64*1024), 1<<20)
	for sc.Scan() {
		out = append(out, sc.Text())
	}
	return out
}
