package main

import (
	"crypto/rand"
	"encoding/base64"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/ticketing-dev/ticketing/internal/pki"
)

// Names of the files 'ticketingd init' writes into its directory.
const (
	initConfigFile = "ticketingd.yaml"
	initTokensFile = "client-tokens"
	initDataDir    = "data"
	initCACert     = "ca.pem"
	initCAKey      = "ca-key.pem"
	initServerCert = "server.pem"
	initServerKey  = "server-key.pem"
)

type initOptions struct {
	Dir    string
	Hosts  []string
	TLS    bool
	Force  bool
	Listen string
}

func newInitCmd(stdout io.Writer) *cobra.Command {
	var o initOptions
	cmd := &cobra.Command{
		Use:   "init --dir DIR [--host NAME ...] [--tls]",
		Short: "Write a ready deployment: config file, client token, and optionally a TLS CA and server certificate",
		Long: `Write a ready deployment into DIR:

  ticketingd.yaml    config file for 'ticketingd serve --config'
  client-tokens      one random client token (mode 0600); printed once
  data/              the data directory (token store)
  ca.pem, ca-key.pem           with --tls: a private CA (ECDSA P-256)
  server.pem, server-key.pem   with --tls: a server certificate for --host

Hosts that parse as IP addresses become IP SANs, others DNS SANs; the default
hosts are 127.0.0.1 and localhost. init refuses to overwrite an existing
deployment unless --force is given.`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if o.Dir == "" {
				return usagef("--dir is required")
			}
			for _, h := range o.Hosts {
				if h == "" || strings.ContainsAny(h, " \t/") {
					return usagef("invalid --host %q", h)
				}
			}
			if _, _, err := net.SplitHostPort(o.Listen); err != nil {
				return usagef("invalid --listen %q: %v", o.Listen, err)
			}
			return initDeployment(&o, stdout)
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.Dir, "dir", "", "`directory` to write the deployment into (created if missing)")
	f.StringArrayVar(&o.Hosts, "host", nil, "host `name` or IP clients use: the server certificate's names with --tls (repeatable; default 127.0.0.1 and localhost)")
	f.BoolVar(&o.TLS, "tls", false, "also create a private CA and a server certificate")
	f.BoolVar(&o.Force, "force", false, "overwrite an existing deployment in --dir")
	f.StringVar(&o.Listen, "listen", defaultListen, "listen `address` to put into the config file")
	return cmd
}

func initDeployment(o *initOptions, stdout io.Writer) error {
	dir := o.Dir
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return runtimef("--dir: %w", err)
	}
	files := []string{initConfigFile, initTokensFile}
	if o.TLS {
		files = append(files, initCACert, initCAKey, initServerCert, initServerKey)
	}
	if !o.Force {
		for _, name := range []string{initConfigFile, initTokensFile, initCACert, initCAKey, initServerCert, initServerKey} {
			p := filepath.Join(dir, name)
			if _, err := os.Lstat(p); err == nil {
				return runtimef("%s already exists: %s holds a deployment; use --force to overwrite it", p, dir)
			}
		}
	}

	var raw [32]byte
	if _, err := rand.Read(raw[:]); err != nil {
		return runtimef("random token: %w", err)
	}
	token := base64.RawURLEncoding.EncodeToString(raw[:])

	if err := os.MkdirAll(filepath.Join(dir, initDataDir), 0o700); err != nil {
		return runtimef("data dir: %w", err)
	}
	tokensBody := "# Client tokens accepted by ticketingd: one per line, # starts a comment.\n" +
		"# Keep this file mode 0600. Add a token here to rotate, restart, then remove the old one.\n" +
		token + "\n"
	if err := writeFile(filepath.Join(dir, initTokensFile), []byte(tokensBody), 0o600); err != nil {
		return err
	}

	hosts := o.Hosts
	if len(hosts) == 0 {
		hosts = []string{"127.0.0.1", "localhost"}
	}
	if o.TLS {
		if err := writeTLS(dir, hosts); err != nil {
			return err
		}
	}

	var cfg strings.Builder
	fmt.Fprintf(&cfg, "# ticketingd configuration, written by 'ticketingd init'.\n")
	fmt.Fprintf(&cfg, "# Keys are the flag names of 'ticketingd serve'; relative paths are relative to this file.\n")
	fmt.Fprintf(&cfg, "listen: %q\n", o.Listen)
	fmt.Fprintf(&cfg, "data-dir: %s\n", initDataDir)
	fmt.Fprintf(&cfg, "client-tokens-file: %s\n", initTokensFile)
	if o.TLS {
		fmt.Fprintf(&cfg, "tls-cert: %s\ntls-key: %s\n", initServerCert, initServerKey)
		fmt.Fprintf(&cfg, "# tls-client-ca: clients-ca.pem   # require client certificates\n")
	}
	fmt.Fprintf(&cfg, "# admin-listen: \"127.0.0.1:9225\"   # /metrics, /healthz, /status\n")
	fmt.Fprintf(&cfg, "log-level: info\nlog-format: text\n")
	fmt.Fprintf(&cfg, "shutdown-timeout: 10s\n")
	fmt.Fprintf(&cfg, "# max-locks: 2000000\n# max-waiters: 1000000\n# max-key-waiters: 10000\n# max-sessions: 10000\n")
	fmt.Fprintf(&cfg, "# max-sessions-per-peer: 2500\n# max-pending-conns: 1000\n# idle-timeout: 30s\n")
	fmt.Fprintf(&cfg, "# socket-buffer: 65536\n# write-timeout: 3s\n")
	cfgPath := filepath.Join(dir, initConfigFile)
	if err := writeFile(cfgPath, []byte(cfg.String()), 0o644); err != nil {
		return err
	}

	addr := o.Listen
	if host, port, err := net.SplitHostPort(o.Listen); err == nil && (host == "" || host == "0.0.0.0" || host == "::") {
		addr = net.JoinHostPort(hosts[0], port)
	}
	fmt.Fprintf(stdout, "Wrote a ticketingd deployment to %s (%s).\n\n", dir, strings.Join(files, ", "))
	fmt.Fprintf(stdout, "Client token (shown once; also in %s):\n\n    %s\n\n", filepath.Join(dir, initTokensFile), token)
	fmt.Fprintf(stdout, "Start the server:\n\n    ticketingd serve --config %s\n\n", cfgPath)
	fmt.Fprintf(stdout, "Connect from Go:\n\n")
	fmt.Fprintf(stdout, "    b, err := broker.New(broker.Config{\n")
	fmt.Fprintf(stdout, "        Addrs: []string{%q},\n", addr)
	fmt.Fprintf(stdout, "        Token: os.Getenv(\"TICKETING_TOKEN\"), // the token above\n")
	if o.TLS {
		caPath, _ := filepath.Abs(filepath.Join(dir, initCACert))
		fmt.Fprintf(stdout, "        TLS:   broker.TLSConfig{Mode: broker.TLSCAFile, CAFile: %q},\n", caPath)
	}
	fmt.Fprintf(stdout, "    })\n")
	if o.TLS {
		fmt.Fprintf(stdout, "\nThe server certificate is valid for: %s. Keep %s offline if you can:\nit signs certificates every client trusts.\n",
			strings.Join(hosts, ", "), filepath.Join(dir, initCAKey))
	}
	return nil
}

// writeFile creates path with perm (exactly: umask does not widen or narrow
// key files), replacing any existing file.
func writeFile(path string, data []byte, perm os.FileMode) error {
	_ = os.Remove(path) // --force: a fresh file gets perm, an old one might keep wider bits
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, perm)
	if err != nil {
		return runtimef("write %s: %w", path, err)
	}
	if err := f.Chmod(perm); err != nil {
		f.Close()
		return runtimef("chmod %s: %w", path, err)
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		return runtimef("write %s: %w", path, err)
	}
	if err := f.Close(); err != nil {
		return runtimef("write %s: %w", path, err)
	}
	return nil
}

func writeTLS(dir string, hosts []string) error {
	now := time.Now()
	ca, err := pki.NewCA("ticketingd private CA", now.AddDate(10, 0, 0).Sub(now))
	if err != nil {
		return runtimef("%w", err)
	}
	srv, err := ca.Issue(pki.Server, hosts, now.AddDate(2, 0, 0).Sub(now))
	if err != nil {
		return runtimef("%w", err)
	}
	for _, f := range []struct {
		name string
		pair *pki.KeyPair
		key  bool
		perm os.FileMode
	}{
		{initCACert, &ca.KeyPair, false, 0o644},
		{initCAKey, &ca.KeyPair, true, 0o600},
		{initServerCert, srv, false, 0o644},
		{initServerKey, srv, true, 0o600},
	} {
		data := f.pair.CertPEM()
		if f.key {
			if data, err = f.pair.KeyPEM(); err != nil {
				return runtimef("%s: %w", f.name, err)
			}
		}
		if err := writeFile(filepath.Join(dir, f.name), data, f.perm); err != nil {
			return err
		}
	}
	return nil
}
