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
	"strconv"
	"strings"
	"time"

	"github.com/spf13/pflag"
	"gopkg.in/yaml.v3"

	"github.com/ticketing-dev/ticketing/internal/wire"
	"github.com/ticketing-dev/ticketing/server"
	"github.com/ticketing-dev/ticketing/server/admin"
)

// serveOptions are the settings of 'ticketingd serve'. Each field but
// Config is a row of options: a flag and a config file key of one name.
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
	TokenStart       string // one or clock (server.ParseTokenStart)
	OwnedRelease     bool
	AdminToken       string
	ConsoleKeys      bool // the lock browser on the admin listener (admin.Options.ConsoleKeys)
	// Admin listener limits (admin.ConnLimits) and header deadline, and
	// the Host names it answers without an admin token
	// (admin.Options.AllowedHosts).
	AdminMaxConns          int
	AdminMaxConnsPerSource int
	AdminHeaderTimeout     time.Duration
	AdminAllowedHosts      []string
	// The connection budget over every listener (server.Config.ConnBudget
	// and FDReserve).
	ConnBudget int
	FDReserve  int

	// Cluster mode (see checkCluster in cluster.go). Advertise and the
	// PeerTLS files are a pair node's settings too.
	Cluster       bool
	NodeID        string
	RaftListen    string
	RaftAdvertise string
	Advertise     string
	Peers         []string
	PeerTLSCert   string
	PeerTLSKey    string
	PeerTLSCA     string
	RaftHeartbeat time.Duration
	RaftElection  time.Duration
	ClusterID     string
	InitialState  string // initial-cluster-state: new or existing
	// EarlyRelease: answer RELEASE before it is committed (opt-in,
	// departs from the protocol). CommittedRelease: deprecated and
	// ignored (the committed release is the default).
	EarlyRelease     bool
	CommittedRelease bool
	// Bounds of the leader's proposals (server.ClusterConfig).
	MaxSessionProposals int
	MaxProposals        int

	// Pair mode (see checkPair in pair.go): Pair is the starting role,
	// primary or backup ("" is no pair).
	Pair       string
	PairID     string
	Peer       string
	PeerListen string
	Heartbeat  time.Duration
	// PeerPlaintext accepts a plain TCP peer link off loopback.
	PeerPlaintext bool
	// The peer listener's caps (server.PairConfig.MaxPeerConns and
	// MaxPeerConnsPerSource).
	PeerMaxConns          int
	PeerMaxConnsPerSource int
}

// defaultListen is loopback on the protocol's default port.
var defaultListen = "127.0.0.1:" + strconv.Itoa(wire.DefaultPort)

const (
	defaultDataDir         = "./ticketing-data"
	defaultShutdownTimeout = 10 * time.Second
	// minSocketBuffer is the smallest --socket-buffer (see
	// server.MinSocketBuffer).
	minSocketBuffer = server.MinSocketBuffer
)

// options are the settings of 'ticketingd serve' but --config, in --help
// order: each is declared here once, and register makes it a flag and
// applyConfigFile a config file key of the same name. A new setting is a
// field of serveOptions, a row here and, if the server needs it, a line in
// serverConfig; check validates values.
func (o *serveOptions) options() []option {
	return []option{
		opt(&o.Listen, "listen", defaultListen, "TCP `address` to serve the lock protocol on"),
		pathOpt(&o.DataDir, "data-dir", defaultDataDir, "`directory` of the durable token store (created 0700 if missing)"),
		opt(&o.ClientTokens, "client-token", nil, "accept HELLO only with this client `token` (repeatable); prefer --client-tokens-file, as flags are visible in ps"),
		pathOpt(&o.ClientTokensFile, "client-tokens-file", "", "read client tokens from this `file`: one per line, blank lines and lines starting with # ignored"),
		pathOpt(&o.TLSCert, "tls-cert", "", "serve TLS with this PEM certificate chain `file` (needs --tls-key)"),
		pathOpt(&o.TLSKey, "tls-key", "", "PEM private key `file` for --tls-cert"),
		pathOpt(&o.TLSClientCA, "tls-client-ca", "", "require client certificates signed by a CA in this PEM `file` (needs --tls-cert)"),
		opt(&o.MaxLocks, "max-locks", 0, "limit on held locks; 0 means the default (2000000)"),
		opt(&o.MaxWaiters, "max-waiters", 0, "limit on queued ACQUIREs over all keys; 0 means the default (1000000)"),
		opt(&o.MaxKeyWaiters, "max-key-waiters", 0, "limit on queued ACQUIREs for one key; 0 means the default (10000)"),
		opt(&o.MaxSessions, "max-sessions", 0, "limit on open sessions; 0 means the default (10000)"),
		opt(&o.MaxPerPeer, "max-sessions-per-peer", 0, "limit on open sessions from one address (IPv4 address or IPv6 /64); 0 means the default (a quarter of max-sessions, at least 64)"),
		opt(&o.MaxPending, "max-pending-conns", 0, "limit on connections that have not completed HELLO; more are closed at accept; 0 means the default (a tenth of max-sessions, at least 64)"),
		opt(&o.ConnBudget, "conn-budget", 0, "limit on the connections open at once over every listener (lock port, admin, peer and Raft ports); more are closed at accept; 0 means the open-file limit minus --fd-reserve, -1 no limit"),
		opt(&o.FDReserve, "fd-reserve", 0, fmt.Sprintf("file descriptors the default --conn-budget leaves for the token store, the Raft log and snapshots, listeners and outbound connections; 0 means the default (%d)", server.DefaultFDReserve)),
		opt(&o.IdleTimeout, "idle-timeout", server.DefaultIdleTimeout, "drop a session that sends no complete frame for this long while no ACQUIRE of it waits (brokers PING every 10s); 0 turns it off"),
		opt(&o.SocketBuffer, "socket-buffer", server.DefaultSocketBuffer, "kernel send and receive buffer `bytes` of every connection, and the most written to it at once; at least 16384, or 0 for the operating system's defaults (autotuning)"),
		opt(&o.WriteTimeout, "write-timeout", server.DefaultWriteTimeout, "drop a session whose socket takes no piece of its pending replies for this long (a peer that does not read); must be > 0"),
		opt(&o.AdminListen, "admin-listen", "", "HTTP `address` for /metrics, /healthz, /status and the web console (/), and in cluster mode /cluster/add and /cluster/remove (off when empty)"),
		opt(&o.AdminToken, "admin-token", "", "require 'Authorization: Bearer `TOKEN`' on every admin request but GET /healthz; required in cluster mode when --admin-listen is not a loopback address"),
		opt(&o.ConsoleKeys, "console-keys", false, "turn on the lock browser of the admin listener (GET /v1/locks, GET /v1/locks/{key}, POST /v1/locks/{key}/expire; 'ticketingd locks'): it shows key names, which can be sensitive, and can expire a lock; needs --admin-listen and --admin-token, which it always requires, on loopback too"),
		opt(&o.AdminMaxConns, "admin-max-conns", 0, fmt.Sprintf("limit on open admin connections from addresses other than 127.0.0.1 and ::1 (which have %d each of their own); more are closed at accept, unanswered; 0 means the default (%d)", admin.DefaultLoopbackConns, admin.DefaultMaxConns)),
		opt(&o.AdminMaxConnsPerSource, "admin-max-conns-per-source", 0, fmt.Sprintf("limit on open admin connections from one address (IPv4 address or IPv6 /64); 0 means the default (%d)", admin.DefaultMaxConnsPerSource)),
		opt(&o.AdminHeaderTimeout, "admin-header-timeout", adminReadHeaderTimeout, "close an admin connection that has not sent a whole request header within this long (a client that sends nothing or trickles); must be > 0"),
		opt(&o.AdminAllowedHosts, "admin-allowed-host", nil, "without --admin-token, also answer admin requests whose Host header names this `host` (repeatable; a YAML list in the file; \"*\" for any). Always answered: IP addresses, localhost, and the hosts of --admin-listen, --listen and --advertise; any other name gets 403, against DNS rebinding"),
		opt(&o.LogLevel, "log-level", "info", "log level: debug, info, warn or error"),
		opt(&o.LogFormat, "log-format", "text", "log format: text or json"),
		opt(&o.NodeName, "node-name", "", "node `name` sent to clients in HELLO_OK (default \"ticketingd\")"),
		opt(&o.Standby, "standby", false, "run as a standby: answer every session with NOT_ACTIVE and --standby-hint"),
		opt(&o.StandbyHint, "standby-hint", "", "`address` of the active node, sent to clients by a standby"),
		opt(&o.Cluster, "cluster", false, "run as a node of a Raft cluster (needs --node-id and --raft-listen): only the leader serves, the others answer NOT_ACTIVE with the leader's --advertise address"),
		opt(&o.NodeID, "node-id", "", "cluster: this node's `ID` in the Raft configuration (1 to 64 letters, digits, '.', '_', '-')"),
		opt(&o.RaftListen, "raft-listen", "", "cluster: TCP `address` (host:port) of the Raft peer transport"),
		opt(&o.RaftAdvertise, "raft-advertise", "", "cluster: `address` the other nodes dial to reach this node's Raft transport (default --raft-listen, which must then be a specific address)"),
		opt(&o.Advertise, "advertise", "", "cluster, pair: client `address` (host:port) the other node(s) send to clients while this node leads or is active (default --listen when that is a specific address)"),
		opt(&o.Peers, "peers", nil, "cluster: initial configuration `ID=RAFTADDR,...` (this node included), used only by a node that has no Raft state yet, which bootstraps once every peer has answered that it starts the same new cluster (repeatable; a YAML list in the file)"),
		opt(&o.InitialState, "initial-cluster-state", initialStateNew, "cluster: `new` (a node without Raft state may bootstrap a new cluster from --peers) or existing (it waits to be added to a running cluster and never bootstraps; --peers must be empty)"),
		opt(&o.ClusterID, "cluster-id", "", "cluster: the cluster's `ID` (1 to 64 letters, digits, '.', '_', '-'; init --cluster writes a random one per bundle): the nodes of a new cluster must have the same, and a node whose Raft state is of another cluster refuses to start"),
		pathOpt(&o.PeerTLSCert, "peer-tls-cert", "", "cluster, pair: PEM node certificate `file` for mutual TLS between nodes (with --peer-tls-key and --peer-tls-ca); without the three the peer links are plain TCP and the server warns (a pair off loopback then needs --peer-plaintext)"),
		pathOpt(&o.PeerTLSKey, "peer-tls-key", "", "cluster, pair: PEM private key `file` of --peer-tls-cert"),
		pathOpt(&o.PeerTLSCA, "peer-tls-ca", "", "cluster, pair: PEM `file` of the CA(s) whose node certificates peers must present"),
		opt(&o.RaftHeartbeat, "raft-heartbeat", server.DefaultRaftHeartbeat, "cluster: Raft heartbeat timeout"),
		opt(&o.RaftElection, "raft-election", server.DefaultRaftElection, "cluster: Raft election timeout (at least --raft-heartbeat); a new leader restarts every lease at its full lease_s plus this"),
		opt(&o.MaxSessionProposals, "max-session-proposals", 0, fmt.Sprintf("cluster: commands one session may have awaiting their commit (its requests, and the expiries of its locks); beyond it the leader reads no more of its requests until some commit (TCP holds the client back); 0 means the default (%d)", server.DefaultMaxSessionProposals)),
		opt(&o.MaxProposals, "max-proposals", 0, fmt.Sprintf("cluster: commands of requests the leader may have awaiting their commit over all sessions (expiries not counted); an ACQUIRE of a free key beyond it gets B; 0 means the default (%d)", server.DefaultMaxProposals)),
		opt(&o.EarlyRelease, "early-release", false, "cluster: answer a RELEASE with R as soon as the leader has queued it, one commit earlier; departs from the protocol (R means released): a leader failure within that commit leaves the released key held until its restarted lease ends. Off: R once the release is committed"),
		opt(&o.CommittedRelease, "committed-release", false, "cluster: deprecated and ignored: a RELEASE is answered once it is committed by default (see --early-release)"),
		opt(&o.Pair, "pair", "", "run as a node of a hot-standby pair (Binary Star) with the starting role `primary|backup` (needs --peer and --peer-listen; the other node has the other role): the active node serves, the passive one answers NOT_ACTIVE with the active's --advertise address"),
		opt(&o.PairID, "pair-id", "", "pair: the pair's `ID` (1 to 64 letters, digits, '.', '_', '-'; init --pair writes a random one per bundle), the same on both nodes, sent to clients in a version-3 HELLO_OK: without it the primary draws one at its first start and the backup adopts it; a node whose data dir records another refuses to start, and a peer of another pair is refused"),
		opt(&o.Peer, "peer", "", "pair: the other node's peer `address` (host:port, its --peer-listen as this node dials it)"),
		opt(&o.PeerListen, "peer-listen", "", "pair: TCP `address` (host:port) this node takes its peer's link on"),
		opt(&o.PeerPlaintext, "peer-plaintext", false, "pair: accept a plain TCP peer link (no --peer-tls-cert) although --peer or --peer-listen is not a loopback address: anyone who reaches the peer port can then pose as the peer, make the active step down or move the token epochs; only on a network nobody else reaches"),
		opt(&o.Heartbeat, "heartbeat", server.DefaultPairHeartbeat, fmt.Sprintf("pair: interval of the heartbeats on the peer link, at least %v; the peer counts as dead after two intervals without one; give both nodes the same", minPairHeartbeat)),
		opt(&o.PeerMaxConns, "peer-max-conns", 0, fmt.Sprintf("pair: limit on connections to --peer-listen from addresses other than --peer's (which have %d of their own); more are closed at accept, and one that has not sent its hello within two heartbeats is closed; 0 means the default (%d)", server.PairPeerSlots, server.DefaultPairPeerConns)),
		opt(&o.PeerMaxConnsPerSource, "peer-max-conns-per-source", 0, fmt.Sprintf("pair: limit on connections to --peer-listen from one address (IPv4 address or IPv6 /64) other than --peer's; 0 means the default (%d)", server.DefaultPairPeerConnsPerSource)),
		opt(&o.TokenBlock, "token-block", 0, "fencing tokens reserved per fsync of the durable ceiling, at most 4294967296; 0 means the default (10000). A crash skips at most this many tokens"),
		opt(&o.InitialToken, "initial-token", 0, "issue fencing tokens strictly above `N` (and above the stored ceiling, if higher): to restart a data dir whose ceiling was lost, or to continue above another server's tokens or a database's high-water; 0: none (a new data dir or cluster starts where --token-start says)"),
		opt(&o.TokenStart, "token-start", "one", "where a NEW data dir or cluster starts issuing fencing tokens: one (at 1, as the protocol says) or clock (above the wall clock in microseconds, so that a reinstalled or wiped server never issues tokens below an earlier installation's; 'ticketingd init' writes clock). Read only at creation: a restart continues from the stored state. In a cluster the first leader's setting decides; give every node the same. --initial-token is a floor in both"),
		opt(&o.OwnedRelease, "owned-release-only", false, "a lock granted on a version-2 session (every Go broker of this release) is freed only by RELEASE_OWNED with its owner, never by a plain RELEASE with a guessed token; version-1 clients' locks are released as before"),
		opt(&o.ShutdownTimeout, "shutdown-timeout", defaultShutdownTimeout, "on SIGTERM/SIGINT, wait this long for sessions to close before closing them"),
	}
}

// option is one setting: its flag and config file key name, the
// serveOptions field it sets (ptr: *T of an optionType) and the flag's
// default and help.
type option struct {
	name, usage string
	ptr, def    any
	path        bool // in the config file, relative to the file's directory
}

// optionType are the types of settings: those pflag and yaml.v3 both parse.
type optionType interface {
	string | []string | int | uint64 | bool | time.Duration
}

func opt[T optionType](p *T, name string, def T, usage string) option {
	return option{name: name, usage: usage, ptr: p, def: def}
}

// pathOpt is a file or directory setting: a relative path in the config
// file is relative to the file's directory.
func pathOpt(p *string, name, def, usage string) option {
	op := opt(p, name, def, usage)
	op.path = true
	return op
}

func (o *serveOptions) register(fs *pflag.FlagSet) {
	fs.StringVar(&o.Config, "config", "", "read settings from this YAML `file` (keys are the flag names; flags given on the command line win)")
	for _, op := range o.options() {
		switch p := op.ptr.(type) {
		case *string:
			fs.StringVar(p, op.name, op.def.(string), op.usage)
		case *[]string: // repeatable; a YAML list in the file
			fs.StringArrayVar(p, op.name, op.def.([]string), op.usage)
		case *int:
			fs.IntVar(p, op.name, op.def.(int), op.usage)
		case *uint64:
			fs.Uint64Var(p, op.name, op.def.(uint64), op.usage)
		case *bool:
			fs.BoolVar(p, op.name, op.def.(bool), op.usage)
		case *time.Duration:
			fs.DurationVar(p, op.name, op.def.(time.Duration), op.usage)
		default:
			panic(fmt.Sprintf("option %s: unhandled type %T", op.name, op.ptr))
		}
	}
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

// applyConfigFile reads o.Config, a YAML mapping whose keys are the names
// of options, and sets every option that is in the file (and not null) and
// was not given on the command line, decoding its value into the option's
// field as yaml.v3 decodes a struct field of that type. Relative paths in
// the file are relative to the file's directory. Problems with the content
// (syntax, unknown or repeated keys, wrong types) are usage errors naming
// the file and line; an unreadable file is a runtime error.
func (o *serveOptions) applyConfigFile(fs *pflag.FlagSet) error {
	path := o.Config
	data, err := os.ReadFile(path)
	if err != nil {
		return runtimef("config file: %w", err)
	}
	var doc yaml.Node
	if err := yaml.NewDecoder(bytes.NewReader(data)).Decode(&doc); err != nil {
		if errors.Is(err, io.EOF) { // an empty file
			return nil
		}
		return usagef("config file %s: %s", path, yamlErrorText(err))
	}
	m := doc.Content[0]
	if m.Kind == yaml.ScalarNode && m.ShortTag() == "!!null" { // "~"
		return nil
	}
	if m.Kind != yaml.MappingNode {
		return usagef("config file %s: line %d: want a mapping of settings (key: value), got %s", path, m.Line, m.ShortTag())
	}
	var errs []string
	for i := 0; i < len(m.Content); i += 2 {
		for j := i + 2; j < len(m.Content); j += 2 {
			if ki, kj := m.Content[i], m.Content[j]; ki.Kind == kj.Kind && ki.Value == kj.Value {
				errs = append(errs, fmt.Sprintf("line %d: mapping key %q already defined at line %d", kj.Line, kj.Value, ki.Line))
			}
		}
	}
	if len(errs) > 0 { // as yaml.v3: nothing else is reported then
		return usagef("config file %s: %s", path, strings.Join(errs, "; "))
	}
	opts := make(map[string]option)
	for _, op := range o.options() {
		opts[op.name] = op
	}
	for i := 0; i < len(m.Content); i += 2 {
		k, v := m.Content[i], m.Content[i+1]
		op, ok := opts[k.Value]
		if !ok || k.Kind != yaml.ScalarNode {
			errs = append(errs, fmt.Sprintf("line %d: unknown key %q", k.Line, k.Value))
			continue
		}
		if fs.Changed(op.name) || v.Kind == yaml.ScalarNode && v.ShortTag() == "!!null" {
			continue // the flag wins; null is as if absent
		}
		if err := v.Decode(op.ptr); err != nil {
			errs = append(errs, yamlErrorText(err))
			continue
		}
		if p, ok := op.ptr.(*string); ok && op.path && *p != "" && !filepath.IsAbs(*p) {
			*p = filepath.Join(filepath.Dir(path), *p)
		}
	}
	if len(errs) > 0 {
		return usagef("config file %s: %s", path, strings.Join(errs, "; "))
	}
	return nil
}

// yamlErrorText is a yaml.v3 error without the "yaml: " prefix and with
// durations named for users.
func yamlErrorText(err error) string {
	var te *yaml.TypeError
	if !errors.As(err, &te) {
		return strings.TrimPrefix(err.Error(), "yaml: ")
	}
	msgs := make([]string, 0, len(te.Errors))
	for _, m := range te.Errors {
		msgs = append(msgs, strings.ReplaceAll(m, "time.Duration", "duration (like 10s)"))
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
		{"max-sessions-per-peer", o.MaxPerPeer}, {"max-pending-conns", o.MaxPending},
		{"admin-max-conns", o.AdminMaxConns}, {"admin-max-conns-per-source", o.AdminMaxConnsPerSource},
		{"peer-max-conns", o.PeerMaxConns}, {"peer-max-conns-per-source", o.PeerMaxConnsPerSource},
		{"fd-reserve", o.FDReserve}} {
		if l.v < 0 {
			return usagef("invalid %s %d: must be >= 0 (0 means the default)", src(l.name), l.v)
		}
	}
	if o.ConnBudget < -1 {
		return usagef("invalid %s %d: must be >= -1 (0 means the open-file limit minus --fd-reserve, -1 no limit)", src("conn-budget"), o.ConnBudget)
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
		if len(t) > wire.MaxTokenLen {
			return usagef("%s #%d is longer than %d bytes", src("client-token"), i+1, wire.MaxTokenLen)
		}
	}
	if len(o.NodeName) > wire.MaxNameLen {
		return usagef("%s is longer than %d bytes", src("node-name"), wire.MaxNameLen)
	}
	if len(o.StandbyHint) > wire.MaxNameLen { // NOT_ACTIVE's hint has the same one-byte length
		return usagef("%s is longer than %d bytes", src("standby-hint"), wire.MaxNameLen)
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
	if _, err := server.ParseTokenStart(o.TokenStart); err != nil {
		return usagef("invalid %s %q: want one or clock", src("token-start"), o.TokenStart)
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
	if o.AdminHeaderTimeout <= 0 {
		return usagef("invalid %s %v: must be > 0", src("admin-header-timeout"), o.AdminHeaderTimeout)
	}
	for i, h := range o.AdminAllowedHosts {
		if h == "" || strings.ContainsAny(h, " \t/") {
			return usagef("invalid %s #%d %q: want a host name (or \"*\")", src("admin-allowed-host"), i+1, h)
		}
	}
	if len(o.AdminToken) > maxAdminTokenLen {
		return usagef("%s is longer than %d bytes", src("admin-token"), maxAdminTokenLen)
	}
	if !validAdminToken(o.AdminToken) {
		return usagef("invalid %s: want printable ASCII without blanks", src("admin-token"))
	}
	if o.ConsoleKeys && (o.AdminToken == "" || o.AdminListen == "") {
		return usagef("%s needs --admin-listen and --admin-token (YAML admin-listen, admin-token): the lock browser shows key names and can expire locks, so it is served only with the admin token", src("console-keys"))
	}
	return o.checkModes(src)
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
		if len(t) > wire.MaxTokenLen {
			return nil, 0, usagef("client tokens file %s, line %d: token longer than %d bytes", path, line, wire.MaxTokenLen)
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
