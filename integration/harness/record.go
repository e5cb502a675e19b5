package harness

import (
	"context"
	"time"

	"github.com/ticketing-dev/ticketing/broker"
)

// Acquire calls b.Acquire and records it in h as a KindAcquire op of
// process, with the ticket's conservative deadline. The Ticket and error are returned unchanged; if the broker ever
// returned both a Ticket and an error, the op records the token with the
// error's outcome, which CheckNoTicketAfterIndeterminate reports.
func Acquire(ctx context.Context, h *History, process string, b *broker.Broker, key string, opts broker.AcquireOptions) (*broker.Ticket, error) {
	i := h.Invoke(process, KindAcquire, key)
	t, err := b.Acquire(ctx, key, opts)
	var token uint64
	if t != nil {
		token = t.Token()
	}
	h.Complete(i, token, err, "")
	if t != nil {
		h.SetDeadline(i, t.Deadline())
	}
	return t, err
}

// Release calls t.Release and records it in h as a KindRelease op.
func Release(ctx context.Context, h *History, process string, t *broker.Ticket) error {
	i := h.Invoke(process, KindRelease, t.Key())
	err := t.Release(ctx)
	h.Complete(i, t.Token(), err, "")
	return err
}

// Refresh calls t.Refresh and records it in h as a KindRefresh op of
// process, with the ticket's token and, in Note, its conservative
// deadline after the call (History time). The checkers ignore the op: a
// refresh moves the deadline of its ticket's grant, which the caller
// records with SetDeadline. The error is returned unchanged.
func Refresh(ctx context.Context, h *History, process string, t *broker.Ticket, lease time.Duration) error {
	i := h.Invoke(process, KindRefresh, t.Key())
	err := t.Refresh(ctx, lease)
	h.Complete(i, t.Token(), err, "deadline "+h.At(t.Deadline()).String())
	return err
}
