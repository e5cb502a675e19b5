package admin_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ticketing-dev/ticketing/server"
	"github.com/ticketing-dev/ticketing/server/admin"
)

// A program that embeds a lock server serves its admin endpoints with
// admin.New: here on an httptest server, in production on an http.Server
// of its own (with timeouts) bound to loopback or a management network.
func Example() {
	dir, err := os.MkdirTemp("", "admin-example")
	if err != nil {
		panic(err)
	}
	defer os.RemoveAll(dir)

	reg := prometheus.NewRegistry()
	srv, err := server.New(server.Config{DataDir: dir, Registerer: reg})
	if err != nil {
		panic(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		panic(err)
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()

	ts := httptest.NewServer(admin.New(srv, admin.Options{Gatherer: reg, Registerer: reg}))
	defer ts.Close()

	resp, err := http.Get(ts.URL + "/healthz")
	if err != nil {
		panic(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	fmt.Printf("/healthz: %d %s", resp.StatusCode, body)

	resp, err = http.Get(ts.URL + "/status")
	if err != nil {
		panic(err)
	}
	var st admin.Status
	err = json.NewDecoder(resp.Body).Decode(&st)
	resp.Body.Close()
	if err != nil {
		panic(err)
	}
	fmt.Printf("/status: role %s, %d held locks, cluster %v\n", st.Role, st.HeldLocks, st.Cluster != nil)

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := srv.Shutdown(ctx); err != nil {
		panic(err)
	}
	<-served
	// Output:
	// /healthz: 200 ok
	// /status: role standalone, 0 held locks, cluster false
}
