// Command pauseworker is worker A of the SIGSTOP pause story
// (integration.TestPauseStory_SIGSTOP). It acquires a lock with a short
// lease, reports its token on stdout, waits for SIGCONT (the test freezes
// it with SIGSTOP first, past its lease, and lets another worker write
// meanwhile), then attempts its fenced write with sqlfence and reports the
// outcome on stdout. Every report is one JSON object per line:
//
//	{"event":"acquired","token":7}
//	{"event":"bumped","token":7}            (with -pause after-bump)
//	{"event":"result","outcome":"stale","token":7,"high_water":8,"resource":"story","error":"..."}
//
// -pause says where it waits for SIGCONT: before-run (acquire, pause, then
// sqlfence.Run: the fence refuses the stale token), or after-bump (inside
// sqlfence.Run, after the check-and-bump: the lease check refuses the
// commit). Outcomes: ok, stale, lease_expired, error. It exits 0 when it
// reported a result, 1 on a setup failure.
package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	_ "github.com/go-sql-driver/mysql"
	_ "github.com/jackc/pgx/v5/stdlib"

	"github.com/ticketing-dev/ticketing/adapters/sqlfence"
	"github.com/ticketing-dev/ticketing/broker"
	"github.com/ticketing-dev/ticketing/fence"
)

type report struct {
	Event     string `json:"event"`
	Outcome   string `json:"outcome,omitempty"`
	Token     uint64 `json:"token,omitempty"`
	HighWater uint64 `json:"high_water,omitempty"`
	Resource  string `json:"resource,omitempty"`
	Error     string `json:"error,omitempty"`
}

func say(r report) {
	b, _ := json.Marshal(r)
	fmt.Println(string(b))
}

func main() {
	var (
		addr   = flag.String("addr", "", "ticketingd address")
		dbKind = flag.String("db", "mysql", "mysql or postgres")
		dsn    = flag.String("dsn", "", "database DSN (go-sql-driver/mysql, or a postgres:// URL)")
		key    = flag.String("key", "story", "lock key (and fenced resource)")
		lease  = flag.Duration("lease", time.Second, "lease")
		pause  = flag.String("pause", "before-run", "before-run or after-bump")
		wait   = flag.Duration("max-wait", 60*time.Second, "give up waiting for SIGCONT after this")
	)
	flag.Parse()
	if err := run(*addr, *dbKind, *dsn, *key, *lease, *pause, *wait); err != nil {
		fmt.Fprintln(os.Stderr, "pauseworker:", err)
		os.Exit(1)
	}
}

func run(addr, dbKind, dsn, key string, lease time.Duration, pause string, maxWait time.Duration) error {
	// SIGCONT is the go signal; subscribe before anything can be stopped.
	cont := make(chan os.Signal, 1)
	signal.Notify(cont, syscall.SIGCONT)
	waitCont := func() error {
		select {
		case <-cont:
			return nil
		case <-time.After(maxWait):
			return errors.New("no SIGCONT")
		}
	}

	var (
		dialect fence.Dialect
		driver  string
		update  string
	)
	switch dbKind {
	case "mysql":
		dialect, driver, update = fence.MySQL, "mysql", "UPDATE story SET writer = ?, token = ? WHERE id = 1"
	case "postgres":
		dialect, driver, update = fence.Postgres, "pgx", "UPDATE story SET writer = $1, token = $2 WHERE id = 1"
	default:
		return fmt.Errorf("unknown -db %q", dbKind)
	}
	db, err := sql.Open(driver, dsn)
	if err != nil {
		return err
	}
	defer db.Close()

	ctx := context.Background()
	b, err := broker.New(broker.Config{Addrs: []string{addr}, Name: "pauseworker"})
	if err != nil {
		return err
	}
	defer b.Close()
	rctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	if err := b.WaitReady(rctx); err != nil {
		return err
	}
	// Open the database connection now, so the pause is the only delay
	// between SIGCONT and the write.
	if err := db.PingContext(rctx); err != nil {
		return err
	}
	t, err := b.Acquire(rctx, key, broker.AcquireOptions{Lease: lease, Wait: 5 * time.Second})
	if err != nil {
		return fmt.Errorf("acquire: %w", err)
	}
	say(report{Event: "acquired", Token: t.Token()})

	if pause == "before-run" {
		if err := waitCont(); err != nil {
			return err
		}
	}
	err = sqlfence.Run(ctx, db, dialect, t, func(tx *sql.Tx) error {
		if pause == "after-bump" {
			say(report{Event: "bumped", Token: t.Token()})
			if err := waitCont(); err != nil {
				return err
			}
		}
		_, err := tx.ExecContext(ctx, update, "A", int64(t.Token()))
		return err
	})
	r := report{Event: "result", Token: t.Token()}
	var stale *fence.StaleError
	switch {
	case fence.Committed(err):
		r.Outcome = "ok"
	case errors.As(err, &stale):
		r.Outcome, r.HighWater, r.Resource = "stale", stale.HighWater, stale.Resource
	case errors.Is(err, fence.ErrLeaseExpired):
		r.Outcome = "lease_expired"
	default:
		r.Outcome = "error"
	}
	if err != nil {
		r.Error = err.Error()
	}
	say(r)
	return nil
}
