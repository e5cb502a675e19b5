package console

import (
	"errors"
	"slices"
	"sync"
	"time"

	"github.com/ticketing-dev/ticketing/internal/wire"
	"github.com/ticketing-dev/ticketing/server"
)

// Overview is one snapshot of the console: GET /v1/overview, and each
// event of /v1/events.
type Overview struct {
	// Time is when it was taken.
	Time time.Time `json:"time"`
	// Planning is true for a console without a server (ticketingd
	// console): then only Time, Version, Revision and UptimeS are set.
	Planning bool `json:"planning"`
	// Version and Revision identify the binary.
	Version  string `json:"version"`
	Revision string `json:"revision,omitempty"`
	// UptimeS is how long the server (or the planning console) has run,
	// in seconds.
	UptimeS float64 `json:"uptime_s"`

	// Role is the server's role (server.Stats.Role: standby, standalone,
	// active or leader).
	Role string `json:"role,omitempty"`
	// Sessions, HeldLocks, Waiters, Grants, LastToken, TokenCeiling and
	// ProtocolErrors are server.Stats's.
	Sessions       int    `json:"sessions"`
	HeldLocks      int    `json:"held_locks"`
	Waiters        int    `json:"waiters"`
	Grants         uint64 `json:"grants"`
	LastToken      uint64 `json:"last_token"`
	TokenCeiling   uint64 `json:"token_ceiling"`
	ProtocolErrors uint64 `json:"protocol_errors"`
	// GrantsPerS is the rate of grants over the last few seconds; null
	// until the console has two samples a little apart (the first event
	// of a console nobody watched has none).
	GrantsPerS *float64 `json:"grants_per_s"`
	// GrantWait summarises the grant waits of the last minute or so
	// (WaitSummary.WindowS says how long: shorter while the console has
	// no sample that old, since start before its first one).
	GrantWait WaitSummary `json:"grant_wait"`
	// Errors are the protocol errors by E code: every code sent since the
	// server started, with its count in the GrantWait window.
	Errors []ErrorCount `json:"errors"`
	// TokenStoreError is server.Stats's: why no token can be reserved.
	TokenStoreError string `json:"token_store_error,omitempty"`

	// Cluster is a cluster node's view of the cluster; ClusterError says
	// why it is missing on a cluster node.
	Cluster      *ClusterView `json:"cluster,omitempty"`
	ClusterError string       `json:"cluster_error,omitempty"`
	// Pair is a pair node's view of its pair.
	Pair *server.PairStatus `json:"pair,omitempty"`
}

// WaitSummary is the grant-wait percentiles of a window, in
// milliseconds; null when no grant was made in it.
type WaitSummary struct {
	// WindowS is the window's length in seconds.
	WindowS float64 `json:"window_s"`
	// Count is the grants made in it.
	Count uint64   `json:"count"`
	P50MS *float64 `json:"p50_ms"`
	P90MS *float64 `json:"p90_ms"`
	P99MS *float64 `json:"p99_ms"`
}

// ErrorCount is the protocol errors of one E code.
type ErrorCount struct {
	Code uint16 `json:"code"`
	// Name is the code's meaning ("invalid argument").
	Name string `json:"name"`
	// Total is the count since the server started, Recent that of the
	// GrantWait window.
	Total  uint64 `json:"total"`
	Recent uint64 `json:"recent"`
}

// ClusterView is a cluster node's view: server.ClusterStatus with a
// health per member.
type ClusterView struct {
	NodeID          string `json:"node_id"`
	ClusterID       string `json:"cluster_id"`
	State           string `json:"state"`
	Serving         bool   `json:"serving"`
	Leader          string `json:"leader"`
	LeaderAdvertise string `json:"leader_advertise"`
	Term            uint64 `json:"term"`
	CommitIndex     uint64 `json:"commit_index"`
	AppliedIndex    uint64 `json:"applied_index"`
	LastLogIndex    uint64 `json:"last_log_index"`
	LeaderChanges   uint64 `json:"leader_changes"`
	// MembersView is "leader" when this node leads and so sees its
	// members; elsewhere the members' contact, index and lag are unknown.
	MembersView          string   `json:"members_view"`
	SinceLeaderContactMS *int64   `json:"since_leader_contact_ms,omitempty"`
	Members              []Member `json:"members"`
}

// The health of a Member.
const (
	HealthUp          = "up"          // the leader reaches it (or it is this node, or the leader this follower hears)
	HealthUnreachable = "unreachable" // the leader has no recent reply from it: stopped, dead or cut off
	HealthUnknown     = "unknown"     // this node does not lead: only the leader sees its members
)

// Member is one server of the Raft configuration as this node sees it.
type Member struct {
	ID        string `json:"id"`
	Address   string `json:"address"`
	Suffrage  string `json:"suffrage"`
	Advertise string `json:"advertise,omitempty"`
	Leader    bool   `json:"leader"`
	// Self marks the node that answers.
	Self bool `json:"self"`
	// Health is HealthUp, HealthUnreachable or HealthUnknown.
	Health         string  `json:"health"`
	SinceContactMS *int64  `json:"since_contact_ms,omitempty"`
	LogIndex       *uint64 `json:"log_index,omitempty"`
	Lag            *uint64 `json:"lag,omitempty"`
	LastError      string  `json:"last_error,omitempty"`
}

// The sampler's windows: grants per second over rateWindow, percentiles
// and recent errors over statsWindow; a sample is kept at most every
// sampleEvery.
const (
	rateWindow  = 5 * time.Second
	statsWindow = time.Minute
	sampleEvery = 500 * time.Millisecond
)

// sample is what the sampler keeps of one Stats.
type sample struct {
	at     time.Time
	grants uint64
	wait   server.WaitHistogram
	codes  map[uint16]uint64
}

// sampler keeps the samples of the last statsWindow, shared by every
// viewer: it samples when asked (no goroutine of its own), so a console
// nobody watches costs nothing.
type sampler struct {
	node Node
	mu   sync.Mutex
	hist []sample // oldest first
}

func newSampler(n Node) *sampler { return &sampler{node: n} }

// take reads the node's Stats, records a sample if the last is older
// than sampleEvery, and returns the Stats with the samples to compare
// them with: the newest at least rateWindow old (or else the oldest), and
// the oldest within statsWindow. ok is false when there is none.
func (s *sampler) take(now time.Time) (st server.Stats, rateBase, statsBase sample, ok bool) {
	st = s.node.Stats()
	cur := sample{at: now, grants: st.Grants, wait: st.GrantWait, codes: st.ProtocolErrorsByCode}
	s.mu.Lock()
	defer s.mu.Unlock()
	// Forget what is older than the window, keeping the newest of those
	// (the window's start), unless it is much older (nobody watched for
	// a while: then the window starts now).
	cut := 0
	for cut < len(s.hist)-1 && now.Sub(s.hist[cut+1].at) >= statsWindow {
		cut++
	}
	if cut < len(s.hist) && now.Sub(s.hist[cut].at) > 2*statsWindow {
		cut++
	}
	s.hist = slices.Delete(s.hist, 0, cut)
	if len(s.hist) > 0 {
		statsBase, ok = s.hist[0], now.Sub(s.hist[0].at) > 0
		rateBase = s.hist[0]
		for _, h := range s.hist {
			if now.Sub(h.at) < rateWindow {
				break
			}
			rateBase = h
		}
	}
	if len(s.hist) == 0 || now.Sub(s.hist[len(s.hist)-1].at) >= sampleEvery {
		s.hist = append(s.hist, cur)
	}
	return st, rateBase, statsBase, ok
}

// Overview returns the console's snapshot as of now.
func (c *Handler) Overview(now time.Time) Overview {
	o := Overview{Time: now.UTC(), Planning: c.opts.Node == nil, Version: c.opts.Version, Revision: c.opts.Revision,
		UptimeS: now.Sub(c.opts.Started).Seconds(), Errors: []ErrorCount{}}
	if o.Planning {
		return o
	}
	st, rateBase, statsBase, ok := c.sampler.take(now)
	o.Role, o.Sessions, o.HeldLocks, o.Waiters = st.Role, st.Sessions, st.HeldLocks, st.Waiters
	o.Grants, o.LastToken, o.TokenCeiling, o.ProtocolErrors = st.Grants, st.LastToken, st.TokenCeiling, st.ProtocolErrors
	o.TokenStoreError, o.Pair = st.TokenStoreError, st.Pair

	wait, window := st.GrantWait, o.UptimeS
	var oldCodes map[uint16]uint64
	if ok {
		if d := now.Sub(rateBase.at).Seconds(); d >= sampleEvery.Seconds() && st.Grants >= rateBase.grants {
			r := float64(st.Grants-rateBase.grants) / d
			o.GrantsPerS = &r
		}
		wait, window, oldCodes = st.GrantWait.Sub(statsBase.wait), now.Sub(statsBase.at).Seconds(), statsBase.codes
	}
	o.GrantWait = summarise(wait, window)
	for code, n := range st.ProtocolErrorsByCode {
		recent := n
		if ok {
			recent = n - min(oldCodes[code], n)
		}
		o.Errors = append(o.Errors, ErrorCount{Code: code, Name: wire.CodeName(code), Total: n, Recent: recent})
	}
	slices.SortFunc(o.Errors, func(a, b ErrorCount) int { return int(a.Code) - int(b.Code) })

	cs, err := c.opts.Node.ClusterStatus()
	switch {
	case errors.Is(err, server.ErrNotCluster):
	case err != nil:
		o.ClusterError = err.Error()
	default:
		o.Cluster = clusterView(cs)
	}
	return o
}

// summarise makes the WaitSummary of h over a window of windowS seconds.
func summarise(h server.WaitHistogram, windowS float64) WaitSummary {
	ws := WaitSummary{WindowS: windowS, Count: h.Count}
	q := func(p float64) *float64 {
		v, ok := h.Quantile(p)
		if !ok {
			return nil
		}
		v *= 1000
		return &v
	}
	ws.P50MS, ws.P90MS, ws.P99MS = q(0.5), q(0.9), q(0.99)
	return ws
}

// clusterView adds each member's health to cs.
func clusterView(cs server.ClusterStatus) *ClusterView {
	v := &ClusterView{NodeID: cs.NodeID, ClusterID: cs.ClusterID, State: cs.State, Serving: cs.Serving,
		Leader: cs.Leader, LeaderAdvertise: cs.LeaderAdvertise, Term: cs.Term, CommitIndex: cs.CommitIndex,
		AppliedIndex: cs.AppliedIndex, LastLogIndex: cs.LastLogIndex, LeaderChanges: cs.LeaderChanges,
		MembersView: cs.MembersView, SinceLeaderContactMS: cs.SinceLeaderContactMS, Members: []Member{}}
	leads := cs.State == "Leader"
	for _, m := range cs.Servers {
		mv := Member{ID: m.ID, Address: m.Address, Suffrage: m.Suffrage, Advertise: m.Advertise, Leader: m.Leader,
			Self: m.ID == cs.NodeID, SinceContactMS: m.SinceContactMS, LogIndex: m.LogIndex, Lag: m.Lag, LastError: m.LastError}
		switch {
		case leads && m.Reachable != nil && !*m.Reachable && !mv.Self:
			mv.Health = HealthUnreachable
		case leads, mv.Self:
			mv.Health = HealthUp
		case m.ID == cs.Leader && cs.State == "Follower":
			// A follower names a leader only while it hears from one.
			mv.Health = HealthUp
		default:
			mv.Health = HealthUnknown
		}
		v.Members = append(v.Members, mv)
	}
	return v
}
