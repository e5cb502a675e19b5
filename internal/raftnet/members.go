package raftnet

import (
	"context"
	"log/slog"
	"strings"
	"time"

	"github.com/ticketing-dev/ticketing/internal/raft"

	"github.com/ticketing-dev/ticketing/internal/connlimit"
)

// membersEvery is how often the stream layer asks Config.Members for the
// members' addresses (connlimit.Watch resolves the names among them again
// every 30 s when they have not changed).
const membersEvery = time.Second

// memberWatch keeps the gate's member IPs current from Config.Members.
func (s *tlsStream) memberWatch(members func() []raft.ServerAddress) *connlimit.Watch {
	return &connlimit.Watch{
		Hosts: func() []string {
			addrs := members()
			hosts := make([]string, len(addrs))
			for i, a := range addrs {
				hosts[i] = string(a)
			}
			return hosts
		},
		Gate: s.gate,
		ResolveFailed: func(host string, err error, previous int) {
			s.resolveFail.Do(func(suppressed int) {
				s.log.Warn("raft peer transport: cannot resolve a member's address: its connections get no handshake slots of their own until it resolves",
					"host", host, "error", err, "previous", previous, "suppressed", suppressed)
			})
		},
		Resolved: func(ips []string) {
			if s.log.Enabled(context.Background(), slog.LevelDebug) {
				s.log.Debug("raft peer transport: member addresses", "ips", strings.Join(ips, " "))
			}
		},
	}
}
