// Package ticketingotel traces and measures Ticketing's broker and fence
// with OpenTelemetry. It is a module of its own
// (github.com/ticketing-dev/ticketing/ticketingotel), so that only the
// programs that use it depend on OpenTelemetry.
//
// New returns a *Tracer that implements both broker.Tracer and
// fence.Tracer: set it as broker.Config.Tracer, and pass it to the
// adapters' Run with fence.WithTracer.
//
// Spans (see docs/opentelemetry.md): "ticketing.acquire",
// "ticketing.refresh" and "ticketing.release" (kind client) and
// "ticketing.fence" (kind internal), with the attributes ticketing.key,
// ticketing.token, ticketing.outcome and, on a failure, error.type; a
// stale token is a "ticketing.fence.stale" event on the fence span, and a
// KeepAlive's possible loss a "ticketing.lock.lost" event on the span of
// the KeepAlive's context. Metrics: the histogram
// ticketing.acquire.duration (s), the counters ticketing.acquire.outcomes,
// ticketing.refresh.outcomes, ticketing.release.outcomes,
// ticketing.fence.outcomes and ticketing.lock.lost. Metrics never carry
// the key (its cardinality is the application's).
package ticketingotel

import (
	"context"
	"errors"
	"math"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/ticketing-dev/ticketing/broker"
	"github.com/ticketing-dev/ticketing/fence"
)

// ScopeName is the instrumentation scope of the spans and metrics.
const ScopeName = "github.com/ticketing-dev/ticketing/ticketingotel"

// Attribute keys.
const (
	KeyKey        = attribute.Key("ticketing.key")       // the lock's key
	KeyToken      = attribute.Key("ticketing.token")     // the fencing token (int)
	KeyOutcome    = attribute.Key("ticketing.outcome")   // see Outcome
	KeyLease      = attribute.Key("ticketing.lease")     // requested lease, seconds (double)
	KeyWait       = attribute.Key("ticketing.wait")      // requested wait, seconds (double)
	KeyWork       = attribute.Key("ticketing.work")      // work budget, seconds (double)
	KeyRemaining  = attribute.Key("ticketing.remaining") // conservative remaining lease, seconds (double)
	KeyResources  = attribute.Key("ticketing.fence.resources")
	KeyTable      = attribute.Key("ticketing.fence.table")
	KeyResource   = attribute.Key("ticketing.fence.resource")   // on a stale event
	KeyHighWater  = attribute.Key("ticketing.fence.high_water") // on a stale event
	KeyStaleCause = attribute.Key("ticketing.fence.stale_cause")
	KeyLostCause  = attribute.Key("ticketing.lost.cause") // lease_ending or not_held
	keyErrorType  = attribute.Key("error.type")
)

// Option configures New.
type Option func(*config)

type config struct {
	tp trace.TracerProvider
	mp metric.MeterProvider
}

// WithTracerProvider uses tp (default: otel.GetTracerProvider()).
func WithTracerProvider(tp trace.TracerProvider) Option {
	return func(c *config) { c.tp = tp }
}

// WithMeterProvider uses mp (default: otel.GetMeterProvider()).
func WithMeterProvider(mp metric.MeterProvider) Option {
	return func(c *config) { c.mp = mp }
}

// Tracer implements broker.Tracer and fence.Tracer with OpenTelemetry.
// It is safe for concurrent use.
type Tracer struct {
	tracer                                trace.Tracer
	acquireDur                            metric.Float64Histogram
	acquires, refreshes, releases, fences metric.Int64Counter
	lost                                  metric.Int64Counter
}

var (
	_ broker.Tracer = (*Tracer)(nil)
	_ fence.Tracer  = (*Tracer)(nil)
)

// New returns a Tracer; it fails only if an instrument cannot be created.
func New(opts ...Option) (*Tracer, error) {
	c := config{}
	for _, o := range opts {
		o(&c)
	}
	if c.tp == nil {
		c.tp = otel.GetTracerProvider()
	}
	if c.mp == nil {
		c.mp = otel.GetMeterProvider()
	}
	m := c.mp.Meter(ScopeName)
	t := &Tracer{tracer: c.tp.Tracer(ScopeName)}
	var err, e error
	t.acquireDur, e = m.Float64Histogram("ticketing.acquire.duration",
		metric.WithUnit("s"),
		metric.WithDescription("Duration of Acquire calls, queueing for the lock included."),
		metric.WithExplicitBucketBoundaries(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 255))
	err = errors.Join(err, e)
	counter := func(name, unit, desc string) metric.Int64Counter {
		c, e := m.Int64Counter(name, metric.WithUnit(unit), metric.WithDescription(desc))
		err = errors.Join(err, e)
		return c
	}
	t.acquires = counter("ticketing.acquire.outcomes", "{acquire}", "Acquire calls, by outcome.")
	t.refreshes = counter("ticketing.refresh.outcomes", "{refresh}", "Lease refreshes (Refresh and KeepAlive's), by outcome.")
	t.releases = counter("ticketing.release.outcomes", "{release}", "Release calls, by outcome.")
	t.fences = counter("ticketing.fence.outcomes", "{transaction}", "Fenced transactions, by outcome.")
	t.lost = counter("ticketing.lock.lost", "{lock}", "KeepAlives that signalled a possible loss of their lock, by cause.")
	if err != nil {
		return nil, err
	}
	return t, nil
}

type startKey struct{}

func tokenAttr(tok uint64) attribute.KeyValue {
	return KeyToken.Int64(int64(min(tok, math.MaxInt64)))
}

// Outcome names an error of the broker or the fence as the
// ticketing.outcome attribute does; ok is the name of success
// ("granted", "extended", "released", "committed").
func Outcome(err error, ok string) string {
	var se *broker.ServerError
	switch {
	case err == nil:
		return ok
	case errors.Is(err, fence.ErrStale):
		return "stale"
	case errors.Is(err, fence.ErrLeaseExpired):
		return "lease_expired"
	case errors.Is(err, fence.ErrReleased):
		return "ticket_released"
	case errors.Is(err, fence.ErrCommitUnknown):
		return "commit_unknown"
	case errors.Is(err, fence.ErrTxEnded):
		return "tx_ended"
	case errors.Is(err, fence.ErrRelease):
		return "release_failed"
	case errors.Is(err, broker.ErrTimedOut):
		return "timed_out"
	case errors.Is(err, broker.ErrBusy):
		return "busy"
	case errors.Is(err, broker.ErrIndeterminate):
		return "indeterminate"
	case errors.Is(err, broker.ErrUnsent):
		return "unsent"
	case errors.Is(err, broker.ErrLeaseTooShort):
		return "lease_too_short"
	case errors.Is(err, broker.ErrNotHeld):
		return "not_held"
	case errors.Is(err, broker.ErrReleaseUnconfirmed), errors.Is(err, broker.ErrRefreshUnconfirmed):
		return "unconfirmed"
	case errors.Is(err, broker.ErrLeaseEnding):
		return "lease_ending"
	case errors.Is(err, broker.ErrUnsupported):
		return "unsupported"
	case errors.Is(err, broker.ErrNotActive):
		return "not_active"
	case errors.Is(err, broker.ErrClosed):
		return "closed"
	case errors.Is(err, broker.ErrInvalidArgument):
		return "invalid_argument"
	case errors.As(err, &se):
		return "server_error"
	}
	return "error"
}

// end closes the span of ctx with the outcome; expected failures (a lock
// held by another: timed_out, busy) do not mark the span as an error.
func end(ctx context.Context, err error, outcome string, attrs ...attribute.KeyValue) {
	span := trace.SpanFromContext(ctx)
	span.SetAttributes(KeyOutcome.String(outcome))
	span.SetAttributes(attrs...)
	if err != nil && outcome != "timed_out" && outcome != "busy" {
		span.SetAttributes(keyErrorType.String(outcome))
		span.SetStatus(codes.Error, err.Error())
	}
	span.End()
}

func seconds(d time.Duration) float64 { return d.Seconds() }

// TraceAcquireStart implements broker.Tracer.
func (t *Tracer) TraceAcquireStart(ctx context.Context, d broker.TraceAcquireStartData) context.Context {
	ctx = context.WithValue(ctx, startKey{}, time.Now())
	ctx, _ = t.tracer.Start(ctx, "ticketing.acquire", trace.WithSpanKind(trace.SpanKindClient),
		trace.WithAttributes(KeyKey.String(d.Key), KeyLease.Float64(seconds(d.Lease)),
			KeyWait.Float64(seconds(d.Wait)), KeyWork.Float64(seconds(d.Work))))
	return ctx
}

// TraceAcquireEnd implements broker.Tracer.
func (t *Tracer) TraceAcquireEnd(ctx context.Context, d broker.TraceAcquireEndData) {
	outcome := Outcome(d.Err, "granted")
	if d.Err == nil {
		end(ctx, nil, outcome, tokenAttr(d.Token), KeyRemaining.Float64(time.Until(d.Deadline).Seconds()))
	} else {
		end(ctx, d.Err, outcome)
	}
	set := metric.WithAttributes(KeyOutcome.String(outcome))
	if start, ok := ctx.Value(startKey{}).(time.Time); ok {
		t.acquireDur.Record(context.WithoutCancel(ctx), time.Since(start).Seconds(), set)
	}
	t.acquires.Add(context.WithoutCancel(ctx), 1, set)
}

// TraceRefreshStart implements broker.Tracer.
func (t *Tracer) TraceRefreshStart(ctx context.Context, d broker.TraceRefreshStartData) context.Context {
	ctx, _ = t.tracer.Start(ctx, "ticketing.refresh", trace.WithSpanKind(trace.SpanKindClient),
		trace.WithAttributes(KeyKey.String(d.Key), tokenAttr(d.Token), KeyLease.Float64(seconds(d.Lease))))
	return ctx
}

// TraceRefreshEnd implements broker.Tracer.
func (t *Tracer) TraceRefreshEnd(ctx context.Context, d broker.TraceRefreshEndData) {
	outcome := Outcome(d.Err, "extended")
	end(ctx, d.Err, outcome, KeyRemaining.Float64(time.Until(d.Deadline).Seconds()))
	t.refreshes.Add(context.WithoutCancel(ctx), 1, metric.WithAttributes(KeyOutcome.String(outcome)))
}

// TraceReleaseStart implements broker.Tracer.
func (t *Tracer) TraceReleaseStart(ctx context.Context, d broker.TraceReleaseStartData) context.Context {
	ctx, _ = t.tracer.Start(ctx, "ticketing.release", trace.WithSpanKind(trace.SpanKindClient),
		trace.WithAttributes(KeyKey.String(d.Key), tokenAttr(d.Token)))
	return ctx
}

// TraceReleaseEnd implements broker.Tracer.
func (t *Tracer) TraceReleaseEnd(ctx context.Context, d broker.TraceReleaseEndData) {
	outcome := Outcome(d.Err, "released")
	end(ctx, d.Err, outcome)
	t.releases.Add(context.WithoutCancel(ctx), 1, metric.WithAttributes(KeyOutcome.String(outcome)))
}

// TraceLost implements broker.Tracer: it counts the loss and adds an
// event to the span of the KeepAlive's context, if any.
func (t *Tracer) TraceLost(ctx context.Context, d broker.TraceLostData) {
	cause := Outcome(d.Cause, "unknown")
	trace.SpanFromContext(ctx).AddEvent("ticketing.lock.lost", trace.WithAttributes(
		KeyKey.String(d.Key), tokenAttr(d.Token), KeyLostCause.String(cause)))
	t.lost.Add(context.WithoutCancel(ctx), 1, metric.WithAttributes(KeyLostCause.String(cause)))
}

// TraceFenceStart implements fence.Tracer.
func (t *Tracer) TraceFenceStart(ctx context.Context, d fence.TraceFenceStartData) context.Context {
	ctx, _ = t.tracer.Start(ctx, "ticketing.fence", trace.WithSpanKind(trace.SpanKindInternal),
		trace.WithAttributes(KeyResources.StringSlice(d.Resources), KeyTable.String(d.Table), tokenAttr(d.Token)))
	return ctx
}

// TraceFenceEnd implements fence.Tracer: a stale token is also an event.
func (t *Tracer) TraceFenceEnd(ctx context.Context, d fence.TraceFenceEndData) {
	outcome := Outcome(d.Err, "committed")
	var se *fence.StaleError
	if errors.As(d.Err, &se) {
		trace.SpanFromContext(ctx).AddEvent("ticketing.fence.stale", trace.WithAttributes(
			KeyResource.String(se.Resource), tokenAttr(se.Token), KeyHighWater.Int64(int64(min(se.HighWater, math.MaxInt64))),
			KeyStaleCause.String(se.Cause().String())))
	}
	end(ctx, d.Err, outcome)
	t.fences.Add(context.WithoutCancel(ctx), 1, metric.WithAttributes(KeyOutcome.String(outcome)))
}
