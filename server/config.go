package server

import (
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ticketing-dev/ticketing/internal/wire"
)

// Defaults for the zero values of Config.
const (
	DefaultNodeName      = "ticketingd"
	DefaultMaxLocks      = 2_000_000
	DefaultMaxWaiters    = 1_000_000
	DefaultMaxKeyWaiters = 10_000
	DefaultMaxSessions   = 10_000
	DefaultHelloTimeout  = 5 * time.Second
	DefaultTokenBlock    = 10_000

	// DefaultFDReserve is Config.FDReserve's default: what the server
	// opens besides accepted connections, counted generously: about 10 for
	// the standard streams, the runtime's poller, the listeners and a
	// connection being refused on each, 2 for the data directory's and
	// the Raft log's locks, 2 for a ceiling write, up to 16 for the Raft
	// log's segments (open until the log is compacted, and one being
	// created) and 8 for snapshots being written or read, about 6 per peer
	// for outbound Raft connections (a pool of 3, the pipeline, a vote, a
	// snapshot: 54 for nine peers), a pair's link, name lookups and the
	// metrics' reads of /proc.
	DefaultFDReserve = 128

	// DefaultIdleTimeout is three keepalive intervals of the broker
	// (broker.DefaultKeepAlive, 10 s): a healthy broker session sends a
	// PING at least every 10 s, so it is never idle that long.
	DefaultIdleTimeout = 30 * time.Second
	// DefaultWriteTimeout: a session whose socket takes no reply bytes for
	// this long is dropped. It is below the broker's keepalive timeout
	// (5 s), after which a broker gives up on a session by itself.
	DefaultWriteTimeout = 3 * time.Second
	// DefaultSocketBuffer is the kernel send and receive buffer size set
	// on every accepted TCP connection.
	DefaultSocketBuffer = 64 << 10
	// MinSocketBuffer is the smallest positive Config.SocketBuffer. Replies
	// are written in pieces of that size; with 4 KiB buffers a loopback
	// connection (64 KiB segments) whose peer pipelines requests without
	// reading was seen to stall in TCP, so that the write timeout never fired.
	MinSocketBuffer = 16 << 10
)

// Config configures a Server. The zero value of every field except DataDir is
// usable and means the documented default. A Config must not be modified after
// it has been passed to New.
type Config struct {
	// DataDir holds the durable token store (the file "tokens.ceiling").
	// Required: New fails without it. It is created (mode 0700) if missing.
	DataDir string

	// ClientTokens, if non-empty, makes HELLO carry one of these tokens
	// (compared in constant time); any other token gets E(3). Empty means no
	// client authentication.
	ClientTokens []string

	// NodeName is sent in HELLO_OK. Default DefaultNodeName. At most 255 bytes.
	NodeName string

	// Standby makes RoleStandby the initial role (see Server.SetRole): the
	// node answers every HELLO (and any later frame) with NOT_ACTIVE (M)
	// carrying StandbyHint (at most 255 bytes), then closes.
	Standby     bool
	StandbyHint string

	clock clock // tests only: the scheduler's clock (nil: the real one)
	// mode: tests only: a mode of the test's own (a lockLog of its own,
	// lockpath.go), made by New instead of standalone's.
	mode func(*Server) mode

	// MaxLocks limits held (unexpired) locks; default DefaultMaxLocks.
	// MaxWaiters limits queued ACQUIREs over all keys; default DefaultMaxWaiters.
	// MaxKeyWaiters limits queued ACQUIREs for one key; default DefaultMaxKeyWaiters.
	// MaxSessions limits open sessions (enforced at HELLO with E(7));
	// default DefaultMaxSessions. A negative value is an error in New.
	MaxLocks, MaxWaiters, MaxKeyWaiters, MaxSessions int

	// MaxSessionsPerPeer limits the open sessions of one peer address (an
	// IPv4 address, or the /64 prefix of an IPv6 address), enforced at HELLO
	// with E(7) like MaxSessions. Default: a quarter of MaxSessions, but at
	// least 64 (and at most MaxSessions), so that one host cannot hold
	// every slot. Set it to MaxSessions to turn the per-peer limit off. A
	// negative value is an error in New.
	MaxSessionsPerPeer int

	// MaxPendingConns limits the connections that have not completed HELLO
	// yet (TLS handshake included); one peer address may hold a quarter of
	// them (but at least 64). A connection accepted beyond either limit is
	// closed at once, without a reply. Default: a tenth of MaxSessions, but
	// at least 64. A negative value is an error in New.
	MaxPendingConns int

	// IdleTimeout drops an idle session with E(1) "idle timeout", req_id 0.
	// A session is idle when it has sent no complete frame for IdleTimeout
	// and no request of it awaits a reply: while one of its ACQUIREs waits
	// in a queue it is never idle, and its clock restarts when the reply to
	// the last such ACQUIRE is queued. It is dropped between 1 and 1.25
	// IdleTimeouts after the later of its last complete frame and that
	// reply; a partly received frame does not count. Clients that have
	// nothing to wait for keep a session alive with PINGs; the broker sends
	// one every 10 s by default. Default DefaultIdleTimeout; a negative
	// value turns the timeout off.
	IdleTimeout time.Duration

	// HelloTimeout is how long a connection may take to complete HELLO
	// (including the TLS handshake); default DefaultHelloTimeout.
	HelloTimeout time.Duration

	// TLS, if non-nil, makes Serve wrap every accepted connection with
	// tls.Server(conn, TLS). Client-certificate verification is whatever
	// this config says.
	TLS *tls.Config

	// Logger receives the server's logs; nil discards them. Client tokens
	// are never logged.
	Logger *slog.Logger

	// Registerer, if non-nil, gets the server's Prometheus collectors
	// (see the metrics table of docs/operations.md).
	Registerer prometheus.Registerer

	// TokenBlock is how many tokens are reserved per fsync of the token
	// ceiling; default DefaultTokenBlock, at most MaxTokenBlock (2^32).
	TokenBlock uint64

	// TokenStart is where a NEW token store (a data dir without a token
	// ceiling) or a NEW cluster (a counter still at 0) starts issuing
	// tokens: TokenStartOne (the zero value, the default) at 1, as the
	// protocol says; TokenStartClock above the wall clock in microseconds
	// (ClockStart), so that a reinstalled or wiped server never issues
	// tokens below those an earlier installation issued. It is read only
	// when the store or cluster is created: persisted state always wins,
	// and a restart never reads the clock again. In a cluster the setting
	// of the first leader (the node whose takeover entry starts the
	// counter) decides; the nodes of a cluster should share it.
	// InitialToken is a floor in both modes.
	TokenStart TokenStart

	// InitialToken, if non-zero, makes tokens continue strictly above it
	// (and above the stored ceiling, whichever is higher: an InitialToken
	// below the ceiling is ignored, tokens never go back). A new data dir
	// (or cluster) starts at 1 without it (above the wall clock in
	// microseconds with TokenStartClock); InitialToken is a floor above
	// that, for a clock that cannot be trusted or a database that holds
	// higher tokens. It lets a data dir whose ceiling was lost start again (New
	// refuses a used data dir without a valid ceiling, ErrCeilingMissing),
	// and a migration continue above the tokens of another server. Set it
	// to at least the highest token ever issued to the fenced resources;
	// at most MaxToken minus one TokenBlock.
	InitialToken uint64

	// WriteTimeout is how long a session's socket may accept no bytes while
	// replies for it are pending before the session is dropped (a peer that
	// does not read). Replies are written in pieces of at most SocketBuffer
	// bytes, each of which must be taken within WriteTimeout: a slow reader
	// that makes progress is not dropped. Default DefaultWriteTimeout.
	// (Addition to the agreed contract.)
	WriteTimeout time.Duration

	// SocketBuffer is the kernel send and receive buffer size
	// (SO_SNDBUF/SO_RCVBUF) set on every accepted TCP connection, TLS or
	// not, so that peers that do not read cannot grow the kernel's TCP
	// memory without bound. Default DefaultSocketBuffer (64 KiB); a
	// negative value leaves the operating system's defaults (autotuning); a
	// positive value below MinSocketBuffer is an error in New.
	SocketBuffer int

	// OwnedReleaseOnly makes a lock granted to an ACQUIRE of a version-2
	// session releasable only by RELEASE_OWNED (V) with its token and its
	// owner: a plain RELEASE (U) of such a lock, from any session, gets N
	// and the lock stays held (until its lease ends or its holder's V).
	// Locks granted on version-1 sessions are released by U with their
	// token as always. With it, another client that guesses a token (tokens
	// are sequential) cannot free a version-2 client's lock without also
	// knowing its 16-byte owner. Off by default: the protocol lets any
	// RELEASE with the current token free the key. (Addition to the agreed
	// contract.)
	OwnedReleaseOnly bool

	// ConnBudget caps the connections accepted and not yet closed over
	// every listener of the server: the lock port's sessions and
	// connections before HELLO, a pair's peer listener, a cluster node's
	// Raft transport, and the listeners given to BudgetListener (the
	// admin port). A connection accepted beyond it is closed at once, with
	// a Warn line (at most one a second) and
	// ticketing_conn_budget_refused_total. Its last units (a quarter, at
	// most 64) are kept for connections from 127.0.0.1 and ::1 on a
	// BudgetListener, and from the configured members on the peer
	// listeners. Zero means the open-file limit (RLIMIT_NOFILE's soft
	// limit, which the Go runtime raises to the hard one at start) minus
	// FDReserve, at least 16, so that the token store's ceiling writes and
	// the Raft log's segment and snapshot files always find a descriptor;
	// where the limit cannot be read, and for a negative value, there is
	// no cap. (Addition to the agreed contract.)
	ConnBudget int

	// FDReserve is the descriptors the default ConnBudget leaves for
	// everything but accepted connections: standard streams, the runtime's
	// poller, listeners, the data directory's lock, the token store's
	// ceiling write (a temporary file and the directory), the Raft log's
	// open segments, their creation and the snapshots, outbound
	// connections to peers, and name lookups. Zero means DefaultFDReserve;
	// a negative value is an error in New.
	FDReserve int

	// Cluster, if non-nil, makes the server a node of a Raft cluster (see
	// ClusterConfig): only the leader serves, tokens come from the
	// replicated counter, and the Raft state is kept in DataDir/raft.
	Cluster *ClusterConfig
	// Pair, if non-nil, makes the server one node of a hot-standby pair
	// (see PairConfig): only the active node serves; every command it
	// applies is replicated to the passive node while the two are
	// connected; tokens carry an epoch in their high bits. Exclusive with
	// Cluster.
	Pair *PairConfig

	// OutputBuffer bounds the bytes of replies queued for one session that
	// its peer has not read yet; a session that exceeds it is dropped.
	// Default 1 MiB. (Addition to the agreed contract.)
	OutputBuffer int
}

const (
	defaultOutputBuffer = 1 << 20
	minPerPeerDefault   = 64
)

func (c *Config) normalize() error {
	if c.DataDir == "" {
		return fmt.Errorf("server: Config.DataDir is required")
	}
	for _, v := range []struct {
		name string
		v    *int
		def  int
	}{
		{"MaxLocks", &c.MaxLocks, DefaultMaxLocks},
		{"MaxWaiters", &c.MaxWaiters, DefaultMaxWaiters},
		{"MaxKeyWaiters", &c.MaxKeyWaiters, DefaultMaxKeyWaiters},
		{"MaxSessions", &c.MaxSessions, DefaultMaxSessions},
		{"MaxSessionsPerPeer", &c.MaxSessionsPerPeer, -1},
		{"MaxPendingConns", &c.MaxPendingConns, -1},
		{"OutputBuffer", &c.OutputBuffer, defaultOutputBuffer},
	} {
		if *v.v < 0 {
			return fmt.Errorf("server: Config.%s is negative (%d)", v.name, *v.v)
		}
		if *v.v == 0 {
			*v.v = v.def
		}
	}
	// The defaults that depend on MaxSessions (marked -1 above).
	if c.MaxSessionsPerPeer < 0 {
		c.MaxSessionsPerPeer = min(max(c.MaxSessions/4, minPerPeerDefault), c.MaxSessions)
	}
	if c.MaxPendingConns < 0 {
		c.MaxPendingConns = max(c.MaxSessions/10, minPerPeerDefault)
	}
	if c.FDReserve < 0 {
		return fmt.Errorf("server: Config.FDReserve is negative (%d)", c.FDReserve)
	}
	if c.FDReserve == 0 {
		c.FDReserve = DefaultFDReserve
	}
	if c.HelloTimeout < 0 {
		return fmt.Errorf("server: Config.HelloTimeout is negative (%v)", c.HelloTimeout)
	}
	if c.WriteTimeout < 0 {
		return fmt.Errorf("server: Config.WriteTimeout is negative (%v)", c.WriteTimeout)
	}
	if c.WriteTimeout == 0 {
		c.WriteTimeout = DefaultWriteTimeout
	}
	if c.IdleTimeout == 0 {
		c.IdleTimeout = DefaultIdleTimeout
	}
	if c.SocketBuffer == 0 {
		c.SocketBuffer = DefaultSocketBuffer
	}
	if c.SocketBuffer > 0 && c.SocketBuffer < MinSocketBuffer {
		return fmt.Errorf("server: Config.SocketBuffer %d is below MinSocketBuffer (%d); use a negative value for the operating system's defaults", c.SocketBuffer, MinSocketBuffer)
	}
	if c.HelloTimeout == 0 {
		c.HelloTimeout = DefaultHelloTimeout
	}
	if c.NodeName == "" {
		c.NodeName = DefaultNodeName
	}
	// The node name of HELLO_OK and the hint of NOT_ACTIVE have a one-byte
	// length, as the client name of HELLO.
	if len(c.NodeName) > wire.MaxNameLen {
		return fmt.Errorf("server: Config.NodeName longer than %d bytes", wire.MaxNameLen)
	}
	if len(c.StandbyHint) > wire.MaxNameLen {
		return fmt.Errorf("server: Config.StandbyHint longer than %d bytes", wire.MaxNameLen)
	}
	for i, t := range c.ClientTokens {
		if len(t) > wire.MaxTokenLen {
			return fmt.Errorf("server: Config.ClientTokens[%d] longer than %d bytes", i, wire.MaxTokenLen)
		}
	}
	if c.TokenBlock == 0 {
		c.TokenBlock = DefaultTokenBlock
	}
	if c.TokenBlock > MaxTokenBlock {
		return fmt.Errorf("server: Config.TokenBlock %d is above the maximum %d", c.TokenBlock, MaxTokenBlock)
	}
	if c.TokenStart != TokenStartOne && c.TokenStart != TokenStartClock {
		return fmt.Errorf("server: Config.TokenStart %d is neither TokenStartOne nor TokenStartClock", int(c.TokenStart))
	}
	if c.InitialToken > MaxToken-c.TokenBlock {
		return fmt.Errorf("server: Config.InitialToken %d leaves no room for a block of %d tokens below the maximum token %d", c.InitialToken, c.TokenBlock, MaxToken)
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.Pair != nil && c.Cluster != nil {
		return errors.New("server: Config.Pair and Config.Cluster are exclusive")
	}
	if c.Cluster != nil {
		cc := *c.Cluster // the caller's struct is not modified
		if err := cc.validate(c); err != nil {
			return err
		}
		c.Cluster = &cc
	}
	if c.Pair != nil {
		pc := *c.Pair // the caller's struct is not modified
		if err := pc.validate(c); err != nil {
			return err
		}
		c.Pair = &pc
	}
	return nil
}
