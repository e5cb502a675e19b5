package ticketingotel_test

import (
	"context"
	"database/sql"
	"errors"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.uber.org/goleak"
	_ "modernc.org/sqlite"

	"github.com/ticketing-dev/ticketing/adapters/sqlfence"
	"github.com/ticketing-dev/ticketing/broker"
	"github.com/ticketing-dev/ticketing/fence"
	"github.com/ticketing-dev/ticketing/migrations"
	"github.com/ticketing-dev/ticketing/server"
	"github.com/ticketing-dev/ticketing/server/servertest"
	"github.com/ticketing-dev/ticketing/ticketingotel"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// setup returns a Tracer recording into an in-memory span exporter and a
// manual metric reader, and a broker using it against an in-process server.
func setup(t *testing.T) (*servertest.Server, *broker.Broker, *ticketingotel.Tracer, *tracetest.InMemoryExporter, *sdkmetric.ManualReader, *sdktrace.TracerProvider) {
	t.Helper()
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	t.Cleanup(func() { _ = mp.Shutdown(context.Background()) })
	tr, err := ticketingotel.New(ticketingotel.WithTracerProvider(tp), ticketingotel.WithMeterProvider(mp))
	if err != nil {
		t.Fatal(err)
	}
	srv := servertest.Start(t, server.Config{})
	b, err := broker.New(broker.Config{Addrs: []string{srv.Addr()}, Tracer: tr, BackoffMax: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Close() })
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	if err := b.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}
	return srv, b, tr, exp, reader, tp
}

func attrs(kv []attribute.KeyValue) map[attribute.Key]attribute.Value {
	m := map[attribute.Key]attribute.Value{}
	for _, a := range kv {
		m[a.Key] = a.Value
	}
	return m
}

func spans(exp *tracetest.InMemoryExporter, name string) []tracetest.SpanStub {
	var out []tracetest.SpanStub
	for _, s := range exp.GetSpans() {
		if s.Name == name {
			out = append(out, s)
		}
	}
	return out
}

// sums returns a counter's values by the string value of attribute key.
func sums(t *testing.T, reader *sdkmetric.ManualReader, name string, key attribute.Key) map[string]int64 {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	out := map[string]int64{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name != name {
				continue
			}
			switch d := m.Data.(type) {
			case metricdata.Sum[int64]:
				for _, p := range d.DataPoints {
					v, _ := p.Attributes.Value(key)
					out[v.AsString()] += p.Value
				}
			case metricdata.Histogram[float64]:
				for _, p := range d.DataPoints {
					v, _ := p.Attributes.Value(key)
					out[v.AsString()] += int64(p.Count)
				}
			}
		}
	}
	return out
}

// TestBrokerAndFence runs acquires (a grant, a contended one that times
// out), a refresh, releases and fenced transactions on SQLite (one
// committed, one refused as stale) and checks the spans and metrics.
func TestBrokerAndFence(t *testing.T) {
	_, b, tr, exp, reader, _ := setup(t)
	ctx := t.Context()

	db, err := sql.Open("sqlite", "file:"+t.TempDir()+"/fence.db")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if err := migrations.Up(ctx, db, fence.SQLite); err != nil {
		t.Fatal(err)
	}

	older, err := b.Acquire(ctx, "older", broker.AcquireOptions{Lease: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	newer, err := b.Acquire(ctx, "newer", broker.AcquireOptions{Lease: 30 * time.Second, Wait: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.Acquire(ctx, "newer", broker.AcquireOptions{Lease: 30 * time.Second}); !errors.Is(err, broker.ErrTimedOut) {
		t.Fatalf("contended acquire: %v, want ErrTimedOut", err)
	}
	if err := newer.Refresh(ctx, 30*time.Second); err != nil {
		t.Fatal(err)
	}
	noop := func(*sql.Tx) error { return nil }
	// The newer token writes the shared resource first; the older one is
	// then stale there.
	if err := sqlfence.Run(ctx, db, fence.SQLite, newer, noop, fence.WithResource("account"), fence.WithTracer(tr)); err != nil {
		t.Fatal(err)
	}
	err = sqlfence.Run(ctx, db, fence.SQLite, older, noop, fence.WithResource("account"), fence.WithTracer(tr))
	if !errors.Is(err, fence.ErrStale) {
		t.Fatalf("older token: %v, want ErrStale", err)
	}

	acq := spans(exp, "ticketing.acquire")
	if len(acq) != 3 {
		t.Fatalf("%d acquire spans, want 3", len(acq))
	}
	a := attrs(acq[0].Attributes)
	if a["ticketing.key"].AsString() != "older" || a["ticketing.outcome"].AsString() != "granted" ||
		a["ticketing.token"].AsInt64() != int64(older.Token()) || a["ticketing.lease"].AsFloat64() != 30 {
		t.Errorf("granted acquire span attributes: %v", acq[0].Attributes)
	}
	if a := attrs(acq[1].Attributes); a["ticketing.wait"].AsFloat64() != 1 {
		t.Errorf("acquire span wait: %v", acq[1].Attributes)
	}
	if a := attrs(acq[2].Attributes); a["ticketing.outcome"].AsString() != "timed_out" || acq[2].Status.Code == codes.Error {
		t.Errorf("timed-out acquire span: %v, status %v", acq[2].Attributes, acq[2].Status)
	}
	ref := spans(exp, "ticketing.refresh")
	if len(ref) != 1 || attrs(ref[0].Attributes)["ticketing.outcome"].AsString() != "extended" {
		t.Errorf("refresh spans: %+v", ref)
	}
	// Run releases its ticket: the release span is a child of the fence span.
	rel := spans(exp, "ticketing.release")
	fen := spans(exp, "ticketing.fence")
	if len(rel) != 2 || len(fen) != 2 {
		t.Fatalf("%d release and %d fence spans, want 2 and 2", len(rel), len(fen))
	}
	if rel[0].Parent.SpanID() != fen[0].SpanContext.SpanID() {
		t.Errorf("release span's parent is not the fence span")
	}
	if a := attrs(fen[0].Attributes); a["ticketing.outcome"].AsString() != "committed" ||
		a["ticketing.token"].AsInt64() != int64(newer.Token()) || len(fen[0].Events) != 0 {
		t.Errorf("committed fence span: %v, events %v", fen[0].Attributes, fen[0].Events)
	}
	stale := fen[1]
	if a := attrs(stale.Attributes); a["ticketing.outcome"].AsString() != "stale" || stale.Status.Code != codes.Error {
		t.Errorf("stale fence span: %v, status %v", stale.Attributes, stale.Status)
	}
	if len(stale.Events) != 1 || stale.Events[0].Name != "ticketing.fence.stale" {
		t.Fatalf("stale fence span events: %+v", stale.Events)
	}
	if e := attrs(stale.Events[0].Attributes); e["ticketing.fence.resource"].AsString() != "account" ||
		e["ticketing.token"].AsInt64() != int64(older.Token()) || e["ticketing.fence.high_water"].AsInt64() != int64(newer.Token()) {
		t.Errorf("stale event attributes: %v", stale.Events[0].Attributes)
	}

	if got := sums(t, reader, "ticketing.acquire.outcomes", "ticketing.outcome"); got["granted"] != 2 || got["timed_out"] != 1 {
		t.Errorf("acquire outcomes: %v", got)
	}
	if got := sums(t, reader, "ticketing.acquire.duration", "ticketing.outcome"); got["granted"] != 2 || got["timed_out"] != 1 {
		t.Errorf("acquire duration counts: %v", got)
	}
	if got := sums(t, reader, "ticketing.fence.outcomes", "ticketing.outcome"); got["committed"] != 1 || got["stale"] != 1 {
		t.Errorf("fence outcomes: %v", got)
	}
	if got := sums(t, reader, "ticketing.release.outcomes", "ticketing.outcome"); got["released"] != 2 {
		t.Errorf("release outcomes: %v", got)
	}
}

// TestLost: a KeepAlive whose server stops signals the loss of its lock;
// the tracer counts it and marks the span of the KeepAlive's context.
func TestLost(t *testing.T) {
	srv, b, _, exp, reader, tp := setup(t)
	ctx := t.Context()
	tk, err := b.Acquire(ctx, "k", broker.AcquireOptions{Lease: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	parentCtx, parent := tp.Tracer("test").Start(ctx, "work")
	held, err := tk.KeepAlive(parentCtx, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	srv.Close()
	select {
	case <-held.Done():
	case <-time.After(60 * time.Second):
		t.Fatal("KeepAlive did not signal the loss")
	}
	if !errors.Is(context.Cause(held), broker.ErrLeaseEnding) {
		t.Fatalf("cause %v, want ErrLeaseEnding", context.Cause(held))
	}
	// The tracer is told just after the context is cancelled: wait for
	// it before ending the span that gets the event.
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		got := sums(t, reader, "ticketing.lock.lost", "ticketing.lost.cause")
		if got["lease_ending"] == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("lost locks: %v", got)
		}
	}
	parent.End()
	work := spans(exp, "work")
	if len(work) != 1 || len(work[0].Events) != 1 || work[0].Events[0].Name != "ticketing.lock.lost" {
		t.Errorf("work span events: %+v", work)
	}
}
