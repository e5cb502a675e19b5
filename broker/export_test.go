package broker

import "time"

// Pause is a pause a session chose before reopening: the backoff's
// attempt counter it came from, whether the failed attempt before it
// followed a swing of the pair to the session's node, whether the broker
// was in pair mode (the pair's retry pace bounds it), whether it followed
// a drop rather than a failed open, and its length, jitter included.
type Pause struct {
	Addr    string
	Attempt int
	Swung   bool
	InPair  bool
	Dropped bool
	D       time.Duration
}

// OnPause makes b call f, from the session's goroutine, with every pause
// its sessions choose from now on.
func OnPause(b *Broker, f func(Pause)) {
	h := func(s *session, c pauseChoice) {
		f(Pause{Addr: s.addr, Attempt: c.attempt, Swung: c.swung, InPair: c.inPair, Dropped: c.dropped, D: c.d})
	}
	b.onPause.Store(&h)
}
