package main

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"sync/atomic"
	"time"

	"github.com/spf13/cobra"

	"github.com/ticketing-dev/ticketing/server/admin"
	"github.com/ticketing-dev/ticketing/server/admin/console"
)

// defaultConsoleListen is 'ticketingd console's --listen.
const defaultConsoleListen = "127.0.0.1:9300"

// consoleOptions are the flags of 'ticketingd console'.
type consoleOptions struct {
	Listen    string
	Token     string
	LogFormat string
}

func newConsoleCmd(stderr io.Writer) *cobra.Command {
	var o consoleOptions
	cmd := &cobra.Command{
		Use:   "console [--listen ADDR] [--admin-token TOKEN]",
		Short: "Serve the web console without a server: the deployment page, for planning before any server exists",
		Long: `Serve the web console on its own, with no lock server behind it: the
page says "no server: planning only" and links to the deployment page
(/deploy). A running server has the same console, live, on its admin
listener (serve --admin-listen).

On a non-loopback address the console needs an admin token (--admin-token,
or else the environment variable ` + adminTokenEnv + `), which a browser
sends as the password of the login it asks for (any user name), and a
script as 'Authorization: Bearer TOKEN'; without one it refuses to start.
It stops on SIGINT or SIGTERM.`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if !cmd.Flags().Changed("admin-token") {
				o.Token = os.Getenv(adminTokenEnv)
			}
			return runConsole(cmd.Context(), &o, stderr)
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.Listen, "listen", defaultConsoleListen, "HTTP `address` to serve the console on")
	f.StringVar(&o.Token, "admin-token", "", "require this admin `TOKEN` (Bearer, or a browser's Basic password); needed off loopback (default $"+adminTokenEnv+")")
	f.StringVar(&o.LogFormat, "log-format", "text", "log format: text or json")
	return cmd
}

// runConsole serves the planning console until ctx is done.
func runConsole(ctx context.Context, o *consoleOptions, stderr io.Writer) error {
	if o.LogFormat != "text" && o.LogFormat != "json" {
		return usagef("invalid --log-format %q: want text or json", o.LogFormat)
	}
	if len(o.Token) > maxAdminTokenLen {
		return usagef("--admin-token is longer than %d bytes", maxAdminTokenLen)
	}
	if !validAdminToken(o.Token) {
		return usagef("invalid --admin-token: want printable ASCII without blanks")
	}
	log := slog.New(slog.NewTextHandler(stderr, nil))
	if o.LogFormat == "json" {
		log = slog.New(slog.NewJSONHandler(stderr, nil))
	}
	ln, err := net.Listen("tcp", o.Listen)
	if err != nil {
		return runtimef("--listen: %w", err)
	}
	if o.Token == "" && !isLoopback(ln.Addr()) {
		_ = ln.Close()
		return usagef("--listen %s is not a loopback address: the console off loopback needs an admin token (--admin-token or %s), or listen on 127.0.0.1", o.Listen, adminTokenEnv)
	}
	var shuttingDown atomic.Bool
	build := readBuildInfo()
	var h http.Handler = console.New(console.Options{
		Version:      build.Version,
		Revision:     build.Revision,
		ShuttingDown: shuttingDown.Load,
		LoopbackOnly: o.Token == "",
		Logger:       log,
	})
	if o.Token != "" {
		h = admin.RequireToken(o.Token, h)
	}
	hs := newAdminServer(h, adminReadHeaderTimeout, log)
	served := make(chan error, 1)
	go func() { served <- hs.Serve(admin.LimitListener(ln, admin.ConnLimits{Logger: log})) }()
	log.Info("console listening", "addr", ln.Addr().String(), "url", "http://"+ln.Addr().String()+"/",
		"admin_token", o.Token != "", "version", build.Version)
	select {
	case err := <-served:
		return runtimef("console: %w", err)
	case <-ctx.Done():
	}
	shuttingDown.Store(true)
	sctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if err := hs.Shutdown(sctx); err != nil {
		_ = hs.Close()
	}
	if err := <-served; err != nil && !errors.Is(err, http.ErrServerClosed) {
		return runtimef("console: %w", err)
	}
	log.Info("console stopped")
	return nil
}
