package harness

import (
	"encoding/json"
	"fmt"
	"net"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/ticketing-dev/ticketing/internal/proctest"
)

// FreePort returns a TCP port on 127.0.0.1 that was free a moment ago.
// Another process may take it before you do; Server.Restart retries for
// that reason. The port is below the kernel's ephemeral range, so no
// listener on port 0 and no outgoing connection can be given it meanwhile,
// and it is never returned twice in one process (proctest.FreePort).
func FreePort() (int, error) { return proctest.FreePort("127.0.0.1") }

// ServerOptions configures StartServer. Every field is optional.
type ServerOptions struct {
	// Listen is the --listen address. Default: 127.0.0.1 and a FreePort.
	Listen string
	// DataDir is the --data-dir. Default: a new directory in tb.TempDir().
	DataDir string
	// Args are extra arguments after "serve --listen L --data-dir D
	// --log-format json" (for instance "--config", F, "--client-token", T,
	// "--token-block", "64"). Flags on the command line override --config.
	Args []string
	// StartTimeout bounds the wait for the "listening" line (default 30 s;
	// a hang guard, not a speed assertion).
	StartTimeout time.Duration
	// RestartRetryFor is how long Restart keeps retrying while the port is
	// still in use (default 10 s).
	RestartRetryFor time.Duration
	// Config, if set, starts "serve --config CONFIG --log-format json"
	// and Args: the listen address and data directory are the file's
	// (Listen and DataDir then only name the server in messages).
	Config string
}

// Server is a ticketingd subprocess ("serve"), restartable on the same port
// and data directory. Its methods are safe for concurrent use. Every
// generation's stderr is kept in one buffer, logged if the test fails.
type Server struct {
	tb   testing.TB
	bin  string
	opts ServerOptions
	args []string
	log  *LogBuffer // all generations' stderr

	mu   sync.Mutex
	proc *Process
	addr string
	gen  int
}

// StartServer starts bin serve with opts and waits for its "listening" line.
// It fails tb if the server does not start. tb.Cleanup kills it (SIGKILL)
// and, if the test failed, logs every generation's stderr.
func StartServer(tb testing.TB, bin string, opts ServerOptions) *Server {
	tb.Helper()
	if opts.Listen == "" {
		port, err := FreePort()
		if err != nil {
			tb.Fatalf("harness: free port: %v", err)
		}
		opts.Listen = net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	}
	if opts.DataDir == "" {
		opts.DataDir = filepath.Join(tb.TempDir(), "data")
	}
	if opts.StartTimeout == 0 {
		opts.StartTimeout = 30 * time.Second
	}
	if opts.RestartRetryFor == 0 {
		opts.RestartRetryFor = 10 * time.Second
	}
	s := &Server{tb: tb, bin: bin, opts: opts, log: NewLogBuffer()}
	s.args = append([]string{"serve", "--listen", opts.Listen, "--data-dir", opts.DataDir, "--log-format", "json"}, opts.Args...)
	if opts.Config != "" {
		s.args = append([]string{"serve", "--config", opts.Config, "--log-format", "json"}, opts.Args...)
	}
	tb.Cleanup(func() {
		s.Kill9()
		if tb.Failed() {
			tb.Logf("--- ticketingd %s stderr (all generations):\n%s", opts.Listen, s.log.String())
		}
	})
	if err := s.start(false); err != nil {
		tb.Fatal(err)
	}
	return s
}

// start runs one generation. With retry, a start that fails because the
// address is in use is retried until RestartRetryFor.
func (s *Server) start(retry bool) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.proc != nil {
		select {
		case <-s.proc.Done():
		default:
			return fmt.Errorf("harness: server %s is still running", s.opts.Listen)
		}
	}
	giveUp := time.Now().Add(s.opts.RestartRetryFor)
	for {
		s.gen++
		fmt.Fprintf(s.log, "=== generation %d: %s %s\n", s.gen, s.bin, strings.Join(redact(s.args), " "))
		p, err := startProcess(fmt.Sprintf("ticketingd#%d", s.gen), s.bin, s.args, s.log)
		if err != nil {
			return fmt.Errorf("harness: start ticketingd: %w", err)
		}
		addr, err := waitListening(p, s.opts.StartTimeout)
		if err == nil {
			s.proc, s.addr = p, addr
			return nil
		}
		p.Kill9()
		inUse := strings.Contains(p.Stderr.String(), "address already in use")
		if !retry || !inUse || time.Now().After(giveUp) {
			return fmt.Errorf("harness: ticketingd generation %d did not start: %w\nstderr:\n%s", s.gen, err, p.Stderr.String())
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// redact hides client tokens in the logged command line.
func redact(args []string) []string {
	out := append([]string(nil), args...)
	for i := range out {
		if out[i] == "--client-token" && i+1 < len(out) {
			out[i+1] = "<redacted>"
		}
		if strings.HasPrefix(out[i], "--client-token=") {
			out[i] = "--client-token=<redacted>"
		}
	}
	return out
}

// ParseListening parses a ticketingd "listening" log line, JSON or text
// format, and returns its addr.
func ParseListening(line string) (addr string, ok bool) {
	var rec map[string]any
	if json.Unmarshal([]byte(line), &rec) == nil {
		if rec["msg"] == "listening" {
			a, _ := rec["addr"].(string)
			return a, a != ""
		}
		return "", false
	}
	if !strings.Contains(line, "msg=listening ") {
		return "", false
	}
	for f := range strings.FieldsSeq(line) {
		if a, found := strings.CutPrefix(f, "addr="); found {
			return a, a != ""
		}
	}
	return "", false
}

func waitListening(p *Process, timeout time.Duration) (string, error) {
	line, _, err := p.Stderr.WaitLine(0, func(l string) bool {
		_, ok := ParseListening(l)
		return ok
	}, p.Done(), timeout)
	if err != nil {
		return "", err
	}
	addr, _ := ParseListening(line)
	return addr, nil
}

// Addr returns the address the server listens on, host:port.
func (s *Server) Addr() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.addr
}

// DataDir returns the server's data directory.
func (s *Server) DataDir() string { return s.opts.DataDir }

// Generation returns how many times the server process was started.
func (s *Server) Generation() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.gen
}

// Process returns the current generation's process.
func (s *Server) Process() *Process {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.proc
}

// Log returns the stderr of every generation so far.
func (s *Server) Log() string { return s.log.String() }

// Kill9 sends SIGKILL to the current generation and waits until it has
// exited. Idempotent.
func (s *Server) Kill9() {
	if p := s.Process(); p != nil {
		p.Kill9()
	}
}

// Stop sends SIGTERM (graceful shutdown) and waits, at most timeout, for the
// exit; it returns the exit code. After timeout the process is killed and an
// error returned.
func (s *Server) Stop(timeout time.Duration) (int, error) {
	p := s.Process()
	if p == nil {
		return 0, nil
	}
	if err := p.Signal(syscall.SIGTERM); err != nil {
		return 0, err
	}
	return p.Wait(timeout)
}

// Pause freezes the server with SIGSTOP (its sockets stay open, nothing is
// answered); Resume continues it.
func (s *Server) Pause() error { return s.Process().Stop() }

// Resume sends SIGCONT.
func (s *Server) Resume() error { return s.Process().Cont() }

// Restart starts a new generation on the same address and data directory,
// after the previous one exited (call Kill9 or Stop first; Restart kills a
// still running one itself). It retries while the port is in use and fails
// tb if the server does not come up.
func (s *Server) Restart(tb testing.TB) {
	tb.Helper()
	s.Kill9()
	if err := s.start(true); err != nil {
		tb.Fatal(err)
	}
}
