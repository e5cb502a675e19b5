package main

import (
	"context"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ticketing-dev/ticketing/broker"
)

// freePort returns a TCP port that is free on host ("" for all
// interfaces) right now. init needs a port before the server starts, so
// the test cannot let the kernel pick one at listen time.
func freePort(t *testing.T, host string) int {
	t.Helper()
	l, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// nonLoopbackIP returns an IPv4 address of this machine that is not
// loopback, the stand-in for the host name remote clients use; "" if there
// is none.
func nonLoopbackIP() string {
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return ""
	}
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok && n.IP.To4() != nil && n.IP.IsGlobalUnicast() {
			return n.IP.String()
		}
	}
	return ""
}

// printedSettings is what a user copies from init's output.
type printedSettings struct {
	token, url string        // from the export lines, as sh evaluates them
	config     broker.Config // from the broker.Config snippet
	exports    string        // the export lines verbatim
}

var (
	reAddrs  = regexp.MustCompile(`(?m)^        Addrs: \[\]string\{"([^"]+)"\},$`)
	reToken  = regexp.MustCompile(`(?m)^        Token: os\.Getenv\("TICKETING_TOKEN"\),$`)
	reTLS    = regexp.MustCompile(`(?m)^        TLS:   broker\.TLSConfig\{Mode: broker\.TLSCAFile, CAFile: ("[^"]+")\},$`)
	reExport = regexp.MustCompile(`(?m)^    export TICKETING_[A-Z]+=.*$`)
)

// parsePrinted takes the settings out of init's stdout: it runs the printed
// export lines through sh, exactly as a user pastes them, and reads the
// broker.Config snippet's fields, with os.Getenv("TICKETING_TOKEN")
// standing for the exported token.
func parsePrinted(t *testing.T, out string) printedSettings {
	t.Helper()
	var p printedSettings
	lines := reExport.FindAllString(out, -1)
	if len(lines) != 2 {
		t.Fatalf("want 2 export lines, got %q in:\n%s", lines, out)
	}
	p.exports = strings.Join(lines, "\n")
	sh := exec.Command("sh", "-c", p.exports+"\nprintf '%s\\n%s' \"$TICKETING_TOKEN\" \"$TICKETING_URL\"")
	sh.Env = []string{"PATH=" + os.Getenv("PATH")}
	res, err := sh.Output()
	if err != nil {
		t.Fatalf("sh: %v on:\n%s", err, p.exports)
	}
	p.token, p.url, _ = strings.Cut(string(res), "\n")

	m := reAddrs.FindStringSubmatch(out)
	if m == nil || !reToken.MatchString(out) {
		t.Fatalf("no broker.Config snippet in:\n%s", out)
	}
	p.config = broker.Config{Addrs: []string{m[1]}, Token: p.token}
	if m := reTLS.FindStringSubmatch(out); m != nil {
		ca, err := strconv.Unquote(m[1])
		if err != nil {
			t.Fatal(err)
		}
		p.config.TLS = broker.TLSConfig{Mode: broker.TLSCAFile, CAFile: ca}
	}
	return p
}

// lockOnce does what a first client does: WaitReady, Acquire, Release.
func lockOnce(t *testing.T, cfg broker.Config) {
	t.Helper()
	b, err := broker.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second) // a hang guard
	defer cancel()
	if err := b.WaitReady(ctx); err != nil {
		t.Fatalf("WaitReady to %v: %v", cfg.Addrs, err)
	}
	tk, err := b.Acquire(ctx, "init-snippet", 0, 10*time.Second, time.Second)
	if err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	if err := tk.Release(ctx); err != nil {
		t.Fatalf("Release: %v", err)
	}
}

// TestInitSnippetWorks runs 'init', starts 'serve --config' on the config
// it wrote, and connects with exactly the settings init printed: the
// TICKETING_URL through broker.ParseURL, and the broker.Config snippet.
//
// The only thing the test chooses is the port (init --port, a free one),
// so that it never collides with a real server on 5225; serve gets
// --log-format json besides the config so that the test can wait for its
// log lines, which changes nothing about listening, TLS or tokens.
func TestInitSnippetWorks(t *testing.T) {
	if runtime.GOOS == "windows" {
		t.Skip("runs the printed export lines with sh")
	}
	remote := nonLoopbackIP()
	tests := []struct {
		name     string
		args     []string
		loopback bool   // the config must listen on 127.0.0.1
		host     string // the host the printed settings must use
		warn     bool   // init and serve warn: reachable without TLS
	}{
		{"tls localhost", []string{"--tls", "--host", "localhost"}, true, "localhost", false},
		{"tls 127.0.0.1", []string{"--tls", "--host", "127.0.0.1"}, true, "127.0.0.1", false},
		{"tls defaults", []string{"--tls"}, true, "127.0.0.1", false},
		{"plain localhost", []string{"--host", "localhost"}, true, "localhost", false},
		{"tls remote", []string{"--tls", "--host", "localhost", "--host", remote}, false, remote, false},
		{"plain remote", []string{"--host", remote}, false, remote, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if tc.host == "" {
				t.Skip("no non-loopback IPv4 address on this machine")
			}
			listenHost := ""
			if tc.loopback {
				listenHost = "127.0.0.1"
			}
			port := strconv.Itoa(freePort(t, listenHost))
			// A directory name that needs escaping in the URL and quoting
			// in sh: the printed lines must still work pasted as they are.
			dir := filepath.Join(t.TempDir(), "de ploy+$HOME&'x'")
			code, out, stderr := runCapture(t, append([]string{"init", "--dir", dir, "--port", port}, tc.args...)...)
			if code != 0 {
				t.Fatalf("init: exit %d: %s", code, stderr)
			}

			// The written config listens where the hosts say.
			cfgPath := filepath.Join(dir, initConfigFile)
			o, err := parseServe(t, "--config", cfgPath)
			if err != nil {
				t.Fatal(err)
			}
			if want := net.JoinHostPort(listenHost, port); o.Listen != want {
				t.Errorf("config listens on %q, want %q", o.Listen, want)
			}
			if got := strings.Contains(stderr, "without TLS"); got != tc.warn {
				t.Errorf("init warns about no TLS: %v, want %v; stderr:\n%s", got, tc.warn, stderr)
			}

			p := parsePrinted(t, out)
			tokens, _, err := readTokensFile(filepath.Join(dir, initTokensFile))
			if err != nil || len(tokens) != 1 || p.token != tokens[0] {
				t.Fatalf("exported token %q, tokens file %q (%v)", p.token, tokens, err)
			}
			if strings.Count(out, p.token) != 1 {
				t.Errorf("token printed %d times, want once:\n%s", strings.Count(out, p.token), out)
			}
			fromURL, err := broker.ParseURL(p.url)
			if err != nil {
				t.Fatalf("ParseURL(printed URL): %v", err)
			}
			want := net.JoinHostPort(tc.host, port)
			if !slices.Equal(fromURL.Addrs, []string{want}) || !slices.Equal(p.config.Addrs, []string{want}) {
				t.Errorf("printed addresses: URL %v, Config %v; want %s", fromURL.Addrs, p.config.Addrs, want)
			}
			if fromURL.Token != p.token || fromURL.TLS != p.config.TLS {
				t.Errorf("URL and Config snippet disagree: URL TLS %+v, Config TLS %+v", fromURL.TLS, p.config.TLS)
			}
			if isTLS := slices.Contains(tc.args, "--tls"); isTLS != (p.config.TLS.Mode == broker.TLSCAFile) ||
				isTLS && p.config.TLS.CAFile != filepath.Join(dir, initCACert) {
				t.Errorf("printed TLS %+v for init %v", p.config.TLS, tc.args)
			}

			// The printed serve command names the config, quoted for sh.
			m := regexp.MustCompile(`(?m)^    ticketingd serve --config (.+)$`).FindStringSubmatch(out)
			if m == nil {
				t.Fatalf("no serve command in:\n%s", out)
			}
			if got, err := exec.Command("sh", "-c", "printf %s "+m[1]).Output(); err != nil || string(got) != cfgPath {
				t.Errorf("serve command names %q (%v), want %q", got, err, cfgPath)
			}
			srv := startInProc(t, "serve", "--config", cfgPath, "--log-format", "json")
			srv.stderr.waitJSON(t, "listening", srv.done)
			lockOnce(t, fromURL)
			lockOnce(t, p.config)
			if got := strings.Contains(srv.stderr.String(), "without TLS"); got != tc.warn {
				t.Errorf("serve warns about no TLS: %v, want %v", got, tc.warn)
			}
			if code := srv.stop(); code != 0 {
				t.Errorf("serve: exit %d:\n%s", code, srv.stderr.String())
			}
		})
	}
}

// TestInitPlan covers the address rules that TestInitSnippetWorks cannot
// reach on every machine: IPv6 loopback, an explicit --listen, a
// loopback address the listen address does not serve.
func TestInitPlan(t *testing.T) {
	tests := []struct {
		hosts        []string
		listen       string
		wantListen   string
		wantClient   string
		wantHosts    []string
		wantUnserved []string
		wantWildcard bool
		wantUnnamed  bool
	}{
		{nil, "", "127.0.0.1:5225", "127.0.0.1:5225", []string{"127.0.0.1", "localhost"}, nil, false, false},
		{[]string{"localhost"}, "", "127.0.0.1:5225", "localhost:5225", []string{"localhost"}, nil, false, false},
		{[]string{"::1"}, "", "[::1]:5225", "[::1]:5225", []string{"::1"}, nil, false, false},
		{[]string{"::1", "localhost"}, "", "[::1]:5225", "[::1]:5225", []string{"::1", "localhost"}, nil, false, false},
		{[]string{"localhost", "::1"}, "", "127.0.0.1:5225", "localhost:5225", []string{"localhost", "::1"}, []string{"::1"}, false, false},
		{[]string{"127.0.0.1", "locks.example.test", "::1"}, "", ":5225", "locks.example.test:5225", []string{"127.0.0.1", "locks.example.test", "::1"}, nil, true, false},
		{[]string{"2001:db8::5"}, "", ":5225", "[2001:db8::5]:5225", []string{"2001:db8::5"}, nil, true, false},
		{nil, "10.0.0.7:6000", "10.0.0.7:6000", "10.0.0.7:6000", []string{"10.0.0.7"}, nil, false, false},
		{nil, "[::1]:6000", "[::1]:6000", "[::1]:6000", []string{"::1", "localhost"}, nil, false, false},
		{nil, "0.0.0.0:6000", "0.0.0.0:6000", "127.0.0.1:6000", []string{"127.0.0.1", "localhost"}, nil, true, false},
		{[]string{"a.example.test", "10.0.0.7"}, "10.0.0.7:6000", "10.0.0.7:6000", "10.0.0.7:6000", []string{"a.example.test", "10.0.0.7"}, nil, false, false},
		{[]string{"a.example.test"}, "127.0.0.1:6000", "127.0.0.1:6000", "a.example.test:6000", []string{"a.example.test"}, nil, false, true},
	}
	for _, tc := range tests {
		p := planInit(&initOptions{Hosts: tc.hosts, Listen: tc.listen, Port: 5225})
		if p.listen != tc.wantListen || p.client != tc.wantClient || !slices.Equal(p.hosts, tc.wantHosts) ||
			!slices.Equal(p.unserved, tc.wantUnserved) || p.wildcard != tc.wantWildcard || p.unnamed != tc.wantUnnamed {
			t.Errorf("hosts %q listen %q: got listen %q client %q hosts %q unserved %q wildcard %v unnamed %v",
				tc.hosts, tc.listen, p.listen, p.client, p.hosts, p.unserved, p.wildcard, p.unnamed)
		}
	}
}
