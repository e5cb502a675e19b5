package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// TestMain is also the member subprocess: the tool starts members by
// running its own executable, which in a test is the test binary.
func TestMain(m *testing.M) {
	if os.Getenv(memberEnv) != "" {
		os.Exit(runMember(os.Args[1:], os.Stdout, os.Stderr))
	}
	goleak.VerifyTestMain(m)
}

func runJSON(t *testing.T, args ...string) *result {
	t.Helper()
	var out, errb bytes.Buffer
	if code := run(t.Context(), append(args, "--json"), &out, &errb); code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	var r result
	if err := json.Unmarshal(out.Bytes(), &r); err != nil {
		t.Fatalf("%v: %s", err, out.String())
	}
	return &r
}

// A real etcd member (a subprocess) and both workloads.
func TestBenchOneMember(t *testing.T) {
	r := runJSON(t, "--members", "1", "--mode", "uncontended", "--clients", "4", "--duration", "300ms", "--warmup", "0")
	if r.Cycles == 0 || r.CyclesPerSec <= 0 || r.Acquire.Count != r.Cycles || r.Cycle.P99US < r.Cycle.P50US || r.Handoff != nil {
		t.Fatalf("uncontended: %+v", r)
	}
	if r.Members != 1 || !r.Fsync || r.Etcd != "3.7.3" || !strings.HasPrefix(r.Addr, "http://127.0.0.1:") {
		t.Errorf("uncontended: %+v", r)
	}
	r = runJSON(t, "--members", "1", "--mode", "contended", "--clients", "4", "--duration", "300ms", "--warmup", "0")
	if r.Cycles == 0 || r.Handoff == nil || r.Handoff.Count == 0 {
		t.Fatalf("contended: %+v", r)
	}
}

// Three members: the clients go to the leader, or with --all-endpoints to
// every member; the human output has ticketing-bench's lines.
func TestBenchThreeMembers(t *testing.T) {
	var out, errb bytes.Buffer
	code := run(t.Context(), []string{"--members", "3", "--mode", "contended", "--clients", "4", "--duration", "300ms", "--warmup", "0", "--all-endpoints"}, &out, &errb)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	for _, want := range []string{"3-member etcd 3.7.3 (member subprocesses, fsync on)", " cycles/s (acquire+release)", "  hand-off ", "  acquire+release  p50 "} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
	if n := strings.Count(out.String(), "http://127.0.0.1:"); n != 3 {
		t.Errorf("--all-endpoints: %d URLs in the output, want 3:\n%s", n, out.String())
	}
	if errb.Len() != 0 {
		t.Errorf("stderr: %s", errb.String())
	}
}

// A member whose client port another process holds fails to start and
// says so (exit 1), rather than serving on a port it does not have.
func TestMemberFailsOnTakenPort(t *testing.T) {
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	ports, err := freePorts(1)
	if err != nil {
		t.Fatal(err)
	}
	peer := fmt.Sprintf("http://127.0.0.1:%d", ports[0])
	var out, errb bytes.Buffer
	code := runMember([]string{"--name", "m1", "--dir", t.TempDir(), "--peer-url", peer,
		"--client-url", "http://" + taken.Addr().String(), "--initial-cluster", "m1=" + peer}, &out, &errb)
	if code != 1 || out.String() != "" || !strings.Contains(errb.String(), "address already in use") {
		t.Errorf("exit %d, stdout %q, stderr %s", code, out.String(), errb.String())
	}
}

func TestBenchUsage(t *testing.T) {
	for _, args := range [][]string{{"--mode", "hold"}, {"--members", "2"}, {"--clients", "0"}, {"--lease", "1500ms"}, {"--endpoints", "a,,b"}, {"extra"}, {"--tls", "--endpoints", "https://127.0.0.1:1"}, {"--tls-ca", "ca.pem"}} {
		var out, errb bytes.Buffer
		if code := run(context.Background(), args, &out, &errb); code != 2 {
			t.Errorf("%v: exit %d, %s", args, code, errb.String())
		}
	}
}

// --tls: the members serve clients only over TLS (a plain HTTP request to
// the client URL is refused, an https one verified against the tool's CA
// answers), and each other only over mutual TLS (a peer without a
// certificate is refused); the benchmark runs through it and says so.
func TestClusterTLS(t *testing.T) {
	c, err := startCluster(t.Context(), 1, true, os.Stderr, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	defer c.stop()
	if c.ca == nil || !strings.HasPrefix(c.clientURL[0], "https://127.0.0.1:") {
		t.Fatalf("clientURL %v, CA %v", c.clientURL, c.ca)
	}
	host := strings.TrimPrefix(c.clientURL[0], "https://")
	client := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: c.ca}}}
	defer client.CloseIdleConnections()
	resp, err := client.Get("https://" + host + "/version")
	if err != nil {
		t.Fatalf("https with the CA: %v", err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), "etcdserver") {
		t.Fatalf("https /version: %s %s", resp.Status, body)
	}
	plain := &http.Client{Timeout: 5 * time.Second}
	if resp, err := plain.Get("http://" + host + "/version"); err == nil {
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode == http.StatusOK {
			t.Fatalf("plain http /version answered: %s", body)
		}
	}

	// The peer port: a TLS client without a certificate gets no answer.
	peer := peerURLOf(t, c)
	conn, err := tls.Dial("tcp", peer, &tls.Config{RootCAs: c.ca})
	if err == nil {
		conn.SetDeadline(time.Now().Add(5 * time.Second))
		_, _ = conn.Write([]byte("GET /version HTTP/1.1\r\nHost: x\r\n\r\n"))
		buf := make([]byte, 64)
		_, err = conn.Read(buf)
		conn.Close()
	}
	if err == nil || !strings.Contains(err.Error(), "certificate required") {
		t.Fatalf("a peer without a client certificate: %v, want a TLS 'certificate required' alert", err)
	}
	// With the members' certificate it is answered.
	cert, err := tls.LoadX509KeyPair(filepath.Join(c.dir, "tls", tlsCertFile), filepath.Join(c.dir, "tls", tlsKeyFile))
	if err != nil {
		t.Fatal(err)
	}
	peerClient := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: c.ca, Certificates: []tls.Certificate{cert}}}}
	defer peerClient.CloseIdleConnections()
	resp, err = peerClient.Get("https://" + peer + "/version")
	if err != nil {
		t.Fatalf("a peer with the members' certificate: %v", err)
	}
	resp.Body.Close()

	r := runJSON(t, "--members", "1", "--tls", "--mode", "uncontended", "--clients", "2", "--duration", "200ms", "--warmup", "0")
	if !r.TLS || r.Cycles == 0 || !strings.HasPrefix(r.Addr, "https://127.0.0.1:") {
		t.Fatalf("--tls run: %+v", r)
	}
}

// peerURLOf returns host:port of the first member's peer URL, from its
// command line.
func peerURLOf(t *testing.T, c *cluster) string {
	t.Helper()
	args := c.procs[0].Args
	for i, a := range args {
		if a == "--peer-url" && i+1 < len(args) {
			return strings.TrimPrefix(args[i+1], "https://")
		}
	}
	t.Fatalf("no --peer-url in %v", args)
	return ""
}
