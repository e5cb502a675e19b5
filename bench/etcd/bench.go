package main

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"runtime"
	"strings"
	"time"

	"go.etcd.io/etcd/api/v3/version"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
	"go.uber.org/zap"

	"github.com/ticketing-dev/ticketing/internal/benchkit"
)

type options struct {
	mode         string
	clients      int
	conns        int
	members      int
	endpoints    []string
	allEndpoints bool
	duration     time.Duration
	warmup       time.Duration
	lease        time.Duration
	jsonOut      bool
	tls          bool   // the started members serve clients and peers over TLS
	tlsCA        string // the CA file of --endpoints' TLS
}

func parseFlags(args []string, stderr io.Writer) (*options, error) {
	o := &options{}
	var endpoints string
	fs := flag.NewFlagSet("etcd-bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&o.mode, "mode", "uncontended", "uncontended (a key per client) or contended (one key)")
	fs.IntVar(&o.clients, "clients", 64, "concurrent clients, each with its own concurrency.Session")
	fs.IntVar(&o.conns, "conns", 2, "clientv3 clients (gRPC connections) the clients' sessions are spread over")
	fs.IntVar(&o.members, "members", 3, "members of the etcd cluster the tool starts (1 or 3)")
	fs.StringVar(&endpoints, "endpoints", "", "comma-separated client `URLs` of a running etcd cluster; empty starts one (--members)")
	fs.BoolVar(&o.allEndpoints, "all-endpoints", false, "give the clients every member's URL (default: the leader's only)")
	fs.DurationVar(&o.duration, "duration", 10*time.Second, "measured run time")
	fs.DurationVar(&o.warmup, "warmup", 500*time.Millisecond, "unmeasured run time before --duration")
	fs.DurationVar(&o.lease, "lease", 30*time.Second, "TTL of each client's session lease (whole seconds)")
	fs.BoolVar(&o.jsonOut, "json", false, "print the result as JSON")
	fs.BoolVar(&o.tls, "tls", false, "the started members serve clients over TLS and each other over mutual TLS, with certificates of a CA the tool makes (as a bundle of 'ticketingd init --cluster' does); the clients verify the members against it")
	fs.StringVar(&o.tlsCA, "tls-ca", "", "with --endpoints: speak TLS to them, verifying them against the CA certificates in this PEM `file`")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	switch o.mode {
	case "uncontended", "contended":
	default:
		return nil, fmt.Errorf("invalid --mode %q: want uncontended or contended", o.mode)
	}
	if o.clients < 1 || o.conns < 1 {
		return nil, fmt.Errorf("--clients and --conns must be >= 1")
	}
	o.conns = min(o.conns, o.clients)
	if o.members != 1 && o.members != 3 {
		return nil, fmt.Errorf("invalid --members %d: want 1 or 3", o.members)
	}
	if endpoints != "" {
		for _, e := range strings.Split(endpoints, ",") {
			if e = strings.TrimSpace(e); e == "" {
				return nil, fmt.Errorf("empty URL in --endpoints %q", endpoints)
			}
			o.endpoints = append(o.endpoints, e)
		}
	}
	if o.tls && len(o.endpoints) > 0 {
		return nil, fmt.Errorf("--tls is for the members the tool starts; with --endpoints give --tls-ca")
	}
	if o.tlsCA != "" && len(o.endpoints) == 0 {
		return nil, fmt.Errorf("--tls-ca needs --endpoints (the started members' TLS is --tls)")
	}
	if o.duration <= 0 || o.warmup < 0 {
		return nil, fmt.Errorf("--duration must be > 0 and --warmup >= 0")
	}
	if o.lease < time.Second || o.lease%time.Second != 0 {
		return nil, fmt.Errorf("invalid --lease %v: whole seconds, at least 1 s", o.lease)
	}
	return o, nil
}

// result is what one run reports; it is also the --json output. The
// fields shared with ticketing-bench have its names.
type result struct {
	Mode         string                   `json:"mode"`
	Addr         string                   `json:"addr"`    // the endpoints the clients used
	Members      int                      `json:"members"` // of the cluster the tool started; 0 with --endpoints
	Etcd         string                   `json:"etcd"`    // the etcd version the tool was built with
	Fsync        bool                     `json:"fsync"`   // the started members fsync (always, unless --endpoints)
	TLS          bool                     `json:"tls"`     // clients speak TLS (and started members mutual TLS to each other)
	Clients      int                      `json:"clients"` // each with its own session
	Conns        int                      `json:"conns"`   // clientv3 clients
	GOMAXPROCS   int                      `json:"gomaxprocs"`
	Seconds      float64                  `json:"seconds"`
	Cycles       uint64                   `json:"cycles"`
	CyclesPerSec float64                  `json:"cycles_per_sec"`
	Acquire      *benchkit.LatencySummary `json:"acquire,omitempty"`
	Cycle        *benchkit.LatencySummary `json:"acquire_release,omitempty"`
	Handoff      *benchkit.LatencySummary `json:"handoff,omitempty"`
	Host         *benchkit.HostLoad       `json:"host,omitempty"`
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	o, err := parseFlags(args, stderr)
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		fmt.Fprintf(stderr, "etcd-bench: %v\n", err)
		return 2
	}
	res, err := bench(ctx, o, stderr)
	if err != nil {
		fmt.Fprintf(stderr, "etcd-bench: %v\n", err)
		return 1
	}
	if err := benchkit.Report(stdout, o.jsonOut, res, printHuman); err != nil {
		fmt.Fprintf(stderr, "etcd-bench: writing the result: %v\n", err)
		return 1
	}
	return 0
}

func bench(ctx context.Context, o *options, stderr io.Writer) (*result, error) {
	res := &result{Mode: o.mode, Etcd: version.Version, Clients: o.clients, Conns: o.conns, GOMAXPROCS: runtime.GOMAXPROCS(0)}
	endpoints := o.endpoints
	var roots *x509.CertPool // the CA the clients verify the members against; nil: plain TCP
	if o.tlsCA != "" {
		pem, err := os.ReadFile(o.tlsCA)
		if err != nil {
			return nil, fmt.Errorf("--tls-ca: %w", err)
		}
		roots = x509.NewCertPool()
		if !roots.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("--tls-ca %s: no PEM certificate in it", o.tlsCA)
		}
	}
	if len(endpoints) == 0 {
		c, err := startCluster(ctx, o.members, o.tls, stderr, time.Minute)
		if err != nil {
			return nil, err
		}
		defer c.stop()
		endpoints = c.clientURL
		res.Members, res.Fsync = o.members, true
		roots = c.ca
	}
	var tlsConf *tls.Config
	if roots != nil {
		tlsConf = &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12}
	}
	res.TLS = tlsConf != nil
	if !o.allEndpoints {
		leader, err := findLeader(ctx, endpoints, tlsConf)
		if err != nil {
			return nil, err
		}
		endpoints = []string{leader}
	}
	res.Addr = strings.Join(endpoints, ",")

	clis := make([]*clientv3.Client, 0, o.conns)
	defer func() {
		for _, c := range clis {
			_ = c.Close()
		}
	}()
	for range o.conns {
		c, err := newClient(ctx, endpoints, tlsConf)
		if err != nil {
			return nil, err
		}
		clis = append(clis, c)
	}
	sessions := make([]*concurrency.Session, 0, o.clients)
	defer func() {
		// Close revokes each lease: no key is left behind.
		for _, s := range sessions {
			_ = s.Close()
		}
	}()
	for i := range o.clients {
		s, err := concurrency.NewSession(clis[i%len(clis)], concurrency.WithTTL(int(o.lease/time.Second)), concurrency.WithContext(ctx))
		if err != nil {
			return nil, fmt.Errorf("session: %w", err)
		}
		sessions = append(sessions, s)
	}

	endHost := benchkit.StartHostLoad()
	if err := runCycles(ctx, o, sessions, res); err != nil {
		return nil, err
	}
	res.Host = endHost()
	return res, nil
}

// newClient makes a clientv3 client of endpoints; TLS if tlsConf is not
// nil (each client its own copy: clientv3 may set ServerName on it).
func newClient(ctx context.Context, endpoints []string, tlsConf *tls.Config) (*clientv3.Client, error) {
	cfg := clientv3.Config{Endpoints: endpoints, DialTimeout: 5 * time.Second, Logger: zap.NewNop(), Context: ctx}
	if tlsConf != nil {
		cfg.TLS = tlsConf.Clone()
	}
	c, err := clientv3.New(cfg)
	if err != nil {
		return nil, fmt.Errorf("etcd client: %w", err)
	}
	return c, nil
}

// findLeader returns the client URL of the cluster's leader, asking every
// member (an election may still be going on: it asks again for up to 30 s).
func findLeader(ctx context.Context, endpoints []string, tlsConf *tls.Config) (string, error) {
	c, err := newClient(ctx, endpoints, tlsConf)
	if err != nil {
		return "", err
	}
	defer c.Close()
	deadline := time.Now().Add(30 * time.Second)
	for {
		var errs []error
		for _, ep := range endpoints {
			sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			st, err := c.Status(sctx, ep)
			cancel()
			if err != nil {
				errs = append(errs, fmt.Errorf("%s: %w", ep, err))
				continue
			}
			if st.Leader != 0 && st.Leader == st.Header.MemberId {
				return ep, nil
			}
		}
		if time.Now().After(deadline) {
			return "", fmt.Errorf("no etcd leader among %s: %w", strings.Join(endpoints, ","), errors.Join(errs...))
		}
		select {
		case <-ctx.Done():
			return "", ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// mutexClient is one client of the workload: a concurrency.Mutex of its
// own session, made on its first Acquire (its key is the workload's).
type mutexClient struct {
	ctx       context.Context
	s         *concurrency.Session
	m         *concurrency.Mutex
	contended bool
}

func (c *mutexClient) Acquire(key string) error {
	if c.m == nil {
		c.m = concurrency.NewMutex(c.s, key)
	}
	lctx, cancel := c.ctx, context.CancelFunc(func() {})
	if c.contended {
		lctx, cancel = context.WithTimeout(c.ctx, 60*time.Second) // ticketing-bench's wait_s
	}
	err := c.m.Lock(lctx)
	cancel()
	if err != nil {
		return fmt.Errorf("Lock: %w", err)
	}
	return nil
}

func (c *mutexClient) Release() error {
	if err := c.m.Unlock(context.WithoutCancel(c.ctx)); err != nil {
		return fmt.Errorf("Unlock: %w", err)
	}
	return nil
}

// runCycles runs the workload through benchkit.RunCycles: each client
// loops Lock, then Unlock, on its own key (uncontended) or on the shared
// one (contended).
func runCycles(ctx context.Context, o *options, sessions []*concurrency.Session, res *result) error {
	var b [4]byte
	_, _ = rand.Read(b[:])
	id := hex.EncodeToString(b[:])
	w := benchkit.Cycles{
		Contended: o.mode == "contended",
		Warmup:    o.warmup,
		Duration:  o.duration,
		Key:       func(i int) string { return fmt.Sprintf("/bench-%s-%d", id, i) },
	}
	if w.Contended {
		w.Key = func(int) string { return "/bench-" + id + "-hot" }
	}
	clients := make([]benchkit.CycleClient, len(sessions))
	for i, s := range sessions {
		clients[i] = &mutexClient{ctx: ctx, s: s, contended: w.Contended}
	}
	cr, err := benchkit.RunCycles(ctx, w, clients)
	if err != nil {
		return err
	}
	res.Seconds, res.Cycles, res.CyclesPerSec = cr.Seconds, cr.Cycles, cr.CyclesPerSec
	res.Acquire, res.Cycle, res.Handoff = cr.Acquire, cr.Cycle, cr.Handoff
	return nil
}

// printHuman prints r in ticketing-bench's format.
func printHuman(w io.Writer, r *result) {
	where := "etcd " + r.Etcd + " at " + r.Addr
	if r.Members > 0 {
		tlsNote := ""
		if r.TLS {
			tlsNote = ", mutual TLS between them, TLS from the clients"
		}
		where = fmt.Sprintf("%d-member etcd %s (member subprocesses, fsync on%s), clients to %s", r.Members, r.Etcd, tlsNote, r.Addr)
	}
	fmt.Fprintf(w, "mode %s: %d clients (a session each) over %d connections, %s, GOMAXPROCS %d\n", r.Mode, r.Clients, r.Conns, where, r.GOMAXPROCS)
	fmt.Fprintf(w, "  %d cycles in %.2f s: %.0f cycles/s (acquire+release)\n", r.Cycles, r.Seconds, r.CyclesPerSec)
	r.Acquire.WriteLine(w, "acquire")
	r.Cycle.WriteLine(w, "acquire+release")
	r.Handoff.WriteLine(w, "hand-off")
	r.Host.WriteLine(w)
}
