package server

import (
	"crypto/tls"
	"testing"
	"time"

	"github.com/ticketing-dev/ticketing/internal/pki"
)

// A dropped TLS session is closed without the close_notify alert: with its
// socket full (a peer that does not read) and no write of the session in
// flight, tls.Conn.Close would wait up to 5 s to send it, and the drop may
// happen under a scheduler lock (an overflow found while a reply is queued
// under a shard mutex, or under the cluster scheduler's on raft's FSM
// goroutine). closeRaw returns at once.
func TestCloseRawDoesNotWaitForCloseNotify(t *testing.T) {
	ca, err := pki.NewCA("test CA", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := ca.Issue(pki.Server, []string{"127.0.0.1"}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	sraw, raw := tcpPair(t)
	raw.SetReadBuffer(4096)
	client := tls.Client(raw, &tls.Config{RootCAs: ca.Pool(), ServerName: "127.0.0.1"})
	sraw.SetWriteBuffer(4096)
	stls := tls.Server(sraw, &tls.Config{Certificates: []tls.Certificate{leaf.TLSCertificate()}})
	done := make(chan error, 1)
	go func() { done <- client.Handshake() }()
	if err := stls.Handshake(); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	// The client reads no more. Fill the path to it below TLS, so that no
	// TLS write is in flight when the session is closed.
	buf := make([]byte, 4096)
	for {
		sraw.SetWriteDeadline(time.Now().Add(100 * time.Millisecond))
		if _, err := sraw.Write(buf); err != nil {
			break
		}
	}
	sraw.SetWriteDeadline(time.Time{})
	c := &conn{nc: stls}
	start := time.Now()
	c.closeRaw()
	if d := time.Since(start); d > time.Second {
		t.Fatalf("closing a dropped TLS session took %v", d)
	}
}
