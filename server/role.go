package server

import (
	"fmt"
	"sync"

	"github.com/ticketing-dev/ticketing/internal/wire"
)

// Role is a node's part in its deployment: serving (standalone, the active
// node of a pair, a cluster's leader) or not (RoleStandby: a standby, a
// passive node, a follower). A serving node answers HELLO with HELLO_OK
// carrying the role's number; a node that does not serve answers HELLO
// with NOT_ACTIVE (M) and its hint, the serving node's client address.
type Role uint8

// The roles. The serving ones have the numbers of HELLO_OK's role byte.
const (
	RoleStandby    Role = 0                   // not serving: HELLO gets M with the hint
	RoleStandalone Role = wire.RoleStandalone // a single node (the default)
	RoleActive     Role = wire.RoleActive     // the serving node of a hot-standby pair
	RoleLeader     Role = wire.RoleLeader     // a cluster's leader
)

// Serving reports whether a node in role r serves sessions.
func (r Role) Serving() bool { return r != RoleStandby }

// String returns the role's name, as /status shows it.
func (r Role) String() string {
	switch r {
	case RoleStandby:
		return "standby"
	case RoleStandalone:
		return "standalone"
	case RoleActive:
		return "active"
	case RoleLeader:
		return "leader"
	}
	return fmt.Sprintf("Role(%d)", uint8(r))
}

// roleState is the current role, read (one atomic load) at every HELLO.
type roleState struct {
	role     Role
	hint     []byte // NOT_ACTIVE's hint (not serving)
	helloOK  []byte // HELLO_OK frame with req_id 0 and this role, the layout of versions 1 and 2 (serving)
	helloOK3 []byte // the same in version 3's layout, with the group's identity
}

type roleSwitch struct {
	mu sync.Mutex // serialises SetRole
}

func (s *Server) newRoleState(r Role, hint string) (*roleState, error) {
	if r > RoleLeader {
		return nil, fmt.Errorf("server: unknown role %d", r)
	}
	if len(hint) > wire.MaxNameLen {
		return nil, fmt.Errorf("server: role hint longer than %d bytes", wire.MaxNameLen)
	}
	rs := &roleState{role: r, hint: []byte(hint)}
	if r.Serving() {
		var err error
		rs.helloOK, err = wire.AppendResponse(nil, &wire.Response{Type: wire.TypeHelloOK, Version: wire.Version, Role: uint8(r), Node: []byte(s.cfg.NodeName)})
		if err != nil {
			return nil, err
		}
		rs.helloOK3, err = wire.AppendResponse(nil, &wire.Response{Type: wire.TypeHelloOK, Version: wire.Version3, Role: uint8(r),
			Node: []byte(s.cfg.NodeName), Cluster: []byte(s.groupID())})
		if err != nil {
			return nil, err
		}
	}
	return rs, nil
}

// groupID is the identity of the replicated group this node belongs to,
// as a version-3 HELLO_OK carries it: a cluster's ID, a pair's ID, ""
// standalone (and for a cluster that has not recorded its ID yet, which
// does not serve).
func (s *Server) groupID() string {
	if s.group == nil {
		return ""
	}
	return s.group()
}

// Role returns the server's current role and its hint.
func (s *Server) Role() (Role, string) {
	rs := s.role.Load()
	return rs.role, string(rs.hint)
}

// SetRole changes the server's role. On a change from a serving role to
// RoleStandby, every connection (sessions and those before HELLO) gets
// NOT_ACTIVE (M, req_id 0) with hint and is closed: the ACQUIREs waiting
// in queues or for a token are dropped with their sessions, unanswered but
// for that session-fatal M, exactly as when a session closes; later HELLOs
// get M with hint. The lock table is untouched: held locks stay held, with
// their tokens and leases, and a RELEASE on a session opened after a switch
// back frees them. (Their leases run on meanwhile: one that ends while the
// node does not serve frees its key as usual. Restarting leases on taking
// over is a replicated mode's business.) A change to a serving role serves the next HELLO (with
// the role in HELLO_OK); open sessions of an earlier serving role go on.
// Each change is logged and shown by Stats().Role and the ticketing_role
// gauge. An ACQUIRE being decided at the very moment of the switch may
// still be granted (and answered before the M): it is a holding like any
// other. hint is at most 255 bytes (wire.MaxNameLen); setting the current
// role and hint again changes nothing.
//
// Config.Standby makes RoleStandby (with Config.StandbyHint) the initial
// role; otherwise it is RoleStandalone.
func (s *Server) SetRole(r Role, hint string) error {
	rs, err := s.newRoleState(r, hint)
	if err != nil {
		return err
	}
	s.roleSw.mu.Lock()
	defer s.roleSw.mu.Unlock()
	old := s.role.Load()
	if old.role == r && string(old.hint) == hint {
		return nil
	}
	s.role.Store(rs)
	n := 0
	if old.role.Serving() && !r.Serving() {
		frame, err := wire.AppendResponse(nil, &wire.Response{Type: wire.TypeNotActive, Hint: rs.hint})
		if err != nil {
			return err // not reached: the hint's length was checked
		}
		s.mu.Lock()
		cs := make([]*conn, 0, len(s.conns))
		for c := range s.conns {
			cs = append(cs, c)
		}
		s.mu.Unlock()
		for _, c := range cs {
			c.closeWith(frame)
		}
		n = len(cs)
	}
	if old.role == r {
		s.log.Info("role hint changed", "role", r.String(), "hint", hint)
		return nil
	}
	s.log.Info("role changed", "from", old.role.String(), "to", r.String(), "hint", hint, "connections_closed", n)
	return nil
}
