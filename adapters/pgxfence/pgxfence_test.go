package pgxfence_test

import (
	"testing"

	"go.uber.org/goleak"

	"github.com/ticketing-dev/ticketing/adapters/pgxfence"
	"github.com/ticketing-dev/ticketing/fence/fencetest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// The database paths are tested in adapters/internal/conformance against
// a real PostgreSQL; these need none.
func TestInvalidArguments(t *testing.T) {
	tk := fencetest.NewTicket("k", 1)
	if err := pgxfence.Run(t.Context(), nil, tk, nil); err == nil || tk.Releases() != 1 {
		t.Errorf("nil db: %v, releases %d", err, tk.Releases())
	}
	if err := pgxfence.Guard(t.Context(), nil, tk); err == nil {
		t.Error("nil tx accepted")
	}
}
