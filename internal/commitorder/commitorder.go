// Package commitorder is the load test of the fence's commit order (a
// fenced write commits only with a token above every token committed before
// it for the resource), shared by the adapter conformance suite and the integration
// tests against database containers.
//
// The load: Workers goroutines × PerWorker fenced transactions on one
// resource (fresh at the start, so the first inserts race on the unique
// index too). Tokens come from an increasing atomic counter, Batch at a
// time, and each goroutine presents its batch in shuffled order, so tokens
// arrive out of order both within and across goroutines. Every accepted
// transaction sleeps 0–2 ms while holding the fence and appends its token
// to a log table.
//
// Why the log's id order is the commit order: an auto-increment id is
// assigned when the row is inserted, not at commit, so in general id order
// is not commit order. Here, though, the log insert happens after the
// check-and-bump, which holds the resource's row lock (PostgreSQL, MySQL)
// or the database's writer lock (SQLite) until the transaction ends. So
// accepted transactions run their log inserts one after another, each
// after the previous one committed (or rolled back), and the ids, which the
// sequence hands out in increasing order, follow commit order. (No accepted
// transaction rolls back here.) Were the fence not holding a lock until
// commit, two transactions could both pass, and the id and commit orders
// would come apart — exactly what the checks catch.
//
// Checks: the logged tokens in id (= commit) order strictly increase, and
// the final high-water is the last logged token (the commit-order violations,
// returned); every rejection is a *fence.StaleError for the resource and
// the token with HighWater >= Token; nothing else fails (a MySQL deadlock
// is a failure, never retried); every ticket was released once; the log has
// one row per accepted transaction; both outcomes occurred.
package commitorder

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ticketing-dev/ticketing/fence"
	"github.com/ticketing-dev/ticketing/fence/fencetest"
)

// The shape of the load.
const (
	Workers   = 16  // goroutines
	PerWorker = 200 // fenced transactions per goroutine
	Batch     = 4   // tokens taken from the counter at once and shuffled
)

// Exec executes a statement in the fenced transaction.
type Exec func(ctx context.Context, query string, args ...any) error

// Run runs fn in one transaction fenced with tk, releases tk, and returns
// the outcome: an adapter's Run, or a deliberately broken fence for a
// negative control.
type Run func(ctx context.Context, tk fence.Ticket, fn func(Exec) error) error

// Config is one run of the load.
type Config struct {
	Name     string  // for the log line
	Resource string  // the fenced resource
	Run      Run     // the fence under test
	DB       *sql.DB // a separate pool for reading the log and the high-water
	// LogTable has columns id (auto-increment, the primary key) and token.
	LogTable string
	// Placeholder is the dialect's first bind parameter: "$1" or "?".
	Placeholder string
}

// Load runs the load and checks its outcomes. It fails tb for every
// problem but a violation of the commit order in the log, and returns those
// (for a negative control to expect); Test fails tb for them too.
func Load(tb testing.TB, ctx context.Context, cfg Config) (violations []string) {
	tb.Helper()
	insertLog := "INSERT INTO " + cfg.LogTable + " (token) VALUES (" + cfg.Placeholder + ")"
	var (
		counter         atomic.Uint64
		accepted, stale atomic.Int64
		mu              sync.Mutex
		failures        []error
	)
	fail := func(err error) {
		mu.Lock()
		defer mu.Unlock()
		failures = append(failures, err)
	}
	start := time.Now()
	var wg sync.WaitGroup
	for w := range Workers {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(w), uint64(time.Now().UnixNano())))
			for range PerWorker / Batch {
				first := counter.Add(Batch) - Batch + 1
				tokens := make([]uint64, Batch)
				for i := range tokens {
					tokens[i] = first + uint64(i)
				}
				rng.Shuffle(len(tokens), func(i, j int) { tokens[i], tokens[j] = tokens[j], tokens[i] })
				for _, tok := range tokens {
					sleep := time.Duration(rng.IntN(2001)) * time.Microsecond
					tk := fencetest.NewTicket(cfg.Resource, tok)
					err := cfg.Run(ctx, tk, func(exec Exec) error {
						time.Sleep(sleep / 2)
						if err := exec(ctx, insertLog, int64(tok)); err != nil {
							return err
						}
						time.Sleep(sleep - sleep/2)
						return nil
					})
					var se *fence.StaleError
					switch {
					case err == nil:
						accepted.Add(1)
					case errors.As(err, &se) && se.Resource == cfg.Resource && se.Token == tok && se.HighWater >= tok:
						stale.Add(1)
					default:
						fail(fmt.Errorf("token %d: %w", tok, err))
					}
					if n := tk.Releases(); n != 1 {
						fail(fmt.Errorf("token %d: released %d times", tok, n))
					}
				}
			}
		})
	}
	wg.Wait()
	for i, err := range failures {
		if i == 10 {
			tb.Errorf("... and %d more failures", len(failures)-10)
			break
		}
		tb.Errorf("unexpected outcome: %v", err)
	}
	tb.Logf("commit order %s: accepted=%d stale=%d failed=%d total=%d in %v", cfg.Name,
		accepted.Load(), stale.Load(), len(failures), Workers*PerWorker, time.Since(start).Round(time.Millisecond))
	if got := accepted.Load() + stale.Load() + int64(len(failures)); got != Workers*PerWorker {
		tb.Errorf("outcomes = %d, want %d", got, Workers*PerWorker)
	}
	if accepted.Load() == 0 || stale.Load() == 0 {
		tb.Errorf("the load did not exercise both outcomes")
	}

	// Read with a context of its own: ctx may be near its end.
	logged, err := readLog(context.WithoutCancel(ctx), cfg)
	if err != nil {
		tb.Fatalf("read %s: %v", cfg.LogTable, err)
	}
	if int64(len(logged)) != accepted.Load() {
		tb.Errorf("log has %d rows, accepted %d", len(logged), accepted.Load())
	}
	for i := 1; i < len(logged); i++ {
		if logged[i] <= logged[i-1] {
			violations = append(violations, fmt.Sprintf("commit #%d has token %d after token %d", i, logged[i], logged[i-1]))
		}
	}
	if len(logged) > 0 {
		var hw int64
		q := "SELECT high_water FROM " + fence.DefaultTable + " WHERE resource = " + cfg.Placeholder
		if err := cfg.DB.QueryRowContext(context.WithoutCancel(ctx), q, []byte(cfg.Resource)).Scan(&hw); err != nil {
			tb.Fatalf("read high-water: %v", err)
		}
		if last := logged[len(logged)-1]; hw != last {
			violations = append(violations, fmt.Sprintf("high-water %d, last accepted token %d", hw, last))
		}
	}
	return violations
}

// Test runs Load and fails tb for each violation of the commit order (the first
// ten, and how many more).
func Test(tb testing.TB, ctx context.Context, cfg Config) {
	tb.Helper()
	violations := Load(tb, ctx, cfg)
	for i, v := range violations {
		if i == 10 {
			tb.Errorf("... and %d more violations", len(violations)-10)
			break
		}
		tb.Errorf("commit order violated: %s", v)
	}
}

func readLog(ctx context.Context, cfg Config) ([]int64, error) {
	rows, err := cfg.DB.QueryContext(ctx, "SELECT token FROM "+cfg.LogTable+" ORDER BY id")
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var logged []int64
	for rows.Next() {
		var tok int64
		if err := rows.Scan(&tok); err != nil {
			return nil, err
		}
		logged = append(logged, tok)
	}
	return logged, rows.Err()
}
