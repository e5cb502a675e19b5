package admin

import (
	"bufio"
	"crypto/rand"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/ticketing-dev/ticketing/internal/wire"
	"github.com/ticketing-dev/ticketing/server"
)

// startServer creates a server.Server with cfg and serves it on
// 127.0.0.1:0; the test's Cleanup closes it and waits until Serve has
// returned.
func startServer(t *testing.T, cfg server.Config) (*server.Server, string) {
	t.Helper()
	srv, err := server.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		srv.Close()
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	t.Cleanup(func() {
		srv.Close()
		if err := <-served; err != nil && !errors.Is(err, server.ErrServerClosed) {
			t.Errorf("Serve: %v", err)
		}
	})
	return srv, ln.Addr().String()
}

// do sends one request to h and returns the recorded answer.
func do(h http.Handler, method, path string, header map[string]string, body string) *httptest.ResponseRecorder {
	req := httptest.NewRequest(method, path, strings.NewReader(body))
	req.Host = "127.0.0.1:9225" // not httptest's example.com, which a handler without a token refuses
	for k, v := range header {
		if k == "Host" {
			req.Host = v
			continue
		}
		req.Header.Set(k, v)
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return rec
}

// wireClient is a minimal lock-protocol client: one request at a time.
type wireClient struct {
	c   net.Conn
	fr  *wire.Reader
	id  uint32
	buf []byte
}

// dialWire connects to addr and sends HELLO without a token; it fails the
// test unless the answer is HELLO_OK.
func dialWire(t *testing.T, addr string) *wireClient {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	cl := &wireClient{c: conn, fr: wire.NewReader(bufio.NewReader(conn))}
	r, err := cl.do(&wire.Request{Type: wire.TypeHello, Version: wire.Version, Name: []byte("admin-test")})
	if err != nil || r.Type != wire.TypeHelloOK {
		t.Fatalf("HELLO: %q %v", r.Type, err)
	}
	return cl
}

func (cl *wireClient) do(req *wire.Request) (wire.Response, error) {
	cl.id++
	req.ReqID = cl.id
	var err error
	if cl.buf, err = wire.AppendRequest(cl.buf[:0], req); err != nil {
		return wire.Response{}, err
	}
	if _, err := cl.c.Write(cl.buf); err != nil {
		return wire.Response{}, err
	}
	body, err := cl.fr.Next()
	if err != nil {
		return wire.Response{}, err
	}
	var r wire.Response
	if err := wire.DecodeResponse(body, &r); err != nil {
		return wire.Response{}, err
	}
	if r.ReqID != req.ReqID && r.Type != wire.TypeError {
		return r, fmt.Errorf("reply req_id %d to request %d", r.ReqID, req.ReqID)
	}
	return r, nil
}

// acquire asks for key with a new owner, waiting up to waitS seconds, for
// a lease of leaseS seconds.
func (cl *wireClient) acquire(key string, waitS, leaseS uint8) (wire.Response, error) {
	var owner [wire.OwnerLen]byte
	_, _ = rand.Read(owner[:])
	return cl.do(&wire.Request{Type: wire.TypeAcquire, Owner: owner, WaitS: waitS, LeaseS: leaseS, Key: []byte(key)})
}
