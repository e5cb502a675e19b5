// Package proctest holds helpers for tests that watch the output of a
// process (a subprocess, or a command run in-process): a buffer that lets a
// test wait for a log line. It serves cmd/ticketingd's tests and the
// integration harness.
package proctest

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"time"
)

// LogBuffer is a goroutine-safe buffer that lets a reader wait for a line.
// It is the io.Writer given to a subprocess's stderr or stdout.
type LogBuffer struct {
	mu      sync.Mutex
	buf     bytes.Buffer
	changed chan struct{}
}

// NewLogBuffer returns an empty LogBuffer.
func NewLogBuffer() *LogBuffer { return &LogBuffer{changed: make(chan struct{})} }

// Write appends p and wakes the waiters.
func (b *LogBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	n, err := b.buf.Write(p)
	close(b.changed)
	b.changed = make(chan struct{})
	return n, err
}

// String returns everything written so far.
func (b *LogBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

func (b *LogBuffer) snapshot() (string, <-chan struct{}) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String(), b.changed
}

// WaitLine waits until a complete line (ended by '\n') at or after byte
// offset from satisfies match, and returns it and the offset just past it.
// It returns an error if done closes first (after one last look) or after
// timeout.
func (b *LogBuffer) WaitLine(from int, match func(line string) bool, done <-chan struct{}, timeout time.Duration) (string, int, error) {
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	exited := false
	for {
		text, changed := b.snapshot()
		off := from
		for off < len(text) {
			i := strings.IndexByte(text[off:], '\n')
			if i < 0 {
				break
			}
			line := text[off : off+i]
			off += i + 1
			if match(line) {
				return line, off, nil
			}
		}
		if exited {
			return "", off, fmt.Errorf("proctest: process exited before the expected line")
		}
		select {
		case <-changed:
		case <-done:
			exited = true // one more look: the line may have come with the exit
		case <-deadline.C:
			return "", off, fmt.Errorf("proctest: no expected line within %v", timeout)
		}
	}
}

// WaitJSON waits for a JSON log line whose "msg" is msg (at or after byte
// offset from, as WaitLine) and returns it decoded.
func (b *LogBuffer) WaitJSON(from int, msg string, done <-chan struct{}, timeout time.Duration) (map[string]any, error) {
	var rec map[string]any
	_, _, err := b.WaitLine(from, func(line string) bool {
		rec = nil
		return json.Unmarshal([]byte(line), &rec) == nil && rec["msg"] == msg
	}, done, timeout)
	if err != nil {
		return nil, fmt.Errorf("%q: %w", msg, err)
	}
	return rec, nil
}
