package proctest

import (
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
)

// FreePort returns a TCP port on host that was free a moment ago (it
// listens on it and closes). Another process may still take it before the
// caller does, but not an outgoing connection or a listener on port 0 of
// any process: the port is below the kernel's ephemeral range
// (net.ipv4.ip_local_port_range). A port from "listen on :0" is in that
// range, and CI saw a node fail with "address already in use" on one that
// another package's test had meanwhile been given for a connection.
// FreePort never returns a port twice in one process.
func FreePort(host string) (int, error) { return FreePortRun(host, 1) }

// FreePortRun is FreePort for n consecutive ports: it returns the first of
// n ports that were all free a moment ago (for configs that number their
// nodes' ports base, base+1, ...).
func FreePortRun(host string, n int) (int, error) {
	given.Lock()
	defer given.Unlock()
	lo, hi := portMin, ephemeralLow()-n
	for range 1000 {
		base := lo + rand.IntN(hi-lo)
		if free(host, base, n) {
			for p := base; p < base+n; p++ {
				given.ports[p] = true
			}
			return base, nil
		}
	}
	return 0, fmt.Errorf("proctest: no run of %d free ports in %d..%d in 1000 tries", n, lo, hi-1)
}

// free reports whether ports base..base+n-1 on host were never given and
// can be listened on now.
func free(host string, base, n int) bool {
	var held []net.Listener
	defer func() {
		for _, l := range held {
			l.Close()
		}
	}()
	for p := base; p < base+n; p++ {
		if given.ports[p] {
			return false
		}
		l, err := net.Listen("tcp", net.JoinHostPort(host, strconv.Itoa(p)))
		if err != nil {
			return false
		}
		held = append(held, l)
	}
	return true
}

// portMin is the lowest port FreePort hands out.
const portMin = 15000

// ephemeralLow is the first port of the kernel's ephemeral range (32768 if
// it cannot be read, or if it leaves too little room below), read once.
var ephemeralLow = sync.OnceValue(func() int {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err == nil {
		if f := strings.Fields(string(b)); len(f) == 2 {
			if v, err := strconv.Atoi(f[0]); err == nil && v > portMin+1000 {
				return v
			}
		}
	}
	return 32768
})

// given are the ports FreePort has returned.
var given = struct {
	sync.Mutex
	ports map[int]bool
}{ports: map[int]bool{}}
