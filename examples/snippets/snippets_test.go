// Package snippets_test compiles and runs the Go code blocks of README.md
// and docs/semantics.md: each block is a function below, between a
// "snippet:" marker and "end snippet", and TestSnippetsMatchDocs checks
// that the documents show that code (whitespace and semicolons aside).
package snippets_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/ticketing-dev/ticketing/broker"
	"github.com/ticketing-dev/ticketing/server"
	"github.com/ticketing-dev/ticketing/server/servertest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// tour is the README's first block, "broker: acquire and release".
func tour(ctx context.Context) error {
	// snippet: README.md "### broker: acquire and release"
	// TICKETING_URL, as ticketingd init prints it, carries everything (addresses, token, TLS):
	// ticketing://TOKEN@10.0.0.5:5225?ca=/etc/ticketing/ca.pem
	cfg, err := broker.ParseURL(os.Getenv("TICKETING_URL"))
	if err != nil {
		return err
	}
	b, err := broker.New(cfg) // never dials: sessions open in the background
	if err != nil {
		return err
	} // only an invalid configuration fails here
	defer b.Close() // one broker per process, shared by all goroutines

	// at start-up, before the first Acquire: wait for a ready session
	if err := b.WaitReady(ctx); err != nil {
		return err
	} // a refused token or certificate, or ctx's end

	// lease 30 s (required), wait for the key at most 5 s (0: one try), at least 2 s must be left to work
	t, err := b.Acquire(ctx, "order-42", broker.AcquireOptions{Lease: 30 * time.Second, Wait: 5 * time.Second, Work: 2 * time.Second})
	if errors.Is(err, broker.ErrUnsent) { /* nothing was sent (no ready session just then): retry soon */
	}
	if err != nil {
		return err
	} // see the outcome table below
	defer t.Release(context.Background())
	fmt.Println(t.Token(), t.Remaining())
	// end snippet
	return nil
}

// TestTour runs the README's tour against an in-process server with a
// client token.
func TestTour(t *testing.T) {
	srv := servertest.Start(t, server.Config{ClientTokens: []string{"tok"}})
	t.Setenv("TICKETING_URL", "ticketing://tok@"+srv.Addr())
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	if err := tour(ctx); err != nil {
		t.Fatal(err)
	}
}

// api is docs/semantics.md's "API in one screen".
func api(ctx context.Context, url string, wait, lease, work time.Duration) error {
	// snippet: docs/semantics.md "## API in one screen"
	cfg, err := broker.ParseURL(url) // "ticketing://TOKEN@h1:5225,h2:5225?ca=/etc/ticketing/ca.pem"
	// or: cfg := broker.Config{Addrs: []string{"h1:5225", "h2:5225"}, Token: token, TLS: broker.TLSConfig{CAFile: "/etc/ticketing/ca.pem"}}
	if err != nil {
		return err
	} // ErrInvalidConfig
	b, err := broker.New(cfg) // or broker.Connect("127.0.0.1:5225"); never dials
	if err != nil {
		return err
	} // ErrInvalidConfig
	defer b.Close()
	if err := b.WaitReady(ctx); err != nil {
		return err
	} // at start-up: the first ready session
	t, err := b.Acquire(ctx, "key", broker.AcquireOptions{Lease: lease, Wait: wait, Work: work}) // named: Lease is required
	if err != nil {
		return err
	}
	t.Key()
	t.Token()
	t.Deadline()
	t.Remaining()
	if err := t.Refresh(ctx, lease); err != nil {
		return err
	} // protocol version 3: the deadline moves only on a confirmed K
	err = t.Release(ctx)
	// end snippet
	return err
}

// TestAPI runs docs/semantics.md's API in one screen against an
// in-process server.
func TestAPI(t *testing.T) {
	srv := servertest.Start(t, server.Config{ClientTokens: []string{"tok"}})
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	if err := api(ctx, "ticketing://tok@"+srv.Addr(), time.Second, 10*time.Second, 0); err != nil {
		t.Fatal(err)
	}
}

// TestSnippetsMatchDocs: each snippet above is the first Go block after
// its heading in its document.
func TestSnippetsMatchDocs(t *testing.T) {
	src, err := os.ReadFile("snippets_test.go")
	if err != nil {
		t.Fatal(err)
	}
	re := regexp.MustCompile(`(?s)// snippet: (\S+) "([^"]+)"\n(.*?)\n\s*// end snippet`)
	found := re.FindAllSubmatch(src, -1)
	if len(found) != 2 {
		t.Fatalf("%d snippets in snippets_test.go, want 2", len(found))
	}
	for _, m := range found {
		doc, heading, code := string(m[1]), string(m[2]), string(m[3])
		text, err := os.ReadFile("../../" + doc)
		if err != nil {
			t.Fatal(err)
		}
		_, after, ok := strings.Cut(string(text), "\n"+heading+"\n")
		if !ok {
			t.Errorf("%s: no heading %q", doc, heading)
			continue
		}
		_, block, ok := strings.Cut(after, "```go\n")
		block, _, ok2 := strings.Cut(block, "```")
		if !ok || !ok2 {
			t.Errorf("%s: no Go block after %q", doc, heading)
			continue
		}
		if normalize(block) != normalize(code) {
			t.Errorf("%s, %q: the Go block differs from the snippet in snippets_test.go:\n--- document\n%s--- snippet\n%s", doc, heading, block, code)
		}
	}
}

// normalize drops whitespace and semicolons: gofmt lays out the snippets
// here, the documents keep them compact.
func normalize(s string) string {
	return strings.Map(func(r rune) rune {
		if r == ' ' || r == '\t' || r == '\n' || r == ';' {
			return -1
		}
		return r
	}, s)
}
