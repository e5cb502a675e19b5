package server

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"time"

	"github.com/ticketing-dev/ticketing/internal/connlimit"
	"github.com/ticketing-dev/ticketing/internal/raftnet"
	"github.com/ticketing-dev/ticketing/internal/wire"
	"github.com/ticketing-dev/ticketing/server/internal/replica"
)

// PairRole is the role a node of a hot-standby pair is started with: the
// Binary Star pattern's PRIMARY or BACKUP. It is fixed by configuration;
// which node is active changes at runtime (Server.Status().Role).
type PairRole string

// The two starting roles of a pair.
const (
	// PairPrimary serves clients as soon as it starts (after one
	// heartbeat's check that the backup is not already active), and
	// becomes active when it hears its backup.
	PairPrimary PairRole = "primary"
	// PairBackup serves no client until it has been passive behind an
	// active primary and a client then comes to it after the primary went
	// silent.
	PairBackup PairRole = "backup"
)

// DefaultPairHeartbeat is PairConfig.Heartbeat's default: the Guide's
// HEARTBEAT. The peer counts as dead two heartbeats after its last one.
const DefaultPairHeartbeat = time.Second

// PairConfig makes a server one node of a hot-standby pair (the Binary
// Star pattern; docs/ha.md "Hot-standby pair"). Exactly one of Config.Pair
// and Config.Cluster may be set.
type PairConfig struct {
	// Role is the node's starting role, PairPrimary or PairBackup; the
	// two nodes of a pair must have different ones. Required.
	Role PairRole

	// Peer is the other node's peer address (its Listen, or the address
	// it is reached at): host:port. Required.
	Peer string

	// Listen is the host:port the node accepts its peer's link on.
	// Required unless listener is set (tests).
	Listen string

	// Advertise is the client address (host:port) the peer gives as the
	// NOT_ACTIVE hint while this node is active. Required; at most 255
	// bytes.
	Advertise string

	// ID is the pair's identity, which a version-3 HELLO_OK carries so
	// that a client never uses two groups as one service: 1 to 64
	// letters, digits, '.', '_' or '-' (NewClusterID draws one), the same
	// on both nodes (ticketingd init --pair writes it). Empty: the primary
	// draws one at its first start and the backup adopts its primary's at
	// their first contact; either way it is kept in the data dir
	// (pair.id), and a node refuses to start with an ID other than the one
	// recorded there, and refuses a peer link from a node of another pair.
	ID string

	// Heartbeat is the interval of the nodes' heartbeats; the peer counts
	// as dead after two intervals without one. Default
	// DefaultPairHeartbeat; both nodes should use the same.
	Heartbeat time.Duration

	// PeerCertificate and PeerRoots, given together, secure the peer link
	// with mutual TLS (TLS 1.3) against the pair's CA, exactly as
	// ClusterConfig's fields of the same names do for the Raft transport
	// (the dialling node checks that its peer's certificate names the host
	// of Peer). Neither set means plain TCP, and New logs a warning;
	// plain TCP off loopback needs PeerPlaintext.
	PeerCertificate *tls.Certificate
	PeerRoots       *x509.CertPool

	// PeerPlaintext accepts a plain TCP peer link (no PeerCertificate)
	// off loopback. Without it, New refuses a plaintext pair whose Listen
	// or Peer is not a loopback address, and a plaintext node refuses a
	// peer link from a non-loopback address: anyone who reaches the peer
	// port of a plaintext pair can pose as the peer (the pair ID it checks
	// is no secret), and a peer can make a node step down, or take a
	// higher token epoch. Set it only on a network that nobody else
	// reaches.
	PeerPlaintext bool

	// MaxPeerConns caps the connections the peer listener holds from
	// addresses other than Peer's (its host resolved), whose IPs have
	// PairPeerSlots of their own: strangers, or the peer connecting from
	// another address. A connection beyond it is closed at once. Zero
	// means DefaultPairPeerConns.
	MaxPeerConns int

	// MaxPeerConnsPerSource caps the connections of MaxPeerConns from one
	// source: an IPv4 address or an IPv6 /64. Zero means
	// DefaultPairPeerConnsPerSource.
	MaxPeerConnsPerSource int

	// HelloTimeout bounds an inbound peer connection's TLS handshake and
	// hello: a connection that has not completed them by then is closed.
	// Zero means two heartbeat intervals.
	HelloTimeout time.Duration

	// listener, if set, is used instead of listening on Listen (tests).
	listener net.Listener
	// peerTLS is made of PeerCertificate and PeerRoots by validate.
	peerTLS *raftnet.PeerTLS
}

// validate checks pc and fills its defaults (for New).
func (pc *PairConfig) validate(c *Config) error {
	switch pc.Role {
	case PairPrimary, PairBackup:
	default:
		return fmt.Errorf("server: PairConfig.Role %q: want %q or %q", pc.Role, PairPrimary, PairBackup)
	}
	if pc.Peer == "" {
		return errors.New("server: PairConfig.Peer (the other node's peer address) is required")
	}
	if err := replica.DialableHostPort(pc.Peer); err != nil {
		return fmt.Errorf("server: PairConfig.Peer: %w", err)
	}
	if pc.listener == nil {
		if pc.Listen == "" {
			return errors.New("server: PairConfig.Listen (this node's peer address) is required")
		}
		if _, _, err := net.SplitHostPort(pc.Listen); err != nil {
			return fmt.Errorf("server: PairConfig.Listen: %w", err)
		}
	}
	if pc.Advertise == "" {
		return errors.New("server: PairConfig.Advertise (the client address the peer gives as hint) is required")
	}
	if len(pc.Advertise) > wire.MaxNameLen {
		return fmt.Errorf("server: PairConfig.Advertise longer than %d bytes", wire.MaxNameLen)
	}
	if pc.ID != "" && !replica.ValidID(pc.ID) {
		return replica.IDError("PairConfig.ID", pc.ID)
	}
	if pc.Heartbeat < 0 {
		return fmt.Errorf("server: PairConfig.Heartbeat is negative (%v)", pc.Heartbeat)
	}
	if pc.Heartbeat == 0 {
		pc.Heartbeat = DefaultPairHeartbeat
	}
	if pc.MaxPeerConns < 0 || pc.MaxPeerConnsPerSource < 0 || pc.HelloTimeout < 0 {
		return fmt.Errorf("server: PairConfig.MaxPeerConns, MaxPeerConnsPerSource or HelloTimeout is negative")
	}
	if pc.MaxPeerConns == 0 {
		pc.MaxPeerConns = DefaultPairPeerConns
	}
	if pc.MaxPeerConnsPerSource == 0 {
		pc.MaxPeerConnsPerSource = DefaultPairPeerConnsPerSource
	}
	if c.Standby {
		return errors.New("server: Config.Standby and Config.Pair are exclusive (a pair node's role follows the pair's state machine)")
	}
	var err error
	if pc.peerTLS, err = replica.PeerTLS("PairConfig", pc.PeerCertificate, pc.PeerRoots); err != nil {
		return err
	}
	if pc.peerTLS == nil && !pc.PeerPlaintext {
		listen := pc.Listen
		if pc.listener != nil {
			listen = pc.listener.Addr().String()
		}
		for _, a := range []struct{ field, addr string }{{"Listen", listen}, {"Peer", pc.Peer}} {
			if !connlimit.LoopbackHostPort(a.addr) {
				return fmt.Errorf("server: PairConfig.%s %q is not a loopback address, and the peer link is plain TCP: anyone who reaches it could pose as the peer; give PeerCertificate and PeerRoots (mutual TLS), or set PeerPlaintext on a network nobody else reaches", a.field, a.addr)
			}
		}
	}
	return nil
}

// loopbackAddr reports whether a is a loopback TCP address.
func loopbackAddr(a net.Addr) bool {
	ta, ok := a.(*net.TCPAddr)
	return ok && ta.IP.IsLoopback()
}
