package server

import (
	"context"
	"net"
	"strings"
	"time"

	"github.com/ticketing-dev/ticketing/internal/connlimit"
	"github.com/ticketing-dev/ticketing/server/internal/bstar"
)

// Defaults of the pair's peer listener limits (PairConfig).
const (
	// DefaultPairPeerConns is PairConfig.MaxPeerConns's default.
	DefaultPairPeerConns = 16
	// DefaultPairPeerConnsPerSource is PairConfig.MaxPeerConnsPerSource's
	// default.
	DefaultPairPeerConnsPerSource = 4
	// PairPeerSlots are the peer listener's connections reserved for each
	// IP of the configured peer (PairConfig.Peer, its name resolved),
	// besides MaxPeerConns: the peer's link, and its next one while the
	// old one is not yet closed.
	PairPeerSlots = 4
	// pairPeerResolve is how often the peer's host is looked at again
	// (a name is resolved again every 30 s).
	pairPeerResolve = 5 * time.Second
)

// helloTimeout bounds an inbound peer connection's TLS handshake and
// hello together.
func (p *pair) helloTimeout() time.Duration {
	if p.cfg.HelloTimeout > 0 {
		return p.cfg.HelloTimeout
	}
	return bstar.DeadAfter * p.cfg.Heartbeat
}

// admitConns puts the peer listener behind a gate (before acceptLoop
// starts): every connection holds a slot until it closes; the configured
// peer's IPs have PairPeerSlots of their own, every other source shares
// MaxPeerConns, at most MaxPeerConnsPerSource each, and a connection for
// which there is no slot is closed at once. With the hello deadline, a
// stranger can hold at most that many file descriptors and goroutines,
// each for helloTimeout, and never the peer's slots. Every connection takes
// a unit of the server's connection budget too (Config.ConnBudget).
func (p *pair) admitConns() {
	pc := p.cfg
	g := connlimit.NewGate(pc.MaxPeerConns, min(pc.MaxPeerConnsPerSource, pc.MaxPeerConns), PairPeerSlots)
	refused := connlimit.NewLimiter(time.Second)
	log := p.s.log
	// The budget first: every descriptor counts, the gate's refusals too
	// until they are closed. The peer's IPs may take its preferred units.
	p.ln = connlimit.NewListener(p.s.budget.Listener(p.ln, "pair peer", g.IsMember), g, func(c net.Conn, why connlimit.Refusal) {
		refused.Do(func(suppressed int) {
			what := "too many connections before the hello"
			switch why {
			case connlimit.SourceFull:
				what = "too many connections before the hello from this source (not the configured peer's address)"
			case connlimit.MemberAllFull:
				what = "too many connections from the configured peer's address (if this lasts, something else connects from it)"
			}
			log.Warn("pair: peer listener refused a connection: "+what,
				"remote", c.RemoteAddr().String(), "max_peer_conns", pc.MaxPeerConns,
				"max_peer_conns_per_source", pc.MaxPeerConnsPerSource, "suppressed", suppressed)
		})
	})
	resolveFail := connlimit.NewLimiter(time.Minute)
	w := &connlimit.Watch{
		Hosts: func() []string { return []string{pc.Peer} },
		Gate:  g,
		ResolveFailed: func(host string, err error, previous int) {
			resolveFail.Do(func(suppressed int) {
				log.Warn("pair: cannot resolve the peer's host: its connections get no slots of their own until it resolves",
					"host", host, "err", err, "previous", previous, "suppressed", suppressed)
			})
		},
		Resolved: func(ips []string) {
			log.Debug("pair: the peer's addresses", "ips", strings.Join(ips, " "))
		},
	}
	ctx, cancel := context.WithCancel(context.Background())
	p.wg.Add(2)
	go func() {
		defer p.wg.Done()
		<-p.stop
		cancel()
	}()
	go func() {
		defer p.wg.Done()
		w.Refresh(ctx) // in the background: a slow lookup does not delay the start
		w.Run(ctx, pairPeerResolve)
	}()
}
