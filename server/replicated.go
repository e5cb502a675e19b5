package server

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"

	"github.com/ticketing-dev/ticketing/internal/raftnet"
)

// What the two replicated modes share, the Raft cluster (log_cluster*.go)
// and the hot-standby pair (log_pair*.go), in one place that both use: the
// effects only a replicated core has (replicated), and the mutual TLS
// between the nodes (peerTLSOf). The group's identity that a version-3
// HELLO_OK carries is Server.group, which each sets (role.go: groupID);
// the lock path both run is session_shard.go's, as standalone's is.

// replicated is what a replicated mode does with the effects only its
// core has.
type replicated interface {
	proposalLimited()      // an ACQUIRE answered B: Config.MaxPending commands await their apply
	slowCommit(took int64) // a grant answered B: it applied took ns after its proposal
	resync(key string)     // a command did not apply as projected: key's projection from the machine
}

// peerTLSOf checks a config's PeerCertificate and PeerRoots (its type
// named in the errors) and makes a raftnet.PeerTLS of them; nil without
// them.
func peerTLSOf(config string, cert *tls.Certificate, roots *x509.CertPool) (*raftnet.PeerTLS, error) {
	switch {
	case cert == nil && roots == nil:
		return nil, nil
	case cert == nil:
		return nil, fmt.Errorf("server: %s.PeerRoots without PeerCertificate: give both (mutual TLS between the nodes) or neither (plain TCP)", config)
	case roots == nil:
		return nil, fmt.Errorf("server: %s.PeerCertificate without PeerRoots: give both (mutual TLS between the nodes) or neither (plain TCP)", config)
	}
	p, err := raftnet.NewPeerTLS(*cert, roots)
	if err != nil {
		return nil, fmt.Errorf("server: %s.PeerCertificate: %w", config, err)
	}
	return p, nil
}
