package broker

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/ticketing-dev/ticketing/internal/wire"
)

// Defaults of the Config fields.
const (
	DefaultDialTimeout      = 5 * time.Second
	DefaultBackoffMin       = 100 * time.Millisecond
	DefaultBackoffMax       = 5 * time.Second
	DefaultKeepAlive        = 10 * time.Second
	DefaultKeepAliveTimeout = 5 * time.Second
	DefaultReplyGrace       = 5 * time.Second
	// DefaultPairSettle is the default of Config.PairSettle: the
	// SETTLE_DELAY of the ZeroMQ Guide's Binary Star client, two of the
	// pair's default 1 s heartbeats.
	DefaultPairSettle = 2 * time.Second
	// ReleaseWindow is the absolute window within which a RELEASE is
	// retried (Release in docs/semantics.md).
	ReleaseWindow = 5 * time.Second
	// DefaultPort is used for an address given without a port.
	DefaultPort = wire.DefaultPort
)

// TLSMode selects how the client verifies the server (TLS in docs/semantics.md).
type TLSMode int

const (
	// TLSOff (the zero value): plain TCP.
	TLSOff TLSMode = iota
	// TLSSystemRoots: TLS, verifying the server against the system trust
	// store.
	TLSSystemRoots
	// TLSCAFile: TLS, verifying the server against the PEM certificates in
	// TLSConfig.CAFile only. The file is read and parsed by New.
	TLSCAFile
	// TLSInsecureSkipVerify: TLS without any verification of the server.
	// For tests only: it gives no protection against an active attacker.
	TLSInsecureSkipVerify
)

// String returns the mode's name as used in URLs and logs, such as "ca-file".
func (m TLSMode) String() string {
	switch m {
	case TLSOff:
		return "off"
	case TLSSystemRoots:
		return "system-roots"
	case TLSCAFile:
		return "ca-file"
	case TLSInsecureSkipVerify:
		return "insecure-skip-verify"
	}
	return "TLSMode(" + strconv.Itoa(int(m)) + ")"
}

// TLSConfig is the client's TLS configuration.
type TLSConfig struct {
	// Mode: default TLSOff.
	Mode TLSMode
	// CAFile is the PEM file of the CA certificates for TLSCAFile. Required
	// in that mode. A CAFile with Mode unset (TLSOff, the zero value)
	// selects TLSCAFile, as ParseURL's ca= does; with TLSSystemRoots or
	// TLSInsecureSkipVerify it is an error from New.
	CAFile string
	// ServerName is the name verified in the server's certificate (and sent
	// as SNI). Default: the host part of each address.
	ServerName string
}

// Config configures a Broker. Only Addrs is required; every other field's
// zero value means the default given in its comment.
type Config struct {
	// Addrs are the server addresses, "host:port" (port default 5225). One
	// address is one node, held with two sessions; two or more are a
	// cluster, one session per address. Required.
	Addrs []string
	// Token is the client token sent in HELLO (default: none). It never
	// appears in errors or logs.
	Token string
	// Name is the client name sent in HELLO, informational (default: none;
	// at most 255 bytes).
	Name string
	// TLS selects TLS (default: off).
	TLS TLSConfig
	// Cluster is the identity of the cluster or hot-standby pair that
	// Addrs belong to (the URL's cluster=, which the TICKETING_URL of
	// ticketingd init --cluster and --pair carries; at most 64 bytes).
	// A node whose version-3 HELLO_OK carries another non-empty identity
	// is never used (see "Cluster identity" in the package
	// documentation), and with Cluster set, neither is a node that
	// carries no identity (a standalone server, or one speaking protocol
	// version 1 or 2): ErrNoClusterIdentity. Default: none, and then the
	// broker keeps to the first non-empty identity it meets, and uses
	// nodes that carry no identity.
	Cluster string
	// Logger receives the broker's events (default: nil, discard). Per
	// session: at Info each time it becomes ready ("broker: session
	// ready": addr, session, node (the server's node name), version and,
	// after a drop or failed opens, down_for and attempts); at Warn a
	// drop, once, with its cause ("broker: session dropped"), the first
	// failed open after New and the first refusal for good of an outage
	// ("broker: session open failed"), and then at most one summary per
	// 10*BackoffMax while it stays down ("broker: session still down":
	// down_for, attempts, the latest err); every other failed open at
	// Debug. A HELLO answered M naming the serving node (a follower, a
	// standby: the normal state of a cluster's other sessions) is no
	// failure: Debug only ("broker: HELLO answered M"), never a Warn. So
	// a healthy cluster logs one ready line per session that serves, a
	// server restart one drop and one ready line per session, and a long
	// outage a bounded number of lines. Also at Warn: dropped tickets,
	// failed background and Close releases. At Debug, besides: each
	// ACQUIRE's and RELEASE's reply ("broker: ACQUIRE reply", "broker:
	// RELEASE reply": addr, session, node, req_id, key, reply, token),
	// and each M hint followed; they cost one level check per request
	// when Debug is off. With a hot-standby pair (see PairSettle): at Info
	// once, the active found ("broker: pair: active found; ..."); at Warn
	// the first move to the other node after the settle delay in an
	// outage ("broker: pair: active lost for the settle delay; trying the
	// other node": lost, lost_for, settle, next), later moves of the same
	// outage at Debug; at Warn a node other than the active that answered
	// HELLO, not used ("broker: pair: a node other than the active
	// answered HELLO; not used"); at Debug each M hint the pair follows.
	// Protocol version 3: at Info, once per step and node, a fallback to
	// an older node ("broker: node does not speak protocol version 3;
	// using version 2", and "... 2; using version 1"; later ones at
	// Debug), and the cluster identity learned from the first node that
	// gave one, when Cluster is not set ("broker: cluster identity
	// learned ...": addr, node, cluster); at Error a node of another
	// cluster, not used ("broker: node belongs to another cluster; not
	// used": addr, session, node, cluster, want, configured), once per
	// session until it is ready; at Debug each EXTEND's reply ("broker:
	// EXTEND reply").
	Logger *slog.Logger

	// DialTimeout bounds dialling plus the TLS handshake plus HELLO
	// (default 5 s).
	DialTimeout time.Duration
	// BackoffMin and BackoffMax bound the reconnect backoff: the delay
	// before attempt n (from 0) is min(BackoffMax, BackoffMin*2^n), of which
	// a random half is jitter (defaults 100 ms and 5 s). After a refusal for
	// good (see Broker.WaitReady) the delay is BackoffMax at once. BackoffMin
	// above BackoffMax (after defaults) is an error from New.
	BackoffMin, BackoffMax time.Duration
	// KeepAlive is the interval between PINGs on each session (default
	// 10 s).
	KeepAlive time.Duration
	// KeepAliveTimeout: a PING not answered within it closes its session
	// (default 5 s).
	KeepAliveTimeout time.Duration
	// ReplyGrace: an ACQUIRE whose reply has not come within its wait plus
	// ReplyGrace closes its session and is Indeterminate (default 5 s).
	ReplyGrace time.Duration
	// PairSettle is the settle delay of a hot-standby pair (default 2 s;
	// negative is an error from New). Once a node has answered HELLO as
	// the active of a pair (role 2), the broker dials no other address
	// while that node serves, and after losing it (a dropped session, a
	// keepalive timeout, an M without a hint to follow) keeps retrying
	// that address alone until it has not served for PairSettle; only
	// then does it try the other node. The node it tries is retried at
	// least every PairSettle/4 (at least 10 ms), from BackoffMin after
	// each move between nodes. An M naming the other node is followed at
	// once. At start, the addresses after the first are
	// dialled once the first has answered or failed, or after PairSettle.
	// See "Hot-standby pairs" in the package documentation. Set it to at
	// least the time the pair's passive takes to declare its peer dead
	// (two heartbeats: 2 s with the servers' default heartbeat of 1 s),
	// or a failover takes one settle delay more. It changes nothing for a
	// standalone node or a Raft cluster, except the start order.
	PairSettle time.Duration
	// ReleaseWindow shortens the absolute release window (Release in
	// docs/semantics.md), for tests only (default and maximum: 5 s; above 5 s is an
	// error).
	ReleaseWindow time.Duration
	// Dialer opens the TCP connections (default: a net.Dialer). Tests use
	// it to inject faults. TLS, if configured, is layered on its result.
	Dialer func(ctx context.Context, network, addr string) (net.Conn, error)
	// Tracer observes Acquire, refreshes, Release and lost KeepAlives
	// (default: nil, nothing traced, at no cost). Module
	// github.com/ticketing-dev/ticketing/otel provides one for
	// OpenTelemetry; see docs/opentelemetry.md.
	Tracer Tracer
}

// settings is a validated Config with defaults applied.
type settings struct {
	Config
	addrs []string      // normalised, one per session
	tls   []*tls.Config // per session, nil for TLSOff
}

func (cfg Config) normalize() (*settings, error) {
	s := &settings{Config: cfg}
	if len(cfg.Addrs) == 0 {
		return nil, newErr(ErrInvalidConfig, "no address", nil)
	}
	if len(cfg.Token) > wire.MaxTokenLen {
		return nil, newErr(ErrInvalidConfig, fmt.Sprintf("token longer than %d bytes", wire.MaxTokenLen), nil)
	}
	if len(cfg.Name) > wire.MaxNameLen {
		return nil, newErr(ErrInvalidConfig, fmt.Sprintf("name longer than %d bytes", wire.MaxNameLen), nil)
	}
	if len(cfg.Cluster) > wire.MaxClusterLen {
		return nil, newErr(ErrInvalidConfig, fmt.Sprintf("cluster identity longer than %d bytes", wire.MaxClusterLen), nil)
	}
	def := func(d *time.Duration, v time.Duration, name string) error {
		if *d < 0 {
			return newErr(ErrInvalidConfig, name+" is negative", nil)
		}
		if *d == 0 {
			*d = v
		}
		return nil
	}
	for _, f := range []struct {
		d    *time.Duration
		v    time.Duration
		name string
	}{
		{&s.DialTimeout, DefaultDialTimeout, "DialTimeout"},
		{&s.BackoffMin, DefaultBackoffMin, "BackoffMin"},
		{&s.BackoffMax, DefaultBackoffMax, "BackoffMax"},
		{&s.KeepAlive, DefaultKeepAlive, "KeepAlive"},
		{&s.KeepAliveTimeout, DefaultKeepAliveTimeout, "KeepAliveTimeout"},
		{&s.ReplyGrace, DefaultReplyGrace, "ReplyGrace"},
		{&s.PairSettle, DefaultPairSettle, "PairSettle"},
		{&s.Config.ReleaseWindow, ReleaseWindow, "ReleaseWindow"},
	} {
		if err := def(f.d, f.v, f.name); err != nil {
			return nil, err
		}
	}
	if s.Config.ReleaseWindow > ReleaseWindow {
		return nil, newErr(ErrInvalidConfig, "ReleaseWindow above 5s", nil)
	}
	if s.BackoffMin > s.BackoffMax {
		return nil, newErr(ErrInvalidConfig, fmt.Sprintf("BackoffMin %v above BackoffMax %v (defaults: %v and %v)",
			s.BackoffMin, s.BackoffMax, DefaultBackoffMin, DefaultBackoffMax), nil)
	}
	if s.Dialer == nil {
		d := &net.Dialer{KeepAlive: 30 * time.Second}
		s.Dialer = d.DialContext
	}
	addrs := make([]string, 0, len(cfg.Addrs))
	for _, a := range cfg.Addrs {
		n, err := normalizeAddr(a)
		if err != nil {
			return nil, err
		}
		addrs = append(addrs, n)
	}
	if len(addrs) == 1 {
		addrs = append(addrs, addrs[0])
	}
	s.addrs = addrs

	if err := s.Config.TLS.impliedMode(); err != nil {
		return nil, err
	}
	base, err := s.Config.TLS.build()
	if err != nil {
		return nil, err
	}
	s.tls = make([]*tls.Config, len(addrs))
	if base != nil {
		for i, a := range addrs {
			c := base.Clone()
			if c.ServerName == "" {
				host, _, _ := net.SplitHostPort(a)
				c.ServerName = host
			}
			s.tls[i] = c
		}
	}
	return s, nil
}

func normalizeAddr(a string) (string, error) {
	a = strings.TrimSpace(a)
	if a == "" {
		return "", newErr(ErrInvalidConfig, "empty address", nil)
	}
	host, port, err := net.SplitHostPort(a)
	if err != nil {
		// No port: "host" or "[v6]".
		h := strings.TrimSuffix(strings.TrimPrefix(a, "["), "]")
		if strings.ContainsAny(h, "[]") || (strings.Contains(h, ":") && !strings.HasPrefix(a, "[")) {
			return "", newErr(ErrInvalidConfig, fmt.Sprintf("bad address %q", a), err)
		}
		return net.JoinHostPort(h, strconv.Itoa(DefaultPort)), nil
	}
	if host == "" {
		return "", newErr(ErrInvalidConfig, fmt.Sprintf("address %q has no host", a), nil)
	}
	if p, err := strconv.Atoi(port); err != nil || p < 1 || p > 65535 {
		return "", newErr(ErrInvalidConfig, fmt.Sprintf("address %q has a bad port", a), nil)
	}
	return a, nil
}

// impliedMode applies the one CAFile rule of New and ParseURL: a CAFile
// selects TLSCAFile; with the mode unset (TLSOff, the zero value) it
// implies TLSCAFile, and with another mode (system roots, skip-verify),
// which would ignore it, it is an error.
func (t *TLSConfig) impliedMode() error {
	if t.CAFile == "" {
		return nil
	}
	switch t.Mode {
	case TLSOff:
		t.Mode = TLSCAFile
	case TLSCAFile:
	default:
		return newErr(ErrInvalidConfig, fmt.Sprintf("CAFile set with TLS mode %s, which would ignore it (a CAFile implies mode %s)", t.Mode, TLSCAFile), nil)
	}
	return nil
}

func (t TLSConfig) build() (*tls.Config, error) {
	switch t.Mode {
	case TLSOff:
		return nil, nil
	case TLSSystemRoots:
		return &tls.Config{MinVersion: tls.VersionTLS12, ServerName: t.ServerName}, nil
	case TLSCAFile:
		if t.CAFile == "" {
			return nil, newErr(ErrInvalidConfig, "TLSCAFile mode without CAFile", nil)
		}
		pem, err := os.ReadFile(t.CAFile)
		if err != nil {
			return nil, newErr(ErrInvalidConfig, "reading CA file", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, newErr(ErrInvalidConfig, fmt.Sprintf("CA file %s holds no PEM certificate", t.CAFile), nil)
		}
		return &tls.Config{MinVersion: tls.VersionTLS12, RootCAs: pool, ServerName: t.ServerName}, nil
	case TLSInsecureSkipVerify:
		return &tls.Config{MinVersion: tls.VersionTLS12, InsecureSkipVerify: true, ServerName: t.ServerName}, nil //nolint:gosec // documented test-only mode
	}
	return nil, newErr(ErrInvalidConfig, "unknown TLS mode "+t.Mode.String(), nil)
}

// ParseURL parses the URL form of a configuration:
//
//	ticketing://[TOKEN@]host1[:port][,host2[:port]...][?name=N&tls=MODE&ca=PATH&server_name=SNI&pair_settle=DURATION&cluster=ID]
//
// MODE is off (default), system, ca (requires ca=PATH) or
// insecure-skip-verify. As for Config.TLS.CAFile, ca=PATH alone implies
// tls=ca, and ca=PATH with any other tls= is an error. pair_settle sets
// Config.PairSettle (a Go duration such as 3s; not negative): the one
// timing of the URL, because it belongs with the servers' --heartbeat of
// a hot-standby pair. cluster sets Config.Cluster (at most 64 bytes):
// the identity of the cluster or pair the addresses belong to, which the
// broker checks against every node's (see "Cluster identity" in the
// package documentation); ticketingd init --cluster and --pair put it in
// the TICKETING_URL they print. The token may be percent-encoded. Only
// the fields in the URL are set; the returned Config can be adjusted
// before New.
//
// The URL carries everything a client needs, the client token included:
// it is the one way to configure a client from its environment (the
// TICKETING_URL that ticketingd init prints). ParseURL reads no
// environment variable; in particular a TICKETING_TOKEN variable, which
// earlier versions of init printed, is not read: put the token in the URL.
// A server that requires a token refuses a URL without one with an error
// matching ErrUnauthorized that says no token was sent.
func ParseURL(s string) (Config, error) {
	var cfg Config
	rest, ok := strings.CutPrefix(s, "ticketing://")
	if !ok {
		return cfg, newErr(ErrInvalidConfig, "URL scheme must be ticketing://", nil)
	}
	rest, rawQuery, _ := strings.Cut(rest, "?")
	if i := strings.IndexByte(rest, '/'); i >= 0 {
		if rest[i:] != "/" {
			return cfg, newErr(ErrInvalidConfig, "URL must not have a path", nil)
		}
		rest = rest[:i]
	}
	if i := strings.LastIndexByte(rest, '@'); i >= 0 {
		tok, err := url.PathUnescape(rest[:i])
		if err != nil {
			return cfg, newErr(ErrInvalidConfig, "bad token encoding in URL", errRedacted)
		}
		cfg.Token = tok
		rest = rest[i+1:]
	}
	for h := range strings.SplitSeq(rest, ",") {
		if h != "" {
			cfg.Addrs = append(cfg.Addrs, h)
		}
	}
	if len(cfg.Addrs) == 0 {
		return cfg, newErr(ErrInvalidConfig, "URL has no host", nil)
	}
	q, err := url.ParseQuery(rawQuery)
	if err != nil {
		return cfg, newErr(ErrInvalidConfig, "bad URL query", err)
	}
	for k := range q {
		switch k {
		case "name", "tls", "ca", "server_name", "pair_settle", "cluster":
		default:
			return cfg, newErr(ErrInvalidConfig, fmt.Sprintf("unknown URL parameter %q", k), nil)
		}
	}
	cfg.Name = q.Get("name")
	cfg.TLS.CAFile = q.Get("ca")
	cfg.TLS.ServerName = q.Get("server_name")
	cfg.Cluster = q.Get("cluster")
	if len(cfg.Cluster) > wire.MaxClusterLen {
		return cfg, newErr(ErrInvalidConfig, fmt.Sprintf("cluster=: longer than %d bytes", wire.MaxClusterLen), nil)
	}
	if v := q.Get("pair_settle"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d < 0 {
			return cfg, newErr(ErrInvalidConfig, fmt.Sprintf("pair_settle=%q: want a duration such as 2s, not negative", v), nil)
		}
		cfg.PairSettle = d
	}
	switch mode := q.Get("tls"); mode {
	case "":
	case "off":
		if cfg.TLS.CAFile != "" {
			return cfg, newErr(ErrInvalidConfig, "ca=PATH with tls=off (ca= implies tls=ca)", nil)
		}
	case "system", "system-roots":
		cfg.TLS.Mode = TLSSystemRoots
	case "ca", "ca-file":
		cfg.TLS.Mode = TLSCAFile
		if cfg.TLS.CAFile == "" {
			return cfg, newErr(ErrInvalidConfig, "tls=ca needs ca=PATH", nil)
		}
	case "insecure-skip-verify", "insecure":
		cfg.TLS.Mode = TLSInsecureSkipVerify
	default:
		return cfg, newErr(ErrInvalidConfig, fmt.Sprintf("unknown tls mode %q", mode), nil)
	}
	// The CAFile rule of New: ca= alone implies tls=ca; with another mode
	// it is an error.
	if err := cfg.TLS.impliedMode(); err != nil {
		return cfg, err
	}
	return cfg, nil
}

// errRedacted stands in for url.Parse errors, which would quote the URL and
// with it the token.
var errRedacted = fmt.Errorf("URL not shown: it may contain a token")
