package broker_test

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain checks that no goroutine outlives its Broker (every test closes
// its brokers and fake servers).
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
