package pgxfence_test

import (
	"context"
	"errors"
	"log"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ticketing-dev/ticketing/adapters/pgxfence"
	"github.com/ticketing-dev/ticketing/fence"
	"github.com/ticketing-dev/ticketing/fence/fencetest"
)

// Run with a pool. (Not run by go test: it needs a PostgreSQL server with
// the migrations applied.)
func ExampleRun() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, "postgres://app@localhost/app")
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()

	ticket := fencetest.NewTicket("account/1", 42) // from broker.Acquire in a program
	err = pgxfence.Run(ctx, pool, ticket, func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, "UPDATE accounts SET balance = balance + 10 WHERE id = $1", 1)
		return err
	})
	var stale *fence.StaleError
	switch {
	case err == nil:
		log.Print("committed")
	case errors.As(err, &stale):
		log.Printf("a newer holder has written (high-water %d)", stale.HighWater)
	case errors.Is(err, fence.ErrCommitUnknown):
		log.Print("check the account before retrying")
	case errors.Is(err, fence.ErrTxEnded):
		log.Print("the function committed or rolled back (a bug): check the account")
	default:
		log.Print(err)
	}
}
