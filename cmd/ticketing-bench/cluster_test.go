package main

import (
	"bytes"
	"context"
	"errors"
	"net"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ticketing-dev/ticketing/server"
)

// countingListener counts the connections a node accepted.
type countingListener struct {
	net.Listener
	n atomic.Int64
}

func (l *countingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err == nil {
		l.n.Add(1)
	}
	return c, err
}

type node struct {
	srv *server.Server
	ln  *countingListener
}

func (n *node) addr() string { return n.ln.Addr().String() }

// startNode serves a real server with cfg on a loopback port, counting
// the connections it accepts; cleanup shuts it down.
func startNode(t *testing.T, cfg server.Config) *node {
	t.Helper()
	cfg.DataDir = t.TempDir()
	srv, err := server.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	inner, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		_ = srv.Close()
		t.Fatal(err)
	}
	ln := &countingListener{Listener: inner}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := srv.Shutdown(ctx); err != nil {
			t.Error(err)
		}
		if err := <-served; !errors.Is(err, server.ErrServerClosed) {
			t.Errorf("Serve: %v", err)
		}
	})
	return &node{srv: srv, ln: ln}
}

// standby is how a node that does not serve answers today: HELLO gets M
// with hint.
func standby(hint string, tokens ...string) server.Config {
	return server.Config{Standby: true, StandbyHint: hint, ClientTokens: tokens}
}

func permutations(s []string) [][]string {
	if len(s) <= 1 {
		return [][]string{slices.Clone(s)}
	}
	var out [][]string
	for i := range s {
		rest := slices.Concat(s[:i:i], s[i+1:])
		for _, p := range permutations(rest) {
			out = append(out, append([]string{s[i]}, p...))
		}
	}
	return out
}

// Whatever the order of the nodes, every session goes to the serving one.
func TestBenchFindsServingNode(t *testing.T) {
	serving := startNode(t, server.Config{})
	a := startNode(t, standby(serving.addr()))
	b := startNode(t, standby(serving.addr()))
	all := []string{serving.addr(), a.addr(), b.addr()}
	var cycles uint64
	for i, order := range permutations(all) {
		t.Run(strings.Join(order, ","), func(t *testing.T) {
			args := []string{"--addr", strings.Join(order, ",")}
			if i%2 == 1 { // the flag repeated, with a list in one of them
				args = []string{"--addr", order[0], "--addr", order[1] + "," + order[2]}
			}
			r := runJSON(t, append(args, "--mode", "uncontended", "--duration", "200ms", "--warmup", "0", "--clients", "4", "--conns", "2")...)
			if r.Addr != serving.addr() || !slices.Equal(r.Addrs, order) || r.InProcess || r.Cycles == 0 {
				t.Fatalf("result: addr %s addrs %v cycles %d; serving node %s", r.Addr, r.Addrs, r.Cycles, serving.addr())
			}
			cycles += r.Cycles
		})
	}
	if st := serving.srv.Stats(); st.Grants < cycles || st.HeldLocks != 0 {
		t.Errorf("serving node: %+v after %d cycles", st, cycles)
	}
	for _, n := range []*node{a, b} {
		if st := n.srv.Stats(); st.Grants != 0 || st.Sessions != 0 {
			t.Errorf("standby %s: %+v", n.addr(), st)
		}
	}

	// The contended mode too, and the human output names the cluster.
	var out, errb bytes.Buffer
	args := []string{"--addr", strings.Join([]string{b.addr(), a.addr(), serving.addr()}, ","), "--mode", "contended",
		"--duration", "200ms", "--warmup", "0", "--clients", "4", "--conns", "4"}
	if code := run(t.Context(), args, &out, &errb); code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	if want := serving.addr() + " (the serving node of "; !strings.Contains(out.String(), want) || !strings.Contains(out.String(), "hand-off") {
		t.Errorf("output lacks %q or the hand-off:\n%s", want, out.String())
	}
}

// A hint naming a listed node is followed at once (the node between is not
// dialled); a hint naming an address not in the list is not, and the
// search goes on in list order.
func TestBenchFollowsListedHintsOnly(t *testing.T) {
	serving := startNode(t, server.Config{})
	hinting := startNode(t, standby(serving.addr()))
	between := startNode(t, standby(serving.addr()))
	r := runJSON(t, "--addr", hinting.addr()+","+between.addr()+","+serving.addr(), "--duration", "100ms", "--warmup", "0", "--clients", "2")
	if r.Addr != serving.addr() {
		t.Fatalf("went to %s, serving node %s", r.Addr, serving.addr())
	}
	if n := between.ln.n.Load(); n != 0 {
		t.Errorf("the node between was dialled %d times; the hint leads past it", n)
	}
	if n := hinting.ln.n.Load(); n != 1 {
		t.Errorf("the first node was dialled %d times, want 1", n)
	}

	unlisted := startNode(t, standby("127.0.0.1:1"))
	r = runJSON(t, "--addr", unlisted.addr()+","+between.addr()+","+serving.addr(), "--duration", "100ms", "--warmup", "0", "--clients", "2")
	if r.Addr != serving.addr() {
		t.Fatalf("went to %s, serving node %s", r.Addr, serving.addr())
	}
	if n := between.ln.n.Load(); n != 1 {
		t.Errorf("the node after an unlisted hint was dialled %d times, want 1", n)
	}
}

// With no serving node the search gives up after --find-wait, having
// dialled each node once per pass (two nodes naming each other do not
// make it spin); a node that is down is skipped.
func TestBenchNoServingNode(t *testing.T) {
	dead, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	deadAddr := dead.Addr().String()
	dead.Close()
	// a names the node that is down, b names a, which was tried already.
	a := startNode(t, standby(deadAddr))
	b := startNode(t, standby(a.addr()))
	var out, errb bytes.Buffer
	code := run(t.Context(), []string{"--addr", a.addr() + "," + b.addr() + "," + deadAddr, "--find-wait", "300ms", "--duration", "100ms"}, &out, &errb)
	if code != 1 || !strings.Contains(errb.String(), "no serving node among") || !strings.Contains(errb.String(), "not active") {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	na, nb := a.ln.n.Load(), b.ln.n.Load()
	if na < 1 || na != nb {
		t.Errorf("dialled a %d times and b %d times; want once each per pass", na, nb)
	}
}

// A HELLO refused with E (wrong token) ends the search at once, however
// long --find-wait is (a search that went on would dial the next node).
func TestBenchClusterWrongToken(t *testing.T) {
	serving := startNode(t, server.Config{ClientTokens: []string{"tok"}})
	a := startNode(t, standby(serving.addr(), "tok"))
	var out, errb bytes.Buffer
	code := run(t.Context(), []string{"--addr", a.addr() + "," + serving.addr(), "--token", "wrong", "--find-wait", "2s", "--duration", "100ms"}, &out, &errb)
	if code != 1 || !strings.Contains(errb.String(), "unauthorized") {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	if n := serving.ln.n.Load(); n != 0 {
		t.Errorf("went on to the next node (%d connections) after E", n)
	}
}

func TestAddrList(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		want []string
		code int
	}{
		{"one", []string{"--addr", "h:1"}, []string{"h:1"}, 0},
		{"list", []string{"--addr", "h:1, h:2,h:3"}, []string{"h:1", "h:2", "h:3"}, 0},
		{"repeated", []string{"--addr", "h:1", "--addr", "h:2,h:1"}, []string{"h:1", "h:2"}, 0},
		{"empty element", []string{"--addr", "h:1,,h:2"}, nil, 2},
		{"empty", []string{"--addr", ""}, nil, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var errb bytes.Buffer
			o, err := parseFlags(tc.args, &errb)
			if tc.code != 0 {
				if err == nil {
					t.Fatalf("accepted: %v", o.addrs)
				}
				return
			}
			if err != nil || !slices.Equal(o.addrs, tc.want) {
				t.Fatalf("got %v, %v; want %v", o.addrs, err, tc.want)
			}
		})
	}
}

// A serving node that stops serving during the run (a leader change) ends
// it with an error that says so, not with a protocol complaint.
func TestBenchServingNodeStepsDown(t *testing.T) {
	serving := startNode(t, server.Config{})
	other := startNode(t, standby(serving.addr()))
	type exit struct {
		code int
		err  string
	}
	done := make(chan exit, 1)
	go func() {
		var out, errb bytes.Buffer
		code := run(t.Context(), []string{"--addr", other.addr() + "," + serving.addr(), "--duration", "5m", "--warmup", "0", "--clients", "4"}, &out, &errb)
		done <- exit{code, errb.String()}
	}()
	deadline := time.Now().Add(30 * time.Second)
	for serving.srv.Stats().Grants == 0 {
		if time.Now().After(deadline) {
			t.Fatal("no grant on the serving node after 30 s")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err := serving.srv.SetRole(server.RoleStandby, other.addr()); err != nil {
		t.Fatal(err)
	}
	select {
	case e := <-done:
		if e.code != 1 || !strings.Contains(e.err, "node stopped serving (hint \""+other.addr()+"\")") {
			t.Errorf("exit %d: %s", e.code, e.err)
		}
	case <-time.After(time.Minute):
		t.Fatal("the run went on after the serving node stepped down")
	}
}
