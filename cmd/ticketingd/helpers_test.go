package main

import (
	"bufio"
	"context"
	"crypto/rand"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/ticketing-dev/ticketing/internal/proctest"
	"github.com/ticketing-dev/ticketing/internal/wire"
)

var (
	binDir   string
	binOnce  sync.Once
	binPath  string
	binError error
)

func TestMain(m *testing.M) {
	var err error
	binDir, err = os.MkdirTemp("", "ticketingd-test-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(binDir)
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintf(os.Stderr, "goleak: %v\n", err)
			code = 1
		}
	}
	os.Exit(code)
}

// buildBinary builds the real ticketingd once per test binary run.
func buildBinary(t *testing.T) string {
	t.Helper()
	binOnce.Do(func() {
		binPath = filepath.Join(binDir, "ticketingd")
		cmd := exec.Command("go", "build", "-o", binPath, ".")
		out, err := cmd.CombinedOutput()
		if err != nil {
			binError = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
	if binError != nil {
		t.Fatal(binError)
	}
	return binPath
}

// logBuffer collects log output and lets a test wait for a line.
type logBuffer struct{ *proctest.LogBuffer }

func newLogBuffer() *logBuffer { return &logBuffer{proctest.NewLogBuffer()} }

// waitJSON waits for a JSON log record with msg and returns it; it fails the
// test if done closes first (the process or run exited).
func (b *logBuffer) waitJSON(t *testing.T, msg string, done <-chan struct{}) map[string]any {
	t.Helper()
	rec, err := b.WaitJSON(0, msg, done, 30*time.Second) // a hang guard, not a speed assertion
	if err != nil {
		t.Fatalf("%v; output:\n%s", err, b.String())
	}
	return rec
}

// inProc runs ticketingd in-process with args until the returned stop is
// called; stop returns the exit code.
type inProc struct {
	stdout, stderr *logBuffer
	done           chan struct{}
	code           int
	cancel         context.CancelFunc
}

func startInProc(t *testing.T, args ...string) *inProc {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	p := &inProc{stdout: newLogBuffer(), stderr: newLogBuffer(), done: make(chan struct{}), cancel: cancel}
	go func() {
		defer close(p.done)
		p.code = run(ctx, args, p.stdout, p.stderr)
	}()
	t.Cleanup(func() { p.stop() })
	return p
}

func (p *inProc) stop() int {
	p.cancel()
	<-p.done
	return p.code
}

// client is a minimal synchronous raw-protocol client.
type client struct {
	c   net.Conn
	fr  *wire.Reader
	id  uint32
	buf []byte
}

func dialRaw(conn net.Conn, token string) (*client, wire.Response, error) {
	cl := &client{c: conn, fr: wire.NewReader(bufio.NewReader(conn))}
	r, err := cl.do(&wire.Request{Type: wire.TypeHello, Version: wire.Version, AuthToken: []byte(token), Name: []byte("test")})
	return cl, r, err
}

// dialRawV3 is dialRaw with a version-3 HELLO: its HELLO_OK carries the
// identity of the node's cluster or pair.
func dialRawV3(conn net.Conn, token string) (*client, wire.Response, error) {
	cl := &client{c: conn, fr: wire.NewReader(bufio.NewReader(conn))}
	r, err := cl.do(&wire.Request{Type: wire.TypeHello, Version: wire.Version3, AuthToken: []byte(token), Name: []byte("test")})
	return cl, r, err
}

func (cl *client) do(req *wire.Request) (wire.Response, error) {
	cl.id++
	req.ReqID = cl.id
	var err error
	cl.buf, err = wire.AppendRequest(cl.buf[:0], req)
	if err != nil {
		return wire.Response{}, err
	}
	if _, err := cl.c.Write(cl.buf); err != nil {
		return wire.Response{}, err
	}
	body, err := cl.fr.Next()
	if err != nil {
		return wire.Response{}, err
	}
	var r wire.Response
	if err := wire.DecodeResponse(body, &r); err != nil {
		return wire.Response{}, err
	}
	if r.ReqID != req.ReqID && r.Type != wire.TypeError {
		return r, fmt.Errorf("reply req_id %d to request %d", r.ReqID, req.ReqID)
	}
	return r, nil
}

func (cl *client) acquire(key string, waitS, leaseS uint8) (wire.Response, error) {
	var owner [wire.OwnerLen]byte
	_, _ = rand.Read(owner[:])
	return cl.do(&wire.Request{Type: wire.TypeAcquire, Owner: owner, WaitS: waitS, LeaseS: leaseS, Key: []byte(key)})
}

func (cl *client) release(key string, token uint64) (wire.Response, error) {
	return cl.do(&wire.Request{Type: wire.TypeRelease, Token: token, Key: []byte(key)})
}

// subprocess is a running ticketingd binary.
type subprocess struct {
	cmd    *exec.Cmd
	stderr *logBuffer
	done   chan struct{}
	err    error
}

func startBinary(t *testing.T, bin string, args ...string) *subprocess {
	t.Helper()
	sp := &subprocess{cmd: exec.Command(bin, args...), stderr: newLogBuffer(), done: make(chan struct{})}
	sp.cmd.Stderr = sp.stderr
	sp.cmd.Stdout = io.Discard
	if err := sp.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		sp.err = sp.cmd.Wait()
		close(sp.done)
	}()
	t.Cleanup(func() {
		_ = sp.cmd.Process.Kill()
		<-sp.done
	})
	return sp
}

// addr waits for the "listening" log line and returns its addr.
func (sp *subprocess) addr(t *testing.T) string {
	t.Helper()
	rec := sp.stderr.waitJSON(t, "listening", sp.done)
	a, _ := rec["addr"].(string)
	if a == "" {
		t.Fatalf("listening line without addr: %v", rec)
	}
	return a
}

func (sp *subprocess) exitCode() int {
	<-sp.done
	return sp.cmd.ProcessState.ExitCode()
}
