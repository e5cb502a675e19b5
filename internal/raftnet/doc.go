// Package raftnet is the peer transport of ticketingd's cluster mode: a
// hashicorp/raft NetworkTransport over mutual TLS with a cluster CA, or over
// plain TCP with a warning.
//
// # Use
//
// New listens and returns a *raft.NetworkTransport for raft.NewRaft.
// LoadPeerTLS reads the node's certificate, key and the cluster CA bundle
// from PEM files (--peer-tls-cert, --peer-tls-key and --peer-tls-ca);
// NewPeerTLS builds the same from memory (server.ClusterConfig's
// PeerCertificate and PeerRoots), and LoadPeerFiles only reads the files
// for it. HCLogger adapts a *slog.Logger to the hclog.Logger that raft
// wants. Config.Members tells the transport who the cluster's members
// are, so that their connections get handshake slots no stranger can take
// (see Denial of service).
//
// # Trust model
//
// Every peer connection is TLS 1.3 (all its cipher suites are AEAD) with
// mutual authentication. The accepting node requires a client certificate
// and verifies it against the cluster CA pool
// (tls.RequireAndVerifyClientCert); the dialling node verifies the
// accepting node's certificate against the same pool and against the host
// of the address it dials (an IP or DNS SAN, as for HTTPS). On both sides
// the peer's leaf must also be a node certificate: it must carry both
// extended key usages ServerAuth and ClientAuth (pki.Node). That tells node
// certificates apart from the client-facing listener's server certificate
// and its clients' certificates, should an operator sign those with the
// same CA; a separate cluster CA, as 'ticketingd init --cluster' writes, is
// still the recommended set-up.
//
// What is authenticated is cluster membership, not a node's Raft identity.
// raft.ServerID travels inside each RPC (RPCHeader.ID) and is not bound to
// the certificate: raft's NetworkTransport decodes RPCs where the stream
// layer cannot see them, and hands them to raft without the connection
// they came on. The binding that does exist is address to certificate, on
// the dialling side: a node reaching a peer at its raft.ServerAddress (its
// advertised address, the one in the cluster configuration) gets a
// connection only if the certificate there names that address.
//
// A stranger without a certificate from a CA in the pool (or with an
// expired one, or with a certificate of another kind) cannot complete a
// handshake, so it cannot send RequestVote, AppendEntries or
// InstallSnapshot to a node, cannot be reached as a peer if an operator adds
// its address, and, having no node that will talk to it, cannot join. Its
// failed handshakes are logged at Warn, at most one line a second with the
// count of the lines suppressed, and never reach raft. (Failed handshakes
// from members' addresses have a line a second of their own, so that a
// flood does not hide a member whose certificate has expired.)
//
// A stolen node certificate and key allow everything a node can do: vote,
// append entries under a higher term, replace the leader, and so issue
// tokens, from any address that can reach the peer ports; and to serve as
// that node to peers that dial the node's address, for whoever can also
// take that address over. There is no revocation list: the remedy is a CA
// rotation that leaves the stolen certificate's CA out.
//
// # Rotation
//
// The CA file may hold several CA certificates, all trusted. A rotation
// is three rolling restarts, one node at a time, the cluster keeping its
// quorum throughout: (1) add the new CA to every node's CA file; (2) give
// every node a certificate from the new CA; (3) remove the old CA. Between
// the steps every pair of nodes trusts each other's certificate. A node's
// certificate must be renewed the same way before it expires, since an
// expired certificate fails the handshake like a stranger's. Certificates
// are checked at the handshake only: a connection made before a
// certificate expired or its CA left the pool lasts until it closes, which
// the restart of either end ensures.
//
// # Denial of service
//
// Handshakes run off raft's accept loop, each under Config.HandshakeTimeout
// (2s by default), in slots that a gate hands out by source IP. Each
// member's IP (Config.Members: the addresses of the cluster configuration,
// names resolved) has Config.MemberHandshakes slots of its own; every
// other source shares Config.MaxHandshakes slots, at most
// Config.MaxHandshakesPerSource from one IPv4 address or IPv6 /64, which a
// member may also use beyond its own. A connection for which there is no
// slot is closed at once, and the refusal logged at Warn, at most one line
// a second (with the count of the lines suppressed) for strangers and one
// for members' addresses, apart from the failed handshakes. A transport
// listening on a specific IP dials from it, so that its peers see its
// connections come from its address in the configuration.
//
// A stranger without a certificate, however many addresses it connects
// from and however fast, therefore cannot take the slots of the members,
// and from one address holds at most MaxHandshakesPerSource slots for
// HandshakeTimeout each. What it can still do:
//
//   - from the IP of a member (the same host, the same NAT, or an on-path
//     attacker), take that member's slots and delay its connections;
//   - from about MaxHandshakes/MaxHandshakesPerSource addresses (or IPv6
//     /64s), fill the shared slots, which delays the connections of a node
//     that is not a member yet (a node being added, until its entry is in
//     the configuration of the node it connects to), and of a member that
//     connects from another IP than its address's;
//   - make the node do a TLS handshake (a signature) for every connection
//     it completes fast, and fill the listener's queue: costs in CPU and
//     in the kernel that the gate does not bound.
//
// These are floods to stop at the network, which should not expose peer
// ports beyond the cluster anyway.
//
// # Concurrency
//
// A transport from New is safe for concurrent use, as raft requires.
// Closing it (raft's Shutdown does not; call Close on the transport after
// it) closes the listener and every peer connection it accepted or dialled,
// which raft's own TCP transport leaves open, and returns after the stream
// layer's goroutines have exited.
package raftnet
