package server

import (
	"errors"
	"fmt"
	"testing"

	"github.com/ticketing-dev/ticketing/server/internal/lockcore"
)

// The server's MaxToken and ErrTokensExhausted are the lock scheduler's: a
// grant refused for want of tokens in any mode matches the exported error.
func TestTokenCounterOneDefinition(t *testing.T) {
	if MaxToken != lockcore.MaxToken {
		t.Fatalf("MaxToken %d, lockcore.MaxToken %d", MaxToken, uint64(lockcore.MaxToken))
	}
	wrapped := fmt.Errorf("grant: %w", lockcore.ErrTokensExhausted)
	if !errors.Is(wrapped, ErrTokensExhausted) {
		t.Fatalf("errors.Is(%v, ErrTokensExhausted) = false", wrapped)
	}
	if !errors.Is(fmt.Errorf("store: %w", ErrTokensExhausted), lockcore.ErrTokensExhausted) {
		t.Fatal("errors.Is(server error, lockcore.ErrTokensExhausted) = false")
	}
	if got := ErrTokensExhausted.Error(); got != "fencing token space exhausted" {
		t.Fatalf("message %q, want the neutral %q", got, "fencing token space exhausted")
	}
}
