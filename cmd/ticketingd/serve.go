package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
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
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/spf13/cobra"

	"github.com/ticketing-dev/ticketing/server"
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

	// The data dir must be a directory; say so with its path rather than
	// leaving it to whatever the token store reports.
	if st, err := os.Stat(o.DataDir); err == nil && !st.IsDir() {
		return runtimef("data dir %s: not a directory", o.DataDir)
	}

	checkFileLimit(log, o.MaxSessions)

	reg := prometheus.NewRegistry()
	reg.MustRegister(
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
	)

	srv, err := server.New(server.Config{
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
	})
	if err != nil {
		return &runtimeError{err} // names the data dir or file itself
	}
	if o.InitialToken != 0 {
		if st := srv.Stats(); st.LastToken > o.InitialToken {
			log.Warn("initial-token is below the stored token ceiling and is ignored: tokens never go back",
				"initial_token", o.InitialToken, "continuing_above", st.LastToken)
		} else {
			log.Info("tokens continue above initial-token", "initial_token", o.InitialToken)
		}
	}

	ln, err := net.Listen("tcp", o.Listen)
	if err != nil {
		_ = srv.Close()
		return runtimef("--listen: %w", err)
	}

	var (
		shuttingDown atomic.Bool
		wg           sync.WaitGroup
		adminSrv     *http.Server
	)
	if o.AdminListen != "" {
		aln, err := net.Listen("tcp", o.AdminListen)
		if err != nil {
			_ = ln.Close()
			_ = srv.Close()
			return runtimef("--admin-listen: %w", err)
		}
		adminSrv = &http.Server{
			Handler:           adminHandler(srv, reg, &shuttingDown),
			ReadHeaderTimeout: 10 * time.Second,
			ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := adminSrv.Serve(aln); err != nil && !errors.Is(err, http.ErrServerClosed) {
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
	log.Info("listening", "addr", ln.Addr().String(), "data_dir", o.DataDir,
		"tls", tlsConf != nil, "client_cert_required", o.TLSClientCA != "",
		"client_tokens", len(tokens), "standby", o.Standby, "version", version)

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

// fdReserve is the file descriptors needed besides sessions: listeners,
// the data directory, logs, connections before HELLO and the admin server.
const fdReserve = 64

// checkFileLimit warns when the open-file limit cannot hold max-sessions
// sessions: past it, accept fails (EMFILE) and further clients wait in the
// listen backlog with no answer instead of getting E(7).
func checkFileLimit(log *slog.Logger, maxSessions int) {
	if maxSessions == 0 {
		maxSessions = server.DefaultMaxSessions
	}
	lim, ok := openFileLimit()
	if !ok || lim >= uint64(maxSessions)+fdReserve {
		return
	}
	log.Warn("open-file limit is too low for max-sessions: clients beyond it will hang instead of getting E(7); raise it (ulimit -n, systemd LimitNOFILE=) or lower max-sessions",
		"nofile_limit", lim, "max_sessions", maxSessions, "needed", uint64(maxSessions)+fdReserve)
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

// adminHandler serves /metrics, /healthz and /status.
func adminHandler(srv *server.Server, reg *prometheus.Registry, shuttingDown *atomic.Bool) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		if shuttingDown.Load() {
			w.WriteHeader(http.StatusServiceUnavailable)
			io.WriteString(w, "shutting down\n")
			return
		}
		if err := srv.TokenStoreErr(); err != nil {
			// No new token can be reserved: grants of free keys fail.
			w.WriteHeader(http.StatusServiceUnavailable)
			fmt.Fprintf(w, "token store: %v\n", err)
			return
		}
		io.WriteString(w, "ok\n")
	})
	mux.HandleFunc("GET /status", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		_ = enc.Encode(srv.Stats())
	})
	return mux
}
