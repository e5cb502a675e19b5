package conformance_test

import (
	"context"
	"net"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ticketing-dev/ticketing/fence"
	"github.com/ticketing-dev/ticketing/fence/fencetest"
	"github.com/ticketing-dev/ticketing/internal/testdb"
)

// BenchmarkUpdate measures one single-row UPDATE in a transaction, plain
// (begin, UPDATE, commit) and fenced (begin, check-and-bump, UPDATE,
// commit, release of a fake ticket), sequentially, and reports the median
// latency as p50-ns. On PostgreSQL the fence adds no round trip (the
// check-and-bump rides in the BEGIN's query, the check that fn left the
// transaction open in the COMMIT's; TestPgxRoundTrips), only the high-water
// row's write; on MySQL and SQLite it adds three statements (the bump,
// SAVEPOINT after it, RELEASE SAVEPOINT before COMMIT).
// PostgreSQL goes through pgxfence; MySQL and SQLite through sqlfence.
// For MySQL, add interpolateParams=true to TICKETING_TEST_MYSQL_DSN to
// measure without go-sql-driver's per-statement prepare round trips.
// postgres-1ms delays every request by 1 ms, as a network would: there
// the fenced transaction's round trips, not the machine's noise, set the
// ratio. The
// latencies are dominated by each commit's fsync, so run with -count and
// compare medians on a quiet machine.
func BenchmarkUpdate(b *testing.B) {
	for _, db := range []struct {
		name string
		open func(testing.TB) *target
	}{
		{"postgres", openPgx},
		{"postgres-1ms", func(tb testing.TB) *target {
			// Every request waits 1 ms before it is sent, as over a
			// network with that latency: the round trips show.
			return openPgxTuned(tb, func(cfg *pgxpool.Config) {
				cfg.ConnConfig.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
					c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
					if err != nil {
						return nil, err
					}
					return delayedConn{c, time.Millisecond}, nil
				}
			})
		}},
		{"mysql", func(tb testing.TB) *target {
			return openSQL(tb, "sql/mysql", "mysql", testdb.MySQL(tb), fence.MySQL, fence.MySQL)
		}},
		{"sqlite", func(tb testing.TB) *target {
			return openSQL(tb, "sql/sqlite", "sqlite", testdb.SQLite(tb), fence.SQLite, fence.SQLite)
		}},
	} {
		b.Run(db.name, func(b *testing.B) {
			tg := db.open(b)
			tg.mustExec(b, "INSERT INTO items (id, v) VALUES (1, 0)")
			update := func(q querier) error {
				return q.exec(context.Background(), "UPDATE items SET v = v + 1 WHERE id = ?", 1)
			}
			var token atomic.Uint64
			b.Run("plain", func(b *testing.B) {
				measure(b, func(ctx context.Context) error { return tg.plainTx(ctx, update) })
			})
			b.Run("fenced", func(b *testing.B) {
				measure(b, func(ctx context.Context) error {
					return tg.run(ctx, fencetest.NewTicket("bench", token.Add(1)), update)
				})
			})
		})
	}
}

// delayedConn waits delay before each write: one request, one wait
// (pgconn sends a request in one write; TestPgxRoundTrips).
type delayedConn struct {
	net.Conn
	delay time.Duration
}

func (c delayedConn) Write(p []byte) (int, error) {
	time.Sleep(c.delay)
	return c.Conn.Write(p)
}

func measure(b *testing.B, op func(context.Context) error) {
	ctx := context.Background()
	// Warm up: connections and statement caches.
	for range 20 {
		if err := op(ctx); err != nil {
			b.Fatal(err)
		}
	}
	lat := make([]time.Duration, 0, 1024)
	for b.Loop() {
		start := time.Now()
		if err := op(ctx); err != nil {
			b.Fatal(err)
		}
		lat = append(lat, time.Since(start))
	}
	slices.Sort(lat)
	b.ReportMetric(float64(lat[len(lat)/2].Nanoseconds()), "p50-ns")
}
