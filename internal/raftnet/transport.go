package raftnet

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"time"

	"github.com/ticketing-dev/ticketing/internal/raft"

	"github.com/ticketing-dev/ticketing/internal/connlimit"
)

// Config configures New. Only BindAddr is required.
type Config struct {
	// BindAddr is the TCP address to listen on for peers (the future
	// --raft-listen), e.g. "0.0.0.0:7947" or "127.0.0.1:0". With TLS and a
	// specific IP, the transport also dials its peers from that IP, so
	// that they see its connections come from it (see Members).
	BindAddr string

	// Advertise is the address peers dial to reach this node (the future
	// --raft-advertise), which is also the node's raft.ServerAddress in the
	// cluster configuration. It must be a *net.TCPAddr with a specified IP.
	// Nil means the listener's address, which must then be specified too.
	// With TLS, the node's certificate must hold Advertise's IP as a SAN,
	// because peers verify the certificate against the address they dial.
	Advertise net.Addr

	// TLS is the node's certificate and the cluster CA pool. Nil means
	// plain TCP: New then logs a warning, since anyone who can reach
	// BindAddr can join the cluster, vote and append to its log.
	TLS *PeerTLS

	// MaxPool is the number of idle connections kept per peer; zero means 3.
	MaxPool int

	// Timeout bounds each dial and each RPC's I/O; zero means 10s.
	Timeout time.Duration

	// HandshakeTimeout bounds an inbound TLS handshake, so that a stranger
	// who connects and stalls holds a handshake slot for at most this long;
	// zero means 2s. A peer's handshake takes about one round trip after
	// the accept (the peer's hello comes with its connection; then the
	// node's flight and the peer's certificate and Finished), plus
	// milliseconds of signing and verifying: under a millisecond of network
	// on a LAN, about 300ms between continents. 2s leaves room for a lost
	// packet's retransmission over a WAN; a handshake cut off is retried by
	// the peer's raft.
	// Unused without TLS.
	HandshakeTimeout time.Duration

	// Members, if non-nil, returns the Raft addresses (host:port) of the
	// cluster's members: the servers of the latest configuration. Inbound
	// connections whose source IP is a member's get MemberHandshakes slots
	// per IP of their own, which no other source can take. New calls it
	// once, and the transport every second after that until Close, outside
	// any lock of its own; it must be safe for concurrent use and fast.
	// Host names among the addresses are resolved when the addresses
	// change and every 30s. Nil: every source shares MaxHandshakes.
	// Unused without TLS.
	Members func() []raft.ServerAddress

	// MemberHandshakes is the number of inbound TLS handshakes in progress
	// reserved for each member IP (see Members); beyond them a member's
	// connections take shared slots. A node opens about three connections
	// to a peer at once when it becomes leader. Zero means 8. Unused
	// without TLS.
	MemberHandshakes int

	// MaxHandshakes caps the inbound TLS handshakes in progress outside the
	// members' slots: from sources that are not members (strangers, a node
	// being added before the configuration lists it), and from members
	// beyond their own slots. A connection for which there is no slot is
	// closed at once (a peer's raft retries). Zero means 64. Unused without
	// TLS.
	MaxHandshakes int

	// MaxHandshakesPerSource caps the shared handshakes in progress from
	// one source: one IPv4 address, or one IPv6 /64. Zero means 8. Unused
	// without TLS.
	MaxHandshakesPerSource int

	// Budget, if not nil, is the process's connection budget: every
	// inbound connection takes a unit of it until it closes, and one
	// beyond it is closed at accept. With TLS, members' IPs (see Members)
	// may take its preferred units.
	Budget *connlimit.Budget

	// Logger receives the transport's log lines (failed handshakes at Warn,
	// at most one line a second with a count of the suppressed ones), and,
	// through HCLogger, those of raft's NetworkTransport. Nil discards them.
	Logger *slog.Logger
}

// New listens on cfg.BindAddr and returns a raft transport over it: mutual
// TLS with cfg.TLS, or plain TCP (with a warning) when cfg.TLS is nil.
// Closing the returned transport closes the listener and every peer
// connection it accepted or dialled, and, with TLS, waits for the stream
// layer's goroutines.
func New(cfg Config) (*raft.NetworkTransport, error) {
	if cfg.BindAddr == "" {
		return nil, errors.New("raftnet: no bind address")
	}
	if cfg.MaxPool == 0 {
		cfg.MaxPool = 3
	}
	if cfg.Timeout == 0 {
		cfg.Timeout = 10 * time.Second
	}
	if cfg.HandshakeTimeout == 0 {
		cfg.HandshakeTimeout = 2 * time.Second
	}
	if cfg.MemberHandshakes == 0 {
		cfg.MemberHandshakes = 8
	}
	if cfg.MaxHandshakes == 0 {
		cfg.MaxHandshakes = 64
	}
	if cfg.MaxHandshakesPerSource == 0 {
		cfg.MaxHandshakesPerSource = 8
	}
	if cfg.MaxPool < 0 || cfg.Timeout < 0 || cfg.HandshakeTimeout < 0 ||
		cfg.MemberHandshakes < 0 || cfg.MaxHandshakes < 0 || cfg.MaxHandshakesPerSource < 0 {
		return nil, errors.New("raftnet: negative MaxPool, Timeout, HandshakeTimeout, MemberHandshakes, MaxHandshakes or MaxHandshakesPerSource")
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if cfg.Advertise != nil {
		if err := checkAdvertise(cfg.Advertise); err != nil {
			return nil, err
		}
	}
	ln, err := net.Listen("tcp", cfg.BindAddr)
	if err != nil {
		return nil, fmt.Errorf("raftnet: listen: %w", err)
	}
	advertise := cfg.Advertise
	if advertise == nil {
		advertise = ln.Addr()
		if err := checkAdvertise(advertise); err != nil {
			_ = ln.Close()
			return nil, fmt.Errorf("%w (listening on %s: set the advertise address)", err, advertise)
		}
	}
	var stream raft.StreamLayer
	if cfg.TLS != nil {
		stream = newTLSStream(ln, advertise, cfg.TLS, streamConfig{
			handshakeTimeout: cfg.HandshakeTimeout,
			maxShared:        cfg.MaxHandshakes, perSource: cfg.MaxHandshakesPerSource, perMember: cfg.MemberHandshakes,
			members: cfg.Members, budget: cfg.Budget,
		}, log)
	} else {
		log.Warn("raft peer transport without TLS: anyone who can reach this address can join the cluster, vote and append to its log; set --peer-tls-cert, --peer-tls-key and --peer-tls-ca",
			"listen", ln.Addr().String(), "advertise", advertise.String())
		stream = &tcpStream{ln: cfg.Budget.Listener(ln, "raft", nil), advertise: advertise}
	}
	return raft.NewNetworkTransportWithConfig(&raft.NetworkTransportConfig{
		Stream:  stream,
		MaxPool: cfg.MaxPool,
		Timeout: cfg.Timeout,
		Logger:  HCLogger(log),
	}), nil
}

// checkAdvertise accepts a TCP address with a specified IP.
func checkAdvertise(a net.Addr) error {
	ta, ok := a.(*net.TCPAddr)
	if !ok {
		return fmt.Errorf("%w: %s is a %T, not a *net.TCPAddr", ErrAdvertise, a, a)
	}
	if ta.IP == nil || ta.IP.IsUnspecified() {
		return fmt.Errorf("%w: %s has no specified IP", ErrAdvertise, a)
	}
	return nil
}

// tcpStream is the plain TCP stream layer, like raft's TCPStreamLayer
// (which cannot be built around a listener from outside raft), except that
// Close also closes the connections it accepted or dialled.
type tcpStream struct {
	ln        net.Listener
	advertise net.Addr
	conns     connSet
}

func (s *tcpStream) Accept() (net.Conn, error) {
	for {
		c, err := s.ln.Accept()
		if err != nil {
			return nil, err
		}
		if tc, ok := s.conns.track(c); ok {
			return tc, nil
		}
	}
}

func (s *tcpStream) Close() error {
	if !s.conns.close() {
		return nil
	}
	return s.ln.Close()
}

func (s *tcpStream) Addr() net.Addr { return s.advertise }

func (s *tcpStream) Dial(address raft.ServerAddress, timeout time.Duration) (net.Conn, error) {
	return s.conns.dialled(net.DialTimeout("tcp", string(address), timeout))
}
