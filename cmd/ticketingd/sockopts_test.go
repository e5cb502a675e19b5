package main

import (
	"net"
	"testing"
	"time"

	"github.com/ticketing-dev/ticketing/internal/wire"
	"github.com/ticketing-dev/ticketing/server"
)

// TestSocketBufferAndWriteTimeoutFlags: --socket-buffer and --write-timeout
// reach server.Config (0 socket buffer: the operating system's defaults,
// which Config spells negative), and the defaults are the server's.
func TestSocketBufferAndWriteTimeoutFlags(t *testing.T) {
	for _, tc := range []struct {
		args   []string
		buf    int
		wtimeo time.Duration
	}{
		{nil, server.DefaultSocketBuffer, server.DefaultWriteTimeout},
		{[]string{"--socket-buffer", "32768", "--write-timeout", "750ms"}, 32768, 750 * time.Millisecond},
		{[]string{"--socket-buffer", "0"}, -1, server.DefaultWriteTimeout},
	} {
		o, err := parseServe(t, tc.args...)
		if err != nil {
			t.Fatalf("%v: %v", tc.args, err)
		}
		cfg := serverConfig(o, nil, nil, nil, nil)
		if cfg.SocketBuffer != tc.buf || cfg.WriteTimeout != tc.wtimeo {
			t.Errorf("%v: Config.SocketBuffer %d, WriteTimeout %v; want %d, %v", tc.args, cfg.SocketBuffer, cfg.WriteTimeout, tc.buf, tc.wtimeo)
		}
	}
}

// TestWriteTimeoutFlagDropsNonReader: with --write-timeout 300ms and
// --socket-buffer 16384, a session that pipelines PINGs and never reads
// its PONGs is dropped for not reading, and the log line names the
// configured timeout.
func TestWriteTimeoutFlagDropsNonReader(t *testing.T) {
	p := startInProc(t, "serve", "--listen", "127.0.0.1:0", "--data-dir", t.TempDir(), "--log-format", "json",
		"--write-timeout", "300ms", "--socket-buffer", "16384")
	addr := p.stderr.waitJSON(t, "listening", p.done)["addr"].(string)
	nc, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	nc.(*net.TCPConn).SetReadBuffer(4096)
	if _, r, err := dialRaw(nc, ""); err != nil || r.Type != wire.TypeHelloOK {
		t.Fatalf("HELLO: %v %+v", err, r)
	}
	// 1,000 PINGs a write, until the server stops reading and drops us.
	var batch []byte
	for i := range 1000 {
		batch, _ = wire.AppendRequest(batch, &wire.Request{Type: wire.TypePing, ReqID: uint32(i + 2)})
	}
	go func() {
		for range 1000 {
			if _, err := nc.Write(batch); err != nil {
				return
			}
		}
	}()
	rec := p.stderr.waitJSON(t, "session dropped: peer not reading", p.done)
	if got := rec["write_timeout"]; got != float64(300*time.Millisecond) && got != "300ms" {
		t.Fatalf("drop logged write_timeout %v (%T), want 300ms", got, got)
	}
}
