package harness_test

import (
	"testing"
	"time"

	"github.com/ticketing-dev/ticketing/integration/harness"
	"github.com/ticketing-dev/ticketing/internal/wire"
)

// TestHarnessSession checks OpenSession and Hello against real servers: a
// standalone server answers HELLO_OK role 1 and, the session left idle,
// later sends E(1) unasked, which Session.Next returns; a standby answers
// M with its hint.
func TestHarnessSession(t *testing.T) {
	bin := harness.Ticketingd(t)
	srv := harness.StartServer(t, bin, harness.ServerOptions{Args: []string{"--idle-timeout", "300ms"}})
	s, r, err := harness.OpenSession(srv.Addr(), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if r.Type != wire.TypeHelloOK || r.Role != wire.RoleStandalone {
		t.Fatalf("HELLO answered %+v, want HELLO_OK role %d", r, wire.RoleStandalone)
	}
	if r, err := s.Next(10 * time.Second); err != nil || r.Type != wire.TypeError || r.Code != wire.CodeMalformed {
		t.Errorf("the idle session got %+v (%v), want E(%d) idle timeout", r, err, wire.CodeMalformed)
	}

	standby := harness.StartServer(t, bin, harness.ServerOptions{Args: []string{"--standby", "--standby-hint", "127.0.0.1:1"}})
	if r, err := harness.Hello(standby.Addr(), 5*time.Second); err != nil || r.Type != wire.TypeNotActive || r.Hint != "127.0.0.1:1" {
		t.Errorf("the standby answered %+v (%v), want M with hint 127.0.0.1:1", r, err)
	}
}
