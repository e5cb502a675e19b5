package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/bsm/redislock"
	"github.com/redis/go-redis/v9"

	"github.com/ticketing-dev/ticketing/broker"
	"github.com/ticketing-dev/ticketing/internal/benchkit"
	"github.com/ticketing-dev/ticketing/internal/wire"
)

// setupTimeout bounds connecting to a server before the run.
const setupTimeout = 10 * time.Second

// modVersion is the version of module path in this binary, or "?".
func modVersion(path string) string {
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, m := range bi.Deps {
			if m.Path == path {
				return m.Version
			}
		}
	}
	return "?"
}

// ---- broker

type brokerTarget struct {
	b    *broker.Broker
	ctx  context.Context
	addr string
	o    *options
}

// openBroker opens the broker as a user would (broker.Connect: two
// sessions to the one node) and waits until both sessions are ready, so
// that the run starts multiplexed over both.
func openBroker(ctx context.Context, o *options, res *result) (target, error) {
	b, err := broker.Connect(o.addr)
	if err != nil {
		return nil, err
	}
	sctx, cancel := context.WithTimeout(ctx, setupTimeout)
	defer cancel()
	if err := b.WaitReady(sctx); err != nil {
		b.Close()
		return nil, fmt.Errorf("broker to %s: %w", o.addr, err)
	}
	for b.ReadySessions() < 2 && sctx.Err() == nil {
		time.Sleep(5 * time.Millisecond)
	}
	res.Addr, res.Library, res.Conns = o.addr, "broker (this checkout) to ticketingd", b.ReadySessions()
	return &brokerTarget{b: b, ctx: ctx, addr: o.addr, o: o}, nil
}

func (t *brokerTarget) newClient() client {
	ctx, cancel := context.WithCancel(t.ctx)
	return &brokerClient{b: t.b, ctx: ctx, cancel: cancel, wait: t.o.wait, lease: t.o.lease}
}

func (t *brokerTarget) notObtained(error) bool  { return false }
func (t *brokerTarget) scripts() (uint64, bool) { return 0, false }
func (t *brokerTarget) close()                  { _ = t.b.Close() }

// brokerClient is one goroutine's use of the shared broker, with a
// cancellable context of its own (as broker's BenchmarkAcquireRelease).
type brokerClient struct {
	b           *broker.Broker
	ctx         context.Context
	cancel      context.CancelFunc
	wait, lease time.Duration
	tk          *broker.Ticket
}

func (c *brokerClient) Acquire(key string) error {
	tk, err := c.b.Acquire(c.ctx, key, broker.AcquireOptions{Lease: c.lease, Wait: c.wait})
	c.tk = tk
	return err
}

func (c *brokerClient) Release() error {
	err := c.tk.Release(c.ctx)
	c.tk = nil
	return err
}

func (c *brokerClient) close() { c.cancel() }

// ping measures the idle round trip of a PING of the protocol on a session
// of its own: the broker exposes no ping. As in the broker's sessions (and
// ticketing-bench's pingRTT), the caller hands the request to a writer
// goroutine and gets the reply from a reader goroutine, so the figure has
// the same goroutine hand-offs as a broker request.
func (t *brokerTarget) ping(n int, gap time.Duration, stop <-chan struct{}) (*benchkit.LatencySummary, error) {
	conn, err := net.DialTimeout("tcp", t.addr, setupTimeout)
	if err != nil {
		return nil, fmt.Errorf("ping: %w", err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(setupTimeout)) // the HELLO; then each PING sets its own
	hello, err := wire.AppendRequest(nil, &wire.Request{Type: wire.TypeHello, ReqID: 1, Version: wire.Version, Name: []byte("peers-bench")})
	if err != nil {
		return nil, err
	}
	if _, err := conn.Write(hello); err != nil {
		return nil, fmt.Errorf("ping: HELLO: %w", err)
	}
	fr := wire.NewReader(bufio.NewReader(conn))
	var r wire.Response
	body, err := fr.Next()
	if err == nil {
		err = wire.DecodeResponse(body, &r)
	}
	if err != nil {
		return nil, fmt.Errorf("ping: HELLO: %w", err)
	}
	if r.Type != wire.TypeHelloOK {
		return nil, fmt.Errorf("ping: HELLO answered %q, not HELLO_OK", r.Type)
	}

	sends := make(chan uint32)
	replies := make(chan error)
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() { // the writer
		var buf []byte
		for id := range sends {
			buf = wire.AppendSimple(buf[:0], wire.TypePing, id)
			if _, err := conn.Write(buf); err != nil {
				return // the reader sees the connection fail
			}
		}
	})
	wg.Go(func() { // the reader
		var r wire.Response
		for {
			body, err := fr.Next()
			if err == nil {
				err = wire.DecodeResponse(body, &r)
			}
			if err == nil && r.Type != wire.TypePong {
				err = fmt.Errorf("PING answered %q", r.Type)
			}
			select {
			case replies <- err:
			case <-done:
				return
			}
			if err != nil {
				return
			}
		}
	})
	defer func() {
		close(sends)
		close(done)
		conn.Close() // ends the reader
		wg.Wait()
	}()
	var h benchkit.Hist
	for i := range n {
		if i > 0 && !pause(gap, stop) {
			break
		}
		t0 := time.Now()
		_ = conn.SetDeadline(t0.Add(setupTimeout))
		sends <- uint32(i + 2)
		if err := <-replies; err != nil {
			return nil, fmt.Errorf("ping: %w", err)
		}
		h.Record(time.Since(t0))
	}
	s := h.Summary()
	return &s, nil
}

// ---- redislock

type redisTarget struct {
	rc     *redis.Client
	locker *redislock.Client
	opts   *redislock.Options
	ctx    context.Context
	o      *options
}

// openRedislock makes one go-redis client, its pool at least --clients
// connections (go-redis's default is 10 per GOMAXPROCS) unless --pool
// says otherwise, and one
// redislock.Client over it; with --flush it deletes the keys under
// keyPrefix first.
func openRedislock(ctx context.Context, o *options, res *result) (target, error) {
	pool := o.pool
	if pool == 0 {
		pool = max(o.clients, 10*runtime.GOMAXPROCS(0))
	}
	rc := redis.NewClient(&redis.Options{Addr: o.redis, PoolSize: pool})
	sctx, cancel := context.WithTimeout(ctx, setupTimeout)
	defer cancel()
	if err := rc.Ping(sctx).Err(); err != nil {
		rc.Close()
		return nil, fmt.Errorf("redis at %s: %w", o.redis, err)
	}
	if o.flush {
		if err := flushKeys(sctx, rc); err != nil {
			rc.Close()
			return nil, err
		}
	}
	res.Addr, res.Conns = o.redis, pool
	res.Library = "redislock " + modVersion("github.com/bsm/redislock") + " (go-redis " + modVersion("github.com/redis/go-redis/v9") + ") to Redis"
	if v, err := rc.Info(sctx, "server").Result(); err == nil {
		if i := strings.Index(v, "redis_version:"); i >= 0 {
			res.Library += " " + strings.TrimSpace(strings.SplitN(v[i+len("redis_version:"):], "\n", 2)[0])
		}
	}
	res.Persistence = redisPersistence(sctx, rc)
	res.BackoffMS = float64(o.backoff) / float64(time.Millisecond)
	return &redisTarget{rc: rc, locker: redislock.New(rc), opts: &redislock.Options{RetryStrategy: redislock.LinearBackoff(o.backoff)}, ctx: ctx, o: o}, nil
}

// redisPersistence says what Redis writes to disk: its appendonly and
// save settings (CONFIG GET), or why it cannot tell.
func redisPersistence(ctx context.Context, rc *redis.Client) string {
	var parts []string
	for _, k := range []string{"appendonly", "appendfsync", "save"} {
		m, err := rc.ConfigGet(ctx, k).Result()
		if err != nil {
			return "unknown: " + err.Error()
		}
		parts = append(parts, fmt.Sprintf("%s=%q", k, m[k]))
	}
	return strings.Join(parts, " ")
}

// flushKeys deletes every key under keyPrefix (not the whole database).
func flushKeys(ctx context.Context, rc *redis.Client) error {
	iter := rc.Scan(ctx, 0, keyPrefix+"*", 1000).Iterator()
	var keys []string
	for iter.Next(ctx) {
		keys = append(keys, iter.Val())
	}
	if err := iter.Err(); err != nil {
		return fmt.Errorf("flush: %w", err)
	}
	if len(keys) > 0 {
		if err := rc.Del(ctx, keys...).Err(); err != nil {
			return fmt.Errorf("flush: %w", err)
		}
	}
	return nil
}

func (t *redisTarget) newClient() client {
	return &redisClient{t: t}
}

func (t *redisTarget) notObtained(err error) bool { return errors.Is(err, redislock.ErrNotObtained) }
func (t *redisTarget) close()                     { _ = t.rc.Close() }

// scripts is how many scripts Redis has run (INFO commandstats: the calls
// of EVALSHA and EVAL; Obtain and Release are one script each).
func (t *redisTarget) scripts() (uint64, bool) {
	ctx, cancel := context.WithTimeout(t.ctx, setupTimeout)
	defer cancel()
	v, err := t.rc.Info(ctx, "commandstats").Result()
	if err != nil {
		return 0, false
	}
	var n uint64
	for line := range strings.Lines(v) {
		line = strings.TrimSpace(line)
		for _, cmd := range []string{"cmdstat_evalsha:calls=", "cmdstat_eval:calls="} {
			if s, ok := strings.CutPrefix(line, cmd); ok {
				s, _, _ = strings.Cut(s, ",")
				c, err := strconv.ParseUint(s, 10, 64)
				if err != nil {
					return 0, false
				}
				n += c
			}
		}
	}
	return n, true
}

// ping measures the idle round trip of go-redis's Ping, a command on a
// pooled connection from the calling goroutine, as Obtain's.
func (t *redisTarget) ping(n int, gap time.Duration, stop <-chan struct{}) (*benchkit.LatencySummary, error) {
	var h benchkit.Hist
	for i := range n {
		if i > 0 && !pause(gap, stop) {
			break
		}
		t0 := time.Now()
		if err := t.rc.Ping(t.ctx).Err(); err != nil {
			return nil, fmt.Errorf("ping: %w", err)
		}
		h.Record(time.Since(t0))
	}
	s := h.Summary()
	return &s, nil
}

// redisClient is one goroutine's use of the shared redislock.Client.
// Obtain's context has a --wait timeout (without a deadline, Obtain would
// set one of its own, at the TTL).
type redisClient struct {
	t    *redisTarget
	lock *redislock.Lock
}

func (c *redisClient) Acquire(key string) error {
	ctx, cancel := context.WithTimeout(c.t.ctx, c.t.o.wait)
	lock, err := c.t.locker.Obtain(ctx, key, c.t.o.lease, c.t.opts)
	cancel()
	c.lock = lock
	return err
}

func (c *redisClient) Release() error {
	err := c.lock.Release(c.t.ctx)
	c.lock = nil
	return err
}

func (c *redisClient) close() {}

// pause waits gap before the next round trip of a ping, and reports
// whether to go on: false once stop is closed (nil: never).
func pause(gap time.Duration, stop <-chan struct{}) bool {
	if gap <= 0 {
		select {
		case <-stop:
			return false
		default:
			return true
		}
	}
	t := time.NewTimer(gap)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-stop:
		return false
	}
}
