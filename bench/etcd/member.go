package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"go.etcd.io/etcd/client/pkg/v3/transport"
	"go.etcd.io/etcd/server/v3/embed"

	"github.com/ticketing-dev/ticketing/internal/pki"
)

// The files of a member's --tls-dir.
const (
	tlsCAFile   = "ca.pem"
	tlsCertFile = "member.pem"
	tlsKeyFile  = "member-key.pem"
)

// writeTLS makes a CA and one certificate for 127.0.0.1 that every member
// uses as server (clients, peers) and as client (peers), a node
// certificate as 'ticketingd init --cluster' makes (pki.Node), and writes
// them into dir. It returns the CA's pool for the clients.
func writeTLS(dir string) (*x509.CertPool, error) {
	ca, err := pki.NewCA("etcd-bench CA", 24*time.Hour)
	if err != nil {
		return nil, err
	}
	member, err := ca.Issue(pki.Node, []string{"127.0.0.1"}, 24*time.Hour)
	if err != nil {
		return nil, err
	}
	key, err := member.KeyPEM()
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	for name, data := range map[string][]byte{tlsCAFile: ca.CertPEM(), tlsCertFile: member.CertPEM(), tlsKeyFile: key} {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o600); err != nil {
			return nil, err
		}
	}
	return ca.Pool(), nil
}

// memberEnv, when set in the environment, makes the program an etcd
// member (see runMember) instead of the benchmark: the benchmark starts
// each member as a subprocess of its own executable this way.
const memberEnv = "ETCD_BENCH_MEMBER"

// readyLine is what a member prints on stdout once it serves clients.
const readyLine = "ready"

// runMember runs one embedded etcd member until SIGTERM or SIGINT, with
// its flags in args. fsync stays on (embed's default, UnsafeNoFsync false).
func runMember(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("etcd-bench member", flag.ContinueOnError)
	fs.SetOutput(stderr)
	name := fs.String("name", "", "member name")
	dir := fs.String("dir", "", "data directory")
	peerURL := fs.String("peer-url", "", "peer URL (listen and advertise)")
	clientURL := fs.String("client-url", "", "client URL (listen and advertise)")
	cluster := fs.String("initial-cluster", "", "name=peerURL,...")
	tlsDir := fs.String("tls-dir", "", "serve clients over TLS and peers over mutual TLS with the files of this directory (see writeTLS); the URLs are then https")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	cfg := embed.NewConfig()
	cfg.Name = *name
	cfg.Dir = *dir
	cfg.LogLevel = "error"
	cfg.LogOutputs = []string{"stderr"}
	pu, err := url.Parse(*peerURL)
	if err != nil {
		fmt.Fprintf(stderr, "etcd member: %v\n", err)
		return 2
	}
	cu, err := url.Parse(*clientURL)
	if err != nil {
		fmt.Fprintf(stderr, "etcd member: %v\n", err)
		return 2
	}
	cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = []url.URL{*pu}, []url.URL{*pu}
	cfg.ListenClientUrls, cfg.AdvertiseClientUrls = []url.URL{*cu}, []url.URL{*cu}
	cfg.InitialCluster = *cluster
	cfg.InitialClusterToken = "etcd-bench"
	cfg.ClusterState = embed.ClusterStateFlagNew
	if *tlsDir != "" {
		cert, key, ca := filepath.Join(*tlsDir, tlsCertFile), filepath.Join(*tlsDir, tlsKeyFile), filepath.Join(*tlsDir, tlsCAFile)
		// Clients present no certificate (as with a bundle of 'ticketingd
		// init --cluster'); peers must present one of the CA's.
		cfg.ClientTLSInfo = transport.TLSInfo{CertFile: cert, KeyFile: key}
		cfg.PeerTLSInfo = transport.TLSInfo{CertFile: cert, KeyFile: key, TrustedCAFile: ca, ClientCertAuth: true}
	}
	if cfg.UnsafeNoFsync {
		fmt.Fprintln(stderr, "etcd member: fsync is off; refusing to benchmark")
		return 2
	}

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		fmt.Fprintf(stderr, "etcd member %s: %v\n", *name, err)
		return 1
	}
	defer e.Close()
	select {
	case <-e.Server.ReadyNotify():
		fmt.Fprintln(stdout, readyLine)
	case err := <-e.Err():
		fmt.Fprintf(stderr, "etcd member %s: %v\n", *name, err)
		return 1
	case <-ctx.Done():
		return 0
	}
	select {
	case err := <-e.Err():
		fmt.Fprintf(stderr, "etcd member %s: %v\n", *name, err)
		return 1
	case <-ctx.Done():
		return 0
	}
}

// cluster is an etcd cluster of member subprocesses on loopback ports,
// with their data in a temporary directory.
type cluster struct {
	dir       string
	logs      *quietWriter
	clientURL []string       // one per member, in order
	ca        *x509.CertPool // with TLS: the members' CA; nil without
	procs     []*exec.Cmd
	exited    []chan error
}

// startCluster starts n members (subprocesses of this executable) and
// returns once each serves clients, or fails after timeout; with useTLS
// over TLS (writeTLS). The members' stderr (errors only) goes to stderr.
func startCluster(ctx context.Context, n int, useTLS bool, stderr io.Writer, timeout time.Duration) (c *cluster, err error) {
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "etcd-bench-")
	if err != nil {
		return nil, err
	}
	c = &cluster{dir: dir, logs: &quietWriter{w: stderr}}
	defer func() {
		if err != nil {
			c.stop()
			c = nil
		}
	}()
	ports, err := freePorts(2 * n)
	if err != nil {
		return nil, err
	}
	scheme := "http"
	var tlsArgs []string
	if useTLS {
		tlsDir := filepath.Join(dir, "tls")
		if c.ca, err = writeTLS(tlsDir); err != nil {
			return c, fmt.Errorf("etcd TLS certificates: %w", err)
		}
		scheme, tlsArgs = "https", []string{"--tls-dir", tlsDir}
	}
	var initial []string
	peer := make([]string, n)
	for i := range n {
		peer[i] = fmt.Sprintf("%s://127.0.0.1:%d", scheme, ports[2*i])
		c.clientURL = append(c.clientURL, fmt.Sprintf("%s://127.0.0.1:%d", scheme, ports[2*i+1]))
		initial = append(initial, fmt.Sprintf("m%d=%s", i+1, peer[i]))
	}
	ready := make(chan error, n)
	for i := range n {
		name := fmt.Sprintf("m%d", i+1)
		args := append([]string{"--name", name, "--dir", filepath.Join(dir, name),
			"--peer-url", peer[i], "--client-url", c.clientURL[i], "--initial-cluster", strings.Join(initial, ",")}, tlsArgs...)
		cmd := exec.Command(self, args...)
		cmd.Env = append(os.Environ(), memberEnv+"=1")
		cmd.Stderr = c.logs
		// A member must not outlive the benchmark, even a killed one.
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		out, err := cmd.StdoutPipe()
		if err != nil {
			return c, err
		}
		if err := cmd.Start(); err != nil {
			return c, fmt.Errorf("start etcd member %s: %w", name, err)
		}
		exited := make(chan error, 1)
		c.procs = append(c.procs, cmd)
		c.exited = append(c.exited, exited)
		go func() {
			sc := bufio.NewScanner(out)
			if sc.Scan() && sc.Text() == readyLine {
				ready <- nil
			} else {
				ready <- fmt.Errorf("etcd member %s exited before it was ready", name)
			}
			_, _ = io.Copy(io.Discard, out)
			exited <- cmd.Wait()
		}()
	}
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	for range n {
		select {
		case err := <-ready:
			if err != nil {
				return c, err
			}
		case <-timer.C:
			return c, fmt.Errorf("etcd cluster not ready after %v", timeout)
		case <-ctx.Done():
			return c, ctx.Err()
		}
	}
	return c, nil
}

// stop ends every member (SIGTERM, then SIGKILL after 10 s), waits for
// them and removes the data directory.
func (c *cluster) stop() {
	// A closing member logs the closing of its listeners as errors.
	c.logs.quiet.Store(true)
	for i, p := range c.procs {
		_ = p.Process.Signal(syscall.SIGTERM)
		select {
		case <-c.exited[i]:
		case <-time.After(10 * time.Second):
			_ = p.Process.Kill()
			<-c.exited[i]
		}
	}
	_ = os.RemoveAll(c.dir)
}

// quietWriter passes the members' log lines on until quiet is set, but
// for the one error line etcd logs at a member's start when its storage
// version monitor runs before the first term is saved ("cannot detect
// storage schema version"): harmless, and ignored by etcd's own test of
// error-free logs (etcd-io/etcd#18978).
type quietWriter struct {
	quiet atomic.Bool
	mu    sync.Mutex
	w     io.Writer
}

func (q *quietWriter) Write(p []byte) (int, error) {
	if q.quiet.Load() || bytes.Contains(p, []byte(`"msg":"failed to update storage version"`)) && bytes.Contains(p, []byte("cannot detect storage schema version")) {
		return len(p), nil
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	_, _ = q.w.Write(p)
	return len(p), nil
}

// freePorts returns n distinct free loopback ports (held open together
// while chosen, so they differ; another process may still take one before
// the member listens, and the member then fails to start).
func freePorts(n int) ([]int, error) {
	var lns []net.Listener
	defer func() {
		for _, ln := range lns {
			ln.Close()
		}
	}()
	var ports []int
	for range n {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		lns = append(lns, ln)
		addr, ok := ln.Addr().(*net.TCPAddr)
		if !ok {
			return nil, errors.New("not a TCP address")
		}
		ports = append(ports, addr.Port)
	}
	return ports, nil
}
