package main

import (
	"bufio"
	"context"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"runtime"
	"runtime/debug"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ticketing-dev/ticketing/internal/benchkit"
	"github.com/ticketing-dev/ticketing/internal/wire"
	"github.com/ticketing-dev/ticketing/server"
)

type options struct {
	addrs      []string      // --addr: one server, or the nodes of a cluster
	findWait   time.Duration // several addresses: how long to look for the serving node
	token      string
	mode       string
	clients    int
	conns      int
	duration   time.Duration
	warmup     time.Duration
	locks      int
	window     int
	serverPID  int
	jsonOut    bool
	rate       float64
	cpuProfile string
	memProfile string

	// Client TLS: the files given, and the configuration they make (nil:
	// plain TCP). A tlsConf without ServerName verifies each address's host.
	tlsCA, tlsServerName, tlsCert, tlsKey string
	tlsConf                               *tls.Config
}

func parseFlags(args []string, stderr io.Writer) (*options, error) {
	o := &options{}
	fs := flag.NewFlagSet("ticketing-bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Var(addrList{&o.addrs}, "addr", "server `address`; a comma-separated list (the flag may be repeated) names the nodes of a cluster, and the sessions go to the one that serves (HELLO_OK), following NOT_ACTIVE hints to listed addresses; none starts an in-process server on a temporary data dir")
	fs.DurationVar(&o.findWait, "find-wait", 10*time.Second, "with several --addr: how long to look for the serving node while none serves (a cluster electing its leader)")
	fs.StringVar(&o.token, "token", "", "client `token` for HELLO")
	fs.StringVar(&o.mode, "mode", "uncontended", "uncontended (a key per client), contended (one key) or hold (--locks held locks, then RSS)")
	fs.IntVar(&o.clients, "clients", 64, "concurrent clients")
	fs.IntVar(&o.conns, "conns", 2, "sessions the clients are multiplexed over (pipelining by req_id); --conns equal to --clients is one session per client")
	fs.DurationVar(&o.duration, "duration", 10*time.Second, "measured run time (uncontended, contended)")
	fs.DurationVar(&o.warmup, "warmup", 500*time.Millisecond, "unmeasured run time before --duration")
	fs.IntVar(&o.locks, "locks", 1_000_000, "hold mode: locks to acquire and hold (lease 250 s)")
	fs.IntVar(&o.window, "window", 32, "hold mode: ACQUIREs in flight per client")
	fs.IntVar(&o.serverPID, "server-pid", 0, "hold mode with --addr: `pid` of the server, to read its RSS from /proc")
	fs.Float64Var(&o.rate, "rate", 0, "uncontended/contended: target cycles/s over all clients (0: as fast as possible); latency is measured from each request's send")
	fs.BoolVar(&o.jsonOut, "json", false, "print the result as JSON")
	fs.StringVar(&o.cpuProfile, "cpuprofile", "", "write a CPU profile of this process (client and in-process server) to `file`")
	fs.StringVar(&o.memProfile, "memprofile", "", "write a heap profile at the end to `file`")
	fs.StringVar(&o.tlsCA, "tls-ca", "", "speak TLS to --addr, verifying the server's certificate with the PEM CA bundle `file` (a bundle of 'ticketingd init --tls' or 'init --cluster': its ca.pem)")
	fs.StringVar(&o.tlsServerName, "tls-server-name", "", "with --tls-ca: the `name` the server certificate must carry (default: the host of each --addr)")
	fs.StringVar(&o.tlsCert, "tls-cert", "", "with --tls-ca: present this PEM client certificate `file`, for a server with --tls-client-ca (needs --tls-key)")
	fs.StringVar(&o.tlsKey, "tls-key", "", "PEM private key `file` of --tls-cert")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	switch o.mode {
	case "uncontended", "contended", "hold":
	default:
		return nil, fmt.Errorf("invalid --mode %q: want uncontended, contended or hold", o.mode)
	}
	if o.clients < 1 {
		return nil, fmt.Errorf("invalid --clients %d: must be >= 1", o.clients)
	}
	if o.conns < 1 {
		return nil, fmt.Errorf("invalid --conns %d: must be >= 1", o.conns)
	}
	o.conns = min(o.conns, o.clients)
	if o.duration <= 0 {
		return nil, fmt.Errorf("invalid --duration %v: must be > 0", o.duration)
	}
	if o.warmup < 0 {
		return nil, fmt.Errorf("invalid --warmup %v", o.warmup)
	}
	if o.rate < 0 {
		return nil, fmt.Errorf("invalid --rate %v", o.rate)
	}
	if o.locks < 1 || o.window < 1 {
		return nil, fmt.Errorf("--locks and --window must be >= 1")
	}
	if o.findWait < 0 {
		return nil, fmt.Errorf("invalid --find-wait %v", o.findWait)
	}
	if o.serverPID != 0 && len(o.addrs) == 0 {
		return nil, fmt.Errorf("--server-pid needs --addr (the in-process server's RSS is this process's)")
	}
	if err := o.loadTLS(); err != nil {
		return nil, err
	}
	return o, nil
}

// loadTLS checks the --tls-* flags and reads their files into o.tlsConf,
// so that a missing or bad file is a usage error before anything is dialled.
func (o *options) loadTLS() error {
	if (o.tlsCert == "") != (o.tlsKey == "") {
		return fmt.Errorf("--tls-cert and --tls-key must be given together")
	}
	if o.tlsCA == "" {
		for _, f := range []struct{ name, v string }{{"tls-server-name", o.tlsServerName}, {"tls-cert", o.tlsCert}} {
			if f.v != "" {
				return fmt.Errorf("--%s needs --tls-ca (which turns TLS on)", f.name)
			}
		}
		return nil
	}
	if len(o.addrs) == 0 {
		return fmt.Errorf("--tls-ca needs --addr: the in-process server speaks plain TCP")
	}
	pem, err := os.ReadFile(o.tlsCA)
	if err != nil {
		return fmt.Errorf("--tls-ca: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return fmt.Errorf("--tls-ca %s: no PEM certificates found", o.tlsCA)
	}
	conf := &tls.Config{RootCAs: pool, ServerName: o.tlsServerName, MinVersion: tls.VersionTLS12}
	if o.tlsCert != "" {
		cert, err := tls.LoadX509KeyPair(o.tlsCert, o.tlsKey)
		if err != nil {
			return fmt.Errorf("--tls-cert %s / --tls-key %s: %w", o.tlsCert, o.tlsKey, err)
		}
		conf.Certificates = []tls.Certificate{cert}
	}
	o.tlsConf = conf
	return nil
}

// result is what one run reports; it is also the --json output.
type result struct {
	Mode         string                   `json:"mode"`
	Addr         string                   `json:"addr"`            // the server the sessions went to
	Addrs        []string                 `json:"addrs,omitempty"` // several --addr: the cluster's nodes
	InProcess    bool                     `json:"in_process_server"`
	TLS          bool                     `json:"tls"`
	Clients      int                      `json:"clients"`
	TargetRate   float64                  `json:"target_rate,omitempty"`
	Conns        int                      `json:"conns"`
	GOMAXPROCS   int                      `json:"gomaxprocs"`
	Seconds      float64                  `json:"seconds"`
	Cycles       uint64                   `json:"cycles"`
	CyclesPerSec float64                  `json:"cycles_per_sec"`
	Acquire      *benchkit.LatencySummary `json:"acquire,omitempty"`
	Cycle        *benchkit.LatencySummary `json:"acquire_release,omitempty"`
	Handoff      *benchkit.LatencySummary `json:"handoff,omitempty"`
	PingRTT      *benchkit.LatencySummary `json:"ping_rtt,omitempty"`
	PingLoaded   *benchkit.LatencySummary `json:"ping_rtt_under_load,omitempty"`
	TimedOut     uint64                   `json:"timed_out"`
	Busy         uint64                   `json:"busy"`
	NotHeld      uint64                   `json:"not_held"`
	Hold         *holdResult              `json:"hold,omitempty"`
	Host         *benchkit.HostLoad       `json:"host,omitempty"`
}

type holdResult struct {
	Requested       int     `json:"requested"`
	Granted         uint64  `json:"granted"`
	Busy            uint64  `json:"busy"`
	Seconds         float64 `json:"seconds"`
	AcquiresPerSec  float64 `json:"acquires_per_sec"`
	ServerHeld      int     `json:"server_held_locks,omitempty"`
	RSSBeforeBytes  int64   `json:"rss_before_bytes"`
	RSSAfterBytes   int64   `json:"rss_after_bytes"`
	RSSPeakBytes    int64   `json:"rss_peak_bytes,omitempty"`
	RSSPerLock      float64 `json:"rss_bytes_per_lock"`
	HeapBeforeBytes uint64  `json:"heap_inuse_before_bytes,omitempty"`
	HeapAfterBytes  uint64  `json:"heap_inuse_after_bytes,omitempty"`
	HeapPerLock     float64 `json:"heap_bytes_per_lock,omitempty"`
	RSSSource       string  `json:"rss_source"`
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	o, err := parseFlags(args, stderr)
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		fmt.Fprintf(stderr, "ticketing-bench: %v\n", err)
		return 2
	}
	res, err := bench(ctx, o, stderr)
	if err != nil {
		fmt.Fprintf(stderr, "ticketing-bench: %v\n", err)
		return 1
	}
	if err := benchkit.Report(stdout, o.jsonOut, res, printHuman); err != nil {
		fmt.Fprintf(stderr, "ticketing-bench: writing the result: %v\n", err)
		return 1
	}
	return 0
}

func bench(ctx context.Context, o *options, stderr io.Writer) (res *result, err error) {
	if o.cpuProfile != "" {
		f, err := os.Create(o.cpuProfile)
		if err != nil {
			return nil, fmt.Errorf("--cpuprofile: %w", err)
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return nil, fmt.Errorf("--cpuprofile: %w", err)
		}
		defer pprof.StopCPUProfile()
	}

	var addr string
	if len(o.addrs) == 1 {
		addr = o.addrs[0]
	}
	var srv *server.Server
	if len(o.addrs) == 0 {
		dir, err := os.MkdirTemp("", "ticketing-bench-")
		if err != nil {
			return nil, err
		}
		defer os.RemoveAll(dir)
		srv, err = server.New(server.Config{DataDir: dir, Logger: nil})
		if err != nil {
			return nil, fmt.Errorf("in-process server: %w", err)
		}
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			_ = srv.Close()
			return nil, err
		}
		served := make(chan struct{})
		go func() {
			defer close(served)
			_ = srv.Serve(ln)
		}()
		defer func() {
			sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			if err := srv.Shutdown(sctx); err != nil {
				_ = srv.Close()
			}
			<-served
		}()
		addr = ln.Addr().String()
	}

	clk := newClock()
	conns := make([]*muxConn, 0, o.conns)
	defer func() {
		for _, c := range conns {
			c.close()
		}
	}()
	if len(o.addrs) > 1 {
		serving, c, err := findServing(ctx, o.addrs, o.token, o.tlsConf, clk, o.findWait)
		if err != nil {
			return nil, err
		}
		addr = serving
		conns = append(conns, c)
	}
	for len(conns) < o.conns {
		c, err := dialMux(addr, o.token, o.tlsConf, clk)
		if err != nil {
			return nil, fmt.Errorf("connect to %s: %w", addr, err)
		}
		conns = append(conns, c)
	}

	res = &result{Mode: o.mode, Addr: addr, InProcess: srv != nil, TLS: o.tlsConf != nil, Clients: o.clients, Conns: o.conns, TargetRate: o.rate,
		GOMAXPROCS: runtime.GOMAXPROCS(0)}
	if len(o.addrs) > 1 {
		res.Addrs = o.addrs
	}
	ping, err := pingRTT(conns[0], clk, 2000)
	if err != nil {
		return nil, err
	}
	res.PingRTT = ping

	var stop atomic.Bool
	defer context.AfterFunc(ctx, func() { stop.Store(true) })()

	endHost := benchkit.StartHostLoad()
	defer func() {
		if res != nil {
			res.Host = endHost()
		}
	}()
	switch o.mode {
	case "hold":
		err = runHold(o, conns, clk, srv, res, &stop)
	default:
		err = runCycles(o, conns, clk, res, &stop)
	}
	if err != nil {
		return nil, err
	}
	if o.memProfile != "" {
		f, err := os.Create(o.memProfile)
		if err != nil {
			return nil, fmt.Errorf("--memprofile: %w", err)
		}
		runtime.GC()
		_ = pprof.WriteHeapProfile(f)
		f.Close()
	}
	return res, nil
}

// pingRTT measures the round trip of a PING through the same client
// machinery: the "one loopback round trip" the hand-off is compared to.
func pingRTT(c *muxConn, clk *clock, n int) (*benchkit.LatencySummary, error) {
	var h benchkit.Hist
	ch := make(chan reply, 1)
	for range n {
		t0 := clk.now()
		if err := c.send(&wire.Request{Type: wire.TypePing}, ch); err != nil {
			return nil, fmt.Errorf("ping: %w", err)
		}
		r := <-ch
		if r.err != nil {
			return nil, fmt.Errorf("ping: %w", r.err)
		}
		h.Record(clk.since(t0))
	}
	s := h.Summary()
	return &s, nil
}

func runID() string {
	var b [4]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

func newOwner() (o [wire.OwnerLen]byte) {
	_, _ = rand.Read(o[:])
	return o
}

type clientStats struct {
	acq, cycle, handoff     benchkit.Hist
	cycles                  uint64
	timedOut, busy, notHeld uint64
}

// runCycles runs the uncontended and contended modes: each client loops
// ACQUIRE, then RELEASE of the granted token.
func runCycles(o *options, conns []*muxConn, clk *clock, res *result, stop *atomic.Bool) error {
	id := runID()
	contended := o.mode == "contended"
	var waitS uint8
	if contended {
		waitS = 60
	}
	measureFrom := clk.now() + o.warmup
	end := measureFrom + o.duration
	var lastRelease atomic.Int64 // contended: when the holder sent its RELEASE

	stats := make([]clientStats, o.clients)
	errs := make(chan error, o.clients)
	var wg sync.WaitGroup
	for i := range o.clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			st := &stats[i]
			c := conns[i%len(conns)]
			key := []byte(fmt.Sprintf("bench-%s-%d", id, i))
			if contended {
				key = []byte("bench-" + id + "-hot")
			}
			owner := newOwner()
			ch := make(chan reply, 1)
			acq := wire.Request{Type: wire.TypeAcquire, Owner: owner, WaitS: waitS, LeaseS: 30, Key: key}
			var interval, next time.Duration
			if o.rate > 0 {
				interval = time.Duration(float64(time.Second) * float64(o.clients) / o.rate)
				next = clk.now() + time.Duration(i)*interval/time.Duration(o.clients)
			}
			for {
				if interval > 0 {
					if d := next - clk.now(); d > 0 {
						time.Sleep(d)
					}
					next += interval
				}
				t0 := clk.now()
				if t0 >= end || stop.Load() {
					break
				}
				measured := t0 >= measureFrom
				if err := c.send(&acq, ch); err != nil {
					errs <- err
					return
				}
				r := <-ch
				if r.err != nil {
					errs <- r.err
					return
				}
				t1 := clk.now()
				switch r.typ {
				case wire.TypeGranted:
				case wire.TypeTimedOut:
					st.timedOut++
					continue
				case wire.TypeBusy:
					st.busy++
					continue
				default:
					errs <- fmt.Errorf("ACQUIRE answered with %q", r.typ)
					return
				}
				if contended {
					if rel := lastRelease.Load(); rel > 0 && measured {
						st.handoff.Record(t1 - time.Duration(rel))
					}
					lastRelease.Store(int64(clk.now()))
				}
				if err := c.send(&wire.Request{Type: wire.TypeRelease, Token: r.token, Key: key}, ch); err != nil {
					errs <- err
					return
				}
				r = <-ch
				if r.err != nil {
					errs <- r.err
					return
				}
				t2 := clk.now()
				if r.typ != wire.TypeReleased {
					st.notHeld++
				}
				if measured {
					st.acq.Record(t1 - t0)
					st.cycle.Record(t2 - t0)
					st.cycles++
				}
			}
		}()
	}
	// A PING every millisecond on the first session during the measured
	// run: the loopback round trip under the same load, which the hand-off
	// is compared to.
	var pingH benchkit.Hist
	pingDone := make(chan struct{})
	go func() {
		defer close(pingDone)
		ch := make(chan reply, 1)
		for {
			time.Sleep(time.Millisecond)
			t0 := clk.now()
			if t0 >= end || stop.Load() {
				return
			}
			if conns[0].send(&wire.Request{Type: wire.TypePing}, ch) != nil {
				return
			}
			if r := <-ch; r.err != nil {
				return
			}
			if t0 >= measureFrom {
				pingH.Record(clk.since(t0))
			}
		}
	}()
	wg.Wait()
	<-pingDone
	ps := pingH.Summary()
	res.PingLoaded = &ps
	close(errs)
	if err := <-errs; err != nil {
		return err
	}
	elapsed := min(clk.now(), end) - measureFrom
	var acq, cyc, hand benchkit.Hist
	for i := range stats {
		st := &stats[i]
		acq.Merge(&st.acq)
		cyc.Merge(&st.cycle)
		hand.Merge(&st.handoff)
		res.Cycles += st.cycles
		res.TimedOut += st.timedOut
		res.Busy += st.busy
		res.NotHeld += st.notHeld
	}
	res.Seconds = elapsed.Seconds()
	if res.Seconds > 0 {
		res.CyclesPerSec = float64(res.Cycles) / res.Seconds
	}
	a, c := acq.Summary(), cyc.Summary()
	res.Acquire, res.Cycle = &a, &c
	if contended {
		h := hand.Summary()
		res.Handoff = &h
	}
	return nil
}

// runHold acquires o.locks distinct keys (lease 250 s, wait 0), each client
// keeping o.window ACQUIREs in flight, then measures the server's memory.
func runHold(o *options, conns []*muxConn, clk *clock, srv *server.Server, res *result, stop *atomic.Bool) error {
	hr := &holdResult{Requested: o.locks}
	res.Hold = hr
	readRSS := func() (rss, peak int64, err error) { return procRSS("self") }
	hr.RSSSource = "in-process: /proc/self/status (bench client and server together)"
	if len(o.addrs) > 0 {
		if o.serverPID == 0 {
			hr.RSSSource = "none (pass --server-pid to read the server's RSS)"
			readRSS = func() (int64, int64, error) { return 0, 0, nil }
		} else {
			pid := strconv.Itoa(o.serverPID)
			hr.RSSSource = "/proc/" + pid + "/status"
			readRSS = func() (int64, int64, error) { return procRSS(pid) }
		}
	}
	var ms runtime.MemStats
	if srv != nil {
		runtime.GC()
		debug.FreeOSMemory()
		runtime.ReadMemStats(&ms)
		hr.HeapBeforeBytes = ms.HeapInuse
	}
	var err error
	if hr.RSSBeforeBytes, _, err = readRSS(); err != nil {
		return err
	}

	id := runID()
	var granted, busy atomic.Uint64
	errs := make(chan error, o.clients)
	var wg sync.WaitGroup
	t0 := clk.now()
	for i := range o.clients {
		share := o.locks / o.clients
		if i < o.locks%o.clients {
			share++
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := conns[i%len(conns)]
			owner := newOwner()
			ch := make(chan reply, o.window)
			inflight, next := 0, 0
			var g, b uint64
			defer func() { granted.Add(g); busy.Add(b) }()
			keyBuf := make([]byte, 0, 48)
			for next < share || inflight > 0 {
				for inflight < o.window && next < share && !stop.Load() {
					keyBuf = fmt.Appendf(keyBuf[:0], "hold-%s-%d-%d", id, i, next)
					req := wire.Request{Type: wire.TypeAcquire, Owner: owner, WaitS: 0, LeaseS: wire.MaxLeaseS, Key: keyBuf}
					if err := c.send(&req, ch); err != nil {
						errs <- err
						return
					}
					inflight++
					next++
				}
				if inflight == 0 {
					return
				}
				r := <-ch
				inflight--
				if r.err != nil {
					errs <- r.err
					return
				}
				switch r.typ {
				case wire.TypeGranted:
					g++
				case wire.TypeBusy:
					b++
				default:
					errs <- fmt.Errorf("ACQUIRE answered with %q", r.typ)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		return err
	}
	hr.Seconds = clk.since(t0).Seconds()
	hr.Granted, hr.Busy = granted.Load(), busy.Load()
	if hr.Seconds > 0 {
		hr.AcquiresPerSec = float64(hr.Granted+hr.Busy) / hr.Seconds
	}
	res.Cycles, res.Busy = hr.Granted, hr.Busy
	res.Seconds, res.CyclesPerSec = hr.Seconds, hr.AcquiresPerSec
	if srv != nil {
		hr.ServerHeld = srv.Stats().HeldLocks
		runtime.GC()
		runtime.ReadMemStats(&ms)
		hr.HeapAfterBytes = ms.HeapInuse
		if hr.Granted > 0 {
			hr.HeapPerLock = float64(int64(hr.HeapAfterBytes)-int64(hr.HeapBeforeBytes)) / float64(hr.Granted)
		}
	}
	if hr.RSSAfterBytes, hr.RSSPeakBytes, err = readRSS(); err != nil {
		return err
	}
	if hr.Granted > 0 && hr.RSSAfterBytes > 0 {
		hr.RSSPerLock = float64(hr.RSSAfterBytes-hr.RSSBeforeBytes) / float64(hr.Granted)
	}
	return nil
}

// procRSS reads VmRSS and VmHWM of /proc/<pid>/status, in bytes.
func procRSS(pid string) (rss, peak int64, err error) {
	f, err := os.Open("/proc/" + pid + "/status")
	if err != nil {
		return 0, 0, fmt.Errorf("read RSS: %w", err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		for _, k := range []struct {
			name string
			dst  *int64
		}{{"VmRSS:", &rss}, {"VmHWM:", &peak}} {
			if strings.HasPrefix(line, k.name) {
				fields := strings.Fields(line[len(k.name):])
				if len(fields) > 0 {
					kb, _ := strconv.ParseInt(fields[0], 10, 64)
					*k.dst = kb * 1024
				}
			}
		}
	}
	return rss, peak, sc.Err()
}

func printHuman(w io.Writer, r *result) {
	where := r.Addr
	if r.InProcess {
		where = "in-process server on " + r.Addr
	}
	if len(r.Addrs) > 1 {
		where = fmt.Sprintf("%s (the serving node of %s)", r.Addr, strings.Join(r.Addrs, ","))
	}
	if r.TLS {
		where += " over TLS"
	}
	fmt.Fprintf(w, "mode %s: %d clients over %d sessions, %s, GOMAXPROCS %d\n", r.Mode, r.Clients, r.Conns, where, r.GOMAXPROCS)
	if r.Hold != nil {
		h := r.Hold
		fmt.Fprintf(w, "  acquired %d of %d locks (%d busy) in %.2f s: %.0f acquires/s\n",
			h.Granted, h.Requested, h.Busy, h.Seconds, h.AcquiresPerSec)
		if h.ServerHeld > 0 {
			fmt.Fprintf(w, "  server reports %d held locks\n", h.ServerHeld)
		}
		fmt.Fprintf(w, "  RSS %s: before %.1f MB, after %.1f MB (peak %.1f MB): %.0f bytes per lock\n",
			h.RSSSource, mb(h.RSSBeforeBytes), mb(h.RSSAfterBytes), mb(h.RSSPeakBytes), h.RSSPerLock)
		if h.HeapAfterBytes > 0 {
			fmt.Fprintf(w, "  Go heap in use: before %.1f MB, after %.1f MB: %.0f bytes per lock\n",
				mb(int64(h.HeapBeforeBytes)), mb(int64(h.HeapAfterBytes)), h.HeapPerLock)
		}
		r.PingRTT.WriteLine(w, "ping RTT")
		r.Host.WriteLine(w)
		return
	}
	fmt.Fprintf(w, "  %d cycles in %.2f s: %.0f cycles/s (acquire+release)", r.Cycles, r.Seconds, r.CyclesPerSec)
	if r.TargetRate > 0 {
		fmt.Fprintf(w, ", target %.0f/s", r.TargetRate)
	}
	fmt.Fprintln(w)
	r.Acquire.WriteLine(w, "acquire")
	r.Cycle.WriteLine(w, "acquire+release")
	r.Handoff.WriteLine(w, "hand-off")
	r.PingRTT.WriteLine(w, "ping RTT idle")
	r.PingLoaded.WriteLine(w, "ping RTT loaded")
	if r.TimedOut+r.Busy+r.NotHeld > 0 {
		fmt.Fprintf(w, "  timed out %d, busy %d, not held %d\n", r.TimedOut, r.Busy, r.NotHeld)
	}
	r.Host.WriteLine(w)
}

func mb(b int64) float64 { return float64(b) / (1 << 20) }
