package raftnet

import (
	"context"
	"log/slog"
	"net"
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/hashicorp/raft"
)

const (
	// membersEvery is how often the stream layer asks Config.Members for
	// the members' addresses.
	membersEvery = time.Second
	// resolveEvery is how often it resolves the names among them again
	// when the addresses have not changed.
	resolveEvery = 30 * time.Second
	// resolveTimeout bounds one resolution of the names.
	resolveTimeout = 2 * time.Second
)

// memberWatch keeps the gate's member IPs current from Config.Members. It
// is used by one goroutine at a time (New, then the stream's watch loop).
type memberWatch struct {
	members  func() []raft.ServerAddress
	gate     *gate
	s        *tlsStream
	last     string                  // the addresses last resolved, sorted and joined
	resolved time.Time               // when
	names    map[string][]netip.Addr // the last successful lookup of each name
}

// refresh asks for the members' addresses and, if they changed or the
// names are due for another lookup, resolves them and updates the gate.
func (w *memberWatch) refresh(ctx context.Context) {
	addrs := w.members()
	hosts := make([]string, 0, len(addrs))
	for _, a := range addrs {
		host, _, err := net.SplitHostPort(string(a))
		if err != nil {
			host = string(a) // not host:port; raft could not dial it either
		}
		hosts = append(hosts, host)
	}
	slices.Sort(hosts)
	hosts = slices.Compact(hosts)
	key := strings.Join(hosts, " ")
	hasNames := false
	for _, h := range hosts {
		if _, err := netip.ParseAddr(h); err != nil {
			hasNames = true
		}
	}
	if key == w.last && (!hasNames || time.Since(w.resolved) < resolveEvery) {
		return
	}
	ips := make(map[netip.Addr]struct{})
	names := make(map[string][]netip.Addr)
	for _, h := range hosts {
		if ip, err := netip.ParseAddr(h); err == nil {
			ips[ip.Unmap().WithZone("")] = struct{}{}
			continue
		}
		lctx, cancel := context.WithTimeout(ctx, resolveTimeout)
		found, err := net.DefaultResolver.LookupNetIP(lctx, "ip", h)
		cancel()
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			found = w.names[h] // keep what it resolved to before, if anything
			w.s.resolveFail.do(func(suppressed int) {
				w.s.log.Warn("raft peer transport: cannot resolve a member's address: its connections get no handshake slots of their own until it resolves",
					"host", h, "error", err, "previous", len(found), "suppressed", suppressed)
			})
		}
		names[h] = found
		for _, ip := range found {
			ips[ip.Unmap().WithZone("")] = struct{}{}
		}
	}
	w.names, w.last, w.resolved = names, key, time.Now()
	w.gate.setMembers(ips)
	if w.s.log.Enabled(ctx, slog.LevelDebug) {
		list := make([]string, 0, len(ips))
		for ip := range ips {
			list = append(list, ip.String())
		}
		slices.Sort(list)
		w.s.log.Debug("raft peer transport: member addresses", "ips", strings.Join(list, " "))
	}
}

// watch refreshes every membersEvery until ctx ends.
func (w *memberWatch) watch(ctx context.Context) {
	tick := time.NewTicker(membersEvery)
	defer tick.Stop()
	for {
		select {
		case <-tick.C:
			w.refresh(ctx)
		case <-ctx.Done():
			return
		}
	}
}
