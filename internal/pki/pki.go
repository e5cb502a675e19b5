// Package pki makes the small X.509 hierarchies Ticketing needs: a private
// certificate authority (ECDSA P-256) and server or client certificates it
// signs, with PEM encoders and crypto/tls helpers. 'ticketingd init' uses it
// to write a deployment's CA and server certificate, and tests use it to set
// up TLS and mutual TLS.
package pki

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"time"
)

// Organization is the subject organization of every certificate this package
// makes.
const Organization = "Ticketing"

// Kind says what an issued certificate is for: its extended key usage.
type Kind int

const (
	// Server is a TLS server certificate (ExtKeyUsageServerAuth).
	Server Kind = iota
	// Client is a TLS client certificate for mutual TLS
	// (ExtKeyUsageClientAuth).
	Client
	// Node is a cluster node's certificate for the Raft peer transport: a
	// node both accepts and dials peer connections, so the certificate
	// carries both ExtKeyUsageServerAuth and ExtKeyUsageClientAuth. Having
	// both is what tells a node certificate apart from the Server and Client
	// certificates of the client-facing listener.
	Node
)

// String returns "server" or "client".
func (k Kind) String() string {
	switch k {
	case Server:
		return "server"
	case Client:
		return "client"
	case Node:
		return "node"
	}
	return fmt.Sprintf("Kind(%d)", int(k))
}

// KeyPair is a certificate and its private key.
type KeyPair struct {
	// Cert is the parsed certificate; Cert.Raw is its DER encoding.
	Cert *x509.Certificate
	// Key is the certificate's private key.
	Key *ecdsa.PrivateKey
}

// CertPEM returns the certificate as a PEM "CERTIFICATE" block.
func (p *KeyPair) CertPEM() []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: p.Cert.Raw})
}

// KeyPEM returns the private key as a PEM "PRIVATE KEY" block (PKCS #8).
func (p *KeyPair) KeyPEM() ([]byte, error) {
	der, err := x509.MarshalPKCS8PrivateKey(p.Key)
	if err != nil {
		return nil, fmt.Errorf("pki: marshal private key: %w", err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), nil
}

// TLSCertificate returns the pair as a tls.Certificate with Leaf set. The
// certificates in chain (usually the issuing CA's) follow the leaf in the
// chain sent to peers.
func (p *KeyPair) TLSCertificate(chain ...*x509.Certificate) tls.Certificate {
	c := tls.Certificate{Certificate: [][]byte{p.Cert.Raw}, PrivateKey: p.Key, Leaf: p.Cert}
	for _, ic := range chain {
		c.Certificate = append(c.Certificate, ic.Raw)
	}
	return c
}

// CA is a private certificate authority: a self-signed CA certificate that
// may sign only end-entity certificates (MaxPathLen 0), and its key.
type CA struct {
	KeyPair
}

// NewCA creates a CA with a fresh ECDSA P-256 key and a self-signed
// certificate for commonName, valid from an hour ago (for clock skew) until
// validFor from now.
func NewCA(commonName string, validFor time.Duration) (*CA, error) {
	now := time.Now()
	tmpl := &x509.Certificate{
		Subject:               pkix.Name{CommonName: commonName, Organization: []string{Organization}},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(validFor),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
	}
	p, err := sign("CA", tmpl, nil)
	if err != nil {
		return nil, err
	}
	return &CA{*p}, nil
}

// LoadCA reads a CA from the PEM encodings of its certificate and its ECDSA
// private key, such as the files 'ticketingd init' writes.
func LoadCA(certPEM, keyPEM []byte) (*CA, error) {
	tc, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return nil, fmt.Errorf("pki: load CA: %w", err)
	}
	cert, err := x509.ParseCertificate(tc.Certificate[0])
	if err != nil {
		return nil, fmt.Errorf("pki: parse CA certificate: %w", err)
	}
	if !cert.IsCA {
		return nil, errors.New("pki: load CA: certificate is not a CA")
	}
	key, ok := tc.PrivateKey.(*ecdsa.PrivateKey)
	if !ok {
		return nil, fmt.Errorf("pki: load CA: key is %T, not ECDSA", tc.PrivateKey)
	}
	return &CA{KeyPair{Cert: cert, Key: key}}, nil
}

// Pool returns a new certificate pool holding only the CA certificate: the
// RootCAs of a client or the ClientCAs of a server that trusts this CA.
func (ca *CA) Pool() *x509.CertPool {
	pool := x509.NewCertPool()
	pool.AddCert(ca.Cert)
	return pool
}

// Issue signs a certificate of the given kind (its extended key usages) with a fresh ECDSA P-256 key,
// valid from an hour ago until validFor from now. hosts must not be empty:
// the first is the subject common name, and each becomes a subject
// alternative name, an IP SAN if it parses as an IP address and a DNS SAN
// otherwise.
func (ca *CA) Issue(kind Kind, hosts []string, validFor time.Duration) (*KeyPair, error) {
	if len(hosts) == 0 {
		return nil, errors.New("pki: issue: no hosts")
	}
	var eku []x509.ExtKeyUsage
	switch kind {
	case Server:
		eku = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}
	case Client:
		eku = []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}
	case Node:
		eku = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}
	default:
		return nil, fmt.Errorf("pki: issue: unknown kind %v", kind)
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		Subject:     pkix.Name{CommonName: hosts[0], Organization: []string{Organization}},
		NotBefore:   now.Add(-time.Hour),
		NotAfter:    now.Add(validFor),
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: eku,
	}
	for _, h := range hosts {
		if ip := net.ParseIP(h); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	return sign(kind.String(), tmpl, ca)
}

// sign gives tmpl a random serial number and a fresh ECDSA P-256 key and
// signs it with ca, or with the new key itself (self-signed) if ca is nil.
// what names the certificate in errors.
func sign(what string, tmpl *x509.Certificate, ca *CA) (*KeyPair, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("pki: generate %s key: %w", what, err)
	}
	if tmpl.SerialNumber, err = randSerial(); err != nil {
		return nil, err
	}
	parent, parentKey := tmpl, key
	if ca != nil {
		parent, parentKey = ca.Cert, ca.Key
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, &key.PublicKey, parentKey)
	if err != nil {
		return nil, fmt.Errorf("pki: create %s certificate: %w", what, err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("pki: parse %s certificate: %w", what, err)
	}
	return &KeyPair{Cert: cert, Key: key}, nil
}

// randSerial returns a random positive serial number of at most 128 bits.
func randSerial() (*big.Int, error) {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return nil, fmt.Errorf("pki: serial number: %w", err)
	}
	return n.Add(n, big.NewInt(1)), nil
}
