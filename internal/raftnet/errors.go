package raftnet

import "errors"

var (
	// ErrNoPeerCertificate is the handshake error when the other side of a
	// peer connection presented no certificate that verifies against the
	// cluster CA pool.
	ErrNoPeerCertificate = errors.New("raftnet: peer presented no verified certificate")

	// ErrNotNodeCertificate is the handshake error, and the error of
	// NewPeerTLS for the node's own certificate, when a certificate
	// verifies against the cluster CA pool but is not a node certificate:
	// it lacks one of the extended key usages ServerAuth and ClientAuth
	// (pki.Node certificates carry both).
	ErrNotNodeCertificate = errors.New("raftnet: not a cluster node certificate (needs both server and client auth)")

	// ErrAdvertise is the error of New when the advertised address is not
	// one that peers can dial: not a TCP address, or an unspecified IP such
	// as 0.0.0.0.
	ErrAdvertise = errors.New("raftnet: advertise address is not dialable")
)
