package ticketingotel_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log"
	"net"
	"os"
	"time"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/ticketing-dev/ticketing/adapters/sqlfence"
	"github.com/ticketing-dev/ticketing/broker"
	"github.com/ticketing-dev/ticketing/fence"
	"github.com/ticketing-dev/ticketing/migrations"
	"github.com/ticketing-dev/ticketing/server"
	"github.com/ticketing-dev/ticketing/ticketingotel"
)

// A broker and a fenced SQLite transaction traced with OpenTelemetry. A
// program would give its own providers (with an OTLP exporter, say), or
// none to use the global ones; the example records the spans in memory
// and prints them.
func Example() {
	ctx := context.Background()
	spans := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(spans))
	defer tp.Shutdown(ctx)
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader()))
	defer mp.Shutdown(ctx)

	tracer, err := ticketingotel.New(ticketingotel.WithTracerProvider(tp), ticketingotel.WithMeterProvider(mp))
	if err != nil {
		log.Fatal(err)
	}
	addr, stop, err := startServer()
	if err != nil {
		log.Fatal(err)
	}
	defer stop()
	b, err := broker.New(broker.Config{Addrs: []string{addr}, Tracer: tracer})
	if err != nil {
		log.Fatal(err)
	}
	defer b.Close()
	readyCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := b.WaitReady(readyCtx); err != nil {
		log.Fatal(err)
	}

	dir, err := os.MkdirTemp("", "ticketingotel-example")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	db, err := sql.Open("sqlite", "file:"+dir+"/app.db")
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	if err := migrations.Up(ctx, db, fence.SQLite); err != nil {
		log.Fatal(err)
	}

	tk, err := b.Acquire(ctx, "order-42", broker.AcquireOptions{Lease: 10 * time.Second})
	if err != nil {
		log.Fatal(err)
	}
	// Run releases the ticket; the release span is the fence span's child.
	err = sqlfence.Run(ctx, db, fence.SQLite, tk, func(tx *sql.Tx) error {
		return nil // the protected writes
	}, fence.WithTracer(tracer))
	if err != nil {
		log.Fatal(err)
	}

	for _, s := range spans.GetSpans() {
		for _, a := range s.Attributes {
			if a.Key == ticketingotel.KeyOutcome {
				fmt.Println(s.Name, a.Value.AsString())
			}
		}
	}
	// Output:
	// ticketing.acquire granted
	// ticketing.release released
	// ticketing.fence committed
}

// startServer starts an in-process Ticketing server on 127.0.0.1.
func startServer() (addr string, stop func(), err error) {
	dir, err := os.MkdirTemp("", "ticketingotel-server")
	if err != nil {
		return "", nil, err
	}
	srv, err := server.New(server.Config{DataDir: dir})
	if err != nil {
		return "", nil, errors.Join(err, os.RemoveAll(dir))
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", nil, errors.Join(err, srv.Close(), os.RemoveAll(dir))
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	return ln.Addr().String(), func() {
		_ = srv.Shutdown(context.Background())
		<-served
		_ = os.RemoveAll(dir)
	}, nil
}
