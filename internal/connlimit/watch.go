package connlimit

import (
	"context"
	"net"
	"net/netip"
	"slices"
	"strings"
	"time"
)

const (
	// resolveEvery is how often a Watch resolves the names among its
	// hosts again when the hosts have not changed.
	resolveEvery = 30 * time.Second
	// resolveTimeout bounds one resolution of a name.
	resolveTimeout = 2 * time.Second
)

// Watch keeps a gate's member IPs current from a list of hosts (host:port
// or host; names are resolved). It is used by one goroutine at a time.
type Watch struct {
	// Hosts returns the members' addresses.
	Hosts func() []string
	// Gate gets the member IPs.
	Gate *Gate
	// ResolveFailed, if not nil, is called for a name that did not
	// resolve, with the number of IPs it keeps from its last lookup.
	ResolveFailed func(host string, err error, previous int)
	// Resolved, if not nil, is called with the member IPs, sorted, each
	// time they are set.
	Resolved func(ips []string)

	last     string                  // the hosts last resolved, sorted and joined
	resolved time.Time               // when
	names    map[string][]netip.Addr // the last successful lookup of each name
}

// Refresh asks for the hosts and, if they changed or their names are due
// for another lookup, resolves them and updates the gate.
func (w *Watch) Refresh(ctx context.Context) {
	addrs := w.Hosts()
	hosts := make([]string, 0, len(addrs))
	for _, a := range addrs {
		host, _, err := net.SplitHostPort(a)
		if err != nil {
			host = a // not host:port: a host alone
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
			if w.ResolveFailed != nil {
				w.ResolveFailed(h, err, len(found))
			}
		}
		names[h] = found
		for _, ip := range found {
			ips[ip.Unmap().WithZone("")] = struct{}{}
		}
	}
	w.names, w.last, w.resolved = names, key, time.Now()
	w.Gate.SetMembers(ips)
	if w.Resolved != nil {
		list := make([]string, 0, len(ips))
		for ip := range ips {
			list = append(list, ip.String())
		}
		slices.Sort(list)
		w.Resolved(list)
	}
}

// Run refreshes every interval until ctx ends.
func (w *Watch) Run(ctx context.Context, every time.Duration) {
	tick := time.NewTicker(every)
	defer tick.Stop()
	for {
		select {
		case <-tick.C:
			w.Refresh(ctx)
		case <-ctx.Done():
			return
		}
	}
}
