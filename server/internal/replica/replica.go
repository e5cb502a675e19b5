// Package replica holds what the server's two replicated modes, the Raft
// cluster and the hot-standby pair, share: their identities (the rule for
// a node's, a cluster's and a pair's ID, and a new random one), the
// addresses their nodes give each other, and the mutual TLS between them. Each mode imports it; neither uses the other's files for
// these.
package replica

import (
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"fmt"
	"net"

	"github.com/ticketing-dev/ticketing/internal/raftnet"
)

// MaxIDLen is the longest ID.
const MaxIDLen = 64

// ValidID reports whether id can name a node, a cluster or a pair: 1 to
// MaxIDLen bytes of ASCII letters, digits, '.', '_' and '-', and neither
// "." nor "..", which as a directory name (a deployment bundle's, a data
// directory's) would name another one.
func ValidID(id string) bool {
	if len(id) == 0 || len(id) > MaxIDLen || id == "." || id == ".." {
		return false
	}
	for _, r := range id {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '.' || r == '_' || r == '-') {
			return false
		}
	}
	return true
}

// IDError is the error of an invalid ID, what naming its setting.
func IDError(what, id string) error {
	return fmt.Errorf("server: %s %q: must be 1 to %d letters, digits, '.', '_' or '-' (not . or ..)", what, id, MaxIDLen)
}

// PeerTLS checks a config's PeerCertificate and PeerRoots (config names
// its type in the errors) and makes the transports' raftnet.PeerTLS of
// them; nil without them.
func PeerTLS(config string, cert *tls.Certificate, roots *x509.CertPool) (*raftnet.PeerTLS, error) {
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

// NewID returns a random identity for a cluster or a pair: 128 bits as
// 32 lowercase hexadecimal digits.
func NewID() string {
	var b [16]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// DialableHostPort checks that a, HOST:PORT, is an address other nodes
// can dial: not a wildcard and not without a host.
func DialableHostPort(a string) error {
	host, _, err := net.SplitHostPort(a)
	if err != nil {
		return err
	}
	if host == "" || host == "0.0.0.0" || host == "::" {
		return fmt.Errorf("%q is not an address other nodes can dial", a)
	}
	return nil
}
