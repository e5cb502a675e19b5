package broker_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"time"

	"github.com/ticketing-dev/ticketing/broker"
	"github.com/ticketing-dev/ticketing/server"
)

// exampleServer starts an in-process server on 127.0.0.1 and returns its
// address and a function that stops it.
func exampleServer() (string, func()) {
	dir, err := os.MkdirTemp("", "ticketing-example")
	if err != nil {
		panic(err)
	}
	srv, err := server.New(server.Config{DataDir: dir})
	if err != nil {
		panic(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		panic(err)
	}
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ln) }()
	return ln.Addr().String(), func() {
		srv.Close()
		<-done
		os.RemoveAll(dir)
	}
}

func Example() {
	addr, stop := exampleServer()
	defer stop()

	// One broker per application, shared by all goroutines.
	b, err := broker.Connect(addr)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer b.Close()

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := b.WaitReady(ctx); err != nil { // optional, at start-up
		fmt.Println(err)
		return
	}

	// Wait up to 5 s for the lock, lease 30 s, need at least 2 s of work.
	ticket, err := b.Acquire(ctx, "order-42", 5*time.Second, 30*time.Second, 2*time.Second)
	if err != nil {
		fmt.Println("not acquired:", err)
		return
	}
	// In one database transaction: reject ticket.Token() if it is not above
	// the stored high-water for "order-42", store it, do the write, commit.
	fmt.Println("key:", ticket.Key())
	fmt.Println("token issued:", ticket.Token() > 0)
	fmt.Println("lease covers the work:", ticket.Remaining() >= 2*time.Second)

	if err := ticket.Release(ctx); err != nil {
		fmt.Println("release:", err)
		return
	}
	fmt.Println("released")
	// Output:
	// key: order-42
	// token issued: true
	// lease covers the work: true
	// released
}

func ExampleBroker_Acquire_outcomes() {
	addr, stop := exampleServer()
	defer stop()
	b, err := broker.New(broker.Config{Addrs: []string{addr}})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer b.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := b.WaitReady(ctx); err != nil {
		fmt.Println(err)
		return
	}
	holder, err := b.Acquire(ctx, "report", 0, 30*time.Second, 0)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer holder.Release(ctx)

	// The key is held: wait 0 is one immediate try.
	_, err = b.Acquire(ctx, "report", 0, 30*time.Second, 0)
	switch {
	case err == nil:
		fmt.Println("granted")
	case errors.Is(err, broker.ErrTimedOut), errors.Is(err, broker.ErrBusy):
		fmt.Println("definitely not granted; try again later")
	case errors.Is(err, broker.ErrIndeterminate):
		fmt.Println("unknown: do not enter the critical section")
	case errors.Is(err, broker.ErrUnsent):
		fmt.Println("not sent: safe to retry")
	case errors.Is(err, broker.ErrInvalidArgument):
		fmt.Println("bug in the caller")
	default:
		fmt.Println("other:", err)
	}

	// Out of range arguments are refused before anything is sent.
	_, err = b.Acquire(ctx, "report", 0, 251*time.Second, 0)
	fmt.Println(errors.Is(err, broker.ErrInvalidArgument))
	// Output:
	// definitely not granted; try again later
	// true
}

func ExampleParseURL() {
	cfg, err := broker.ParseURL("ticketing://s3cret@10.0.0.1:5225,10.0.0.2?tls=ca&ca=/etc/ticketing/ca.pem")
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(cfg.Addrs, cfg.TLS.Mode, cfg.TLS.CAFile, cfg.Token != "")
	// Output: [10.0.0.1:5225 10.0.0.2] ca-file /etc/ticketing/ca.pem true
}

// A hot-standby pair: the primary listed first (the broker tries it
// first at start), and a settle delay matching the pair's heartbeat (two
// heartbeats of 1.5 s here). While the active serves, the broker never
// dials the other node; see "Hot-standby pairs" in the package
// documentation.
func ExampleParseURL_pair() {
	cfg, err := broker.ParseURL("ticketing://s3cret@primary.example:5225,backup.example:5225?ca=/etc/ticketing/ca.pem&pair_settle=3s")
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(cfg.Addrs, cfg.PairSettle)
	// Output: [primary.example:5225 backup.example:5225] 3s
}
