package main

import (
	"cmp"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/spf13/cobra"

	"github.com/ticketing-dev/ticketing/server"
	"github.com/ticketing-dev/ticketing/server/admin"
)

func newServeCmd(stderr io.Writer) *cobra.Command {
	var o serveOptions
	cmd := &cobra.Command{
		Use:   "serve",
		Short: "Run the lock server until SIGTERM or SIGINT",
		Long: `Run the lock server until SIGTERM or SIGINT, then shut down gracefully:
stop accepting, tell sessions the server is shutting down (E 5), wait up to
--shutdown-timeout for them to close, persist the token store, exit 0.

Settings come from flags and from --config FILE, a YAML file whose keys are
the flag names without dashes in front (listen:, data-dir:, client-token: [..],
max-locks: ...). A flag given on the command line overrides the file. Relative
paths in the file are relative to the file's directory.

With --cluster the server is a node of a Raft cluster (--node-id,
--raft-listen, --peers, --peer-tls-*; 'ticketingd init --cluster' writes a
config per node): only the leader serves, the others answer NOT_ACTIVE with
the leader's --advertise address. See docs/operations.md, "Cluster".

With --pair primary|backup the server is a node of a hot-standby pair (the
Binary Star pattern: --peer, --peer-listen, --heartbeat, --advertise,
--peer-tls-*; 'ticketingd init --pair' writes a config per node): the active
node serves, the passive one answers NOT_ACTIVE with the active's --advertise
address, and takes over when the active has missed two heartbeats and a
client comes to it. See docs/operations.md, "Hot-standby pair".

The server logs "listening" with addr=HOST:PORT once it accepts connections.`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := o.finish(cmd.Flags()); err != nil {
				return err
			}
			return serve(cmd.Context(), &o, stderr)
		},
	}
	o.register(cmd.Flags())
	cmd.Flags().SortFlags = false
	groupServeFlags(cmd)
	return cmd
}

func newLogger(o *serveOptions, w io.Writer) *slog.Logger {
	lvl, _ := parseLevel(o.LogLevel)
	hopts := &slog.HandlerOptions{Level: lvl}
	if o.LogFormat == "json" {
		return slog.New(slog.NewJSONHandler(w, hopts))
	}
	return slog.New(slog.NewTextHandler(w, hopts))
}

// serve runs the server with validated options until ctx is done.
func serve(ctx context.Context, o *serveOptions, stderr io.Writer) error {
	log := newLogger(o, stderr)

	tokens := append([]string(nil), o.ClientTokens...)
	if o.ClientTokensFile != "" {
		ft, loose, err := readTokensFile(o.ClientTokensFile)
		if err != nil {
			return err
		}
		if loose != 0 {
			log.Warn("client tokens file is readable by group or others; chmod 600 it",
				"path", o.ClientTokensFile, "mode", fmt.Sprintf("%#o", loose))
		}
		tokens = append(tokens, ft...)
	}

	tlsConf, err := loadTLS(o)
	if err != nil {
		return err
	}
	pt, err := loadPeerTLS(o)
	if err != nil {
		return err
	}

	// The data dir must be a directory; say so with its path rather than
	// leaving it to whatever the token store reports.
	if st, err := os.Stat(o.DataDir); err == nil && !st.IsDir() {
		return runtimef("data dir %s: not a directory", o.DataDir)
	}

	checkFileLimit(log, o)

	// Listen before the token store is opened (which creates the data dir
	// and writes the ceiling): a start that fails here, a port in use say,
	// leaves the data dir as it found it.
	ln, err := net.Listen("tcp", o.Listen)
	if err != nil {
		return runtimef("--listen: %w", err)
	}
	var aln net.Listener
	if o.AdminListen != "" {
		if aln, err = net.Listen("tcp", o.AdminListen); err != nil {
			_ = ln.Close()
			return runtimef("--admin-listen: %w", err)
		}
	}
	if o.Cluster && aln != nil && o.AdminToken == "" && !isLoopback(aln.Addr()) {
		// The cluster endpoints change the membership: not for anyone who
		// can reach the port.
		_ = ln.Close()
		_ = aln.Close()
		return usagef("--admin-listen %s is not a loopback address: a cluster node's admin listener can add and remove nodes, so it needs --admin-token (or listen on 127.0.0.1)", o.AdminListen)
	}
	warnExposure(log, ln.Addr(), aln, len(tokens) > 0, tlsConf != nil, o.AdminToken != "")

	reg := prometheus.NewRegistry()
	reg.MustRegister(
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		newBuildInfoGauge(readBuildInfo()),
	)
	cfg := serverConfig(o, tokens, tlsConf, log, reg)
	switch {
	case o.Cluster:
		cfg.Cluster = clusterConfig(o, ln.Addr(), pt)
	case o.Pair != "":
		cfg.Pair = pairConfig(o, ln.Addr(), pt)
	}

	srv, err := server.New(cfg)
	if err != nil {
		_ = ln.Close()
		if aln != nil {
			_ = aln.Close()
		}
		return &runtimeError{err} // names the data dir or file itself
	}
	switch {
	case o.CommittedRelease:
		log.Warn("committed-release is deprecated and ignored: a RELEASE is answered once it is committed by default; remove the setting")
	case o.EarlyRelease:
		log.Warn("early-release: the leader answers a RELEASE before it is committed (a deviation from the protocol): a leader failure within that commit leaves the key held until its restarted lease ends, although its releaser was told R")
	}
	switch {
	case o.InitialToken != 0 && o.Cluster:
		// The counter is the log's, which this node may not have applied
		// yet: only its own takeover as leader raises it.
		log.Info("initial-token: when this node leads, it raises the token counter to it if the counter is below (tokens never go back); give it to every node",
			"initial_token", o.InitialToken)
	case o.InitialToken != 0 && o.Pair != "":
		log.Info("initial-token: when this node starts serving, its tokens continue above it (and above every token epoch it has used or seen); give it to both nodes",
			"initial_token", o.InitialToken)
	case o.InitialToken != 0:
		if st := srv.Stats(); st.LastToken > o.InitialToken {
			log.Warn("initial-token is below the stored token ceiling and is ignored: tokens never go back",
				"initial_token", o.InitialToken, "continuing_above", st.LastToken)
		} else {
			log.Info("tokens continue above initial-token", "initial_token", o.InitialToken)
		}
	}

	var (
		shuttingDown atomic.Bool
		wg           sync.WaitGroup
		adminSrv     *http.Server
	)
	if aln != nil {
		build := admin.BuildInfo(readBuildInfo())
		adminSrv = newAdminServer(admin.New(srv, admin.Options{
			Token:        o.AdminToken,
			Gatherer:     reg,
			Registerer:   reg,
			ShuttingDown: shuttingDown.Load,
			Build:        &build,
			Logger:       log,
			ConsoleKeys:  o.ConsoleKeys,
			AllowedHosts: adminAllowedHosts(o),
		}), o.AdminHeaderTimeout, log)
		// The budget first, so that every admin descriptor counts; loopback
		// may take its preferred units.
		limited := admin.LimitListener(srv.BudgetListener(aln, "admin"), admin.ConnLimits{
			MaxConns:          o.AdminMaxConns,
			MaxConnsPerSource: o.AdminMaxConnsPerSource,
			Logger:            log,
		})
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := adminSrv.Serve(limited); err != nil && !errors.Is(err, http.ErrServerClosed) {
				log.Error("admin listener failed", "err", err)
			}
		}()
		log.Info("admin listening", "addr", aln.Addr().String())
	}

	serveErr := make(chan error, 1)
	wg.Add(1)
	go func() {
		defer wg.Done()
		serveErr <- srv.Serve(ln)
	}()
	budget, budgetPref, _ := srv.ConnBudget()
	attrs := []any{"addr", ln.Addr().String(), "data_dir", o.DataDir,
		"tls", tlsConf != nil, "client_cert_required", o.TLSClientCA != "",
		"client_tokens", len(tokens), "standby", o.Standby,
		"conn_budget", budget, "conn_budget_preferred", budgetPref, "fd_reserve", cmp.Or(cfg.FDReserve, server.DefaultFDReserve),
		"version", readBuildInfo().Version, "revision", readBuildInfo().Revision}
	log.Info("listening", append(attrs, modeAttrs(&cfg)...)...)

	var result error
	select {
	case err := <-serveErr:
		// Serve stopped on its own: a listener failure.
		shuttingDown.Store(true)
		_ = srv.Close()
		result = runtimef("serve: %w", err)
	case <-ctx.Done():
		shuttingDown.Store(true)
		log.Info("shutting down", "timeout", o.ShutdownTimeout.String())
		sctx, cancel := context.WithTimeout(context.Background(), o.ShutdownTimeout)
		err := srv.Shutdown(sctx)
		cancel()
		switch {
		case err == nil:
		case errors.Is(err, context.DeadlineExceeded):
			log.Warn("graceful shutdown timed out; closing remaining sessions", "timeout", o.ShutdownTimeout.String())
			_ = srv.Close()
		default:
			_ = srv.Close()
			result = runtimef("shutdown: %w", err)
		}
		if err := <-serveErr; err != nil && !errors.Is(err, server.ErrServerClosed) && result == nil {
			result = runtimef("serve: %w", err)
		}
	}
	if adminSrv != nil {
		actx, cancel := context.WithTimeout(context.Background(), time.Second)
		if err := adminSrv.Shutdown(actx); err != nil {
			_ = adminSrv.Close()
		}
		cancel()
	}
	wg.Wait()
	st := srv.Stats()
	log.Info("stopped", "last_token", st.LastToken, "token_ceiling", st.TokenCeiling)
	return result
}

// modeAttrs are the attributes of the "listening" log line that name the
// settings of cfg's replicated mode, if any: no secrets (the peer TLS is
// only whether it is on).
func modeAttrs(cfg *server.Config) []any {
	var attrs []any
	if cc := cfg.Cluster; cc != nil {
		attrs = append(attrs, "cluster", true, "node_id", cc.NodeID, "raft_listen", cc.RaftListen,
			"raft_advertise", cc.RaftAdvertise, "advertise", cc.Advertise, "peer_tls", cc.PeerCertificate != nil)
		if len(cc.Peers) > 0 {
			attrs = append(attrs, "peers", peersString(cc.Peers))
		}
	}
	if pc := cfg.Pair; pc != nil {
		attrs = append(attrs, "pair", string(pc.Role), "peer", pc.Peer, "peer_listen", pc.Listen,
			"advertise", pc.Advertise, "heartbeat", pc.Heartbeat.String(), "peer_tls", pc.PeerCertificate != nil)
	}
	return attrs
}

// serverConfig maps validated options (and the client tokens, TLS config,
// logger and registry made from them) to the lock server's Config.
func serverConfig(o *serveOptions, tokens []string, tlsConf *tls.Config, log *slog.Logger, reg prometheus.Registerer) server.Config {
	return server.Config{
		DataDir:       o.DataDir,
		ClientTokens:  tokens,
		NodeName:      o.NodeName,
		Standby:       o.Standby,
		StandbyHint:   o.StandbyHint,
		MaxLocks:      o.MaxLocks,
		MaxWaiters:    o.MaxWaiters,
		MaxKeyWaiters: o.MaxKeyWaiters,
		MaxSessions:   o.MaxSessions,
		TLS:           tlsConf,
		Logger:        log,
		Registerer:    reg,
		TokenBlock:    o.TokenBlock,
		InitialToken:  o.InitialToken,
		TokenStart:    tokenStart(o.TokenStart),

		MaxSessionsPerPeer: o.MaxPerPeer,
		MaxPendingConns:    o.MaxPending,
		IdleTimeout:        idleTimeout(o.IdleTimeout),
		SocketBuffer:       socketBuffer(o.SocketBuffer),
		WriteTimeout:       o.WriteTimeout,
		OwnedReleaseOnly:   o.OwnedRelease,
		ConnBudget:         o.ConnBudget,
		FDReserve:          o.FDReserve,
	}
}

// tokenStart maps --token-start (checked: one or clock) to
// Config.TokenStart.
func tokenStart(s string) server.TokenStart {
	ts, _ := server.ParseTokenStart(s)
	return ts
}

// idleTimeout maps --idle-timeout (0: off) to Config.IdleTimeout (0:
// default, negative: off).
func idleTimeout(d time.Duration) time.Duration {
	if d == 0 {
		return -1
	}
	return d
}

// socketBuffer maps --socket-buffer (0: the operating system's defaults)
// to Config.SocketBuffer (0: default, negative: the operating system's).
func socketBuffer(n int) int {
	if n == 0 {
		return -1
	}
	return n
}

// warnExposure warns when the lock port is reachable from other hosts
// (not a loopback address: a wildcard address counts as reachable) without
// client tokens or without TLS, and when the admin port is without
// --admin-token.
func warnExposure(log *slog.Logger, addr net.Addr, admin net.Listener, tokens, tls, adminToken bool) {
	if !isLoopback(addr) {
		if !tokens {
			log.Warn("listening on a non-loopback address without client tokens: anyone who can reach it can take and release locks; set --client-tokens-file",
				"addr", addr.String())
		}
		if !tls {
			log.Warn("listening on a non-loopback address without TLS: client tokens and lock traffic cross the network in clear; set --tls-cert and --tls-key",
				"addr", addr.String())
		}
	}
	if admin != nil && !isLoopback(admin.Addr()) && !adminToken {
		log.Warn("admin listening on a non-loopback address: /metrics and /status have no authentication; set --admin-token, restrict it with a firewall or listen on 127.0.0.1",
			"addr", admin.Addr().String())
	}
}

func isLoopback(a net.Addr) bool {
	ta, ok := a.(*net.TCPAddr)
	return ok && ta.IP.IsLoopback()
}

// adminAllowedHosts are the Host names the admin listener answers without
// an admin token (admin.Options.AllowedHosts): --admin-allowed-host, and
// the hosts of the addresses this node is known by (IP addresses and
// localhost are always allowed).
func adminAllowedHosts(o *serveOptions) []string {
	hosts := append([]string(nil), o.AdminAllowedHosts...)
	for _, a := range []string{o.AdminListen, o.Listen, o.Advertise, o.RaftAdvertise} {
		if h, _, err := net.SplitHostPort(a); err == nil && h != "" {
			hosts = append(hosts, h)
		}
	}
	return hosts
}

// Admin HTTP server limits (adminReadHeaderTimeout is the default of
// --admin-header-timeout): a client that sends nothing, trickles its
// request or keeps an idle keep-alive connection is closed instead of
// holding a file descriptor the lock port may need. adminWriteTimeout is
// above admin.DefaultClusterChangeTimeout, so that the answer of a slow
// membership change still gets out.
const (
	adminReadHeaderTimeout = 5 * time.Second
	adminReadTimeout       = 10 * time.Second
	adminWriteTimeout      = 30 * time.Second
	adminIdleTimeout       = 2 * time.Second
	adminMaxHeaderBytes    = 16 << 10
)

func newAdminServer(h http.Handler, headerTimeout time.Duration, log *slog.Logger) *http.Server {
	return &http.Server{
		Handler:           h,
		ReadHeaderTimeout: headerTimeout,
		ReadTimeout:       max(adminReadTimeout, headerTimeout),
		WriteTimeout:      adminWriteTimeout,
		IdleTimeout:       adminIdleTimeout,
		MaxHeaderBytes:    adminMaxHeaderBytes,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
}

// fileNeed is the open files the settings of o may take at once: sessions,
// connections before HELLO, the admin listener's and a pair's peer
// listener's connections (each capped), and --fd-reserve. It returns the
// effective max-sessions and max-pending-conns too.
func fileNeed(o *serveOptions) (need uint64, maxSessions, maxPending int) {
	maxSessions, maxPending = o.MaxSessions, o.MaxPending
	if maxSessions == 0 {
		maxSessions = server.DefaultMaxSessions
	}
	if maxPending == 0 {
		maxPending = max(maxSessions/10, 64) // server.Config's default
	}
	reserve := o.FDReserve
	if reserve == 0 {
		reserve = server.DefaultFDReserve
	}
	need = uint64(maxSessions) + uint64(maxPending) + uint64(reserve)
	if o.AdminListen != "" {
		adminConns := o.AdminMaxConns
		if adminConns == 0 {
			adminConns = admin.DefaultMaxConns
		}
		need += uint64(adminConns) + 2*admin.DefaultLoopbackConns // 127.0.0.1 and ::1
	}
	if o.Pair != "" {
		need += pairPeerConnsNeed(o)
	}
	return need, maxSessions, maxPending
}

// checkFileLimit warns when the open-file limit cannot hold what fileNeed
// counts: the connection budget (the limit minus --fd-reserve) then runs
// out before the caps do, and connections beyond it, clients' too, are
// closed at accept instead of getting E(7). The token store and the Raft
// log keep their descriptors either way.
func checkFileLimit(log *slog.Logger, o *serveOptions) {
	if o.ConnBudget != 0 {
		return // set by hand: the operator sized it
	}
	need, maxSessions, maxPending := fileNeed(o)
	lim, ok := server.OpenFileLimit()
	if !ok || lim >= need {
		return
	}
	log.Warn("open-file limit is too low for max-sessions: connections beyond the connection budget (the limit minus fd-reserve) are closed at accept, clients' too, instead of getting E(7); raise it (ulimit -n, systemd LimitNOFILE=) or lower max-sessions",
		"nofile_limit", lim, "max_sessions", maxSessions, "max_pending_conns", maxPending, "needed", need,
		"counted", "max-sessions, max-pending-conns, admin-max-conns and peer-max-conns (with their reserved slots), and fd-reserve for files, listeners and outbound connections")
}

// aeadSuites are the TLS 1.2 cipher suites the lock port accepts: ECDHE
// with AES-GCM or ChaCha20-Poly1305.
var aeadSuites = []uint16{
	tls.TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256,
	tls.TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256,
	tls.TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384,
	tls.TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384,
	tls.TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256,
	tls.TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256,
}

func loadTLS(o *serveOptions) (*tls.Config, error) {
	if o.TLSCert == "" {
		return nil, nil
	}
	cert, err := tls.LoadX509KeyPair(o.TLSCert, o.TLSKey)
	if err != nil {
		return nil, runtimef("--tls-cert %s / --tls-key %s: %w", o.TLSCert, o.TLSKey, err)
	}
	conf := &tls.Config{
		Certificates: []tls.Certificate{cert},
		MinVersion:   tls.VersionTLS12,
		// For TLS 1.2, forward-secret AEAD suites only (no CBC, no RSA key
		// exchange); TLS 1.3's suites are all AEAD and not configurable.
		CipherSuites: aeadSuites,
	}
	if o.TLSClientCA != "" {
		pem, err := os.ReadFile(o.TLSClientCA)
		if err != nil {
			return nil, runtimef("--tls-client-ca: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, runtimef("--tls-client-ca %s: no PEM certificates found", o.TLSClientCA)
		}
		conf.ClientCAs = pool
		conf.ClientAuth = tls.RequireAndVerifyClientCert
	}
	return conf, nil
}
