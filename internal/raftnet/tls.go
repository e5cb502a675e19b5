package raftnet

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"slices"
)

// PeerTLS is a node's identity and trust for the peer transport: its node
// certificate and key, and the pool of cluster CAs whose node certificates it
// accepts from peers. It is immutable and safe for concurrent use.
type PeerTLS struct {
	cert  tls.Certificate
	roots *x509.CertPool
}

// NewPeerTLS returns the PeerTLS of a node that presents cert and trusts the
// node certificates signed by a CA in roots. It checks cert now, so that a
// wrong file fails at start rather than at the first handshake: cert must
// have a private key, verify against roots at the current time, and be a
// node certificate (ErrNotNodeCertificate otherwise). cert.Leaf is parsed
// from cert.Certificate[0] when nil. The certificates after the leaf in
// cert.Certificate are sent to peers as intermediates.
func NewPeerTLS(cert tls.Certificate, roots *x509.CertPool) (*PeerTLS, error) {
	if len(cert.Certificate) == 0 || cert.PrivateKey == nil {
		return nil, errors.New("raftnet: peer TLS: certificate or key missing")
	}
	if roots == nil {
		return nil, errors.New("raftnet: peer TLS: no CA pool")
	}
	if cert.Leaf == nil {
		leaf, err := x509.ParseCertificate(cert.Certificate[0])
		if err != nil {
			return nil, fmt.Errorf("raftnet: peer TLS: parse certificate: %w", err)
		}
		cert.Leaf = leaf
	}
	if err := verifyNode(cert.Leaf, intermediates(cert.Certificate[1:]), roots); err != nil {
		return nil, fmt.Errorf("raftnet: peer TLS: own certificate: %w", err)
	}
	return &PeerTLS{cert: cert, roots: roots}, nil
}

// LoadPeerTLS reads a PeerTLS from PEM files, the flags --peer-tls-cert,
// --peer-tls-key and --peer-tls-ca: LoadPeerFiles, then NewPeerTLS and its
// checks.
func LoadPeerTLS(certFile, keyFile, caFile string) (*PeerTLS, error) {
	cert, roots, err := LoadPeerFiles(certFile, keyFile, caFile)
	if err != nil {
		return nil, err
	}
	return NewPeerTLS(cert, roots)
}

// LoadPeerFiles reads what NewPeerTLS takes from PEM files: certFile holds
// the node certificate (optionally followed by intermediates), keyFile its
// private key, and caFile one or more CA certificates. During a CA
// rotation caFile holds both the old and the new CA. It checks only that
// the files can be read and parsed; NewPeerTLS checks the certificate.
func LoadPeerFiles(certFile, keyFile, caFile string) (tls.Certificate, *x509.CertPool, error) {
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		return tls.Certificate{}, nil, fmt.Errorf("raftnet: peer TLS: load key pair: %w", err)
	}
	caPEM, err := os.ReadFile(caFile)
	if err != nil {
		return tls.Certificate{}, nil, fmt.Errorf("raftnet: peer TLS: read CA file: %w", err)
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(caPEM) {
		return tls.Certificate{}, nil, fmt.Errorf("raftnet: peer TLS: no certificate in CA file %s", caFile)
	}
	return cert, roots, nil
}

// Leaf returns the node's own certificate.
func (p *PeerTLS) Leaf() *x509.Certificate { return p.cert.Leaf }

// ServerConfig is the TLS configuration of the accepting side (the Raft
// transport's, and the pair link's): TLS 1.3
// only, the peer must present a certificate that verifies against the CA
// pool (RequireAndVerifyClientCert) and is a node certificate.
func (p *PeerTLS) ServerConfig() *tls.Config {
	return &tls.Config{
		MinVersion:       tls.VersionTLS13,
		Certificates:     []tls.Certificate{p.cert},
		ClientAuth:       tls.RequireAndVerifyClientCert,
		ClientCAs:        p.roots,
		VerifyConnection: p.verifyConnection,
	}
}

// ClientConfig is the TLS configuration of the dialling side for a peer at
// host: TLS 1.3 only, the peer's certificate must verify against the CA pool
// for host (an IP or DNS SAN) and be a node certificate. The node's own
// certificate is always sent, whatever CA names the server asks for, so
// that during a rotation a peer that does not trust the new CA yet says so
// in its log instead of seeing no certificate at all.
func (p *PeerTLS) ClientConfig(host string) *tls.Config {
	cert := p.cert
	return &tls.Config{
		MinVersion: tls.VersionTLS13,
		ServerName: host,
		RootCAs:    p.roots,
		GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			return &cert, nil
		},
		VerifyConnection: p.verifyConnection,
	}
}

// verifyConnection runs on both sides after crypto/tls has verified the
// peer's chain (against ClientCAs for client certificates, against RootCAs
// and the host name for server certificates). It requires a verified chain,
// which also holds if ClientAuth were ever weakened, and a node
// certificate.
func (p *PeerTLS) verifyConnection(cs tls.ConnectionState) error {
	if len(cs.PeerCertificates) == 0 || len(cs.VerifiedChains) == 0 {
		return ErrNoPeerCertificate
	}
	if !isNode(cs.PeerCertificates[0]) {
		return ErrNotNodeCertificate
	}
	return nil
}

// verifyNode checks that leaf verifies against roots, now, as a node
// certificate.
func verifyNode(leaf *x509.Certificate, inter *x509.CertPool, roots *x509.CertPool) error {
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: roots, Intermediates: inter,
		KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}}); err != nil {
		return err
	}
	if !isNode(leaf) {
		return ErrNotNodeCertificate
	}
	return nil
}

// isNode reports whether c carries both ServerAuth and ClientAuth.
func isNode(c *x509.Certificate) bool {
	return slices.Contains(c.ExtKeyUsage, x509.ExtKeyUsageServerAuth) &&
		slices.Contains(c.ExtKeyUsage, x509.ExtKeyUsageClientAuth)
}

// intermediates parses DER certificates into a pool, skipping any that do
// not parse (the handshake would reject them anyway).
func intermediates(ders [][]byte) *x509.CertPool {
	pool := x509.NewCertPool()
	for _, der := range ders {
		if c, err := x509.ParseCertificate(der); err == nil {
			pool.AddCert(c)
		}
	}
	return pool
}
