package integration_test

import (
	"context"
	"crypto/x509"
	"errors"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/ticketing-dev/ticketing/broker"
	"github.com/ticketing-dev/ticketing/integration/harness"
)

// initDeployment runs the real 'ticketingd init --dir D --tls --host
// 127.0.0.1' and returns D and the client token, which must be the same
// in its output and in D/client-tokens.
func initDeployment(t *testing.T, bin string) (dir, token string) {
	t.Helper()
	dir = filepath.Join(t.TempDir(), "deploy")
	p := harness.StartProcess(t, "ticketingd init", bin, "init", "--dir", dir, "--tls", "--host", "127.0.0.1")
	if code, err := p.Wait(30 * time.Second); code != 0 {
		t.Fatalf("ticketingd init: exit %d (%v)\n%s%s", code, err, p.Stdout.String(), p.Stderr.String())
	}
	m := regexp.MustCompile(`(?m)^\s*export TICKETING_URL='([^']+)'$`).FindStringSubmatch(p.Stdout.String())
	if m == nil {
		t.Fatalf("no TICKETING_URL in the output of init:\n%s", p.Stdout.String())
	}
	u, err := broker.ParseURL(m[1])
	if err != nil || u.Token == "" {
		t.Fatalf("the TICKETING_URL init printed has no client token (%v)", err)
	}
	token = u.Token
	body, err := os.ReadFile(filepath.Join(dir, "client-tokens"))
	if err != nil {
		t.Fatal(err)
	}
	var fileTokens []string
	for _, l := range strings.Split(string(body), "\n") {
		if l = strings.TrimSpace(l); l != "" && !strings.HasPrefix(l, "#") {
			fileTokens = append(fileTokens, l)
		}
	}
	if len(fileTokens) != 1 || fileTokens[0] != token {
		t.Fatalf("client-tokens holds %d tokens, not just the printed one", len(fileTokens))
	}
	for _, f := range []string{"ticketingd.yaml", "ca.pem", "server.pem", "server-key.pem"} {
		if _, err := os.Stat(filepath.Join(dir, f)); err != nil {
			t.Fatalf("init did not write %s: %v", f, err)
		}
	}
	return dir, token
}

// TestAuthAndTLS: a deployment made by 'ticketingd init --tls --host
// 127.0.0.1', served by 'ticketingd serve --config D/ticketingd.yaml' (with
// --listen and --data-dir overridden on the command line), and the
// broker's token and TLS modes against it.
//
// Pass:
//   - the right token with TLSCAFile D/ca.pem: WaitReady, Acquire and
//     Release succeed; so does TLSInsecureSkipVerify;
//   - a wrong token, or none: WaitReady fails at once (refused for good)
//     with an error matching broker.ErrUnauthorized;
//   - TLSSystemRoots: WaitReady fails at once, its error naming the
//     unknown authority (x509.UnknownAuthorityError, "certificate signed
//     by unknown authority");
//   - TLSCAFile with ServerName "localhost" (not in the certificate):
//     WaitReady fails at once with an x509 host name error;
//   - TLSOff against the TLS server: WaitReady fails when its ctx ends
//     (broker.ErrNotReady), not matching ErrUnauthorized, with a session
//     error in its text.
func TestAuthAndTLS(t *testing.T) {
	bin := harness.Ticketingd(t)
	dir, token := initDeployment(t, bin)
	srv := harness.StartServer(t, bin, harness.ServerOptions{
		Args: []string{"--config", filepath.Join(dir, "ticketingd.yaml")},
	})
	if log := srv.Log(); !strings.Contains(log, `"tls":true`) || !strings.Contains(log, `"client_tokens":1`) {
		t.Fatalf("the server did not start with TLS and one client token:\n%s", log)
	}
	ca := filepath.Join(dir, "ca.pem")

	// waitReady returns WaitReady's error with a short timeout (a failing
	// case waits it out; a succeeding one returns at once).
	waitReady := func(t *testing.T, cfg broker.Config, timeout time.Duration) (*broker.Broker, error) {
		t.Helper()
		cfg.Addrs = []string{srv.Addr()}
		cfg.BackoffMin, cfg.BackoffMax = 20*time.Millisecond, 200*time.Millisecond
		b, err := broker.New(cfg)
		if err != nil {
			t.Fatalf("New: %v", err)
		}
		t.Cleanup(func() { b.Close() })
		ctx, cancel := context.WithTimeout(t.Context(), timeout)
		defer cancel()
		return b, b.WaitReady(ctx)
	}
	works := func(t *testing.T, cfg broker.Config) {
		t.Helper()
		b, err := waitReady(t, cfg, 20*time.Second)
		if err != nil {
			t.Fatalf("WaitReady: %v", err)
		}
		tk, err := b.Acquire(t.Context(), "tls-"+t.Name(), broker.AcquireOptions{Lease: 5 * time.Second, Wait: time.Second})
		if err != nil {
			t.Fatalf("Acquire: %v", err)
		}
		if err := tk.Release(t.Context()); err != nil {
			t.Fatalf("Release: %v", err)
		}
	}
	// fails expects WaitReady to fail: at once, with the refusal, if every
	// session is refused for good (a refused token, a rejected
	// certificate), else when its ctx ends, with broker.ErrNotReady.
	fails := func(t *testing.T, cfg broker.Config, forGood bool) error {
		t.Helper()
		_, err := waitReady(t, cfg, 2*time.Second)
		if err == nil {
			t.Fatal("WaitReady succeeded, want an error")
		}
		if forGood && errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("WaitReady error %v waited for its ctx, want the refusal at once", err)
		}
		if !forGood && (!errors.Is(err, context.DeadlineExceeded) || !errors.Is(err, broker.ErrNotReady)) {
			t.Errorf("WaitReady error %v does not match context.DeadlineExceeded and broker.ErrNotReady", err)
		}
		if strings.Contains(err.Error(), token) {
			t.Errorf("the client token appears in the error")
		}
		t.Logf("WaitReady: %v", err)
		return err
	}

	t.Run("ca-file", func(t *testing.T) {
		t.Parallel()
		works(t, broker.Config{Token: token, TLS: broker.TLSConfig{Mode: broker.TLSCAFile, CAFile: ca}})
	})
	t.Run("insecure-skip-verify", func(t *testing.T) {
		t.Parallel()
		works(t, broker.Config{Token: token, TLS: broker.TLSConfig{Mode: broker.TLSInsecureSkipVerify}})
	})
	t.Run("url", func(t *testing.T) {
		t.Parallel()
		cfg, err := broker.ParseURL("ticketing://" + token + "@" + srv.Addr() + "?tls=ca&ca=" + ca)
		if err != nil {
			t.Fatal(err)
		}
		works(t, cfg)
	})
	t.Run("wrong-token", func(t *testing.T) {
		t.Parallel()
		err := fails(t, broker.Config{Token: "not-" + token, TLS: broker.TLSConfig{Mode: broker.TLSCAFile, CAFile: ca}}, true)
		if !errors.Is(err, broker.ErrUnauthorized) {
			t.Errorf("WaitReady: %v, want errors.Is ErrUnauthorized", err)
		}
	})
	t.Run("no-token", func(t *testing.T) {
		t.Parallel()
		err := fails(t, broker.Config{TLS: broker.TLSConfig{Mode: broker.TLSCAFile, CAFile: ca}}, true)
		if !errors.Is(err, broker.ErrUnauthorized) {
			t.Errorf("WaitReady: %v, want errors.Is ErrUnauthorized", err)
		}
	})
	t.Run("system-roots", func(t *testing.T) {
		t.Parallel()
		err := fails(t, broker.Config{Token: token, TLS: broker.TLSConfig{Mode: broker.TLSSystemRoots}}, true)
		var ua x509.UnknownAuthorityError
		if !errors.As(err, &ua) {
			t.Errorf("WaitReady: %v, want an x509.UnknownAuthorityError in the chain", err)
		}
		if !strings.Contains(err.Error(), "certificate signed by unknown authority") {
			t.Errorf("WaitReady: %v, want the unknown authority in the text", err)
		}
		if errors.Is(err, broker.ErrUnauthorized) {
			t.Errorf("a TLS failure matches ErrUnauthorized: %v", err)
		}
	})
	t.Run("wrong-server-name", func(t *testing.T) {
		t.Parallel()
		err := fails(t, broker.Config{Token: token, TLS: broker.TLSConfig{Mode: broker.TLSCAFile, CAFile: ca, ServerName: "localhost"}}, true)
		var he x509.HostnameError
		if !errors.As(err, &he) {
			t.Errorf("WaitReady: %v, want an x509.HostnameError in the chain", err)
		}
	})
	t.Run("tls-off", func(t *testing.T) {
		t.Parallel()
		// Told at once that the server speaks TLS (it used to be a wait
		// for ctx ending in "reading HELLO reply: EOF").
		err := fails(t, broker.Config{Token: token}, true)
		if errors.Is(err, broker.ErrUnauthorized) {
			t.Errorf("plain TCP to a TLS server matches ErrUnauthorized: %v", err)
		}
		if !errors.Is(err, broker.ErrTLSRequired) || !strings.Contains(err.Error(), "ca=PATH") {
			t.Errorf("WaitReady: %v, want broker.ErrTLSRequired naming the URL's ca=", err)
		}
	})
}
