package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"runtime"
	"time"

	"github.com/ticketing-dev/ticketing/internal/benchkit"
)

// keyPrefix starts every key the tool uses, on both targets; --flush
// deletes the Redis keys under it.
const keyPrefix = "peers-bench:"

type options struct {
	target   string
	addr     string
	redis    string
	mode     string
	clients  int
	duration time.Duration
	warmup   time.Duration
	lease    time.Duration
	wait     time.Duration
	backoff  time.Duration
	pings    int
	pool     int
	flush    bool
	jsonOut  bool
}

func parseFlags(args []string, stderr io.Writer) (*options, error) {
	o := &options{}
	fs := flag.NewFlagSet("peers-bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&o.target, "target", "", "broker (a running ticketingd at --addr) or redislock (Redis at --redis)")
	fs.StringVar(&o.addr, "addr", "", "host:port of a running ticketingd (--target broker)")
	fs.StringVar(&o.redis, "redis", "127.0.0.1:6379", "host:port of Redis (--target redislock)")
	fs.StringVar(&o.mode, "mode", "uncontended", "uncontended (a key per client) or contended (one key)")
	fs.IntVar(&o.clients, "clients", 64, "concurrent clients (goroutines)")
	fs.DurationVar(&o.duration, "duration", 10*time.Second, "measured run time")
	fs.DurationVar(&o.warmup, "warmup", 500*time.Millisecond, "unmeasured run time before --duration")
	fs.DurationVar(&o.lease, "lease", 30*time.Second, "lease (broker) or TTL (redislock) of each lock, whole seconds")
	fs.DurationVar(&o.wait, "wait", 10*time.Second, "how long an acquire may wait for the lock, whole seconds (broker: the ACQUIRE's wait; redislock: Obtain's context timeout)")
	fs.DurationVar(&o.backoff, "backoff", time.Millisecond, "redislock: the interval of its LinearBackoff retry strategy (how often a waiter polls)")
	fs.IntVar(&o.pings, "pings", 2000, "idle round trips measured before the run")
	fs.IntVar(&o.pool, "pool", 0, "redislock: go-redis's PoolSize; 0: the larger of --clients and go-redis's default (10 per GOMAXPROCS)")
	fs.BoolVar(&o.flush, "flush", false, "redislock: delete the Redis keys under "+keyPrefix+" before the run")
	fs.BoolVar(&o.jsonOut, "json", false, "print the result as JSON")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	switch o.target {
	case "broker":
		if o.addr == "" {
			return nil, fmt.Errorf("--target broker needs --addr (a running ticketingd)")
		}
	case "redislock":
	default:
		return nil, fmt.Errorf("invalid --target %q: want broker or redislock", o.target)
	}
	switch o.mode {
	case "uncontended", "contended":
	default:
		return nil, fmt.Errorf("invalid --mode %q: want uncontended or contended", o.mode)
	}
	if o.clients < 1 || o.pings < 1 || o.pool < 0 {
		return nil, fmt.Errorf("--clients and --pings must be >= 1, --pool >= 0")
	}
	if o.duration <= 0 || o.warmup < 0 {
		return nil, fmt.Errorf("--duration must be > 0 and --warmup >= 0")
	}
	if o.lease < time.Second || o.lease > 250*time.Second || o.lease%time.Second != 0 {
		return nil, fmt.Errorf("invalid --lease %v: whole seconds, 1 s to 250 s", o.lease)
	}
	if o.wait < 0 || o.wait > 255*time.Second || o.wait%time.Second != 0 {
		return nil, fmt.Errorf("invalid --wait %v: whole seconds, 0 to 255 s", o.wait)
	}
	if o.backoff <= 0 {
		return nil, fmt.Errorf("--backoff must be > 0")
	}
	return o, nil
}

// result is what one run reports; it is also the --json output. The
// fields shared with ticketing-bench and etcd-bench have their names.
type result struct {
	Target    string  `json:"target"`
	Mode      string  `json:"mode"`
	Addr      string  `json:"addr"`
	Library   string  `json:"library"` // what the clients call, with its version
	Clients   int     `json:"clients"`
	Conns     int     `json:"conns"`                // broker: sessions; redislock: go-redis PoolSize
	BackoffMS float64 `json:"backoff_ms,omitempty"` // redislock: the polling interval
	// redislock: Redis's appendonly, appendfsync and save settings.
	Persistence string `json:"redis_persistence,omitempty"`
	LeaseS      int    `json:"lease_s"`
	WaitS       int    `json:"wait_s"`
	GOMAXPROCS  int    `json:"gomaxprocs"`

	Seconds      float64                  `json:"seconds"`
	Cycles       uint64                   `json:"cycles"`
	CyclesPerSec float64                  `json:"cycles_per_sec"`
	Acquire      *benchkit.LatencySummary `json:"acquire,omitempty"`
	Cycle        *benchkit.LatencySummary `json:"acquire_release,omitempty"`
	Handoff      *benchkit.LatencySummary `json:"handoff,omitempty"`
	PingRTT      *benchkit.LatencySummary `json:"ping_rtt,omitempty"`
	// The round trip during the run: one PING per millisecond on its own
	// connection, as ticketing-bench's ping_rtt_under_load.
	PingLoaded *benchkit.LatencySummary `json:"ping_rtt_under_load,omitempty"`
	// Contended: 1 / PingRTT's p50, and CyclesPerSec over it.
	BoundPerSec float64 `json:"bound_cycles_per_sec,omitempty"`
	OfBound     float64 `json:"of_bound,omitempty"`
	// Contended: the same against the round trip under load (PingLoaded):
	// on a machine whose idle wake-ups vary (a VM), the steadier figure.
	LoadedBoundPerSec float64 `json:"loaded_bound_cycles_per_sec,omitempty"`
	OfLoadedBound     float64 `json:"of_loaded_bound,omitempty"`
	NotObtained       uint64  `json:"not_obtained"`
	// redislock: the scripts Redis ran (EVALSHA and EVAL, every client's:
	// INFO commandstats) per cycle over the whole run, warmup included: 2
	// when no acquire had to try again, one more per retry.
	ScriptsPerCycle float64            `json:"redis_scripts_per_cycle,omitempty"`
	Host            *benchkit.HostLoad `json:"host,omitempty"`
}

// client is one benchmark client of a target: it holds at most one lock.
type client interface {
	benchkit.CycleClient // Acquire and Release, with the library's errors
	close()
}

// target is what a run measures: the clients, and the idle round trip of
// their stack.
type target interface {
	newClient() client
	// ping measures n round trips, gap apart, or fewer if stop is closed first.
	ping(n int, gap time.Duration, stop <-chan struct{}) (*benchkit.LatencySummary, error)
	notObtained(err error) bool // the error is the library's "not obtained": counted, not fatal
	scripts() (uint64, bool)    // how many lock scripts the server has run, if it tells (Redis)
	close()
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	o, err := parseFlags(args, stderr)
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		fmt.Fprintf(stderr, "peers-bench: %v\n", err)
		return 2
	}
	res, err := bench(ctx, o)
	if err != nil {
		fmt.Fprintf(stderr, "peers-bench: %v\n", err)
		return 1
	}
	if err := benchkit.Report(stdout, o.jsonOut, res, printHuman); err != nil {
		fmt.Fprintf(stderr, "peers-bench: writing the result: %v\n", err)
		return 1
	}
	return 0
}

func bench(ctx context.Context, o *options) (*result, error) {
	res := &result{Target: o.target, Mode: o.mode, Clients: o.clients, GOMAXPROCS: runtime.GOMAXPROCS(0),
		LeaseS: int(o.lease / time.Second), WaitS: int(o.wait / time.Second)}
	var (
		t   target
		err error
	)
	switch o.target {
	case "broker":
		t, err = openBroker(ctx, o, res)
	default:
		t, err = openRedislock(ctx, o, res)
	}
	if err != nil {
		return nil, err
	}
	defer t.close()

	if res.PingRTT, err = t.ping(o.pings, 0, nil); err != nil {
		return nil, err
	}
	if o.mode == "contended" && res.PingRTT.P50US > 0 {
		res.BoundPerSec = 1e6 / res.PingRTT.P50US
	}
	scr0, haveScr := t.scripts()

	clients := make([]client, o.clients)
	for i := range clients {
		clients[i] = t.newClient()
	}
	defer func() {
		for _, c := range clients {
			c.close()
		}
	}()
	endHost := benchkit.StartHostLoad()
	// The loaded round trip: a PING per millisecond through the run.
	type pinged struct {
		s   *benchkit.LatencySummary
		err error
	}
	loaded, stop := make(chan pinged, 1), make(chan struct{})
	go func() {
		// Until the run ends (at most one per millisecond of it).
		s, err := t.ping(int((o.warmup+o.duration)/time.Millisecond), time.Millisecond, stop)
		loaded <- pinged{s, err}
	}()
	all, err := runCycles(ctx, o, t, clients, res)
	close(stop)
	lp := <-loaded
	if err != nil {
		return nil, err
	}
	if lp.err != nil {
		return nil, fmt.Errorf("round trip under load: %w", lp.err)
	}
	res.PingLoaded = lp.s
	res.Host = endHost()
	if scr1, ok := t.scripts(); ok && haveScr && all > 0 {
		res.ScriptsPerCycle = float64(scr1-scr0) / float64(all)
	}
	if res.BoundPerSec > 0 {
		res.OfBound = res.CyclesPerSec / res.BoundPerSec
	}
	if o.mode == "contended" && res.PingLoaded.P50US > 0 {
		res.LoadedBoundPerSec = 1e6 / res.PingLoaded.P50US
		res.OfLoadedBound = res.CyclesPerSec / res.LoadedBoundPerSec
	}
	return res, nil
}

// runCycles runs the workload through benchkit.RunCycles (the loop of
// etcd-bench): each client loops acquire, then release, on its own key
// (uncontended) or on the shared one (contended). It returns every
// completed cycle's count, warmup included.
func runCycles(ctx context.Context, o *options, t target, clients []client, res *result) (uint64, error) {
	var b [4]byte
	_, _ = rand.Read(b[:])
	id := keyPrefix + hex.EncodeToString(b[:])
	w := benchkit.Cycles{
		Contended: o.mode == "contended",
		Warmup:    o.warmup,
		Duration:  o.duration,
		Key:       func(i int) string { return fmt.Sprintf("%s:%d", id, i) },
		Skip:      t.notObtained,
	}
	if w.Contended {
		w.Key = func(int) string { return id + ":hot" }
	}
	cc := make([]benchkit.CycleClient, len(clients))
	for i, c := range clients {
		cc[i] = c
	}
	cr, err := benchkit.RunCycles(ctx, w, cc)
	if err != nil {
		return 0, fmt.Errorf("%s: %w (wait %v)", o.target, err, o.wait)
	}
	if err := ctx.Err(); err != nil {
		return 0, fmt.Errorf("interrupted: %w", err)
	}
	res.Seconds, res.Cycles, res.CyclesPerSec, res.NotObtained = cr.Seconds, cr.Cycles, cr.CyclesPerSec, cr.Skipped
	res.Acquire, res.Cycle, res.Handoff = cr.Acquire, cr.Cycle, cr.Handoff
	return cr.All, nil
}

// printHuman prints r in ticketing-bench's format.
func printHuman(w io.Writer, r *result) {
	conns := fmt.Sprintf("%d sessions", r.Conns)
	if r.Target == "redislock" {
		conns = fmt.Sprintf("a go-redis pool of %d, LinearBackoff %g ms", r.Conns, r.BackoffMS)
	}
	fmt.Fprintf(w, "%s, mode %s: %d clients over %s, %s at %s, lease %d s, wait %d s, GOMAXPROCS %d\n",
		r.Target, r.Mode, r.Clients, conns, r.Library, r.Addr, r.LeaseS, r.WaitS, r.GOMAXPROCS)
	if r.Persistence != "" {
		fmt.Fprintf(w, "  Redis persistence: %s\n", r.Persistence)
	}
	fmt.Fprintf(w, "  %d cycles in %.2f s: %.0f cycles/s (acquire+release)\n", r.Cycles, r.Seconds, r.CyclesPerSec)
	r.Acquire.WriteLine(w, "acquire")
	r.Cycle.WriteLine(w, "acquire+release")
	r.Handoff.WriteLine(w, "hand-off")
	r.PingRTT.WriteLine(w, "idle round trip")
	if r.BoundPerSec > 0 {
		fmt.Fprintf(w, "  round-trip bound %.0f cycles/s (1 / round-trip p50): %.2f of it\n", r.BoundPerSec, r.OfBound)
	}
	if r.PingLoaded != nil {
		r.PingLoaded.WriteLine(w, "loaded round trip")
	}
	if r.LoadedBoundPerSec > 0 {
		fmt.Fprintf(w, "  loaded round-trip bound %.0f cycles/s (1 / loaded round-trip p50): %.2f of it\n", r.LoadedBoundPerSec, r.OfLoadedBound)
	}
	if r.NotObtained > 0 {
		fmt.Fprintf(w, "  %d acquires not obtained (redislock.ErrNotObtained)\n", r.NotObtained)
	}
	if r.ScriptsPerCycle > 0 {
		fmt.Fprintf(w, "  %.1f Redis scripts per cycle (2 without retries: Obtain's and Release's)\n", r.ScriptsPerCycle)
	}
	r.Host.WriteLine(w)
}
