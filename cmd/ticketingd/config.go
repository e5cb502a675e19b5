package main

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/pflag"
	"gopkg.in/yaml.v3"

	"github.com/ticketing-dev/ticketing/server"
)

// serveOptions are the settings of 'ticketingd serve'. Every field is a flag
// and a key of the config file, with the same name.
type serveOptions struct {
	Config           string
	Listen           string
	DataDir          string
	ClientTokens     []string
	ClientTokensFile string
	TLSCert          string
	TLSKey           string
	TLSClientCA      string
	MaxLocks         int
	MaxWaiters       int
	MaxKeyWaiters    int
	MaxSessions      int
	MaxPerPeer       int
	MaxPending       int
	IdleTimeout      time.Duration
	SocketBuffer     int
	WriteTimeout     time.Duration
	AdminListen      string
	LogLevel         string
	LogFormat        string
	NodeName         string
	Standby          bool
	StandbyHint      string
	ShutdownTimeout  time.Duration
	TokenBlock       uint64
	InitialToken     uint64
}

const (
	defaultListen          = "127.0.0.1:5225"
	defaultDataDir         = "./ticketing-data"
	defaultShutdownTimeout = 10 * time.Second
	// minSocketBuffer is the smallest --socket-buffer (see
	// server.MinSocketBuffer).
	minSocketBuffer = server.MinSocketBuffer
)

func (o *serveOptions) register(fs *pflag.FlagSet) {
	fs.StringVar(&o.Config, "config", "", "read settings from this YAML `file` (keys are the flag names; flags given on the command line win)")
	fs.StringVar(&o.Listen, "listen", defaultListen, "TCP `address` to serve the lock protocol on")
	fs.StringVar(&o.DataDir, "data-dir", defaultDataDir, "`directory` of the durable token store (created 0700 if missing)")
	fs.StringArrayVar(&o.ClientTokens, "client-token", nil, "accept HELLO only with this client `token` (repeatable); prefer --client-tokens-file, as flags are visible in ps")
	fs.StringVar(&o.ClientTokensFile, "client-tokens-file", "", "read client tokens from this `file`: one per line, blank lines and lines starting with # ignored")
	fs.StringVar(&o.TLSCert, "tls-cert", "", "serve TLS with this PEM certificate chain `file` (needs --tls-key)")
	fs.StringVar(&o.TLSKey, "tls-key", "", "PEM private key `file` for --tls-cert")
	fs.StringVar(&o.TLSClientCA, "tls-client-ca", "", "require client certificates signed by a CA in this PEM `file` (needs --tls-cert)")
	fs.IntVar(&o.MaxLocks, "max-locks", 0, "limit on held locks; 0 means the default (2000000)")
	fs.IntVar(&o.MaxWaiters, "max-waiters", 0, "limit on queued ACQUIREs over all keys; 0 means the default (1000000)")
	fs.IntVar(&o.MaxKeyWaiters, "max-key-waiters", 0, "limit on queued ACQUIREs for one key; 0 means the default (10000)")
	fs.IntVar(&o.MaxSessions, "max-sessions", 0, "limit on open sessions; 0 means the default (10000)")
	fs.IntVar(&o.MaxPerPeer, "max-sessions-per-peer", 0, "limit on open sessions from one address (IPv4 address or IPv6 /64); 0 means the default (a quarter of max-sessions, at least 64)")
	fs.IntVar(&o.MaxPending, "max-pending-conns", 0, "limit on connections that have not completed HELLO; more are closed at accept; 0 means the default (a tenth of max-sessions, at least 64)")
	fs.DurationVar(&o.IdleTimeout, "idle-timeout", server.DefaultIdleTimeout, "drop a session that sends no complete frame for this long while no ACQUIRE of it waits (brokers PING every 10s); 0 turns it off")
	fs.IntVar(&o.SocketBuffer, "socket-buffer", server.DefaultSocketBuffer, "kernel send and receive buffer `bytes` of every connection, and the most written to it at once; at least 16384, or 0 for the operating system's defaults (autotuning)")
	fs.DurationVar(&o.WriteTimeout, "write-timeout", server.DefaultWriteTimeout, "drop a session whose socket takes no piece of its pending replies for this long (a peer that does not read); must be > 0")
	fs.StringVar(&o.AdminListen, "admin-listen", "", "HTTP `address` for /metrics, /healthz and /status (off when empty)")
	fs.StringVar(&o.LogLevel, "log-level", "info", "log level: debug, info, warn or error")
	fs.StringVar(&o.LogFormat, "log-format", "text", "log format: text or json")
	fs.StringVar(&o.NodeName, "node-name", "", "node `name` sent to clients in HELLO_OK (default \"ticketingd\")")
	fs.BoolVar(&o.Standby, "standby", false, "run as a standby: answer every session with NOT_ACTIVE and --standby-hint")
	fs.StringVar(&o.StandbyHint, "standby-hint", "", "`address` of the active node, sent to clients by a standby")
	fs.Uint64Var(&o.TokenBlock, "token-block", 0, "fencing tokens reserved per fsync of the durable ceiling, at most 4294967296; 0 means the default (10000). A crash skips at most this many tokens")
	fs.Uint64Var(&o.InitialToken, "initial-token", 0, "issue fencing tokens strictly above `N` (and above the stored ceiling, if higher): to restart a data dir whose ceiling was lost, or to continue above another server's tokens; 0: none")
	fs.DurationVar(&o.ShutdownTimeout, "shutdown-timeout", defaultShutdownTimeout, "on SIGTERM/SIGINT, wait this long for sessions to close before closing them")
}

// finish applies the config file (if any) under the flags given on the
// command line, then validates the result.
func (o *serveOptions) finish(fs *pflag.FlagSet) error {
	if o.Config != "" {
		if err := o.applyConfigFile(fs); err != nil {
			return err
		}
	}
	return o.check(fs)
}

// fileConfig is the YAML config file. Keys are the flag names. Pointers tell
// a key that is absent from one set to its zero value.
type fileConfig struct {
	Listen           *string        `yaml:"listen"`
	DataDir          *string        `yaml:"data-dir"`
	ClientToken      []string       `yaml:"client-token"`
	ClientTokensFile *string        `yaml:"client-tokens-file"`
	TLSCert          *string        `yaml:"tls-cert"`
	TLSKey           *string        `yaml:"tls-key"`
	TLSClientCA      *string        `yaml:"tls-client-ca"`
	MaxLocks         *int           `yaml:"max-locks"`
	MaxWaiters       *int           `yaml:"max-waiters"`
	MaxKeyWaiters    *int           `yaml:"max-key-waiters"`
	MaxSessions      *int           `yaml:"max-sessions"`
	MaxPerPeer       *int           `yaml:"max-sessions-per-peer"`
	MaxPending       *int           `yaml:"max-pending-conns"`
	IdleTimeout      *time.Duration `yaml:"idle-timeout"`
	SocketBuffer     *int           `yaml:"socket-buffer"`
	WriteTimeout     *time.Duration `yaml:"write-timeout"`
	AdminListen      *string        `yaml:"admin-listen"`
	LogLevel         *string        `yaml:"log-level"`
	LogFormat        *string        `yaml:"log-format"`
	NodeName         *string        `yaml:"node-name"`
	Standby          *bool          `yaml:"standby"`
	StandbyHint      *string        `yaml:"standby-hint"`
	ShutdownTimeout  *time.Duration `yaml:"shutdown-timeout"`
	TokenBlock       *uint64        `yaml:"token-block"`
	InitialToken     *uint64        `yaml:"initial-token"`
}

// applyConfigFile reads o.Config and sets every option that is in the file
// and was not given on the command line. Relative paths in the file are
// relative to the file's directory. Problems with the content are usage
// errors naming the file (and the key); an unreadable file is a runtime error.
func (o *serveOptions) applyConfigFile(fs *pflag.FlagSet) error {
	path := o.Config
	data, err := os.ReadFile(path)
	if err != nil {
		return runtimef("config file: %w", err)
	}
	var fc fileConfig
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(&fc); err != nil && !errors.Is(err, io.EOF) { // io.EOF: empty file
		return usagef("config file %s: %s", path, yamlErrorText(err))
	}
	dir := filepath.Dir(path)
	rel := func(p string) string {
		if p == "" || filepath.IsAbs(p) {
			return p
		}
		return filepath.Join(dir, p)
	}
	setStr := func(name string, dst *string, v *string, isPath bool) {
		if v == nil || fs.Changed(name) {
			return
		}
		*dst = *v
		if isPath {
			*dst = rel(*v)
		}
	}
	setInt := func(name string, dst *int, v *int) {
		if v != nil && !fs.Changed(name) {
			*dst = *v
		}
	}
	setStr("listen", &o.Listen, fc.Listen, false)
	setStr("data-dir", &o.DataDir, fc.DataDir, true)
	if fc.ClientToken != nil && !fs.Changed("client-token") {
		o.ClientTokens = fc.ClientToken
	}
	setStr("client-tokens-file", &o.ClientTokensFile, fc.ClientTokensFile, true)
	setStr("tls-cert", &o.TLSCert, fc.TLSCert, true)
	setStr("tls-key", &o.TLSKey, fc.TLSKey, true)
	setStr("tls-client-ca", &o.TLSClientCA, fc.TLSClientCA, true)
	setInt("max-locks", &o.MaxLocks, fc.MaxLocks)
	setInt("max-waiters", &o.MaxWaiters, fc.MaxWaiters)
	setInt("max-key-waiters", &o.MaxKeyWaiters, fc.MaxKeyWaiters)
	setInt("max-sessions", &o.MaxSessions, fc.MaxSessions)
	setInt("max-sessions-per-peer", &o.MaxPerPeer, fc.MaxPerPeer)
	setInt("max-pending-conns", &o.MaxPending, fc.MaxPending)
	if fc.IdleTimeout != nil && !fs.Changed("idle-timeout") {
		o.IdleTimeout = *fc.IdleTimeout
	}
	setInt("socket-buffer", &o.SocketBuffer, fc.SocketBuffer)
	if fc.WriteTimeout != nil && !fs.Changed("write-timeout") {
		o.WriteTimeout = *fc.WriteTimeout
	}
	setStr("admin-listen", &o.AdminListen, fc.AdminListen, false)
	setStr("log-level", &o.LogLevel, fc.LogLevel, false)
	setStr("log-format", &o.LogFormat, fc.LogFormat, false)
	setStr("node-name", &o.NodeName, fc.NodeName, false)
	if fc.Standby != nil && !fs.Changed("standby") {
		o.Standby = *fc.Standby
	}
	setStr("standby-hint", &o.StandbyHint, fc.StandbyHint, false)
	if fc.ShutdownTimeout != nil && !fs.Changed("shutdown-timeout") {
		o.ShutdownTimeout = *fc.ShutdownTimeout
	}
	if fc.TokenBlock != nil && !fs.Changed("token-block") {
		o.TokenBlock = *fc.TokenBlock
	}
	if fc.InitialToken != nil && !fs.Changed("initial-token") {
		o.InitialToken = *fc.InitialToken
	}
	return nil
}

// yamlErrorText turns yaml.v3's "field x not found in type main.fileConfig"
// into "unknown key "x"" and drops the Go type names.
func yamlErrorText(err error) string {
	var te *yaml.TypeError
	if !errors.As(err, &te) {
		return strings.TrimPrefix(err.Error(), "yaml: ")
	}
	msgs := make([]string, 0, len(te.Errors))
	for _, m := range te.Errors {
		if i := strings.Index(m, "field "); i >= 0 && strings.HasSuffix(m, "in type main.fileConfig") {
			key := strings.TrimSuffix(m[i+len("field "):], " not found in type main.fileConfig")
			m = fmt.Sprintf("%sunknown key %q", m[:i], key)
		}
		m = strings.ReplaceAll(m, "*time.Duration", "duration (like 10s)")
		m = strings.ReplaceAll(m, "time.Duration", "duration (like 10s)")
		msgs = append(msgs, m)
	}
	return strings.Join(msgs, "; ")
}

// check validates the options; src names where a setting came from.
func (o *serveOptions) check(fs *pflag.FlagSet) error {
	src := func(name string) string {
		if o.Config != "" && !fs.Changed(name) {
			return fmt.Sprintf("%s in config file %s", name, o.Config)
		}
		return "--" + name
	}
	if _, err := parseLevel(o.LogLevel); err != nil {
		return usagef("invalid %s %q: want debug, info, warn or error", src("log-level"), o.LogLevel)
	}
	if o.LogFormat != "text" && o.LogFormat != "json" {
		return usagef("invalid %s %q: want text or json", src("log-format"), o.LogFormat)
	}
	if o.Listen == "" {
		return usagef("%s is empty", src("listen"))
	}
	if o.DataDir == "" {
		return usagef("%s is empty", src("data-dir"))
	}
	for _, l := range []struct {
		name string
		v    int
	}{{"max-locks", o.MaxLocks}, {"max-waiters", o.MaxWaiters}, {"max-key-waiters", o.MaxKeyWaiters}, {"max-sessions", o.MaxSessions},
		{"max-sessions-per-peer", o.MaxPerPeer}, {"max-pending-conns", o.MaxPending}} {
		if l.v < 0 {
			return usagef("invalid %s %d: must be >= 0 (0 means the default)", src(l.name), l.v)
		}
	}
	if (o.TLSCert == "") != (o.TLSKey == "") {
		return usagef("--tls-cert and --tls-key must be given together")
	}
	if o.TLSClientCA != "" && o.TLSCert == "" {
		return usagef("%s needs --tls-cert and --tls-key", src("tls-client-ca"))
	}
	for i, t := range o.ClientTokens {
		if t == "" {
			return usagef("%s #%d is empty", src("client-token"), i+1)
		}
		if len(t) > 255 {
			return usagef("%s #%d is longer than 255 bytes", src("client-token"), i+1)
		}
	}
	if len(o.NodeName) > 255 {
		return usagef("%s is longer than 255 bytes", src("node-name"))
	}
	if len(o.StandbyHint) > 255 {
		return usagef("%s is longer than 255 bytes", src("standby-hint"))
	}
	if o.IdleTimeout < 0 {
		return usagef("invalid %s %v: must be >= 0 (0 turns it off)", src("idle-timeout"), o.IdleTimeout)
	}
	if o.TokenBlock > server.MaxTokenBlock {
		return usagef("invalid %s %d: must be at most %d (0 means the default)", src("token-block"), o.TokenBlock, server.MaxTokenBlock)
	}
	block := o.TokenBlock
	if block == 0 {
		block = server.DefaultTokenBlock
	}
	if o.InitialToken > server.MaxToken-block {
		return usagef("invalid %s %d: tokens must stay at most %d with room for a block of %d", src("initial-token"), o.InitialToken, server.MaxToken, block)
	}
	if o.SocketBuffer != 0 && o.SocketBuffer < minSocketBuffer {
		return usagef("invalid %s %d: must be at least %d bytes (0 leaves the operating system's defaults)", src("socket-buffer"), o.SocketBuffer, minSocketBuffer)
	}
	if o.WriteTimeout <= 0 {
		return usagef("invalid %s %v: must be > 0", src("write-timeout"), o.WriteTimeout)
	}
	if o.ShutdownTimeout <= 0 {
		return usagef("invalid %s %v: must be > 0", src("shutdown-timeout"), o.ShutdownTimeout)
	}
	return nil
}

func parseLevel(s string) (slog.Level, error) {
	switch strings.ToLower(s) {
	case "debug":
		return slog.LevelDebug, nil
	case "info":
		return slog.LevelInfo, nil
	case "warn", "warning":
		return slog.LevelWarn, nil
	case "error":
		return slog.LevelError, nil
	}
	return 0, fmt.Errorf("unknown level %q", s)
}

// readTokensFile reads client tokens: one per line; surrounding blanks are
// trimmed; blank lines and lines whose first non-blank is # are skipped.
// It reports (without the tokens) whether the file is group/world readable.
func readTokensFile(path string) (tokens []string, looseMode os.FileMode, err error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, 0, runtimef("client tokens file: %w", err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, 0, runtimef("client tokens file: %w", err)
	}
	if st.IsDir() {
		return nil, 0, runtimef("client tokens file %s: is a directory", path)
	}
	sc := bufio.NewScanner(f)
	line := 0
	for sc.Scan() {
		line++
		t := strings.TrimSpace(sc.Text())
		if t == "" || strings.HasPrefix(t, "#") {
			continue
		}
		if len(t) > 255 {
			return nil, 0, usagef("client tokens file %s, line %d: token longer than 255 bytes", path, line)
		}
		tokens = append(tokens, t)
	}
	if err := sc.Err(); err != nil {
		return nil, 0, runtimef("client tokens file %s: %w", path, err)
	}
	if len(tokens) == 0 {
		// Running without authentication because of an empty file would be
		// a silent downgrade.
		return nil, 0, usagef("client tokens file %s contains no tokens", path)
	}
	return tokens, st.Mode().Perm() & 0o077, nil
}
