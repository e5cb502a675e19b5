package main

import (
	"net"
	"time"

	"github.com/ticketing-dev/ticketing/internal/connlimit"
	"github.com/ticketing-dev/ticketing/server"
)

// minPairHeartbeat is the smallest --heartbeat: the peer counts as dead
// after two heartbeats, and a shorter interval would take a scheduling
// pause or a busy host's hiccup for a dead peer.
const minPairHeartbeat = 100 * time.Millisecond

// pairOnly are the settings that mean something only with --pair.
func (o *serveOptions) pairOnly() []modeSetting {
	return []modeSetting{
		{"pair-id", o.PairID != ""},
		{"peer", o.Peer != ""},
		{"peer-listen", o.PeerListen != ""},
		{"heartbeat", o.Heartbeat != server.DefaultPairHeartbeat},
		{"peer-plaintext", o.PeerPlaintext},
		{"peer-max-conns", o.PeerMaxConns != 0},
		{"peer-max-conns-per-source", o.PeerMaxConnsPerSource != 0},
	}
}

// checkPair validates the settings of a pair node (checkModes calls it
// with --pair): the role, --peer and --peer-listen are required, and the
// rest must be consistent.
func (o *serveOptions) checkPair(src func(string) string) error {
	switch server.PairRole(o.Pair) {
	case server.PairPrimary, server.PairBackup:
	default:
		return usagef("invalid %s %q: want %s or %s", src("pair"), o.Pair, server.PairPrimary, server.PairBackup)
	}
	if o.Standby {
		return usagef("%s and --pair exclude each other: a pair node's role follows the pair's state machine", src("standby"))
	}
	if o.StandbyHint != "" {
		return usagef("%s and --pair exclude each other: a pair node's hint is its peer's --advertise address", src("standby-hint"))
	}
	if o.PairID != "" && !validNodeID(o.PairID) {
		return usagef("invalid %s %q: want 1 to %d letters, digits, '.', '_' or '-'", src("pair-id"), o.PairID, maxNodeIDLen)
	}
	if o.Peer == "" {
		return usagef("--pair needs --peer, the other node's peer address (its --peer-listen)")
	}
	// The peer address is dialled: a specific host.
	if err := checkHostPort(src("peer"), o.Peer, hostPortRule{}); err != nil {
		return err
	}
	if o.PeerListen == "" {
		return usagef("--pair needs --peer-listen, the address this node takes its peer's link on")
	}
	// The peer dials it: a fixed port.
	if err := checkHostPort(src("peer-listen"), o.PeerListen, hostPortRule{wildcard: true}); err != nil {
		return err
	}
	if o.Peer == o.PeerListen {
		return usagef("%s %q is this node's own %s: give the other node's peer address", src("peer"), o.Peer, src("peer-listen"))
	}
	if err := o.checkAdvertise("--pair", src); err != nil {
		return err
	}
	if err := o.checkPeerTLSFiles(); err != nil {
		return err
	}
	if o.PeerTLSCert == "" && !o.PeerPlaintext {
		for _, name := range []string{"peer", "peer-listen"} {
			addr := map[string]string{"peer": o.Peer, "peer-listen": o.PeerListen}[name]
			if !connlimit.LoopbackHostPort(addr) {
				return usagef("%s %q is not a loopback address and the peer link is plain TCP (no --peer-tls-cert): anyone who reaches it could pose as the peer; give --peer-tls-cert, --peer-tls-key and --peer-tls-ca (ticketingd init --pair writes them), or --peer-plaintext on a network nobody else reaches", src(name), addr)
			}
		}
	} else if o.PeerTLSCert != "" && o.PeerPlaintext {
		return usagef("%s and --peer-tls-cert exclude each other", src("peer-plaintext"))
	}
	if o.Heartbeat < minPairHeartbeat {
		return usagef("invalid %s %v: must be at least %v", src("heartbeat"), o.Heartbeat, minPairHeartbeat)
	}
	return nil
}

// pairConfig builds the server's PairConfig from validated options, the
// lock port's bound address (--advertise's default when --listen has port
// 0) and the peer TLS from loadPeerTLS (nil: plain TCP).
func pairConfig(o *serveOptions, listen net.Addr, pt *peerTLS) *server.PairConfig {
	pc := &server.PairConfig{
		Role:          server.PairRole(o.Pair),
		ID:            o.PairID,
		Peer:          o.Peer,
		Listen:        o.PeerListen,
		Advertise:     o.clientAdvertise(listen),
		Heartbeat:     o.Heartbeat,
		PeerPlaintext: o.PeerPlaintext,

		MaxPeerConns:          o.PeerMaxConns,
		MaxPeerConnsPerSource: o.PeerMaxConnsPerSource,
	}
	if pt != nil {
		cert := pt.cert
		pc.PeerCertificate, pc.PeerRoots = &cert, pt.roots
	}
	return pc
}

// pairPeerConnsNeed is the open files a pair's peer listener may take: its
// connections before the hello (capped), the peer's own slots, and the
// link both ways.
func pairPeerConnsNeed(o *serveOptions) uint64 {
	n := o.PeerMaxConns
	if n == 0 {
		n = server.DefaultPairPeerConns
	}
	return uint64(n) + server.PairPeerSlots + 2
}
