package server

import (
	"math"
	"net"

	"github.com/ticketing-dev/ticketing/internal/connlimit"
)

// Sizes of the connection budget (Config.ConnBudget).
const (
	// minConnBudget is the smallest default budget, whatever the
	// open-file limit.
	minConnBudget = 16
	// maxPreferredConns caps the budget's units kept for preferred
	// sources (loopback on a BudgetListener, members on the peer
	// listeners); they are a quarter of the budget below 256.
	maxPreferredConns = 64
)

// connBudget returns the budget cfg asks for (normalized), with the
// open-file limit it was derived from (0 when it was not), or nil for no
// cap.
func connBudget(cfg *Config) (n int, nofile uint64) {
	switch {
	case cfg.ConnBudget > 0:
		return cfg.ConnBudget, 0
	case cfg.ConnBudget < 0:
		return 0, 0
	}
	lim, ok := OpenFileLimit()
	if !ok {
		return 0, 0
	}
	lim = min(lim, math.MaxInt32)
	return max(int(lim)-cfg.FDReserve, minConnBudget), lim
}

// newBudget makes the server's connection budget (nil: no cap), whose
// refusals are logged at Warn at most once a second.
func (s *Server) newBudget() {
	n, nofile := connBudget(&s.cfg)
	if n == 0 {
		return
	}
	pref := min(n/4, maxPreferredConns)
	log := s.log
	s.budget = connlimit.NewBudget(n, pref, func(listener string, remote net.Addr, suppressed int) {
		attrs := []any{"listener", listener, "remote", remote.String(), "conn_budget", n,
			"conn_budget_preferred", pref, "fd_reserve", s.cfg.FDReserve, "suppressed", suppressed}
		if nofile != 0 {
			attrs = append(attrs, "nofile_limit", nofile)
		}
		log.Warn("connection refused: the server's connections hold every descriptor of their budget (the open-file limit minus fd-reserve, kept for the token store and the Raft log); if these are clients, raise the open-file limit (ulimit -n, systemd LimitNOFILE=)", attrs...)
	})
}

// ConnBudget returns the connection budget (0: no cap), the units of it
// kept for preferred sources, and the units in use.
func (s *Server) ConnBudget() (budget, preferred, inUse int) {
	budget, preferred = s.budget.Max()
	return budget, preferred, s.budget.InUse()
}

// BudgetListener returns ln, whose connections each take a unit of the
// server's connection budget (Config.ConnBudget) until they are closed: a
// connection beyond it is closed at once. Connections from 127.0.0.1 and
// ::1 may take the units kept for preferred sources, so that a local
// probe is answered while strangers hold the rest. name names the
// listener in the log. Without a budget it returns ln.
func (s *Server) BudgetListener(ln net.Listener, name string) net.Listener {
	return s.budget.Listener(ln, name, connlimit.IsLoopbackHost)
}
