package console

import (
	"encoding/json"
	"net/http"
	"time"
)

// streamWriteTimeout bounds each event's write: the stream outlives the
// admin server's WriteTimeout, so every event sets its own deadline.
const streamWriteTimeout = 10 * time.Second

// events serves GET /v1/events: an "overview" event now and then every
// interval, until the client goes away, a write fails or ShuttingDown.
func (c *Handler) events(w http.ResponseWriter, r *http.Request) {
	rc := http.NewResponseController(w)
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("X-Accel-Buffering", "no") // a proxy in front must not hold events back
	w.WriteHeader(http.StatusOK)
	tick := time.NewTicker(c.interval)
	defer tick.Stop()
	// retry: the browser's reconnection delay after the stream ends.
	first := []byte("retry: 2000\n")
	for {
		if c.opts.ShuttingDown != nil && c.opts.ShuttingDown() {
			return
		}
		data, err := json.Marshal(c.Overview(time.Now()))
		if err != nil {
			return
		}
		buf := append(first, "event: overview\ndata: "...)
		buf = append(append(buf, data...), "\n\n"...)
		first = nil
		_ = rc.SetWriteDeadline(time.Now().Add(streamWriteTimeout))
		if _, err := w.Write(buf); err != nil {
			return
		}
		if err := rc.Flush(); err != nil {
			return
		}
		select {
		case <-r.Context().Done():
			return
		case <-tick.C:
		}
	}
}
